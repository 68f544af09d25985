//! Flow tools: `flows/<Controller>.json` parsing and validation, and the runner that walks a
//! flow's nodes over one isolated dictionary.
//!
//! File format (`docs/keen.md`): `{"nodes": {id: node}}` with node types
//! `start {next}`, `script {entry, next}`, `agent {prompt, next}`,
//! `condition {key, equals, then, else}` and `end {}`; any node may also carry `description`
//! or `label`. Validation (every problem names the file and the node): known types and
//! fields, required fields present and strings (`equals` may be any JSON scalar and is compared
//! as text), script entries pass [`validate_script_entry`], every reference names an existing
//! node, the file has a start node, and every node can reach an `end` (so a cycle always has an
//! exit).
//!
//! Runner invariants: one fresh dictionary per run with `dictionary.context` the raw
//! `!*context`; script nodes run JS against the shared dictionary; agent nodes ask the
//! bundle's own model through [`FlowAgent`] and store its answer in `dictionary.result` and
//! its type in `dictionary.responseType`; a condition compares the text of
//! `dictionary[key]` with `equals` (a missing or null key never matches); a run stops after
//! [`MAX_FLOW_STEPS`] nodes.

use std::collections::{BTreeMap, HashMap, VecDeque};

use serde_json::{Map, Value as Json};

use super::registry::{validate_script_entry, KeenBundle};
use super::script::{run_entry, ScriptLimits, ScriptOutcome};
use super::{KeenError, Result};

/// The step cap of one flow run.
pub const MAX_FLOW_STEPS: usize = 256;

/// One node of a flow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FlowNode {
    Start {
        next: String,
    },
    Script {
        entry: String,
        next: String,
    },
    Agent {
        prompt: String,
        next: String,
    },
    Condition {
        key: String,
        equals: String,
        then: String,
        otherwise: String,
    },
    End,
}

impl FlowNode {
    fn successors(&self) -> Vec<(&'static str, &str)> {
        match self {
            FlowNode::Start { next }
            | FlowNode::Script { next, .. }
            | FlowNode::Agent { next, .. } => {
                vec![("next", next.as_str())]
            }
            FlowNode::Condition {
                then, otherwise, ..
            } => {
                vec![("then", then.as_str()), ("else", otherwise.as_str())]
            }
            FlowNode::End => Vec::new(),
        }
    }
}

/// A validated flow file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Flow {
    pub nodes: BTreeMap<String, FlowNode>,
}

/// Parses and validates one flow file; `file` labels the problems (e.g. `flows/Next.json`).
pub fn parse_flow(file: &str, text: &str) -> Result<Flow> {
    let value: Json = serde_json::from_str(text)
        .map_err(|e| KeenError::Invalid(vec![format!("{file}: not valid JSON: {e}")]))?;
    let Some(nodes) = value.get("nodes").and_then(Json::as_object) else {
        return Err(KeenError::Invalid(vec![format!(
            "{file}: expected an object {{\"nodes\": {{\"<id>\": {{\"type\": \"start\", \"next\": \"…\"}}, …}}}}"
        )]));
    };
    let mut problems = Vec::new();
    if let Some(obj) = value.as_object() {
        for key in obj
            .keys()
            .filter(|k| !matches!(k.as_str(), "nodes" | "description"))
        {
            problems.push(format!(
                "{file}: unknown top-level field {key:?}; expected nodes"
            ));
        }
    }
    let mut parsed = BTreeMap::new();
    for (id, node) in nodes {
        match parse_node(node) {
            Ok(n) => {
                parsed.insert(id.clone(), n);
            }
            Err(why) => problems.push(format!("{file}: node {id:?}: {why}")),
        }
    }
    if !problems.is_empty() {
        return Err(KeenError::Invalid(problems));
    }
    for (id, node) in &parsed {
        for (field, target) in node.successors() {
            if !parsed.contains_key(target) {
                problems.push(format!(
                    "{file}: node {id:?}: {field}: unknown node {target:?}"
                ));
            }
        }
    }
    if !parsed.values().any(|n| matches!(n, FlowNode::Start { .. })) {
        problems.push(format!(
            "{file}: has no start node; add {{\"type\": \"start\", \"next\": \"…\"}}"
        ));
    }
    if problems.is_empty() {
        // Every node must reach an end: walk the edges backwards from the end nodes.
        let mut preds: HashMap<&str, Vec<&str>> = HashMap::new();
        for (id, node) in &parsed {
            for (_, target) in node.successors() {
                preds.entry(target).or_default().push(id);
            }
        }
        let mut reaches_end: std::collections::HashSet<&str> = parsed
            .iter()
            .filter(|(_, n)| matches!(n, FlowNode::End))
            .map(|(id, _)| id.as_str())
            .collect();
        let mut queue: VecDeque<&str> = reaches_end.iter().copied().collect();
        while let Some(id) = queue.pop_front() {
            for p in preds.get(id).into_iter().flatten() {
                if reaches_end.insert(p) {
                    queue.push_back(p);
                }
            }
        }
        for id in parsed
            .keys()
            .filter(|id| !reaches_end.contains(id.as_str()))
        {
            problems.push(format!(
                "{file}: node {id:?}: cannot reach an end node (a loop without an exit, or no end node)"
            ));
        }
    }
    if problems.is_empty() {
        Ok(Flow { nodes: parsed })
    } else {
        Err(KeenError::Invalid(problems))
    }
}

