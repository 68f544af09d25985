//! End-to-end tests: real `agen` binaries (Hub, Nests, CLI, built-in servers), real
//! third-party MCP servers and clients (PyPI `mcp`, `mcp-server-time`, npm
//! `@modelcontextprotocol/server-filesystem`), a real PostgreSQL, and the scripted fake model.
//! Run through `tests/run.sh`, which installs the peers and builds the binary first.

#![allow(clippy::unwrap_used)]
mod artifacts;
mod cli;
mod deploy;
mod fleet;
mod keen;
mod lifecycle;
mod resume;
mod runs;
mod secrets;
mod sql;
mod up;
mod workspace;
