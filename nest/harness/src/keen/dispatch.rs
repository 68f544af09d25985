//! Dispatch decisions for one run (pure logic, no IO): which tool a parsed reply calls, the
//! attempts ledger, the run-wide cap, and the exact texts the model gets back.
//!
//! Invariants:
//! - the general recovery prompt is exactly [`GENERAL_FAILURE`], plain (no markers, no
//!   attempts line), and quotes nothing of the call or the project; the details go to the log
//!   (`Decision::Recall::log`, [`ToolResult::log_detail`]). It answers: a malformed block, an
//!   unknown tool, a wrong action for the tool's type, an invalid script path, a missing flow
//!   entry, no response (`dictionary.result` unset), and a script that threw, timed out or ran
//!   out of memory;
//! - results: `<SYSTEM RESPONSE>\n{result}\n</SYSTEM RESPONSE>`; `toolStatus = 'error'` from a
//!   script (or an MCP tool's error result) → `<SYSTEM SCRIPT ERROR>`; a failing flow (a failed
//!   node, or a flow ending with `toolStatus = 'error'`) → `<SYSTEM FLOW ERROR>`; an unreachable
//!   tool → `<SYSTEM TECHNICAL ERROR>`. A tool with attempts gets `attempts N` (N = attempts
//!   left) as the last line inside the markers;
//! - attempts (`docs/keen.md`): `attempts: N` allows N recalls after the first call; every
//!   dispatched call after the first spends one whatever the earlier outcome; `0` = one-shot;
//!   none = no per-tool limit. A call to a tool with none left is not dispatched and gets
//!   [`attempts_spent_prompt`] (`attempts 0`). Calls that never reach a tool (malformed,
//!   unknown tool, wrong action, bad path) spend no attempt;
//! - every call attempt (anything but a plain answer) counts toward the run-wide cap; past it,
//!   [`Decision::Stop`] ends the loop.

use std::collections::HashMap;

use serde_json::{Map, Value};

use super::flow::FlowOutcome;
use super::parser::{check_action, ParsedReply};
use super::prompt::KeenToolSpec;
use super::registry::{validate_script_entry, KeenBundle, ToolEntry};
use super::script::ScriptOutcome;
use super::KeenToolKind;

/// The general recovery prompt, word for word (`docs/keen.md`).
pub const GENERAL_FAILURE: &str = "No tool response. The tool call could not be completed; check the call and try again, or tell the user it cannot run right now.";

/// The body of a `<SYSTEM TECHNICAL ERROR>` when the harness has nothing better to say.
pub const TECHNICAL_ERROR_TEXT: &str = "The tool is unreachable right now.";

/// The soft-validation answer when a native tool's `!*context` is not a JSON object.
pub const NATIVE_CONTEXT_CORRECTION: &str = "This tool takes a JSON object of arguments. Please call again with !*context containing a JSON object, for example {\"name\": \"value\"}, or {} when the tool needs no arguments.";

/// What a tool runs.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolTarget {
    /// A JS file beneath the script root.
    Script { entry: String },
    /// `flows/<controller>.json` from `start_node`.
    Flow {
        controller: String,
        start_node: String,
    },
    /// An MCP tool or built-in (model-facing name `<server>_<tool>`), run by the harness.
    Native { arguments: Map<String, Value> },
}

/// A tool offered to the model in this run.
#[derive(Debug, Clone, PartialEq)]
pub struct OfferedTool {
    pub spec: KeenToolSpec,
    /// For native tools the arguments are filled in at dispatch; here they are empty.
    pub target: ToolTarget,
}

/// Every tool the model may call in the Keen dialect, in prompt order.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ToolTable {
    tools: Vec<OfferedTool>,
}

impl ToolTable {
    /// An empty table.
    pub fn new() -> Self {
        Self::default()
    }

    /// The bundle's `keen-tools.json` tools (none for `None`).
    pub fn from_bundle(bundle: Option<&KeenBundle>) -> Self {
        let mut table = Self::new();
        for tool in bundle.map(|b| b.tools.as_slice()).unwrap_or_default() {
            let target = match &tool.entry {
                ToolEntry::Script { path } => ToolTarget::Script {
                    entry: path.clone(),
                },
                ToolEntry::Flow {
                    controller,
                    start_node,
                } => ToolTarget::Flow {
                    controller: controller.clone(),
                    start_node: start_node.clone(),
                },
            };
            table.tools.push(OfferedTool {
                spec: KeenToolSpec {
                    name: tool.name.clone(),
                    kind: tool.kind,
                    description: tool
                        .description
                        .clone()
                        .unwrap_or_else(|| "Accepts context.".into()),
                    context_hint: String::new(),
                    attempts: tool.attempts,
                },
                target,
            });
        }
        table
    }

