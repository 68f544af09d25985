//! The bundle: a folder that defines an agent (`mcp.json`, `skills/`, `x-agen/`, Keen tools),
//! its parsed model, validation with errors naming file, field and expectation, and its
//! content-addressed archive form.
