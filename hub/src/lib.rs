//! The Agen Hub: the control plane of a fleet. It keeps the desired state (deployments,
//! bundles by digest), the durable record of every task and run (sled), schedules instances
//! onto Nests, detects lost Nests, queues tasks and dispatches runs.
//!
//! Reading order: [`config`] (options), [`error`] (one error type, one mapping to gRPC status),
//! `server/` (the gRPC edge; the only module that knows protobuf), `scheduler/` (pure placement
//! decisions), `store/` (sled behind a small trait), [`nodes`] (Nest links and liveness),
//! [`limits`] (the table of input limits and its checks),
//! [`core`] (the state behind one lock and its behaviour by concern: bundles, deployments,
//! nests and liveness, reconcile, tasks (submit, dispatch, events, outcome, query), leases,
//! lifecycle, cordon, approvals, delegates, artifacts),
//! [`metrics`] (Prometheus metrics, `--metrics-listen`), [`logs`] (log requests in flight between `ReadLogs` and the Nests' `SendLogs`),
//! [`secrets`] (the secret store, sealed at rest), `listener` (the one TLS port: gRPC over
//! h2, HTTP/1.1 too), [`a2a`] (every deployment an A2A agent on that port).
//!
//! Data dir (`--data-dir`, default `$AGEN_DATA_DIR/hub` else `~/.local/share/agen/hub`):
//! `db/` (sled, and `db/events.log`: run and task events), `tls/ca.pem` + `tls/ca.key` (0600; created on first start, the server
//! certificate is re-issued from them at every start), `admin-token` (0600; the cluster admin's
//! bearer for `AgenService`), `join-token` (0600; `agen1.<sha256 of the CA cert DER>.<secret>`,
//! a join token with no expiry and unlimited uses until revoked; only its hash is in `db/`),
//! `secret.key` (0600; created on first start, seals the values of the secret store kept in
//! `db/`; losing it makes every stored secret unreadable).
//!
//! Everything in it is private to the Hub's user: folders 0700, files 0600, created that way
//! (`agen hub` and `agen up` also set umask 077, which covers sled's own files); a start on a
//! data dir with looser modes tightens them and logs each one.
//!
//! Invariants: the scheduler does no IO; every state change is in the store before anyone is
//! told; TLS unless explicitly plaintext on loopback; every `AgenService` call carries a live
//! token (the cluster admin's or an API token, [`tokens`]) and is authorized for its namespace
//! and role, and every mutating one is audited; `NestService.Join` needs a live join token (or,
//! to renew, the Nest's own certificate); on a TLS Hub every other `NestService` call needs a
//! client certificate issued by `Join` whose key is the one its id is bound to (the Hub
//! identifies the Nest by it, never by what the Nest says); health and reflection need none.

pub mod a2a;
pub mod config;
pub mod conn_gate;
pub mod core;
pub mod cron;
pub mod error;
mod follower;
pub mod ha;
pub mod limits;
mod listener;
pub mod logs;
pub mod metrics;
pub mod model;
pub mod nodes;
pub mod otlp;
pub mod repair;
pub mod role;
pub mod rpc_metrics;
pub mod scheduler;
pub mod secrets;
mod server;
pub mod store;
pub mod store_metrics;
pub mod tls_live;
pub mod tokens;
pub mod trace;
pub mod webhooks;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use agen_shared::tls::{self, JoinToken};
use tokio_util::sync::CancellationToken;

pub use config::{default_data_dir, HubOptions};

/// How long a stopping Hub waits for open streams (watchers, uploads) to finish.
const SHUTDOWN_GRACE: std::time::Duration = std::time::Duration::from_secs(10);
pub use error::{HubError, Result};

