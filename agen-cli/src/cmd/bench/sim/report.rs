//! What `agen bench fleet` measured, as one typed object: printed as a table for people or
//! as JSON (`-o json`) for scripts and the e2e test. A figure that could not be measured is
//! `null` in JSON and `n/a` in the table, never zero.

use serde::Serialize;

#[derive(Debug, Default, Serialize)]
pub struct Report {
    pub nests: usize,
    pub instances_per_nest: u32,
    pub hub_url: String,
    pub join: Join,
    pub placement: Placement,
    pub steady: Steady,
    pub tasks: Tasks,
    pub kill: Kill,
    pub hub: HubFigures,
    pub queries: Queries,
}

/// Joining and registering every Nest.
#[derive(Debug, Default, Serialize)]
pub struct Join {
    /// Nests that registered.
    pub registered: usize,
    /// From the first Nest's start to the last `Registered`.
    pub seconds: f64,
    pub per_second: f64,
    /// Until the Hub's `ListNests` showed every Nest ready.
    pub all_ready_seconds: Option<f64>,
}

/// Deploying `replicas` instances across the Nests.
#[derive(Debug, Default, Serialize)]
pub struct Placement {
    pub replicas: u32,
    /// Deployments holding them (at most 1,000 replicas each).
    pub deployments: usize,
    /// `PlaceInstance` messages the Nests received.
    pub placed: u64,
    /// From the deploy call to the last placement.
    pub seconds: f64,
    pub per_second: f64,
    /// Until the Hub's deployment showed every replica ready.
    pub all_ready_seconds: Option<f64>,
}

/// The fleet held with no tasks.
#[derive(Debug, Default, Serialize)]
pub struct Steady {
    pub seconds: f64,
    pub heartbeats: u64,
    pub heartbeats_per_second: f64,
    /// The Hub process's CPU over the hold, in percent of one core.
    pub hub_cpu_percent: Option<f64>,
    pub hub_cpu_us_per_heartbeat: Option<f64>,
}

/// The task phase.
#[derive(Debug, Default, Serialize)]
pub struct Tasks {
    pub submitted: usize,
    /// Tasks the Hub shows succeeded at the end.
    pub succeeded: usize,
    /// Submitted tasks that did not succeed.
    pub lost: usize,
    /// Tasks whose side effect the simulated runs executed more than once.
    pub twice: usize,
    /// Tasks whose side effect was executed (once or more).
    pub executed: usize,
    /// Resumed attempts that reported their call `effect_unknown` (started, end not known).
    pub effect_unknown: u64,
    pub seconds: f64,
    pub dispatches: u64,
    pub dispatches_per_second: f64,
    pub run_events: u64,
    pub run_events_per_second: f64,
    pub submit_to_start_p50_ms: Option<f64>,
    pub submit_to_start_p99_ms: Option<f64>,
    pub hub_cpu_us_per_event: Option<f64>,
}

/// Killing a share of the Nests mid-run, and their return.
#[derive(Debug, Default, Serialize)]
pub struct Kill {
    pub nests_killed: usize,
    /// Instances the killed Nests held.
    pub instances_affected: usize,
    /// Runs in flight on the killed Nests.
    pub runs_in_flight: usize,
    /// From the kill until as many instances were placed again.
    pub replaced_seconds: Option<f64>,
    /// Runs of the killed Nests assigned again elsewhere (a later attempt).
    pub runs_resumed: usize,
    /// From the kill until the last of them was assigned again.
    pub resumed_seconds: Option<f64>,
    /// From the kill until the last of them finished.
    pub resumed_finished_seconds: Option<f64>,
    /// From the killed Nests' return until all registered again.
    pub returned_seconds: Option<f64>,
}

/// The Hub process at the end.
#[derive(Debug, Default, Serialize)]
pub struct HubFigures {
    pub rss_bytes: Option<u64>,
    pub rss_peak_bytes: Option<u64>,
    pub open_fds: Option<usize>,
    pub store_bytes: Option<u64>,
}

/// How long the listing commands took at this size.
#[derive(Debug, Default, Serialize)]
pub struct Queries {
    pub agen_nests_ms: Option<f64>,
    pub agen_ps_all_ms: Option<f64>,
    pub list_tasks_first_page_ms: Option<f64>,
}

