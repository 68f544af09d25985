//! `agen deploy DIR [--name NAME]`: validates the bundle locally (a bad bundle changes
//! nothing), uploads it content-addressed, then creates or rolls the deployment (named after
//! the bundle's agent unless `--name` says otherwise, as `agen up --deploy` does), keeping its
//! replica count unless `--replicas` says otherwise.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use agen_proto::v1 as pb;
use agen_shared::bundle;
use anyhow::Context;
use serde_json::json;

use crate::client::{status_error, ClientArgs, Hub, Output};
use crate::view;

/// Arguments of `agen deploy`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// The bundle folder
    pub dir: PathBuf,
    /// Deployment name (default: the bundle's name: `name` in x-agen/agent.md, else the folder's)
    #[arg(long)]
    pub name: Option<String>,
    /// Number of instances (default: as many as the deployment has now, 1 for a new one)
    #[arg(long)]
    pub replicas: Option<u32>,
    /// Tasks one instance runs at a time
    #[arg(long, default_value_t = 1)]
    pub concurrency: u32,
    /// CPUs per instance with its tool servers (limit and reservation; over `resources.cpu`
    /// in x-agen/config.json), such as 0.5
    #[arg(long, value_name = "CPUS", value_parser = parse_cpu_flag)]
    pub cpu: Option<u32>,
    /// Memory per instance with its tool servers (limit and reservation), such as 512Mi
    #[arg(long, value_name = "SIZE", value_parser = parse_memory_flag)]
    pub memory: Option<u64>,
    /// Processes per instance with its tool servers (limit), such as 256
    #[arg(long, value_name = "N")]
    pub pids: Option<u32>,
    /// Place instances only on Nests with this label (repeatable)
    #[arg(long = "selector", value_name = "K=V")]
    pub selector: Vec<String>,
    /// Wait until every replica runs the new version and is healthy
    #[arg(long)]
    pub wait: bool,
    /// How long --wait waits
    #[arg(long, default_value = "120s", value_parser = crate::cmd::parse_duration)]
    pub timeout: Duration,
    /// With --wait (implied): fail (exit 1) when a ready instance has a tool server that is
    /// not connected, instead of only printing it
    #[arg(long)]
    pub require_all_servers: bool,
    /// POST a signed notice to this URL when a task of the deployment ends (README "Webhooks");
    /// a deploy without it removes the deployment's webhook
    #[arg(long, value_name = "URL", requires = "webhook_secret")]
    pub webhook: Option<String>,
    /// The platform secret (agen secrets set NAME) that signs the --webhook deliveries
    #[arg(long, value_name = "NAME", requires = "webhook")]
    pub webhook_secret: Option<String>,
    /// The --webhook URL is also told when a task waits for an approval
    #[arg(long, requires = "webhook")]
    pub webhook_on_waiting: bool,
    #[command(flatten)]
    pub client: ClientArgs,
}

/// Bundle size of one upload chunk.
const CHUNK: usize = 1 << 20;

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let loaded = match validate(&args.dir) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: bundle {} is not valid: {e:#}", args.dir.display());
            return Ok(crate::exit::code::USAGE);
        }
    };
    for w in warnings(&args.dir, &loaded) {
        eprintln!("warning: {w}");
    }
    let resources = bundle::ResourceSpec {
        cpu_millis: args.cpu,
        memory_bytes: args.memory,
        pids: args.pids,
    };
    if let Err(e) = resources.check(|k| format!("--{k}")) {
        eprintln!("error: {e}");
        return Ok(crate::exit::code::USAGE);
    }
    let name = args.name.clone().unwrap_or_else(|| default_name(&loaded));
    let mut hub = args.client.connect()?;
    let replicas = match args.replicas {
        Some(n) => n,
        None => current_replicas(&mut hub, &name).await?.unwrap_or(1),
    };
    let hook = args.webhook.clone().map(|url| {
        let secret = args.webhook_secret.clone().unwrap_or_default();
        let on_waiting = args.webhook_on_waiting;
        (pb::WebhookTarget { url, on_waiting }, secret)
    });
    let deployment = deploy_full(
        &mut hub,
        &args.dir,
        &name,
        (replicas, args.concurrency),
        &args.selector,
        hook,
        resources,
    )
    .await?;
    if args.wait || args.require_all_servers {
        let ready = wait_ready(&mut hub, &deployment, args.timeout).await?;
        let missing = not_connected(&ready);
        for line in &missing {
            eprintln!("warning: {line}");
        }
        if args.require_all_servers && !missing.is_empty() {
            return Err(crate::exit::coded(
                crate::exit::code::FAILED,
                format!(
                    "deployment {}/{}: {} tool server(s) not connected and --require-all-servers is set; fix the server (its cause is above; `agen logs` shows its stderr) and deploy again",
                    deployment.namespace,
                    deployment.name,
                    missing.len()
                ),
            ));
        }
    }
    let d = hub
        .client
        .get_deployment(pb::GetDeploymentRequest {
            namespace: hub.namespace.clone(),
            name: name.clone(),
        })
        .await
        .map_err(|s| status_error(&hub, s))?
        .into_inner();
    let dep = d.deployment.unwrap_or(deployment);
    match args.client.output {
        Output::Json | Output::Yaml => {
            let mut v = view::deployment_json(&dep);
            v["instances"] = json!(d
                .instances
                .iter()
                .map(view::instance_json)
                .collect::<Vec<_>>());
            view::print_value(args.client.output, &v);
        }
        Output::Table => crate::outln!(
            "deployed {}/{} ({} {}, generation {}, {}/{} ready) from {}",
            dep.namespace,
            dep.name,
            loaded.agent.name,
            view::short_digest(&dep.bundle_digest),
            dep.generation,
            dep.ready_replicas,
            dep.replicas,
            args.dir.display()
        ),
    }
    Ok(0)
}

