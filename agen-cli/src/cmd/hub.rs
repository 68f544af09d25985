//! `agen hub`: the Hub alone, in the foreground. Creates its data dir (store, CA, admin and
//! join tokens) on first start, writes the client config when none exists, prints the
//! `agen nest` command that joins it, notifies systemd when ready, and stops gracefully on
//! SIGINT/SIGTERM.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use agen_shared::client_config::ClientConfig;
use anyhow::Context;
use tokio_util::sync::CancellationToken;

/// Arguments of `agen hub`.
#[derive(Debug, clap::Args)]
pub struct Args {
    #[command(subcommand)]
    pub action: Option<Action>,
    /// Read flag values from this TOML file: keys are the long flags (`nest-ttl = "10s"`,
    /// `tls-name = ["hub.example"]`); flags and AGEN_HUB_<FLAG> variables win over it; SIGHUP
    /// reads it again and applies what can change live (log-level, task-retention,
    /// audit-retention)
    #[arg(long, value_name = "FILE", global = true)]
    pub config: Option<PathBuf>,
    /// Log level of the Hub's own lines (error, warn, info, debug, trace, or directives such as
    /// agen=debug,h2=info) [default: RUST_LOG, else info]; SIGHUP applies a new one
    #[arg(long, value_name = "LEVEL")]
    pub log_level: Option<String>,
    /// The configuration these flags, variables and file make (set by `daemon_config`)
    #[arg(skip)]
    pub effective: crate::daemon_config::Effective,
    /// Log format on stderr: text (colour only on a terminal; syslog priorities under systemd) or json
    #[arg(long, env = "AGEN_LOG_FORMAT", default_value = "text")]
    pub log_format: agen_shared::telemetry::LogFormat,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464)
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// A file holding the bearer token /metrics needs (Prometheus `authorization:
    /// credentials_file`); /healthz and /readyz never need it
    #[arg(long, value_name = "FILE")]
    pub metrics_token_file: Option<std::path::PathBuf>,
    /// Refuse connections (to the gRPC/A2A port and /metrics) from local processes of these uids:
    /// the instances and tool servers of Nests on this host, so give it their --run-uids
    /// (comma-separated or repeated ranges; `none` refuses no uid)
    #[arg(
        long,
        value_name = "FIRST-LAST",
        default_value = "61000-61999",
        value_delimiter = ','
    )]
    pub refuse_uids: Vec<String>,
    /// Export each finished task's trace over OTLP to this collector URL (e.g.
    /// http://127.0.0.1:4317); also OTEL_EXPORTER_OTLP_{TRACES_,}ENDPOINT, _PROTOCOL
    /// (grpc or http/protobuf), _HEADERS and _CERTIFICATE (the CA file of an https:// collector)
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Where the Hub keeps its state, CA and tokens [default: $AGEN_DATA_DIR/hub, else ~/.local/share/agen/hub]
    #[arg(long, global = true)]
    pub data_dir: Option<PathBuf>,
    /// Keep the Hub's state in PostgreSQL (postgres://user:password@host:port/db) instead of the
    /// local store in the data dir; the schema is migrated at start [default: the local store]
    #[arg(
        long,
        global = true,
        value_name = "URL",
        env = "AGEN_HUB_STORE",
        hide_env_values = true
    )]
    pub store: Option<String>,
    /// Several Hubs on one --store postgres://: the file sealing the identity they share in
    /// the database (CA, admin and join tokens, secret key); the same file on every Hub (created
    /// when missing). Turns on the leader lease: one Hub leads, the others wait as followers
    #[arg(long, value_name = "PATH", env = "AGEN_HUB_IDENTITY_KEY_FILE")]
    pub identity_key_file: Option<PathBuf>,
    /// How long the leader's lease lasts without a renewal (renewed every third of it); a
    /// follower leads at most this long after the leader died
    #[arg(long, value_name = "DURATION", default_value = "5s", value_parser = crate::cmd::parse_duration)]
    pub leader_lease: Duration,
    /// The URL this Hub is reached at, stored as the leader's when it leads (with
    /// --identity-key-file) [default: its listen address]
    #[arg(long, value_name = "URL")]
    pub advertise_url: Option<String>,
    /// The URL A2A clients reach this Hub at (https://host:port); the agent cards' interface
    /// URLs start with it [default: https://<listen address>; the primary address when
    /// listening on all addresses]
    #[arg(long, value_name = "URL", env = "AGEN_HUB_PUBLIC_URL")]
    pub public_url: Option<String>,
    /// Serve each deployment's public A2A agent card without a token; false: a card needs the
    /// same token as the agent (401 otherwise)
    #[arg(long, value_name = "BOOL", default_value_t = true, action = clap::ArgAction::Set)]
    pub a2a_public_cards: bool,
    /// Show the bundle digest and the namespace/deployment in the public A2A cards too (by
    /// default only GetExtendedAgentCard, with a token, shows them)
    #[arg(long)]
    pub a2a_card_details: bool,
    /// Also serve each deployment at an origin of its own, https://<deployment>.<namespace>.DOMAIN
    /// (its card at /.well-known/agent-card.json, JSON-RPC at /); point a wildcard DNS name at
    /// the Hub and give its certificate the names (--tls-name '*.<namespace>.DOMAIN')
    #[arg(long, value_name = "DOMAIN")]
    pub a2a_domain: Option<String>,
    /// How long a blocking A2A SendMessage waits for its task to end or need input before it
    /// answers with the task as it is (clients poll with GetTask)
    #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = crate::cmd::parse_duration)]
    pub a2a_send_wait: Duration,
    /// Longest a web console sign-in lasts (at most 12h); it ends sooner when its token is
    /// revoked, rotated or expires
    #[arg(long, value_name = "DURATION", default_value = "12h", value_parser = crate::cmd::parse_duration)]
    pub console_session_max: Duration,
    /// An internal address webhooks may reach (loopback, private, link-local are refused
    /// otherwise); HOST or HOST:PORT, repeatable (e.g. --webhook-allow 127.0.0.1:8080)
    #[arg(long, value_name = "HOST[:PORT]")]
    pub webhook_allow: Vec<agen_hub::webhooks::Allow>,
    /// Address to listen on
    #[arg(long, env = "AGEN_HUB_LISTEN", default_value = agen_hub::config::DEFAULT_LISTEN)]
    pub listen: SocketAddr,
    /// Serve plaintext gRPC instead of TLS (only on a loopback address)
    #[arg(long)]
    pub insecure_plaintext: bool,
    /// How long a silent Nest stays alive before its instances are replaced elsewhere
    #[arg(long, default_value = "10s", value_parser = crate::cmd::parse_duration)]
    pub nest_ttl: Duration,
    /// How often Nests heartbeat
    #[arg(long, default_value = "2s", value_parser = crate::cmd::parse_duration)]
    pub heartbeat_interval: Duration,
    /// Another name (host name or IP address) Nests and clients use to reach the Hub, for its
    /// TLS certificate (repeatable)
    #[arg(long = "tls-name", value_name = "NAME")]
    pub tls_names: Vec<String>,
    /// How long a Nest whose stream closed may take to reconnect before its runs resume elsewhere
    #[arg(long, default_value = "3s", value_parser = crate::cmd::parse_duration)]
    pub nest_disconnect_grace: Duration,
    /// The --nest-lease the Nests run with (how long a Nest that hears from no Hub keeps its
    /// runs): the Hub refuses to start unless it exceeds the leader lease plus the Nests'
    /// reconnect time (5s)
    #[arg(long, default_value = "30s", value_parser = crate::cmd::parse_duration)]
    pub nest_lease: Duration,
    /// Refuse Nests whose instances run without uid separation (as the Nest's own user:
    /// --run-as-self, or a Nest not run as root)
    #[arg(long)]
    pub require_uid_separation: bool,
    /// How long a dispatched run may take to start before it is dispatched again
    #[arg(long, default_value = "30s", value_parser = crate::cmd::parse_duration)]
    pub run_start_deadline: Duration,
    /// Longest task input (bytes, or with KiB/MiB)
    #[arg(long, default_value = "1MiB", value_parser = agen_hub::limits::parse_size)]
    pub max_input_bytes: usize,
    /// Most labels on a task, a Nest or a deployment selector
    #[arg(long, default_value_t = 64)]
    pub max_labels: usize,
    /// Longest label value (bytes, or with KiB/MiB)
    #[arg(long, default_value = "1KiB", value_parser = agen_hub::limits::parse_size)]
    pub max_label_value_bytes: usize,
    /// Longest conversation key (bytes)
    #[arg(long, default_value = "256", value_parser = agen_hub::limits::parse_size)]
    pub max_conversation_key_bytes: usize,
    /// History quota of one conversation: a submit to a conversation over it is refused
    #[arg(long, default_value = "32MiB", value_parser = agen_hub::limits::parse_size)]
    pub max_history_bytes: usize,
    /// Bytes queued for one Nest before it counts as not reading and is disconnected
    #[arg(long, default_value = "64MiB", value_parser = agen_hub::limits::parse_size)]
    pub nest_queue_bytes: usize,
    /// Artifact storage quota of one namespace (distinct contents)
    #[arg(long, default_value = "500MB", value_parser = agen_hub::limits::parse_size)]
    pub max_artifact_namespace_bytes: usize,
    /// Artifact storage of all namespaces together
    #[arg(long, default_value = "10GB", value_parser = agen_hub::limits::parse_size)]
    pub max_artifact_total_bytes: usize,
    /// Longest a client may take to finish its TLS handshake
    #[arg(long, default_value = "10s", value_parser = crate::cmd::parse_duration)]
    pub handshake_timeout: Duration,
    /// A connection that has not authenticated (a Nest certificate, or a request with a valid
    /// token) within this long is closed
    #[arg(long, default_value = "10s", value_parser = crate::cmd::parse_duration)]
    pub unauthenticated_timeout: Duration,
    /// Longest an authenticated A2A request body may take to arrive
    #[arg(long, default_value = "30s", value_parser = crate::cmd::parse_duration)]
    pub body_timeout: Duration,
    /// Connections from one address that have not authenticated yet; more are closed at once
    #[arg(long, default_value_t = 64)]
    pub max_unauthenticated_per_address: usize,
    /// Connections that have not authenticated yet, from all addresses
    #[arg(long, default_value_t = 1024)]
    pub max_unauthenticated: usize,
    /// Connections in all (Nests and authenticated clients included)
    #[arg(long, default_value_t = 16384)]
    pub max_connections: usize,
    /// Open streams of one kind (WatchTask, WatchDeployments, WatchNests, logs follow, A2A SSE)
    /// per token
    #[arg(long, default_value_t = 256)]
    pub max_streams_per_token: usize,
    /// Open streams of one kind in all
    #[arg(long, default_value_t = 8192)]
    pub max_streams: usize,
    /// The deepest delegation tree (call_agent/start_agent children) any bundle may have: a
    /// bundle's limits.maxDelegationDepth above it is capped here
    #[arg(long, default_value_t = 5)]
    pub max_delegation_depth: u32,
    /// Nests connected at once; one more is refused at registration (it retries with back-off)
    #[arg(long, default_value_t = 10_000)]
    pub max_nests: usize,
    /// Instances placed on one Nest, whatever capacity the Nest declares
    #[arg(long, default_value_t = 1000)]
    pub max_instances_per_nest: u32,
    /// Tasks waiting to start per deployment; a submit past it is refused (RESOURCE_EXHAUSTED)
    #[arg(long, default_value_t = 10_000)]
    pub max_queued_tasks: usize,
    /// Remove finished tasks, their run logs and the artifacts no other task refers to this
    /// long after they finished
    #[arg(long, default_value = "30d", value_parser = crate::cmd::parse_duration)]
    pub task_retention: Duration,
    /// Remove audit records this long after they were written
    #[arg(long, default_value = "400d", value_parser = crate::cmd::parse_duration)]
    pub audit_retention: Duration,
    /// The built-in join token (<data-dir>/join-token) expires this long after it is made (or
    /// after the first start that finds it without an expiry); Nests that joined never need it
    /// again; `agen tokens create --join` makes more; 0 = never (not recommended)
    #[arg(long, default_value = "24h", value_parser = crate::cmd::parse_duration)]
    pub join_token_ttl: Duration,
    /// Hide stopped and lost instances and lost Nests from `agen ps --all` and `agen nests`
    /// this long after they ended (`--ended`/`--all` still show them)
    #[arg(long, default_value = "1h", value_parser = crate::cmd::parse_duration)]
    pub hide_ended_after: Duration,
    /// Write a sealed snapshot this often while serving (e.g. 1h); needs --snapshot-dir and
    /// --snapshot-key-file
    #[arg(long, value_name = "D", value_parser = crate::cmd::parse_duration)]
    pub snapshot_every: Option<Duration>,
    /// Keep the newest N scheduled snapshots; older ones are removed
    #[arg(long, value_name = "N", default_value_t = 7)]
    pub snapshot_keep: usize,
    /// Where scheduled snapshots go (best on another disk than --data-dir)
    #[arg(long, value_name = "DIR")]
    pub snapshot_dir: Option<PathBuf>,
    /// The snapshot key (32 random bytes, made by `agen hub snapshot-key new FILE`); keep it
    /// apart from the snapshots
    #[arg(long, value_name = "PATH", env = "AGEN_SNAPSHOT_KEY_FILE")]
    pub snapshot_key_file: Option<PathBuf>,
}

