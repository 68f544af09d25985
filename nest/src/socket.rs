//! The Nest⇄instance protocol over the Nest's Unix socket (`<data-dir>/nest.sock`, mode 0600, or
//! 0666 in the 0711 run root outside the data dir when instances run under their own uids):
//! newline-delimited JSON, one message per line.
//!
//! Bootstrap: the Nest starts `agen instance` with no arguments; the instance reads one
//! [`Bootstrap`] (socket path, instance id, bundle dir, per-spawn secret) from the inherited fd
//! named by [`BOOTSTRAP_FD_ENV`] (a pipe the Nest wrote and closed) and closes it, so none of these
//! is on a command line, in an environment, or inherited by tool servers.
//!
//! Conversation: the instance connects and sends [`ToNest::Hello`] with its id and its secret;
//! the Nest checks the secret together with the peer's `SO_PEERCRED` pid (the pid it spawned) and
//! that this is the first hello of that spawn, then answers [`ToInstance::Placement`] (namespace,
//! deployment, bundle, concurrency, resolved secrets) or [`ToInstance::Refused`]. Then the instance reports [`ToNest::Status`] on every change and
//! streams [`ToNest::Event`]s of its runs; the Nest sends [`ToInstance::Run`],
//! [`ToInstance::Cancel`] and [`ToInstance::Ack`].
//!
//! Invariants: this is the only channel an instance has: it never sees Hub credentials; secret
//! values travel only in `Placement` and are never logged (`Debug` redacts them, and the spawn
//! secret's too); a hello that fails the check never touches the live connection; a line longer
//! than [`MAX_LINE`] is a protocol error, not an allocation.

use std::collections::BTreeMap;
use std::path::Path;

use agen_contract::run::{wire, RunAssignment};
use futures::{SinkExt, StreamExt};
use serde::{Deserialize, Serialize};
use tokio::net::unix::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{UnixListener, UnixStream};
use tokio_util::codec::{FramedRead, FramedWrite, LinesCodec};

/// The longest line either side accepts (conversation histories can be large).
pub const MAX_LINE: usize = 64 * 1024 * 1024;

/// The variable naming the fd an instance reads its [`Bootstrap`] from (its value is only a
/// number: nothing secret).
pub const BOOTSTRAP_FD_ENV: &str = "AGEN_NEST_FD";
/// The fd number the Nest puts the bootstrap pipe on in the instance.
pub const BOOTSTRAP_FD: i32 = 3;
/// The longest bootstrap an instance reads.
pub const MAX_BOOTSTRAP: u64 = 64 * 1024;

/// A per-spawn secret. `Debug` never shows it; comparison takes the same time wherever the
/// first difference is.
#[derive(Clone, Serialize, Deserialize)]
#[serde(transparent)]
pub struct SpawnSecret(String);

impl SpawnSecret {
    /// 32 random bytes, hex.
    pub fn generate() -> SpawnSecret {
        use rand::RngCore;
        let mut bytes = [0u8; 32];
        rand::rngs::OsRng.fill_bytes(&mut bytes);
        SpawnSecret(hex::encode(bytes))
    }

    /// Constant-time equality (lengths are public: every secret has the same length).
    pub fn matches(&self, other: &SpawnSecret) -> bool {
        let (a, b) = (self.0.as_bytes(), other.0.as_bytes());
        a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
    }

    #[cfg(test)]
    pub fn from_test(s: &str) -> SpawnSecret {
        SpawnSecret(s.to_string())
    }
}

impl PartialEq for SpawnSecret {
    fn eq(&self, other: &Self) -> bool {
        self.matches(other)
    }
}

impl std::fmt::Debug for SpawnSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SpawnSecret(..)")
    }
}

/// What the Nest hands a freshly spawned instance through its bootstrap fd.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Bootstrap {
    pub socket: std::path::PathBuf,
    pub instance_id: String,
    pub bundle_dir: std::path::PathBuf,
    pub secret: SpawnSecret,
    /// Who each command server runs as (a uid of its own each); empty: as the instance.
    #[serde(default)]
    pub seats: std::collections::BTreeMap<String, agen_harness::mcp::ServerSeat>,
}

