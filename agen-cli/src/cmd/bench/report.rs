//! The report of `agen bench`: percentiles of what the phases measured, tool calls per second,
//! the Hub's fsyncs per second and run events per fsync, the tool-call ratios, and the one
//! JSON object (`-o json`) or the table made from it.
//!
//! Invariant: the table is made from the JSON object and shows nothing the JSON lacks.

use serde_json::{json, Value};

use super::cpu::Sample;
use super::load::Measured;
use super::metrics::Counters;
use super::{Args, BenchTool};
use crate::view;

/// Latency summary in milliseconds.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Summary {
    pub count: usize,
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
    pub max: f64,
}

impl Summary {
    /// Nearest-rank percentiles of `samples` (milliseconds); all zero when empty.
    pub fn of(samples: &[f64]) -> Summary {
        if samples.is_empty() {
            return Summary::default();
        }
        let mut s = samples.to_vec();
        s.sort_by(f64::total_cmp);
        let rank = |p: f64| {
            let i = ((p / 100.0) * s.len() as f64).ceil() as usize;
            s[i.clamp(1, s.len()) - 1]
        };
        Summary {
            count: s.len(),
            mean: s.iter().sum::<f64>() / s.len() as f64,
            p50: rank(50.0),
            p90: rank(90.0),
            p99: rank(99.0),
            max: s[s.len() - 1],
        }
    }

