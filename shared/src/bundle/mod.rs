//! The bundle: a folder that defines an agent (`mcp.json`, `skills/`, `x-agen/`, Keen tools),
//! its parsed model, validation with errors naming file, field and expectation, and its
//! content-addressed archive form.
//!
//! Invariants: [`Bundle::load`] either returns a fully validated bundle or the first problem
//! found, as a [`BundleError`] whose message names the file, the field and what was expected;
//! only `x-agen/agent.md` is required; every `${NAME}` used where secrets are substituted
//! (`mcp.json` env values and headers, `agent.md` `apiKey`) is declared in
//! `x-agen/secrets.json`. This module does no network IO and knows nothing of gRPC.

mod agent;
mod archive;
mod config;
mod entry;
mod error;
mod front_matter;
#[cfg(test)]
mod fuzz_tests;
mod harness;
#[cfg(test)]
mod hostile_tests;
mod json;
mod keen;
mod links;
mod mcp;
mod network;
mod output;
mod prompts;
mod read;
pub mod resources;
mod secrets;
mod skills;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

pub use agent::{AgentSpec, ModelRef, Provider, AGENT_FILE};
pub use archive::{
    decode, digest, encode, pack, unpack, unpack_verified, ArchiveEntry, EntryKind,
    MAX_BUNDLE_BYTES, SKIPPED_DIRS,
};
pub use config::{
    check_card_url, check_tool_pattern, model_name, tool_matches, AgentConfig, Delegate,
    DoubleTexting, Permission, Permissions, RemoteAgent, ToolOverride, CONFIG_FILE,
    DEFAULT_TOOL_BACKOFF, MAX_TOOL_BACKOFF, MAX_TOOL_RETRIES, MAX_TOOL_TIMEOUT,
};
pub use error::{BundleError, Result};
pub use harness::{HarnessConfig, Limits, StoreToolArguments, ToolProtocol, HARNESS_FILE};
pub use keen::{
    keen_script_root, parse_keen_registry, parse_keen_registry_value, split_flow_entry,
    validate_keen_script_entry, KeenTool, KeenToolEntry, KeenToolKind, RegisteredTool, FLOWS_DIR,
    KEEN_TOOLS_FILE,
};
pub use mcp::{unpinned_servers, valid_server_name, McpConfig, ServerSpec, MCP_FILE};
pub use network::{Destination, HostPattern, NetworkRules};
pub use output::OutputSchema;
pub use read::MAX_FILE_BYTES;
pub use resources::ResourceSpec;
pub use secrets::{
    secret_refs, substitute_secrets, valid_secret_name, SecretDecls, SecretSource, SubstituteError,
    SECRETS_FILE,
};
pub use skills::{Skill, SKILLS_DIR};

/// A loaded and validated bundle.
#[derive(Debug, Clone, PartialEq)]
pub struct Bundle {
    /// The bundle folder (absolute when it could be resolved).
    pub dir: PathBuf,
    /// `mcp.json`; empty when the bundle has none.
    pub mcp: McpConfig,
    /// `x-agen/agent.md`.
    pub agent: AgentSpec,
    /// `x-agen/config.json`; defaults when absent.
    pub config: AgentConfig,
    /// `x-agen/secrets.json`; empty when absent.
    pub secrets: SecretDecls,
    /// `x-agen/harness.json`; defaults when absent.
    pub harness: HarnessConfig,
    /// `skills/*/SKILL.md`, sorted by name.
    pub skills: Vec<Skill>,
    /// Whether `keen-tools.json` exists.
    pub has_keen_tools: bool,
    /// The registrations of `keen-tools.json` (empty when absent).
    pub keen_tools: Vec<KeenTool>,
    /// The schema `agent.md`'s `outputSchema` names, compiled.
    pub output_schema: Option<OutputSchema>,
    /// The MCP prompts `agent.md`'s `systemPrompts` names (`server/prompt`), in order.
    pub system_prompts: Vec<String>,
}

