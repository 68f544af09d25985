//! `agen run DIR PROMPT`: one run of a bundle in-process, no Hub: loads and validates the
//! bundle, resolves `env` secrets from this process's environment, starts its tool servers,
//! runs the same harness as a fleet instance with a local sled run log, and prints the answer.
//!
//! Invariants: stdout carries only the answer; a bad bundle (or bad `--model`, or a secret
//! that cannot be resolved) exits 2 (usage, as the CLI's table says), a failed or cancelled run 1, a successful run 0. Each
//! run has its own sled database under the run-log folder (`$XDG_STATE_HOME/agen/runs/<run id>`,
//! or `~/.local/state/agen/runs/<run id>`), so concurrent `agen run`s never contend for a lock;
//! the run's assignment and its bundle folder ([`RunOrigin`]) are in it before the first event,
//! so `agen run --resume RUN` ([`resume_cli`]) carries an interrupted run on from the log alone.
//! Artifacts go to files beside the run logs (`$XDG_STATE_HOME/agen/artifacts/standalone`, see
//! [`crate::artifacts::LocalArtifacts`]); when the run saved any, stderr says where.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agen_shared::bundle::{referenced_secrets, Bundle, ModelRef, Provider, SecretSource};
use anyhow::Context;
use tokio_util::sync::CancellationToken;

use crate::artifacts::LocalArtifacts;
use crate::local_delegates::LocalDelegator;
use crate::mcp::{LaunchContext, ToolHost};
use crate::model::provider_for;
use crate::run::{
    model_config, Harness, RunAssignment, RunEventBody, RunEventSink, RunState, SinkError,
};
use crate::terminal::TerminalApprover;

/// Exit code of a bad bundle or bad arguments.
pub const EXIT_BAD_INPUT: i32 = 2;
/// Exit code of `agen run --resume` for a run that is not in the run logs.
pub const EXIT_NOT_FOUND: i32 = 4;
/// The namespace of standalone runs (and the folder of their artifacts).
pub const STANDALONE_NAMESPACE: &str = "standalone";

/// Runs `prompt` against the bundle in `dir` (`model` overrides its `model`); returns the
/// process exit code.
pub async fn run_cli(dir: PathBuf, prompt: String, model: Option<String>) -> anyhow::Result<i32> {
    run_cli_with(dir, prompt, model, false).await
}

/// [`run_cli`]; `approve_all` approves every call that needs approval without asking (and
/// says so at start); otherwise they are asked on the terminal ([`TerminalApprover`]).
pub async fn run_cli_with(
    dir: PathBuf,
    prompt: String,
    model: Option<String>,
    approve_all: bool,
) -> anyhow::Result<i32> {
    let artifacts = Arc::new(LocalArtifacts::new(crate::artifacts::default_dir()));
    if approve_all {
        eprintln!("agen run: --approve-all: every call that needs approval (permissions.ask) is approved without asking");
    }
    let model_arg = model.clone();
    let Prepared {
        bundle,
        harness,
        host,
    } = match prepare(&dir, model, approve_all, artifacts.clone()).await {
        Ok(p) => p,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(EXIT_BAD_INPUT);
        }
    };

    let run_id = uuid::Uuid::now_v7().to_string();
    let log_dir = runs_dir().join(&run_id);
    let req = RunAssignment {
        trace_id: String::new(),
        run_id: run_id.clone().into(),
        attempt: 1,
        task_id: run_id.clone().into(),
        namespace: STANDALONE_NAMESPACE.into(),
        deployment: bundle.agent.name.clone(),
        input: prompt,
        labels: BTreeMap::new(),
        conversation_id: run_id.clone(),
        conversation_key: String::new(),
        root_run_id: run_id.clone().into(),
        delegation_depth: 0,
        history: Vec::new(),
        replay: Vec::new(),
        tool_overrides: Default::default(),
        max_tokens: None,
        output_schema: None,
    };
    let sink = SledRunLog::open(&log_dir, &run_id, 1)?;
    let origin = RunOrigin {
        bundle: std::path::absolute(&dir).unwrap_or(dir),
        model: model_arg,
    };
    sink.put_origin(&origin)?;
    sink.put_assignment(&req)?;
    tracing::info!(run_id = %run_id, log = %log_dir.display(), "standalone run");
    run_logged(harness, host, req, Arc::new(sink), &artifacts).await
}

