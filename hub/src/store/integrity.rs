//! Whether the store still holds everything it acknowledged: the event log read back record by
//! record (`log_scan`), and compared with what sled says (how many flushes it made durable,
//! which tasks it knows and how many events each has). The Hub refuses to serve a store with a
//! problem here ([`super::StoreError::Damaged`], exit code 65 from `agen hub`); `agen hub
//! verify` prints the same [`Report`], `agen hub repair` keeps the intact records and fails
//! the tasks a problem names.
//!
//! The comparisons, and why a crash (kill -9) never trips them:
//! - the log's header counts sled's durable flushes, and sled keeps the same count (written
//!   in each flush): sled with fewer lost writes (its files cut or replaced); sled's files
//!   missing while the log holds records, the same;
//! - a log missing while sled has made flushes with one was deleted or lost;
//! - a task sled knows with `next_event_seq` N must have task events 1..N-1 in the log: the
//!   log is written first and reaches the page cache at once, sled's record after it
//!   (buffered, so after a crash sled may lag the log, never lead it), and retention removes
//!   the task record (flushed) before its events;
//! - task events of a task sled does not know are not a problem: a submit the crash cut
//!   between its first event and its record (never acknowledged), or the leftovers of a
//!   retention sweep the crash cut.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::event_log::{Access, EventLog, Findings, FILE_NAME};
use super::{Result, StoreError, Table};

/// The exit code of `agen hub` when it refuses a damaged store (sysexits' EX_DATAERR).
pub const EXIT_STORE_DAMAGED: i32 = 65;
/// sled's count of the flushes it made durable, in its `counters` tree.
pub(super) const SLED_FLUSHES: &str = "store_flushes";

/// What the checks need of a task's record in sled.
#[derive(Debug, Clone, Deserialize)]
pub(super) struct TaskBrief {
    pub task_id: String,
    #[serde(default)]
    pub run_id: String,
    #[serde(default)]
    pub next_event_seq: u64,
    pub state: crate::model::TaskState,
    #[serde(default)]
    pub outcome: Option<OutcomeBrief>,
}

#[derive(Debug, Clone, Deserialize)]
pub(super) struct OutcomeBrief {
    #[serde(default)]
    pub error: String,
}

/// How a task a repair failed says so (`agen hub repair`): its history is known to be
/// partial, so it is not compared again.
pub const HISTORY_LOST: &str = "history_lost";

impl TaskBrief {
    fn history_lost(&self) -> bool {
        self.state == crate::model::TaskState::Failed
            && self
                .outcome
                .as_ref()
                .is_some_and(|o| o.error.starts_with(HISTORY_LOST))
    }

    /// Started and not finished: a resume would replay its history.
    fn in_flight(&self) -> bool {
        !self.state.is_terminal() && !self.run_id.is_empty()
    }
}

/// What sled holds, for the checks.
#[derive(Debug, Default)]
pub(super) struct SledView {
    /// sled's files were there before it was opened.
    pub existed: bool,
    pub flushes: u64,
    pub tasks: Vec<TaskBrief>,
}

impl SledView {
    pub(super) fn read(db: &sled::Db, existed: bool) -> Result<SledView, String> {
        let counters = db
            .open_tree(Table::Counters.name())
            .map_err(|e| e.to_string())?;
        let flushes = counters
            .get(SLED_FLUSHES)
            .map_err(|e| e.to_string())?
            .and_then(|v| <[u8; 8]>::try_from(v.as_ref()).ok())
            .map_or(0, u64::from_be_bytes);
        let tree = db
            .open_tree(Table::Tasks.name())
            .map_err(|e| e.to_string())?;
        let mut tasks = Vec::new();
        for entry in tree.iter() {
            let (key, value) = entry.map_err(|e| e.to_string())?;
            let brief: TaskBrief = serde_json::from_slice(&value).map_err(|e| {
                format!(
                    "task record {} is corrupt: {e}",
                    String::from_utf8_lossy(&key)
                )
            })?;
            tasks.push(brief);
        }
        Ok(SledView {
            existed,
            flushes,
            tasks,
        })
    }
}

