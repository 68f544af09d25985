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
//! A Nest that has heard nothing from the Hub (pings, acks, anything) for the Hub's announced
//! disconnect grace minus one second cancels every run it holds ([`Supervisor::fence_all`])
//! before the Hub, which loses it after the grace, re-dispatches them.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use agen_proto::v1::hub_message::Msg as HubMsg;
use agen_proto::v1::nest_message::Msg as NestMsg;
use agen_proto::v1::nest_service_client::NestServiceClient;
use agen_proto::v1::{Heartbeat, HubMessage, Leaving, NestMessage, Register, RunEvent, RunEvents};
use tokio::sync::{mpsc, Notify};
use tokio_stream::wrappers::ReceiverStream;
use tokio_util::sync::CancellationToken;
use tonic::service::interceptor::InterceptedService;
use tonic::transport::{Certificate, Channel, ClientTlsConfig, Endpoint, Identity};

use crate::config::{NestError, NestOptions, Result};
use crate::supervisor::backoff::Backoff;
use crate::supervisor::Supervisor;

/// The Nest's gRPC client: its certificate (TLS) or the join token (plaintext) identifies it.
pub type HubClient = NestServiceClient<InterceptedService<Channel, Bearer>>;

/// Heartbeat interval until the Hub says otherwise.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(2);
/// Reconnect back-off bounds (the cap is small so that tests recover quickly).
const RECONNECT_BASE: Duration = Duration::from_millis(200);
const RECONNECT_CAP: Duration = Duration::from_secs(5);
/// Events nobody waits for are gathered this long before a batch is sent.
const BATCH_WINDOW: Duration = Duration::from_millis(5);
/// Events per `RunEvents` message at most.
const BATCH_MAX: usize = 256;
/// How long to wait for `Registered` after opening the stream.
const REGISTER_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a stopping Nest waits for the Hub to confirm `Leaving`.
const LEAVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Adds the join token as the bearer of every request, when there is one to send.
#[derive(Clone)]
pub struct Bearer(Option<tonic::metadata::MetadataValue<tonic::metadata::Ascii>>);

impl tonic::service::Interceptor for Bearer {
    fn call(
        &mut self,
        mut req: tonic::Request<()>,
    ) -> std::result::Result<tonic::Request<()>, tonic::Status> {
        if let Some(v) = &self.0 {
            req.metadata_mut().insert("authorization", v.clone());
        }
        Ok(req)
    }
}

/// Builds the client for `opts.hub`. For `https://` the Hub's CA is read from
/// `<data-dir>/hub-ca.pem` when its hash matches the join token, otherwise fetched from the Hub
/// pinned by that hash and stored; then the Nest's certificate is read from `<data-dir>` or
/// obtained by `Join`. Connects lazily: no network IO besides the CA fetch and `Join`.
pub async fn client(opts: &NestOptions) -> Result<HubClient> {
    let hub = opts.hub.trim_end_matches('/').to_string();
    let bearer: tonic::metadata::MetadataValue<tonic::metadata::Ascii> =
        format!("Bearer {}", opts.join_token.trim())
            .parse()
            .map_err(|_| {
                NestError::JoinToken("it contains characters that cannot go in a header".into())
            })?;
    let endpoint = Endpoint::from_shared(hub.clone())
        .map_err(|e| NestError::HubUrl {
            url: hub.clone(),
            reason: e.to_string(),
        })?
        .connect_timeout(Duration::from_secs(5))
        .http2_keep_alive_interval(Duration::from_secs(5))
        .keep_alive_timeout(Duration::from_secs(5))
        .keep_alive_while_idle(true);
    let endpoint = if hub.starts_with("https://") {
        // Several rustls providers are in the build graph: pick ring for the process (no-op
        // when one is installed already).
        agen_shared::tls::install_crypto_provider();
        let ca = trusted_ca(opts, &hub).await?;
        let mut tls = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(&ca));
        let trust_err = |e: tonic::transport::Error| NestError::Trust {
            url: hub.clone(),
            reason: e.to_string(),
        };
        if let Some((cert, key)) =
            nest_identity(opts, &hub, &ca, endpoint.clone(), tls.clone(), &bearer).await?
        {
            tls = tls.identity(Identity::from_pem(cert, key));
            // The certificate is the Nest's credential from now on.
            return Ok(NestServiceClient::with_interceptor(
                endpoint.tls_config(tls).map_err(trust_err)?.connect_lazy(),
                Bearer(None),
            ));
        }
        endpoint.tls_config(tls).map_err(trust_err)?
    } else if hub.starts_with("http://") {
        endpoint
    } else {
        return Err(NestError::HubUrl {
            url: hub,
            reason: "no http:// or https:// scheme".into(),
        });
    };
    // The same message limit as the Hub's, both ways: the Hub refuses over-limit fields itself.
    Ok(
        NestServiceClient::with_interceptor(endpoint.connect_lazy(), Bearer(Some(bearer)))
            .max_decoding_message_size(agen_proto::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(agen_proto::MAX_MESSAGE_BYTES),
    )
}