/// A running Hub.
#[derive(Debug)]
pub struct HubHandle {
    /// The address actually bound (listen port 0 picks one).
    pub addr: SocketAddr,
    /// `https://127.0.0.1:PORT` (or `http://` when plaintext), for clients and Nests.
    pub url: String,
    /// The CA certificate clients trust (`<data-dir>/tls/ca.pem`).
    pub ca_file: PathBuf,
    /// The admin token (`<data-dir>/admin-token`).
    pub admin_token: String,
    /// The Nest join token (`agen1.<ca sha256>.<secret>`).
    pub join_token: String,
    /// `<data-dir>/join-token`.
    pub join_token_file: PathBuf,
    /// The URL other machines use (the primary address when listening on all addresses).
    pub nest_url: String,
    /// Whether the Hub serves plaintext.
    pub plaintext: bool,
    /// Where metrics are served (`--metrics-listen`, port 0 resolved).
    pub metrics_addr: Option<SocketAddr>,
    /// The task and audit retentions in force: [`core::retention::LiveRetention::set`] changes
    /// them while the Hub runs (`agen hub` on SIGHUP).
    pub retention: Arc<core::retention::LiveRetention>,
    /// The leader epoch this Hub holds (several Hubs on PostgreSQL), `None` for a Hub alone.
    pub leader_epoch: Option<u64>,
    /// Set when another Hub took the lease over and this one stopped for it
    /// ([`ha::EXIT_DEPOSED`]).
    pub deposed: Arc<std::sync::atomic::AtomicBool>,
    serving: tokio::task::JoinHandle<Result<()>>,
    shutdown: CancellationToken,
}

impl HubHandle {
    /// The `agen nest` command that joins this Hub: it reads the join token from its file, so
    /// the secret is neither printed nor on a command line.
    pub fn nest_command(&self) -> String {
        format!(
            "agen nest --hub {} --join-file {}",
            self.nest_url,
            self.join_token_file.display()
        )
    }

    /// Waits until the Hub has stopped (after the shutdown token is cancelled), gracefully.
    pub async fn wait(self) -> Result<()> {
        match self.serving.await {
            Ok(r) => r,
            Err(e) => Err(HubError::Serve(format!("the hub server task failed: {e}"))),
        }
    }

    /// Cancels the Hub's shutdown token (the one passed to [`start`]) and waits.
    pub async fn stop(self) -> Result<()> {
        self.shutdown.cancel();
        self.wait().await
    }
}

/// The connections the Hub serves: TLS (handshaken by [`listener`]) or plaintext on loopback.
enum Incoming {
    Tls(TlsIncoming),
    Plain(PlainIncoming),
}

type TlsIncoming = tokio_stream::wrappers::ReceiverStream<
    std::io::Result<listener::Cut<tokio_rustls::server::TlsStream<tokio::net::TcpStream>>>,
>;
type PlainIncoming =
    tokio_stream::wrappers::ReceiverStream<std::io::Result<listener::Cut<tokio::net::TcpStream>>>;

/// The connections a follower serves, given back when it leads.
enum Back {
    Tls(tokio::task::JoinHandle<TlsIncoming>),
    Plain(tokio::task::JoinHandle<PlainIncoming>),
}

/// Reads the token in `path`, or writes a new one produced by `make` (mode 0600).
fn load_or_create_token(path: &Path, make: impl FnOnce() -> String) -> Result<String> {
    match std::fs::read_to_string(path) {
        Ok(t) if !t.trim().is_empty() => Ok(t.trim().to_string()),
        Ok(_) => Err(HubError::Config(format!(
            "{} is empty; delete it to generate a new token",
            path.display()
        ))),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let token = make();
            tls::write_private(path, format!("{token}\n").as_bytes())?;
            Ok(token)
        }
        Err(e) => Err(HubError::Io {
            path: path.to_path_buf(),
            action: "cannot read token",
            source: e,
        }),
    }
}

/// What `/metrics` and `/readyz` answer once the Hub serves (set when it leads).
type MetricsSlot = Arc<
    std::sync::OnceLock<(
        agen_net::metrics_http::Render,
        agen_net::metrics_http::Ready,
    )>,
>;

