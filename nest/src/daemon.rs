//! The Nest daemon's entry point, [`run`]: prepares the data dir, reaps leftovers of a previous
//! run, listens on the instance socket, keeps the Hub link up, and on shutdown stops every
//! instance before returning.
//!
//! Invariants: shutdown is "cancel, then wait under a grace period" and says whether it was
//! graceful; nothing this Nest started outlives `run` (instances get SIGTERM, then SIGKILL;
//! whatever a crashed predecessor left is SIGKILLed at start); READY is sent to systemd
//! (`NOTIFY_SOCKET`) once the instance socket listens, even while the Hub is down (the link
//! reports in `STATUS=`), `STOPPING=1` when shutdown begins.

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::bundles::BundleCache;
use crate::config::{load_or_create_node_id, prepare_data_dir, Result};
pub use crate::config::{NestError, NestOptions};
use crate::hub_client::ClientSlot;
use crate::hub_link::{self, LinkContext};
use crate::outbox::Outbox;
use crate::socket;
use crate::supervisor::children::Children;
use crate::supervisor::{Supervisor, STOP_GRACE};

/// Runs a Nest until `shutdown` is cancelled. Several Nests may run in one process (`agen up
/// --nests N`), each with its own data dir.
pub async fn run(opts: NestOptions, shutdown: CancellationToken) -> Result<(), NestError> {
    let mut opts = opts;
    opts.validate()?;
    prepare_data_dir(&opts.data_dir)?;
    let nest_id = load_or_create_node_id(&opts.data_dir)?;
    let children = Arc::new(Children::open(&opts.children_file()));
    for rec in children.reap_leftovers() {
        tracing::warn!(what = %rec.what, pgid = rec.pgid, "killed a leftover of a previous run of this nest");
    }
    let separation = crate::separation::Separation::resolve_in(
        &opts.run_as,
        &opts.data_dir,
        opts.run_root.as_deref(),
    )
    .map_err(|e| NestError::Config(e.to_string()))?;
    if separation.is_on() {
        // Separated instances reach the socket in the run root and run an agen they can run.
        opts.socket_dir = Some(separation.socket_dir());
        opts.agen_bin = separation
            .runnable_bin(&opts.agen_bin)
            .map_err(|e| NestError::Config(e.to_string()))?;
    }
    let network = Arc::new(crate::netns::Network::resolve(&opts, separation.is_on()));
    if separation.is_on() && !network.is_on() {
        tracing::warn!(
            "network isolation is off: {}; instances share the host's network and loopback",
            network.describe()
        );
    }
    let opts = Arc::new(opts);
    let socket_path = opts.socket_path();
    // Separated instances run as other uids: the socket lets them connect (0666; who may say
    // hello is proven by the spawn secret and SO_PEERCRED), else it stays 0600.
    let socket_mode = if separation.is_on() { 0o666 } else { 0o600 };
    let listener =
        socket::listen(&socket_path, socket_mode).map_err(|source| NestError::Socket {
            path: socket_path.clone(),
            source,
        })?;

    // The Nest's own life: not a child of `shutdown`, which starts the drain (runs finish,
    // no new ones come); `own` ends once that is over.
    let own = CancellationToken::new();
    let client = Arc::new(ClientSlot::default());
    let draining = CancellationToken::new();
    let outbox = Arc::new(Outbox::default());
    let bundles = Arc::new(BundleCache::new(opts.clone(), client.clone()));
    let (supervisor, reports) = Supervisor::new(
        opts.clone(),
        children,
        bundles,
        outbox.clone(),
        Arc::new(separation),
        network,
        own.child_token(),
    );
    let cgroups = Arc::new(
        tokio::task::spawn_blocking(crate::cgroup::Cgroups::detect)
            .await
            .unwrap_or_else(|e| crate::cgroup::Cgroups::Rlimits(e.to_string())),
    );
    supervisor.set_cgroups(cgroups.clone());
    let serve = tokio::spawn(supervisor.clone().serve(listener));
    if let Some(at) = opts.metrics_listen {
        let metrics_listener = tokio::net::TcpListener::bind(at).await.map_err(|e| {
            NestError::Config(format!(
                "cannot listen on {at} for metrics: {e}; pick another --metrics-listen address"
            ))
        })?;
        let metrics = crate::metrics::NestMetrics::new();
        let (sup, out) = (supervisor.clone(), outbox.clone());
        let render: agen_net::metrics_http::Render = Arc::new(move || metrics.render(&sup, &out));
        let stop = own.clone();
        let serving = own.clone();
        let access = agen_net::metrics_http::Access {
            token: opts.metrics_token.as_deref().map(Arc::from),
            // Its instances and their tool servers never read it.
            refused_uids: supervisor
                .separation()
                .instance_uids()
                .into_iter()
                .collect(),
            ready: Some(Arc::new(move || !serving.is_cancelled())),
        };
        tokio::spawn(agen_net::metrics_http::serve_with(
            metrics_listener,
            render,
            access,
            async move { stop.cancelled().await },
        ));
        tracing::info!(addr = %at, "serving metrics at /metrics");
    }

    tracing::info!(nest_id = %nest_id, name = %opts.name, hub = %opts.hub, data_dir = %opts.data_dir.display(), capacity = opts.capacity, separation = %supervisor.separation().describe(), network = %supervisor.network().describe(), resources = %cgroups.describe(), "nest starting");
    let ctx = LinkContext {
        opts: opts.clone(),
        nest_id,
        supervisor: supervisor.clone(),
        reports,
        outbox: outbox.clone(),
        fetching: Default::default(),
        on_first_registered: None,
        draining: draining.clone(),
        client_slot: client.clone(),
    };
    // Ready once the instance socket listens, whether or not the Hub answers (the link says
    // how it is doing in STATUS= lines).
    agen_shared::systemd::ready(&format!("connecting to the Hub at {}", opts.hub));
    let link = tokio::spawn(hub_link::run(ctx, client, own.clone()));
    shutdown.cancelled().await;
    // Shutdown has begun: systemd hears it now, not after the drain.
    agen_shared::systemd::stopping();
    drain(&supervisor, &outbox, &draining, opts.stop_grace).await;
    own.cancel();
    let _ = link.await;

    tracing::info!(
        instances = supervisor.len(),
        "nest shutting down: stopping instances"
    );
    own.cancel();
    let graceful = supervisor.shutdown(STOP_GRACE).await;
    let _ = serve.await;
    cgroups.cleanup();
    let _ = std::fs::remove_file(&socket_path);
    if graceful {
        tracing::info!("nest stopped gracefully");
    } else {
        tracing::warn!("nest stopped: some instances had to be killed after the grace period");
    }
    Ok(())
}

/// The drain of a Nest told to stop: the Hub is told (no new runs, no placements), and the
/// runs it holds may finish and have their events acknowledged, for at most `grace`; what is
/// left is handed over when the Nest leaves.
async fn drain(
    supervisor: &Supervisor,
    outbox: &Outbox,
    draining: &CancellationToken,
    grace: std::time::Duration,
) {
    draining.cancel();
    let busy = || supervisor.active_runs() > 0 || outbox.pending() > 0;
    if !busy() {
        return;
    }
    agen_shared::systemd::status("draining: waiting for running runs to finish");
    tracing::info!(runs = supervisor.active_runs(), grace = ?grace, "nest draining: running runs may finish, no new ones come");
    let deadline = tokio::time::Instant::now() + grace;
    while busy() && tokio::time::Instant::now() < deadline {
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
    if busy() {
        tracing::warn!(
            runs = supervisor.active_runs(),
            "nest drain: the stop grace ran out; the runs left are handed over"
        );
    } else {
        tracing::info!("nest drained: every run finished");
    }
}