/// The Nest's certificate and key (PEM): the stored ones when they are current for this Hub's
/// CA and node id (renewed first, with the Nest's own certificate and key, once two thirds of
/// their lifetime have passed), otherwise a certificate from `Join` with the join token for the
/// Nest's key (kept when there is one: the Hub binds a nest id to its key). `None` when the
/// Hub predates `Join` (it knows the Nest by the join token alone).
async fn nest_identity(
    opts: &NestOptions,
    hub: &str,
    ca_pem: &str,
    endpoint: Endpoint,
    tls_config: ClientTlsConfig,
    bearer: &tonic::metadata::MetadataValue<tonic::metadata::Ascii>,
) -> Result<Option<(String, String)>> {
    use agen_shared::tls;
    let nest_id = crate::config::load_or_create_node_id(&opts.data_dir)?;
    let (cert_path, key_path) = (opts.cert_file(), opts.key_file());
    let trust = |reason: String| NestError::Trust {
        url: hub.to_string(),
        reason,
    };
    let stored_key = std::fs::read_to_string(&key_path).ok();
    if let (Ok(cert), Some(key)) = (std::fs::read_to_string(&cert_path), stored_key.clone()) {
        if tls::nest_cert_is_current(&cert, ca_pem, &nest_id) {
            let due = tls::nest_cert_renew_at(&cert).is_some_and(|at| now_ms() / 1000 >= at);
            if !due {
                return Ok(Some((cert, key)));
            }
            let own = endpoint
                .clone()
                .tls_config(tls_config.clone().identity(Identity::from_pem(&cert, &key)))
                .map_err(|e| trust(e.to_string()))?;
            let csr_pem =
                tls::nest_csr_for_key(&key, &nest_id).map_err(|e| trust(e.to_string()))?;
            let mut renewer = NestServiceClient::with_interceptor(own.connect_lazy(), Bearer(None));
            let request = agen_proto::v1::JoinRequest {
                nest_id: nest_id.clone(),
                name: opts.name.clone(),
                csr_pem,
            };
            match renewer.join(request).await {
                Ok(r) => {
                    let renewed = r.into_inner().cert_pem;
                    if tls::nest_cert_is_current(&renewed, ca_pem, &nest_id) {
                        tls::write_private(&cert_path, renewed.as_bytes())
                            .map_err(|e| trust(e.to_string()))?;
                        tracing::info!(nest_id = %nest_id, path = %cert_path.display(), "renewed the nest certificate");
                        return Ok(Some((renewed, key)));
                    }
                    tracing::warn!(
                        "the hub returned an unusable renewed certificate; keeping the current one"
                    );
                }
                Err(status) => {
                    tracing::warn!(code = ?status.code(), message = %status.message(), "cannot renew the nest certificate; keeping the current one");
                }
            }
            return Ok(Some((cert, key)));
        }
        tracing::warn!(path = %cert_path.display(), "stored nest certificate is not valid for this hub and node id; joining again");
    }
    let (key, csr_pem) = match stored_key {
        Some(key) => {
            let csr = tls::nest_csr_for_key(&key, &nest_id).map_err(|e| trust(e.to_string()))?;
            (key, csr)
        }
        None => tls::nest_key_and_csr(&nest_id).map_err(|e| trust(e.to_string()))?,
    };
    let joining = endpoint
        .tls_config(tls_config)
        .map_err(|e| trust(e.to_string()))?;
    let mut joiner =
        NestServiceClient::with_interceptor(joining.connect_lazy(), Bearer(Some(bearer.clone())));
    let request = agen_proto::v1::JoinRequest {
        nest_id: nest_id.clone(),
        name: opts.name.clone(),
        csr_pem,
    };
    match joiner.join(request).await {
        Ok(response) => {
            let cert = response.into_inner().cert_pem;
            if !tls::nest_cert_is_current(&cert, ca_pem, &nest_id) {
                return Err(trust(format!(
                    "join: the hub returned a certificate that is not for nest {nest_id} or not signed by the pinned CA"
                )));
            }
            tls::write_private(&key_path, key.as_bytes()).map_err(|e| trust(e.to_string()))?;
            tls::write_private(&cert_path, cert.as_bytes()).map_err(|e| trust(e.to_string()))?;
            tracing::info!(nest_id = %nest_id, path = %cert_path.display(), "joined the hub: stored the nest certificate");
            Ok(Some((cert, key)))
        }
        Err(status) if status.code() == tonic::Code::Unimplemented => {
            tracing::warn!("the hub predates Join; connecting with the join token alone");
            Ok(None)
        }
        Err(status) => Err(trust(format!(
            "join failed ({:?}): {}",
            status.code(),
            status.message()
        ))),
    }
}

