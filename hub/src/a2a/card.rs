//! The agent cards of a deployment: name and description from the bundle's `x-agen/agent.md`,
//! skills from its `skills/*/SKILL.md` and `keen-tools.json` (one skill for the agent when it
//! has neither), streaming, the extended card, bearer authentication with the Hub's API tokens,
//! and the JSON-RPC interface URL the caller reached the deployment at. What comes from a
//! bundle is read once per bundle digest.
//!
//! The public card ([`Detail::Public`]) says only what a stranger may know: its version is the
//! deployment's generation (`generation N`). The extended card ([`Detail::Extended`], for a
//! token holder through `GetExtendedAgentCard`, or for everyone with `--a2a-card-details`) adds
//! the bundle digest as the version and the provider (`Agen`, naming namespace and deployment).

use std::collections::{BTreeMap, HashMap};
use std::sync::Mutex;

use super::types::*;
use crate::core::Core;
use crate::error::{HubError, Result};

/// Longest description taken from the agent's prompt when its front matter has none.
const MAX_DESCRIPTION: usize = 1000;
/// The name of the card's one security scheme.
pub const SCHEME: &str = "bearer";
/// What the card says of it (the 401 answer names the command that makes one).
const SCHEME_DESCRIPTION: &str =
    "HTTP bearer authentication with an access key of this Agen Hub for the deployment's namespace (role submitter or above); the Hub's operator issues them";

/// What a card takes from a bundle.
#[derive(Debug, Clone)]
pub struct BundleFacts {
    pub name: String,
    pub description: String,
    pub skills: Vec<AgentSkill>,
}

/// Bundle facts by digest (bundles never change under a digest).
#[derive(Default)]
pub struct Cards {
    by_digest: Mutex<HashMap<String, BundleFacts>>,
}

/// How much a card says.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Detail {
    /// What a stranger may know.
    Public,
    /// What a caller with a token may know besides.
    Extended,
}

impl Cards {
    /// The card of `namespace/deployment`, whose interface URL is `interface_url`.
    pub async fn card(
        &self,
        core: &Core,
        namespace: &str,
        deployment: &str,
        interface_url: String,
        detail: Detail,
    ) -> Result<AgentCard> {
        let (view, _) = core.get_deployment(namespace, deployment)?;
        let digest = view.rec.bundle_digest.clone();
        let cached = self
            .by_digest
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&digest)
            .cloned();
        let facts = match cached {
            Some(f) => f,
            None => {
                let bytes = core.bundle_bytes(&digest)?.ok_or_else(|| {
                    HubError::not_found(format!(
                        "bundle {digest} of deployment {namespace}/{deployment} is not in the hub's store; deploy it again"
                    ))
                })?;
                let f = tokio::task::spawn_blocking(move || bundle_facts(&bytes))
                    .await
                    .map_err(|e| HubError::Internal(format!("bundle read panicked: {e}")))??;
                self.by_digest
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(digest.clone(), f.clone());
                f
            }
        };
        let (version, provider) = match detail {
            Detail::Public => (format!("generation {}", view.rec.generation), None),
            Detail::Extended => (
                digest.clone(),
                Some(AgentProvider {
                    organization: format!(
                        "Agen deployment {}/{deployment}",
                        crate::core::namespace_or_default(namespace)
                    ),
                    url: interface_url.clone(),
                }),
            ),
        };
        let mut card = build(facts, interface_url);
        card.version = version;
        card.provider = provider;
        Ok(card)
    }
}

/// The card from what the bundle says (version and provider are the caller's to set).
fn build(facts: BundleFacts, interface_url: String) -> AgentCard {
    AgentCard {
        name: facts.name,
        description: facts.description,
        supported_interfaces: vec![AgentInterface {
            url: interface_url,
            protocol_binding: BINDING_JSONRPC.into(),
            protocol_version: PROTOCOL_VERSION.into(),
        }],
        provider: None,
        version: String::new(),
        capabilities: AgentCapabilities {
            streaming: true,
            push_notifications: false,
            extended_agent_card: true,
        },
        security_schemes: BTreeMap::from([(
            SCHEME.to_string(),
            SecurityScheme {
                http_auth_security_scheme: HttpAuthSecurityScheme {
                    description: SCHEME_DESCRIPTION.into(),
                    scheme: "Bearer".into(),
                },
            },
        )]),
        security_requirements: vec![SecurityRequirement {
            schemes: BTreeMap::from([(SCHEME.to_string(), StringList { list: Vec::new() })]),
        }],
        default_input_modes: vec!["text/plain".into(), "application/json".into()],
        default_output_modes: vec!["text/plain".into()],
        skills: facts.skills,
    }
}

/// Reads name, description and skills from a stored bundle.
pub fn bundle_facts(bytes: &[u8]) -> Result<BundleFacts> {
    let tmp = tempfile::tempdir().map_err(HubError::io(
        std::env::temp_dir(),
        "cannot create a temporary folder",
    ))?;
    let dir = tmp.path().join("bundle");
    agen_shared::bundle::unpack(bytes, &dir)
        .map_err(|e| HubError::invalid(format!("bundle: {e}")))?;
    let bundle = agen_shared::bundle::Bundle::load(&dir)
        .map_err(|e| HubError::invalid(format!("bundle: {e}")))?;
    let agent = &bundle.agent;
    let description = match agent.extra.get("description") {
        Some(serde_json::Value::String(d)) if !d.trim().is_empty() => d.trim().to_string(),
        _ => first_paragraph(&agent.system_prompt)
            .unwrap_or_else(|| format!("the Agen agent {}", agent.name)),
    };
    let mut skills: Vec<AgentSkill> = bundle
        .skills
        .iter()
        .map(|s| AgentSkill {
            id: s.name.clone(),
            name: s.name.clone(),
            description: s.description.clone(),
            tags: vec!["skill".into()],
        })
        .collect();
    skills.extend(bundle.keen_tools.iter().map(|t| {
        AgentSkill {
            id: t.name.clone(),
            name: t.name.clone(),
            description: t
                .description
                .clone()
                .unwrap_or_else(|| format!("the tool {}", t.name)),
            tags: vec!["tool".into()],
        }
    }));
    if skills.is_empty() {
        skills.push(AgentSkill {
            id: agent.name.clone(),
            name: agent.name.clone(),
            description: description.clone(),
            tags: vec!["agent".into()],
        });
    }
    Ok(BundleFacts {
        name: agent.name.clone(),
        description,
        skills,
    })
}

/// The first paragraph of a prompt that is not a heading, cut at a char boundary.
fn first_paragraph(prompt: &str) -> Option<String> {
    let para = prompt
        .split("\n\n")
        .map(str::trim)
        .find(|p| !p.is_empty() && !p.starts_with('#'))?;
    let one_line = para.split_whitespace().collect::<Vec<_>>().join(" ");
    Some(crate::limits::cut(&one_line, MAX_DESCRIPTION))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_description_is_the_prompts_first_paragraph_that_is_not_a_heading() {
        assert_eq!(
            first_paragraph("# Title\n\nYou answer\nquestions.\n\nMore."),
            Some("You answer questions.".to_string())
        );
        assert_eq!(first_paragraph("  \n\n# only a heading"), None);
    }
}
