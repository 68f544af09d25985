//! `x-agen/config.json`: delegates (deployments of the fleet, or remote A2A agents), per-tool
//! overrides (`sideEffect`, `idempotent`, `timeout`, `retries`, `backoff`) and permissions
//! (`allow` / `ask` / `deny` tool patterns).
//!
//! Invariants: tool names and patterns accept both `<server>.<tool>` and `<server>_<tool>`;
//! a `tools` key is a tool name or a whole server (`ws.*`); a tool's own entry wins over its
//! server's, key by key;
//! a pattern is a tool name where `*` matches any run of characters; deny beats ask beats
//! allow, and a non-empty `allow` list denies every tool it does not match.

use std::collections::BTreeMap;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::{BundleError, Result};
use super::json::{kind, Obj};

pub const CONFIG_FILE: &str = "x-agen/config.json";

/// The agent's wiring beyond its MCP servers.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentConfig {
    /// Deployments this agent may call (`call_agent`, `start_agent`).
    pub delegates: Vec<Delegate>,
    /// Overrides by tool name as written (`crm.upsert_contact` or `crm_upsert_contact`), or
    /// for every tool of a server (`crm.*` or `crm_*`).
    pub tools: BTreeMap<String, ToolOverride>,
    pub permissions: Permissions,
    /// Where a sandboxed instance may connect (`"network": {"allow", "deny"}`); `None`: the
    /// Nest's `--egress-default` decides.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<super::network::NetworkRules>,
    /// `doubleTexting`: what a submit does when its conversation already has a task queued
    /// or running (a submit may say otherwise).
    #[serde(default)]
    pub double_texting: DoubleTexting,
    /// `resources`: what one instance may use and placement reserves (see `resources`).
    #[serde(default)]
    pub resources: super::resources::ResourceSpec,
}

/// What a new message to a conversation does while a task of that conversation is queued or
/// running (`"doubleTexting"` in `x-agen/config.json`, `agen submit --double-texting`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DoubleTexting {
    /// The new submit is refused (FAILED_PRECONDITION naming the task in the way).
    Reject,
    /// The new task runs after the others, in order.
    #[default]
    Enqueue,
    /// The running task stops at its next safe point (between turns, never inside a call) and
    /// ends cancelled, reason `interrupted`; the new input continues the conversation.
    Interrupt,
    /// The running task is cancelled and its turns leave the conversation, except a note of
    /// every side-effecting call it completed.
    Rollback,
}

impl DoubleTexting {
    pub const NAMES: &'static str = "reject, enqueue, interrupt, rollback";

    pub fn parse(s: &str) -> Option<DoubleTexting> {
        Some(match s {
            "reject" => DoubleTexting::Reject,
            "enqueue" => DoubleTexting::Enqueue,
            "interrupt" => DoubleTexting::Interrupt,
            "rollback" => DoubleTexting::Rollback,
            _ => return None,
        })
    }

    pub fn as_str(self) -> &'static str {
        match self {
            DoubleTexting::Reject => "reject",
            DoubleTexting::Enqueue => "enqueue",
            DoubleTexting::Interrupt => "interrupt",
            DoubleTexting::Rollback => "rollback",
        }
    }
}

/// A deployment this agent may delegate to: `"researcher"` or
/// `{"deployment": "researcher", "namespace": "team-a", "description": "..."}`; or a remote A2A
/// agent: `{"name": "pricing", "a2a": "https://host/.well-known/agent-card.json", "token":
/// "${PRICING_TOKEN}", "description": "..."}` (then `deployment` is its `name`, and `a2a` is set).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Delegate {
    /// The deployment's name; for a remote A2A agent, the name the model calls it by.
    pub deployment: String,
    /// `None`: the caller's own namespace.
    pub namespace: Option<String>,
    /// Shown to the model in `call_agent`'s description.
    pub description: Option<String>,
    /// A local bundle folder (relative to this bundle) that `agen run` runs the delegate from
    /// in-process; a fleet ignores it.
    #[serde(default)]
    pub bundle: Option<String>,
    /// Set for a remote A2A agent: `call_agent` speaks A2A to it instead of starting a child task.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub a2a: Option<RemoteAgent>,
}

