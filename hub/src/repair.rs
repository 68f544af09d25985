//! `agen hub repair`: brings the store of a stopped Hub that lost acknowledged data back to a
//! state it can serve. Every whole record is kept (the event log is rewritten with them, the
//! damaged file kept beside it); the tasks a problem touches end `failed` with reason
//! `history_lost` (never resumed from a partial replay); a report file says what was found and
//! done. Above the store and the core: it opens the one and calls the other.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use crate::config::HubOptions;
use crate::error::{HubError, Result};
use crate::store::integrity::Report;
use crate::store::{Db, SledStore};

/// What a repair did.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Repaired {
    /// What the store held before.
    pub before: Report,
    /// Tasks ended `failed` (`history_lost`).
    pub failed: Vec<String>,
    /// Tasks a problem touched that sled has no record of (nothing to end: they are gone).
    pub lost: Vec<String>,
    /// Tasks kept as they were.
    pub kept: u64,
    /// The report file.
    pub report_file: PathBuf,
}

/// Repairs the store in `data_dir` (the Hub stopped); see the module doc.
pub async fn repair(data_dir: &Path) -> Result<Repaired> {
    let dir = data_dir.join("db");
    if !dir.is_dir() {
        return Err(HubError::Config(format!(
            "{}: no store here: check --data-dir (the Hub's data dir holds db/)",
            dir.display()
        )));
    }
    let (store, before) = SledStore::open_for_repair(&dir)?;
    let db = Db::new(Arc::new(store));
    let key = crate::secrets::SecretKey::load_or_create(&data_dir.join("secret.key"))?;
    let opts = HubOptions {
        data_dir: data_dir.to_path_buf(),
        ..HubOptions::default()
    };
    let core = crate::core::Core::open(opts, db.clone(), key)?;
    let touched: BTreeSet<String> = before.affected();
    let why = format!(
        "the hub store lost part of this task's history (agen hub repair at {}); submit it again",
        crate::model::now_ms()
    );
    let failed = core.fail_history_lost(&touched, &why).await?;
    let lost: Vec<String> = touched
        .iter()
        .filter(|id| !failed.contains(id))
        .cloned()
        .collect();
    db.flush().await?;
    let tasks_now = db
        .raw()
        .scan(crate::store::Table::Tasks, b"")
        .map(|t| t.len() as u64)?;
    db.close();
    let report_file = data_dir.join(format!("repair-{}.txt", crate::model::now_ms()));
    let repaired = Repaired {
        kept: tasks_now.saturating_sub(failed.len() as u64),
        before,
        failed,
        lost,
        report_file: report_file.clone(),
    };
    agen_shared::private::write_file(&report_file, render(&repaired).as_bytes())
        .map_err(HubError::io(&report_file, "cannot write the repair report"))?;
    Ok(repaired)
}

/// The report file's text.
pub fn render(r: &Repaired) -> String {
    let mut out = format!(
        "agen hub repair of {}\n\nfound:\n{}\ndone: {} tasks kept, {} ended failed (history_lost), {} touched but unknown to sled (lost)\n",
        r.before.dir.display(),
        r.before.render(),
        r.kept,
        r.failed.len(),
        r.lost.len()
    );
    for id in &r.failed {
        out.push_str(&format!("failed (history_lost): {id}\n"));
    }
    for id in &r.lost {
        out.push_str(&format!("lost: {id}\n"));
    }
    out
}
