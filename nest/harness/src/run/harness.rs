//! The per-instance [`Harness`]: built once from a bundle (model client, system prompt, the
//! tools offered), then [`Harness::run`] runs each run through the dialect's loop (native tool
//! calling, or Keen's text protocol built on `crate::keen`: no `tools` are sent, results return
//! as `<SYSTEM RESPONSE>` user prompts).

use std::collections::BTreeMap;
use std::sync::Arc;

use agen_shared::bundle::{Bundle, ToolProtocol, AGENT_FILE};
use serde_json::{json, Value};
use tokio_util::sync::CancellationToken;

use super::approval::{Approver, NoApprover};
use super::builtin_names::BUILTIN_NAMES;
use super::builtins;
use super::host::{check_host_tool_name, HostTool, Registered};
use super::state::Run;
use super::{RunAssignment, RunEventSink, RunOutcome, ToolBackend};
use crate::artifacts::{ArtifactStore, MemoryArtifacts};
use crate::mcp::ToolInfo;
use crate::model::{provider_for, ModelConfig, ModelProvider, ToolSpec};
use crate::redact::Redactor;

/// How the model calls tools: the seam where the Keen text protocol plugs in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Dialect {
    /// The provider's native tool calling (`tools` in the request, `tool_calls` in the reply).
    Native,
    /// Keen's `<SYSTEM CALL>` text protocol (see `crate::keen`); no `tools` are sent.
    Keen,
}

/// Why a harness could not be built for a bundle.
#[derive(Debug, thiserror::Error)]
pub enum HarnessError {
    #[error("{AGENT_FILE}: model: missing; set `model: openai/gpt-4.1-mini` (or anthropic/…) in the front matter, or pass --model to agen run")]
    NoModel,
    #[error("{0}")]
    ApiKey(String),
    #[error("{0}")]
    Keen(String),
    #[error("{0}")]
    HostTool(String),
    #[error("tool name {0} is used twice (an MCP tool clashes with another tool or a built-in); rename the server in mcp.json")]
    DuplicateTool(String),
    #[error(
        "{AGENT_FILE}: systemPrompts: {0}; check that the server lists that prompt (prompts/list)"
    )]
    Prompt(String),
}

/// The model client settings of `bundle`: its `model`, `baseUrl`, `apiKey` (with `${NAME}`
/// filled from `secrets`) and extra front-matter settings.
pub fn model_config(
    bundle: &Bundle,
    secrets: &BTreeMap<String, String>,
) -> Result<ModelConfig, HarnessError> {
    let model = bundle.agent.model.clone().ok_or(HarnessError::NoModel)?;
    let mut config = ModelConfig::new(model);
    config.base_url = bundle.agent.base_url.clone();
    config.api_key = bundle
        .api_key_with_secrets(secrets)
        .map_err(|e| HarnessError::ApiKey(e.to_string()))?;
    config.extra = bundle.agent.extra.clone();
    Ok(config)
}

/// One instance's agent loop (see the module doc). Cheap to share: runs borrow it.
pub struct Harness {
    pub(super) bundle: Arc<Bundle>,
    pub(super) tools: Arc<dyn ToolBackend>,
    pub(super) provider: Arc<dyn ModelProvider>,
    pub(super) dialect: Dialect,
    pub(super) system_prompt: String,
    /// MCP tools by the name the model sees.
    pub(super) mcp_tools: BTreeMap<String, ToolInfo>,
    /// Tools of the embedding program by name (see [`super::host`]).
    pub(super) host_tools: BTreeMap<String, Registered>,
    /// Whether `report_progress` is offered (fleet only).
    pub(super) progress: bool,
    /// Every form of every secret value: out of tool results, errors and traced arguments.
    pub(super) redactor: Redactor,
    /// The bundle's Keen tools (`keen-tools.json`, flows) when the dialect is Keen.
    pub(super) keen: Option<Arc<crate::keen::KeenBundle>>,
    /// Where `save_artifact` / `read_artifact` keep artifacts.
    pub(super) artifacts: Arc<dyn ArtifactStore>,
    /// Who decides calls to tools in `permissions.ask`.
    pub(super) approver: Arc<dyn Approver>,
    /// Who runs `call_agent`/`start_agent` children (none: delegate calls need a fleet).
    pub(super) delegator: Option<Arc<dyn super::Delegator>>,
    /// Remote A2A delegates' tokens (from the secrets) and the HTTP client that calls them.
    pub(super) remote: super::remote::RemoteAgents,
}

