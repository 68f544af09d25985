//! End-to-end tests: real `agen` binaries (Hub, Nests, CLI, built-in servers), real
//! third-party MCP servers and clients (PyPI `mcp`, `mcp-server-time`, npm
//! `@modelcontextprotocol/server-filesystem`), a real PostgreSQL, and the scripted fake model.
//! Run through `tests/run.sh`, which installs the peers and builds the binary first.

#![allow(clippy::unwrap_used)]
mod a2a;
mod a2a_delegates;
mod a2a_spec;
mod approval_edits;
mod approvals;
mod artifacts;
mod audit_trail;
mod backups;
mod budgets;
mod chaos;
mod cli;
mod console;
mod day_two;
mod delegates;
mod deploy;
mod disk_full;
mod double_texting;
mod fleet;
mod guides;
mod hostile_bundle;
mod hostile_clients;
mod hostile_keen;
mod hostile_smaller;
mod hub_port;
mod hub_restart;
mod identity;
mod init;
mod keen;
mod lifecycle;
mod limits;
mod limits_table;
mod local_runs;
mod logs;
mod metrics;
mod netns;
mod operations;
mod otlp;
mod permissions;
mod privacy;
mod privsep;
mod resume;
mod run_context;
mod runs;
mod sandbox;
mod secrets;
mod sql;
mod store_damage;
mod store_suite;
mod stored_arguments;
mod streaming;
mod structured_output;
mod suspend;
mod tokens;
mod tool_limits;
mod trace_events;
mod triggers;
mod up;
mod versions;
mod workspace;
