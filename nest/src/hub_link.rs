//! The Nest's one outbound link to the Hub: a `NestService/Connect` bidirectional stream that
//! registers (with the instances the Nest still runs), heartbeats, reports instances, relays run
//! events and receives placements, stops, run assignments, cancels and acks; it reconnects with
//! exponential back-off and jitter and re-registers after a Hub restart.
//!
//! Invariants: there is exactly one stream at a time; bundles never travel on it (see
//! `bundles`); instances keep running across reconnects (the Hub re-adopts what `Register`
//! lists); a run event stays in the [`Outbox`] until the Hub acks it and is resent after every
//! reconnect (the Hub appends if absent, so a resend is harmless); the join token is never
//! logged; against an `https://` Hub every call but `Join` presents the Nest's client
//! certificate (`<data-dir>/nest.crt`, key `nest.key`), obtained by `Join` on first start and
//! again whenever it no longer matches the Hub's CA or the node id, and once the Nest holds a
//! certificate it never sends the join token again (it is the bearer only of `Join`, and of
//! every call to a plaintext Hub, which has no certificates).
//! A Nest that loses its Hub keeps its runs and reconnects: no run can start a side effect
//! without the Hub's ack of its durable "started" (the instance's sink waits for it, with no
//! timeout), so a run that goes on without a Hub can do nothing twice. At reconnect the Nest
//! lists the runs it holds (`Register.instances[].runs`); the Hub keeps the ones whose lease is
//! still theirs (their resent events are acked and they carry on with the same attempt) and
//! cancels the others. Only a Nest that has heard nothing from any Hub (pings, acks, anything)
//! for its own `--nest-lease` stops every run it holds ([`Supervisor::fence_all`]); the Hub
//! resumes them from their logs.
//! Run events nobody waits for are batched for at most `event_batch_window`; that window is a
//! deadline of the link's loop, never a wait inside it, so a waited-for event and everything
//! from the Hub (acks above all) never wait for it.

use std::sync::atomic::{AtomicI64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use agen_proto::v1::hub_message::Msg as HubMsg;
use agen_proto::v1::nest_message::Msg as NestMsg;
use agen_proto::v1::{
    Draining, Heartbeat, HubMessage, Leaving, NestMessage, NestSettings, Register,
};
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;

use crate::config::NestOptions;
use crate::hub_client::{convert, ClientSlot, HubClient};
use crate::outbox::Outbox;
use crate::supervisor::backoff::Backoff;
use crate::supervisor::Supervisor;

/// Heartbeat interval until the Hub says otherwise.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(2);
/// Reconnect back-off bounds. The cap is small: a Hub that starts gives the Nests it knows
/// its reconnect grace (its nest ttl plus a heartbeat) before it re-places their runs, so a
/// Nest must try again well within it.
const RECONNECT_BASE: Duration = Duration::from_millis(200);
const RECONNECT_CAP: Duration = Duration::from_secs(2);
/// Events per `RunEvents` message at most.
const BATCH_MAX: usize = 256;
/// How long to wait for `Registered` after opening the stream.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping Nest waits for the Hub to confirm `Leaving`.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(2);

/// When the link last heard from a Hub, against the Nest lease.
pub struct HubSilence {
    last_heard_ms: AtomicI64,
    lease: Duration,
}

impl HubSilence {
    /// Silence counts from now (the Nest's start): a Nest that never reaches a Hub holds no
    /// runs anyway.
    fn new(lease: Duration) -> HubSilence {
        HubSilence {
            last_heard_ms: AtomicI64::new(now_ms()),
            lease,
        }
    }

    fn heard(&self) {
        self.last_heard_ms.store(now_ms(), Ordering::SeqCst);
    }

    /// Stops every run whenever no Hub has been heard from for the Nest lease, until
    /// `shutdown`.
    async fn watch(self: Arc<Self>, sup: Arc<Supervisor>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        // This loop guards the supervisor's runs: it pets systemd's watchdog while it goes round.
        let watchdog = agen_shared::systemd::Watchdog::from_env();
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.cancelled() => return,
            }
            watchdog.pet();
            let silent = now_ms() - self.last_heard_ms.load(Ordering::SeqCst);
            if silent > self.lease.as_millis() as i64 {
                sup.fence_all(&format!(
                    "no word from any hub for {:.1}s, past the nest lease of {:?} (--nest-lease); the hub resumes these runs from their logs",
                    silent as f64 / 1000.0,
                    self.lease
                ));
            }
        }
    }
}

