//! The local run log of `agen run` and embedded agents: one sled database per run under
//! [`runs_dir`] (`$XDG_STATE_HOME/agen/runs/<run id>`), holding the run's assignment, what
//! started it ([`RunOrigin`]) and its events keyed `(attempt, seq)`. [`SledRunLog`] is the
//! [`RunEventSink`] that writes it and the reader `local_runs.rs` and `agen run --resume` use.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use anyhow::Context;

use crate::run::{RunAssignment, RunEventBody, RunEventSink, SinkError};

/// The namespace of standalone runs (and the folder of their artifacts).
pub const STANDALONE_NAMESPACE: &str = "standalone";

/// `$XDG_STATE_HOME/agen/runs`, else `~/.local/state/agen/runs`, else a temp folder.
pub fn runs_dir() -> PathBuf {
    if let Some(x) = std::env::var_os("XDG_STATE_HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(x).join("agen/runs");
    }
    if let Some(h) = std::env::var_os("HOME").filter(|v| !v.is_empty()) {
        return PathBuf::from(h).join(".local/state/agen/runs");
    }
    std::env::temp_dir().join("agen/runs")
}

/// A run log's kept assignment and its events, each with the attempt that wrote it.
pub type LoggedRun = (Option<RunAssignment>, Vec<(u32, RunEventBody)>);

/// Where a [`SledRunLog`] keeps the run's assignment.
const ASSIGNMENT_KEY: &str = "assignment";
/// Where a [`SledRunLog`] of `agen run` keeps its [`RunOrigin`].
const ORIGIN_KEY: &str = "origin";

/// What started a local run: its bundle folder (absolute) and `--model`, so `agen run
/// --resume RUN` needs neither.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct RunOrigin {
    pub bundle: PathBuf,
    #[serde(default)]
    pub model: Option<String>,
}

/// One event of a run log with where and when it was written.
#[derive(Debug, Clone)]
pub struct LoggedRecord {
    pub attempt: u32,
    pub seq: u64,
    /// RFC 3339 (empty in a log written before times were kept).
    pub at: String,
    pub body: RunEventBody,
}

/// A whole run log: assignment, origin and every event.
#[derive(Debug, Clone)]
pub struct RunLogContents {
    pub assignment: Option<RunAssignment>,
    pub origin: Option<RunOrigin>,
    pub records: Vec<LoggedRecord>,
}

/// A run log in a local sled database: tree `events`, key `(attempt, seq)` big-endian, value
/// `{"kind", "at", "json"}` (a [`RunEventBody`] in its serialised form, plus the time).
pub struct SledRunLog {
    pub(crate) db: sled::Db,
    events: sled::Tree,
    attempt: u32,
    seq: AtomicU64,
    /// `artifact.saved` events seen (so `agen run` can say where artifacts went).
    pub artifacts_saved: AtomicU64,
}

impl SledRunLog {
    /// Opens (or creates) the log in `dir` for `attempt` of `run_id`.
    pub fn open(dir: &Path, run_id: &str, attempt: u32) -> anyhow::Result<SledRunLog> {
        std::fs::create_dir_all(dir)
            .with_context(|| format!("while creating the run log folder {}", dir.display()))?;
        let db = sled::open(dir)
            .with_context(|| format!("while opening the run log {}", dir.display()))?;
        db.insert("run_id", run_id.as_bytes())
            .context("while writing the run log")?;
        let events = db
            .open_tree("events")
            .context("while opening the run log's events")?;
        Ok(SledRunLog {
            db,
            events,
            attempt,
            seq: AtomicU64::new(0),
            artifacts_saved: AtomicU64::new(0),
        })
    }

    /// Keeps the run's assignment (without its replay) so the run can be resumed from this log
    /// alone; durable on return.
    pub fn put_assignment(&self, req: &RunAssignment) -> anyhow::Result<()> {
        let mut kept = req.clone();
        kept.replay.clear();
        let bytes = serde_json::to_vec(&kept).context("while encoding the run's assignment")?;
        self.db
            .insert(ASSIGNMENT_KEY, bytes)
            .context("while writing the run's assignment to the run log")?;
        self.db
            .flush()
            .context("while flushing the run's assignment to the run log")?;
        Ok(())
    }

    /// Keeps what started the run (durable with the assignment that follows).
    pub fn put_origin(&self, origin: &RunOrigin) -> anyhow::Result<()> {
        let bytes = serde_json::to_vec(origin).context("while encoding the run's origin")?;
        self.db
            .insert(ORIGIN_KEY, bytes)
            .context("while writing the run's origin to the run log")?;
        Ok(())
    }