/// A remote A2A agent (A2A v1.0, JSON-RPC binding) a delegate names.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RemoteAgent {
    /// The URL of its agent card (`https://…/.well-known/agent-card.json`).
    pub card_url: String,
    /// The bearer token as written (`${NAME}`, a secret declared in `x-agen/secrets.json`);
    /// `None`: the agent is called without one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub token: Option<String>,
}

impl Delegate {
    /// Whether this delegate is a remote A2A agent.
    pub fn is_remote(&self) -> bool {
        self.a2a.is_some()
    }
}

/// What the bundle says about a tool, overriding its server's hints.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ToolOverride {
    /// `sideEffect`: `false` makes the tool read-only for the effect ledger.
    pub side_effect: Option<bool>,
    /// `idempotent`: `true` lets an interrupted call be retried.
    pub idempotent: Option<bool>,
    /// `timeout`: this tool's own `limits.toolTimeout`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout: Option<Duration>,
    /// `retries`: how often a call that timed out or failed at the protocol level is sent again
    /// (only for tools that are read-only or idempotent; default 0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub retries: Option<u32>,
    /// `backoff`: the wait before the first retry, doubled before each next one (default 1s).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backoff: Option<Duration>,
}

/// The most retries a tool may be given (`tools.<name>.retries`).
pub const MAX_TOOL_RETRIES: u32 = 10;
/// The longest `tools.<name>.backoff`.
pub const MAX_TOOL_BACKOFF: Duration = Duration::from_secs(600);
/// The longest `tools.<name>.timeout`.
pub const MAX_TOOL_TIMEOUT: Duration = Duration::from_secs(24 * 3600);
/// The backoff of a tool with retries and no `backoff`.
pub const DEFAULT_TOOL_BACKOFF: Duration = Duration::from_secs(1);

impl ToolOverride {
    /// `self`, with each key it leaves unset taken from `server` (its server's `ws.*` entry).
    fn or(self, server: ToolOverride) -> ToolOverride {
        ToolOverride {
            side_effect: self.side_effect.or(server.side_effect),
            idempotent: self.idempotent.or(server.idempotent),
            timeout: self.timeout.or(server.timeout),
            retries: self.retries.or(server.retries),
            backoff: self.backoff.or(server.backoff),
        }
    }
}

/// Tool patterns that are allowed, need approval, or are denied.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Permissions {
    pub allow: Vec<String>,
    pub ask: Vec<String>,
    pub deny: Vec<String>,
}

/// The decision for one tool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Permission {
    Allow,
    Ask,
    Deny,
}

impl Permissions {
    /// The decision for the tool `<server>.<tool>` (pass the dotted name; patterns written with
    /// `_` match too). Deny beats ask beats allow; with a non-empty `allow` list, a tool that
    /// matches neither `allow` nor `ask` is denied. Built-ins (`finish`, artifacts, progress)
    /// are never gated: callers do not ask for them.
    pub fn decide(&self, tool: &str) -> Permission {
        let any = |list: &[String]| list.iter().any(|p| tool_matches(p, tool));
        if any(&self.deny) {
            Permission::Deny
        } else if any(&self.ask) {
            Permission::Ask
        } else if self.allow.is_empty() || any(&self.allow) {
            Permission::Allow
        } else {
            Permission::Deny
        }
    }
}

