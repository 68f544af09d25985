//! An embedded agent's local run log folder: one [`SledRunLog`] per run (`<dir>/<run id>/`, the
//! same log `agen run` keeps, with the run's assignment beside its events) and the
//! conversations' histories (`<dir>/conversations/<sha256 of the key>.json`).
//!
//! Invariant: a run's assignment is durable before its first event, so every run folder can be
//! resumed from the folder alone.

use std::path::{Path, PathBuf};

use agen_contract::run::Message;
use sha2::{Digest, Sha256};

use super::AgentError;
use crate::run::{RunAssignment, RunEventBody};
use crate::run_log::SledRunLog;

/// What a run folder holds.
pub(super) struct Logged {
    pub assignment: RunAssignment,
    /// Every event, with the attempt that wrote it.
    pub events: Vec<(u32, RunEventBody)>,
}

impl Logged {
    pub fn last_attempt(&self) -> u32 {
        self.events
            .iter()
            .map(|(a, _)| *a)
            .max()
            .unwrap_or(0)
            .max(self.assignment.attempt)
    }

    pub fn finished(&self) -> bool {
        self.events
            .iter()
            .any(|(_, e)| matches!(e, RunEventBody::RunFinished(_)))
    }
}

pub(super) fn run_dir(log: &Path, run_id: &str) -> Result<PathBuf, AgentError> {
    let plain = !run_id.is_empty()
        && run_id.len() <= 128
        && run_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if !plain || run_id == "conversations" {
        return Err(AgentError::Invalid(format!(
            "run id `{run_id}` is not valid; expected 1 to 128 of a-z, A-Z, 0-9, `-` and `_`"
        )));
    }
    Ok(log.join(run_id))
}

/// Opens a new attempt's log for `req` and keeps its assignment.
pub(super) fn open(log: &Path, req: &RunAssignment) -> Result<SledRunLog, AgentError> {
    let dir = run_dir(log, req.run_id.as_str())?;
    let sink = SledRunLog::open(&dir, req.run_id.as_str(), req.attempt)
        .map_err(|e| AgentError::RunLog(format!("{}: {e:#}", dir.display())))?;
    sink.put_assignment(req)
        .map_err(|e| AgentError::RunLog(format!("{}: {e:#}", dir.display())))?;
    Ok(sink)
}

/// Reads the run folder of `run_id`.
pub(super) fn read(log: &Path, run_id: &str) -> Result<Logged, AgentError> {
    let dir = run_dir(log, run_id)?;
    if !dir.is_dir() {
        return Err(AgentError::UnknownRun {
            run_id: run_id.to_string(),
            dir: log.to_path_buf(),
        });
    }
    let (assignment, events) = SledRunLog::read_with_attempts(&dir)
        .map_err(|e| AgentError::RunLog(format!("{}: {e:#}", dir.display())))?;
    let assignment = assignment.ok_or_else(|| {
        AgentError::RunLog(format!(
            "{}: the run's assignment is missing, so it cannot be resumed",
            dir.display()
        ))
    })?;
    Ok(Logged { assignment, events })
}

/// The ids of the run folders in `log`, oldest first (run ids are UUIDv7 by default).
pub(super) fn run_ids(log: &Path) -> Result<Vec<String>, AgentError> {
    let entries = std::fs::read_dir(log).map_err(|e| AgentError::Io {
        what: "listing the run log folder".into(),
        path: log.to_path_buf(),
        source: e,
    })?;
    let mut ids: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| n != "conversations")
        .collect();
    ids.sort();
    Ok(ids)
}

fn conversation_file(log: &Path, key: &str) -> PathBuf {
    log.join("conversations").join(format!(
        "{}.json",
        hex::encode(Sha256::digest(key.as_bytes()))
    ))
}

/// The stored history of conversation `key` (empty when it has none yet).
pub(super) fn read_history(log: &Path, key: &str) -> Result<Vec<Message>, AgentError> {
    let path = conversation_file(log, key);
    match std::fs::read(&path) {
        Ok(bytes) => serde_json::from_slice(&bytes)
            .map_err(|e| AgentError::RunLog(format!("{}: {e}", path.display()))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(AgentError::Io {
            what: "reading a conversation".into(),
            path,
            source: e,
        }),
    }
}

/// Replaces the stored history of conversation `key` (written to a temp file, then renamed).
pub(super) fn write_history(log: &Path, key: &str, history: &[Message]) -> Result<(), AgentError> {
    let path = conversation_file(log, key);
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |e| AgentError::Io {
            what: "writing a conversation".into(),
            path,
            source: e,
        }
    };
    if let Some(parent) = path.parent() {
        std::fs::create_dir_all(parent).map_err(io(parent))?;
    }
    let bytes = serde_json::to_vec(history)
        .map_err(|e| AgentError::RunLog(format!("{}: {e}", path.display())))?;
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, bytes).map_err(io(&tmp))?;
    std::fs::rename(&tmp, &path).map_err(io(&path))
}
