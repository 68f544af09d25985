//! MCP resources and prompts of the connected servers: reading one resource (`resources/read`)
//! and fetching a prompt's text (`prompts/get`) for the system prompt. What each server listed
//! when it started is [`super::listing`].
//!
//! Invariants: a read or a prompt answers text only (binary contents are summarised), within a
//! deadline, at most [`MAX_RESOURCE_CHARS`] characters of a resource.

use std::time::Duration;

use rmcp::model::{GetPromptRequestParams, ReadResourceRequestParams, ResourceContents};

use super::error_chain;
use super::host::ToolHost;

/// The most characters of one resource a read returns (the rest is cut, said in the text).
pub const MAX_RESOURCE_CHARS: usize = 100_000;
/// How long one `prompts/get` at start may take.
const PROMPT_TIMEOUT: Duration = Duration::from_secs(10);

impl ToolHost {
    /// Fetches every prompt of `names` (`server/prompt`, as `agent.md` `systemPrompts` names
    /// them) and keeps each text, or why it could not be had, for [`ToolHost::system_prompt`].
    pub async fn load_prompts(&self, names: &[String]) {
        for full in names {
            let text = match full.split_once('/') {
                Some((server, prompt)) => self.prompt_text(server, prompt, PROMPT_TIMEOUT).await,
                None => Err(format!("prompt {full}: expected server/prompt")),
            };
            if let Err(e) = &text {
                tracing::warn!(prompt = %full, "system prompt not loaded: {e}");
            }
            self.keep_prompt(full, text);
        }
    }

    /// Reads `uri` from `server` as text for the model, within `timeout`.
    pub async fn read_resource(
        &self,
        server: &str,
        uri: &str,
        timeout: Duration,
    ) -> Result<String, String> {
        let peer = self
            .living_peer(server)
            .ok_or_else(|| format!("tool server {server} is not connected"))?;
        let read = peer.read_resource(ReadResourceRequestParams::new(uri));
        let result = tokio::time::timeout(timeout, read)
            .await
            .map_err(|_| {
                format!("tool server {server} did not answer resources/read within {timeout:?}")
            })?
            .map_err(|e| {
                format!(
                    "tool server {server} could not read {uri}: {}",
                    error_chain(&e)
                )
            })?;
        let mut parts = Vec::new();
        for c in &result.contents {
            match c {
                ResourceContents::TextResourceContents { text, .. } => parts.push(text.clone()),
                ResourceContents::BlobResourceContents {
                    mime_type, blob, ..
                } => parts.push(format!(
                    "[binary: {}, {} bytes base64]",
                    mime_type.as_deref().unwrap_or("application/octet-stream"),
                    blob.len()
                )),
                _ => parts.push("[contents of a kind this client does not know]".into()),
            }
        }
        let text = parts.join("\n");
        Ok(match text.char_indices().nth(MAX_RESOURCE_CHARS) {
            Some((at, _)) => format!(
                "{}\n[cut: the resource is longer than {MAX_RESOURCE_CHARS} characters]",
                &text[..at]
            ),
            None => text,
        })
    }

    /// The text of prompt `name` of `server` (its messages' text, in order), within `timeout`.
    pub async fn prompt_text(
        &self,
        server: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<String, String> {
        let peer = self
            .living_peer(server)
            .ok_or_else(|| format!("tool server {server} is not connected"))?;
        let get = peer.get_prompt(GetPromptRequestParams::new(name));
        let result = tokio::time::timeout(timeout, get)
            .await
            .map_err(|_| {
                format!("tool server {server} did not answer prompts/get within {timeout:?}")
            })?
            .map_err(|e| {
                format!(
                    "tool server {server} has no prompt {name}: {}",
                    error_chain(&e)
                )
            })?;
        let texts: Vec<String> = result
            .messages
            .iter()
            .filter_map(|m| m.content.as_text().map(|t| t.text.clone()))
            .collect();
        if texts.is_empty() {
            return Err(format!(
                "prompt {name} of tool server {server} has no text message"
            ));
        }
        Ok(texts.join("\n\n"))
    }
}
