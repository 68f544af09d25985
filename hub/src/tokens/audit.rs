//! The audit log: one record per mutating call (time, token id and name, namespace, call,
//! target, outcome), kept in the store in time order and written to the Hub's log as one
//! structured line (`audit record`, target `agen_hub::audit`).
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
    let seq = db.raw().increment("audit")?;
    let mut message = message.to_string();
    if message.len() > MAX_MESSAGE {
        let mut cut = MAX_MESSAGE;
        while !message.is_char_boundary(cut) {
            cut -= 1;
        }
        message.truncate(cut);
    }
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
    };
    db.put_json(Table::Audit, &key(rec.at_ms, rec.seq), &rec)?;
    tracing::info!(
        target: "agen_hub::audit",
        at_ms = rec.at_ms,
        token_id = %rec.token_id,
        token_name = %agen_shared::text::LogField(&rec.token_name),
        namespace = %rec.namespace,
        call = %rec.call,
        target_name = %agen_shared::text::LogField(&rec.target),
        outcome = %rec.outcome,
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
