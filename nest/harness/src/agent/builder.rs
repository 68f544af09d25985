//! [`AgentBuilder`]: an [`Agent`] from a bundle folder or described in code. A code-built agent
//! is written out as the bundle files it stands for and loaded by the same [`Bundle::load`] as
//! `agen deploy` and `agen run`, so both kinds get the same validation and the same messages
//! (naming `x-agen/agent.md`, `mcp.json`, …, the field and what was expected).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use agen_shared::bundle::{check_tool_pattern, Bundle, ModelRef};
use serde_json::{json, Map, Value};

use super::{Agent, AgentError, Inner, EMBEDDED_NAMESPACE};
use crate::artifacts::{ArtifactStore, LocalArtifacts, MemoryArtifacts};
use crate::mcp::{LaunchContext, ToolHost};
use crate::model::{provider_for, ModelProvider};
use crate::run::{Approver, Harness, HostTool, NoApprover};

/// Where the agent's definition comes from.
#[derive(Debug, Clone)]
enum Source {
    Folder(PathBuf),
    Code(Box<CodeBundle>),
}

/// The files of a code-built agent, as JSON (written out once at build time).
#[derive(Debug, Clone, Default)]
struct CodeBundle {
    front_matter: Map<String, Value>,
    system_prompt: String,
    /// (name, description, body).
    skills: Vec<(String, String, String)>,
    mcp_servers: Map<String, Value>,
    config: Map<String, Value>,
    harness: Map<String, Value>,
    secrets: Map<String, Value>,
}

/// Builds an [`Agent`]: [`Agent::from_bundle`] or [`Agent::builder`], then tools and settings,
/// then [`AgentBuilder::build`].
pub struct AgentBuilder {
    source: Source,
    model: Option<String>,
    base_url: Option<String>,
    api_key: Option<String>,
    dir: Option<PathBuf>,
    tools: Vec<Arc<dyn HostTool>>,
    run_log: Option<PathBuf>,
    artifacts: Option<Arc<dyn ArtifactStore>>,
    approver: Option<Arc<dyn Approver>>,
    provider: Option<Arc<dyn ModelProvider>>,
    agen_bin: Option<PathBuf>,
    settings: Settings,
    /// Setters that do not apply to this kind of definition (refused by `build`).
    misused: Vec<String>,
}

/// Settings given in code on top of the definition (bundle or code), checked like the files'.
#[derive(Debug, Clone, Default)]
struct Settings {
    parallel_tool_calls: Option<bool>,
    max_turns: Option<u32>,
    tool_timeout: Option<Duration>,
    allow: Vec<String>,
    ask: Vec<String>,
    deny: Vec<String>,
}

impl Settings {
    fn apply(&self, bundle: &mut Bundle) -> Result<(), AgentError> {
        if let Some(p) = self.parallel_tool_calls {
            bundle.harness.parallel_tool_calls = p;
        }
        if let Some(n) = self.max_turns {
            if n == 0 {
                return Err(AgentError::Invalid(
                    "max_turns: 0; expected at least 1 model turn per run".into(),
                ));
            }
            bundle.harness.limits.max_turns = n;
        }
        if let Some(t) = self.tool_timeout {
            bundle.harness.limits.tool_timeout = t;
        }
        let p = &mut bundle.config.permissions;
        for (list, into, what) in [
            (&self.allow, &mut p.allow, "allow"),
            (&self.ask, &mut p.ask, "ask"),
            (&self.deny, &mut p.deny, "deny"),
        ] {
            for pattern in list {
                check_tool_pattern(pattern).map_err(|e| {
                    AgentError::Invalid(format!("permissions {what} `{pattern}`: {e}"))
                })?;
                into.push(pattern.clone());
            }
        }
        Ok(())
    }
}

impl Agent {
    /// An agent from the bundle folder `dir` (`x-agen/agent.md`, `mcp.json`, `skills/`, …),
    /// validated as `agen deploy` validates it when [`AgentBuilder::build`] runs.
    pub fn from_bundle(dir: impl Into<PathBuf>) -> AgentBuilder {
        AgentBuilder::new(Source::Folder(dir.into()))
    }

    /// An agent described in code: give it at least a model ([`AgentBuilder::model`]).
    pub fn builder() -> AgentBuilder {
        AgentBuilder::new(Source::Code(Box::default()))
    }
}

impl AgentBuilder {
    fn new(source: Source) -> AgentBuilder {
        AgentBuilder {
            source,
            model: None,
            base_url: None,
            api_key: None,
            dir: None,
            tools: Vec::new(),
            run_log: None,
            artifacts: None,
            approver: None,
            provider: None,
            agen_bin: None,
            settings: Settings::default(),
            misused: Vec::new(),
        }
    }

