//! `keen-tools.json` (the tool registry) and [`KeenBundle`], the validated Keen parts of a
//! bundle: registry, flows and the script root.
//!
//! Invariants: every problem names the file, the index/field (or node) and what was expected;
//! all problems of a bundle are reported at once; a loaded [`KeenBundle`] has unique tool
//! names, valid script entries whose files exist, and flow entries whose controller file and
//! start node exist. [`validate_script_entry`] is the one path check used at deploy, before
//! dispatch and by the script engine.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};

use serde_json::Value;

use super::flow::{parse_flow, Flow, FlowNode};
use super::{KeenError, KeenToolKind, Result};

/// The registry file name at the bundle root.
pub const REGISTRY_FILE: &str = "keen-tools.json";

/// A script entry that fails the spec's path rules.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    #[error("script entry is empty; expected a path like tools/my-tool.js")]
    Empty,
    #[error("script entry {0:?} must start with tools/")]
    NotUnderTools(String),
    #[error("script entry {0:?} must not contain ..")]
    ParentSegment(String),
}

/// The spec's script path rule: non-empty, starts with `tools/`, no `..` anywhere.
pub fn validate_script_entry(entry: &str) -> std::result::Result<(), EntryError> {
    if entry.is_empty() {
        return Err(EntryError::Empty);
    }
    if !entry.starts_with("tools/") {
        return Err(EntryError::NotUnderTools(entry.to_string()));
    }
    if entry.contains("..") {
        return Err(EntryError::ParentSegment(entry.to_string()));
    }
    Ok(())
}

/// The script root of a bundle: `src/scripts/` when it exists, else the bundle root.
pub fn script_root(bundle_dir: &Path) -> PathBuf {
    let scripts = bundle_dir.join("src").join("scripts");
    if scripts.is_dir() {
        scripts
    } else {
        bundle_dir.to_path_buf()
    }
}

/// What a registered tool runs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolEntry {
    /// `tools/….js` beneath the script root.
    Script { path: String },
    /// `<Controller>-<StartNode>`, split at the first `-`.
    Flow {
        controller: String,
        start_node: String,
    },
}

/// One validated `keen-tools.json` entry.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeenTool {
    pub name: String,
    /// [`KeenToolKind::Script`] or [`KeenToolKind::Flow`].
    pub kind: KeenToolKind,
    pub entry: ToolEntry,
    pub attempts: Option<u32>,
    /// Optional purpose line for the prompt (an Agen extension; the spec's prompt is written
    /// by hand). Defaults to "Accepts context." when absent.
    pub description: Option<String>,
}

/// Splits a flow entry `<Controller>-<StartNode>` at the first `-`.
pub fn split_flow_entry(entry: &str) -> Option<(&str, &str)> {
    let (controller, start) = entry.split_once('-')?;
    if controller.is_empty() || start.is_empty() {
        return None;
    }
    Some((controller, start))
}