/// `agen run --resume RUN`: carries on the run `run_id` of the local run log from where it
/// stopped (a kill, a crash): a new attempt replays the log, so answered model turns are not
/// asked again, recorded tool results are reused and an interrupted side-effecting call is
/// reported to the model as `effect_unknown`, never sent again. `dir`/`model` override the
/// bundle folder and `--model` the log recorded. A run the log shows finished prints its
/// recorded outcome. An unknown run exits 4; a running or unreadable one 2, with the reason.
pub async fn resume_cli(
    run_id: &str,
    dir: Option<PathBuf>,
    model: Option<String>,
    approve_all: bool,
) -> anyhow::Result<i32> {
    let root = runs_dir();
    let bad = |msg: String| {
        eprintln!("error: {msg}");
        Ok(EXIT_BAD_INPUT)
    };
    let run = match crate::local_runs::read(&root, run_id) {
        Ok(Some(r)) => r,
        Ok(None) => {
            eprintln!(
                "error: run {run_id} is not in the run logs in {}; `agen runs` lists them",
                root.display()
            );
            return Ok(EXIT_NOT_FOUND);
        }
        Err(e) => return bad(format!("{e:#}")),
    };
    use crate::local_runs::LocalRunState;
    match run.state {
        LocalRunState::Running => {
            return bad(format!(
                "run {run_id} is still running (another agen run holds its log {} open); wait for it or stop it first",
                run.dir.display()
            ))
        }
        LocalRunState::Finished(state) => {
            eprintln!("agen run: run {run_id} had already {}; its recorded outcome:", state.as_str());
            let result = run.result().unwrap_or_default();
            return Ok(if state == RunState::Succeeded {
                println!("{result}");
                0
            } else {
                eprintln!("error: the run {}: {result}", state.as_str());
                1
            });
        }
        LocalRunState::Interrupted => {}
    }
    let Some(assignment) = run.assignment.clone() else {
        return bad(format!(
            "run {run_id} cannot be resumed: its log {} has no assignment (it was written by an older agen)",
            run.dir.display()
        ));
    };
    let origin = run.origin.clone();
    let Some(bundle_dir) = dir.or_else(|| origin.as_ref().map(|o| o.bundle.clone())) else {
        return bad(format!(
            "run {run_id}: its log does not name its bundle; give the folder: agen run DIR --resume {run_id}"
        ));
    };
    let model = model.or_else(|| origin.and_then(|o| o.model));
    if approve_all {
        eprintln!("agen run: --approve-all: every call that needs approval (permissions.ask) is approved without asking");
    }
    let artifacts = Arc::new(LocalArtifacts::new(crate::artifacts::default_dir()));
    let Prepared { harness, host, .. } =
        match prepare(&bundle_dir, model, approve_all, artifacts.clone()).await {
            Ok(p) => p,
            Err(e) => {
                return bad(format!(
                    "{} (the bundle of run {run_id}): {e}",
                    bundle_dir.display()
                ))
            }
        };
    let attempt = run.attempts().max(assignment.attempt) + 1;
    let mut req = assignment;
    req.attempt = attempt;
    req.replay = run.records.into_iter().map(|r| r.body).collect();
    let sink = SledRunLog::open(&run.dir, run_id, attempt)?;
    sink.put_assignment(&req)?;
    eprintln!(
        "agen run: resuming run {run_id} (attempt {attempt}) of {}",
        bundle_dir.display()
    );
    tracing::info!(run_id = %run_id, attempt, log = %run.dir.display(), "standalone run resumed");
    run_logged(harness, host, req, Arc::new(sink), &artifacts).await
}

/// Runs `req` on `harness` into `sink` (Ctrl-C cancels), stops the tool servers and prints the
/// answer (exit 0) or the failure (exit 1).
async fn run_logged(
    harness: Arc<Harness>,
    host: ToolHost,
    req: RunAssignment,
    sink: Arc<SledRunLog>,
    artifacts: &LocalArtifacts,
) -> anyhow::Result<i32> {
    let cancel = CancellationToken::new();
    let on_signal = cancel.clone();
    let signals = tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("cancelling the run");
            on_signal.cancel();
        }
    });
    let outcome = harness.run(req, sink.clone(), cancel).await;
    signals.abort();
    let saved = sink.artifacts_saved.load(Ordering::SeqCst);
    if saved > 0 {
        eprintln!(
            "{saved} artifact(s) saved in {}",
            artifacts.namespace_dir(STANDALONE_NAMESPACE).display()
        );
    }
    host.shutdown().await;
    if let Err(e) = sink.db.flush_async().await {
        tracing::warn!("run log flush failed: {e}");
    }
    match outcome.state {
        RunState::Succeeded => {
            println!("{}", outcome.result);
            Ok(0)
        }
        RunState::Failed | RunState::Cancelled => {
            eprintln!(
                "error: the run {}: {}",
                outcome.state.as_str(),
                outcome.result
            );
            Ok(1)
        }
    }
}