impl Permissions {
    /// The decision for `tool` when a task's `overrides` narrow these permissions: the stricter
    /// of the two decisions (deny beats ask beats allow), so an override adds deny and ask
    /// patterns and its `allow` list is intersected with this one; it never widens.
    pub fn decide_narrowed(&self, overrides: &Permissions, tool: &str) -> Permission {
        let rank = |p: Permission| match p {
            Permission::Allow => 0,
            Permission::Ask => 1,
            Permission::Deny => 2,
        };
        let (a, b) = (self.decide(tool), overrides.decide(tool));
        if rank(b) > rank(a) {
            b
        } else {
            a
        }
    }

    /// The `allow` patterns of `overrides` that try to widen these permissions (they name a
    /// tool these deny or ask for, or fall outside a non-empty `allow` list): each has no effect.
    pub fn widening(&self, overrides: &Permissions) -> Vec<String> {
        overrides
            .allow
            .iter()
            .filter(|p| {
                self.decide(p) != Permission::Allow
                    || self
                        .deny
                        .iter()
                        .chain(&self.ask)
                        .any(|q| glob_match(&model_name(p), &model_name(q)))
            })
            .map(|p| {
                format!(
                    "tool override allow `{p}` has no effect: a task's overrides only narrow the bundle's permissions"
                )
            })
            .collect()
    }
}

impl AgentConfig {
    /// The override for the tool `<server>.<tool>`, whichever form the bundle wrote its key in:
    /// its own entry, each unset key taken from its server's entry (`<server>.*`).
    pub fn tool_override(&self, tool: &str) -> Option<ToolOverride> {
        let own = self
            .tools
            .get(tool)
            .or_else(|| self.tools.get(&model_name(tool)))
            .copied();
        let server = tool.split_once('.').and_then(|(server, _)| {
            self.tools
                .get(&format!("{server}.*"))
                .or_else(|| self.tools.get(&format!("{server}_*")))
                .copied()
        });
        match (own, server) {
            (Some(own), Some(server)) => Some(own.or(server)),
            (own, server) => own.or(server),
        }
    }
}

/// `<server>.<tool>` → `<server>_<tool>` (the first dot only; server names have none).
pub fn model_name(tool: &str) -> String {
    tool.replacen('.', "_", 1)
}

/// Whether `pattern` matches the tool `<server>.<tool>` (in that form or as `<server>_<tool>`).
pub fn tool_matches(pattern: &str, tool: &str) -> bool {
    glob_match(pattern, tool) || glob_match(pattern, &model_name(tool))
}