    /// The code definition, for a setter named `what`; on a bundle agent the misuse is kept
    /// and [`AgentBuilder::build`] refuses it.
    fn code(&mut self, what: &str) -> Option<&mut CodeBundle> {
        match &mut self.source {
            Source::Code(c) => Some(c),
            Source::Folder(dir) => {
                let dir = dir.display().to_string();
                self.misused.push(format!(
                    "AgentBuilder::{what} is for agents built in code (Agent::builder()); the agent from {dir} takes it from its bundle files"
                ));
                None
            }
        }
    }

    /// `value` as a JSON object for the setter `what` (anything else is kept as a misuse).
    fn object(&mut self, what: &str, value: Value) -> Option<Map<String, Value>> {
        match value {
            Value::Object(o) => Some(o),
            other => {
                self.misused.push(format!(
                    "AgentBuilder::{what}: expected a JSON object (the file's content), got {other}"
                ));
                None
            }
        }
    }

    fn front(mut self, key: &str, value: Value) -> AgentBuilder {
        if let Some(c) = self.code(key) {
            c.front_matter.insert(key.to_string(), value);
        }
        self
    }

    /// The agent's name (a code-built agent's default is `agent`; a bundle's is in its
    /// `x-agen/agent.md`).
    pub fn name(self, name: impl Into<String>) -> AgentBuilder {
        self.front("name", Value::String(name.into()))
    }

    /// `<provider>/<model>`, e.g. `openai/gpt-4.1-mini`; for a bundle, overrides its `model`
    /// (as `agen run --model` does).
    pub fn model(mut self, model: impl Into<String>) -> AgentBuilder {
        self.model = Some(model.into());
        self
    }

    /// The provider endpoint, e.g. `http://127.0.0.1:11434/v1`; overrides a bundle's `baseUrl`.
    pub fn base_url(mut self, url: impl Into<String>) -> AgentBuilder {
        self.base_url = Some(url.into());
        self
    }

    /// The provider API key (kept in memory only). Without one, the bundle's `apiKey`, else
    /// `OPENAI_API_KEY` / `ANTHROPIC_API_KEY` from the environment.
    pub fn api_key(mut self, key: impl Into<String>) -> AgentBuilder {
        self.api_key = Some(key.into());
        self
    }

    /// The system prompt (the body of `x-agen/agent.md`).
    pub fn system_prompt(mut self, prompt: impl Into<String>) -> AgentBuilder {
        if let Some(c) = self.code("system_prompt") {
            c.system_prompt = prompt.into();
        }
        self
    }

    /// A skill (`skills/<name>/SKILL.md`): the model can load it with `load_skill`.
    pub fn skill(
        mut self,
        name: impl Into<String>,
        description: impl Into<String>,
        body: impl Into<String>,
    ) -> AgentBuilder {
        if let Some(c) = self.code("skill") {
            c.skills
                .push((name.into(), description.into(), body.into()));
        }
        self
    }

    /// Puts a skill in the system prompt from the start (`preloadSkills`).
    pub fn preload_skill(mut self, name: impl Into<String>) -> AgentBuilder {
        if let Some(c) = self.code("preload_skill") {
            let list = c
                .front_matter
                .entry("preloadSkills")
                .or_insert_with(|| json!([]));
            if let Value::Array(a) = list {
                a.push(Value::String(name.into()));
            }
        }
        self
    }

    /// An MCP server, exactly as an entry of `mcp.json` `mcpServers`:
    /// `{"command", "args", "env"}` or `{"url", "headers"}`.
    pub fn mcp_server(mut self, name: impl Into<String>, server: Value) -> AgentBuilder {
        if let Some(c) = self.code("mcp_server") {
            c.mcp_servers.insert(name.into(), server);
        }
        self
    }

    /// `x-agen/config.json` (tool overrides, permissions, delegates) as JSON.
    pub fn config_json(mut self, config: Value) -> AgentBuilder {
        if let Some(o) = self.object("config_json", config) {
            if let Some(c) = self.code("config_json") {
                c.config = o;
            }
        }
        self
    }

    /// `x-agen/harness.json` (parallelToolCalls, limits, toolProtocol, …) as JSON.
    pub fn harness_json(mut self, harness: Value) -> AgentBuilder {
        if let Some(o) = self.object("harness_json", harness) {
            if let Some(c) = self.code("harness_json") {
                c.harness = o;
            }
        }
        self
    }

    /// `x-agen/secrets.json` as JSON (only `env` sources: an embedded agent has no Hub).
    pub fn secrets_json(mut self, secrets: Value) -> AgentBuilder {
        if let Some(o) = self.object("secrets_json", secrets) {
            if let Some(c) = self.code("secrets_json") {
                c.secrets = o;
            }
        }
        self
    }