/// Instance → Nest.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum ToNest {
    /// The first message; `secret` is the spawn's [`Bootstrap::secret`].
    Hello {
        instance_id: String,
        pid: u32,
        secret: SpawnSecret,
    },
    Status(InstanceStatus),
    Event(RunEventMsg),
    /// A piece of a run's streamed model answer (not an event: never acked, see
    /// [`crate::model::RunDelta`]).
    Delta(crate::model::RunDelta),
    /// The run is over on this instance (after its final event was acked, or it was cancelled).
    RunDone {
        run_id: String,
        attempt: u32,
    },
    /// `save_artifact`: the Nest stores it at the Hub (`PutArtifact`, in the instance's
    /// namespace) and answers [`ToInstance::ArtifactReply`] with the same `req`.
    PutArtifact {
        req: u64,
        task_id: String,
        name: String,
        media_type: String,
        content: String,
    },
    /// `read_artifact`: the Nest reads it from the Hub (`ReadArtifact`, in the instance's
    /// namespace) and answers [`ToInstance::ArtifactReply`] with the content.
    ReadArtifact {
        req: u64,
        id: String,
    },
    /// A delegate call of one of the instance's runs (`call_agent` / `start_agent`): the
    /// Nest asks the Hub (`NestService/StartChild`, `WaitChild`, `CancelChild`) and answers
    /// [`ToInstance::ChildReply`] with the same `req`.
    Child(ChildCall),
}

/// One request about a run's child task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChildCall {
    pub req: u64,
    /// The parent run (it must be one the instance holds, at this attempt).
    pub task_id: String,
    pub run_id: String,
    pub attempt: u32,
    pub op: ChildOp,
}

/// What to do about the child.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub enum ChildOp {
    Start(agen_harness::run::ChildRequest),
    Wait {
        child_task_id: String,
        wait_ms: u64,
    },
    Cancel {
        child_task_id: String,
        reason: String,
    },
}

/// The answer to a [`ChildCall`]: the child's task id (`Start`), its end when it ended
/// (`Wait`), or what went wrong.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct ChildReply {
    pub req: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub task_id: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub end: Option<agen_harness::run::ChildEnd>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// Nest → instance.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case")]
// One `Run` per run, sent once: its size does not matter.
#[allow(clippy::large_enum_variant)]
pub enum ToInstance {
    Placement(Placement),
    Refused {
        reason: String,
    },
    Run(RunOrder),
    Cancel {
        run_id: String,
        reason: String,
    },
    /// Stop the run at its next safe point (never inside a tool call); it ends cancelled.
    Interrupt {
        run_id: String,
    },
    Ack {
        run_id: String,
        attempt: u32,
        acked_seq: u64,
        fenced: bool,
    },
    /// The answer to [`ToNest::PutArtifact`] (`artifact`) or [`ToNest::ReadArtifact`]
    /// (`content`), or what went wrong (`error`, for the model).
    ArtifactReply {
        req: u64,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        artifact: Option<agen_harness::artifacts::ArtifactMeta>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        content: Option<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        error: Option<String>,
    },
    ChildReply(ChildReply),
    /// The Hub's decision about an `ask` call of one of the instance's runs.
    ApprovalDecided {
        run_id: String,
        decided: agen_contract::run::ApprovalDecided,
    },
}

/// Lifecycle state as the instance sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum HostState {
    Starting,
    Running,
    Unhealthy,
}

/// The most MCP resources an instance reports (each report travels with every heartbeat).
pub const MAX_REPORTED_RESOURCES: usize = 100;

/// What an instance reports about itself.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct InstanceStatus {
    pub state: HostState,
    /// MCP tools only.
    pub tools_loaded: u32,
    /// `(server, reason)`.
    pub servers_not_connected: Vec<(String, String)>,
    /// `<server>.<tool>` names.
    pub tools: Vec<String>,
    /// The MCP resources its servers listed at their start (the first
    /// [`MAX_REPORTED_RESOURCES`]).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub resources: Vec<agen_harness::mcp::ResourceInfo>,
    /// Why it is in this state ("tool server time exited").
    pub message: String,
    pub active_runs: Vec<String>,
    /// Process ids (= process group ids) of the running command tool servers, by server, so
    /// the Nest can reap them if the instance dies without cleaning up.
    #[serde(default)]
    pub server_pids: BTreeMap<String, u32>,
}