fn f(x: Option<f64>, unit: &str) -> String {
    match x {
        Some(v) if v >= 100.0 => format!("{v:.0} {unit}"),
        Some(v) => format!("{v:.2} {unit}"),
        None => "n/a".into(),
    }
}

fn mib(x: Option<u64>) -> String {
    x.map_or("n/a".into(), |b| format!("{:.1} MiB", b as f64 / 1048576.0))
}

pub fn print_table(r: &Report) {
    let rows: Vec<(&str, String)> = vec![
        (
            "nests × instances",
            format!("{} × {}", r.nests, r.instances_per_nest),
        ),
        (
            "joined",
            format!(
                "{} in {:.2} s ({:.0}/s)",
                r.join.registered, r.join.seconds, r.join.per_second
            ),
        ),
        ("all nests ready", f(r.join.all_ready_seconds, "s")),
        (
            "placed",
            format!(
                "{} of {} in {:.2} s ({:.0}/s)",
                r.placement.placed,
                r.placement.replicas,
                r.placement.seconds,
                r.placement.per_second
            ),
        ),
        ("all instances ready", f(r.placement.all_ready_seconds, "s")),
        (
            "steady hold",
            format!(
                "{:.0} s, {} heartbeats ({:.0}/s)",
                r.steady.seconds, r.steady.heartbeats, r.steady.heartbeats_per_second
            ),
        ),
        (
            "hub cpu (steady)",
            f(r.steady.hub_cpu_percent, "% of a core"),
        ),
        (
            "hub cpu per heartbeat",
            f(r.steady.hub_cpu_us_per_heartbeat, "µs"),
        ),
        (
            "tasks",
            format!(
                "{} submitted, {} succeeded, {} lost, {} twice, {} effect_unknown",
                r.tasks.submitted,
                r.tasks.succeeded,
                r.tasks.lost,
                r.tasks.twice,
                r.tasks.effect_unknown
            ),
        ),
        (
            "dispatches",
            format!(
                "{} ({:.0}/s)",
                r.tasks.dispatches, r.tasks.dispatches_per_second
            ),
        ),
        (
            "run events",
            format!(
                "{} ({:.0}/s)",
                r.tasks.run_events, r.tasks.run_events_per_second
            ),
        ),
        (
            "submit→start p50 / p99",
            format!(
                "{} / {}",
                f(r.tasks.submit_to_start_p50_ms, "ms"),
                f(r.tasks.submit_to_start_p99_ms, "ms")
            ),
        ),
        (
            "hub cpu per run event",
            f(r.tasks.hub_cpu_us_per_event, "µs"),
        ),
        (
            "killed",
            format!(
                "{} nests, {} instances, {} runs in flight",
                r.kill.nests_killed, r.kill.instances_affected, r.kill.runs_in_flight
            ),
        ),
        ("kill → re-placed", f(r.kill.replaced_seconds, "s")),
        (
            "kill → runs resumed",
            format!(
                "{} ({} runs)",
                f(r.kill.resumed_seconds, "s"),
                r.kill.runs_resumed
            ),
        ),
        (
            "kill → resumed runs finished",
            f(r.kill.resumed_finished_seconds, "s"),
        ),
        ("killed nests back", f(r.kill.returned_seconds, "s")),
        (
            "hub rss (peak)",
            format!("{} ({})", mib(r.hub.rss_bytes), mib(r.hub.rss_peak_bytes)),
        ),
        (
            "hub open fds",
            r.hub.open_fds.map_or("n/a".into(), |n| n.to_string()),
        ),
        ("hub store", mib(r.hub.store_bytes)),
        ("agen nests", f(r.queries.agen_nests_ms, "ms")),
        ("agen ps --all", f(r.queries.agen_ps_all_ms, "ms")),
        (
            "ListTasks first page",
            f(r.queries.list_tasks_first_page_ms, "ms"),
        ),
    ];
    let width = rows
        .iter()
        .map(|(k, _)| k.chars().count())
        .max()
        .unwrap_or(0);
    for (k, v) in rows {
        println!("{k:<width$}  {v}");
    }
}