/// What the link needs from the rest of the Nest.
pub struct LinkContext {
    pub opts: Arc<NestOptions>,
    pub nest_id: String,
    pub supervisor: Arc<Supervisor>,
    /// The supervisor's reports (see [`crate::supervisor::Reports`]), kept across sessions.
    pub reports: crate::supervisor::Reports,
    pub outbox: Arc<Outbox>,
    /// Runs whose history and replay are on their way (`run_context`).
    pub fetching: Arc<crate::run_context::Fetching>,
    /// Called once, after the first successful registration (sd-notify READY).
    pub on_first_registered: Option<Box<dyn FnOnce() + Send>>,
    /// Cancelled when the Nest starts draining (it was told to stop): every session then tells
    /// the Hub (`Draining`), which sends it no new runs while its runs finish.
    pub draining: CancellationToken,
    /// The Hub client (told when the Hub's CA changed, see `HubPing.ca_sha256`).
    pub client_slot: Arc<ClientSlot>,
}

/// Keeps the link up until `shutdown`: connect, register, serve, and on any failure back off
/// and start again.
pub async fn run(mut ctx: LinkContext, client_slot: Arc<ClientSlot>, shutdown: CancellationToken) {
    let mut backoff = Backoff::new(RECONNECT_BASE, RECONNECT_CAP);
    let silence = Arc::new(HubSilence::new(ctx.opts.nest_lease));
    tokio::spawn(
        silence
            .clone()
            .watch(ctx.supervisor.clone(), shutdown.clone()),
    );
    loop {
        if shutdown.is_cancelled() {
            return;
        }
        let client = match client_slot.get_or_connect(&ctx.opts).await {
            Ok(c) => c,
            Err(e) => {
                let delay = backoff.next_delay();
                tracing::warn!(hub = %client_slot.current(&ctx.opts), "{e}; retrying in {delay:?}");
                client_slot.fail_over(&ctx.opts).await;
                agen_shared::systemd::status(&format!(
                    "Hub unreachable, retrying: {}",
                    ctx.opts.hub
                ));
                if sleep_or_cancel(delay, &shutdown).await {
                    return;
                }
                continue;
            }
        };
        match session(&mut ctx, client, &shutdown, &mut backoff, &silence).await {
            Ok(()) => return,
            Err(reason) => {
                let delay = backoff.next_delay();
                client_slot.fail_over(&ctx.opts).await;
                tracing::warn!(hub = %ctx.opts.hub, runs_kept = ctx.supervisor.active_runs(), nest_lease = ?ctx.opts.nest_lease, "hub link down: {reason}; reconnecting in {delay:?} (runs go on until their next side effect waits for the hub)");
                agen_shared::systemd::status(&format!(
                    "Hub unreachable, retrying: {}",
                    ctx.opts.hub
                ));
                if sleep_or_cancel(delay, &shutdown).await {
                    return;
                }
            }
        }
    }
}

/// Returns true when cancelled.
async fn sleep_or_cancel(d: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = shutdown.cancelled() => true,
    }
}

fn now_ms() -> i64 {
    chrono::Utc::now().timestamp_millis()
}

