//! Permissions at the point of use: which tools a run offers and whether a call may go out.
//! The bundle's `x-agen/config.json` `permissions` decide ([`Permissions::decide`]): MCP tools
//! by `<server>.<tool>` (either name form), Keen `keen-tools.json` tools by their registered
//! name, `load_skill`, `call_agent`, `start_agent`, `list_resources` and `read_resource` by
//! their names. `finish`, `save_artifact`, `read_artifact` and
//! `report_progress` are never gated.
//!
//! Invariant: a denied tool is never offered (native `tools`, the Keen tools section) and a call
//! to it anyway is answered with a tool error and recorded as `tool.failed` (`denied`); it never
//! reaches its server or script.

use agen_contract::run::ToolFailure;
use agen_shared::bundle::{Permission, Permissions};

use super::builtin_names::BUILTIN_LOAD_SKILL;
use super::harness::Harness;
use super::state::Run;
use crate::model::{ToolCall, ToolSpec};

impl Harness {
    /// The name permissions judge the tool the model calls `model_name` by: `<server>.<tool>`
    /// for an MCP tool, the registered name of a Keen tool, `load_skill`. `None` for the
    /// built-ins that are never gated and for names the harness does not know (those get the
    /// unknown-tool answer instead).
    pub(super) fn gated_name(&self, model_name: &str) -> Option<String> {
        if let Some(tool) = self.mcp_tools.get(model_name) {
            return Some(tool.qualified_name());
        }
        if self.host_tools.contains_key(model_name) {
            return Some(model_name.to_string());
        }
        if model_name == BUILTIN_LOAD_SKILL && !self.bundle.skills.is_empty() {
            return Some(model_name.to_string());
        }
        if self.is_delegate_tool(model_name) {
            return Some(model_name.to_string());
        }
        let keen = self.keen.as_deref()?;
        keen.tools
            .iter()
            .any(|t| t.name == model_name)
            .then(|| model_name.to_string())
    }

    /// The bundle's decision for the tool the model calls `model_name`.
    pub(super) fn bundle_permission(&self, model_name: &str) -> Permission {
        decide(&self.bundle.config.permissions, self.gated_name(model_name))
    }
}

fn decide(p: &Permissions, gated: Option<String>) -> Permission {
    match gated {
        Some(name) => p.decide(&name),
        None => Permission::Allow,
    }
}

impl Run<'_> {
    /// This run's decision for the tool the model calls `model_name`: the bundle's, narrowed
    /// by the task's tool overrides.
    pub(super) fn permission(&self, model_name: &str) -> Permission {
        match self.h.gated_name(model_name) {
            Some(name) => self
                .h
                .bundle
                .config
                .permissions
                .decide_narrowed(&self.req.tool_overrides, &name),
            None => Permission::Allow,
        }
    }

    /// Whether this run offers the tool the model calls `model_name` (it is not denied).
    pub(super) fn offers(&self, model_name: &str) -> bool {
        self.permission(model_name) != Permission::Deny
    }

    /// Whether a call to the tool the model calls `model_name` waits for an approver.
    pub(super) fn needs_approval(&self, model_name: &str) -> bool {
        self.permission(model_name) == Permission::Ask
    }

    /// Whether `model_name` is a Keen `keen-tools.json` tool (run by the Keen loop itself,
    /// not through [`Run::run_call`]).
    pub(super) fn is_keen_tool(&self, model_name: &str) -> bool {
        !self.h.mcp_tools.contains_key(model_name)
            && !self.h.host_tools.contains_key(model_name)
            && self
                .h
                .keen
                .as_deref()
                .is_some_and(|k| k.tools.iter().any(|t| t.name == model_name))
    }

    /// The tools this run offers to the model: the harness's, less the denied ones.
    pub(super) fn offered_specs(&self) -> Vec<ToolSpec> {
        let mut specs = self.h.all_tool_specs();
        specs.retain(|s| self.offers(&s.name));
        specs
    }

    /// Refuses a call to a denied tool: records `tool.failed` (`denied`) and returns what the
    /// model is told. The call is never sent.
    pub(super) async fn refuse_denied(&self, call: &ToolCall) -> String {
        let tool = self
            .h
            .gated_name(&call.name)
            .unwrap_or_else(|| call.name.clone());
        let by = if self.h.bundle_permission(&call.name) == Permission::Deny {
            "the bundle's permissions deny it (x-agen/config.json `permissions`)"
        } else {
            "this task's tool overrides deny it"
        };
        let content = format!(
            "tool {} was not run: {by}; do not call it again, answer with the tools you have",
            call.name
        );
        let _ = self
            .emit(
                self.failed(call, &tool, &content, ToolFailure::Denied, 0),
                false,
            )
            .await;
        content
    }

    /// A `tool.failed` record for a denied Keen call that has no [`ToolCall`] of its own.
    pub(super) async fn refuse_denied_keen(&self, call_id: &str, tool: &str) -> String {
        let call = ToolCall {
            id: call_id.to_string(),
            name: tool.to_string(),
            arguments: serde_json::Value::Object(Default::default()),
        };
        self.refuse_denied(&call).await
    }
}