/// Where and how an instance runs.
#[derive(Clone, PartialEq, Serialize, Deserialize)]
pub struct Placement {
    pub instance_id: String,
    pub namespace: String,
    pub deployment: String,
    pub bundle_digest: String,
    pub generation: u64,
    /// Runs at once (at least 1).
    pub concurrency: u32,
    /// Resolved secret values by name (`source: env` from the Nest's environment, `platform`
    /// from the Hub).
    pub secrets: BTreeMap<String, String>,
    /// Secrets the bundle uses that have no value, with why: the instance reports itself
    /// unhealthy naming them.
    pub missing_secrets: Vec<String>,
}

impl std::fmt::Debug for Placement {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Placement")
            .field("instance_id", &self.instance_id)
            .field("namespace", &self.namespace)
            .field("deployment", &self.deployment)
            .field("bundle_digest", &self.bundle_digest)
            .field("generation", &self.generation)
            .field("concurrency", &self.concurrency)
            .field("secrets", &self.secrets.keys().collect::<Vec<_>>())
            .field("missing_secrets", &self.missing_secrets)
            .finish()
    }
}

/// One run to execute (the Hub's assignment): the run, and the bundle version it must run on.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct RunOrder {
    pub bundle_digest: String,
    pub run: RunAssignment,
}

impl From<crate::model::AssignedRun> for RunOrder {
    fn from(a: crate::model::AssignedRun) -> Self {
        RunOrder {
            bundle_digest: a.bundle_digest,
            run: RunAssignment {
                run_id: a.run_id,
                attempt: a.attempt.0,
                task_id: a.task_id,
                namespace: a.namespace,
                deployment: a.deployment.0,
                input: a.input,
                labels: a.labels.into_iter().collect(),
                conversation_id: a.conversation_id,
                conversation_key: a.conversation_key,
                root_run_id: a.root_run_id,
                delegation_depth: a.delegation_depth,
                trace_id: a.trace_id,
                history: wire::history(&a.history_json),
                replay: wire::replay(&a.replay_json),
                tool_overrides: a.tool_overrides,
                max_tokens: (a.max_tokens > 0).then_some(a.max_tokens),
                // The Hub checked it is JSON; anything else is dropped, not half-read.
                output_schema: serde_json::from_str(&a.output_schema).ok(),
            },
        }
    }
}

/// One run event, keyed `(run_id, attempt, seq)`; on the socket as one JSON line with the
/// body's `kind` and `json` beside the key. The Nest relays it as it came.
pub use crate::model::RunEvent as RunEventMsg;

/// Protocol errors.
#[derive(Debug, thiserror::Error)]
pub enum SocketError {
    #[error("nest socket: {0}")]
    Io(#[from] std::io::Error),
    #[error("nest socket: line too long or not UTF-8: {0}")]
    Framing(String),
    #[error("nest socket: bad message: {0}")]
    Decode(#[from] serde_json::Error),
}

/// Reads messages of type `T`, one per line.
pub struct Reader<T> {
    inner: FramedRead<OwnedReadHalf, LinesCodec>,
    _t: std::marker::PhantomData<fn() -> T>,
}

/// How one line becomes a message.
pub trait FromLine: Sized {
    fn from_line(line: &str) -> Result<Self, SocketError>;
}

impl FromLine for ToInstance {
    fn from_line(line: &str) -> Result<Self, SocketError> {
        decode(line)
    }
}

impl FromLine for ToNest {
    /// An `event` line (most of what an instance sends) is read in one pass: its key fields,
    /// then its body from the raw text of its `json` ([`RunEventBody::from_wire`]), with no
    /// `Content` tree in between (serde buffers one for a tagged enum, and another for a
    /// flattened body). A line that pass cannot read takes the general path, which reads it
    /// or says what is wrong exactly as before.
    fn from_line(line: &str) -> Result<Self, SocketError> {
        if line.starts_with(r#"{"type":"event","#) {
            if let Some(event) = read_event_line(line) {
                return Ok(ToNest::Event(event));
            }
        }
        decode(line)
    }
}

/// An `event` line's fields, the body's left as raw text.
#[derive(Deserialize)]
struct EventLine<'a> {
    #[serde(rename = "type", borrow)]
    line_type: std::borrow::Cow<'a, str>,
    run_id: String,
    attempt: u32,
    seq: u64,
    task_id: String,
    at_ms: i64,
    #[serde(borrow)]
    kind: std::borrow::Cow<'a, str>,
    #[serde(borrow)]
    json: &'a serde_json::value::RawValue,
    sync: bool,
}

fn read_event_line(line: &str) -> Option<RunEventMsg> {
    let e: EventLine<'_> = serde_json::from_str(line).ok()?;
    if e.line_type != "event" {
        return None;
    }
    let body = agen_contract::run::RunEventBody::from_wire(&e.kind, e.json.get()).ok()?;
    Some(RunEventMsg {
        run_id: e.run_id,
        attempt: e.attempt,
        seq: e.seq,
        task_id: e.task_id,
        at_ms: e.at_ms,
        body,
        sync: e.sync,
    })
}

impl<T: FromLine> Reader<T> {
    /// The next message, or `None` when the peer closed the socket.
    pub async fn next(&mut self) -> Result<Option<T>, SocketError> {
        loop {
            match self.inner.next().await {
                None => return Ok(None),
                Some(Err(e)) => return Err(SocketError::Framing(e.to_string())),
                Some(Ok(line)) if line.trim().is_empty() => continue,
                Some(Ok(line)) => return Ok(Some(T::from_line(&line)?)),
            }
        }
    }
}

/// Writes messages of type `T`, one per line.
pub struct Writer<T> {
    inner: FramedWrite<OwnedWriteHalf, LinesCodec>,
    _t: std::marker::PhantomData<fn(T)>,
}

/// Messages a writer sends with one flush at most (see [`Writer::send_queued`]).
pub const WRITE_BATCH: usize = 64;

impl<T: Serialize> Writer<T> {
    pub async fn send(&mut self, msg: &T) -> Result<(), SocketError> {
        let line = encode(msg)?;
        self.inner
            .send(line)
            .await
            .map_err(|e| SocketError::Framing(e.to_string()))
    }