/// Serves `--metrics-listen` from the start: a follower's has `agen_hub_is_leader 0` only (and
/// is ready while it reaches the database); the leader's every metric, once set in the slot.
async fn serve_metrics(
    at: SocketAddr,
    opts: &HubOptions,
    role: Arc<role::Role>,
    shutdown: &CancellationToken,
) -> Result<(SocketAddr, MetricsSlot)> {
    let listener = tokio::net::TcpListener::bind(at).await.map_err(|e| {
        HubError::Config(format!(
            "cannot listen on {at} for metrics: {e}; pick another --metrics-listen address"
        ))
    })?;
    let bound = listener
        .local_addr()
        .map_err(|e| HubError::Serve(format!("cannot read the metrics address: {e}")))?;
    let slot: MetricsSlot = Arc::default();
    let (render_slot, ready_slot) = (slot.clone(), slot.clone());
    let render: agen_net::metrics_http::Render = Arc::new(move || match render_slot.get() {
        Some((render, _)) => render(),
        None => metrics::follower_text(),
    });
    let serving = shutdown.clone();
    let access = agen_net::metrics_http::Access {
        token: opts.metrics_token.as_deref().map(Arc::from),
        // Instances and tool servers of a Nest on this host (`--refuse-uids`).
        refused_uids: opts.refuse_uids.clone(),
        ready: Some(Arc::new(move || {
            !serving.is_cancelled()
                && match ready_slot.get() {
                    Some((_, ready)) => ready(),
                    // A follower serves (forwards) while it reaches the database; a Hub
                    // about to lead is not ready until its core is loaded.
                    None => {
                        let now = role.now();
                        !now.leader && now.db_ok
                    }
                }
        })),
    };
    let stop = shutdown.clone();
    tokio::spawn(agen_net::metrics_http::serve_with(
        listener,
        render,
        access,
        async move { stop.cancelled().await },
    ));
    tracing::info!(addr = %bound, "serving metrics at /metrics");
    Ok((bound, slot))
}

/// Tells systemd the Hub is ready (`READY=1`, `STATUS=listening at URL`) when
/// `NOTIFY_SOCKET` is set (no-op otherwise). The reconcile loop sends `WATCHDOG=1` and the
/// Nest count in `STATUS=`; shutdown sends `STOPPING=1`.
pub fn notify_ready(url: &str) {
    agen_shared::systemd::ready(&format!("listening at {url}"));
}