/// `*` matches any run of characters (dots included); everything else matches itself.
fn glob_match(pattern: &str, text: &str) -> bool {
    let p: Vec<char> = pattern.chars().collect();
    let t: Vec<char> = text.chars().collect();
    let (mut pi, mut ti) = (0, 0);
    let (mut star, mut mark) = (None, 0);
    while ti < t.len() {
        if pi < p.len() && p[pi] != '*' && p[pi] == t[ti] {
            pi += 1;
            ti += 1;
        } else if pi < p.len() && p[pi] == '*' {
            star = Some(pi);
            mark = ti;
            pi += 1;
        } else if let Some(s) = star {
            pi = s + 1;
            mark += 1;
            ti = mark;
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|c| *c == '*')
}

/// Checks the syntax of a tool name or pattern: non-empty, no surrounding whitespace, no
/// control characters, and `*` as the only wildcard.
pub fn check_tool_pattern(p: &str) -> std::result::Result<(), String> {
    let expected = "expected a tool name such as `crm.upsert_contact`, `crm_upsert_contact` or a pattern such as `crm.*`";
    if p.is_empty() {
        return Err(format!("is empty; {expected}"));
    }
    if p.trim() != p || p.chars().any(char::is_control) {
        return Err(format!(
            "{expected}, got `{p}` (surrounding whitespace or control characters)"
        ));
    }
    if let Some(c) = p
        .chars()
        .find(|c| matches!(c, '?' | '[' | ']' | '{' | '}' | '(' | ')'))
    {
        return Err(format!(
            "{expected}, got `{p}` (`{c}` is not supported; only `*` is a wildcard)"
        ));
    }
    Ok(())
}

pub(crate) fn parse(v: &Value) -> Result<AgentConfig> {
    let top = Obj::new(CONFIG_FILE, "", v, "an object")?;
    top.only_keys(&[
        "delegates",
        "tools",
        "permissions",
        "doubleTexting",
        "network",
        "resources",
    ])?;
    let mut config = AgentConfig::default();
    if let Some(res_v) = top.get("resources") {
        let res = Obj::new(
            CONFIG_FILE,
            "resources",
            res_v,
            "an object such as {\"cpu\": 0.5, \"memory\": \"512Mi\", \"pids\": 256}",
        )?;
        config.resources = super::resources::parse(&res)?;
    }
    if let Some(mode) = top.opt_str("doubleTexting")? {
        config.double_texting = DoubleTexting::parse(&mode).ok_or_else(|| {
            top.err(
                "doubleTexting",
                format!("expected one of {}, got {mode:?}", DoubleTexting::NAMES),
            )
        })?;
    }

    match top.get("delegates") {
        None => {}
        Some(Value::Array(items)) => {
            for (i, item) in items.iter().enumerate() {
                config
                    .delegates
                    .push(parse_delegate(&format!("delegates[{i}]"), item)?);
            }
        }
        Some(other) => {
            return Err(top.err(
                "delegates",
                format!("expected an array of deployment names, got {}", kind(other)),
            ))
        }
    }

    if let Some(tools_v) = top.get("tools") {
        let tools = Obj::new(
            CONFIG_FILE,
            "tools",
            tools_v,
            "an object of tool overrides by tool name",
        )?;
        for (name, ov) in tools.map {
            check_tool_pattern(name).map_err(|m| tools.err(name, m))?;
            let server_entry = name
                .strip_suffix(".*")
                .or_else(|| name.strip_suffix("_*"))
                .is_some_and(|server| !server.is_empty() && !server.contains(['*', '.']));
            if name.contains('*') && !server_entry {
                return Err(tools.err(
                    name,
                    "expected a tool name such as `ws.run` or a whole server such as `ws.*`, not another pattern",
                ));
            }
            let o = Obj::new(
                CONFIG_FILE,
                &tools.field(name),
                ov,
                "an object such as {\"sideEffect\": false}",
            )?;
            config.tools.insert(name.clone(), parse_tool_override(&o)?);
        }
    }

    if let Some(perms_v) = top.get("permissions") {
        let perms = Obj::new(
            CONFIG_FILE,
            "permissions",
            perms_v,
            "an object with allow, ask, deny",
        )?;
        perms.only_keys(&["allow", "ask", "deny"])?;
        let list = |key: &str| -> Result<Vec<String>> {
            let items = perms.str_vec(key)?;
            for (i, p) in items.iter().enumerate() {
                check_tool_pattern(p).map_err(|m| {
                    BundleError::invalid(CONFIG_FILE, &format!("permissions.{key}[{i}]"), m)
                })?;
            }
            Ok(items)
        };
        config.permissions = Permissions {
            allow: list("allow")?,
            ask: list("ask")?,
            deny: list("deny")?,
        };
    }
    if let Some(net_v) = top.get("network") {
        let net = Obj::new(
            CONFIG_FILE,
            "network",
            net_v,
            "an object with allow, deny (host patterns such as \"api.openai.com:443\")",
        )?;
        net.only_keys(&["allow", "deny"])?;
        let rules = super::network::NetworkRules {
            allow: net.str_vec("allow")?,
            deny: net.str_vec("deny")?,
        };
        rules.patterns().map_err(|m| {
            let (field, msg) = m.split_once(": ").unwrap_or(("network", m.as_str()));
            BundleError::invalid(CONFIG_FILE, field, msg.to_string())
        })?;
        config.network = Some(rules);
    }
    Ok(config)
}

/// One `tools` entry: `{"sideEffect"?, "idempotent"?, "timeout"?, "retries"?, "backoff"?}`.
fn parse_tool_override(o: &Obj) -> Result<ToolOverride> {
    o.only_keys(&["sideEffect", "idempotent", "timeout", "retries", "backoff"])?;
    let duration = |key: &str, max: Duration| -> Result<Option<Duration>> {
        let Some(s) = o.opt_str(key)? else {
            return Ok(None);
        };
        let d = crate::duration::parse_duration(&s).map_err(|e| o.err(key, e.to_string()))?;
        if d.is_zero() && key == "timeout" {
            return Err(o.err(
                key,
                format!("expected a duration above zero, such as `90s`, got `{s}`"),
            ));
        }
        if d > max {
            return Err(o.err(
                key,
                format!(
                    "`{s}` is over the limit of {}",
                    crate::duration::format_duration(max)
                ),
            ));
        }
        Ok(Some(d))
    };
    let retries = o.opt_u32("retries")?;
    if let Some(n) = retries.filter(|n| *n > MAX_TOOL_RETRIES) {
        return Err(o.err(
            "retries",
            format!("{n} is over the limit of {MAX_TOOL_RETRIES} retries"),
        ));
    }
    let over = ToolOverride {
        side_effect: o.opt_bool("sideEffect")?,
        idempotent: o.opt_bool("idempotent")?,
        timeout: duration("timeout", MAX_TOOL_TIMEOUT)?,
        retries,
        backoff: duration("backoff", MAX_TOOL_BACKOFF)?,
    };
    if over.retries.is_some_and(|n| n > 0)
        && over.idempotent == Some(false)
        && over.side_effect != Some(false)
    {
        return Err(o.err(
            "retries",
            "only a read-only or idempotent tool may be retried; this entry says \"idempotent\": false",
        ));
    }
    Ok(over)
}

fn parse_delegate(path: &str, v: &Value) -> Result<Delegate> {
    let check_name = |field: &str, name: &str| -> Result<()> {
        if name.trim().is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err(BundleError::invalid(
                CONFIG_FILE,
                field,
                format!("expected a deployment name without spaces, got `{name}`"),
            ));
        }
        Ok(())
    };
    match v {
        Value::String(name) => {
            check_name(path, name)?;
            Ok(Delegate { deployment: name.clone(), namespace: None, description: None, bundle: None, a2a: None })
        }
        Value::Object(o) if o.contains_key("a2a") => parse_remote(path, v),
        Value::Object(_) => {
            let o = Obj::new(CONFIG_FILE, path, v, "an object")?;
            o.only_keys(&["deployment", "namespace", "description", "bundle"])?;
            let deployment = o
                .opt_str("deployment")?
                .ok_or_else(|| o.err("deployment", "missing; expected the deployment's name"))?;
            check_name(&o.field("deployment"), &deployment)?;
            let namespace = o.opt_str("namespace")?;
            if let Some(ns) = &namespace {
                check_name(&o.field("namespace"), ns)?;
            }
            Ok(Delegate { deployment, namespace, description: o.opt_str("description")?, bundle: o.opt_str("bundle")?, a2a: None })
        }
        other => Err(BundleError::invalid(
            CONFIG_FILE,
            path,
            format!(
                "expected a deployment name, {{\"deployment\": ..., \"namespace\"?: ..., \"description\"?: ...}} or {{\"name\": ..., \"a2a\": \"https://…/agent-card.json\", \"token\"?: \"${{NAME}}\"}}, got {}",
                kind(other)
            ),
        )),
    }
}