    /// Adds an MCP tool or built-in under its model-facing name (`<server>_<tool>`); a name
    /// already in the table is not added twice (the first one wins).
    pub fn add_native(&mut self, name: &str, description: &str, context_hint: &str) {
        if self.get(name).is_some() {
            tracing::warn!(target: "keen", tool = name, "a keen tool already has this name; the native tool is hidden");
            return;
        }
        self.tools.push(OfferedTool {
            spec: KeenToolSpec {
                name: name.to_string(),
                kind: KeenToolKind::Native,
                description: description.to_string(),
                context_hint: context_hint.to_string(),
                attempts: None,
            },
            target: ToolTarget::Native {
                arguments: Map::new(),
            },
        });
    }

    /// Keeps only the tools `keep` accepts by name (permissions: a denied tool is not offered).
    pub fn retain(&mut self, mut keep: impl FnMut(&str) -> bool) {
        self.tools.retain(|t| keep(&t.spec.name));
    }

    /// The tool with this exact name.
    pub fn get(&self, name: &str) -> Option<&OfferedTool> {
        self.tools.iter().find(|t| t.spec.name == name)
    }

    /// The prompt specs, in order (input of [`super::prompt::tools_section`]).
    pub fn specs(&self) -> Vec<KeenToolSpec> {
        self.tools.iter().map(|t| t.spec.clone()).collect()
    }
}

/// A call to run now.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolDispatch {
    /// The tool's name as the model wrote it.
    pub tool: String,
    pub kind: KeenToolKind,
    pub target: ToolTarget,
    /// The raw `!*context`.
    pub context: String,
    /// Attempts left after this call (`None`: the tool has no attempts limit).
    pub attempts_left: Option<u32>,
    /// The reply's text outside the block.
    pub narration: String,
}

/// What the harness does with a reply.
#[derive(Debug, Clone, PartialEq)]
pub enum Decision {
    /// No call: the reply is the answer.
    Answer,
    /// Send `prompt` as the next user message without running anything; log `log`.
    Recall { prompt: String, log: String },
    /// Run this tool, then send [`recall_prompt`] of its result.
    Dispatch(ToolDispatch),
    /// The run-wide tool-call cap is reached: end the run.
    Stop { log: String },
}

/// The per-run ledger: calls per tool and in total.
#[derive(Debug, Clone)]
pub struct KeenRun {
    max_tool_calls: u32,
    total: u32,
    per_tool: HashMap<String, u32>,
}

impl KeenRun {
    /// A new run allowing at most `max_tool_calls` call attempts.
    pub fn new(max_tool_calls: u32) -> Self {
        KeenRun {
            max_tool_calls,
            total: 0,
            per_tool: HashMap::new(),
        }
    }

    /// Call attempts so far.
    pub fn total_calls(&self) -> u32 {
        self.total
    }

    /// Decides what a parsed reply leads to, and records the call.
    pub fn decide(&mut self, reply: &ParsedReply, table: &ToolTable) -> Decision {
        let call = match reply {
            ParsedReply::NoCall => return Decision::Answer,
            _ if self.total >= self.max_tool_calls => {
                return Decision::Stop {
                    log: format!(
                        "keen: the run reached its cap of {} tool calls",
                        self.max_tool_calls
                    ),
                }
            }
            ParsedReply::Malformed { mistake, line } => {
                self.total += 1;
                return general(format!(
                    "keen: malformed <SYSTEM CALL> at line {line}: {mistake}"
                ));
            }
            ParsedReply::Call(call) => {
                self.total += 1;
                call
            }
        };
        let Some(tool) = table.get(&call.tool) else {
            return general(format!("keen: unknown tool {:?}", call.tool));
        };
        if let Err(wrong) = check_action(call, tool.spec.kind) {
            return general(format!("keen: {wrong}"));
        }
        if let ToolTarget::Script { entry } = &tool.target {
            if let Err(e) = validate_script_entry(entry) {
                return general(format!("keen: tool {:?}: {e}", call.tool));
            }
        }
        let made = self.per_tool.get(&call.tool).copied().unwrap_or(0);
        if let Some(n) = tool.spec.attempts {
            if made > n {
                return Decision::Recall {
                    prompt: attempts_spent_prompt(),
                    log: format!(
                        "keen: tool {:?} has no attempts left (attempts: {n})",
                        call.tool
                    ),
                };
            }
        }
        self.per_tool.insert(call.tool.clone(), made + 1);
        // After the k-th call (k = made + 1) a tool with N attempts has N - (k - 1) left.
        let attempts_left = tool.spec.attempts.map(|n| n.saturating_sub(made));
        let target = match &tool.target {
            ToolTarget::Native { .. } => match native_arguments(&call.context) {
                Some(arguments) => ToolTarget::Native { arguments },
                None => {
                    return Decision::Recall {
                        prompt: recall_prompt(
                            &ToolResult::Answer(NATIVE_CONTEXT_CORRECTION.into()),
                            attempts_left,
                        ),
                        log: format!("keen: tool {:?}: !*context is not a JSON object", call.tool),
                    }
                }
            },
            other => other.clone(),
        };
        Decision::Dispatch(ToolDispatch {
            tool: call.tool.clone(),
            kind: tool.spec.kind,
            target,
            context: call.context.clone(),
            attempts_left,
            narration: call.narration.clone(),
        })
    }
}

