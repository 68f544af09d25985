//! MCP prompts in the system prompt: `x-agen/agent.md` front matter
//! `systemPrompts: [server/prompt, …]` names prompts of the bundle's MCP servers; their text is
//! fetched when the servers start and joins the system prompt after the agent.md body, in the
//! order named.
//!
//! Invariant: every name is `server/prompt` with a server of `mcp.json`, checked when the
//! bundle is read.

use serde_json::Value;

use super::error::{BundleError, Result};
use super::{McpConfig, AGENT_FILE};

/// The most prompts one bundle may name.
const MAX_PROMPTS: usize = 16;

/// Reads `systemPrompts` (absent: none).
pub(crate) fn load(named: Option<&Value>, mcp: &McpConfig) -> Result<Vec<String>> {
    let Some(value) = named else {
        return Ok(Vec::new());
    };
    let expected = "expected a list of MCP prompts as server/prompt, such as [docs/house-style]";
    let Some(list) = value.as_array() else {
        return Err(BundleError::invalid(AGENT_FILE, "systemPrompts", expected));
    };
    if list.len() > MAX_PROMPTS {
        return Err(BundleError::invalid(
            AGENT_FILE,
            "systemPrompts",
            format!("{} prompts is over the limit of {MAX_PROMPTS}", list.len()),
        ));
    }
    let mut out = Vec::with_capacity(list.len());
    for (i, item) in list.iter().enumerate() {
        let field = format!("systemPrompts[{i}]");
        let Some((server, prompt)) = item.as_str().and_then(|s| s.trim().split_once('/')) else {
            return Err(BundleError::invalid(AGENT_FILE, &field, expected));
        };
        if prompt.is_empty() {
            return Err(BundleError::invalid(AGENT_FILE, &field, expected));
        }
        if !mcp.servers.contains_key(server) {
            let known: Vec<&str> = mcp.servers.keys().map(String::as_str).collect();
            return Err(BundleError::invalid(
                AGENT_FILE,
                &field,
                format!(
                    "server `{server}` is not in mcp.json (servers: {}); name a prompt as server/prompt",
                    if known.is_empty() { "none".to_string() } else { known.join(", ") }
                ),
            ));
        }
        out.push(format!("{server}/{prompt}"));
    }
    Ok(out)
}
