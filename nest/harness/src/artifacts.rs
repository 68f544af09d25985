//! Artifacts as the harness sees them: the `save_artifact` / `read_artifact` built-ins work on
//! an [`ArtifactStore`], the one seam where a fleet instance (its Nest relays to the Hub, see
//! `agen_nest::instance`) and `agen run` ([`LocalArtifacts`], files next to the run log) differ.
//! [`MemoryArtifacts`] is the default for embedded use and tests.
//!
//! Invariants: an artifact's id is `sha256:<hex>` of its bytes, so the same bytes in the same
//! namespace are one artifact and saving them again is free (no new bytes, no quota spent);
//! no store accepts more than [`MAX_ARTIFACT_BYTES`] per artifact or lets a namespace pass
//! [`MAX_NAMESPACE_BYTES`]; an id is checked before it becomes a file name; `read_artifact`
//! pages by characters, never splitting one, and always says the next offset when more follows.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Mutex;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::model::Message;

/// At most this many bytes per artifact (25 MB).
pub const MAX_ARTIFACT_BYTES: u64 = 25 * 1000 * 1000;
/// At most this many bytes of artifacts per namespace (500 MB).
pub const MAX_NAMESPACE_BYTES: u64 = 500 * 1000 * 1000;
/// `read_artifact` returns this many characters when no `length` is given.
pub const READ_DEFAULT_CHARS: usize = 4000;
/// The longest page `read_artifact` returns, whatever `length` asks.
pub const READ_MAX_CHARS: usize = 100_000;
/// The media type of an artifact saved without one.
pub const DEFAULT_MEDIA_TYPE: &str = "text/plain; charset=utf-8";
/// A `save_artifact` content longer than this is kept in run logs and conversation histories
/// by its id only (see [`elide_saved_content`]).
pub const INLINE_CONTENT_BYTES: usize = 32 * 1024;

/// A copy of one assistant message with the long
/// `content` of each `save_artifact` call by `content_artifact` (its id) and `content_bytes`,
/// so run events and conversation histories never carry a big artifact twice (the Nest
/// stream and the Hub's messages stay small). `save_artifact` called with such arguments (a
/// resumed run) finds the artifact by that id.
pub fn elide_saved_content(message: &Message) -> Message {
    let Message::Assistant {
        content,
        tool_calls,
    } = message
    else {
        return message.clone();
    };
    let mut calls = tool_calls.clone();
    for call in &mut calls {
        if call.name != "save_artifact" {
            continue;
        }
        let Some(args) = call.arguments.as_object_mut() else {
            continue;
        };
        let long = match args.get("content") {
            Some(serde_json::Value::String(s)) if s.len() > INLINE_CONTENT_BYTES => s.clone(),
            _ => continue,
        };
        args.remove("content");
        args.insert(
            "content_artifact".into(),
            artifact_id(long.as_bytes()).into(),
        );
        args.insert("content_bytes".into(), long.len().into());
    }
    Message::Assistant {
        content: content.clone(),
        tool_calls: calls,
    }
}

/// What is known about a stored artifact.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ArtifactMeta {
    /// `sha256:<hex>` of the content.
    pub id: String,
    pub name: String,
    pub media_type: String,
    pub size: u64,
    /// The task that first saved it.
    pub task_id: String,
    pub created_at_ms: i64,
}

/// An artifact to save.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NewArtifact {
    pub namespace: String,
    pub task_id: String,
    pub run_id: String,
    pub name: String,
    pub media_type: String,
    pub content: Vec<u8>,
}

/// Why an artifact could not be saved or read. The messages are for the model: they say what
/// to do instead.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ArtifactError {
    #[error("artifact {name} is {size} bytes, more than the limit of 25 MB per artifact; save it in smaller parts or save a summary")]
    TooLarge { name: String, size: u64 },
    #[error("namespace {namespace} already holds {used} bytes of artifacts; {size} more would pass the limit of 500 MB per namespace; save less or ask an operator to clean up")]
    QuotaExceeded {
        namespace: String,
        used: u64,
        size: u64,
    },
    #[error("artifact {0} not found in this namespace; use an id that save_artifact returned")]
    NotFound(String),
    #[error("artifact id {0:?} is not valid: expected sha256:<64 lowercase hex digits>, as save_artifact returns")]
    BadId(String),
    #[error("{0}")]
    Invalid(String),
    #[error("artifact store unavailable: {0}")]
    Unavailable(String),
}