    /// Runs the calls of one turn at the same time (`parallelToolCalls`, default true).
    pub fn parallel_tool_calls(mut self, on: bool) -> AgentBuilder {
        self.settings.parallel_tool_calls = Some(on);
        self
    }

    /// Model turns per run (`limits.maxTurns`, default 50).
    pub fn max_turns(mut self, turns: u32) -> AgentBuilder {
        self.settings.max_turns = Some(turns);
        self
    }

    /// How long one tool call may take (`limits.toolTimeout`, default 10 minutes).
    pub fn tool_timeout(mut self, timeout: Duration) -> AgentBuilder {
        self.settings.tool_timeout = Some(timeout);
        self
    }

    /// Adds a `permissions.allow` pattern (a non-empty allow list closes every other tool).
    pub fn allow(mut self, pattern: impl Into<String>) -> AgentBuilder {
        self.settings.allow.push(pattern.into());
        self
    }

    /// Adds a `permissions.ask` pattern: calls wait for the [`AgentBuilder::approver`].
    pub fn ask(mut self, pattern: impl Into<String>) -> AgentBuilder {
        self.settings.ask.push(pattern.into());
        self
    }

    /// Adds a `permissions.deny` pattern: matching tools are not offered and never called.
    pub fn deny(mut self, pattern: impl Into<String>) -> AgentBuilder {
        self.settings.deny.push(pattern.into());
        self
    }

    /// The folder a code-built agent's command MCP servers run in (default: this process's
    /// working folder).
    pub fn dir(mut self, dir: impl Into<PathBuf>) -> AgentBuilder {
        self.dir = Some(dir.into());
        self
    }

    /// A tool written in this program: a [`super::Tool`] or any [`HostTool`].
    pub fn tool(mut self, tool: impl HostTool) -> AgentBuilder {
        self.tools.push(Arc::new(tool));
        self
    }

    /// Keeps every run's log in `dir` (one folder per run) so a run a crash interrupted can be
    /// resumed ([`Agent::resume`]) and conversations outlive the program.
    pub fn run_log(mut self, dir: impl Into<PathBuf>) -> AgentBuilder {
        self.run_log = Some(dir.into());
        self
    }

    /// Keeps artifacts in files under `dir` (default: in memory).
    pub fn artifacts_dir(mut self, dir: impl Into<PathBuf>) -> AgentBuilder {
        self.artifacts = Some(Arc::new(LocalArtifacts::new(dir.into())));
        self
    }

    /// Keeps artifacts in `store`.
    pub fn artifact_store(mut self, store: Arc<dyn ArtifactStore>) -> AgentBuilder {
        self.artifacts = Some(store);
        self
    }

    /// Who decides calls to tools in `permissions.ask` (default: no one; they are denied).
    pub fn approver(mut self, approver: Arc<dyn Approver>) -> AgentBuilder {
        self.approver = Some(approver);
        self
    }

    /// A model client of your own instead of the HTTP provider for `model`.
    pub fn provider(mut self, provider: Arc<dyn ModelProvider>) -> AgentBuilder {
        self.provider = Some(provider);
        self
    }

    /// The `agen` binary that `"command": "agen"` servers run (default: `agen` on PATH).
    pub fn agen_bin(mut self, path: impl Into<PathBuf>) -> AgentBuilder {
        self.agen_bin = Some(path.into());
        self
    }

