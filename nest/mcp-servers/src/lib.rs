//! Agen's own MCP servers, served over stdio by `agen mcp …`: `workspace` (files and a shell in
//! one folder, every path confined to the root) and `sql` (read-only queries).

pub mod sql;
pub mod workspace;