/// Starts a Hub: creates or loads its data dir (store, CA, tokens), binds, spawns serving and
/// the reconcile loop, and returns once it is listening. It stops when `shutdown` is cancelled.
pub async fn start(opts: HubOptions, shutdown: CancellationToken) -> Result<HubHandle> {
    agen_shared::tls::install_crypto_provider();
    opts.validate()?;
    let data_dir = opts.data_dir.clone();
    // 0700 from the start; a data dir left readable by others is tightened (and logged).
    agen_shared::private::prepare_data_dir(&data_dir).map_err(HubError::io(
        &data_dir,
        "cannot create or make private the hub data dir",
    ))?;

    // Several Hubs on PostgreSQL: the identity comes from the database, and this Hub follows
    // (serving clients by forwarding, `follower`) until it holds the leader lease (every write
    // of it fenced by the epoch).
    let deposed = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut ha_store: Option<(Arc<store::PgStore>, ha::HaOptions)> = None;
    if let (Some(url), Some(ha_opts)) = (&opts.store, &opts.ha) {
        let (url, shown) = (url.clone(), store::pg::shown(url));
        let pg = Arc::new(
            tokio::task::spawn_blocking(move || store::PgStore::open(&url))
                .await
                .map_err(|e| HubError::Serve(format!("opening the store: {e}")))??,
        );
        let (p, key, dir, names) = (
            pg.clone(),
            ha_opts.identity_key_file.clone(),
            data_dir.clone(),
            opts.certificate_names(),
        );
        tokio::task::spawn_blocking(move || ha::sync_identity(&p, &shown, &key, &dir, &names))
            .await
            .map_err(|e| HubError::Serve(format!("reading the identity: {e}")))??;
        ha_store = Some((pg, ha_opts.clone()));
    }

    let admin_file = data_dir.join("admin-token");
    let admin_token = load_or_create_token(&admin_file, tls::random_secret)?;

    let extra = opts.certificate_names();
    let hub_tls = tls::load_or_create_hub_tls(&data_dir.join("tls"), &extra)?;
    let live_tls = tls_live::LiveTls::new(data_dir.join("tls"), extra.clone(), hub_tls.clone())?;
    let join_token_file = data_dir.join("join-token");
    let join_token = load_or_create_token(&join_token_file, || {
        JoinToken::generate(&hub_tls.ca_sha256).to_string()
    })?;
    let join = JoinToken::parse(&join_token).map_err(|e| {
        HubError::Config(format!(
            "{}: {e}; delete the file to generate a new one",
            join_token_file.display()
        ))
    })?;
    if join.ca_sha256 != hub_tls.ca_sha256 {
        return Err(HubError::Config(format!(
            "{} names a different CA than {}; delete the join token file to generate one for this CA",
            join_token_file.display(),
            hub_tls.ca_file.display()
        )));
    }

    let listener = tokio::net::TcpListener::bind(opts.listen)
        .await
        .map_err(|e| {
            HubError::Config(format!(
                "cannot listen on {}: {e}; pick another --listen address",
                opts.listen
            ))
        })?;
    let addr = listener
        .local_addr()
        .map_err(|e| HubError::Serve(format!("cannot read the bound address: {e}")))?;
    let host = if addr.ip().is_unspecified() {
        "127.0.0.1".to_string()
    } else {
        addr.ip().to_string()
    };
    let host = if host.contains(':') {
        format!("[{host}]")
    } else {
        host
    };
    let scheme = if opts.insecure_plaintext {
        "http"
    } else {
        "https"
    };
    let url = format!("{scheme}://{host}:{}", addr.port());
    let nest_url = match extra.iter().find(|n| {
        n.parse::<std::net::IpAddr>()
            .is_ok_and(|ip| !ip.is_loopback())
    }) {
        Some(ip) if addr.ip().is_unspecified() => {
            let ip = if ip.contains(':') {
                format!("[{ip}]")
            } else {
                ip.clone()
            };
            format!("{scheme}://{ip}:{}", addr.port())
        }
        _ => url.clone(),
    };
    // Who may hold a connection before authenticating (the TLS listener, the token checks).
    let gate = conn_gate::ConnGate::refusing_uids(opts.limits.conn, opts.refuse_uids.clone());
    let tls_config = if opts.insecure_plaintext {
        None
    } else {
        tokio::spawn(live_tls.clone().watch(shutdown.child_token()));
        Some(live_tls.clone())
    };
    // Cancelled once the server is done: every connection still open is cut.
    let cut = CancellationToken::new();
    let mut incoming = match tls_config {
        Some(config) => Incoming::Tls(listener::tls_incoming(
            listener,
            config,
            shutdown.child_token(),
            cut.clone(),
            gate.clone(),
        )),
        None => Incoming::Plain(listener::plain_incoming(
            listener,
            shutdown.child_token(),
            cut.clone(),
            gate.clone(),
        )),
    };
    let role = role::Role::new(role::RoleNow {
        leader: ha_store.is_none(),
        db_ok: true,
        ..Default::default()
    });
    let full_metrics = match opts.metrics_listen {
        Some(at) => Some(serve_metrics(at, &opts, role.clone(), &shutdown).await?),
        None => None,
    };

    let mut leading: Option<(Arc<store::PgStore>, u64)> = None;
    // What a leader gives up when it stops: (store, holder, epoch).
    let mut release: Option<(Arc<store::PgStore>, String, u64)> = None;
    if let Some((pg, ha_opts)) = ha_store {
        let holder = ha::holder_id();
        let advertise = ha_opts.advertise_url.clone().unwrap_or_else(|| url.clone());
        // Until it leads, the Hub serves its port as a follower.
        let following = CancellationToken::new();
        let forward = follower::Forward::new(
            role.clone(),
            advertise.clone(),
            (!opts.insecure_plaintext)
                .then(|| std::fs::read_to_string(&hub_tls.ca_file).ok())
                .flatten(),
        );
        let routes = follower::router(forward, role.clone(), following.clone());
        let back = match incoming {
            Incoming::Tls(s) => Back::Tls(follower::serve_until(s, routes, following.clone())),
            Incoming::Plain(s) => Back::Plain(follower::serve_until(s, routes, following.clone())),
        };
        tracing::info!(%url, advertise = %advertise, "hub follower listening (forwarding clients to the leader)");
        agen_shared::systemd::ready(&format!("follower listening at {url}"));
        let led = ha::campaign(
            pg.clone(),
            &holder,
            &advertise,
            ha_opts.leader_lease,
            &role,
            &shutdown,
        )
        .await;
        following.cancel();
        let Some(epoch) = led? else {
            return Err(HubError::Serve(
                "stopped while following another Hub".into(),
            ));
        };
        let taken =
            |e: tokio::task::JoinError| HubError::Serve(format!("the follower's port: {e}"));
        incoming = match back {
            Back::Tls(h) => Incoming::Tls(h.await.map_err(taken)?),
            Back::Plain(h) => Incoming::Plain(h.await.map_err(taken)?),
        };
        ha::keep(
            pg.clone(),
            holder.clone(),
            epoch,
            ha_opts.leader_lease,
            shutdown.clone(),
            deposed.clone(),
            role.clone(),
        );
        release = Some((pg.clone(), holder, epoch));
        leading = Some((pg, epoch));
    }
    let leader_epoch = leading.as_ref().map(|l| l.1);

    let store: Arc<dyn store::Store> = match (&opts.store, leading) {
        (_, Some((pg, _))) => pg,
        (Some(url), None) => {
            let url = url.clone();
            Arc::new(
                tokio::task::spawn_blocking(move || store::PgStore::open(&url))
                    .await
                    .map_err(|e| HubError::Serve(format!("opening the store: {e}")))??,
            )
        }
        (None, None) => Arc::new(store::SledStore::open(&data_dir.join("db"))?),
    };
    let db = store::Db::new(store);
    let secret_key = secrets::SecretKey::load_or_create(&data_dir.join("secret.key"))?;
    let tokens = tokens::Tokens::open(db.clone(), &admin_token)?;
    // On a plaintext Hub the join token is a Nest's credential on every call (no certificates),
    // so it cannot expire there; with TLS a joined Nest uses its certificate from then on.
    let join_ttl =
        (!opts.insecure_plaintext && !opts.join_token_ttl.is_zero()).then_some(opts.join_token_ttl);
    tokens.ensure_bootstrap_join(&join_token, join_ttl)?;
    let nest_identities = tokens::nests::NestIdentities::open(db.clone())?;
    let core = core::Core::open(opts.clone(), db, secret_key)?;
    let live_retention = core.retention.clone();
    core.resume_after_restore().await?;

    // Default: the URL other machines use (the primary address when listening on all).
    let public_url = opts.public_url.clone().unwrap_or_else(|| nest_url.clone());
    let a2a_routes = a2a::router(core.clone(), tokens.clone(), &public_url, gate.clone());
    let routes = server::routes(
        core.clone(),
        tokens,
        gate.clone(),
        nest_identities,
        (!opts.insecure_plaintext).then(|| live_tls.clone()),
        live_tls.clone(),
        public_url,
        role.clone(),
    )
    .await?;
    // The A2A HTTP API beside the gRPC services (tonic's routes are an axum router).
    let routes = tonic::service::Routes::from(routes.into_axum_router().merge(a2a_routes));
    // One port, two protocols: gRPC over h2 and the A2A HTTP API over h2 or HTTP/1.1 (the TLS
    // listener offers both by ALPN; plaintext connections are told apart by their preface).
    let router = tonic::transport::Server::builder()
        .accept_http1(true)
        .http2_keepalive_interval(Some(std::time::Duration::from_secs(10)))
        .http2_keepalive_timeout(Some(std::time::Duration::from_secs(20)))
        .layer(server::malformed_request_layer::<tonic::body::Body>())
        .layer(rpc_metrics::Layer)
        .add_routes(routes);
    let metrics_addr = match full_metrics {
        Some((bound, slot)) => {
            let metrics = metrics::HubMetrics::new();
            metrics.follow(core.clone());
            let (render_core, render_gate, render_role) =
                (core.clone(), gate.clone(), role.clone());
            let render: agen_net::metrics_http::Render = Arc::new(move || {
                metrics.connections_refused(&render_gate.refused_by_reason());
                metrics.set_leader(render_role.now().leader);
                metrics.render(&render_core)
            });
            let ready_core = core.clone();
            let ready: agen_net::metrics_http::Ready =
                Arc::new(move || ready_core.store_broken().is_none());
            let _ = slot.set((render, ready));
            Some(bound)
        }
        None => None,
    };
    if let Some(otlp) = opts.otlp.clone() {
        otlp::follow(otlp, core.clone())?;
    }
    let reconciler = tokio::spawn(core.clone().run_reconciler(shutdown.child_token()));
    let retention = tokio::spawn(core.clone().run_retention(shutdown.child_token()));
    tokio::spawn(core.clone().run_schedules(shutdown.child_token()));
    tokio::spawn(core.refusals.clone().run(shutdown.child_token()));
    tokio::spawn(core.clone().run_webhooks(shutdown.child_token()));
    if let Some(schedule) = opts.snapshots.clone() {
        tokio::spawn(core.clone().run_snapshots(schedule, shutdown.child_token()));
    }
    let stop = shutdown.clone();
    let serving = tokio::spawn(async move {
        let signal = {
            let stop = stop.clone();
            async move { stop.cancelled().await }
        };
        let mut serve: std::pin::Pin<
            Box<
                dyn std::future::Future<Output = std::result::Result<(), tonic::transport::Error>>
                    + Send,
            >,
        > = match incoming {
            Incoming::Tls(s) => Box::pin(router.serve_with_incoming_shutdown(s, signal)),
            Incoming::Plain(s) => Box::pin(router.serve_with_incoming_shutdown(s, signal)),
        };
        // The stop is announced here, not from tonic's shutdown-signal future: tonic drops that
        // future unpolled when the incoming stream ends first, and the TLS stream ends on this
        // same token, so it lost `STOPPING=1` (and the cut of the Nest streams) in about a
        // third of the stops. `biased`: a stop that ended the server is still a stop.
        let stopped_first = tokio::select! {
            biased;
            _ = stop.cancelled() => None,
            r = &mut serve => Some(r),
        };
        let result = match stopped_first {
            Some(r) => r.map_err(|e| HubError::Serve(e.to_string())),
            None => {
                agen_shared::systemd::stopping();
                // End every Nest stream so that graceful shutdown does not wait on them.
                core.close_links();
                tokio::select! {
                    r = &mut serve => r.map_err(|e| HubError::Serve(e.to_string())),
                    _ = tokio::time::sleep(SHUTDOWN_GRACE) => {
                        tracing::warn!("open streams did not finish within {SHUTDOWN_GRACE:?}; stopping anyway (not graceful)");
                        Ok(())
                    }
                }
            }
        };
        // Whatever connection is left is cut: none outlives the server.
        cut.cancel();
        let _ = reconciler.await;
        let _ = retention.await;
        if let Err(e) = core.db.flush().await {
            tracing::error!(error = %e, "final store flush failed");
        }
        // Nothing writes after this: a task still holding the core gets an error, not a write
        // the Hub never flushed.
        core.db.close();
        // A leader that stops gives its lease up (unless deposed): a follower leads at once.
        if let Some((pg, holder, epoch)) = release {
            if !pg.deposed() {
                match tokio::task::spawn_blocking(move || pg.release_lease(&holder, epoch)).await {
                    Ok(Ok(true)) => tracing::info!(epoch, "gave the leader lease up"),
                    Ok(Ok(false)) => {}
                    Ok(Err(e)) => tracing::warn!(epoch, "cannot give the leader lease up: {e}"),
                    Err(e) => tracing::warn!(epoch, "cannot give the leader lease up: {e}"),
                }
            }
        }
        tracing::info!("hub stopped");
        result
    });
    tracing::info!(%url, data_dir = %data_dir.display(), plaintext = opts.insecure_plaintext, "hub listening");
    Ok(HubHandle {
        addr,
        url,
        nest_url,
        ca_file: hub_tls.ca_file,
        admin_token,
        join_token,
        join_token_file,
        plaintext: opts.insecure_plaintext,
        metrics_addr,
        retention: live_retention,
        leader_epoch,
        deposed,
        serving,
        shutdown,
    })
}
