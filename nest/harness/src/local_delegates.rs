//! `agen run`'s [`Delegator`]: a `call_agent` to a delegate that names a local bundle
//! (`{"deployment": "researcher", "bundle": "../researcher"}`, relative to the calling bundle)
//! runs that bundle in-process as a child run with the caller's `rootRunId` and the next
//! delegation depth, with its own tool servers and run log; a delegate without `bundle` says
//! it needs a fleet. Children never outlive the call (no `start_agent` standalone).
//!
//! [`prepare`] readies a bundle to run in-process, for `agen run` and for each such child.
//!
//! Invariant: one child per idempotency key (a call asked twice waits for the same child).

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agen_shared::bundle::{Bundle, Delegate, ModelRef};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::artifacts::LocalArtifacts;
use crate::local_config::resolve_local;
use crate::mcp::{LaunchContext, ToolHost};
use crate::model::provider_for;
use crate::run::{ChildEnd, ChildRequest, Delegator, Harness, RunAssignment};
use crate::run_log::{runs_dir, SledRunLog, STANDALONE_NAMESPACE};
use crate::terminal::TerminalApprover;

/// One child run.
struct Child {
    end: watch::Receiver<Option<ChildEnd>>,
    cancel: CancellationToken,
}

/// See the module doc.
pub struct LocalDelegator {
    /// The calling bundle's folder (delegates' `bundle` paths are relative to it).
    dir: PathBuf,
    delegates: Vec<Delegate>,
    approve_all: bool,
    artifacts: Arc<LocalArtifacts>,
    /// Children by id, and ids by idempotency key.
    children: Mutex<(HashMap<String, Child>, HashMap<String, String>)>,
}

impl LocalDelegator {
    pub fn new(
        dir: PathBuf,
        delegates: Vec<Delegate>,
        approve_all: bool,
        artifacts: Arc<LocalArtifacts>,
    ) -> LocalDelegator {
        LocalDelegator {
            dir,
            delegates,
            approve_all,
            artifacts,
            children: Mutex::new((HashMap::new(), HashMap::new())),
        }
    }

    fn children(
        &self,
    ) -> std::sync::MutexGuard<'_, (HashMap<String, Child>, HashMap<String, String>)> {
        self.children.lock().unwrap_or_else(|p| p.into_inner())
    }
}

#[async_trait::async_trait]
impl Delegator for LocalDelegator {
    async fn start(&self, parent: &RunAssignment, child: ChildRequest) -> Result<String, String> {
        if let Some(id) = self.children().1.get(&child.idempotency_key) {
            return Ok(id.clone());
        }
        let Some(delegate) = self
            .delegates
            .iter()
            .find(|d| d.deployment == child.deployment && d.namespace == child.namespace)
        else {
            return Err(format!("`{}` is not a delegate", child.deployment));
        };
        let Some(rel) = &delegate.bundle else {
            return Err(format!(
                "delegate `{0}` needs a fleet: agen run runs only delegates that name a local bundle, e.g. {{\"deployment\": \"{0}\", \"bundle\": \"../{0}\"}} in x-agen/config.json",
                delegate.deployment
            ));
        };
        let dir = self.dir.join(rel);
        let prepared = prepare(&dir, None, self.approve_all, self.artifacts.clone())
            .await
            .map_err(|e| {
                format!(
                    "delegate `{}` ({}): {e}",
                    delegate.deployment,
                    dir.display()
                )
            })?;
        let run_id = uuid::Uuid::now_v7().to_string();
        let log_dir = runs_dir().join(&run_id);
        let sink = Arc::new(SledRunLog::open(&log_dir, &run_id, 1).map_err(|e| format!("{e:#}"))?);
        let req = RunAssignment {
            trace_id: String::new(),
            run_id: run_id.clone().into(),
            attempt: 1,
            task_id: run_id.clone().into(),
            namespace: STANDALONE_NAMESPACE.into(),
            deployment: delegate.deployment.clone(),
            input: child.input,
            labels: BTreeMap::new(),
            conversation_id: run_id.clone(),
            conversation_key: child.conversation_key,
            root_run_id: parent.root_run_id().clone(),
            delegation_depth: parent.delegation_depth + 1,
            history: Vec::new(),
            replay: Vec::new(),
            tool_overrides: Default::default(),
            max_tokens: None,
            output_schema: None,
        };
        let (tx, rx) = watch::channel(None);
        let cancel = CancellationToken::new();
        let token = cancel.clone();
        tracing::info!(run_id = %run_id, delegate = %delegate.deployment, "standalone child run");
        tokio::spawn(async move {
            let outcome = prepared.harness.run(req, sink, token).await;
            prepared.host.shutdown().await;
            let _ = tx.send(Some(ChildEnd {
                state: outcome.state,
                result: outcome.result,
                artifacts: Vec::new(),
            }));
        });
        let mut children = self.children();
        children.0.insert(run_id.clone(), Child { end: rx, cancel });
        children.1.insert(child.idempotency_key, run_id.clone());
        Ok(run_id)
    }

    async fn wait(
        &self,
        _parent: &RunAssignment,
        task_id: &str,
        wait: Duration,
    ) -> Result<Option<ChildEnd>, String> {
        let Some(mut end) = self.children().0.get(task_id).map(|c| c.end.clone()) else {
            return Err(format!("run {task_id} is not a child of this run"));
        };
        let done = tokio::time::timeout(wait, end.wait_for(Option::is_some)).await;
        match done {
            Ok(Ok(v)) => Ok(v.clone()),
            Ok(Err(_)) => Err(format!("child run {task_id} ended without an outcome")),
            Err(_) => Ok(None),
        }
    }

    async fn cancel(
        &self,
        _parent: &RunAssignment,
        task_id: &str,
        _reason: &str,
    ) -> Result<(), String> {
        if let Some(c) = self.children().0.get(task_id) {
            c.cancel.cancel();
        }
        Ok(())
    }

    fn detached(&self) -> bool {
        false
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