    /// Sends `first` and whatever else is queued in `rx` right now (up to [`WRITE_BATCH`]),
    /// in order, with one flush: one write where each message cost one, and one wake-up of
    /// the reader.
    pub async fn send_queued(
        &mut self,
        first: T,
        rx: &mut tokio::sync::mpsc::UnboundedReceiver<T>,
    ) -> Result<(), SocketError> {
        let framing = |e: tokio_util::codec::LinesCodecError| SocketError::Framing(e.to_string());
        self.inner.feed(encode(&first)?).await.map_err(framing)?;
        for _ in 1..WRITE_BATCH {
            let Ok(next) = rx.try_recv() else { break };
            self.inner.feed(encode(&next)?).await.map_err(framing)?;
        }
        SinkExt::<String>::flush(&mut self.inner)
            .await
            .map_err(framing)
    }
}

/// Splits a connected stream into a typed reader (`R`) and writer (`W`).
pub fn split<R, W>(stream: UnixStream) -> (Reader<R>, Writer<W>) {
    let (r, w) = stream.into_split();
    (
        Reader {
            inner: FramedRead::new(r, LinesCodec::new_with_max_length(MAX_LINE)),
            _t: std::marker::PhantomData,
        },
        Writer {
            inner: FramedWrite::new(w, LinesCodec::new_with_max_length(MAX_LINE)),
            _t: std::marker::PhantomData,
        },
    )
}

/// One message as one line (no trailing newline).
pub fn encode<T: Serialize>(msg: &T) -> Result<String, SocketError> {
    Ok(serde_json::to_string(msg)?)
}

pub fn decode<T: for<'de> Deserialize<'de>>(line: &str) -> Result<T, SocketError> {
    Ok(serde_json::from_str(line)?)
}

/// Listens on `path` (any old socket there is removed), mode `mode` (0600, or 0666 when
/// instances run under their own uids).
pub fn listen(path: &Path, mode: u32) -> std::io::Result<UnixListener> {
    use std::os::unix::fs::PermissionsExt;
    match std::fs::remove_file(path) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(e),
    }
    // Bind under a restrictive umask-equivalent: set the mode right after bind, before any
    // instance is started (instances are only spawned after this returns).
    let listener = UnixListener::bind(path)?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))?;
    Ok(listener)
}

#[cfg(test)]
mod tests {
    use super::*;
    use agen_contract::run::RunEventBody;
    use pretty_assertions::assert_eq;

    fn check_to_nest(line: &str, expected: ToNest) {
        let got: ToNest = decode(line).expect("decodes");
        assert_eq!(got, expected);
        let again: ToNest = decode(&encode(&got).expect("encodes")).expect("round trip");
        assert_eq!(again, expected);
        let encoded = encode(&got).expect("encodes");
        if matches!(expected, ToNest::Event(_)) {
            assert!(
                read_event_line(&encoded).is_some(),
                "an instance's own event lines take the one-pass read: {encoded}"
            );
        }
        for text in [line, encoded.as_str()] {
            assert_eq!(
                ToNest::from_line(text).expect("reads"),
                expected,
                "the reader's one-pass read of {text}"
            );
        }
    }

