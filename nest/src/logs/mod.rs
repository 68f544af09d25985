//! The Nest's log files: each instance's stderr and each of its tool servers' stderr, kept in
//! bounded, rotated files under `<data-dir>/logs/<instance>/` (`instance.log`,
//! `server.<name>.log`, each with one older `.1`), one JSON [`StoredLine`] per line, with the
//! instance's namespace and deployment in `owner.json` ([`LogOwner`]); served to the Hub's
//! `ReadLogs` through `NestService.SendLogs` ([`serve`]), never the Connect stream, also after
//! the Hub forgot the instance (removed, replaced) but only to readers of its namespace.
//!
//! Invariants: every line is redacted of the instance's secret values before it is written
//! (tool-server lines were already redacted by the instance; the Nest redacts again); files
//! are 0600 and folders 0700, created that way; one source never takes more than
//! `2 × MAX_FILE_BYTES` on disk, and at most `MAX_INSTANCE_DIRS` instances' logs are kept.

mod lines;
pub mod serve;

use std::collections::HashMap;
use std::fs::{File, OpenOptions};
use std::io::{BufRead, BufReader, Seek, SeekFrom, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use agen_harness::redact::Redactor;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

pub use lines::{parse_instance_line, InstanceLine};

/// A log file is rotated (to `.1`, replacing the older one) when it passes this size.
pub const MAX_FILE_BYTES: u64 = 1024 * 1024;
/// One stored line's text is cut to this many bytes.
pub const MAX_LINE_BYTES: usize = 8 * 1024;
/// Instance log folders kept (the oldest are removed when a new instance starts).
pub const MAX_INSTANCE_DIRS: usize = 64;

/// One line as stored.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct StoredLine {
    pub at_ms: i64,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub level: String,
    pub text: String,
}

/// Whose logs a folder holds, written when the instance starts (`owner.json`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LogOwner {
    pub namespace: String,
    pub deployment: String,
}

const OWNER_FILE: &str = "owner.json";

/// Which stream of an instance.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum Source {
    Instance,
    Server(String),
}

impl Source {
    fn file_name(&self) -> String {
        match self {
            Source::Instance => "instance.log".into(),
            Source::Server(name) => format!("server.{}.log", safe_name(name)),
        }
    }
}

/// Every instance's logs on this Nest. Cheap to clone.
#[derive(Clone)]
pub struct LogStore {
    root: PathBuf,
    inner: Arc<Mutex<Open>>,
    /// Bumped on every write: followers wake and read what is new.
    written: Arc<watch::Sender<u64>>,
}

#[derive(Default)]
struct Open {
    files: HashMap<(String, Source), (File, u64)>,
    redactors: HashMap<String, Redactor>,
}