/// What `agen hub` does instead of running the Hub.
#[derive(Debug, clap::Subcommand)]
pub enum Action {
    /// Print the configuration `agen hub` would run with (these flags, AGEN_HUB_* variables,
    /// --config FILE, defaults) as TOML, each value's source in a comment; secrets never shown
    Config,
    /// Write a consistent copy of the running Hub's state (store, CA, tokens, secret key) to
    /// FILE, sealed with the snapshot key (0600)
    Snapshot {
        /// Where to write the snapshot
        file: PathBuf,
        #[command(flatten)]
        key: super::hub_snapshot::KeyArgs,
        #[command(flatten)]
        client: crate::client::ClientArgs,
    },
    /// Bring a snapshot back into the data dir of a stopped Hub (the store it replaces is
    /// kept beside it as db.replaced-<time>); the restored Hub starts a new store epoch
    Restore {
        /// A file written by `agen hub snapshot` or `--snapshot-every`
        file: PathBuf,
        #[command(flatten)]
        key: super::hub_snapshot::KeyArgs,
    },
    /// Check a snapshot file whole (its key, every frame, its digest) without restoring it;
    /// exit 0 when it can be restored, 1 when not
    VerifySnapshot {
        /// A file written by `agen hub snapshot` or `--snapshot-every`
        file: PathBuf,
        #[command(flatten)]
        key: super::hub_snapshot::KeyArgs,
    },
    /// Snapshot keys: `agen hub snapshot-key new [FILE]`
    SnapshotKey {
        #[command(subcommand)]
        action: super::hub_snapshot::KeyAction,
    },
    /// Check that the store holds everything it acknowledged (read-only): a stopped Hub's from
    /// its files in --data-dir, a running one through the Hub (admin). Exit 0 intact, 1 damaged
    Verify {
        #[command(flatten)]
        client: crate::client::ClientArgs,
    },
    /// Make a stopped Hub's damaged store servable again: keep every intact record, end the
    /// tasks whose history is damaged failed (history_lost), and write a report file
    /// (<data-dir>/repair-<unix ms>.txt)
    Repair,
    /// Roll the Hub's CA without downtime: a new CA signs from now on while the previous one
    /// stays trusted (the running Hub picks it up within a second, Nests renew their
    /// certificates by themselves); prints the new join token. `--finish` then stops trusting
    /// the previous CA
    RotateCa {
        /// End the rotation: certificates signed only by the previous CA are refused from now on
        #[arg(long)]
        finish: bool,
    },
    /// Write COUNT succeeded tasks into a stopped Hub's store (--data-dir, or --store), as the
    /// Hub writes them (record and events): a benchmark aid for the task list at size
    SeedTasks {
        /// How many tasks
        count: u64,
        /// Their deployment (need not exist)
        #[arg(long, default_value = "seeded")]
        deployment: String,
        /// Their namespace
        #[arg(long, default_value = "default")]
        namespace: String,
    },
    /// Several Hubs on the PostgreSQL store named by --store: which one leads (its advertised
    /// URL), the fencing epoch and how long its lease has left. Exit 0 while a Hub holds a live
    /// lease, 1 when none does
    Status,
    /// Bring the schema of the PostgreSQL store named by --store up to this build's version
    /// (versioned, forward-only; `agen hub` also does it at start). Exit 0 when it is current,
    /// 1 when --check finds migrations to apply, 2 when the schema is newer than this build
    Migrate {
        /// Only report the schema version; change nothing
        #[arg(long)]
        check: bool,
        /// Copy a stopped Hub's store instead: from this data dir or postgres:// URL …
        #[arg(long, value_name = "DATA_DIR|URL", requires = "to")]
        from: Option<String>,
        /// … into this (empty) postgres:// URL or data dir; counts every table on both sides
        #[arg(long, value_name = "URL|DATA_DIR", requires = "from")]
        to: Option<String>,
    },
}

