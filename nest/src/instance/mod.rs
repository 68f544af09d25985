//! The agent harness: runs one task's run inside an instance (or standalone): system prompt,
//! model, tools (MCP + built-ins), the loop until the model answers or calls `finish`, and the
//! run log events that make the run resumable.