/// Whether sled's files are in `dir` (before sled is opened, which would make them).
pub(super) fn sled_files_exist(dir: &Path) -> bool {
    dir.join("conf").exists() || dir.join("db").exists()
}

/// One thing the store lost: where, and which tasks it touches.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Problem {
    pub file: PathBuf,
    /// The byte offset in `file`, when the problem has one.
    pub offset: Option<u64>,
    pub what: String,
    /// The tasks whose history it touches.
    pub tasks: BTreeSet<String>,
}

/// What a check of the store found.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Report {
    /// The store's folder (`<data-dir>/db`).
    pub dir: PathBuf,
    pub problems: Vec<Problem>,
    /// Findings that are not damage (a torn tail a crash left, events of unknown tasks).
    pub notes: Vec<String>,
    /// Whole records in the event log.
    pub records: u64,
    /// Tasks sled knows.
    pub tasks: u64,
}

impl Report {
    /// Nothing acknowledged was lost.
    pub fn intact(&self) -> bool {
        self.problems.is_empty()
    }

    /// Every task a problem touches.
    pub fn affected(&self) -> BTreeSet<String> {
        self.problems
            .iter()
            .flat_map(|p| p.tasks.iter().cloned())
            .collect()
    }

    /// The findings, one per line (what `agen hub verify` prints).
    pub fn render(&self) -> String {
        let mut out = String::new();
        let verdict = if self.intact() { "intact" } else { "DAMAGED" };
        out.push_str(&format!(
            "store {}: {verdict} ({} records in {FILE_NAME}, {} tasks)\n",
            self.dir.display(),
            self.records,
            self.tasks
        ));
        for p in &self.problems {
            let at = p
                .offset
                .map(|o| format!(" at byte {o}"))
                .unwrap_or_default();
            out.push_str(&format!("damaged: {}{at}: {}\n", p.file.display(), p.what));
            if !p.tasks.is_empty() {
                out.push_str(&format!(
                    "  tasks touched ({}): {}\n",
                    p.tasks.len(),
                    list(&p.tasks)
                ));
            }
        }
        for n in &self.notes {
            out.push_str(&format!("note: {n}\n"));
        }
        out
    }

    /// Why the Hub does not start, and what to do (the error `agen hub` exits 65 with).
    pub fn refusal(&self) -> String {
        let data_dir = self.dir.parent().unwrap_or(&self.dir).display().to_string();
        let problems: Vec<String> = self
            .problems
            .iter()
            .map(|p| {
                let at = p
                    .offset
                    .map(|o| format!(" at byte {o}"))
                    .unwrap_or_default();
                let tasks = if p.tasks.is_empty() {
                    String::new()
                } else {
                    format!(" (tasks touched: {})", list(&p.tasks))
                };
                format!("{}{at}: {}{tasks}", p.file.display(), p.what)
            })
            .collect();
        format!(
            "the hub store in {} lost data it had acknowledged, so the Hub does not serve it: {}. \
             Keep a copy of {data_dir} first; then restore the latest snapshot (agen hub restore FILE --data-dir {data_dir}), \
             or run `agen hub repair --data-dir {data_dir}` to keep every intact record and end the {} touched tasks failed (history_lost); \
             `agen hub verify --data-dir {data_dir}` shows this again",
            self.dir.display(),
            problems.join("; "),
            self.affected().len()
        )
    }
}

fn list(ids: &BTreeSet<String>) -> String {
    const SHOWN: usize = 20;
    let mut s: Vec<&str> = ids.iter().take(SHOWN).map(String::as_str).collect();
    let more = ids.len().saturating_sub(SHOWN);
    let tail = format!("and {more} more");
    if more > 0 {
        s.push(&tail);
    }
    s.join(", ")
}

