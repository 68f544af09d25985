//! The built-in tools: `finish`, `load_skill`, `report_progress` (fleet only),
//! `save_artifact` and `read_artifact` (on the harness's [`crate::artifacts::ArtifactStore`]).
//! Never gated by config or permissions.

use agen_contract::run::{ArtifactSaved, Progress, ToolCompleted, ToolFailure};
use serde_json::{json, Value};

use super::harness::Harness;
use super::state::Run;
use super::tools::CallResult;
use super::RunEventBody;
use crate::artifacts::{self, NewArtifact};
use crate::model::{ToolCall, ToolSpec};

use super::builtin_names::{
    BUILTIN_FINISH, BUILTIN_LOAD_SKILL, BUILTIN_READ_ARTIFACT, BUILTIN_REPORT_PROGRESS,
    BUILTIN_SAVE_ARTIFACT,
};

/// The built-ins `h` offers, after its MCP tools.
pub(super) fn specs(h: &Harness) -> Vec<ToolSpec> {
    let mut specs = Vec::new();
    specs.push(ToolSpec {
            name: BUILTIN_FINISH.into(),
            description: "End the run with your final answer. Call it when the task is done; `result` is what the user gets.".into(),
            parameters: json!({"type": "object", "properties": {"result": {"type": "string", "description": "the final answer"}}, "required": ["result"]}),
        });
    specs.push(ToolSpec {
            name: BUILTIN_SAVE_ARTIFACT.into(),
            description: "Save a long result (a report, a large file's contents) as an artifact so it does not crowd your context; returns its id (sha256:<hex> of the content). Saving the same content again returns the same id. Limits: 25 MB per artifact, 500 MB per namespace.".into(),
            parameters: json!({"type": "object", "properties": {
                "name": {"type": "string", "description": "a short name, e.g. weekly-report"},
                "content": {"type": "string", "description": "the content to save"},
                "mediaType": {"type": "string", "description": "e.g. text/markdown (default text/plain)"}
            }, "required": ["name", "content"]}),
        });
    specs.push(ToolSpec {
            name: BUILTIN_READ_ARTIFACT.into(),
            description: "Read a saved artifact: up to 4000 characters by default; page through a longer one with offset and length (the reply says the next offset).".into(),
            parameters: json!({"type": "object", "properties": {
                "id": {"type": "string", "description": "the id save_artifact returned (sha256:<hex>)"},
                "offset": {"type": "integer", "description": "the first character to read (default 0)"},
                "length": {"type": "integer", "description": "how many characters (default 4000)"}
            }, "required": ["id"]}),
        });
    if !h.bundle.skills.is_empty() {
        let list: Vec<String> = h
            .bundle
            .skills
            .iter()
            .map(|s| format!("- {} — {}", s.name, s.description))
            .collect();
        let names: Vec<&str> = h.bundle.skills.iter().map(|s| s.name.as_str()).collect();
        specs.push(ToolSpec {
                name: BUILTIN_LOAD_SKILL.into(),
                description: format!("Load a skill: returns its instructions. Available skills:\n{}", list.join("\n")),
                parameters: json!({"type": "object", "properties": {"name": {"type": "string", "enum": names, "description": "the skill's name"}}, "required": ["name"]}),
            });
    }
    if h.progress {
        specs.push(ToolSpec {
                name: BUILTIN_REPORT_PROGRESS.into(),
                description: "Report progress on a long task so whoever watches it sees more than \"running\". It does not end the run.".into(),
                parameters: json!({"type": "object", "properties": {
                    "step": {"type": "string", "description": "what you are doing now"},
                    "done": {"type": "integer", "description": "steps done"},
                    "total": {"type": "integer", "description": "steps in all"},
                    "note": {"type": "string"},
                    "artifacts": {"type": "array", "items": {"type": "string"}, "description": "artifact ids"}
                }, "required": ["step"]}),
            });
    }
    specs
}