async fn trusted_ca(opts: &NestOptions, hub: &str) -> Result<String> {
    use agen_shared::tls;
    let token =
        tls::JoinToken::parse(&opts.join_token).map_err(|e| NestError::JoinToken(e.to_string()))?;
    let path = opts.ca_file();
    if let Ok(pem) = std::fs::read_to_string(&path) {
        if tls::ca_pem_sha256(&pem).ok().as_deref() == Some(token.ca_sha256.as_str()) {
            return Ok(pem);
        }
        tracing::warn!(path = %path.display(), "stored hub CA does not match the join token; fetching it again");
    }
    let pem = crate::hub_client::fetch_pinned_ca(hub, &token.ca_sha256)
        .await
        .map_err(|e| NestError::Trust {
            url: hub.to_string(),
            reason: e.to_string(),
        })?;
    tls::write_private(&path, pem.as_bytes()).map_err(|e| NestError::Trust {
        url: hub.to_string(),
        reason: e.to_string(),
    })?;
    tracing::info!(path = %path.display(), "trusting the hub CA pinned by the join token");
    Ok(pem)
}

/// Run events not yet acknowledged by the Hub, by `(run_id, attempt)` then seq, with the
/// instance that produced them.
#[derive(Default)]
pub struct Outbox {
    state: Mutex<OutboxState>,
    notify: Notify,
    /// Woken when a waited-for event is queued (it ends a batching window early).
    urgent_notify: Notify,
}

#[derive(Default)]
struct OutboxState {
    unacked: BTreeMap<(String, u32), BTreeMap<u64, (String, RunEvent)>>,
    /// Keys of events not yet sent on the current stream, in order.
    unsent: VecDeque<(String, u32, u64)>,
    /// Whether an unsent event is waited for (`sync`): then the batch goes at once.
    urgent: bool,
}

impl Outbox {
    /// Queues one event (from `instance_id`) for sending.
    pub fn push(&self, instance_id: &str, event: RunEvent) {
        {
            let mut st = self.lock();
            let key = (event.run_id.clone(), event.attempt);
            let seq = event.seq;
            let slot = st.unacked.entry(key.clone()).or_default();
            let sync = event.sync;
            if slot.insert(seq, (instance_id.to_string(), event)).is_none() {
                st.unsent.push_back((key.0, key.1, seq));
                st.urgent |= sync;
            }
            if sync {
                self.urgent_notify.notify_one();
            }
        }
        self.notify.notify_one();
    }

