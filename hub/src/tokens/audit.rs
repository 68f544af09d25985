//! The audit log: one record per mutating call (time, token id and name, namespace, call,
//! target, outcome), kept in the store in time order and written to the Hub's log as one
//! structured line (`audit record`, target `agen_hub::audit`).
//!
//! A record may also say what a call decided ([`AuditDetail`]: an approval's decision, the task,
//! call id and tool it was about, the reason) and the remote address of the connection it came
//! on. Records older than the audit retention (`--audit-retention`) are removed by [`sweep`],
//! which the Hub's retention loop runs.
//!
//! Invariant: a record is durable (flushed) before the call's response leaves the Hub.

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::model::now_ms;
use crate::store::{Db, Table};

/// One mutating call.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct AuditRec {
    pub at_ms: i64,
    pub seq: u64,
    pub token_id: String,
    pub token_name: String,
    pub namespace: String,
    pub call: String,
    pub target: String,
    /// `ok` or the gRPC code in snake_case.
    pub outcome: String,
    #[serde(default)]
    pub message: String,
    /// What the call decided and where it came from (empty for records written before).
    #[serde(flatten)]
    pub detail: AuditDetail,
}

/// What a record says beyond who called what: every field optional (empty = not said).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AuditDetail {
    /// An approval's decision: `approve`, `approve always` or `deny`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub decision: String,
    /// The task, call id and tool the decision was about.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub task_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub call_id: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub tool: String,
    /// The reason the caller gave.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub reason: String,
    /// The remote `IP:port` of the connection the call came on.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub peer: String,
    /// A refusal's record: how many more refusals like it came from the same address in the
    /// same second, counted instead of recorded one by one (`refusals`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub suppressed: u64,
}

fn is_zero(n: &u64) -> bool {
    *n == 0
}

/// Which records to read.
#[derive(Debug, Clone, Default)]
pub struct AuditFilter {
    /// `None`: every namespace.
    pub namespace: Option<String>,
    pub since_ms: i64,
    /// The newest this many (0 = 1000).
    pub limit: u32,
}

/// Longest error message kept in a record.
const MAX_MESSAGE: usize = 512;

fn key(at_ms: i64, seq: u64) -> String {
    // Hex keeps the key a string (the typed layer keys by &str) and sorts like the numbers.
    format!("{:016x}{:016x}", at_ms.max(0), seq)
}