/// The replica count of deployment `name` now (`None`: there is none): `agen deploy` without
/// `--replicas` keeps it, so a deploy after `agen scale` never changes capacity.
async fn current_replicas(hub: &mut Hub, name: &str) -> anyhow::Result<Option<u32>> {
    let got = hub
        .client
        .get_deployment(pb::GetDeploymentRequest {
            namespace: hub.namespace.clone(),
            name: name.to_owned(),
        })
        .await;
    match got {
        Ok(d) => Ok(d.into_inner().deployment.map(|d| d.replicas)),
        Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
        Err(s) => Err(status_error(hub, s)),
    }
}

/// The deployment name a bundle gets when none is given: its agent's name, lowercased.
pub fn default_name(b: &bundle::Bundle) -> String {
    b.agent.name.to_lowercase()
}

/// Every check a bundle gets before it leaves this machine: the bundle format (agen-shared)
/// and, when it has `keen-tools.json`, its Keen registry and flows (agen-nest).
pub fn validate(dir: &std::path::Path) -> anyhow::Result<bundle::Bundle> {
    let loaded = bundle::Bundle::load(dir)?;
    if loaded.has_keen_tools {
        agen_harness::keen::KeenBundle::load(dir)?;
    }
    Ok(loaded)
}

/// What deploy warns about without refusing the bundle: servers fetched unpinned, Keen tools
/// that cannot run as registered (a call gets the general recall).
pub fn warnings(dir: &std::path::Path, loaded: &bundle::Bundle) -> Vec<String> {
    let mut out = bundle::unpinned_servers(&loaded.mcp);
    if let Ok(Some(keen)) = agen_harness::keen::KeenBundle::load(dir) {
        out.extend(keen.warnings.into_iter().map(|w| {
            format!("{w}; a call to this tool gets the general \"no tool response\" recall")
        }));
    }
    out
}

/// Uploads the bundle in `dir` and creates or updates deployment `name`. Shared with `agen up --deploy`.
pub async fn deploy(
    hub: &mut Hub,
    dir: &std::path::Path,
    name: &str,
    replicas: u32,
    concurrency: u32,
    selector: &[String],
) -> anyhow::Result<pb::Deployment> {
    deploy_with(hub, dir, name, (replicas, concurrency), selector, None).await
}

/// [`deploy`] with the deployment's webhook and the secret that signs it (`None`: none).
pub async fn deploy_with(
    hub: &mut Hub,
    dir: &std::path::Path,
    name: &str,
    (replicas, concurrency): (u32, u32),
    selector: &[String],
    hook: Option<(pb::WebhookTarget, String)>,
) -> anyhow::Result<pb::Deployment> {
    deploy_full(
        hub,
        dir,
        name,
        (replicas, concurrency),
        selector,
        hook,
        Default::default(),
    )
    .await
}

/// [`deploy_with`] with per-instance resources over the bundle's (`agen deploy --cpu …`).
async fn deploy_full(
    hub: &mut Hub,
    dir: &std::path::Path,
    name: &str,
    (replicas, concurrency): (u32, u32),
    selector: &[String],
    hook: Option<(pb::WebhookTarget, String)>,
    resources: bundle::ResourceSpec,
) -> anyhow::Result<pb::Deployment> {
    validate(dir).with_context(|| format!("bundle {} is not valid", dir.display()))?;
    let bytes =
        bundle::pack(dir).with_context(|| format!("cannot pack bundle {}", dir.display()))?;
    let digest = bundle::digest(&bytes);
    let total = bytes.len() as u64;
    let mut chunks: Vec<pb::BundleChunk> = bytes
        .chunks(CHUNK)
        .map(|c| pb::BundleChunk {
            digest: String::new(),
            total_size: 0,
            data: c.to_vec(),
        })
        .collect();
    if chunks.is_empty() {
        chunks.push(pb::BundleChunk::default());
    }
    chunks[0].digest = digest.clone();
    chunks[0].total_size = total;
    hub.client
        .upload_bundle(tokio_stream::iter(chunks))
        .await
        .map_err(|s| status_error(hub, s))?;
    let selector = view::parse_labels(selector)?;
    let dep = hub
        .client
        .create_deployment(pb::CreateDeploymentRequest {
            namespace: hub.namespace.clone(),
            name: name.to_owned(),
            bundle_digest: digest,
            replicas,
            selector,
            concurrency,
            webhook_secret: hook.as_ref().map(|h| h.1.clone()).unwrap_or_default(),
            webhook: hook.map(|h| h.0),
            resources: Some(pb::Resources {
                cpu_millis: resources.cpu_millis.unwrap_or(0),
                memory_bytes: resources.memory_bytes.unwrap_or(0),
                pids: resources.pids.unwrap_or(0),
            }),
        })
        .await
        .map_err(|s| status_error(hub, s))?
        .into_inner();
    Ok(dep)
}