impl Run<'_> {
    pub(super) fn finish_call(&self, call: &ToolCall) -> CallResult {
        let result = match call.arguments.get("result") {
            Some(Value::String(s)) => s.clone(),
            Some(other) => other.to_string(),
            None => match &call.arguments {
                Value::String(s) => s.clone(),
                _ => {
                    return CallResult::error("finish needs `result`: the final answer as a string")
                }
            },
        };
        CallResult {
            finish: Some(result),
            ..CallResult::ok("finished")
        }
    }

    pub(super) async fn load_skill(&self, call: &ToolCall) -> CallResult {
        let name = call
            .arguments
            .get("name")
            .and_then(Value::as_str)
            .unwrap_or_default();
        match self.h.bundle.skill(name) {
            Some(s) => {
                self.activity(format!("loading skill {name}")).await;
                CallResult::ok(s.body.clone())
            }
            None => {
                let available: Vec<&str> = self
                    .h
                    .bundle
                    .skills
                    .iter()
                    .map(|s| s.name.as_str())
                    .collect();
                CallResult::error(format!(
                    "no skill named `{name}`; available skills: {}",
                    available.join(", ")
                ))
            }
        }
    }

    pub(super) async fn report_progress(&self, call: &ToolCall) -> CallResult {
        let progress: Progress = serde_json::from_value(call.arguments.clone()).unwrap_or_default();
        if progress.step.is_empty() {
            return CallResult::error("report_progress needs `step`: what you are doing now");
        }
        self.activity(progress.step.clone()).await;
        self.progress(progress).await;
        CallResult::ok("progress recorded")
    }

    pub(super) async fn save_artifact(&self, call: &ToolCall) -> CallResult {
        let answer = |content: String, is_error: bool| {
            if is_error {
                CallResult::error(content)
            } else {
                CallResult::ok(content)
            }
        };
        let args = &call.arguments;
        let Some(name) = args
            .get("name")
            .and_then(Value::as_str)
            .filter(|n| !n.trim().is_empty())
        else {
            return answer(
                "save_artifact needs `name`: a short name for the artifact, e.g. weekly-report"
                    .into(),
                true,
            );
        };
        let content = match args.get("content") {
            Some(Value::String(s)) => s.clone(),
            None if args.get("content_artifact").is_some() => {
                return self.saved_by_reference(call).await
            }
            Some(Value::Null) | None => {
                return answer(
                    "save_artifact needs `content`: the text to save".into(),
                    true,
                )
            }
            Some(other) => other.to_string(),
        };
        let media_type = args
            .get("mediaType")
            .or_else(|| args.get("media_type"))
            .and_then(Value::as_str)
            .filter(|m| !m.trim().is_empty())
            .unwrap_or(artifacts::DEFAULT_MEDIA_TYPE)
            .to_string();
        if let Err(e) = artifacts::check_size(name, content.len() as u64) {
            return answer(e.to_string(), true);
        }
        let _ = self
            .emit(
                RunEventBody::ToolStarted(self.started(call, BUILTIN_SAVE_ARTIFACT, false)),
                false,
            )
            .await;
        self.activity(format!("saving artifact {name}")).await;
        let saved = self
            .h
            .artifacts
            .save(NewArtifact {
                namespace: self.req.namespace.clone(),
                task_id: self.req.task_id.to_string(),
                run_id: self.req.run_id.to_string(),
                name: name.to_string(),
                media_type,
                content: content.into_bytes(),
            })
            .await;
        match saved {
            Ok(meta) => {
                let _ = self
                    .emit(
                        RunEventBody::ArtifactSaved(ArtifactSaved {
                            id: meta.id.clone(),
                            name: name.to_string(),
                            media_type: meta.media_type.clone(),
                            size: meta.size,
                        }),
                        false,
                    )
                    .await;
                // Recorded, so a resumed run reuses the id instead of saving again (its log
                // may hold the content by id only, see `elide_saved_content`).
                let _ = self
                    .emit(
                        RunEventBody::ToolCompleted(ToolCompleted {
                            call_id: call.id.clone(),
                            tool: BUILTIN_SAVE_ARTIFACT.into(),
                            result: meta.id.clone(),
                            is_error: false,
                            duration_ms: 0,
                            keen_result: None,
                        }),
                        false,
                    )
                    .await;
                answer(meta.id, false)
            }
            Err(e) => {
                let content = format!("save_artifact failed: {e}");
                let _ = self
                    .emit(
                        self.failed(
                            call,
                            BUILTIN_SAVE_ARTIFACT,
                            &content,
                            ToolFailure::Failed,
                            0,
                        ),
                        false,
                    )
                    .await;
                answer(content, true)
            }
        }
    }

    /// A `save_artifact` call whose content a resumed run's log holds by id only: the
    /// artifact is either stored already (its id is the answer) or the content is gone.
    async fn saved_by_reference(&self, call: &ToolCall) -> CallResult {
        let id = call
            .arguments
            .get("content_artifact")
            .and_then(Value::as_str)
            .unwrap_or_default();
        let (content, is_error) = match self.h.artifacts.read(&self.req.namespace, id).await {
            Ok(_) => (id.to_string(), false),
            Err(_) => (
                "save_artifact was interrupted before its content was stored, and the run log keeps only its digest; call save_artifact again with the content".to_string(),
                true,
            ),
        };
        if is_error {
            CallResult::error(content)
        } else {
            CallResult::ok(content)
        }
    }

    pub(super) async fn read_artifact(&self, call: &ToolCall) -> CallResult {
        let answer = |content: String, is_error: bool| {
            if is_error {
                CallResult::error(content)
            } else {
                CallResult::ok(content)
            }
        };
        let args = &call.arguments;
        let Some(id) = args.get("id").and_then(Value::as_str) else {
            return answer(
                "read_artifact needs `id`: the sha256:<hex> id save_artifact returned".into(),
                true,
            );
        };
        let number = |key: &str| -> Result<Option<usize>, String> {
            match args.get(key) {
                None | Some(Value::Null) => Ok(None),
                Some(v) => v
                    .as_u64()
                    .or_else(|| v.as_str().and_then(|s| s.trim().parse().ok()))
                    .map(|n| Some(usize::try_from(n).unwrap_or(usize::MAX)))
                    .ok_or_else(|| {
                        format!(
                            "read_artifact: `{key}` must be a whole number of characters, got {v}"
                        )
                    }),
            }
        };
        let (offset, length) = match (number("offset"), number("length")) {
            (Ok(o), Ok(l)) => (o.unwrap_or(0), l),
            (Err(e), _) | (_, Err(e)) => return answer(e, true),
        };
        match self.h.artifacts.read(&self.req.namespace, id).await {
            Ok(bytes) => {
                let text = String::from_utf8_lossy(&bytes);
                answer(artifacts::page(id, &text, offset, length), false)
            }
            Err(e) => answer(format!("read_artifact failed: {e}"), true),
        }
    }
}
