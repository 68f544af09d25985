//! `keen-tools.json`: the generic checks of Keen-style tools (script and flow registrations).
//! Deep flow validation (node graph, node types) belongs to the Keen engine in agen-nest.
//!
//! Invariants: a flow entry is `<Controller>-<StartNode>` (split at the first `-`); tool names
//! are unique. A script entry that breaks the path rule (non-empty, `tools/`, no `..`) or names
//! no file, and a flow whose file or node is missing, are registered all the same: the Keen
//! guide's engine answers a call to one with the general recall, and deploy warns.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::{BundleError, Result};
use super::json;

pub const KEEN_TOOLS_FILE: &str = "keen-tools.json";
pub const FLOWS_DIR: &str = "flows";

/// One registered Keen tool.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct KeenTool {
    /// What the model writes in `!*tool` (case-sensitive, may contain spaces).
    pub name: String,
    pub kind: KeenToolKind,
    /// The entry as written (`tools/x.js` or `Controller-StartNode`).
    pub entry: String,
    /// `attempts`: recalls allowed after the first call; `None` = no per-tool limit.
    pub attempts: Option<u32>,
    /// Optional description for the tools section of the system prompt.
    pub description: Option<String>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum KeenToolKind {
    /// A JS module under the script root; `path` is the entry resolved against it.
    Script { path: PathBuf },
    /// A flow in `flows/<controller>.json`, started at `start_node`.
    Flow {
        controller: String,
        start_node: String,
    },
}

/// What a registered tool runs, as `keen-tools.json` writes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum KeenToolEntry {
    /// `tools/….js` beneath the script root.
    Script { path: String },
    /// `<Controller>-<StartNode>`, split at the first `-`.
    Flow {
        controller: String,
        start_node: String,
    },
}

/// One `keen-tools.json` entry checked for its shape only ([`parse_keen_registry`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegisteredTool {
    pub name: String,
    pub entry: KeenToolEntry,
    pub attempts: Option<u32>,
    pub description: Option<String>,
}

#[derive(Debug, Clone, Copy)]
enum EntryKind {
    Script,
    Flow,
}

/// Where script entries (`tools/x.js`) are resolved: `src/scripts/` when the bundle has that
/// folder, else the bundle root.
pub fn keen_script_root(dir: &Path) -> PathBuf {
    let scripts = dir.join("src").join("scripts");
    if scripts.is_dir() {
        scripts
    } else {
        dir.to_path_buf()
    }
}

/// The spec's script path rule: non-empty, starts with `tools/`, no `..`.
pub fn validate_keen_script_entry(entry: &str) -> std::result::Result<(), String> {
    if entry.is_empty() {
        return Err("script entry is empty; expected a path such as `tools/my-tool.js`".into());
    }
    if !entry.starts_with("tools/") {
        return Err(format!(
            "script entry `{entry}` must start with `tools/` (e.g. `tools/my-tool.js`)"
        ));
    }
    if entry.contains("..") {
        return Err(format!("script entry `{entry}` must not contain `..`"));
    }
    if entry.contains('\\') || entry.contains('\0') {
        return Err(format!(
            "script entry `{entry}` must use `/` separators and no NUL"
        ));
    }
    Ok(())
}

/// Splits a flow entry `<Controller>-<StartNode>` at the first `-`.
pub fn split_flow_entry(entry: &str) -> std::result::Result<(&str, &str), String> {
    match entry.split_once('-') {
        Some((c, n)) if !c.is_empty() && !n.is_empty() && !c.contains(['/', '\\', '.']) => Ok((c, n)),
        _ => Err(format!(
            "flow entry `{entry}`: expected `<Controller>-<StartNode>` such as `Next-ToolCall` (flows/<Controller>.json, node <StartNode>)"
        )),
    }
}

pub(crate) fn load(dir: &Path) -> Result<Option<Vec<KeenTool>>> {
    let Some(v) = json::read_optional(dir, KEEN_TOOLS_FILE)? else {
        return Ok(None);
    };
    let registered =
        parse_keen_registry_value(KEEN_TOOLS_FILE, &v).map_err(|problems| BundleError::File {
            file: KEEN_TOOLS_FILE.to_string(),
            message: problems
                .iter()
                .map(|p| p.strip_prefix("keen-tools.json: ").unwrap_or(p))
                .collect::<Vec<_>>()
                .join("; "),
        })?;
    let script_root = keen_script_root(dir);
    let mut tools = Vec::new();
    for (i, t) in registered.into_iter().enumerate() {
        let kind = match &t.entry {
            // A script that is invalid or missing, a flow that is missing: registered all the
            // same (warned at deploy by the Keen engine's load; the call gets the general
            // recall at run time, as the Keen guide says).
            KeenToolEntry::Script { path: entry } => KeenToolKind::Script {
                path: script_root.join(entry),
            },
            KeenToolEntry::Flow {
                controller,
                start_node,
            } => {
                // A flow file that is there must be JSON (the Keen engine's load checks its
                // nodes).
                let file = format!("{FLOWS_DIR}/{controller}.json");
                json::read_optional(dir, &file).map_err(|e| {
                    BundleError::invalid(KEEN_TOOLS_FILE, &format!("[{i}].entry"), e.to_string())
                })?;
                KeenToolKind::Flow {
                    controller: controller.clone(),
                    start_node: start_node.clone(),
                }
            }
        };
        let entry = match &t.entry {
            KeenToolEntry::Script { path } => path.clone(),
            KeenToolEntry::Flow {
                controller,
                start_node,
            } => format!("{controller}-{start_node}"),
        };
        tools.push(KeenTool {
            name: t.name,
            kind,
            entry,
            attempts: t.attempts,
            description: t.description,
        });
    }
    Ok(Some(tools))
}