/// A bundle ready to run in-process: the root of `agen run`, or one of its local delegates.
pub(crate) struct Prepared {
    pub bundle: Arc<Bundle>,
    pub harness: Arc<Harness>,
    pub host: ToolHost,
}

/// Loads and validates the bundle in `dir` (`model` overrides its `model`), resolves its `env`
/// secrets, starts its tool servers and builds its harness (terminal approvals unless
/// `approve_all`; local delegates through a [`LocalDelegator`]). The error is the user's.
pub(crate) async fn prepare(
    dir: &Path,
    model: Option<String>,
    approve_all: bool,
    artifacts: Arc<LocalArtifacts>,
) -> Result<Prepared, String> {
    let mut bundle = match Bundle::load(dir) {
        Ok(b) => b,
        Err(e) => {
            return Err(e.to_string());
        }
    };
    if let Some(m) = model {
        match ModelRef::parse(&m) {
            Ok(r) => bundle.agent.model = Some(r),
            Err(e) => {
                return Err(format!("--model: {e}"));
            }
        }
    }
    let (secrets, config) = resolve_local(&bundle)?;
    let bundle = Arc::new(bundle);

    let agen_bin = std::env::current_exe()
        .map_err(|e| format!("cannot find the agen binary for AGEN_BIN: {e}"))?;
    let mut launch = LaunchContext::new(agen_bin);
    launch.secrets = secrets.clone();
    let host = ToolHost::start(&bundle, launch).await;
    for p in host.status().not_connected {
        eprintln!(
            "warning: tool server {} is not connected: {}",
            p.server, p.reason
        );
    }

    let http = reqwest::Client::builder()
        .connect_timeout(Duration::from_secs(10))
        .timeout(Duration::from_secs(600))
        .build()
        .map_err(|e| format!("cannot build the HTTP client: {e}"))?;
    let provider = Arc::from(provider_for(config, http));
    let approver: Arc<dyn crate::run::Approver> = if approve_all {
        Arc::new(crate::run::ApproveAll)
    } else {
        Arc::new(TerminalApprover::default())
    };
    let harness = match Harness::with_provider(bundle.clone(), Arc::new(host.clone()), provider) {
        Ok(h) => h
            .with_secret_values(&secrets)
            .with_artifacts(artifacts.clone())
            .with_approver(approver)
            .with_delegator(Arc::new(LocalDelegator::new(
                dir.to_path_buf(),
                bundle.config.delegates.clone(),
                approve_all,
                artifacts,
            ))),
        Err(e) => {
            host.shutdown().await;
            return Err(e.to_string());
        }
    };
    Ok(Prepared {
        bundle,
        harness: Arc::new(harness),
        host,
    })
}

/// What a run without a Hub needs of a loaded bundle: the values of its secrets (each
/// `env`-sourced one from this process's environment; a `platform` one is an error that says
/// what to write instead) and its model client settings (the API key from `OPENAI_API_KEY` /
/// `ANTHROPIC_API_KEY` when the bundle gives none). Shared by `agen run` and embedded agents.
pub fn resolve_local(
    bundle: &Bundle,
) -> Result<(BTreeMap<String, String>, crate::model::ModelConfig), String> {
    if let Some((name, used_in)) = referenced_secrets(bundle)
        .into_iter()
        .find(|(name, _)| matches!(bundle.secrets.get(name), Some(SecretSource::Platform)))
    {
        return Err(format!(
            "x-agen/secrets.json: secret {name} (used in {used_in}) has source platform, which needs a Hub; \
             use {{\"source\": \"env\", \"var\": \"{name}\"}} to run without one"
        ));
    }
    let secrets = bundle
        .secret_values(|var| std::env::var(var).ok(), |_| None)
        .map_err(|e| e.to_string())?;
    let mut config = model_config(bundle, &secrets).map_err(|e| e.to_string())?;
    if config.api_key.is_none() {
        // What a user of the providers' own tools expects.
        let var = match config.model.provider {
            Provider::OpenAi => "OPENAI_API_KEY",
            Provider::Anthropic => "ANTHROPIC_API_KEY",
        };
        config.api_key = std::env::var(var).ok().filter(|k| !k.is_empty());
    }
    Ok((secrets, config))
}

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
    db: sled::Db,
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
            let attempt = k
                .get(..4)
                .and_then(|b| <[u8; 4]>::try_from(b).ok())
                .map(u32::from_be_bytes)
                .unwrap_or(0);
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
