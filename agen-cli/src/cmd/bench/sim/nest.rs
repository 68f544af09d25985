//! One simulated Nest: a real `NestService` client of the Hub (the Nest's own
//! [`agen_nest::hub_client`]: the Hub's CA pinned by the join token, `Join` with the join token
//! for a certificate of its own key, then mutual TLS on every call), one `Connect` stream at a
//! time that registers, heartbeats at the rate the Hub gives with every instance's report,
//! answers `PlaceInstance` with a running, healthy instance and `AssignRun` with a simulated
//! run ([`super::runs`]), and routes the Hub's acks to the runs that wait for them. Messages
//! are built from the Nest's own domain types and converted by the Nest's own
//! [`agen_nest::hub_client::convert`], so what goes over the wire is what a Nest sends.
//!
//! Invariants: [`SimNest::kill`] drops the stream, the connection and every run of the Nest at
//! once, with no `Leaving` (as a kill -9 does), and forgets its instances; a killed Nest comes
//! back with [`SimNest::start`], as the same Nest (its stored certificate, no second `Join`)
//! with no instances. A session that fails is tried again with back-off, as a Nest does.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agen_nest::config::NestOptions;
use agen_nest::hub_client::{self, convert};
use agen_nest::model::{InstanceReport, InstanceState, RunAttempt};
use agen_proto::v1::hub_message::Msg as HubMsg;
use agen_proto::v1::nest_message::Msg as NestMsg;
use agen_proto::v1::{Heartbeat, HubMessage, NestMessage, Register};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_stream::wrappers::ReceiverStream;

use super::nest_state::{NestState, Shared, SimInstance};

/// Every instance's report, as a heartbeat or `Register` lists them.
fn reports(state: &NestState) -> Vec<InstanceReport> {
    state.instances().values().map(report).collect()
}

fn report(i: &SimInstance) -> InstanceReport {
    let mut r = InstanceReport::new(&i.order, InstanceState::Running, "simulated".into());
    r.healthy = true;
    r.tools_loaded = 1;
    r.tools = vec![super::runs::TOOL.to_string()];
    r.active_runs = i.runs.iter().map(|(a, _)| a.run_id.clone()).collect();
    r.run_attempts = i.runs.iter().map(|(a, _)| a.clone()).collect();
    r
}

/// One simulated Nest.
pub struct SimNest {
    pub index: usize,
    opts: NestOptions,
    pub state: Arc<NestState>,
    shared: Arc<Shared>,
    task: Mutex<Option<tokio::task::JoinHandle<()>>>,
}

impl SimNest {
    /// A Nest whose identity (node id, key, certificate) lives in `data_dir`.
    pub fn new(index: usize, opts: NestOptions, shared: Arc<Shared>) -> SimNest {
        SimNest {
            index,
            opts,
            state: Arc::new(NestState::default()),
            shared,
            task: Mutex::new(None),
        }
    }