impl Bundle {
    /// Reads and validates every file of the bundle in `dir`.
    pub fn load(dir: &Path) -> Result<Bundle> {
        let meta = std::fs::metadata(dir).map_err(|e| BundleError::NotABundle {
            dir: dir.to_path_buf(),
            reason: e.to_string(),
        })?;
        if !meta.is_dir() {
            return Err(BundleError::NotABundle {
                dir: dir.to_path_buf(),
                reason: "not a folder".into(),
            });
        }
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        let folder_name = dir
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_else(|| "agent".to_string());

        let mcp = match json::read_optional(&dir, MCP_FILE)? {
            Some(v) => mcp::parse(&v)?,
            None => McpConfig::default(),
        };
        let agent_text = json::read_text_optional(&dir, AGENT_FILE)?.ok_or_else(|| BundleError::Missing {
            file: AGENT_FILE.to_string(),
            hint: "a bundle needs x-agen/agent.md: `---`, front matter such as `model: openai/gpt-4.1-mini`, `---`, then the system prompt".into(),
        })?;
        let agent = agent::parse(&agent_text, &folder_name)?;
        let config = match json::read_optional(&dir, CONFIG_FILE)? {
            Some(v) => config::parse(&v)?,
            None => AgentConfig::default(),
        };
        let secrets = match json::read_optional(&dir, SECRETS_FILE)? {
            Some(v) => secrets::parse(&v)?,
            None => SecretDecls::default(),
        };
        let harness = match json::read_optional(&dir, HARNESS_FILE)? {
            Some(v) => harness::parse(&v)?,
            None => HarnessConfig::default(),
        };
        let skills = skills::load_all(&dir)?;
        let keen = keen::load(&dir)?;
        let output_schema = output::load(&dir, agent.extra.get("outputSchema"))?;
        let system_prompts = prompts::load(agent.extra.get("systemPrompts"), &mcp)?;

        let bundle = Bundle {
            dir,
            mcp,
            agent,
            config,
            secrets,
            harness,
            skills,
            has_keen_tools: keen.is_some(),
            keen_tools: keen.unwrap_or_default(),
            output_schema,
            system_prompts,
        };
        bundle.check_cross_references()?;
        Ok(bundle)
    }

    /// Checks between files: declared secrets and preloaded skills.
    fn check_cross_references(&self) -> Result<()> {
        for (name, used_in) in referenced_secrets_checked(self)? {
            if !self.secrets.contains(&name) {
                return Err(BundleError::UndeclaredSecret { name, used_in });
            }
        }
        for (i, skill) in self.agent.preload_skills.iter().enumerate() {
            if !self.skills.iter().any(|s| &s.name == skill) {
                let available: Vec<&str> = self.skills.iter().map(|s| s.name.as_str()).collect();
                let available = if available.is_empty() {
                    "none".to_string()
                } else {
                    available.join(", ")
                };
                return Err(BundleError::invalid(
                    AGENT_FILE,
                    &format!("preloadSkills[{i}]"),
                    format!("skill `{skill}` not found; expected a folder skills/{skill}/ with a SKILL.md (skills in this bundle: {available})"),
                ));
            }
        }
        Ok(())
    }

    /// The value of every secret the bundle references: `env`-sourced ones through `env` (the
    /// Nest's or `agen run`'s environment, by variable name), `platform` ones through
    /// `platform` (the Hub's store, by secret name; pass `|_| None` where there is none).
    /// A missing value is a [`BundleError::MissingSecret`] naming the secret, where it is used
    /// and where it was looked for. Values are never logged.
    pub fn secret_values(
        &self,
        env: impl Fn(&str) -> Option<String>,
        platform: impl Fn(&str) -> Option<String>,
    ) -> Result<BTreeMap<String, String>> {
        let mut values = BTreeMap::new();
        for (name, used_in) in referenced_secrets(self) {
            if values.contains_key(&name) {
                continue;
            }
            let (value, reason) = match self.secrets.get(&name) {
                Some(SecretSource::Env { var }) => {
                    (env(var), format!("environment variable {var} is not set (x-agen/secrets.json declares source env)"))
                }
                Some(SecretSource::Platform) => (
                    platform(&name),
                    "it is not in the Hub's secret store (x-agen/secrets.json declares source platform; \
                     outside a fleet use {\"source\": \"env\"})"
                        .to_string(),
                ),
                None => (None, "it is not declared in x-agen/secrets.json".to_string()),
            };
            match value {
                Some(v) => {
                    values.insert(name, v);
                }
                None => {
                    return Err(BundleError::MissingSecret {
                        name,
                        used_in,
                        reason,
                    })
                }
            }
        }
        Ok(values)
    }