/// One stream's life. `Ok` only on shutdown.
async fn session(
    ctx: &mut LinkContext,
    mut client: HubClient,
    shutdown: &CancellationToken,
    backoff: &mut Backoff,
    silence: &HubSilence,
) -> std::result::Result<(), String> {
    let sup = ctx.supervisor.clone();
    let (tx, rx) = mpsc::channel::<NestMessage>(512);
    // Reports queued while disconnected are covered by `Register.instances` (read after this,
    // so a change in between is in both).
    ctx.reports.clear();
    let register = Register {
        nest_id: ctx.nest_id.clone(),
        name: ctx.opts.name.clone(),
        labels: ctx.opts.settings.get().labels.into_iter().collect(),
        capacity: ctx.opts.capacity,
        version: agen_shared::version::CRATE_VERSION.to_string(),
        instances: convert::reports(sup.snapshot()),
        fallback_name: ctx.opts.fallback_name.clone(),
        separation: sup.separation().describe(),
        network: sup.network().describe(),
        protocol_version: agen_shared::version::Protocol::spoken().to_string(),
        commit: ctx.opts.commit.clone(),
        cpu_millis: crate::cgroup::host_capacity().0,
        memory_bytes: crate::cgroup::host_capacity().1,
        resources: sup
            .cgroups()
            .map_or_else(|| "not limited".to_string(), |c| c.describe()),
    };
    tx.send(NestMessage {
        msg: Some(NestMsg::Register(register)),
    })
    .await
    .map_err(|_| "stream closed before register".to_string())?;
    let mut inbound = tokio::select! {
        r = client.connect(ReceiverStream::new(rx)) => r.map_err(|s| {
            // A follower Hub names the leader (`agen-leader`): the next attempt goes there.
            if let Some(leader) = s.metadata().get("agen-leader").and_then(|v| v.to_str().ok()) {
                ctx.client_slot.follow_leader(&ctx.opts, leader);
            }
            status_text(&s)
        })?,
        _ = shutdown.cancelled() => return Ok(()),
    };
    let first = tokio::select! {
        m = tokio::time::timeout(REGISTER_TIMEOUT, inbound.message()) => m
            .map_err(|_| "no Registered from the hub within 10s".to_string())?
            .map_err(|s| status_text(&s))?,
        _ = shutdown.cancelled() => return Ok(()),
    };
    let registered = match first {
        Some(HubMessage {
            msg: Some(HubMsg::Registered(r)),
        }) => r,
        Some(other) => return Err(format!("expected Registered first, got {other:?}")),
        None => return Err("the hub closed the stream before Registered".into()),
    };
    backoff.reset();
    silence.heard();
    let interval = match registered.heartbeat_interval_ms {
        0 => DEFAULT_HEARTBEAT,
        ms => Duration::from_millis(u64::from(ms)),
    };
    tracing::info!(hub = %ctx.opts.hub, nest_id = %ctx.nest_id, name = %ctx.opts.name, heartbeat = ?interval, "registered with the hub");
    agen_shared::systemd::status(&format!("connected to the Hub at {}", ctx.opts.hub));
    for id in &registered.stop_instances {
        sup.stop(id, "the hub does not know this instance");
    }
    if let Some(f) = ctx.on_first_registered.take() {
        f();
    }
    ctx.outbox.resend_all();
    // Its settings after every registration (the Hub applies a cordon only when it changed),
    // and again whenever a reload changes them.
    let mut settings = ctx.opts.settings.subscribe();
    settings.mark_changed();

    let mut heartbeat = tokio::time::interval(interval);
    heartbeat.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    heartbeat.tick().await;
    let send = |m: NestMsg| {
        let tx = tx.clone();
        async move {
            tx.send(NestMessage { msg: Some(m) })
                .await
                .map_err(|_| "the stream closed".to_string())
        }
    };
    let mut told_draining = false;
    // Streamed pieces queued before this session are dropped (never resent), and the next
    // batch leaves no sooner than `deltas::SEND_EVERY` after the last one.
    drop(ctx.outbox.deltas.take());
    let mut deltas_due = tokio::time::Instant::now();
    // When the batch of events nobody waits for leaves (none queued: no window).
    let mut window: Option<tokio::time::Instant> = None;
    loop {
        tokio::select! {
            _ = ctx.draining.cancelled(), if !told_draining => {
                told_draining = true;
                let grace_ms = ctx.opts.stop_grace.as_millis() as u64;
                send(NestMsg::Draining(Draining { grace_ms })).await?;
            }
            _ = shutdown.cancelled() => {
                leave(&tx, &mut inbound).await;
                return Ok(());
            }
            Ok(()) = settings.changed() => {
                let now = settings.borrow_and_update().clone();
                send(NestMsg::Settings(NestSettings {
                    labels: now.labels.into_iter().collect(),
                    cordon: now.cordon,
                }))
                .await?;
            }
            _ = heartbeat.tick() => {
                let instances = convert::reports(sup.snapshot());
                send(NestMsg::Heartbeat(Heartbeat { at_ms: now_ms(), instances })).await?;
            }
            Some(report) = ctx.reports.recv() => {
                for report in ctx.reports.coalesce(report) {
                    send(NestMsg::Instance(convert::report(report))).await?;
                }
            }
            // Batching is for events nobody waits for; a waited-for one goes at once, and with
            // it every earlier event of the queue (order is the ledger's guarantee). The window
            // is a deadline of this loop, never a wait inside it: acks and everything else from
            // the Hub are read while it runs.
            _ = ctx.outbox.queued() => {
                if ctx.outbox.urgent() {
                    window = None;
                    send_queued(&ctx.outbox, &tx).await?;
                } else if window.is_none() {
                    window = Some(tokio::time::Instant::now() + ctx.opts.event_batch_window);
                }
            }
            _ = ctx.outbox.urgent_queued() => {
                // A stale wake-up (its event already went with an earlier batch) sends nothing.
                if ctx.outbox.urgent() {
                    window = None;
                    send_queued(&ctx.outbox, &tx).await?;
                }
            }
            _ = async {
                ctx.outbox.deltas.queued().await;
                tokio::time::sleep_until(deltas_due).await;
            } => {
                deltas_due = tokio::time::Instant::now() + crate::deltas::SEND_EVERY;
                let deltas = ctx.outbox.deltas.take();
                if !deltas.is_empty() {
                    send(NestMsg::RunDeltas(convert::run_deltas(deltas))).await?;
                }
            }
            _ = sleep_until_window(window) => {
                window = None;
                send_queued(&ctx.outbox, &tx).await?;
            }
            m = inbound.message() => {
                match m {
                    Ok(Some(HubMessage { msg: Some(msg) })) => {
                        silence.heard();
                        handle(ctx, &client, msg);
                    }
                    Ok(Some(HubMessage { msg: None })) => silence.heard(),
                    Ok(None) => return Err("the hub closed the stream".into()),
                    Err(s) => return Err(status_text(&s)),
                }
            }
        }
    }
}

