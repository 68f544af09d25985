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
            let args = s.str_vec("args")?;
            check_args_hold_no_secrets(&s.field("args"), &args)?;
            Ok(ServerSpec::Command { command, args, env: s.str_map("env")? })
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
            let headers = s.str_map("headers")?;
            check_secret_headers_are_private(&s.field("url"), &url, &headers)?;
            Ok(ServerSpec::Url { url, headers })
        }
    }
}

/// `${NAME}` is substituted only in `env` values and headers: in `args` it would reach the
/// server literally, and substituting it would put a secret on a command line every user of
/// the host can read (`/proc/PID/cmdline`). So a well-formed `${NAME}` in an argument is
/// refused, naming the argument and the fix.
fn check_args_hold_no_secrets(path: &str, args: &[String]) -> Result<()> {
    for (i, arg) in args.iter().enumerate() {
        let Ok(names) = super::secrets::secret_refs(arg) else {
            continue;
        };
        if let Some(name) = names.first() {
            return Err(BundleError::invalid(
                MCP_FILE,
                &format!("{path}[{i}]"),
                format!(
                    "holds `${{{name}}}`, which is not replaced in args (a secret on a command line is readable by every user of the host); \
                     pass it in \"env\" instead, e.g. \"env\": {{\"{name}\": \"${{{name}}}\"}}, and let the server read it from its environment \
                     (a shell variable in an argument can be written ${name})"
                ),
            ));
        }
    }
    Ok(())
}

/// A url server whose headers hold a secret is reached over `https://`, or `http://` only to
/// this machine (127.0.0.1, localhost, [::1]): plain http elsewhere would send the secret in
/// the clear (the rule of A2A agent cards).
fn check_secret_headers_are_private(
    path: &str,
    url: &str,
    headers: &BTreeMap<String, String>,
) -> Result<()> {
    let Some(rest) = url.strip_prefix("http://") else {
        return Ok(());
    };
    let secret_header = headers
        .iter()
        .find(|(_, v)| super::secrets::secret_refs(v).is_ok_and(|names| !names.is_empty()));
    let Some((header, _)) = secret_header else {
        return Ok(());
    };
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = match host_port.strip_prefix('[') {
        Some(v6) => v6.split(']').next().unwrap_or(""),
        None => host_port.split(':').next().unwrap_or(""),
    }
    .to_ascii_lowercase();
    if matches!(host.as_str(), "127.0.0.1" | "localhost" | "::1") {
        return Ok(());
    }
    Err(BundleError::invalid(
        MCP_FILE,
        path,
        format!(
            "`{url}` is plain http to {host}, which would send the secret in header {header} in the clear; \
             use an https:// URL (http:// is accepted with secret headers only for 127.0.0.1 and localhost)"
        ),
    ))
}

/// Advice for servers fetched at start without a pinned version (`npx -y pkg`, `uvx pkg`): a
/// new release could change what the agent runs. One line per server, naming it and the fix.
pub fn unpinned_servers(mcp: &McpConfig) -> Vec<String> {
    let mut out = Vec::new();
    for (name, spec) in &mcp.servers {
        let ServerSpec::Command { command, args, .. } = spec else {
            continue;
        };
        let program = command.rsplit('/').next().unwrap_or(command);
        let unpinned = match program {
            "npx" => {
                let package = args.iter().find(|a| !a.starts_with('-'));
                // `@scope/pkg@1.2.3` or `pkg@1.2.3`: a version `@` after the first character.
                package
                    .filter(|p| !p.get(1..).is_some_and(|rest| rest.contains('@')))
                    .map(|p| (p.clone(), format!("{p}@1.2.3")))
            }
            "uvx" => {
                let from = args
                    .iter()
                    .position(|a| a == "--from")
                    .and_then(|i| args.get(i + 1));
                let package = from.or_else(|| args.iter().find(|a| !a.starts_with('-')));
                package
                    .filter(|p| !p.contains("==") && !p.contains('@'))
                    .map(|p| (p.clone(), format!("{p}==1.2.3")))
            }
            _ => None,
        };
        if let Some((package, pinned)) = unpinned {
            out.push(format!(
                "mcp.json: mcpServers.{name}: `{program} {package}` fetches whatever release is newest at each start; pin a version (e.g. `{pinned}`) so a new release cannot change what the agent runs"
            ));
        }
    }
    out
}