/// Parses `keen-tools.json` text without touching the file system (names, types, entry shapes,
/// attempts): the one reading of the registry, used at deploy ([`load`], which then checks the
/// files it names) and by the Keen engine. `file` labels the problems, all of which are
/// returned at once.
pub fn parse_keen_registry(
    file: &str,
    text: &str,
) -> std::result::Result<Vec<RegisteredTool>, Vec<String>> {
    let value: Value =
        serde_json::from_str(text).map_err(|e| vec![format!("{file}: not valid JSON: {e}")])?;
    parse_keen_registry_value(file, &value)
}

/// [`parse_keen_registry`] of JSON already read.
pub fn parse_keen_registry_value(
    file: &str,
    value: &Value,
) -> std::result::Result<Vec<RegisteredTool>, Vec<String>> {
    let Value::Array(items) = value else {
        return Err(vec![format!(
            "{file}: expected a JSON array of tools like [{{\"name\": \"ToolTimestamp\", \"type\": \"script\", \"entry\": \"tools/stamp.js\"}}]"
        )]);
    };
    let mut problems = Vec::new();
    let mut tools = Vec::new();
    let mut names = BTreeSet::new();
    for (i, item) in items.iter().enumerate() {
        let at = |field: &str| format!("{file}: [{i}].{field}");
        let Value::Object(obj) = item else {
            problems.push(format!(
                "{file}: [{i}]: expected an object with name, type and entry"
            ));
            continue;
        };
        for key in obj.keys() {
            if !matches!(
                key.as_str(),
                "name" | "type" | "entry" | "attempts" | "description"
            ) {
                problems.push(format!(
                    "{}: unknown field; expected name, type, entry, attempts or description",
                    at(key)
                ));
            }
        }
        let name = match obj.get("name") {
            Some(Value::String(s))
                if !s.trim().is_empty() && s.trim() == s && !s.contains('\n') =>
            {
                Some(s.clone())
            }
            Some(Value::String(_)) => {
                problems.push(format!(
                    "{}: must be a non-empty single line without surrounding spaces",
                    at("name")
                ));
                None
            }
            Some(_) => {
                problems.push(format!("{}: expected a string", at("name")));
                None
            }
            None => {
                problems.push(format!("{}: missing; expected the tool's name", at("name")));
                None
            }
        };
        if let Some(n) = &name {
            if !names.insert(n.clone()) {
                problems.push(format!(
                    "{}: duplicate tool name {n:?}; names must be unique",
                    at("name")
                ));
            }
        }
        let kind = match obj.get("type") {
            Some(Value::String(t)) if t == "script" => Some(EntryKind::Script),
            Some(Value::String(t)) if t == "flow" => Some(EntryKind::Flow),
            Some(other) => {
                let got = match other {
                    Value::String(t) => format!("\"{}\"", t.chars().take(40).collect::<String>()),
                    v => json::kind(v).to_string(),
                };
                problems.push(format!(
                    "{}: expected \"script\" or \"flow\", got {got}",
                    at("type")
                ));
                None
            }
            None => {
                problems.push(format!(
                    "{}: missing; expected \"script\" or \"flow\"",
                    at("type")
                ));
                None
            }
        };
        let entry = match (obj.get("entry"), kind) {
            // An entry the path rule refuses is registered all the same: the engine checks it
            // before dispatch and answers a call with the general recall (the Keen guide);
            // deploy warns about it (`validate_keen_script_entry`).
            (Some(Value::String(e)), Some(EntryKind::Script)) => {
                Some(KeenToolEntry::Script { path: e.clone() })
            }
            // The type is wrong: already reported, the entry cannot be judged.
            (Some(Value::String(_)), None) => None,
            (Some(Value::String(e)), Some(_)) => match split_flow_entry(e) {
                Ok((c, s)) if is_safe_controller(c) => Some(KeenToolEntry::Flow {
                    controller: c.to_string(),
                    start_node: s.to_string(),
                }),
                _ => {
                    problems.push(format!(
                        "{}: flow entry {e:?} must be <Controller>-<StartNode>, e.g. \"Next-ToolCall\" (a controller name without / or .)",
                        at("entry")
                    ));
                    None
                }
            },
            (Some(_), _) => {
                problems.push(format!("{}: expected a string", at("entry")));
                None
            }
            (None, _) => {
                problems.push(format!(
                    "{}: missing; expected tools/<file>.js for a script or <Controller>-<StartNode> for a flow",
                    at("entry")
                ));
                None
            }
        };
        let attempts = match obj.get("attempts") {
            None | Some(Value::Null) => None,
            Some(v) => match v.as_u64().and_then(|n| u32::try_from(n).ok()) {
                Some(n) => Some(n),
                None => {
                    problems.push(format!("{}: expected a whole number >= 0", at("attempts")));
                    None
                }
            },
        };
        let description = match obj.get("description") {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.clone()),
            Some(_) => {
                problems.push(format!("{}: expected a string", at("description")));
                None
            }
        };
        if let (Some(name), Some(_), Some(entry)) = (name, kind, entry) {
            tools.push(RegisteredTool {
                name,
                entry,
                attempts,
                description,
            });
        }
    }
    if problems.is_empty() {
        Ok(tools)
    } else {
        Err(problems)
    }
}

fn is_safe_controller(c: &str) -> bool {
    !c.contains(['/', '\\', '.']) && !c.trim().is_empty()
}