    /// Loads and validates the definition, starts its MCP servers and builds the agent.
    pub async fn build(self) -> Result<Agent, AgentError> {
        if let Some(m) = self.misused.first() {
            return Err(AgentError::Invalid(m.clone()));
        }
        let mut bundle = match &self.source {
            Source::Folder(dir) => Bundle::load(dir)?,
            Source::Code(code) => {
                let mut code = code.as_ref().clone();
                if let Some(m) = &self.model {
                    code.front_matter
                        .insert("model".into(), Value::String(m.clone()));
                }
                if let Some(u) = &self.base_url {
                    code.front_matter
                        .insert("baseUrl".into(), Value::String(u.clone()));
                }
                code.front_matter
                    .entry("name")
                    .or_insert_with(|| json!("agent"));
                let mut bundle = load_code_bundle(&code)?;
                bundle.dir = match &self.dir {
                    Some(d) => d.clone(),
                    None => std::env::current_dir().map_err(|e| AgentError::Io {
                        what: "finding the working folder".into(),
                        path: PathBuf::from("."),
                        source: e,
                    })?,
                };
                bundle
            }
        };
        if let Source::Folder(_) = self.source {
            if let Some(m) = &self.model {
                bundle.agent.model = Some(
                    ModelRef::parse(m).map_err(|e| AgentError::Invalid(format!("model: {e}")))?,
                );
            }
            if let Some(u) = &self.base_url {
                bundle.agent.base_url = Some(u.clone());
            }
        }
        self.settings.apply(&mut bundle)?;
        let (secrets, mut config) =
            crate::local_config::resolve_local(&bundle).map_err(AgentError::Invalid)?;
        if let Some(k) = &self.api_key {
            config.api_key = Some(k.clone());
        }
        let bundle = Arc::new(bundle);

        let mut launch = LaunchContext::new(
            self.agen_bin
                .clone()
                .unwrap_or_else(|| PathBuf::from("agen")),
        );
        launch.secrets = secrets.clone();
        let host = ToolHost::start(&bundle, launch).await;
        let provider = match self.provider.clone() {
            Some(p) => p,
            None => {
                let http = reqwest::Client::builder()
                    .connect_timeout(Duration::from_secs(10))
                    .timeout(Duration::from_secs(600))
                    .build()
                    .map_err(|e| AgentError::Invalid(format!("the HTTP client: {e}")))?;
                Arc::from(provider_for(config, http))
            }
        };
        let artifacts = self
            .artifacts
            .clone()
            .unwrap_or_else(|| Arc::new(MemoryArtifacts::default()));
        let approver = self.approver.clone().unwrap_or_else(|| {
            Arc::new(NoApprover(
                "no one to approve: this embedded agent has no approver; give it one with AgentBuilder::approver, or move the tool from `ask` to `allow` in `permissions`".into(),
            ))
        });
        let built = Harness::with_provider(bundle.clone(), Arc::new(host.clone()), provider)
            .and_then(|h| {
                h.with_secret_values(&secrets)
                    .with_artifacts(artifacts.clone())
                    .with_approver(approver)
                    .with_host_tools(self.tools.clone())
            });
        let harness = match built {
            Ok(h) => h,
            Err(e) => {
                host.shutdown().await;
                return Err(e.into());
            }
        };
        if let Some(dir) = &self.run_log {
            std::fs::create_dir_all(dir).map_err(|e| AgentError::Io {
                what: "creating the run log folder".into(),
                path: dir.clone(),
                source: e,
            })?;
        }
        Ok(Agent {
            inner: Arc::new(Inner {
                harness,
                host,
                name: bundle.agent.name.clone(),
                namespace: EMBEDDED_NAMESPACE.to_string(),
                run_log: self.run_log.clone(),
                artifacts,
                conversations: Default::default(),
            }),
        })
    }
}

/// Writes `code` out as a bundle in a fresh private folder, loads it with [`Bundle::load`] and
/// removes the folder.
fn load_code_bundle(code: &CodeBundle) -> Result<Bundle, AgentError> {
    let dir = std::env::temp_dir().join(format!("agen-sdk-{}", uuid::Uuid::new_v4()));
    let written = write_bundle(&dir, code);
    let loaded = written.and_then(|()| Bundle::load(&dir).map_err(AgentError::from));
    let _ = std::fs::remove_dir_all(&dir);
    loaded
}

fn write_bundle(dir: &Path, code: &CodeBundle) -> Result<(), AgentError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |e| AgentError::Io {
            what: "writing the agent's definition".into(),
            path,
            source: e,
        }
    };
    let write = |rel: &str, text: String| -> Result<(), AgentError> {
        let path = dir.join(rel);
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent).map_err(io(parent))?;
        }
        std::fs::write(&path, text).map_err(io(&path))
    };
    std::fs::create_dir_all(dir).map_err(io(dir))?;
    let front = Value::Object(code.front_matter.clone());
    write(
        "x-agen/agent.md",
        format!("---\n{front}\n---\n{}\n", code.system_prompt),
    )?;
    for (name, description, body) in &code.skills {
        // A skill's name is its folder: nothing that could leave the bundle folder.
        let plain = !name.is_empty()
            && name
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-' || c == '.')
            && !name.starts_with('.');
        if !plain {
            return Err(AgentError::Invalid(format!(
                "skill name `{name}` is not valid; expected letters, digits, `_`, `-` and `.`, e.g. pricing"
            )));
        }
        let front = json!({"name": name, "description": description});
        write(
            &format!("skills/{name}/SKILL.md"),
            format!("---\n{front}\n---\n{body}\n"),
        )?;
    }
    if !code.mcp_servers.is_empty() {
        let mcp = json!({"mcpServers": Value::Object(code.mcp_servers.clone())});
        write("mcp.json", mcp.to_string())?;
    }
    for (rel, map) in [
        ("x-agen/config.json", &code.config),
        ("x-agen/harness.json", &code.harness),
        ("x-agen/secrets.json", &code.secrets),
    ] {
        if !map.is_empty() {
            write(rel, Value::Object(map.clone()).to_string())?;
        }
    }
    Ok(())
}