/// Each tool server a ready instance runs without, with its cause: `instance I: tool server
/// S is not connected: CAUSE`.
fn not_connected(ready: &[pb::Instance]) -> Vec<String> {
    ready
        .iter()
        .flat_map(|i| {
            i.servers_not_connected.iter().map(move |p| {
                format!(
                    "instance {}: tool server {} is not connected: {}",
                    i.instance_id,
                    p.server,
                    p.reason
                        .lines()
                        .find(|l| !l.trim().is_empty())
                        .unwrap_or("")
                )
            })
        })
        .collect()
}

/// Messages of an instance that failed to start for a reason of its own that no retry fixes
/// (the Nest and the instance say them; a replacement in back-off repeats its predecessor's).
const START_ERRORS: &[&str] = &[
    "permission denied: uid",
    "does not exist; expected an executable file",
    "not found in the bundle",
    "could not start ",
    "cannot start ",
    "bundle: ",
    "has no value",
    "instance process exited",
];

/// When no replica of `dep`'s generation is ready and there are at least `replicas` of them,
/// each failing with a known start error: those errors, one per instance.
fn every_replica_fails_to_start(list: &[pb::Instance], dep: &pb::Deployment) -> Option<String> {
    let current: Vec<&pb::Instance> = list
        .iter()
        .filter(|i| i.generation == dep.generation)
        .filter(|i| {
            !matches!(
                view::instance_state(i.state),
                "lost" | "stopped" | "stopping"
            )
        })
        .collect();
    let failing: Vec<String> = current
        .iter()
        .filter(|i| !i.healthy)
        .filter(|i| START_ERRORS.iter().any(|e| i.message.contains(e)))
        .map(|i| format!("{}: {}", i.instance_id, i.message))
        .collect();
    (dep.replicas > 0 && failing.len() == current.len() && failing.len() as u32 >= dep.replicas)
        .then(|| failing.join("; "))
}

/// Waits until every replica of `dep` runs its generation and is healthy, and returns those
/// replicas; stops early (exit 1) when every replica fails with a start error of its own.
pub async fn wait_ready(
    hub: &mut Hub,
    dep: &pb::Deployment,
    timeout: Duration,
) -> anyhow::Result<Vec<pb::Instance>> {
    let deadline = Instant::now() + timeout;
    loop {
        let list = hub
            .client
            .list_instances(pb::ListInstancesRequest {
                namespace: dep.namespace.clone(),
                deployment: dep.name.clone(),
                all_namespaces: false,
                include_ended: false,
            })
            .await
            .map_err(|s| status_error(hub, s))?
            .into_inner()
            .instances;
        let ready_list: Vec<&pb::Instance> = list
            .iter()
            .filter(|i| {
                i.generation == dep.generation
                    && i.healthy
                    && view::instance_state(i.state) == "running"
            })
            .collect();
        let ready = ready_list.len();
        // Only live instances of older generations hold a rollout up: lost and stopped ones
        // are history, not work, and one kept only for the runs of its version (a run that
        // waits for an approval may resume there hours later) is not a replica.
        let old = list
            .iter()
            .filter(|i| i.generation != dep.generation)
            .filter(|i| !matches!(view::instance_state(i.state), "lost" | "stopped"))
            .filter(|i| {
                !(i.active_runs == 0 && i.message.starts_with(agen_contract::run::DRAINING_NOTE))
            })
            .count();
        if ready as u32 >= dep.replicas && old == 0 {
            return Ok(ready_list.into_iter().cloned().collect());
        }
        if let Some(failing) = every_replica_fails_to_start(&list, dep) {
            return Err(crate::exit::coded(
                crate::exit::code::FAILED,
                format!(
                    "deployment {}/{}: every replica fails to start, waiting longer will not help: {failing}",
                    dep.namespace, dep.name
                ),
            ));
        }
        let last = list
            .iter()
            .filter(|i| !i.message.is_empty())
            .map(|i| format!("{}: {}", i.instance_id, i.message))
            .collect::<Vec<_>>()
            .join("; ");
        if Instant::now() > deadline {
            anyhow::bail!(
                "deployment {}/{}: {ready}/{} replicas ready after {:?}{}",
                dep.namespace,
                dep.name,
                dep.replicas,
                timeout,
                if last.is_empty() {
                    String::new()
                } else {
                    format!(" ({last})")
                }
            );
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
}

fn parse_cpu_flag(s: &str) -> Result<u32, String> {
    bundle::resources::parse_cpu(s)
}

fn parse_memory_flag(s: &str) -> Result<u64, String> {
    bundle::resources::parse_bytes(s)
}