impl Args {
    /// The limit table these flags set.
    pub fn limits(&self) -> agen_hub::limits::Limits {
        agen_hub::limits::Limits {
            input_bytes: self.max_input_bytes,
            labels: self.max_labels,
            label_value_bytes: self.max_label_value_bytes,
            conversation_key_bytes: self.max_conversation_key_bytes,
            history_bytes: self.max_history_bytes,
            nest_queue_bytes: self.nest_queue_bytes,
            artifact_namespace_bytes: self.max_artifact_namespace_bytes as u64,
            artifact_total_bytes: self.max_artifact_total_bytes as u64,
            conn: agen_hub::conn_gate::ConnLimits {
                handshake_timeout: self.handshake_timeout,
                unauthenticated_timeout: self.unauthenticated_timeout,
                body_timeout: self.body_timeout,
                max_unauthenticated_per_address: self.max_unauthenticated_per_address,
                max_unauthenticated: self.max_unauthenticated,
                max_connections: self.max_connections,
            },
            streams: agen_hub::core::streams::StreamLimits {
                per_token: self.max_streams_per_token,
                total: self.max_streams,
            },
            max_delegation_depth: self.max_delegation_depth,
            max_nests: self.max_nests,
            max_instances_per_nest: self.max_instances_per_nest,
            max_queued_tasks: self.max_queued_tasks,
        }
    }
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    if let Some(Action::Config) = args.action {
        crate::out::line(args.effective.to_toml().trim_end());
        return Ok(0);
    }
    if let Some(action) = args.action {
        let data_dir = args
            .data_dir
            .clone()
            .unwrap_or_else(agen_hub::default_data_dir);
        if let Action::RotateCa { finish } = action {
            return super::hub_rotate_ca::run(&data_dir, finish);
        }
        if let Action::SeedTasks {
            count,
            deployment,
            namespace,
        } = action
        {
            let spec = agen_hub::core::tasks::seed::SeedSpec {
                namespace,
                deployment,
                count,
                batches: 10,
            };
            return super::hub_store::seed(args.store.as_deref(), &data_dir, spec).await;
        }
        if let Action::Status = action {
            return super::hub_store::status(args.store.as_deref()).await;
        }
        if let Action::Migrate { check, from, to } = action {
            if let (Some(from), Some(to)) = (from, to) {
                return super::hub_store::copy(&from, &to).await;
            }
            return super::hub_store::migrate(args.store.as_deref(), check).await;
        }
        return run_offline(action, &data_dir).await;
    }
    // Everything this daemon and its children create is private to its user (umask 077).
    agen_shared::private::restrict_umask();
    crate::cmd::raise_open_file_limit();
    if let Err(e) = agen_shared::telemetry::filter_for(args.log_level.as_deref(), "info") {
        eprintln!("error: --log-level: {e}");
        return Ok(64);
    }
    let log_filter =
        agen_shared::telemetry::init_reloadable(args.log_level.as_deref(), "info", args.log_format);
    // Installed before the Hub starts: a SIGHUP is never the default kill.
    let reloads = super::reload::Reloads::listen()?;
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(agen_hub::default_data_dir);
    let opts = agen_hub::HubOptions {
        data_dir: data_dir.clone(),
        listen: args.listen,
        insecure_plaintext: args.insecure_plaintext,
        nest_ttl: args.nest_ttl,
        heartbeat_interval: args.heartbeat_interval.min(args.nest_ttl),
        tls_names: args.tls_names.clone(),
        nest_disconnect_grace: args.nest_disconnect_grace,
        nest_lease: args.nest_lease,
        require_uid_separation: args.require_uid_separation,
        run_start_deadline: args.run_start_deadline,
        limits: args.limits(),
        metrics_listen: args.metrics_listen,
        metrics_token: match args
            .metrics_token_file
            .as_deref()
            .map(crate::cmd::read_token_file)
        {
            None => None,
            Some(Ok(t)) => Some(t),
            Some(Err(e)) => {
                eprintln!("error: {e}");
                return Ok(64);
            }
        },
        refuse_uids: match refuse_uids(&args.refuse_uids) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("error: --refuse-uids: {e}");
                return Ok(64);
            }
        },
        public_url: args.public_url.clone(),
        task_retention: args.task_retention,
        audit_retention: args.audit_retention,
        join_token_ttl: args.join_token_ttl,
        hide_ended_after: args.hide_ended_after,
        snapshots: match snapshot_schedule(&args) {
            Ok(s) => s,
            Err(e) => {
                eprintln!("error: {e}");
                return Ok(64);
            }
        },
        a2a: agen_hub::config::A2aOptions {
            public_cards: args.a2a_public_cards,
            card_details: args.a2a_card_details,
            domain: args.a2a_domain.clone(),
            send_wait: args.a2a_send_wait,
        },
        console_session_max: args.console_session_max,
        webhook_allow: args.webhook_allow.clone(),
        store: args.store.clone(),
        ha: args
            .identity_key_file
            .clone()
            .map(|identity_key_file| agen_hub::ha::HaOptions {
                identity_key_file,
                leader_lease: args.leader_lease,
                advertise_url: args.advertise_url.clone(),
            }),
        otlp: match agen_hub::config::OtlpOptions::resolve(args.otlp_endpoint.as_deref(), |k| {
            std::env::var(k).ok()
        }) {
            Ok(o) => o,
            Err(e) => {
                eprintln!("error: {e}");
                return Ok(64);
            }
        },
    };
    if let Err(e) = opts.validate() {
        eprintln!("error: {e}");
        return Ok(64);
    }
    let shutdown = CancellationToken::new();
    crate::cmd::cancel_on_signals(shutdown.clone());
    let hub = match agen_hub::start(opts, shutdown.clone()).await {
        Ok(hub) => hub,
        Err(e) => match e.store_damaged() {
            Some(report) => return Ok(crate::cmd::hub_store::refuse(report)),
            None => return Err(anyhow::Error::new(e).context("cannot start the Hub")),
        },
    };

    let client_cfg = ClientConfig {
        hub: Some(hub.url.clone()),
        hubs: Vec::new(),
        ca_file: if hub.plaintext {
            None
        } else {
            Some(hub.ca_file.clone())
        },
        token: Some(hub.admin_token.clone()),
    };
    crate::cmd::write_client_config(&client_cfg, &data_dir)?;
    eprintln!(
        "agen hub: listening at {}; data in {}",
        hub.url,
        data_dir.display()
    );
    eprintln!("web console: {}/ui/ (sign in with an API token)", hub.url);
    eprintln!("join a Nest with:\n  {}", hub.nest_command());
    agen_hub::notify_ready(&hub.url);
    reloads.spawn(
        args.effective.clone(),
        super::reload::Live {
            log: log_filter,
            retention: Some(hub.retention.clone()),
            nest: None,
        },
    );

    let deposed = hub.deposed.clone();
    hub.wait().await.context("the Hub stopped with an error")?;
    if deposed.load(std::sync::atomic::Ordering::SeqCst) {
        eprintln!("agen hub: stopped: another Hub took the leader lease over");
        return Ok(crate::exit::code::DEPOSED);
    }
    eprintln!("agen hub: stopped");
    Ok(0)
}