    fn json(&self) -> Value {
        json!({
            "count": self.count,
            "mean": round3(self.mean),
            "p50": round3(self.p50),
            "p90": round3(self.p90),
            "p99": round3(self.p99),
            "max": round3(self.max),
        })
    }
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

pub(super) fn report(args: &Args, raw: &[f64], m: &Measured) -> Value {
    let (phase, baseline, spans) = (&m.phase, m.baseline.as_ref(), &m.spans);
    let raw_s = Summary::of(raw);
    let span_s = Summary::of(&spans.tool);
    let lat = Summary::of(&phase.latency);
    let ratio = if raw_s.mean > 0.0 && span_s.count > 0 {
        span_s.mean / raw_s.mean
    } else {
        0.0
    };
    let mut tool_call = json!({
        "raw_mcp_ms": raw_s.json(),
        "in_run_span_ms": span_s.json(),
        "ratio_in_run_to_raw": round3(ratio),
        "overhead_ms": round3(if span_s.count > 0 { span_s.mean - raw_s.mean } else { 0.0 }),
    });
    let baseline_json = baseline.map(|b| {
        let bl = Summary::of(&b.latency);
        let per_round = if args.tool_calls > 0 {
            (lat.mean - bl.mean) / f64::from(args.tool_calls)
        } else {
            0.0
        };
        tool_call["in_run_round_ms"] = json!(round3(per_round));
        tool_call["ratio_round_to_raw"] = json!(round3(if raw_s.mean > 0.0 {
            per_round / raw_s.mean
        } else {
            0.0
        }));
        json!({
            "tasks": b.succeeded + b.failed.len(),
            "succeeded": b.succeeded,
            "failed": b.failed.len(),
            "throughput_tasks_per_s": round3(b.throughput()),
            "latency_ms": bl.json(),
        })
    });
    json!({
        "date": chrono::Utc::now().to_rfc3339_opts(chrono::SecondsFormat::Secs, true),
        "build": if cfg!(debug_assertions) { "debug" } else { "release" },
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(1),
        "transport": if args.insecure_plaintext { "plaintext" } else { "tls" },
        // Other work on the machine skews every number: record the 1-minute load at the end.
        "loadavg_1m": std::fs::read_to_string("/proc/loadavg")
            .ok()
            .and_then(|l| l.split_whitespace().next().and_then(|x| x.parse::<f64>().ok())),
        "tasks": args.tasks,
        "concurrency": args.concurrency,
        "replicas": args.replicas,
        "instance_concurrency": args.instance_concurrency,
        "tool_calls_per_task": args.tool_calls,
        "tool": format!("ws.{}", args.tool.name()),
        "succeeded": phase.succeeded,
        "failed": phase.failed.len(),
        "failures": phase.failed.iter().take(5).collect::<Vec<_>>(),
        "wall_s": round3(phase.wall.as_secs_f64()),
        "throughput_tasks_per_s": round3(phase.throughput()),
        "latency_ms": lat.json(),
        // Submit → the first piece of the answer the client saw (time to first token): its
        // first delta, or the task's end for an answer that came whole.
        "first_token_ms": Summary::of(&phase.first_token).json(),
        "answers_streamed": phase.streamed,
        "piece_delay_ms": u64::try_from(args.piece_delay.as_millis()).unwrap_or(u64::MAX),
        // Tool calls the measured tasks made per second of the measured phase.
        "tool_calls_per_s": round3(phase.throughput() * f64::from(args.tool_calls)),
        "tool_kind": match args.tool {
            BenchTool::Read => "read-only",
            BenchTool::Write => "side-effecting",
        },
        "durability": durability_json(&m.durability, phase.wall.as_secs_f64()),
        "cpu": cpu_json(m.cpu.as_ref(), phase.succeeded, args.tool_calls),
        "hub_queued_ms": Summary::of(&phase.queued).json(),
        "hub_running_ms": Summary::of(&phase.running).json(),
        "model_turn_span_ms": Summary::of(&spans.model).json(),
        "tool_call": tool_call,
        "baseline_no_tool": baseline_json,
    })
}

/// The Hub's fsyncs over the measured phase: per second, their mean duration and run events
/// per fsync; each null when the Hub does not count it (an older Hub) or nothing was flushed.
fn durability_json(d: &Counters, secs: f64) -> Value {
    let per_s = d.fsyncs.filter(|_| secs > 0.0).map(|f| round3(f / secs));
    let per_fsync = match (d.run_events, d.fsyncs) {
        (Some(e), Some(f)) if f > 0.0 => Some(round3(e / f)),
        _ => None,
    };
    let mean_ms = match (d.fsync_seconds, d.fsyncs) {
        (Some(t), Some(f)) if f > 0.0 => Some(round3(t * 1000.0 / f)),
        _ => None,
    };
    json!({
        "fsyncs": d.fsyncs.map(|f| f as u64),
        "fsync_mean_ms": mean_ms,
        "fsyncs_per_s": per_s,
        "run_events_stored": d.run_events.map(|e| e as u64),
        "durable_events_per_fsync": per_fsync,
    })
}

/// CPU the fleet spent in the measured phase: seconds, per task and per tool call (µs), and
/// the processes counted; null without `/proc` (per call: null when the tasks call no tool).
fn cpu_json(cpu: Option<&Sample>, tasks: usize, calls_per_task: u32) -> Value {
    let Some(&Sample {
        cpu: spent,
        processes,
    }) = cpu
    else {
        return Value::Null;
    };
    let us = spent.as_secs_f64() * 1e6;
    let calls = tasks as f64 * f64::from(calls_per_task);
    json!({
        "seconds": round3(spent.as_secs_f64()),
        "processes": processes,
        "us_per_task": (tasks > 0).then(|| round3(us / tasks as f64)),
        "us_per_tool_call": (calls > 0.0).then(|| round3(us / calls)),
    })
}

pub(super) fn print_table(r: &Value) {
    let f = |v: &Value| match v.as_f64() {
        Some(x) => format!("{x:.2}"),
        None => v.to_string(),
    };
    crate::outln!(
        "agen bench ({} build, {} cores, load {}, {}): {} tasks, {} clients, {} replica(s) x {} task(s) at a time, {} call(s) of {} per task",
        r["build"].as_str().unwrap_or(""),
        r["cores"],
        r["loadavg_1m"],
        r["transport"].as_str().unwrap_or(""),
        r["tasks"],
        r["concurrency"],
        r["replicas"],
        r["instance_concurrency"],
        r["tool_calls_per_task"],
        r["tool"].as_str().unwrap_or("")
    );
    crate::outln!(
        "succeeded {} failed {} in {} s: {} tasks/s",
        r["succeeded"],
        r["failed"],
        f(&r["wall_s"]),
        f(&r["throughput_tasks_per_s"])
    );
    let lat = &r["latency_ms"];
    crate::outln!(
        "{} tool calls/s: {} (succeeded tasks x {} call(s) / measured s); task p50 {} ms, p99 {} ms",
        r["tool_kind"].as_str().unwrap_or(""),
        f(&r["tool_calls_per_s"]),
        r["tool_calls_per_task"],
        f(&lat["p50"]),
        f(&lat["p99"])
    );
    let ft = &r["first_token_ms"];
    crate::outln!(
        "time to first token: p50 {} ms, p99 {} ms ({} of {} answers streamed as deltas, {} ms between pieces)",
        f(&ft["p50"]),
        f(&ft["p99"]),
        r["answers_streamed"],
        r["succeeded"],
        r["piece_delay_ms"]
    );
    let d = &r["durability"];
    let na = |v: &Value| match v {
        Value::Null => "n/a".to_string(),
        v if v.is_u64() => v.to_string(),
        v => f(v),
    };
    crate::outln!(
        "hub fsyncs/s: {} ({} fsyncs, {} ms each), durable events per fsync: {} ({} run events stored), measured phase",
        na(&d["fsyncs_per_s"]),
        na(&d["fsyncs"]),
        na(&d["fsync_mean_ms"]),
        na(&d["durable_events_per_fsync"]),
        na(&d["run_events_stored"])
    );
    let c = &r["cpu"];
    crate::outln!(
        "fleet CPU (user + sys, {} processes): {} s, {} µs per tool call, {} µs per task, measured phase",
        na(&c["processes"]),
        na(&c["seconds"]),
        na(&c["us_per_tool_call"]),
        na(&c["us_per_task"])
    );
    for e in r["failures"].as_array().into_iter().flatten() {
        crate::outln!("  failure: {}", e.as_str().unwrap_or(""));
    }
    let mut t = view::table(&["ms", "n", "mean", "p50", "p90", "p99", "max"]);
    let mut row = |name: &str, s: &Value| {
        if s.is_null() {
            return;
        }
        t.add_row(vec![
            name.to_string(),
            s["count"].to_string(),
            f(&s["mean"]),
            f(&s["p50"]),
            f(&s["p90"]),
            f(&s["p99"]),
            f(&s["max"]),
        ]);
    };
    row("task end-to-end (client)", &r["latency_ms"]);
    row("  first token (client)", &r["first_token_ms"]);
    row("  queued at hub", &r["hub_queued_ms"]);
    row("  running at hub", &r["hub_running_ms"]);
    row("  model turn (span)", &r["model_turn_span_ms"]);
    row(
        "task without tool (client)",
        &r["baseline_no_tool"]["latency_ms"],
    );
    row("tool call, raw MCP", &r["tool_call"]["raw_mcp_ms"]);
    row(
        "tool call, in run (span)",
        &r["tool_call"]["in_run_span_ms"],
    );
    crate::outln!("{t}");
    let tc = &r["tool_call"];
    crate::outln!(
        "tool call in a run / raw MCP call: {}x (overhead {} ms per call, ms-resolution spans)",
        f(&tc["ratio_in_run_to_raw"]),
        f(&tc["overhead_ms"])
    );
    if !tc["in_run_round_ms"].is_null() {
        crate::outln!(
            "one tool round in a run (task with tools - task without, per call; includes a model turn): {} ms = {}x the raw call",
            f(&tc["in_run_round_ms"]),
            f(&tc["ratio_round_to_raw"])
        );
    }
}

#[cfg(test)]
mod tests {
    use super::Summary;

    #[test]
    fn percentiles_are_nearest_rank() {
        let samples: Vec<f64> = (1..=100).map(f64::from).collect();
        let s = Summary::of(&samples);
        assert_eq!(
            (s.count, s.mean, s.p50, s.p90, s.p99, s.max),
            (100, 50.5, 50.0, 90.0, 99.0, 100.0)
        );
        assert_eq!(Summary::of(&[]), Summary::default());
        assert_eq!(Summary::of(&[7.0]).p99, 7.0);
    }
}