    /// Starts (or restarts) the Nest's link: join if needed, register, and serve the Hub.
    pub fn start(&self) {
        let (index, opts, state, shared) = (
            self.index,
            self.opts.clone(),
            self.state.clone(),
            self.shared.clone(),
        );
        let handle = tokio::spawn(async move {
            let mut delay = Duration::from_millis(200);
            loop {
                if let Err(e) = session(index, &opts, &state, &shared).await {
                    tracing::debug!(nest = index, "simulated nest session ended: {e}");
                }
                state.registered.store(false, Ordering::SeqCst);
                state.instances().clear();
                state.acks().clear();
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        });
        let mut slot = self.task.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(old) = slot.replace(handle) {
            old.abort();
        }
    }

    /// Drops the Nest at once, as a kill -9 would: no `Leaving`, its runs gone mid-way.
    pub fn kill(&self) {
        if let Some(t) = self.task.lock().unwrap_or_else(|p| p.into_inner()).take() {
            t.abort();
        }
        self.state.registered.store(false, Ordering::SeqCst);
        self.state.instances().clear();
        self.state.acks().clear();
    }

    pub fn is_registered(&self) -> bool {
        self.state.registered.load(Ordering::SeqCst)
    }
}

/// How long the Hub may take to answer `Register`.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(60);

/// One stream's life; returns when it breaks.
async fn session(
    index: usize,
    opts: &NestOptions,
    state: &Arc<NestState>,
    shared: &Arc<Shared>,
) -> anyhow::Result<()> {
    let client = {
        let _permit = shared.join_permits.acquire().await?;
        hub_client::client(opts).await?
    };
    let nest_id = agen_nest::config::load_or_create_node_id(&opts.data_dir)?;
    let (tx, rx) = mpsc::channel::<NestMessage>(256);
    let register = Register {
        nest_id,
        name: opts.name.clone(),
        labels: opts.settings.get().labels.into_iter().collect(),
        capacity: shared.capacity,
        version: agen_shared::version::CRATE_VERSION.to_string(),
        instances: convert::reports(reports(state)),
        fallback_name: String::new(),
        separation: "off (simulated)".into(),
        protocol_version: agen_shared::version::Protocol::spoken().to_string(),
        commit: opts.commit.clone(),
        network: "simulated".into(),
        // Room for any number of instances that reserve nothing.
        cpu_millis: 1_000_000,
        memory_bytes: 1 << 40,
        resources: "not limited (simulated)".into(),
    };
    tx.send(NestMessage {
        msg: Some(NestMsg::Register(register)),
    })
    .await?;
    let mut inbound = client
        .clone()
        .connect(ReceiverStream::new(rx))
        .await
        .map_err(|s| anyhow::anyhow!("connect: {:?}: {}", s.code(), s.message()))?;
    let first = tokio::time::timeout(REGISTER_TIMEOUT, inbound.message())
        .await
        .map_err(|_| anyhow::anyhow!("no Registered within {REGISTER_TIMEOUT:?}"))??;
    let interval = match first {
        Some(HubMessage {
            msg: Some(HubMsg::Registered(r)),
        }) => Duration::from_millis(u64::from(r.heartbeat_interval_ms.max(100))),
        other => anyhow::bail!("expected Registered first, got {other:?}"),
    };
    state.registered.store(true, Ordering::SeqCst);
    shared.registrations.fetch_add(1, Ordering::SeqCst);

    let mut runs: JoinSet<()> = JoinSet::new();
    let mut heartbeat = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = heartbeat.tick() => {
                let instances = convert::reports(reports(state));
                let at_ms = chrono::Utc::now().timestamp_millis();
                tx.send(NestMessage { msg: Some(NestMsg::Heartbeat(Heartbeat { at_ms, instances })) }).await?;
                shared.stats.heartbeats.fetch_add(1, Ordering::Relaxed);
            }
            Some(_) = runs.join_next(), if !runs.is_empty() => {}
            m = inbound.message() => {
                let msg = match m {
                    Ok(Some(HubMessage { msg: Some(msg) })) => msg,
                    Ok(Some(HubMessage { msg: None })) => continue,
                    Ok(None) => anyhow::bail!("the hub closed the stream"),
                    Err(s) => anyhow::bail!("{:?}: {}", s.code(), s.message()),
                };
                handle(index, msg, state, shared, &tx, &client, &mut runs).await?;
            }
        }
    }
}

async fn handle(
    index: usize,
    msg: HubMsg,
    state: &Arc<NestState>,
    shared: &Arc<Shared>,
    tx: &mpsc::Sender<NestMessage>,
    client: &hub_client::HubClient,
    runs: &mut JoinSet<()>,
) -> anyhow::Result<()> {
    match msg {
        HubMsg::Place(p) => {
            let order = convert::place(p);
            let inst = SimInstance {
                order,
                runs: Vec::new(),
            };
            let r = report(&inst);
            state
                .instances()
                .insert(inst.order.instance_id.clone(), inst);
            shared.stats.placed();
            tx.send(NestMessage {
                msg: Some(NestMsg::Instance(convert::report(r))),
            })
            .await?;
            shared
                .stats
                .reports
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        HubMsg::Stop(s) => {
            state.instances().remove(&s.instance_id);
        }
        HubMsg::AssignRun(a) => {
            let a = convert::assigned_run(a);
            let here = match state.instances().get_mut(a.instance_id.as_str()) {
                Some(i) => {
                    let attempt = RunAttempt {
                        run_id: a.run_id.0.clone(),
                        attempt: a.attempt.0,
                    };
                    i.runs.push((attempt, a.task_id.0.clone()));
                    true
                }
                None => false,
            };
            shared
                .stats
                .assigned(a.task_id.as_str(), a.attempt.0, index);
            let acks = state.watch_acks(a.run_id.as_str(), a.attempt.0);
            let ctx = super::runs::RunCtx {
                client: client.clone(),
                tx: tx.clone(),
                state: state.clone(),
                shared: shared.clone(),
                acks,
            };
            runs.spawn(super::runs::run(ctx, a, here));
        }
        HubMsg::Ack(a) => {
            if let Some(w) = state.acks().get(&(a.run_id.clone(), a.attempt)) {
                w.send_modify(|(seq, fenced)| {
                    *seq = (*seq).max(a.acked_seq);
                    *fenced |= a.fenced;
                });
            }
            shared
                .stats
                .acks
                .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
        // Cancels, pings, logs and approvals: the simulated runs ask for none of them.
        _ => {}
    }
    Ok(())
}