impl Harness {
    /// Builds the harness for `bundle`: its model client (`apiKey` resolved from `secrets`),
    /// system prompt (agent.md body + preloaded skills) and tool list (`tools` + built-ins).
    pub fn new(
        bundle: Arc<Bundle>,
        tools: Arc<dyn ToolBackend>,
        secrets: &BTreeMap<String, String>,
        http: reqwest::Client,
    ) -> Result<Harness, HarnessError> {
        let config = model_config(&bundle, secrets)?;
        let provider: Arc<dyn ModelProvider> = Arc::from(provider_for(config, http.clone()));
        Ok(Harness::with_provider(bundle, tools, provider)?.with_secret_values(secrets))
    }

    /// The run's secret values: redacted (with their JSON-, URL- and shell-quoted forms) from
    /// tool results, tool errors and traced tool arguments, and the source of remote A2A
    /// delegates' tokens.
    pub fn with_secret_values(mut self, secrets: &BTreeMap<String, String>) -> Harness {
        self.redactor = Redactor::of_secrets(secrets);
        self.remote.resolve(&self.bundle, secrets);
        self
    }

    /// Like [`Harness::new`] with a ready model client.
    pub fn with_provider(
        bundle: Arc<Bundle>,
        tools: Arc<dyn ToolBackend>,
        provider: Arc<dyn ModelProvider>,
    ) -> Result<Harness, HarnessError> {
        let mut mcp_tools = BTreeMap::new();
        for t in tools.tools() {
            let name = t.model_name();
            if BUILTIN_NAMES.contains(&name.as_str())
                || [super::BUILTIN_CALL_AGENT, super::BUILTIN_START_AGENT].contains(&name.as_str())
                || mcp_tools.contains_key(&name)
            {
                return Err(HarnessError::DuplicateTool(name));
            }
            mcp_tools.insert(name, t);
        }
        let mut system_prompt = bundle.agent.system_prompt.trim_end().to_string();
        for name in &bundle.system_prompts {
            let text = tools.system_prompt(name).map_err(HarnessError::Prompt)?;
            if !system_prompt.is_empty() {
                system_prompt.push_str("\n\n");
            }
            system_prompt.push_str(text.trim_end());
        }
        for name in &bundle.agent.preload_skills {
            if let Some(skill) = bundle.skill(name) {
                system_prompt.push_str(&format!(
                    "\n\n# Skill: {}\n\n{}",
                    skill.name,
                    skill.body.trim_end()
                ));
            }
        }
        let dialect = match bundle.harness.tool_protocol {
            ToolProtocol::Native => Dialect::Native,
            ToolProtocol::Keen => Dialect::Keen,
        };
        let keen = match dialect {
            Dialect::Native => None,
            Dialect::Keen => crate::keen::KeenBundle::load(&bundle.dir)
                .map_err(|e| HarnessError::Keen(e.to_string()))?
                .map(Arc::new),
        };
        let host_tools = super::resources::builtins(&tools);
        Ok(Harness {
            bundle,
            tools,
            provider,
            dialect,
            system_prompt,
            mcp_tools,
            host_tools,
            progress: false,
            redactor: Redactor::default(),
            keen,
            artifacts: Arc::new(MemoryArtifacts::default()),
            approver: Arc::new(NoApprover::fleet()),
            delegator: None,
            remote: Default::default(),
        })
    }

    /// Adds tools written in the embedding program (see [`super::host`]); they are offered
    /// beside the MCP tools. A name that is not valid or is taken is an error naming it.
    pub fn with_host_tools(
        mut self,
        tools: impl IntoIterator<Item = Arc<dyn HostTool>>,
    ) -> Result<Harness, HarnessError> {
        for tool in tools {
            let spec = tool.spec();
            check_host_tool_name(&spec.name).map_err(|e| HarnessError::HostTool(e.to_string()))?;
            if self.mcp_tools.contains_key(&spec.name) || self.host_tools.contains_key(&spec.name) {
                return Err(HarnessError::DuplicateTool(spec.name));
            }
            self.host_tools
                .insert(spec.name.clone(), Registered { spec, tool });
        }
        Ok(self)
    }

