//! `mcp.json`: the bundle's MCP tool servers, `{"mcpServers": {name: {command,args,env} | {url,headers}}}`.
//!
//! Invariants: a server name is non-empty and made of `[A-Za-z0-9_-]` (tools are named
//! `<server>.<tool>` and models see `<server>_<tool>`, so no dots); a server is exactly one of
//! a command server (non-empty `command`) or a url server (an `http(s)://` URL).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::{BundleError, Result};
use super::json::{kind, Obj};

pub const MCP_FILE: &str = "mcp.json";

/// All servers of a bundle, by name (sorted).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct McpConfig {
    pub servers: BTreeMap<String, ServerSpec>,
}

/// One MCP server.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServerSpec {
    /// A stdio server started by the instance with the bundle dir as cwd. `env` values may hold `${NAME}`.
    Command {
        command: String,
        args: Vec<String>,
        env: BTreeMap<String, String>,
    },
    /// A streamable-HTTP server. `headers` values may hold `${NAME}`.
    Url {
        url: String,
        headers: BTreeMap<String, String>,
    },
}

/// Whether `name` is a valid server name: non-empty, `[A-Za-z0-9_-]`, at most 64 characters.
pub fn valid_server_name(name: &str) -> bool {
    !name.is_empty()
        && name.len() <= 64
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Checks that `url` looks like `http://host[:port][/path]` or `https://…`.
pub(crate) fn check_http_url(url: &str) -> std::result::Result<(), String> {
    let expected = "expected an http:// or https:// URL such as `https://crm.example/mcp`";
    let rest = url
        .strip_prefix("https://")
        .or_else(|| url.strip_prefix("http://"))
        .ok_or_else(|| format!("{expected}, got `{url}`"))?;
    let host = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host = host.rsplit('@').next().unwrap_or("");
    if host.is_empty() || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!("{expected}, got `{url}`"));
    }
    if let Some((h, port)) = host.rsplit_once(':') {
        // `[::1]:8080` or `host:8080`; a bare IPv6 literal has its colons inside brackets.
        if !h.ends_with(']') && h.contains(':') {
            return Err(format!("{expected}, got `{url}`"));
        }
        if !port.is_empty() && !port.ends_with(']') && port.parse::<u16>().is_err() {
            return Err(format!(
                "{expected} (the port must be a number), got `{url}`"
            ));
        }
    }
    Ok(())
}

pub(crate) fn parse(v: &Value) -> Result<McpConfig> {
    let top = Obj::new(MCP_FILE, "", v, "an object with \"mcpServers\"")?;
    top.only_keys(&["mcpServers"])?;
    // `{}` is a bundle without MCP servers; unknown keys were refused above.
    let Some(servers_v) = top.get("mcpServers") else {
        return Ok(McpConfig::default());
    };
    let servers = Obj::new(
        MCP_FILE,
        "mcpServers",
        servers_v,
        "an object of servers by name",
    )?;
    let mut out = BTreeMap::new();
    for (name, spec) in servers.map {
        if !valid_server_name(name) {
            return Err(servers.err(
                name,
                "bad server name; expected 1-64 letters, digits, `_` or `-` (no dots: tools are named <server>.<tool>)",
            ));
        }
        out.insert(name.clone(), parse_server(&servers.field(name), spec)?);
    }
    Ok(McpConfig { servers: out })
}

fn parse_server(path: &str, v: &Value) -> Result<ServerSpec> {
    let s = Obj::new(MCP_FILE, path, v, "an object with \"command\" or \"url\"")?;
    let has_command = s.map.contains_key("command");
    let has_url = s.map.contains_key("url");
    let transport = s.opt_str("type")?;
    match (has_command, has_url) {
        (true, true) => Err(BundleError::invalid(
            MCP_FILE,
            path,
            "has both \"command\" and \"url\"; expected exactly one (a stdio server or an HTTP server)",
        )),
        (false, false) => Err(BundleError::invalid(
            MCP_FILE,
            path,
            "unknown server shape; expected {\"command\": ..., \"args\": [...], \"env\": {...}} or {\"url\": ..., \"headers\": {...}}",
        )),
        (true, false) => {
            s.only_keys(&["command", "args", "env", "type"])?;
            if let Some(t) = transport.as_deref() {
                if t != "stdio" {
                    return Err(s.err("type", format!("expected \"stdio\" for a command server, got \"{t}\"")));
                }
            }
            let command = match s.map.get("command") {
                Some(Value::String(c)) if !c.trim().is_empty() => c.clone(),
                Some(Value::String(_)) => {
                    return Err(s.err("command", "is empty; expected a program such as \"uvx\" or \"./server.py\""))
                }
                other => {
                    let got = other.map(kind).unwrap_or("null");
                    return Err(s.err("command", format!("expected a string (the program to run), got {got}")));
                }
            };
            Ok(ServerSpec::Command { command, args: s.str_vec("args")?, env: s.str_map("env")? })
        }
        (false, true) => {
            s.only_keys(&["url", "headers", "type"])?;
            if let Some(t) = transport.as_deref() {
                if !matches!(t, "http" | "streamable-http" | "streamableHttp") {
                    return Err(s.err(
                        "type",
                        format!("expected \"http\" (streamable HTTP) for a url server, got \"{t}\""),
                    ));
                }
            }
            let url = s.opt_str("url")?.unwrap_or_default();
            check_http_url(&url).map_err(|m| s.err("url", m))?;
            Ok(ServerSpec::Url { url, headers: s.str_map("headers")? })
        }
    }
}