/// Compares the event log (`None`: the file is missing) with sled; `dir` is the store's folder.
/// `per_task`: compare each task's events too.
pub(super) fn assess(
    dir: &Path,
    log: Option<(&EventLog, &Findings)>,
    sled: &SledView,
    per_task: bool,
) -> Report {
    let log_path = log.map_or_else(|| dir.join(FILE_NAME), |(_, f)| f.path.clone());
    let mut report = Report {
        dir: dir.to_path_buf(),
        tasks: sled.tasks.len() as u64,
        ..Report::default()
    };
    let known: BTreeMap<&str, &TaskBrief> =
        sled.tasks.iter().map(|t| (t.task_id.as_str(), t)).collect();
    let by_run: BTreeMap<&str, &str> = sled
        .tasks
        .iter()
        .filter(|t| !t.run_id.is_empty())
        .map(|t| (t.run_id.as_str(), t.task_id.as_str()))
        .collect();
    let in_flight: BTreeSet<String> = sled
        .tasks
        .iter()
        .filter(|t| t.in_flight())
        .map(|t| t.task_id.clone())
        .collect();
    let Some((log, found)) = log else {
        if sled.flushes > 0 || sled.tasks.iter().any(|t| t.next_event_seq > 1) {
            report.problems.push(Problem {
                file: log_path,
                offset: None,
                what: format!(
                    "the file is missing, but sled made {} flushes with it and knows {} tasks with events (it was deleted or lost)",
                    sled.flushes,
                    sled.tasks.iter().filter(|t| t.next_event_seq > 1).count()
                ),
                tasks: sled
                    .tasks
                    .iter()
                    .filter(|t| t.next_event_seq > 1 || t.in_flight())
                    .map(|t| t.task_id.clone())
                    .collect(),
            });
        }
        return report;
    };
    report.records = found.records;
    let counts = log.task_event_counts();
    let orphans: BTreeSet<String> = counts
        .keys()
        .filter(|id| !known.contains_key(id.as_str()))
        .cloned()
        .collect();

    if found.header_damaged {
        report.problems.push(Problem {
            file: log_path.clone(),
            offset: Some(0),
            what: "the header fails its checksum: how far the file was synced is unknown, so a cut tail cannot be told from a torn one".into(),
            tasks: in_flight.clone(),
        });
    }
    for r in &found.damaged {
        let tasks = r
            .ids
            .iter()
            .filter_map(|id| {
                if id.starts_with("run-") {
                    by_run.get(id.as_str()).map(|t| t.to_string())
                } else {
                    Some(id.clone())
                }
            })
            .collect();
        report.problems.push(Problem {
            file: log_path.clone(),
            offset: Some(r.offset),
            what: format!(
                "{} bytes hold no whole record (a record fails its checksum or its length), before the synced length or followed by whole records: not a torn tail",
                r.len
            ),
            tasks,
        });
    }
    if let Some(synced) = found.short_of {
        report.problems.push(Problem {
            file: log_path.clone(),
            offset: Some(found.len),
            what: format!(
                "the file is {} bytes, {} fewer than the {synced} it had when last synced (its tail was cut off); every task in flight may have had events there",
                found.len,
                synced - found.len
            ),
            tasks: in_flight.clone(),
        });
    }
    if let Some(tail) = &found.torn_tail {
        report.notes.push(format!(
            "{} ends in {} bytes past its last sync that hold no whole record, a torn tail (a crash while it was written): opening cuts them off",
            log_path.display(),
            tail.len
        ));
    }
    let log_flushes = found.header.map_or(0, |h| h.sled_flushes);
    if !sled.existed && found.records > 0 {
        report.problems.push(Problem {
            file: dir.join("db"),
            offset: None,
            what: format!(
                "sled's files were missing while {FILE_NAME} holds {} records (they were deleted or lost)",
                found.records
            ),
            tasks: counts.keys().cloned().collect(),
        });
    } else if log_flushes > sled.flushes {
        report.problems.push(Problem {
            file: dir.join("db"),
            offset: None,
            what: format!(
                "sled has made {} flushes durable, but {FILE_NAME} saw it make {log_flushes}: sled lost writes (its files were cut or replaced)",
                sled.flushes
            ),
            tasks: orphans.union(&in_flight).cloned().collect(),
        });
    }
    let mut short = Vec::new();
    let mut touched = BTreeSet::new();
    for t in sled.tasks.iter().filter(|t| per_task && !t.history_lost()) {
        let (count, max) = counts.get(&t.task_id).copied().unwrap_or((0, 0));
        let expected = t.next_event_seq.saturating_sub(1);
        if max < expected || count < max {
            short.push(format!(
                "{} (sled counts {expected} events, the log holds {count} up to seq {max})",
                t.task_id
            ));
            touched.insert(t.task_id.clone());
        }
    }
    if !short.is_empty() {
        let shown: Vec<&str> = short.iter().take(10).map(String::as_str).collect();
        report.problems.push(Problem {
            file: log_path.clone(),
            offset: None,
            what: format!(
                "{} tasks miss acknowledged events: {}{}",
                short.len(),
                shown.join(", "),
                if short.len() > 10 { ", …" } else { "" }
            ),
            tasks: touched,
        });
    }
    if !orphans.is_empty() {
        report.notes.push(format!(
            "{} tasks have events in {FILE_NAME} but no record in sled (submits a crash cut before they were acknowledged, or retention leftovers): ignored",
            orphans.len()
        ));
    }
    report
}

