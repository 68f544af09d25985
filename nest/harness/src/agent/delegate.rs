//! Delegates that are other [`Agent`]s of the same program: [`Agent::as_tool`] makes an agent a
//! host tool of another. The delegate's run is a run of its own (its own log folder when it
//! keeps a run log) in the caller's delegation tree (`agen/rootRunId`), with the caller's
//! labels.
//!
//! Invariants: the delegate run's id is derived from the caller's run id and call id, so a
//! resumed caller that sends the call again resumes the same delegate run instead of starting
//! another (the tool is idempotent exactly when the delegate keeps a run log); cancelling the
//! caller cancels the delegate run.

use serde::Deserialize;
use sha2::{Digest, Sha256};

use super::{Agent, RunOptions, Tool};
use crate::run::ToolContext;

/// The arguments of an agent used as a tool.
#[derive(Debug, Deserialize, schemars::JsonSchema)]
struct DelegateArgs {
    /// What to ask the agent: the task's input text.
    input: String,
    /// Continue this conversation of the agent (optional).
    #[serde(default)]
    conversation_key: Option<String>,
}

impl Agent {
    /// This agent as a host tool named `name` of another agent: the model calls it with
    /// `{"input", "conversation_key"?}` and gets this agent's answer (a failed or cancelled run
    /// is an error result saying why).
    pub fn as_tool(&self, name: impl Into<String>, description: impl Into<String>) -> Tool {
        let agent = self.clone();
        let mut tool = Tool::new(name, description);
        if self.inner.run_log.is_some() {
            tool = tool.idempotent();
        }
        tool.handler(move |args: DelegateArgs, cx: ToolContext| {
            let agent = agent.clone();
            async move { agent.delegated(args, cx).await }
        })
    }

    async fn delegated(&self, args: DelegateArgs, cx: ToolContext) -> Result<String, String> {
        let run_id = delegate_run_id(&cx.meta.run_id, &cx.call_id);
        let resumable = match &self.inner.run_log {
            Some(dir) => super::log::run_dir(dir, &run_id)
                .map(|d| d.exists())
                .unwrap_or(false),
            None => false,
        };
        let mut options = RunOptions::new().run_id(run_id.clone());
        options.root_run_id = Some(cx.meta.root_run_id.clone());
        options.labels = cx.meta.labels.clone();
        options.cancel = Some(cx.cancel.child_token());
        if let Some(k) = args.conversation_key.filter(|k| !k.is_empty()) {
            options = options.conversation(k);
        }
        let outcome = if resumable {
            self.resume(&run_id).await
        } else {
            self.run_with(args.input, options).await
        }
        .map_err(|e| format!("agent {} could not run: {e}", self.name()))?;
        if outcome.succeeded() {
            Ok(outcome.result)
        } else {
            Err(format!(
                "agent {} {}: {}",
                self.name(),
                outcome.state.as_str(),
                outcome.result
            ))
        }
    }
}

/// `<caller run>-<call id>`, kept to the run-id alphabet; a long one is shortened by hash.
fn delegate_run_id(caller_run: &str, call_id: &str) -> String {
    let raw = format!("{caller_run}-{call_id}");
    let clean: String = raw
        .chars()
        .map(|c| {
            if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                c
            } else {
                '_'
            }
        })
        .collect();
    if clean.len() <= 100 && clean == raw {
        clean
    } else {
        let hash = hex::encode(Sha256::digest(raw.as_bytes()));
        let head: String = clean.chars().take(60).collect();
        format!("{head}-{}", &hash[..32])
    }
}

#[cfg(test)]
mod tests {
    use super::delegate_run_id;

    #[test]
    fn delegate_run_ids_are_stable_and_stay_in_the_run_id_alphabet() {
        assert_eq!(delegate_run_id("r1", "call_7"), "r1-call_7");
        let odd = delegate_run_id("r1", "call/../x");
        assert!(odd.starts_with("r1-call____x-"), "{odd}");
        assert_eq!(odd, delegate_run_id("r1", "call/../x"));
        assert!(delegate_run_id(&"r".repeat(200), "c").len() <= 128);
    }
}