    /// The one-pass read of `event` lines reads what the general path reads, and a line it
    /// cannot read fails with the general path's error, word for word.
    #[test]
    fn an_event_line_reads_the_same_in_one_pass_and_fails_the_same() {
        let good = [
            r#"{"type":"event","run_id":"r","attempt":1,"seq":1,"task_id":"t","at_ms":5,"kind":"tool.started","json":{"call_id":"c\u00e9","tool":"ws.write","arguments":{"path":"a\"b"},"side_effecting":true},"sync":true}"#,
            r#"{"type":"event","run_id":"r","attempt":1,"seq":2,"task_id":"t","at_ms":5,"kind":"a.kind.from.later","json":{"anything":[1,2]},"sync":false}"#,
            r#"{"type":"event","run_id":"r","attempt":1,"seq":3,"task_id":"t","at_ms":5,"kind":"activity","json":{"text":"x"},"sync":false,"extra":1}"#,
            r#"{"type":"event","run_id":"r\u0031","attempt":1,"seq":4,"task_id":"t","at_ms":5,"kind":"activit\u0079","json":{"text":"x"},"sync":false}"#,
        ];
        for line in good {
            let general: ToNest = decode(line).expect("the general path reads it");
            assert!(
                read_event_line(line).is_some(),
                "the one-pass read takes {line}"
            );
            assert_eq!(ToNest::from_line(line).expect("reads"), general, "{line}");
        }
        let bad = [
            r#"{"type":"event","run_id":"r","attempt":1,"seq":1,"task_id":"t","at_ms":5,"kind":"tool.started","json":{"tool":"ws.write"},"sync":true}"#,
            r#"{"type":"event","run_id":"r","attempt":-1,"seq":1,"task_id":"t","at_ms":5,"kind":"activity","json":{},"sync":true}"#,
            r#"{"type":"event","run_id":"r","attempt":1,"seq":1,"task_id":"t","at_ms":5,"kind":"activity","json":{},"sync":true"#,
            r#"{"type":"event","run_id":"r","attempt":1,"seq":1,"task_id":"t","at_ms":5,"kind":"activity","json":{}}"#,
        ];
        for line in bad {
            let general = decode::<ToNest>(line)
                .map(|_| ())
                .map_err(|e| e.to_string());
            let fast = ToNest::from_line(line)
                .map(|_| ())
                .map_err(|e| e.to_string());
            assert_eq!(fast, general, "{line}");
        }
    }

    #[test]
    fn instance_messages_have_a_stable_wire_form() {
        check_to_nest(
            r#"{"type":"hello","instance_id":"i-1","pid":42,"secret":"00ff"}"#,
            ToNest::Hello {
                instance_id: "i-1".into(),
                pid: 42,
                secret: SpawnSecret::from_test("00ff"),
            },
        );
        check_to_nest(
            r#"{"type":"run_done","run_id":"r","attempt":2}"#,
            ToNest::RunDone {
                run_id: "r".into(),
                attempt: 2,
            },
        );
        check_to_nest(
            r#"{"type":"status","state":"unhealthy","tools_loaded":0,"servers_not_connected":[["time","exited with status 1"]],"tools":[],"message":"tool server time exited","active_runs":[]}"#,
            ToNest::Status(InstanceStatus {
                state: HostState::Unhealthy,
                tools_loaded: 0,
                servers_not_connected: vec![("time".into(), "exited with status 1".into())],
                tools: vec![],
                resources: vec![],
                message: "tool server time exited".into(),
                active_runs: vec![],
                server_pids: BTreeMap::new(),
            }),
        );
        check_to_nest(
            r#"{"type":"event","run_id":"r","attempt":1,"seq":3,"task_id":"t","at_ms":5,"kind":"run.finished","json":{"state":"succeeded","result":"ok","response_type":"text"},"sync":true}"#,
            ToNest::Event(RunEventMsg {
                run_id: "r".into(),
                attempt: 1,
                seq: 3,
                task_id: "t".into(),
                at_ms: 5,
                body: RunEventBody::RunFinished(agen_contract::run::RunFinished {
                    state: agen_contract::run::RunState::Succeeded,
                    result: "ok".into(),
                    response_type: agen_contract::run::ResponseType::Text,
                    messages: vec![],
                }),
                sync: true,
            }),
        );
    }