/// `{"name", "a2a", "description"?, "token"?}`: a remote A2A agent.
fn parse_remote(path: &str, v: &Value) -> Result<Delegate> {
    let o = Obj::new(CONFIG_FILE, path, v, "an object")?;
    o.only_keys(&["name", "a2a", "description", "token"])?;
    let url = o
        .opt_str("a2a")?
        .ok_or_else(|| o.err("a2a", "expected the URL of the agent's card as a string"))?;
    let name = match o.opt_str("name")? {
        Some(name) => name,
        None => name_from_card_url(&url).ok_or_else(|| {
            o.err("name", "missing; expected the name the agent calls this remote agent by, e.g. \"name\": \"pricing\"")
        })?,
    };
    if name.trim().is_empty() || name.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(o.err(
            "name",
            format!("expected a name without spaces, got `{name}`"),
        ));
    }
    check_card_url(&url).map_err(|m| o.err("a2a", format!("delegate `{name}`: {m}")))?;
    let token = o.opt_str("token")?;
    if let Some(t) = &token {
        let refs = super::secrets::secret_refs(t)
            .map_err(|e| o.err("token", format!("delegate `{name}`: {e}")))?;
        if refs.is_empty() {
            return Err(o.err(
                "token",
                format!("delegate `{name}`: expected a secret reference such as \"${{{}_TOKEN}}\" (declared in x-agen/secrets.json), not the token itself", name.to_uppercase().replace(|c: char| !c.is_ascii_alphanumeric(), "_")),
            ));
        }
    }
    Ok(Delegate {
        deployment: name,
        namespace: None,
        description: o.opt_str("description")?,
        bundle: None,
        a2a: Some(RemoteAgent {
            card_url: url,
            token,
        }),
    })
}