    /// `mcp.json` with every `${NAME}` in env values and headers replaced from `values`
    /// (see [`Bundle::secret_values`]).
    pub fn mcp_with_secrets(&self, values: &BTreeMap<String, String>) -> Result<McpConfig> {
        let mut out = self.mcp.clone();
        for (server, spec) in out.servers.iter_mut() {
            let (kind, map) = match spec {
                ServerSpec::Command { env, .. } => ("env", env),
                ServerSpec::Url { headers, .. } => ("headers", headers),
            };
            for (k, v) in map.iter_mut() {
                *v = fill(
                    v,
                    values,
                    &format!("{MCP_FILE} mcpServers.{server}.{kind}.{k}"),
                )?;
            }
        }
        Ok(out)
    }

    /// `apiKey` from `x-agen/agent.md` with `${NAME}` replaced from `values`.
    pub fn api_key_with_secrets(
        &self,
        values: &BTreeMap<String, String>,
    ) -> Result<Option<String>> {
        self.agent
            .api_key
            .as_deref()
            .map(|k| fill(k, values, &format!("{AGENT_FILE} apiKey")))
            .transpose()
    }

    /// The skill named `name`.
    pub fn skill(&self, name: &str) -> Option<&Skill> {
        self.skills.iter().find(|s| s.name == name)
    }
}

fn fill(value: &str, values: &BTreeMap<String, String>, used_in: &str) -> Result<String> {
    substitute_secrets(value, |name| values.get(name).cloned()).map_err(|e| match e {
        SubstituteError::Unresolved(name) => BundleError::MissingSecret {
            name,
            used_in: used_in.to_string(),
            reason: "no value was supplied".into(),
        },
        other => {
            let (file, field) = used_in.split_once(' ').unwrap_or((used_in, ""));
            BundleError::invalid(file, field, other.to_string())
        }
    })
}

/// Every `${NAME}` the bundle uses where secrets are substituted, with where it is used
/// (`mcp.json mcpServers.crm.headers.Authorization`, `x-agen/agent.md apiKey`), in file order.
/// A loaded bundle has only well-formed references, all declared.
pub fn referenced_secrets(bundle: &Bundle) -> Vec<(String, String)> {
    let mut out = Vec::new();
    for (value, place) in substitution_sites(bundle) {
        if let Ok(names) = secret_refs(value) {
            out.extend(names.into_iter().map(|n| (n, place.clone())));
        }
    }
    out
}

fn referenced_secrets_checked(bundle: &Bundle) -> Result<Vec<(String, String)>> {
    let mut out = Vec::new();
    for (value, place) in substitution_sites(bundle) {
        let names = secret_refs(value).map_err(|e| {
            let (file, field) = place.split_once(' ').unwrap_or((place.as_str(), ""));
            BundleError::invalid(file, field, e.to_string())
        })?;
        out.extend(names.into_iter().map(|n| (n, place.clone())));
    }
    Ok(out)
}

/// The values where `${NAME}` is substituted, each with `"<file> <field>"`.
fn substitution_sites(bundle: &Bundle) -> Vec<(&str, String)> {
    let mut sites = Vec::new();
    for (server, spec) in &bundle.mcp.servers {
        let (kind, map) = match spec {
            ServerSpec::Command { env, .. } => ("env", env),
            ServerSpec::Url { headers, .. } => ("headers", headers),
        };
        for (k, v) in map {
            sites.push((
                v.as_str(),
                format!("{MCP_FILE} mcpServers.{server}.{kind}.{k}"),
            ));
        }
    }
    if let Some(key) = &bundle.agent.api_key {
        sites.push((key.as_str(), format!("{AGENT_FILE} apiKey")));
    }
    for (i, d) in bundle.config.delegates.iter().enumerate() {
        if let Some(token) = d.a2a.as_ref().and_then(|r| r.token.as_ref()) {
            sites.push((
                token.as_str(),
                format!(
                    "{CONFIG_FILE} delegates[{i}].token (delegate {})",
                    d.deployment
                ),
            ));
        }
    }
    sites
}

/// The bearer token of the remote A2A delegate `d` with `${NAME}` replaced from `values`
/// (`None` when it has no token).
pub fn delegate_token_with_secrets(
    d: &Delegate,
    values: &BTreeMap<String, String>,
) -> Result<Option<String>> {
    d.a2a
        .as_ref()
        .and_then(|r| r.token.as_deref())
        .map(|t| {
            fill(
                t,
                values,
                &format!("{CONFIG_FILE} token of delegate {}", d.deployment),
            )
        })
        .transpose()
}
