//! W3C trace context for runs: a run's trace id (32 lowercase hex) is derived from its run id,
//! so every attempt of a resumed run stays in one trace; span ids (16 lowercase hex) are derived
//! from the run, the attempt and what the span is (the run itself, a model turn, a tool call),
//! so the harness (which sends `traceparent` in each tool call's `_meta`) and the Hub (which
//! builds `GetTrace` from the run log) name the same span without telling each other.

use sha2::{Digest, Sha256};

/// The trace id of a run: 32 lowercase hex digits, never all zero.
pub fn trace_id(run_id: &str) -> String {
    nonzero(&digest(&["agen/trace", run_id])[..16])
}

/// The span of one attempt of a run (the root of its spans).
pub fn run_span_id(run_id: &str, attempt: u32) -> String {
    span(&["run", run_id, &attempt.to_string()])
}

/// The span of a model turn (`turn` is the harness's turn number, or a flow agent's key).
pub fn model_span_id(run_id: &str, attempt: u32, turn: &str) -> String {
    span(&["model", run_id, &attempt.to_string(), turn])
}

/// The span of one tool call, by its call id.
pub fn tool_span_id(run_id: &str, attempt: u32, call_id: &str) -> String {
    span(&["tool", run_id, &attempt.to_string(), call_id])
}

/// `00-<trace>-<span>-01`, the W3C `traceparent` header value.
pub fn traceparent(trace_id: &str, span_id: &str) -> String {
    format!("00-{trace_id}-{span_id}-01")
}

fn span(parts: &[&str]) -> String {
    let mut all = vec!["agen/span"];
    all.extend_from_slice(parts);
    nonzero(&digest(&all)[..8])
}

fn digest(parts: &[&str]) -> Vec<u8> {
    let mut h = Sha256::new();
    for p in parts {
        h.update((p.len() as u64).to_be_bytes());
        h.update(p.as_bytes());
    }
    h.finalize().to_vec()
}

/// W3C forbids all-zero ids; a zero digest prefix (never seen in practice) gets its last bit set.
fn nonzero(bytes: &[u8]) -> String {
    let mut b = bytes.to_vec();
    if b.iter().all(|x| *x == 0) {
        if let Some(last) = b.last_mut() {
            *last = 1;
        }
    }
    hex::encode(b)
}