/// Where a harness keeps artifacts (see the module doc).
#[async_trait::async_trait]
pub trait ArtifactStore: Send + Sync {
    /// Stores `artifact` (or finds the same bytes already stored in its namespace) and
    /// returns its metadata.
    async fn save(&self, artifact: NewArtifact) -> Result<ArtifactMeta, ArtifactError>;
    /// The bytes of artifact `id` in `namespace`.
    async fn read(&self, namespace: &str, id: &str) -> Result<Vec<u8>, ArtifactError>;
}

/// `sha256:<hex>` of `bytes`.
pub fn artifact_id(bytes: &[u8]) -> String {
    format!("sha256:{}", hex::encode(Sha256::digest(bytes)))
}

/// The hex part of a well-formed artifact id (safe as a file name).
pub fn id_hex(id: &str) -> Result<&str, ArtifactError> {
    let hex = id
        .strip_prefix("sha256:")
        .ok_or_else(|| ArtifactError::BadId(id.to_string()))?;
    if hex.len() == 64
        && hex
            .bytes()
            .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    {
        Ok(hex)
    } else {
        Err(ArtifactError::BadId(id.to_string()))
    }
}

/// Checks the per-artifact limit.
pub fn check_size(name: &str, size: u64) -> Result<(), ArtifactError> {
    if size > MAX_ARTIFACT_BYTES {
        return Err(ArtifactError::TooLarge {
            name: name.to_string(),
            size,
        });
    }
    Ok(())
}

/// Checks the per-namespace limit before adding `size` new bytes to `used`.
pub fn check_quota(namespace: &str, used: u64, size: u64) -> Result<(), ArtifactError> {
    if used.saturating_add(size) > MAX_NAMESPACE_BYTES {
        return Err(ArtifactError::QuotaExceeded {
            namespace: namespace.to_string(),
            used,
            size,
        });
    }
    Ok(())
}

/// One page of `text` for `read_artifact`: `length` characters (default
/// [`READ_DEFAULT_CHARS`], at most [`READ_MAX_CHARS`]) from character `offset`, followed by
/// a line saying where the page ends and the next offset when more follows.
pub fn page(id: &str, text: &str, offset: usize, length: Option<usize>) -> String {
    let length = length
        .unwrap_or(READ_DEFAULT_CHARS)
        .clamp(1, READ_MAX_CHARS);
    let total = text.chars().count();
    if offset == 0 && total <= length {
        return text.to_string();
    }
    if offset >= total {
        return format!("[artifact {id} has {total} characters; offset {offset} is past its end]");
    }
    let body: String = text.chars().skip(offset).take(length).collect();
    let end = offset + body.chars().count();
    if end < total {
        format!("{body}\n[characters {offset}..{end} of {total}; more follows: call read_artifact with offset {end}]")
    } else {
        format!("{body}\n[characters {offset}..{end} of {total}; end of artifact]")
    }
}

/// Now, in unix milliseconds (also the clock of a suspended run's wall-clock deadline).
pub(crate) fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

fn meta_for(a: &NewArtifact, id: String) -> ArtifactMeta {
    ArtifactMeta {
        id,
        name: a.name.clone(),
        media_type: a.media_type.clone(),
        size: a.content.len() as u64,
        task_id: a.task_id.clone(),
        created_at_ms: now_ms(),
    }
}

/// One namespace's artifacts in memory, by id.
type Namespace = HashMap<String, (ArtifactMeta, Vec<u8>)>;

/// Artifacts in memory (embedded use and tests), with the same limits as the real stores.
#[derive(Default)]
pub struct MemoryArtifacts {
    by_namespace: Mutex<HashMap<String, Namespace>>,
}

#[async_trait::async_trait]
impl ArtifactStore for MemoryArtifacts {
    async fn save(&self, a: NewArtifact) -> Result<ArtifactMeta, ArtifactError> {
        check_size(&a.name, a.content.len() as u64)?;
        let id = artifact_id(&a.content);
        let mut all = self.by_namespace.lock().unwrap_or_else(|p| p.into_inner());
        let ns = all.entry(a.namespace.clone()).or_default();
        if let Some((meta, _)) = ns.get(&id) {
            return Ok(meta.clone());
        }
        let used = ns.values().map(|(m, _)| m.size).sum();
        check_quota(&a.namespace, used, a.content.len() as u64)?;
        let meta = meta_for(&a, id.clone());
        ns.insert(id, (meta.clone(), a.content));
        Ok(meta)
    }