/// Checks the store of a stopped Hub in `data_dir` from its files, changing nothing: the event
/// log is read in place, sled from a copy of its files (opening sled writes).
pub fn verify_stopped(data_dir: &Path) -> Result<Report> {
    let dir = data_dir.join("db");
    let open_err = |reason: String| StoreError::Open {
        path: dir.display().to_string(),
        reason,
    };
    if !dir.is_dir() {
        return Err(open_err(
            "no store here: check --data-dir (the Hub's data dir holds db/)".into(),
        ));
    }
    refuse_if_running(&dir)?;
    let existed = sled_files_exist(&dir);
    let copy = tempfile::tempdir().map_err(|e| open_err(format!("cannot make a temp dir: {e}")))?;
    let sled_copy = copy.path().join("db");
    copy_sled_files(&dir, &sled_copy)
        .map_err(|e| open_err(format!("cannot copy sled's files to read them: {e}")))?;
    let db = sled::Config::new()
        .path(&sled_copy)
        .open()
        .map_err(|e| open_err(format!("sled cannot open its files: {e}")))?;
    let sled = SledView::read(&db, existed).map_err(open_err)?;
    drop(db);
    let log = match EventLog::open_unchecked(&dir, Access::Read) {
        Ok(opened) => Some(opened),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => None,
        Err(e) => return Err(open_err(format!("cannot read {FILE_NAME}: {e}"))),
    };
    Ok(assess(&dir, log.as_ref().map(|(l, f)| (l, f)), &sled, true))
}

/// Fails when a running Hub holds sled's lock on `dir`.
fn refuse_if_running(dir: &Path) -> Result<()> {
    let file = match std::fs::File::open(dir.join("db")) {
        Ok(f) => f,
        Err(_) => return Ok(()),
    };
    match file.try_lock() {
        Ok(()) => {
            let _ = file.unlock();
            Ok(())
        }
        Err(std::fs::TryLockError::WouldBlock) => Err(StoreError::Held(dir.display().to_string())),
        Err(std::fs::TryLockError::Error(e)) => Err(StoreError::Open {
            path: dir.display().to_string(),
            reason: format!("cannot check whether a Hub holds the store: {e}"),
        }),
    }
}

/// Copies sled's files (everything in `from` but the event log) into `to`.
fn copy_sled_files(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let name = entry.file_name();
        if name.to_string_lossy().starts_with(FILE_NAME) {
            continue;
        }
        let target = to.join(&name);
        if entry.file_type()?.is_dir() {
            copy_sled_files(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), target)?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "integrity_tests.rs"]
mod tests;
