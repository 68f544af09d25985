//! Structured output in the loop: a run whose bundle names an `outputSchema` ends only with an
//! answer that is JSON matching it. An answer that does not match is sent back to the model
//! with the schema error, at most `limits.outputRetries` times (default 2); then the run fails
//! naming the schema error. An accepted answer is the run's result as compact JSON, response
//! type `json`.
//!
//! Invariant: the check is a pure function of the answer and the answers refused before it in
//! this run's context, so a resumed run rebuilds the same messages from its log.

use agen_shared::bundle::OutputSchema;

use super::{Message, RunEnd};

/// What a final answer leads to.
pub(super) enum AnswerCheck {
    /// Send this back to the model as a user message and ask again.
    Retry(String),
    /// The run ends here (accepted, or failed after its retries).
    End(RunEnd),
}

/// The first line of the message that sends a refused answer back.
const RETRY_PREFIX: &str = "Your answer does not match the required output schema";

/// The task's own schema (`agen submit --output-schema`), compiled. The Hub checked that it
/// compiles; one that does not (an older or foreign Hub) is logged and the bundle's is used.
pub(super) fn task_schema(req: &agen_contract::run::RunAssignment) -> Option<OutputSchema> {
    let schema = req.output_schema.clone()?;
    match OutputSchema::new("--output-schema", schema) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(task = %req.task_id, "the task's output schema is not used: {e}");
            None
        }
    }
}

/// Checks a final answer against `schema` (any answer ends a run without one); `refused` is
/// how many answers of this run were sent back already, `limit` how many may be.
pub(super) fn check_answer(
    schema: Option<&OutputSchema>,
    text: &str,
    refused: u32,
    limit: u32,
) -> AnswerCheck {
    let Some(schema) = schema else {
        return AnswerCheck::End(RunEnd::answer(text));
    };
    let error = match schema.check(text) {
        Ok(value) => return AnswerCheck::End(RunEnd::json_answer(value.to_string())),
        Err(e) => e,
    };
    if refused >= limit {
        return AnswerCheck::End(RunEnd::failed(format!(
            "no valid answer after {} (limits.outputRetries {limit}): {error}",
            match refused + 1 {
                1 => "1 try".to_string(),
                n => format!("{n} tries"),
            }
        )));
    }
    AnswerCheck::Retry(format!(
        "{RETRY_PREFIX} ({}): {error}\n\nAnswer again with only the JSON value, no other text.\n\nThe schema:\n{}",
        schema.source, schema.schema
    ))
}

/// Whether `m` sent a refused answer back (a retry in the run's context).
pub(super) fn is_refused_answer(m: &Message) -> bool {
    matches!(m, Message::User { content } if content.starts_with(RETRY_PREFIX))
}
