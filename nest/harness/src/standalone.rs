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
//! The run log is `run_log.rs`, preparing a bundle to run in-process `local_delegates.rs`, and
//! resolving its secrets and model without a Hub `local_config.rs`: this module is only the CLI.
//! Artifacts go to files beside the run logs (`$XDG_STATE_HOME/agen/artifacts/standalone`, see
//! [`crate::artifacts::LocalArtifacts`]); when the run saved any, stderr says where.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::artifacts::LocalArtifacts;
use crate::local_delegates::{prepare, Prepared};
use crate::mcp::ToolHost;
use crate::run::{Harness, RunAssignment, RunState};
use crate::run_log::{runs_dir, RunOrigin, SledRunLog};

/// Exit code of a bad bundle or bad arguments.
pub const EXIT_BAD_INPUT: i32 = 2;
/// Exit code of `agen run --resume` for a run that is not in the run logs.
pub const EXIT_NOT_FOUND: i32 = 4;
use crate::run_log::STANDALONE_NAMESPACE;

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
