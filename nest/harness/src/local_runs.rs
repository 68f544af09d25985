//! The local run logs of `agen run` (`runs_dir()/<run id>/`, one [`SledRunLog`] each) as the
//! CLI shows them: `agen runs` lists them with their state, `agen trace --local RUN` reads one
//! with each event's time, `agen run --resume RUN` finds the bundle it ran.
//!
//! Invariant: reading never changes a log. A log whose lock is held belongs to an `agen run`
//! still going on and reads as [`LocalRunState::Running`], never as an error.

use std::path::{Path, PathBuf};

use anyhow::Context;

use crate::run::{RunAssignment, RunEventBody, RunState};
use crate::run_log::{runs_dir, LoggedRecord, RunOrigin, SledRunLog};

/// Where a local run stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LocalRunState {
    /// Its log ends with `run.finished`.
    Finished(RunState),
    /// An `agen run` holds its log open.
    Running,
    /// No end and nobody running it (a crash, a kill): `agen run --resume RUN` carries it on.
    Interrupted,
}

impl LocalRunState {
    pub fn as_str(self) -> &'static str {
        match self {
            LocalRunState::Finished(s) => s.as_str(),
            LocalRunState::Running => "running",
            LocalRunState::Interrupted => "interrupted",
        }
    }
}

/// One local run log, read.
#[derive(Debug, Clone)]
pub struct LocalRun {
    pub run_id: String,
    pub dir: PathBuf,
    pub state: LocalRunState,
    /// What the run was asked to do (`None` for a log kept before assignments were).
    pub assignment: Option<RunAssignment>,
    /// The bundle folder and `--model` of the `agen run` that started it.
    pub origin: Option<RunOrigin>,
    /// Every event with its attempt, seq and time (empty while it runs: its log is locked).
    pub records: Vec<LoggedRecord>,
}

impl LocalRun {
    /// The time of its first event, RFC 3339 (empty when it has none).
    pub fn started_at(&self) -> &str {
        self.records.first().map(|r| r.at.as_str()).unwrap_or("")
    }

    /// The highest attempt that wrote to it.
    pub fn attempts(&self) -> u32 {
        self.records.iter().map(|r| r.attempt).max().unwrap_or(0)
    }

    /// Its `run.finished` result text, when it finished.
    pub fn result(&self) -> Option<&str> {
        self.records.iter().rev().find_map(|r| match &r.body {
            RunEventBody::RunFinished(f) => Some(f.result.as_str()),
            _ => None,
        })
    }
}

/// A run id as a folder name: 1 to 128 of a-z, A-Z, 0-9, `-`, `_` (else an error saying so).
pub fn check_run_id(run_id: &str) -> Result<(), String> {
    let plain = !run_id.is_empty()
        && run_id.len() <= 128
        && run_id
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_');
    if plain {
        Ok(())
    } else {
        Err(format!(
            "run id `{}` is not valid; expected 1 to 128 of a-z, A-Z, 0-9, `-` and `_` (agen runs lists the runs)",
            run_id.escape_debug()
        ))
    }
}

/// Reads the log of `run_id` in `root` (`None`: there is no such run folder).
pub fn read(root: &Path, run_id: &str) -> anyhow::Result<Option<LocalRun>> {
    check_run_id(run_id).map_err(anyhow::Error::msg)?;
    let dir = root.join(run_id);
    if !dir.is_dir() {
        return Ok(None);
    }
    let logged = match SledRunLog::read_log(&dir) {
        Ok(l) => l,
        Err(e) if format!("{e:#}").contains("could not acquire lock") => {
            return Ok(Some(LocalRun {
                run_id: run_id.to_string(),
                dir,
                state: LocalRunState::Running,
                assignment: None,
                origin: None,
                records: Vec::new(),
            }))
        }
        Err(e) => return Err(e),
    };
    let state = logged
        .records
        .iter()
        .rev()
        .find_map(|r| match &r.body {
            RunEventBody::RunFinished(f) => Some(LocalRunState::Finished(f.state)),
            _ => None,
        })
        .unwrap_or(LocalRunState::Interrupted);
    Ok(Some(LocalRun {
        run_id: run_id.to_string(),
        dir,
        state,
        assignment: logged.assignment,
        origin: logged.origin,
        records: logged.records,
    }))
}

/// Every run log in `root`, oldest first (run ids are UUIDv7); a folder that cannot be read is
/// skipped with a warning on stderr naming it.
pub fn list(root: &Path) -> anyhow::Result<Vec<LocalRun>> {
    let entries = match std::fs::read_dir(root) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => {
            return Err(e)
                .with_context(|| format!("while listing the run logs in {}", root.display()))
        }
    };
    let mut ids: Vec<String> = entries
        .filter_map(|e| e.ok())
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().to_str().map(str::to_string))
        .filter(|n| check_run_id(n).is_ok())
        .collect();
    ids.sort();
    let mut out = Vec::new();
    for id in ids {
        match read(root, &id) {
            Ok(Some(r)) => out.push(r),
            Ok(None) => {}
            Err(e) => eprintln!("warning: run log {}: {e:#}", root.join(&id).display()),
        }
    }
    Ok(out)
}

/// The folder `agen run` keeps its run logs in ([`runs_dir`]).
pub fn default_root() -> PathBuf {
    runs_dir()
}