    async fn read(&self, namespace: &str, id: &str) -> Result<Vec<u8>, ArtifactError> {
        id_hex(id)?;
        let all = self.by_namespace.lock().unwrap_or_else(|p| p.into_inner());
        all.get(namespace)
            .and_then(|ns| ns.get(id))
            .map(|(_, bytes)| bytes.clone())
            .ok_or_else(|| ArtifactError::NotFound(id.to_string()))
    }
}

/// Artifacts in files for `agen run`: `<dir>/<namespace>/<hex>` holds the bytes and
/// `<hex>.json` the [`ArtifactMeta`] (default dir: [`default_dir`]).
pub struct LocalArtifacts {
    dir: PathBuf,
    lock: tokio::sync::Mutex<()>,
}

/// `$XDG_STATE_HOME/agen/artifacts`, else `~/.local/state/agen/artifacts` (beside the run logs).
pub fn default_dir() -> PathBuf {
    crate::run_log::runs_dir()
        .parent()
        .map(|p| p.join("artifacts"))
        .unwrap_or_else(|| std::env::temp_dir().join("agen/artifacts"))
}

impl LocalArtifacts {
    pub fn new(dir: impl Into<PathBuf>) -> LocalArtifacts {
        LocalArtifacts {
            dir: dir.into(),
            lock: tokio::sync::Mutex::new(()),
        }
    }

    /// The folder of one namespace (where `agen run` says its artifacts are).
    pub fn namespace_dir(&self, namespace: &str) -> PathBuf {
        // Namespace names are [a-z0-9-]; anything else is made safe for a path.
        let safe: String = namespace
            .chars()
            .map(|c| {
                if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
                    c
                } else {
                    '_'
                }
            })
            .collect();
        self.dir.join(if safe.is_empty() {
            "default".into()
        } else {
            safe
        })
    }

    pub fn meta(&self, namespace: &str, id: &str) -> Result<Option<ArtifactMeta>, ArtifactError> {
        let path = self
            .namespace_dir(namespace)
            .join(format!("{}.json", id_hex(id)?));
        match std::fs::read(&path) {
            Ok(bytes) => serde_json::from_slice(&bytes)
                .map(Some)
                .map_err(|e| ArtifactError::Unavailable(format!("{}: {e}", path.display()))),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
            Err(e) => Err(io_err(&path, e)),
        }
    }

    fn used(&self, dir: &Path) -> Result<u64, ArtifactError> {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(io_err(dir, e)),
        };
        let mut used = 0;
        for entry in entries.flatten() {
            let name = entry.file_name();
            let name = name.to_string_lossy();
            if !name.ends_with(".json") && !name.starts_with('.') {
                used += entry.metadata().map(|m| m.len()).unwrap_or(0);
            }
        }
        Ok(used)
    }
}

fn io_err(path: &Path, e: std::io::Error) -> ArtifactError {
    ArtifactError::Unavailable(format!("{}: {e}", path.display()))
}

#[async_trait::async_trait]
impl ArtifactStore for LocalArtifacts {
    async fn save(&self, a: NewArtifact) -> Result<ArtifactMeta, ArtifactError> {
        check_size(&a.name, a.content.len() as u64)?;
        let id = artifact_id(&a.content);
        let _guard = self.lock.lock().await;
        if let Some(meta) = self.meta(&a.namespace, &id)? {
            return Ok(meta);
        }
        let dir = self.namespace_dir(&a.namespace);
        std::fs::create_dir_all(&dir).map_err(|e| io_err(&dir, e))?;
        check_quota(&a.namespace, self.used(&dir)?, a.content.len() as u64)?;
        let hex = id_hex(&id)?.to_string();
        let meta = meta_for(&a, id);
        // Bytes first, then the metadata (which makes the artifact exist), each renamed into
        // place so a crash never leaves a half-written artifact.
        let write = |name: String, bytes: &[u8]| -> Result<(), ArtifactError> {
            let tmp = dir.join(format!(".{name}.tmp"));
            std::fs::write(&tmp, bytes).map_err(|e| io_err(&tmp, e))?;
            let path = dir.join(&name);
            std::fs::rename(&tmp, &path).map_err(|e| io_err(&path, e))
        };
        write(hex.clone(), &a.content)?;
        let json = serde_json::to_vec_pretty(&meta)
            .map_err(|e| ArtifactError::Unavailable(e.to_string()))?;
        write(format!("{hex}.json"), &json)?;
        Ok(meta)
    }

