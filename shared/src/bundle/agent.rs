//! `x-agen/agent.md`: the agent's name, model, provider settings and preloaded skills (front
//! matter) and its system prompt (body).
//!
//! Invariants: `model`, when present, is `<provider>/<model>` with a known provider; `apiKey`
//! is kept raw (it may hold `${NAME}`, substituted at start time from declared secrets).

use std::fmt;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use super::error::Result;
use super::front_matter;
use super::json::{kind, Obj};
use super::mcp::check_http_url;

pub const AGENT_FILE: &str = "x-agen/agent.md";

/// A model provider the harness has a client for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Provider {
    /// Any OpenAI-compatible Chat Completions API (OpenAI, vLLM, llama.cpp server, Ollama, …).
    OpenAi,
    /// Anthropic Messages.
    Anthropic,
}

impl Provider {
    pub const ALL: [Provider; 2] = [Provider::OpenAi, Provider::Anthropic];

    pub fn as_str(self) -> &'static str {
        match self {
            Provider::OpenAi => "openai",
            Provider::Anthropic => "anthropic",
        }
    }
}

impl fmt::Display for Provider {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// `openai/gpt-4.1-mini`: a provider and the model name it knows (which may itself contain `/`).
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ModelRef {
    pub provider: Provider,
    pub model: String,
}

impl ModelRef {
    /// Parses `<provider>/<model>`; the error says what was expected (no file: callers add it).
    pub fn parse(s: &str) -> std::result::Result<ModelRef, String> {
        let expected = "expected `<provider>/<model>` such as `openai/gpt-4.1-mini` or `anthropic/claude-sonnet-4-5`";
        let Some((provider, model)) = s.trim().split_once('/') else {
            return Err(format!("{expected}, got `{s}`"));
        };
        if model.trim().is_empty() {
            return Err(format!(
                "{expected}, got `{s}` (no model name after the `/`)"
            ));
        }
        let provider = match provider.trim().to_ascii_lowercase().as_str() {
            "openai" => Provider::OpenAi,
            "anthropic" => Provider::Anthropic,
            other => {
                return Err(format!(
                    "unknown provider `{other}` in `{s}`; expected one of: openai (any OpenAI-compatible API), anthropic"
                ))
            }
        };
        Ok(ModelRef {
            provider,
            model: model.trim().to_string(),
        })
    }
}

impl fmt::Display for ModelRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.provider, self.model)
    }
}

impl std::str::FromStr for ModelRef {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, Self::Err> {
        ModelRef::parse(s)
    }
}

/// The agent definition from `x-agen/agent.md`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AgentSpec {
    /// `name`, or the bundle folder's name.
    pub name: String,
    /// `model`; `None` when absent (e.g. `agen run --model` supplies it).
    pub model: Option<ModelRef>,
    /// `baseUrl`: the provider endpoint, e.g. `http://127.0.0.1:11434/v1`.
    pub base_url: Option<String>,
    /// `apiKey` as written; may contain `${NAME}` (see [`super::substitute_secrets`]).
    pub api_key: Option<String>,
    /// `preloadSkills`: skills put in the system prompt from the start.
    pub preload_skills: Vec<String>,
    /// The body of the file.
    pub system_prompt: String,
    /// Every other front-matter key (e.g. `temperature`, `maxTokens`), as JSON.
    pub extra: Map<String, Value>,
}

pub(crate) fn parse(text: &str, default_name: &str) -> Result<AgentSpec> {
    let fm = front_matter::split(AGENT_FILE, text)?;
    let holder = Value::Object(fm.fields);
    let obj = Obj::new(AGENT_FILE, "", &holder, "front matter fields")?;
    let name = match obj.opt_str("name")? {
        Some(n) if n.trim().is_empty() => {
            return Err(obj.err(
                "name",
                "is empty; expected the agent's name or no `name` (the folder name is used)",
            ))
        }
        Some(n) => n.trim().to_string(),
        None => default_name.to_string(),
    };
    let model = match obj.get("model") {
        None => None,
        Some(Value::String(m)) => Some(ModelRef::parse(m).map_err(|e| obj.err("model", e))?),
        Some(other) => {
            return Err(obj.err(
                "model",
                format!(
                    "expected `<provider>/<model>` such as `openai/gpt-4.1-mini`, got {}",
                    kind(other)
                ),
            ))
        }
    };
    let base_url = obj.opt_str("baseUrl")?;
    if let Some(url) = &base_url {
        check_http_url(url).map_err(|m| obj.err("baseUrl", m))?;
    }
    let api_key = obj.opt_str("apiKey")?;
    let preload_skills = obj.str_vec("preloadSkills")?;
    let extra = obj
        .map
        .iter()
        .filter(|(k, _)| {
            !matches!(
                k.as_str(),
                "name" | "model" | "baseUrl" | "apiKey" | "preloadSkills"
            )
        })
        .map(|(k, v)| (k.clone(), v.clone()))
        .collect();
    if fm.body.is_empty() {
        tracing::debug!("{AGENT_FILE}: empty system prompt");
    }
    Ok(AgentSpec {
        name,
        model,
        base_url,
        api_key,
        preload_skills,
        system_prompt: fm.body,
        extra,
    })
}