    /// Forgets every event of `(run_id, attempt)` with seq <= `acked_seq` (all of them when fenced).
    pub fn ack(&self, run_id: &str, attempt: u32, acked_seq: u64, fenced: bool) {
        let mut st = self.lock();
        let key = (run_id.to_string(), attempt);
        if let Some(slot) = st.unacked.get_mut(&key) {
            if fenced {
                slot.clear();
            } else {
                slot.retain(|seq, _| *seq > acked_seq);
            }
            if slot.is_empty() {
                st.unacked.remove(&key);
            }
        }
    }

    /// Marks every unacked event unsent (a new stream starts).
    pub fn resend_all(&self) {
        {
            let mut st = self.lock();
            let keys: VecDeque<_> = st
                .unacked
                .iter()
                .flat_map(|((run, attempt), slot)| {
                    slot.keys().map(move |seq| (run.clone(), *attempt, *seq))
                })
                .collect();
            st.unsent = keys;
        }
        self.notify.notify_one();
    }

    /// Up to `max` events to send, grouped as `RunEvents` per instance (in order).
    pub fn take_batch(&self, max: usize) -> Vec<RunEvents> {
        let mut st = self.lock();
        st.urgent = false;
        let mut out: Vec<RunEvents> = Vec::new();
        let mut n = 0;
        while n < max {
            let Some((run, attempt, seq)) = st.unsent.pop_front() else {
                break;
            };
            let Some((instance, ev)) = st.unacked.get(&(run, attempt)).and_then(|s| s.get(&seq))
            else {
                continue;
            };
            match out.last_mut() {
                Some(last) if last.instance_id == *instance => last.events.push(ev.clone()),
                _ => out.push(RunEvents {
                    instance_id: instance.clone(),
                    events: vec![ev.clone()],
                }),
            }
            n += 1;
        }
        out
    }

    /// Whether an event someone waits for is queued (no batching window then).
    pub fn urgent(&self) -> bool {
        self.lock().urgent
    }