fn parse_node(node: &Json) -> std::result::Result<FlowNode, String> {
    let Some(obj) = node.as_object() else {
        return Err("expected an object with a type".into());
    };
    let ty = obj
        .get("type")
        .and_then(Json::as_str)
        .ok_or("type: missing; expected start, script, agent, condition or end")?;
    let allowed: &[&str] = match ty {
        "start" => &["next"],
        "script" => &["entry", "next"],
        "agent" => &["prompt", "next"],
        "condition" => &["key", "equals", "then", "else"],
        "end" => &[],
        other => {
            return Err(format!(
                "type: unknown node type {other:?}; expected start, script, agent, condition or end"
            ))
        }
    };
    for key in obj.keys() {
        if key != "type"
            && key != "description"
            && key != "label"
            && !allowed.contains(&key.as_str())
        {
            let expected = if allowed.is_empty() {
                "no other fields".to_string()
            } else {
                allowed.join(", ")
            };
            return Err(format!(
                "{key}: unknown field for a {ty} node; expected {expected}"
            ));
        }
    }
    let field = |name: &str| -> std::result::Result<String, String> {
        match obj.get(name) {
            Some(Json::String(s)) if !s.is_empty() => Ok(s.clone()),
            Some(Json::String(_)) => Err(format!("{name}: must not be empty")),
            Some(_) => Err(format!("{name}: expected a string")),
            None => Err(format!("{name}: missing in a {ty} node")),
        }
    };
    Ok(match ty {
        "start" => FlowNode::Start {
            next: field("next")?,
        },
        "script" => {
            let entry = field("entry")?;
            validate_script_entry(&entry).map_err(|e| format!("entry: {e}"))?;
            FlowNode::Script {
                entry,
                next: field("next")?,
            }
        }
        "agent" => FlowNode::Agent {
            prompt: field("prompt")?,
            next: field("next")?,
        },
        "condition" => {
            let equals = match obj.get("equals") {
                Some(Json::String(s)) => s.clone(),
                Some(v @ (Json::Number(_) | Json::Bool(_))) => v.to_string(),
                Some(_) => return Err("equals: expected a string, number or boolean".into()),
                None => return Err("equals: missing in a condition node".into()),
            };
            FlowNode::Condition {
                key: field("key")?,
                equals,
                then: field("then")?,
                otherwise: field("else")?,
            }
        }
        _ => FlowNode::End,
    })
}

/// The bundle's own model, as flow `agent` nodes see it (implemented by the harness).
#[async_trait::async_trait]
pub trait FlowAgent: Send + Sync {
    /// Asks the model `prompt` with the flow's `dictionary.context`. Returns the answer and its
    /// `responseType` (`"text"` or `"error"` for a provider error), or an error text when the
    /// model could not be asked at all.
    async fn ask(
        &self,
        prompt: &str,
        context: &str,
    ) -> std::result::Result<(String, String), String>;
}

/// How a flow run ended.
#[derive(Debug, Clone, PartialEq)]
pub enum FlowOutcome {
    /// An `end` node was reached.
    Done {
        /// `dictionary.result` (non-strings as JSON text), `None` when unset.
        result: Option<String>,
        /// `dictionary.toolStatus === "error"`.
        tool_status_error: bool,
        dictionary: Json,
    },
    /// A node failed; `error` is the sentence for `<SYSTEM FLOW ERROR>`, e.g.
    /// `ScriptNode "compute-stamp" threw: ReferenceError: now is not defined`.
    NodeFailed { node: String, error: String },
    /// The controller or start node does not exist (a general failure).
    BadEntry(String),
}