    /// Everything in the log in `dir`, events in order with attempt, seq and time.
    pub fn read_log(dir: &Path) -> anyhow::Result<RunLogContents> {
        let db = sled::open(dir)
            .with_context(|| format!("while opening the run log {}", dir.display()))?;
        let decode = |key: &str| -> anyhow::Result<Option<sled::IVec>> {
            db.get(key)
                .with_context(|| format!("while reading {key} in {}", dir.display()))
        };
        let assignment = match decode(ASSIGNMENT_KEY)? {
            Some(v) => Some(serde_json::from_slice(&v).with_context(|| {
                format!("while reading the run's assignment in {}", dir.display())
            })?),
            None => None,
        };
        let origin =
            match decode(ORIGIN_KEY)? {
                Some(v) => Some(serde_json::from_slice(&v).with_context(|| {
                    format!("while reading the run's origin in {}", dir.display())
                })?),
                None => None,
            };
        let events = db.open_tree("events")?;
        let mut records = Vec::new();
        for kv in events.iter() {
            let (k, v) = kv?;
            let (attempt, seq) = event_key(&k);
            let record: LoggedEvent = serde_json::from_slice(&v).with_context(|| {
                format!("while reading event {attempt}/{seq} in {}", dir.display())
            })?;
            records.push(LoggedRecord {
                attempt,
                seq,
                at: record.at,
                body: record.body,
            });
        }
        Ok(RunLogContents {
            assignment,
            origin,
            records,
        })
    }

    /// The kept assignment and every event with the attempt that wrote it, in order.
    pub fn read_with_attempts(dir: &Path) -> anyhow::Result<LoggedRun> {
        let db = sled::open(dir)
            .with_context(|| format!("while opening the run log {}", dir.display()))?;
        let assignment = match db.get(ASSIGNMENT_KEY)? {
            Some(v) => Some(serde_json::from_slice(&v).with_context(|| {
                format!("while reading the run's assignment in {}", dir.display())
            })?),
            None => None,
        };
        let events = db.open_tree("events")?;
        let mut out = Vec::new();
        for kv in events.iter() {
            let (k, v) = kv?;
            let (attempt, _) = event_key(&k);
            let record: LoggedEvent = serde_json::from_slice(&v)?;
            out.push((attempt, record.body));
        }
        Ok((assignment, out))
    }

    /// Flushes everything appended so far.
    pub async fn flush(&self) -> Result<(), SinkError> {
        self.db
            .flush_async()
            .await
            .map(|_| ())
            .map_err(|e| SinkError::Unavailable(e.to_string()))
    }

    /// Every event in order.
    pub fn read_all(dir: &Path) -> anyhow::Result<Vec<RunEventBody>> {
        let db = sled::open(dir)
            .with_context(|| format!("while opening the run log {}", dir.display()))?;
        let events = db.open_tree("events")?;
        let mut out = Vec::new();
        for kv in events.iter() {
            let (_, v) = kv?;
            let record: LoggedEvent = serde_json::from_slice(&v)?;
            out.push(record.body);
        }
        Ok(out)
    }
}

#[async_trait::async_trait]
impl RunEventSink for SledRunLog {
    async fn emit(&self, body: RunEventBody, sync: bool) -> Result<(), SinkError> {
        let seq = self.seq.fetch_add(1, Ordering::SeqCst);
        if matches!(body, RunEventBody::ArtifactSaved(_)) {
            self.artifacts_saved.fetch_add(1, Ordering::SeqCst);
        }
        let mut key = self.attempt.to_be_bytes().to_vec();
        key.extend_from_slice(&seq.to_be_bytes());
        let record = LoggedEvent {
            at: chrono::Utc::now().to_rfc3339(),
            body,
        };
        let bytes =
            serde_json::to_vec(&record).map_err(|e| SinkError::Unavailable(e.to_string()))?;
        self.events
            .compare_and_swap(key, None as Option<&[u8]>, Some(bytes))
            .map_err(|e| SinkError::Unavailable(e.to_string()))?
            .map_err(|_| SinkError::Unavailable(format!("event {seq} already exists")))?;
        if sync {
            self.db
                .flush_async()
                .await
                .map_err(|e| SinkError::Unavailable(e.to_string()))?;
        }
        Ok(())
    }

    fn durable_results(&self) -> bool {
        true
    }
}

/// One record of a [`SledRunLog`]: `{"kind", "json", "at"}`.
#[derive(serde::Serialize, serde::Deserialize)]
struct LoggedEvent {
    #[serde(default)]
    at: String,
    #[serde(flatten)]
    body: RunEventBody,
}

/// An event's key in the log: the attempt (4 bytes) then the sequence (8 bytes), big-endian; a
/// key too short for either reads as 0.
fn event_key(k: &[u8]) -> (u32, u64) {
    let attempt = k
        .get(..4)
        .and_then(|b| <[u8; 4]>::try_from(b).ok())
        .map(u32::from_be_bytes)
        .unwrap_or(0);
    let seq = k
        .get(4..12)
        .and_then(|b| <[u8; 8]>::try_from(b).ok())
        .map(u64::from_be_bytes)
        .unwrap_or(0);
    (attempt, seq)
}
