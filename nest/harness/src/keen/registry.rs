//! `keen-tools.json` (the tool registry) and [`KeenBundle`], the validated Keen parts of a
//! bundle: registry, flows and the script root.
//!
//! Invariants: every problem names the file, the index/field (or node) and what was expected;
//! all problems of a bundle are reported at once; a loaded [`KeenBundle`] has unique tool
//! names; a script entry that is invalid or names no file and a flow entry whose controller
//! file or start node is missing are [`KeenBundle::warnings`], not problems (the guide: the
//! agent gets the general recall when it calls one). [`validate_script_entry`] is the one path check used at deploy, before
//! dispatch and by the script engine.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use super::flow::{parse_flow, Flow, FlowNode};
use super::{KeenError, KeenToolKind, Result};

/// The registry file name at the bundle root.
pub const REGISTRY_FILE: &str = "keen-tools.json";

/// A script entry that fails the spec's path rules; the message says which and what to write.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct EntryError(pub String);

/// The spec's script path rule (non-empty, starts with `tools/`, no `..`, `/` separators, no
/// NUL): the bundle format's own rule, so deploy, dispatch and the script engine agree.
pub fn validate_script_entry(entry: &str) -> std::result::Result<(), EntryError> {
    agen_shared::bundle::validate_keen_script_entry(entry).map_err(EntryError)
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

/// What a registered tool runs (the bundle format's type).
pub use agen_shared::bundle::KeenToolEntry as ToolEntry;

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

/// Parses `keen-tools.json` text without touching the file system: the bundle format's one
/// reading of the registry ([`agen_shared::bundle::parse_keen_registry`]), as engine tools.
pub fn parse_registry(file: &str, text: &str) -> Result<Vec<KeenTool>> {
    let registered =
        agen_shared::bundle::parse_keen_registry(file, text).map_err(KeenError::Invalid)?;
    Ok(registered
        .into_iter()
        .map(|t| KeenTool {
            name: t.name,
            kind: match t.entry {
                ToolEntry::Script { .. } => KeenToolKind::Script,
                ToolEntry::Flow { .. } => KeenToolKind::Flow,
            },
            entry: t.entry,
            attempts: t.attempts,
            description: t.description,
        })
        .collect())
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
    /// Tools that cannot run as registered (a script path the rule refuses or that does not
    /// exist, a missing flow file or start node): warned at deploy; a call to one gets the
    /// general "no tool response" recall at run time (the Keen guide), never a refused bundle.
    pub warnings: Vec<String>,
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

        let mut warnings = Vec::new();
        for (i, tool) in tools.iter().enumerate() {
            match &tool.entry {
                ToolEntry::Script { path } => {
                    if let Err(e) = validate_script_entry(path) {
                        warnings.push(format!("{REGISTRY_FILE}: [{i}].entry: {e}"));
                    } else if !script_root.join(path).is_file() {
                        warnings.push(format!(
                            "{REGISTRY_FILE}: [{i}].entry: script {root_label}{path} does not exist"
                        ));
                    }
                }
                ToolEntry::Flow { controller, start_node } => match flows.get(controller) {
                    // An invalid flow file has been reported above.
                    None if flows_dir.join(format!("{controller}.json")).is_file() => {}
                    None => warnings.push(format!(
                        "{REGISTRY_FILE}: [{i}].entry: flow file flows/{controller}.json does not exist"
                    )),
                    Some(flow) => match flow.nodes.get(start_node) {
                        Some(FlowNode::Start { .. }) => {}
                        Some(_) => warnings.push(format!(
                            "{REGISTRY_FILE}: [{i}].entry: node {start_node:?} in flows/{controller}.json is not a start node"
                        )),
                        None => warnings.push(format!(
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
            warnings,
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