/// Runs `flows/<controller>.json` from `start_node` with a fresh dictionary `{context}`.
pub async fn run_flow(
    bundle: &KeenBundle,
    controller: &str,
    start_node: &str,
    context: &str,
    agent: &dyn FlowAgent,
    limits: &ScriptLimits,
) -> FlowOutcome {
    let Some(flow) = bundle.flows.get(controller) else {
        return FlowOutcome::BadEntry(format!("no flow file flows/{controller}.json"));
    };
    match flow.nodes.get(start_node) {
        Some(FlowNode::Start { .. }) => {}
        _ => {
            return FlowOutcome::BadEntry(format!(
                "flows/{controller}.json has no start node {start_node:?}"
            ))
        }
    }
    let mut dictionary = Map::new();
    dictionary.insert("context".into(), Json::String(context.to_string()));
    let mut dictionary = Json::Object(dictionary);
    let mut current = start_node.to_string();
    for _ in 0..MAX_FLOW_STEPS {
        let Some(node) = flow.nodes.get(&current) else {
            return FlowOutcome::BadEntry(format!(
                "flows/{controller}.json has no node {current:?}"
            ));
        };
        tracing::debug!(target: "keen::flow", controller, node = %current, "flow step");
        let next = match node {
            FlowNode::Start { next } => next.clone(),
            FlowNode::End => return finish(dictionary),
            FlowNode::Script { entry, next } => {
                let why = match run_entry(&bundle.script_root, entry, dictionary.clone(), limits)
                    .await
                {
                    ScriptOutcome::Ok { dictionary: d, .. } => {
                        dictionary = keep_context(d, context);
                        current = next.clone();
                        continue;
                    }
                    ScriptOutcome::Threw(msg) => format!("threw: {msg}"),
                    ScriptOutcome::TimedOut => {
                        format!(
                            "timed out after {}",
                            humantime::format_duration(limits.timeout)
                        )
                    }
                    ScriptOutcome::OutOfMemory => "ran out of memory".to_string(),
                    ScriptOutcome::BadEntry(detail) => {
                        tracing::warn!(target: "keen::flow", controller, node = %current, "bad script entry: {detail}");
                        "could not load its script".to_string()
                    }
                };
                return FlowOutcome::NodeFailed {
                    error: format!("ScriptNode {current:?} {why}"),
                    node: current,
                };
            }
            FlowNode::Agent { prompt, next } => {
                let ctx_text = dictionary
                    .get("context")
                    .and_then(Json::as_str)
                    .unwrap_or_default()
                    .to_string();
                match agent.ask(prompt, &ctx_text).await {
                    Ok((answer, response_type)) => {
                        if let Some(d) = dictionary.as_object_mut() {
                            d.insert("result".into(), Json::String(answer));
                            d.insert("responseType".into(), Json::String(response_type));
                        }
                        next.clone()
                    }
                    Err(e) => {
                        return FlowOutcome::NodeFailed {
                            error: format!("AgentNode {current:?} failed: {e}"),
                            node: current,
                        }
                    }
                }
            }
            FlowNode::Condition {
                key,
                equals,
                then,
                otherwise,
            } => {
                let value = dictionary.get(key).and_then(value_text);
                if value.as_deref() == Some(equals.as_str()) {
                    then.clone()
                } else {
                    otherwise.clone()
                }
            }
        };
        current = next;
    }
    FlowOutcome::NodeFailed {
        error: format!("Flow stopped at node {current:?} after {MAX_FLOW_STEPS} steps (a loop?)"),
        node: current,
    }
}

/// The text a condition compares: strings as they are, numbers/booleans as JSON, null as none.
fn value_text(v: &Json) -> Option<String> {
    match v {
        Json::Null => None,
        Json::String(s) => Some(s.clone()),
        other => Some(other.to_string()),
    }
}

fn keep_context(mut d: Json, context: &str) -> Json {
    if !d.is_object() {
        d = Json::Object(Map::new());
    }
    if let Some(obj) = d.as_object_mut() {
        if !obj.get("context").is_some_and(Json::is_string) {
            obj.insert("context".into(), Json::String(context.to_string()));
        }
    }
    d
}

fn finish(dictionary: Json) -> FlowOutcome {
    let result = dictionary.get("result").and_then(value_text);
    let tool_status_error = dictionary.get("toolStatus").and_then(Json::as_str) == Some("error");
    FlowOutcome::Done {
        result,
        tool_status_error,
        dictionary,
    }
}

#[cfg(test)]
mod tests;