    /// Where artifacts go: the Nest (fleet), local files (`agen run`); in memory by default.
    pub fn with_artifacts(mut self, artifacts: Arc<dyn ArtifactStore>) -> Harness {
        self.artifacts = artifacts;
        self
    }

    /// Who decides calls to tools in `permissions.ask` (default: no one, they are denied).
    pub fn with_approver(mut self, approver: Arc<dyn Approver>) -> Harness {
        self.approver = approver;
        self
    }

    /// Who runs the children of `call_agent`/`start_agent` (the fleet instance's Nest).
    pub fn with_delegator(mut self, delegator: Arc<dyn super::Delegator>) -> Harness {
        self.delegator = Some(delegator);
        self
    }

    /// Offers `report_progress` (fleet runs only; standalone has no platform to report to).
    pub fn with_progress(mut self, on: bool) -> Harness {
        self.progress = on;
        self
    }

    pub fn dialect(&self) -> Dialect {
        self.dialect
    }

    /// The system prompt every run starts with.
    pub fn system_prompt(&self) -> &str {
        &self.system_prompt
    }

    /// `openai/gpt-4.1-mini`.
    pub fn model(&self) -> String {
        self.provider.describe()
    }

    /// The tools offered to the model, MCP tools first (sorted), then built-ins; the tools the
    /// bundle's permissions deny are left out.
    pub fn tool_specs(&self) -> Vec<ToolSpec> {
        let mut specs = self.all_tool_specs();
        specs.retain(|s| self.bundle_permission(&s.name) != agen_shared::bundle::Permission::Deny);
        specs
    }

    /// Every tool the harness has, permitted or not.
    pub(super) fn all_tool_specs(&self) -> Vec<ToolSpec> {
        let mut specs: Vec<ToolSpec> = self
            .mcp_tools
            .iter()
            .map(|(name, t)| ToolSpec {
                name: name.clone(),
                description: t.description.clone(),
                parameters: object_schema(&t.input_schema),
            })
            .collect();
        specs.extend(self.host_tools.values().map(|t| ToolSpec {
            name: t.spec.name.clone(),
            description: t.spec.description.clone(),
            parameters: object_schema(&t.spec.input_schema),
        }));
        specs.extend(builtins::specs(self));
        specs.extend(super::delegate::specs(self));
        specs
    }

    /// Runs one run to its end (see the module doc). Never panics on model or tool failures:
    /// they become the outcome.
    pub async fn run(
        &self,
        req: RunAssignment,
        sink: Arc<dyn RunEventSink>,
        cancel: CancellationToken,
    ) -> RunOutcome {
        let run = Run::new(self, &req, sink, cancel);
        let end = match self.dialect {
            Dialect::Native => run.native_loop().await,
            Dialect::Keen => run.keen_loop().await,
        };
        run.finish(end).await
    }
}

/// A JSON Schema the providers accept for a tool's parameters: an object schema.
pub(super) fn object_schema(schema: &Value) -> Value {
    match schema {
        Value::Object(o) if o.get("type").and_then(Value::as_str) == Some("object") => {
            schema.clone()
        }
        Value::Object(o) if !o.contains_key("type") => {
            let mut o = o.clone();
            o.insert("type".into(), json!("object"));
            o.entry("properties").or_insert_with(|| json!({}));
            Value::Object(o)
        }
        _ => json!({"type": "object", "properties": {}}),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tool_schemas_are_object_schemas() {
        assert_eq!(
            object_schema(&json!({"type": "object", "properties": {}})),
            json!({"type": "object", "properties": {}})
        );
        assert_eq!(
            object_schema(&json!({"properties": {"a": {}}})),
            json!({"properties": {"a": {}}, "type": "object"})
        );
        assert_eq!(
            object_schema(&Value::Null),
            json!({"type": "object", "properties": {}})
        );
    }
}