/// `--refuse-uids` values as ranges (`none`: no uid).
fn refuse_uids(values: &[String]) -> Result<Vec<std::ops::RangeInclusive<u32>>, String> {
    values
        .iter()
        .filter(|v| !v.trim().eq_ignore_ascii_case("none"))
        .map(|v| agen_hub::config::parse_uid_range(v))
        .collect()
}

/// The `--snapshot-every` schedule of `agen hub`, checked.
fn snapshot_schedule(args: &Args) -> anyhow::Result<Option<agen_hub::config::SnapshotSchedule>> {
    let Some(every) = args.snapshot_every else {
        return Ok(None);
    };
    let dir = args.snapshot_dir.clone().context(
        "--snapshot-every needs --snapshot-dir DIR (where the snapshots go, best on another disk)",
    )?;
    let key_file = args.snapshot_key_file.clone().context(
        "--snapshot-every needs --snapshot-key-file PATH (or AGEN_SNAPSHOT_KEY_FILE); make a key with `agen hub snapshot-key new FILE`",
    )?;
    Ok(Some(agen_hub::config::SnapshotSchedule {
        every,
        keep: args.snapshot_keep,
        dir,
        key_file,
    }))
}

/// The offline actions of `agen hub` (snapshots, verify, repair).
async fn run_offline(action: Action, data_dir: &std::path::Path) -> anyhow::Result<i32> {
    match action {
        Action::Snapshot { file, key, client } => {
            super::hub_snapshot::snapshot(&file, &key, &client).await
        }
        Action::Restore { file, key } => super::hub_snapshot::restore(&file, &key, data_dir).await,
        Action::VerifySnapshot { file, key } => super::hub_snapshot::verify(&file, &key).await,
        Action::SnapshotKey {
            action: super::hub_snapshot::KeyAction::New { file },
        } => super::hub_snapshot::new_key(file),
        Action::Verify { client } => super::hub_store::verify(data_dir, &client).await,
        Action::Repair => super::hub_store::repair(data_dir).await,
        Action::Migrate { .. }
        | Action::Config
        | Action::RotateCa { .. }
        | Action::SeedTasks { .. }
        | Action::Status => {
            unreachable!(
                "agen hub migrate, config, rotate-ca, seed-tasks and status are run by hub::run"
            )
        }
    }
}