/// Sends every queued run event, in order, in bounded batches grouped per instance.
/// Streamed pieces queued before an event go first: a turn's pieces reach the Hub before its
/// `model.answered` and the run's `run.finished`.
async fn send_queued(outbox: &Outbox, tx: &mpsc::Sender<NestMessage>) -> Result<(), String> {
    let deltas = outbox.deltas.take();
    if !deltas.is_empty() {
        tx.send(NestMessage {
            msg: Some(NestMsg::RunDeltas(convert::run_deltas(deltas))),
        })
        .await
        .map_err(|_| "the stream closed".to_string())?;
    }
    loop {
        let batch = outbox.take_batch(BATCH_MAX);
        if batch.is_empty() {
            return Ok(());
        }
        for events in batch {
            tx.send(NestMessage {
                msg: Some(NestMsg::RunEvents(convert::run_events(events))),
            })
            .await
            .map_err(|_| "the stream closed".to_string())?;
        }
    }
}

/// Resolves when the batching window ends; never without one.
async fn sleep_until_window(window: Option<tokio::time::Instant>) {
    match window {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Tells the Hub this Nest is stopping on purpose (its instances end as stopped, their runs
/// are handed over at once) and waits briefly for the Hub to end the stream, so the message
/// is not lost with the connection.
async fn leave(tx: &mpsc::Sender<NestMessage>, inbound: &mut tonic::Streaming<HubMessage>) {
    let leaving = NestMessage {
        msg: Some(NestMsg::Leaving(Leaving {
            reason: "shutting down".into(),
        })),
    };
    if tx.send(leaving).await.is_err() {
        return;
    }
    let drained = tokio::time::timeout(LEAVE_TIMEOUT, async {
        while let Ok(Some(_)) = inbound.message().await {}
    })
    .await;
    match drained {
        Ok(()) => tracing::info!("told the hub this nest is leaving"),
        Err(_) => tracing::warn!(
            "the hub did not confirm that this nest is leaving within {LEAVE_TIMEOUT:?}"
        ),
    }
}

fn handle(ctx: &LinkContext, client: &HubClient, msg: HubMsg) {
    let sup = &ctx.supervisor;
    match msg {
        HubMsg::Registered(_) => tracing::debug!("ignoring a second Registered"),
        HubMsg::Place(p) => sup.place(convert::place(p)),
        HubMsg::Stop(s) => sup.stop(&s.instance_id, &s.reason),
        // A run whose assignment cannot be used fails with the reason (the link stays up); a
        // run with a history or a replay starts once they are fetched (`run_context`).
        HubMsg::AssignRun(a) => {
            let a = convert::assigned_run(a);
            match crate::refused_run::unusable(&a) {
                None => crate::run_context::assign(
                    client.clone(),
                    sup.clone(),
                    ctx.outbox.clone(),
                    ctx.fetching.clone(),
                    a,
                ),
                Some(why) => crate::refused_run::refuse(&ctx.outbox, &a, &why),
            }
        }
        HubMsg::CancelRun(c) if c.interrupt => sup.interrupt(&c.run_id, &c.instance_id),
        HubMsg::CancelRun(c) => {
            ctx.fetching.cancel(&c.run_id);
            sup.cancel(&c.run_id, &c.instance_id, &c.reason)
        }
        HubMsg::Ping(p) => {
            if ctx.client_slot.note_hub_ca(&ctx.opts, &p.ca_sha256) {
                // Renew now (the next client is built with the new certificate and CAs).
                let (slot, opts) = (ctx.client_slot.clone(), ctx.opts.clone());
                tokio::spawn(async move {
                    if let Err(e) = slot.get_or_connect(&opts).await {
                        tracing::warn!(
                            "cannot renew the nest certificate for the hub's new CA: {e}"
                        );
                    }
                });
            }
        }
        HubMsg::LogRequest(r) => sup.answer_logs(convert::log_request(r)),
        HubMsg::ApprovalDecided(d) => {
            let (run_id, instance_id, decided) = convert::approval(d);
            sup.deliver_approval(&run_id, &instance_id, decided)
        }
        HubMsg::Ack(a) => {
            ctx.outbox.ack(&a.run_id, a.attempt, a.acked_seq, a.fenced);
            sup.deliver_ack(&a.run_id, a.attempt, a.acked_seq, a.fenced);
        }
    }
}

fn status_text(s: &tonic::Status) -> String {
    match s.code() {
        tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
            format!(
                "the hub refused this nest ({}); check the join token (--join-file) or ask the cluster admin",
                s.message()
            )
        }
        _ => format!("{:?}: {}", s.code(), s.message()),
    }
}