    /// Number of events waiting for an ack.
    pub fn pending(&self) -> usize {
        self.lock().unacked.values().map(|s| s.len()).sum()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, OutboxState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// When the link last heard from the Hub, and the disconnect grace the Hub announced.
#[derive(Default)]
pub struct HubSilence {
    last_heard_ms: AtomicI64,
    grace_ms: AtomicU64,
}

impl HubSilence {
    fn heard(&self) {
        self.last_heard_ms.store(now_ms(), Ordering::SeqCst);
    }

    /// How long the Nest may go without a word from the Hub before it fences itself (`None`
    /// until a Hub announced its grace).
    fn limit(&self) -> Option<Duration> {
        match self.grace_ms.load(Ordering::SeqCst) {
            0 => None,
            g => Some(Duration::from_millis(g.saturating_sub(1000).max(500))),
        }
    }

    /// Fences every run whenever the Hub has been silent past the limit, until `shutdown`.
    async fn watch(self: Arc<Self>, sup: Arc<Supervisor>, shutdown: CancellationToken) {
        let mut tick = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = shutdown.cancelled() => return,
            }
            let Some(limit) = self.limit() else { continue };
            let silent = now_ms() - self.last_heard_ms.load(Ordering::SeqCst);
            if silent > limit.as_millis() as i64 {
                sup.fence_all(&format!(
                    "no word from the hub for {:.1}s (the hub re-dispatches runs after its disconnect grace)",
                    silent as f64 / 1000.0
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
    pub outbox: Arc<Outbox>,
    /// Called once, after the first successful registration (sd-notify READY).
    pub on_first_registered: Option<Box<dyn FnOnce() + Send>>,
}

/// Keeps the link up until `shutdown`: connect, register, serve, and on any failure back off
/// and start again.
pub async fn run(mut ctx: LinkContext, client_slot: Arc<ClientSlot>, shutdown: CancellationToken) {
    let mut backoff = Backoff::new(RECONNECT_BASE, RECONNECT_CAP);
    let silence = Arc::new(HubSilence::default());
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
                tracing::warn!(hub = %ctx.opts.hub, "{e}; retrying in {delay:?}");
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
                tracing::warn!(hub = %ctx.opts.hub, "hub link down: {reason}; reconnecting in {delay:?}");
                if sleep_or_cancel(delay, &shutdown).await {
                    return;
                }
            }
        }
    }
}

/// The Hub client, built on first use (an `https://` Hub needs its CA fetched first) and again
/// once its certificate is due for renewal, with the renewal time (unix seconds).
#[derive(Default)]
pub struct ClientSlot(tokio::sync::Mutex<Option<(HubClient, Option<i64>)>>);

impl ClientSlot {
    pub async fn get_or_connect(&self, opts: &NestOptions) -> Result<HubClient> {
        let mut slot = self.0.lock().await;
        if let Some((c, renew_at)) = slot.as_ref() {
            if renew_at.is_none_or(|at| now_ms() / 1000 < at) {
                return Ok(c.clone());
            }
        }
        let c = client(opts).await?;
        let renew_at = std::fs::read_to_string(opts.cert_file())
            .ok()
            .and_then(|pem| agen_shared::tls::nest_cert_renew_at(&pem));
        *slot = Some((c.clone(), renew_at));
        Ok(c)
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
    let register = Register {
        nest_id: ctx.nest_id.clone(),
        name: ctx.opts.name.clone(),
        labels: ctx.opts.labels.clone().into_iter().collect(),
        capacity: ctx.opts.capacity,
        version: env!("CARGO_PKG_VERSION").to_string(),
        instances: sup.snapshot(),
        fallback_name: ctx.opts.fallback_name.clone(),
    };
    // Reports queued while disconnected are covered by `Register.instances`.
    let _ = sup.take_changed();
    tx.send(NestMessage {
        msg: Some(NestMsg::Register(register)),
    })
    .await
    .map_err(|_| "stream closed before register".to_string())?;
    let response = tokio::select! {
        r = client.connect(ReceiverStream::new(rx)) => r.map_err(|s| status_text(&s))?,
        _ = shutdown.cancelled() => return Ok(()),
    };
    let mut inbound = response.into_inner();
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
    silence
        .grace_ms
        .store(u64::from(registered.disconnect_grace_ms), Ordering::SeqCst);
    let interval = match registered.heartbeat_interval_ms {
        0 => DEFAULT_HEARTBEAT,
        ms => Duration::from_millis(u64::from(ms)),
    };
    tracing::info!(hub = %ctx.opts.hub, nest_id = %ctx.nest_id, name = %ctx.opts.name, heartbeat = ?interval, "registered with the hub");
    for id in &registered.stop_instances {
        sup.stop(id, "the hub does not know this instance");
    }
    if let Some(f) = ctx.on_first_registered.take() {
        f();
    }
    ctx.outbox.resend_all();

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
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => {
                leave(&tx, &mut inbound).await;
                return Ok(());
            }
            _ = heartbeat.tick() => {
                send(NestMsg::Heartbeat(Heartbeat { at_ms: now_ms(), instances: sup.snapshot() })).await?;
            }
            _ = sup.changed_notify().notified() => {
                for report in sup.take_changed() {
                    send(NestMsg::Instance(report)).await?;
                }
            }
            _ = ctx.outbox.notify.notified() => {
                // Batching is for events nobody waits for; a waited-for one goes at once, and
                // with it every earlier event of the queue (order is the ledger's guarantee).
                if !ctx.outbox.urgent() {
                    tokio::select! {
                        _ = tokio::time::sleep(BATCH_WINDOW) => {}
                        _ = ctx.outbox.urgent_notify.notified() => {}
                    }
                }
                loop {
                    let batch = ctx.outbox.take_batch(BATCH_MAX);
                    if batch.is_empty() {
                        break;
                    }
                    for events in batch {
                        send(NestMsg::RunEvents(events)).await?;
                    }
                }
            }
            m = inbound.message() => {
                match m {
                    Ok(Some(HubMessage { msg: Some(msg) })) => {
                        silence.heard();
                        handle(ctx, msg);
                    }
                    Ok(Some(HubMessage { msg: None })) => silence.heard(),
                    Ok(None) => return Err("the hub closed the stream".into()),
                    Err(s) => return Err(status_text(&s)),
                }
            }
        }
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

fn handle(ctx: &LinkContext, msg: HubMsg) {
    let sup = &ctx.supervisor;
    match msg {
        HubMsg::Registered(_) => tracing::debug!("ignoring a second Registered"),
        HubMsg::Place(p) => sup.place(p),
        HubMsg::Stop(s) => sup.stop(&s.instance_id, &s.reason),
        HubMsg::AssignRun(a) => match crate::refused_run::unusable(&a) {
            None => sup.assign(a),
            Some(why) => {
                tracing::warn!(run = %a.run_id, task = %a.task_id, "{why}; the run fails, the link stays up");
                if let Some(e) = crate::refused_run::failed_event(&a, &why) {
                    ctx.outbox.push(&a.instance_id, e);
                }
            }
        },
        HubMsg::CancelRun(c) => sup.cancel(&c.run_id, &c.instance_id, &c.reason),
        HubMsg::Ping(_) => {}
        HubMsg::LogRequest(r) => sup.answer_logs(r),
        HubMsg::ApprovalDecided(d) => sup.deliver_approval(
            &d.run_id,
            &d.instance_id,
            agen_shared::run::ApprovalDecided {
                call_id: d.call_id,
                approved: d.approved,
                reason: d.reason,
                by: d.by,
            },
        ),
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

#[cfg(test)]
mod tests {
    use super::*;

    fn ev(run: &str, attempt: u32, seq: u64) -> RunEvent {
        RunEvent {
            run_id: run.into(),
            attempt,
            seq,
            kind: "log".into(),
            ..Default::default()
        }
    }

    fn seqs(batch: &[RunEvents]) -> Vec<(String, String, u64)> {
        batch
            .iter()
            .flat_map(|b| {
                b.events
                    .iter()
                    .map(move |e| (b.instance_id.clone(), e.run_id.clone(), e.seq))
            })
            .collect()
    }

    #[test]
    fn events_are_sent_once_and_resent_after_a_reconnect_until_acked() {
        let o = Outbox::default();
        o.push("i1", ev("r1", 1, 1));
        o.push("i1", ev("r1", 1, 2));
        o.push("i2", ev("r2", 1, 1));
        o.push("i1", ev("r1", 1, 2)); // duplicate: ignored
        let first = o.take_batch(10);
        assert_eq!(
            seqs(&first),
            vec![
                ("i1".into(), "r1".into(), 1),
                ("i1".into(), "r1".into(), 2),
                ("i2".into(), "r2".into(), 1)
            ]
        );
        assert_eq!(first.len(), 2, "grouped per instance");
        assert!(
            o.take_batch(10).is_empty(),
            "sent events are not sent again on the same stream"
        );

        o.ack("r1", 1, 1, false);
        o.resend_all();
        assert_eq!(
            seqs(&o.take_batch(10)),
            vec![("i1".into(), "r1".into(), 2), ("i2".into(), "r2".into(), 1)]
        );

        o.ack("r2", 1, 0, true); // fenced: everything of that attempt goes
        o.ack("r1", 1, 2, false);
        assert_eq!(o.pending(), 0);
    }

    #[test]
    fn batches_are_bounded() {
        let o = Outbox::default();
        for seq in 1..=5 {
            o.push("i", ev("r", 1, seq));
        }
        assert_eq!(o.take_batch(2)[0].events.len(), 2);
        assert_eq!(o.take_batch(10)[0].events.len(), 3);
    }
}