    async fn read(&self, namespace: &str, id: &str) -> Result<Vec<u8>, ArtifactError> {
        let path = self.namespace_dir(namespace).join(id_hex(id)?);
        match std::fs::read(&path) {
            Ok(bytes) => Ok(bytes),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                Err(ArtifactError::NotFound(id.to_string()))
            }
            Err(e) => Err(io_err(&path, e)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use pretty_assertions::assert_eq;

    fn new(ns: &str, content: &[u8]) -> NewArtifact {
        NewArtifact {
            namespace: ns.into(),
            task_id: "t1".into(),
            run_id: "r1".into(),
            name: "report".into(),
            media_type: DEFAULT_MEDIA_TYPE.into(),
            content: content.to_vec(),
        }
    }

    #[test]
    fn pages_say_where_they_end_and_the_next_offset() {
        fn check(text: &str, offset: usize, length: Option<usize>, expected: &str) {
            assert_eq!(page("sha256:x", text, offset, length), expected);
        }
        check("short", 0, None, "short");
        check(
            "abcdef",
            0,
            Some(4),
            "abcd\n[characters 0..4 of 6; more follows: call read_artifact with offset 4]",
        );
        check(
            "abcdef",
            4,
            Some(4),
            "ef\n[characters 4..6 of 6; end of artifact]",
        );
        // Characters, not bytes: a multi-byte character is never split.
        check(
            "héllo wörld",
            1,
            Some(3),
            "éll\n[characters 1..4 of 11; more follows: call read_artifact with offset 4]",
        );
        check(
            "abc",
            9,
            None,
            "[artifact sha256:x has 3 characters; offset 9 is past its end]",
        );
    }

    #[test]
    fn long_saved_content_is_kept_by_id_in_logs_and_histories() {
        let long = "x".repeat(INLINE_CONTENT_BYTES + 1);
        let m: Message = serde_json::from_value(serde_json::json!({"role": "assistant", "content": "", "tool_calls": [
            {"id": "c1", "name": "save_artifact", "arguments": {"name": "big", "content": long}},
            {"id": "c2", "name": "save_artifact", "arguments": {"name": "small", "content": "short"}},
            {"id": "c3", "name": "other_tool", "arguments": {"content": long}}
        ]}))
        .unwrap();
        let m = elide_saved_content(&m).to_json();
        assert_eq!(
            m["tool_calls"],
            serde_json::json!([
                {"id": "c1", "name": "save_artifact", "arguments": {"name": "big", "content_artifact": artifact_id(long.as_bytes()), "content_bytes": long.len()}},
                {"id": "c2", "name": "save_artifact", "arguments": {"name": "small", "content": "short"}},
                {"id": "c3", "name": "other_tool", "arguments": {"content": long}}
            ])
        );
    }

    #[test]
    fn ids_are_checked_before_use() {
        let good = artifact_id(b"x");
        assert!(id_hex(&good).is_ok());
        for bad in [
            "",
            "sha256:",
            "md5:00",
            "sha256:../../etc/passwd",
            &good.to_uppercase(),
        ] {
            assert_eq!(
                id_hex(bad).map(str::to_string),
                Err(ArtifactError::BadId(bad.to_string())),
                "{bad}"
            );
        }
    }

    #[tokio::test]
    async fn local_store_keeps_one_copy_of_the_same_bytes_per_namespace() {
        let dir = tempfile::tempdir().expect("tempdir");
        let store = LocalArtifacts::new(dir.path());
        let a = store.save(new("ns", b"hello")).await.expect("save");
        assert_eq!(a.id, artifact_id(b"hello"));
        let again = store.save(new("ns", b"hello")).await.expect("save again");
        assert_eq!(again, a);
        assert_eq!(store.read("ns", &a.id).await.expect("read"), b"hello");
        assert_eq!(
            store.read("other", &a.id).await,
            Err(ArtifactError::NotFound(a.id.clone()))
        );
        let files = std::fs::read_dir(store.namespace_dir("ns"))
            .expect("dir")
            .count();
        assert_eq!(files, 2, "one blob and its metadata");
    }

    #[tokio::test]
    async fn limits_are_enforced_with_errors_that_say_what_to_do() {
        let store = MemoryArtifacts::default();
        let big = vec![b'x'; MAX_ARTIFACT_BYTES as usize + 1];
        let err = store.save(new("ns", &big)).await.expect_err("too large");
        assert!(err.to_string().contains("25 MB per artifact"), "{err}");
        assert_eq!(
            check_quota("ns", MAX_NAMESPACE_BYTES - 10, 11),
            Err(ArtifactError::QuotaExceeded {
                namespace: "ns".into(),
                used: MAX_NAMESPACE_BYTES - 10,
                size: 11
            })
        );
        assert!(check_quota("ns", MAX_NAMESPACE_BYTES - 10, 10).is_ok());
    }
}