impl LogStore {
    /// The store under `root` (`<data-dir>/logs`; folders are created 0700 when an instance
    /// starts).
    pub fn new(root: PathBuf) -> LogStore {
        LogStore {
            root,
            inner: Arc::new(Mutex::new(Open::default())),
            written: Arc::new(watch::channel(0).0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Open> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn dir(&self, instance: &str) -> PathBuf {
        self.root.join(safe_name(instance))
    }

    /// Starts (or restarts) an instance's logs: its owner recorded, its secrets for
    /// redaction, and room made by removing the oldest folders beyond [`MAX_INSTANCE_DIRS`].
    pub fn start_instance(&self, instance: &str, owner: &LogOwner, redactor: Redactor) {
        let dir = self.dir(instance);
        if let Err(e) = agen_shared::private::create_dir_all(&dir) {
            tracing::warn!(instance = %instance, "cannot create the log folder {}: {e}", dir.display());
        }
        let file = dir.join(OWNER_FILE);
        match serde_json::to_vec(owner) {
            // No placement known (the instance is going): nothing to record, nothing claimed.
            _ if owner.namespace.is_empty() => {}
            Ok(json) => {
                if let Err(e) = agen_shared::tls::write_private(&file, &json) {
                    tracing::warn!(instance = %instance, "cannot record the owner of its logs in {}: {e}; they are served only while the Hub lists the instance", file.display());
                }
            }
            Err(e) => {
                tracing::warn!(instance = %instance, "cannot encode the owner of its logs: {e}")
            }
        }
        self.lock().redactors.insert(instance.to_string(), redactor);
        self.prune(&dir);
    }

    fn prune(&self, keep: &Path) {
        let Ok(entries) = std::fs::read_dir(&self.root) else {
            return;
        };
        let mut dirs: Vec<(std::time::SystemTime, PathBuf)> = entries
            .flatten()
            .filter(|e| e.path() != keep)
            .filter_map(|e| Some((e.metadata().ok()?.modified().ok()?, e.path())))
            .collect();
        if dirs.len() < MAX_INSTANCE_DIRS {
            return;
        }
        dirs.sort();
        let extra = dirs.len() + 1 - MAX_INSTANCE_DIRS;
        for (_, path) in dirs.into_iter().take(extra) {
            let _ = std::fs::remove_dir_all(path);
        }
    }

    /// Appends one line (redacted, cut, rotated when the file is full). Logged, never fatal.
    pub fn append(&self, instance: &str, source: &Source, level: &str, text: &str) {
        let mut open = self.lock();
        let text = match open.redactors.get(instance) {
            Some(r) if !r.is_empty() => r.redact(text),
            _ => text.to_string(),
        };
        let line = StoredLine {
            at_ms: chrono::Utc::now().timestamp_millis(),
            level: level.to_string(),
            text: cut(&text, MAX_LINE_BYTES),
        };
        let Ok(mut json) = serde_json::to_string(&line) else {
            return;
        };
        json.push('\n');
        let key = (instance.to_string(), source.clone());
        let path = self.dir(instance).join(source.file_name());
        if let Err(e) = write_rotating(&mut open.files, key, &path, json.as_bytes()) {
            tracing::debug!(instance = %instance, "cannot write {}: {e}", path.display());
            return;
        }
        drop(open);
        self.written.send_modify(|n| *n += 1);
    }

    /// Forgets an instance's open files (its logs stay on disk).
    pub fn close_instance(&self, instance: &str) {
        let mut open = self.lock();
        open.files.retain(|(i, _), _| i != instance);
        open.redactors.remove(instance);
    }

    /// The file of `source` of `instance`, if any line was ever kept there.
    pub fn path(&self, instance: &str, source: &Source) -> PathBuf {
        self.dir(instance).join(source.file_name())
    }

    /// Whether this Nest keeps logs of `instance`.
    pub fn knows(&self, instance: &str) -> bool {
        self.dir(instance).is_dir()
    }

    /// Whose logs the folder of `instance` holds (`None`: no folder, or kept before owners
    /// were recorded).
    pub fn owner(&self, instance: &str) -> Option<LogOwner> {
        let text = std::fs::read(self.dir(instance).join(OWNER_FILE)).ok()?;
        serde_json::from_slice(&text).ok()
    }

    /// Wakes on every write.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.written.subscribe()
    }
}

fn write_rotating(
    files: &mut HashMap<(String, Source), (File, u64)>,
    key: (String, Source),
    path: &Path,
    bytes: &[u8],
) -> std::io::Result<()> {
    if let Some((_, size)) = files.get(&key) {
        if *size + bytes.len() as u64 > MAX_FILE_BYTES {
            files.remove(&key);
            std::fs::rename(path, rotated(path))?;
        }
    }
    if !files.contains_key(&key) {
        let file = OpenOptions::new()
            .create(true)
            .append(true)
            .mode(0o600)
            .open(path)?;
        let size = file.metadata()?.len();
        files.insert(key.clone(), (file, size));
        if size + bytes.len() as u64 > MAX_FILE_BYTES && size > 0 {
            files.remove(&key);
            std::fs::rename(path, rotated(path))?;
            return write_rotating(files, key, path, bytes);
        }
    }
    let (file, size) = files.get_mut(&key).expect("the file was opened just above");
    file.write_all(bytes)?;
    *size += bytes.len() as u64;
    Ok(())
}

/// `x.log` → `x.log.1`.
pub fn rotated(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_owned();
    p.push(".1");
    PathBuf::from(p)
}

/// Reads the stored lines of one file from byte `from`; returns them and the offset after the
/// last whole line. A line that is not a [`StoredLine`] is kept as raw text.
pub fn read_from(path: &Path, from: u64) -> std::io::Result<(Vec<StoredLine>, u64)> {
    let mut file = match File::open(path) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok((Vec::new(), 0)),
        Err(e) => return Err(e),
    };
    file.seek(SeekFrom::Start(from))?;
    let mut reader = BufReader::new(file);
    let mut out = Vec::new();
    let mut offset = from;
    let mut buf = Vec::new();
    loop {
        buf.clear();
        let n = reader.read_until(b'\n', &mut buf)?;
        if n == 0 || buf.last() != Some(&b'\n') {
            break;
        }
        offset += n as u64;
        let text = String::from_utf8_lossy(&buf[..n - 1]);
        out.push(serde_json::from_str(&text).unwrap_or_else(|_| StoredLine {
            at_ms: 0,
            level: String::new(),
            text: text.into_owned(),
        }));
    }
    Ok((out, offset))
}

/// A name safe as one path component: `[A-Za-z0-9._-]` kept, anything else `%xx`; never
/// `.` or `..`.
pub fn safe_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for b in name.bytes() {
        if b.is_ascii_alphanumeric() || b == b'-' || b == b'_' || (b == b'.' && !out.is_empty()) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02x}"));
        }
    }
    if out.is_empty() {
        out.push_str("%00");
    }
    out
}

fn cut(text: &str, max: usize) -> String {
    if text.len() <= max {
        return text.to_string();
    }
    let mut end = max;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}…", &text[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_are_redacted_kept_private_and_rotated_within_the_bound() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = LogStore::new(dir.path().join("logs"));
        let owner = LogOwner {
            namespace: "team-a".into(),
            deployment: "crm-bot".into(),
        };
        store.start_instance("i-1", &owner, Redactor::new(["hunter2-secret"]));
        assert_eq!(store.owner("i-1"), Some(owner));
        assert_eq!(store.owner("i-2"), None);
        store.start_instance("i-3", &LogOwner::default(), Redactor::new(["x"]));
        assert_eq!(store.owner("i-3"), None, "an unknown owner is not recorded");
        let src = Source::Server("crm".into());
        store.append("i-1", &src, "INFO", "token hunter2-secret here");
        let path = store.path("i-1", &src);
        let (lines, _) = read_from(&path, 0).expect("read");
        assert_eq!(lines[0].text, "token [redacted] here");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).expect("meta").permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        let long = "x".repeat(4000);
        for _ in 0..700 {
            store.append("i-1", &src, "", &long);
        }
        let size = std::fs::metadata(&path).expect("meta").len();
        let old = std::fs::metadata(rotated(&path)).expect("meta").len();
        assert!(
            size <= MAX_FILE_BYTES && old <= MAX_FILE_BYTES,
            "{size} {old}"
        );
    }

    #[test]
    fn names_cannot_leave_their_folder() {
        assert_eq!(safe_name("../etc"), "%2e.%2fetc");
        assert_eq!(safe_name("crm-2.x"), "crm-2.x");
        assert_eq!(safe_name(""), "%00");
    }
}
