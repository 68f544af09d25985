//! The Keen text tool dialect: the `<SYSTEM CALL>` parser, the canonical tools prompt,
//! `keen-tools.json`, sandboxed script tools (QuickJS) and flow tools.
//!
//! This module is a library the harness (`instance/`) and bundle validation (`agen-shared`
//! via the nest) call; it does no model IO of its own (flow `agent` nodes go through the
//! [`flow::FlowAgent`] trait the harness implements) and runs no MCP tools (it only formats
//! their calls and results).
//!
//! # Using it from the harness (one run)
//! 1. At instance start: `KeenBundle::load(bundle_dir)?` (None when the bundle has no
//!    `keen-tools.json`). Build a [`dispatch::ToolTable`] from it
//!    ([`dispatch::ToolTable::from_bundle`]) and add every MCP tool / built-in with
//!    [`dispatch::ToolTable::add_native`] (name `<server>_<tool>`, description, and
//!    [`prompt::native_context_hint`] of its input schema).
//! 2. System prompt: append [`prompt::tools_section`]`(&table.specs())`.
//! 3. Per run: `let mut run = dispatch::KeenRun::new(max_tool_calls)`. For each model reply:
//!    `match run.decide(&parser::parse_reply(&reply), &table)`:
//!    - [`dispatch::Decision::Answer`]: the reply is the final answer;
//!    - [`dispatch::Decision::Recall`]: send `prompt` as the next user message (nothing ran;
//!      log `log`);
//!    - [`dispatch::Decision::Dispatch`]: run the tool: a script with
//!      [`script::run_script_tool`], a flow with [`flow::run_flow`], a native tool yourself
//!      (arguments already parsed); turn its outcome into a [`dispatch::ToolResult`] (`From`
//!      impls exist for [`script::ScriptOutcome`] and [`flow::FlowOutcome`]) and send
//!      [`dispatch::recall_prompt`]`(&result, d.attempts_left)` as the next user message;
//!    - [`dispatch::Decision::Stop`]: the run-wide tool-call cap is reached: end the run.
//!
//! # Settled rules
//! See the `parser` module doc for what is a call and what is a malformed call; `dispatch`
//! for attempts and the texts sent back; `script` for the sandbox; `flow` for the flow file.

pub mod dispatch;
pub mod flow;
pub mod parser;
pub mod prompt;
pub mod registry;
pub mod script;

pub use dispatch::{
    recall_prompt, Decision, KeenRun, ToolDispatch, ToolResult, ToolTable, ToolTarget,
    GENERAL_FAILURE,
};
pub use flow::{run_flow, Flow, FlowAgent, FlowNode, FlowOutcome};
pub use parser::{check_action, parse_reply, KeenAction, KeenCall, Mistake, ParsedReply};
pub use prompt::{native_context_hint, tools_section, KeenToolSpec};
pub use registry::{validate_script_entry, KeenBundle, KeenTool, ToolEntry};
pub use script::{run_script, run_script_tool, ScriptLimits, ScriptOutcome};

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
