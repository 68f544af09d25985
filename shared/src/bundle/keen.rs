//! `keen-tools.json`: the generic checks of Keen-style tools (script and flow registrations).
//! Deep flow validation (node graph, node types) belongs to the Keen engine in agen-nest.
//!
//! Invariants: a script entry is non-empty, starts with `tools/`, has no `..` and names a file
//! beneath [`keen_script_root`]; a flow entry is `<Controller>-<StartNode>` (split at the first
//! `-`) and `flows/<Controller>.json` exists with that node in its `nodes`; tool names are unique.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::error::{BundleError, Result};
use super::json::{self, kind, Obj};

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
    let Value::Array(items) = &v else {
        return Err(BundleError::invalid(
            KEEN_TOOLS_FILE,
            "(top level)",
            format!("expected an array of tools such as [{{\"name\": ..., \"type\": \"script\", \"entry\": \"tools/x.js\"}}], got {}", kind(&v)),
        ));
    };
    let script_root = keen_script_root(dir);
    let mut seen = BTreeSet::new();
    let mut tools = Vec::new();
    for (i, item) in items.iter().enumerate() {
        let o = Obj::new(
            KEEN_TOOLS_FILE,
            &format!("[{i}]"),
            item,
            "an object with name, type, entry",
        )?;
        o.only_keys(&["name", "type", "entry", "attempts", "description"])?;
        let name = o.opt_str("name")?.unwrap_or_default();
        if name.trim().is_empty() {
            return Err(o.err(
                "name",
                "missing or empty; expected the name the agent uses in `!*tool`",
            ));
        }
        if !seen.insert(name.clone()) {
            return Err(o.err(
                "name",
                format!("tool `{name}` is registered twice; expected unique names"),
            ));
        }
        let entry = o.opt_str("entry")?.unwrap_or_default();
        let kind = match o.opt_str("type")?.as_deref() {
            Some("script") => {
                validate_keen_script_entry(&entry).map_err(|m| o.err("entry", m))?;
                let path = script_root.join(&entry);
                if !path.is_file() {
                    let shown = path
                        .strip_prefix(dir)
                        .unwrap_or(&path)
                        .display()
                        .to_string();
                    return Err(o.err(
                        "entry",
                        format!("script `{entry}` not found; expected a file at {shown}"),
                    ));
                }
                KeenToolKind::Script { path }
            }
            Some("flow") => {
                let (controller, start) =
                    split_flow_entry(&entry).map_err(|m| o.err("entry", m))?;
                check_flow_node(dir, controller, start).map_err(|m| o.err("entry", m))?;
                KeenToolKind::Flow {
                    controller: controller.to_string(),
                    start_node: start.to_string(),
                }
            }
            Some(other) => {
                return Err(o.err(
                    "type",
                    format!("expected \"script\" or \"flow\", got \"{other}\""),
                ))
            }
            None => return Err(o.err("type", "missing; expected \"script\" or \"flow\"")),
        };
        tools.push(KeenTool {
            name,
            kind,
            entry,
            attempts: o.opt_u32("attempts")?,
            description: o.opt_str("description")?,
        });
    }
    Ok(Some(tools))
}

/// `flows/<controller>.json` exists, is JSON with a `nodes` object, and has `start`.
fn check_flow_node(dir: &Path, controller: &str, start: &str) -> std::result::Result<(), String> {
    let file = format!("{FLOWS_DIR}/{controller}.json");
    let v = match json::read_optional(dir, &file) {
        Ok(Some(v)) => v,
        Ok(None) => {
            return Err(format!(
                "flow `{controller}` not found; expected a file {file}"
            ))
        }
        Err(e) => return Err(e.to_string()),
    };
    let has_node = v
        .get("nodes")
        .and_then(Value::as_object)
        .map(|n| n.contains_key(start));
    match has_node {
        Some(true) => Ok(()),
        Some(false) => Err(format!(
            "{file} has no node `{start}`; expected it under \"nodes\""
        )),
        None => Err(format!(
            "{file}: expected an object with \"nodes\": {{...}}"
        )),
    }
}