/// `s` cut to at most `max` bytes (on a character boundary).
fn cut(s: &str, max: usize) -> String {
    let mut s = s.to_string();
    if s.len() > max {
        let mut at = max;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s
}

/// Appends a record (now) and logs it.
#[allow(clippy::too_many_arguments)]
pub fn record(
    db: &Db,
    token_id: &str,
    token_name: &str,
    namespace: &str,
    call: &str,
    target: &str,
    outcome: &str,
    message: &str,
) -> Result<AuditRec> {
    record_with(
        db,
        token_id,
        token_name,
        namespace,
        call,
        target,
        outcome,
        message,
        AuditDetail::default(),
    )
}

/// [`record`] with what the call decided and its peer address.
#[allow(clippy::too_many_arguments)]
pub fn record_with(
    db: &Db,
    token_id: &str,
    token_name: &str,
    namespace: &str,
    call: &str,
    target: &str,
    outcome: &str,
    message: &str,
    detail: AuditDetail,
) -> Result<AuditRec> {
    let seq = db.raw().increment("audit")?;
    let message = cut(message, MAX_MESSAGE);
    // Every field may come from outside (a refused call's arguments): bounded like the message.
    let detail = AuditDetail {
        decision: cut(&detail.decision, MAX_MESSAGE),
        task_id: cut(&detail.task_id, MAX_MESSAGE),
        call_id: cut(&detail.call_id, MAX_MESSAGE),
        tool: cut(&detail.tool, MAX_MESSAGE),
        reason: cut(&detail.reason, MAX_MESSAGE),
        peer: cut(&detail.peer, MAX_MESSAGE),
        suppressed: detail.suppressed,
    };
    let rec = AuditRec {
        at_ms: now_ms(),
        seq,
        token_id: token_id.to_string(),
        token_name: token_name.to_string(),
        namespace: namespace.to_string(),
        call: call.to_string(),
        target: target.to_string(),
        outcome: outcome.to_string(),
        message,
        detail,
    };
    db.put_json(Table::Audit, &key(rec.at_ms, rec.seq), &rec)?;
    let d = &rec.detail;
    let tool_call = format!("{} {} {}", d.task_id, d.call_id, d.tool);
    tracing::info!(
        target: "agen_hub::audit",
        at_ms = rec.at_ms,
        token_id = %rec.token_id,
        token_name = %agen_shared::text::LogField(&rec.token_name),
        namespace = %rec.namespace,
        call = %rec.call,
        target_name = %agen_shared::text::LogField(&rec.target),
        outcome = %rec.outcome,
        decision = %rec.detail.decision,
        tool_call = %agen_shared::text::LogField(tool_call.trim()),
        reason = %agen_shared::text::LogField(&rec.detail.reason),
        peer = %rec.detail.peer,
        suppressed = rec.detail.suppressed,
        "audit record"
    );
    Ok(rec)
}

/// Records matching `filter`, oldest first.
pub fn list(db: &Db, filter: &AuditFilter) -> Result<Vec<AuditRec>> {
    let all: Vec<AuditRec> = db.list_json(Table::Audit, b"")?;
    let limit = if filter.limit == 0 {
        1000
    } else {
        filter.limit as usize
    };
    let mut out: Vec<AuditRec> = all
        .into_iter()
        .filter(|r| r.at_ms >= filter.since_ms)
        .filter(|r| {
            filter
                .namespace
                .as_ref()
                .is_none_or(|ns| &r.namespace == ns)
        })
        .collect();
    if out.len() > limit {
        out.drain(..out.len() - limit);
    }
    Ok(out)
}

/// Removes every record written before `before_ms`; returns how many.
pub fn sweep(db: &Db, before_ms: i64) -> Result<usize> {
    let raw = db.raw();
    let cutoff = key(before_ms, 0);
    let mut removed = 0;
    // Keys sort by time: stop at the first record inside the retention.
    for (k, _) in raw.scan(Table::Audit, b"")? {
        if k.as_slice() >= cutoff.as_bytes() {
            break;
        }
        raw.remove(Table::Audit, &k)?;
        removed += 1;
    }
    Ok(removed)
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[test]
    fn a_record_keeps_its_detail_and_the_sweep_removes_only_older_records() {
        let dir = tempfile::tempdir().unwrap();
        let store = crate::store::SledStore::open(&dir.path().join("db")).unwrap();
        let db = Db::new(Arc::new(store));
        let detail = AuditDetail {
            decision: "deny".into(),
            task_id: "t1".into(),
            call_id: "c1".into(),
            tool: "ws.run".into(),
            reason: "x".repeat(2000),
            peer: "127.0.0.1:5000".into(),
            suppressed: 0,
        };
        let old = record_with(
            &db,
            "i",
            "n",
            "ns",
            "DecideApproval",
            "t1",
            "ok",
            "",
            detail,
        )
        .unwrap();
        assert_eq!(old.detail.reason.len(), MAX_MESSAGE);
        record(&db, "i", "n", "ns", "SubmitTask", "d", "ok", "").unwrap();
        let all = list(&db, &AuditFilter::default()).unwrap();
        assert_eq!(all.len(), 2);
        assert_eq!(all[0].detail.tool, "ws.run");
        assert_eq!(all[1].detail, AuditDetail::default());
        assert_eq!(sweep(&db, old.at_ms).unwrap(), 0, "not older than itself");
        assert_eq!(sweep(&db, all[1].at_ms + 1).unwrap(), 2);
        assert!(list(&db, &AuditFilter::default()).unwrap().is_empty());
    }
}