/// The name an Agen Hub's card URL gives its deployment
/// (`…/a2a/<namespace>/<deployment>/.well-known/agent-card.json`).
fn name_from_card_url(url: &str) -> Option<String> {
    let path = url.split_once("://")?.1.split_once('/')?.1;
    let path = path.split(['?', '#']).next().unwrap_or(path);
    let rest = path.strip_suffix("/.well-known/agent-card.json")?;
    let name = rest.rsplit('/').next()?;
    (!name.is_empty()).then(|| name.to_string())
}

/// An agent card URL: `https://…`, or `http://` only to this machine (127.0.0.1, localhost, [::1]).
pub fn check_card_url(url: &str) -> std::result::Result<(), String> {
    let expected = "expected the https:// URL of its agent card, e.g. https://agents.example.com/.well-known/agent-card.json (http:// is accepted only for 127.0.0.1 and localhost)";
    if url.trim() != url || url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(format!(
            "{expected}, got `{url}` (spaces or control characters)"
        ));
    }
    let (scheme, rest) = url
        .split_once("://")
        .ok_or_else(|| format!("{expected}, got `{url}`"))?;
    let authority = rest.split(['/', '?', '#']).next().unwrap_or("");
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
    let host = if let Some(v6) = host_port.strip_prefix('[') {
        v6.split(']').next().unwrap_or("")
    } else {
        host_port.split(':').next().unwrap_or("")
    };
    if host.is_empty() {
        return Err(format!("{expected}, got `{url}` (no host)"));
    }
    if authority.contains('@') {
        return Err(format!("{expected}, got a URL with credentials in it; put the token in \"token\" as a secret reference"));
    }
    match scheme.to_ascii_lowercase().as_str() {
        "https" => Ok(()),
        "http"
            if matches!(
                host.to_ascii_lowercase().as_str(),
                "127.0.0.1" | "localhost" | "::1"
            ) =>
        {
            Ok(())
        }
        "http" => Err(format!(
            "{expected}, got `{url}`: plain http would send the token in the clear to {host}"
        )),
        other => Err(format!("{expected}, got scheme `{other}`")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn patterns_match_both_tool_name_forms() {
        let check = |pattern: &str, tool: &str, expected: bool| {
            assert_eq!(tool_matches(pattern, tool), expected, "{pattern} vs {tool}");
        };
        check("crm.upsert", "crm.upsert", true);
        check("crm_upsert", "crm.upsert", true);
        check("crm.*", "crm.upsert", true);
        check("crm_*", "crm.upsert", true);
        check("*", "crm.upsert", true);
        check("crm.up*t", "crm.upsert", true);
        check("crm.read", "crm.upsert", false);
        check("crm", "crm.upsert", false);
        check("fs.*", "crm.upsert", false);
    }

    #[test]
    fn deny_beats_ask_beats_allow_and_allow_lists_are_closed() {
        let p = Permissions {
            allow: vec![
                "workspace.read".into(),
                "workspace.list".into(),
                "workspace_grep".into(),
            ],
            ask: vec!["workspace.run".into()],
            deny: vec!["workspace.list".into()],
        };
        let check =
            |tool: &str, expected: Permission| assert_eq!(p.decide(tool), expected, "{tool}");
        check("workspace.read", Permission::Allow);
        check("workspace.grep", Permission::Allow);
        check("workspace.list", Permission::Deny);
        check("workspace.run", Permission::Ask);
        check("workspace.write", Permission::Deny);
        assert_eq!(
            Permissions::default().decide("anything.at_all"),
            Permission::Allow
        );
    }

    #[test]
    fn task_overrides_only_narrow() {
        let bundle = Permissions {
            allow: vec![],
            ask: vec!["ws.run".into()],
            deny: vec!["ws.rm".into()],
        };
        let task = Permissions {
            allow: vec!["ws.read".into(), "ws.run".into(), "ws_rm".into()],
            ask: vec!["ws.write".into()],
            deny: vec!["ws.grep".into()],
        };
        let check = |tool: &str, expected: Permission| {
            assert_eq!(bundle.decide_narrowed(&task, tool), expected, "{tool}")
        };
        check("ws.read", Permission::Allow);
        check("ws.run", Permission::Ask);
        check("ws.rm", Permission::Deny);
        check("ws.write", Permission::Ask);
        check("ws.grep", Permission::Deny);
        check("ws.list", Permission::Deny);
        assert_eq!(
            bundle.widening(&task).len(),
            2,
            "ws.run and ws_rm try to widen: {:?}",
            bundle.widening(&task)
        );
        let star = Permissions {
            allow: vec!["*".into()],
            ..Permissions::default()
        };
        assert_eq!(bundle.widening(&star).len(), 1);
        assert_eq!(Permissions::default().widening(&star), Vec::<String>::new());
        assert_eq!(
            bundle.decide_narrowed(&Permissions::default(), "ws.list"),
            Permission::Allow
        );
    }

    #[test]
    fn overrides_are_found_under_either_name() {
        let mut c = AgentConfig::default();
        c.tools.insert(
            "crm_upsert".into(),
            ToolOverride {
                idempotent: Some(true),
                ..ToolOverride::default()
            },
        );
        assert_eq!(
            c.tool_override("crm.upsert").and_then(|o| o.idempotent),
            Some(true)
        );
        assert!(c.tool_override("crm.read").is_none());
    }

    #[test]
    fn a_tools_own_entry_wins_over_its_servers_key_by_key() {
        let c = parse(&serde_json::json!({"tools": {
            "ws.*": {"timeout": "1s", "retries": 2},
            "ws_read": {"timeout": "30s"},
            "ws.run": {"sideEffect": true, "idempotent": false, "retries": 0}
        }}))
        .expect("parses");
        let of = |t: &str| c.tool_override(t).unwrap_or_default();
        assert_eq!(of("ws.read").timeout, Some(Duration::from_secs(30)));
        assert_eq!(of("ws.read").retries, Some(2));
        assert_eq!(of("ws.grep").timeout, Some(Duration::from_secs(1)));
        assert_eq!(of("ws.run").retries, Some(0));
        assert_eq!(of("ws.run").timeout, Some(Duration::from_secs(1)));
        assert!(c.tool_override("other.read").is_none());
    }
}