    #[test]
    fn a_spawn_secret_never_shows_and_compares_whole() {
        let s = SpawnSecret::generate();
        assert_eq!(s.0.len(), 64);
        assert!(!format!("{s:?}").contains(&s.0));
        let hello = ToNest::Hello {
            instance_id: "i".into(),
            pid: 1,
            secret: s.clone(),
        };
        assert!(!format!("{hello:?}").contains(&s.0));
        assert!(s.matches(&s.clone()));
        assert!(!s.matches(&SpawnSecret::generate()));
        assert!(!s.matches(&SpawnSecret::from_test(&s.0[..63])));
        assert!(!s.matches(&SpawnSecret::from_test("")));
    }

    #[test]
    fn a_hello_without_a_secret_does_not_decode() {
        let err = decode::<ToNest>(r#"{"type":"hello","instance_id":"i-1","pid":42}"#)
            .expect_err("no secret");
        assert!(err.to_string().contains("missing field `secret`"), "{err}");
    }

    #[test]
    fn a_bad_line_is_an_error_naming_the_problem() {
        let err = decode::<ToNest>(r#"{"type":"nope"}"#).expect_err("unknown type");
        assert!(err.to_string().contains("unknown variant `nope`"), "{err}");
    }

    #[test]
    fn placement_debug_never_shows_secret_values() {
        let p = Placement {
            instance_id: "i".into(),
            namespace: "default".into(),
            deployment: "d".into(),
            bundle_digest: "sha256:00".into(),
            generation: 1,
            concurrency: 1,
            secrets: BTreeMap::from([("TOKEN".to_string(), "hunter2".to_string())]),
            missing_secrets: vec![],
        };
        let shown = format!("{p:?}");
        assert!(
            shown.contains("TOKEN") && !shown.contains("hunter2"),
            "{shown}"
        );
    }

    #[tokio::test]
    async fn messages_cross_a_real_socket_in_order() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("nest.sock");
        let listener = listen(&path, 0o600).expect("listen");
        use std::os::unix::fs::PermissionsExt;
        assert_eq!(
            std::fs::metadata(&path).expect("stat").permissions().mode() & 0o777,
            0o600
        );
        let client = tokio::spawn({
            let path = path.clone();
            async move {
                let (mut r, mut w) =
                    split::<ToInstance, ToNest>(UnixStream::connect(&path).await.expect("connect"));
                w.send(&ToNest::Hello {
                    instance_id: "i".into(),
                    pid: 1,
                    secret: SpawnSecret::from_test("s"),
                })
                .await
                .expect("send");
                r.next().await.expect("read")
            }
        });
        let (stream, _) = listener.accept().await.expect("accept");
        let (mut r, mut w) = split::<ToNest, ToInstance>(stream);
        assert_eq!(
            r.next().await.expect("read"),
            Some(ToNest::Hello {
                instance_id: "i".into(),
                pid: 1,
                secret: SpawnSecret::from_test("s"),
            })
        );
        w.send(&ToInstance::Refused {
            reason: "unknown instance".into(),
        })
        .await
        .expect("send");
        drop(w);
        assert_eq!(
            client.await.expect("join"),
            Some(ToInstance::Refused {
                reason: "unknown instance".into()
            })
        );
    }

    #[tokio::test]
    async fn queued_messages_go_in_order_with_one_flush_and_at_most_a_batch_at_a_time() {
        let (a, b) = UnixStream::pair().expect("pair");
        let (_, mut w) = split::<ToNest, ToInstance>(a);
        let (mut r, _keep) = split::<ToInstance, ToNest>(b);
        let refused = |i: usize| ToInstance::Refused {
            reason: i.to_string(),
        };
        let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
        for i in 1..=WRITE_BATCH + 10 {
            tx.send(refused(i)).expect("queue");
        }
        w.send_queued(refused(0), &mut rx).await.expect("send");
        for i in 0..WRITE_BATCH {
            assert_eq!(r.next().await.expect("read"), Some(refused(i)));
        }
        let mut left = 0;
        while rx.try_recv().is_ok() {
            left += 1;
        }
        assert_eq!(left, 11, "the rest stays queued for the next write");
    }
}