/// Parses `keen-tools.json` text without touching the file system (names, types, entry shapes,
/// attempts). `file` labels the problems.
pub fn parse_registry(file: &str, text: &str) -> Result<Vec<KeenTool>> {
    let value: Value = serde_json::from_str(text)
        .map_err(|e| KeenError::Invalid(vec![format!("{file}: not valid JSON: {e}")]))?;
    let Value::Array(items) = value else {
        return Err(KeenError::Invalid(vec![format!(
            "{file}: expected a JSON array of tools like [{{\"name\": \"ToolTimestamp\", \"type\": \"script\", \"entry\": \"tools/stamp.js\"}}]"
        )]));
    };
    let mut problems = Vec::new();
    let mut tools = Vec::new();
    let mut names = HashSet::new();
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
        let kind = match obj.get("type").and_then(Value::as_str) {
            Some("script") => Some(KeenToolKind::Script),
            Some("flow") => Some(KeenToolKind::Flow),
            _ => {
                problems.push(format!("{}: expected \"script\" or \"flow\"", at("type")));
                None
            }
        };
        let entry = match (obj.get("entry"), kind) {
            (Some(Value::String(e)), Some(KeenToolKind::Script)) => {
                match validate_script_entry(e) {
                    Ok(()) => Some(ToolEntry::Script { path: e.clone() }),
                    Err(err) => {
                        problems.push(format!("{}: {err}", at("entry")));
                        None
                    }
                }
            }
            // The type is wrong: already reported, the entry cannot be judged.
            (Some(Value::String(_)), None) => None,
            (Some(Value::String(e)), Some(_)) => match split_flow_entry(e) {
                Some((c, s)) if is_safe_controller(c) => Some(ToolEntry::Flow {
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
        if let (Some(name), Some(kind), Some(entry)) = (name, kind, entry) {
            tools.push(KeenTool {
                name,
                kind,
                entry,
                attempts,
                description,
            });
        }
    }
    if problems.is_empty() {
        Ok(tools)
    } else {
        Err(KeenError::Invalid(problems))
    }
}

fn is_safe_controller(c: &str) -> bool {
    !c.contains(['/', '\\', '.']) && !c.trim().is_empty()
}

/// The validated Keen parts of a bundle.
#[derive(Debug, Clone)]
pub struct KeenBundle {
    /// The bundle folder.
    pub bundle_dir: PathBuf,
    /// `src/scripts/` or the bundle root (see [`script_root`]).
    pub script_root: PathBuf,
    /// Registered tools, in file order.
    pub tools: Vec<KeenTool>,
    /// Every `flows/*.json`, by controller name.
    pub flows: BTreeMap<String, Flow>,
}

impl KeenBundle {
    /// Loads and validates `keen-tools.json`, every `flows/*.json` and the script files they
    /// name. `Ok(None)` when the bundle has no `keen-tools.json`.
    pub fn load(bundle_dir: &Path) -> Result<Option<KeenBundle>> {
        let registry_path = bundle_dir.join(REGISTRY_FILE);
        if !registry_path.exists() {
            return Ok(None);
        }
        let text = read(&registry_path, REGISTRY_FILE)?;
        let mut problems = Vec::new();
        let tools = match parse_registry(REGISTRY_FILE, &text) {
            Ok(t) => t,
            Err(KeenError::Invalid(p)) => {
                problems.extend(p);
                Vec::new()
            }
            Err(e) => return Err(e),
        };
        let script_root = script_root(bundle_dir);
        let root_label = if script_root == bundle_dir {
            String::new()
        } else {
            "src/scripts/".to_string()
        };

        let mut flows = BTreeMap::new();
        let flows_dir = bundle_dir.join("flows");
        if flows_dir.is_dir() {
            let mut entries: Vec<PathBuf> = std::fs::read_dir(&flows_dir)
                .map_err(|source| KeenError::Io {
                    path: "flows/".into(),
                    source,
                })?
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| p.extension().is_some_and(|x| x == "json"))
                .collect();
            entries.sort();
            for path in entries {
                let Some(controller) = path
                    .file_stem()
                    .and_then(|s| s.to_str())
                    .map(str::to_string)
                else {
                    continue;
                };
                let label = format!("flows/{controller}.json");
                let text = read(&path, &label)?;
                match parse_flow(&label, &text) {
                    Ok(flow) => {
                        for (node_id, node) in &flow.nodes {
                            if let FlowNode::Script { entry, .. } = node {
                                if validate_script_entry(entry).is_ok()
                                    && !script_root.join(entry).is_file()
                                {
                                    problems.push(format!(
                                        "{label}: node {node_id:?}: script {root_label}{entry} does not exist"
                                    ));
                                }
                            }
                        }
                        flows.insert(controller, flow);
                    }
                    Err(KeenError::Invalid(p)) => problems.extend(p),
                    Err(e) => return Err(e),
                }
            }
        }

        for (i, tool) in tools.iter().enumerate() {
            match &tool.entry {
                ToolEntry::Script { path } => {
                    if !script_root.join(path).is_file() {
                        problems.push(format!(
                            "{REGISTRY_FILE}: [{i}].entry: script {root_label}{path} does not exist"
                        ));
                    }
                }
                ToolEntry::Flow { controller, start_node } => match flows.get(controller) {
                    // An invalid flow file has been reported above.
                    None if flows_dir.join(format!("{controller}.json")).is_file() => {}
                    None => problems.push(format!(
                        "{REGISTRY_FILE}: [{i}].entry: flow file flows/{controller}.json does not exist"
                    )),
                    Some(flow) => match flow.nodes.get(start_node) {
                        Some(FlowNode::Start { .. }) => {}
                        Some(_) => problems.push(format!(
                            "{REGISTRY_FILE}: [{i}].entry: node {start_node:?} in flows/{controller}.json is not a start node"
                        )),
                        None => problems.push(format!(
                            "{REGISTRY_FILE}: [{i}].entry: flows/{controller}.json has no node {start_node:?}"
                        )),
                    },
                },
            }
        }
        if !problems.is_empty() {
            return Err(KeenError::Invalid(problems));
        }
        Ok(Some(KeenBundle {
            bundle_dir: bundle_dir.to_path_buf(),
            script_root,
            tools,
            flows,
        }))
    }

    /// The registered tool with this exact (case-sensitive) name.
    pub fn tool(&self, name: &str) -> Option<&KeenTool> {
        self.tools.iter().find(|t| t.name == name)
    }
}

fn read(path: &Path, label: &str) -> Result<String> {
    std::fs::read_to_string(path).map_err(|source| KeenError::Io {
        path: label.to_string(),
        source,
    })
}

#[cfg(test)]
mod tests;