fn general(log: String) -> Decision {
    Decision::Recall {
        prompt: GENERAL_FAILURE.to_string(),
        log,
    }
}

/// A native tool's arguments: `{}` for an empty context, the object for a JSON object,
/// `None` for anything else.
pub fn native_arguments(context: &str) -> Option<Map<String, Value>> {
    let trimmed = context.trim();
    if trimmed.is_empty() {
        return Some(Map::new());
    }
    match serde_json::from_str(trimmed) {
        Ok(Value::Object(map)) => Some(map),
        _ => None,
    }
}

/// What a tool produced, before it is worded for the model.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ToolResult {
    /// `dictionary.result` (or a native tool's text) → `<SYSTEM RESPONSE>`.
    Answer(String),
    /// `toolStatus = 'error'` (or a native tool's error result) → `<SYSTEM SCRIPT ERROR>`.
    ScriptError(String),
    /// A failing flow → `<SYSTEM FLOW ERROR>`.
    FlowError(String),
    /// The tool could not be reached → `<SYSTEM TECHNICAL ERROR>`.
    TechnicalError(String),
    /// Threw, timed out, out of memory, bad entry, or no result → [`GENERAL_FAILURE`]; the text
    /// is for the log only.
    NoResponse(String),
}

impl ToolResult {
    /// A line for the instance log.
    pub fn log_detail(&self) -> String {
        match self {
            ToolResult::Answer(_) => "tool answered".into(),
            ToolResult::ScriptError(t) => format!("tool reported an error: {t}"),
            ToolResult::FlowError(t) => format!("flow failed: {t}"),
            ToolResult::TechnicalError(t) => format!("tool unreachable: {t}"),
            ToolResult::NoResponse(t) => format!("no tool response: {t}"),
        }
    }
}

impl From<ScriptOutcome> for ToolResult {
    fn from(outcome: ScriptOutcome) -> Self {
        match outcome {
            ScriptOutcome::Ok {
                result: Some(r),
                tool_status_error: true,
                ..
            } => ToolResult::ScriptError(r),
            ScriptOutcome::Ok {
                result: None,
                tool_status_error: true,
                ..
            } => ToolResult::ScriptError("The tool reported an error without a message.".into()),
            ScriptOutcome::Ok {
                result: Some(r), ..
            } => ToolResult::Answer(r),
            ScriptOutcome::Ok { result: None, .. } => {
                ToolResult::NoResponse("dictionary.result was not set".into())
            }
            ScriptOutcome::Threw(msg) => ToolResult::NoResponse(format!("the script threw: {msg}")),
            ScriptOutcome::TimedOut => {
                ToolResult::NoResponse("the script ran past its time limit".into())
            }
            ScriptOutcome::OutOfMemory => {
                ToolResult::NoResponse("the script exceeded its memory limit".into())
            }
            ScriptOutcome::BadEntry(why) => {
                ToolResult::NoResponse(format!("bad script entry: {why}"))
            }
        }
    }
}

impl From<FlowOutcome> for ToolResult {
    fn from(outcome: FlowOutcome) -> Self {
        match outcome {
            FlowOutcome::Done {
                result: Some(r),
                tool_status_error: true,
                ..
            } => ToolResult::FlowError(r),
            FlowOutcome::Done {
                result: None,
                tool_status_error: true,
                ..
            } => ToolResult::FlowError("The flow reported an error without a message.".into()),
            FlowOutcome::Done {
                result: Some(r), ..
            } => ToolResult::Answer(r),
            FlowOutcome::Done { result: None, .. } => {
                ToolResult::NoResponse("the flow ended without dictionary.result".into())
            }
            FlowOutcome::NodeFailed { error, .. } => ToolResult::FlowError(error),
            FlowOutcome::BadEntry(why) => ToolResult::NoResponse(format!("bad flow entry: {why}")),
        }
    }
}

/// The user prompt that carries a tool's result back to the model.
pub fn recall_prompt(result: &ToolResult, attempts_left: Option<u32>) -> String {
    let (tag, body) = match result {
        ToolResult::Answer(t) => ("SYSTEM RESPONSE", t),
        ToolResult::ScriptError(t) => ("SYSTEM SCRIPT ERROR", t),
        ToolResult::FlowError(t) => ("SYSTEM FLOW ERROR", t),
        ToolResult::TechnicalError(t) => ("SYSTEM TECHNICAL ERROR", t),
        ToolResult::NoResponse(_) => return GENERAL_FAILURE.to_string(),
    };
    let attempts = attempts_left
        .map(|n| format!("attempts {n}\n"))
        .unwrap_or_default();
    format!("<{tag}>\n{body}\n{attempts}</{tag}>")
}

/// The answer to a call of a tool whose attempts are spent (it is not dispatched).
pub fn attempts_spent_prompt() -> String {
    recall_prompt(
        &ToolResult::Answer("This tool cannot be called again in this run.".into()),
        Some(0),
    )
}

#[cfg(test)]
mod tests;
