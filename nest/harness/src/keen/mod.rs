//! The Keen text tool dialect: the `<SYSTEM CALL>` parser, the canonical tools prompt,
//! `keen-tools.json`, sandboxed script tools (QuickJS) and flow tools.
//!
//! This module is a library the harness (`instance/`) and bundle validation (`agen-shared`
//! via the nest) call; it does no model IO of its own (flow `agent` nodes go through the
//! [`flow::FlowAgent`] trait the harness implements) and runs no MCP tools (it only formats
//! their calls and results).
//!
//! # Bundle validation (deploy time and `agen run`)
//! [`KeenBundle::load`]`(bundle_dir)`: `Ok(None)` when the bundle has no `keen-tools.json`;
//! `Err(KeenError::Invalid(problems))` lists every problem, one per line, each naming the file,
//! the index/field or node, and what was expected (unique names; script entries non-empty,
//! under `tools/`, without `..`, and present beneath the script root; flow entries
//! `<Controller>-<StartNode>` split at the first `-`, with `flows/<Controller>.json` valid and
//! holding that start node). The script root is `src/scripts/` when the bundle has that folder,
//! else the bundle root ([`registry::script_root`]). [`validate_script_entry`] is the one path
//! rule, shared by deploy, dispatch and the script engine.
//!
//! # Using it from the harness (one run)
//! 1. At instance start: `KeenBundle::load(bundle_dir)?`. Build a [`ToolTable`] with
//!    [`ToolTable::from_bundle`] and add every MCP tool / built-in with
//!    [`ToolTable::add_native`]`(name, description, &native_context_hint(&input_schema))`
//!    (name `<server>_<tool>`; a registry tool of the same name wins).
//! 2. System prompt: append [`tools_section`]`(&table.specs())`.
//! 3. Per run: `let mut run = KeenRun::new(max_tool_calls)`. For each model reply:
//!    `match run.decide(&parse_reply(&reply), &table)`:
//!    - [`Decision::Answer`]: the reply is the final answer;
//!    - [`Decision::Recall`]`{prompt, log}`: nothing runs; log `log`, send `prompt` as the next
//!      user message;
//!    - [`Decision::Dispatch`]`(d)`: run `d.target`:
//!      [`ToolTarget::Script`] → [`run_script_tool`]`(&bundle.script_root, entry, &d.context,
//!      &limits)`; [`ToolTarget::Flow`] → [`run_flow`]`(&bundle, controller, start_node,
//!      &d.context, &agent, &limits)` with the harness's [`FlowAgent`] (the bundle's own model);
//!      [`ToolTarget::Native`]`{arguments}` → call the MCP tool / built-in yourself and map its
//!      result to [`ToolResult::Answer`] (text), [`ToolResult::ScriptError`] (an error result)
//!      or [`ToolResult::TechnicalError`]`(dispatch::TECHNICAL_ERROR_TEXT.into())` (server
//!      down). Script and flow outcomes convert with `ToolResult::from(outcome)`. Log
//!      [`ToolResult::log_detail`], then send [`recall_prompt`]`(&result, d.attempts_left)` as
//!      the next user message;
//!    - [`Decision::Stop`]`{log}`: the run-wide tool-call cap is reached: end the run.
//!
//!    A provider error is not recalled: it ends the turn as in native mode (not handled here).
//!
//! # Settled rules (details in each module's doc)
//! - `parser`: what a call is, what a malformed call is (fenced, indented, commentary, two
//!   calls in one block, missing markers, unterminated…), CRLF, the context's extent;
//! - `dispatch`: attempts (`N` recalls after the first call; `0` one-shot; none unlimited;
//!   spent → not dispatched, `attempts 0`), the run-wide cap, the exact texts, and that the
//!   general sentence [`GENERAL_FAILURE`] is sent for every failure that is not a result;
//! - `script`: fresh QuickJS runtime per call, limits (5 s, 64 MiB by default), no IO,
//!   `props`/`dictionary`, module shape;
//! - `flow`: the file format, validation, one dictionary per run, the step cap.

pub mod dispatch;
pub mod flow;
#[cfg(test)]
mod fuzz_tests;
pub mod parser;
pub mod prompt;
pub mod registry;
pub mod script;
pub mod script_child;

pub use dispatch::{
    recall_prompt, Decision, KeenRun, ToolDispatch, ToolResult, ToolTable, ToolTarget,
    GENERAL_FAILURE,
};
pub use flow::{parse_flow, run_flow, Flow, FlowAgent, FlowNode, FlowOutcome};
pub use parser::{check_action, parse_reply, KeenAction, KeenCall, Mistake, ParsedReply};
pub use prompt::{native_context_hint, tools_section, KeenToolSpec};
pub use registry::{parse_registry, validate_script_entry, KeenBundle, KeenTool, ToolEntry};
pub use script::{run_entry, run_script, run_script_tool, ScriptLimits, ScriptOutcome};

use std::fmt;

/// The kind of a tool as the Keen dialect offers it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum KeenToolKind {
    /// A JS script tool from `keen-tools.json` (`use tool`, "This tool is a script.").
    Script,
    /// A flow tool from `keen-tools.json` (`use tool flow`, "This tool is a pipe.").
    Flow,
    /// An MCP tool or built-in offered as a script-style tool (`use tool`); its `!*context`
    /// must be a JSON object of arguments. The harness executes it.
    Native,
}

impl KeenToolKind {
    /// The action the model must use for this kind.
    pub fn action(self) -> KeenAction {
        match self {
            KeenToolKind::Flow => KeenAction::Flow,
            KeenToolKind::Script | KeenToolKind::Native => KeenAction::Script,
        }
    }

    /// `script`, `flow` or `native`.
    pub fn as_str(self) -> &'static str {
        match self {
            KeenToolKind::Script => "script",
            KeenToolKind::Flow => "flow",
            KeenToolKind::Native => "native",
        }
    }
}

impl fmt::Display for KeenToolKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Errors loading or validating the Keen parts of a bundle. Each problem names the file, the
/// field (or node) and what was expected.
#[derive(Debug, thiserror::Error)]
pub enum KeenError {
    /// A file could not be read.
    #[error("{path}: cannot read: {source}")]
    Io {
        path: String,
        #[source]
        source: std::io::Error,
    },
    /// One or more validation problems, one per line.
    #[error("{}", .0.join("\n"))]
    Invalid(Vec<String>),
}

/// `Result` with [`KeenError`].
pub type Result<T> = std::result::Result<T, KeenError>;
