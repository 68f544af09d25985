//! The recorded tool result limit: a tool result over [`MAX_TOOL_RESULT_BYTES`] is cut for the
//! model and the run log, with a note saying how long it was and how to get the rest, and kept
//! whole as an artifact when it fits the artifact limits.

use agen_contract::run::ArtifactSaved;

use super::state::Run;
use super::RunEventBody;
use crate::artifacts::{self, NewArtifact};

/// The longest tool result recorded and shown to the model (1 MiB).
pub const MAX_TOOL_RESULT_BYTES: usize = 1024 * 1024;

/// The first `max` bytes of `s`, at a character boundary.
fn head(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

impl Run<'_> {
    /// `text` when it is within the limit; otherwise its first 1 MiB and a note, the whole
    /// result saved as an artifact of the task when it fits.
    pub(super) async fn bounded_tool_result(&self, tool: &str, text: String) -> String {
        if text.len() <= MAX_TOOL_RESULT_BYTES {
            return text;
        }
        let total = text.len();
        let kept = head(&text, MAX_TOOL_RESULT_BYTES);
        let kept_chars = kept.chars().count();
        let name = format!("{}-result", tool.replace(['.', '/'], "-"));
        let where_rest = match artifacts::check_size(&name, total as u64) {
            Err(_) => format!(
                "the rest was not kept: it is over the artifact limit of {} bytes",
                artifacts::MAX_ARTIFACT_BYTES
            ),
            Ok(()) => {
                let saved = self
                    .h
                    .artifacts
                    .save(NewArtifact {
                        namespace: self.req.namespace.clone(),
                        task_id: self.req.task_id.to_string(),
                        run_id: self.req.run_id.to_string(),
                        name: name.clone(),
                        media_type: artifacts::DEFAULT_MEDIA_TYPE.to_string(),
                        content: text.as_bytes().to_vec(),
                    })
                    .await;
                match saved {
                    Ok(meta) => {
                        let _ = self
                            .emit(
                                RunEventBody::ArtifactSaved(ArtifactSaved {
                                    id: meta.id.clone(),
                                    name: name.clone(),
                                    media_type: meta.media_type.clone(),
                                    size: meta.size,
                                }),
                                false,
                            )
                            .await;
                        format!(
                            "the whole result is artifact {}; read the rest with read_artifact(id: \"{}\", offset: {kept_chars})",
                            meta.id, meta.id
                        )
                    }
                    Err(e) => {
                        format!("the rest was not kept: saving it as an artifact failed: {e}")
                    }
                }
            }
        };
        format!(
            "{kept}\n\n[tool result cut: it was {total} bytes, over the limit of {MAX_TOOL_RESULT_BYTES} bytes; the first {} bytes are above; {where_rest}]",
            kept.len()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::head;

    #[test]
    fn the_head_is_cut_at_a_character_boundary() {
        assert_eq!(head("héllo", 2), "h");
        assert_eq!(head("héllo", 3), "hé");
        assert_eq!(head("abc", 10), "abc");
    }
}
