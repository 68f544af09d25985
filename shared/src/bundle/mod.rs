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
mod error;
mod front_matter;
mod harness;
mod json;
mod keen;
mod mcp;
mod secrets;
mod skills;
#[cfg(test)]
mod tests;

use std::path::{Path, PathBuf};

pub use agent::{AgentSpec, ModelRef, Provider, AGENT_FILE};
pub use archive::{
    decode, digest, encode, pack, unpack, unpack_verified, ArchiveEntry, EntryKind, MAX_BUNDLE_BYTES, SKIPPED_DIRS,
};
pub use config::{
    check_tool_pattern, model_name, tool_matches, AgentConfig, Delegate, Permission, Permissions, ToolOverride,
    CONFIG_FILE,
};
pub use error::{BundleError, Result};
pub use harness::{HarnessConfig, Limits, ToolProtocol, HARNESS_FILE};
pub use keen::{
    keen_script_root, split_flow_entry, validate_keen_script_entry, KeenTool, KeenToolKind, FLOWS_DIR,
    KEEN_TOOLS_FILE,
};
pub use mcp::{valid_server_name, McpConfig, ServerSpec, MCP_FILE};
pub use secrets::{
    secret_refs, substitute_secrets, valid_secret_name, SecretDecls, SecretSource, SubstituteError, SECRETS_FILE,
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
}

impl Bundle {
    /// Reads and validates every file of the bundle in `dir`.
    pub fn load(dir: &Path) -> Result<Bundle> {
        let meta = std::fs::metadata(dir).map_err(|e| BundleError::NotABundle {
            dir: dir.to_path_buf(),
            reason: e.to_string(),
        })?;
        if !meta.is_dir() {
            return Err(BundleError::NotABundle { dir: dir.to_path_buf(), reason: "not a folder".into() });
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
                let available = if available.is_empty() { "none".to_string() } else { available.join(", ") };
                return Err(BundleError::invalid(
                    AGENT_FILE,
                    &format!("preloadSkills[{i}]"),
                    format!("skill `{skill}` not found; expected a folder skills/{skill}/ with a SKILL.md (skills in this bundle: {available})"),
                ));
            }
        }
        Ok(())
    }

    /// The skill named `name`.
    pub fn skill(&self, name: &str) -> Option<&Skill> {
        self.skills.iter().find(|s| s.name == name)
    }
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
            sites.push((v.as_str(), format!("{MCP_FILE} mcpServers.{server}.{kind}.{k}")));
        }
    }
    if let Some(key) = &bundle.agent.api_key {
        sites.push((key.as_str(), format!("{AGENT_FILE} apiKey")));
    }
    sites
}
