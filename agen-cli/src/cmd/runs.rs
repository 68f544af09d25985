//! `agen runs`: the local run logs of `agen run` (no Hub), oldest first, each with its state
//! (succeeded, failed, cancelled, running, interrupted), agent, start time and prompt. An
//! interrupted run is carried on by `agen run --resume RUN`; `agen trace --local RUN` shows one.

use agen_harness::local_runs::{self, LocalRun, LocalRunState};
use serde_json::{json, Value};

use crate::client::Output;
use crate::view;

/// Longest prompt shown in the table before it is cut.
const PROMPT: usize = 50;

/// Arguments of `agen runs`.
#[derive(Debug, clap::Args)]
pub struct Args {
    /// Only runs in this state (succeeded|failed|cancelled|running|interrupted)
    #[arg(long)]
    pub state: Option<String>,
    /// Output format: table (for people), json or yaml (for scripts)
    #[arg(short = 'o', long = "output", value_enum, default_value = "table")]
    pub output: Output,
}

pub async fn run(args: Args) -> anyhow::Result<i32> {
    let root = local_runs::default_root();
    let runs: Vec<LocalRun> = local_runs::list(&root)?
        .into_iter()
        .filter(|r| args.state.as_deref().is_none_or(|s| r.state.as_str() == s))
        .collect();
    if args.output != Output::Table {
        view::print_value(
            args.output,
            &Value::Array(runs.iter().map(run_json).collect()),
        );
        return Ok(0);
    }
    if runs.is_empty() {
        crate::outln!("no runs in {}", root.display());
        return Ok(0);
    }
    let mut t = view::table(&["RUN", "STATE", "AGENT", "STARTED", "PROMPT"]).keep(&["STATE"]);
    for r in &runs {
        let a = r.assignment.as_ref();
        let prompt = a.map(|a| a.input.as_str()).unwrap_or("-");
        let prompt = prompt.lines().next().unwrap_or("");
        let prompt = if prompt.chars().count() > PROMPT {
            format!("{}…", prompt.chars().take(PROMPT).collect::<String>())
        } else {
            prompt.to_string()
        };
        t.add_row(vec![
            r.run_id.clone(),
            r.state.as_str().to_string(),
            a.map(|a| a.deployment.clone())
                .unwrap_or_else(|| "-".into()),
            match r.started_at() {
                "" => "-".into(),
                s => s.get(..19).unwrap_or(s).replace('T', " "),
            },
            prompt,
        ]);
    }
    crate::outln!("{t}");
    if runs.iter().any(|r| r.state == LocalRunState::Interrupted) {
        eprintln!("an interrupted run carries on with: agen run --resume RUN");
    }
    Ok(0)
}

/// One run for scripts: `run`, `state`, `agent`, `prompt`, `started`, `attempts`, `bundle`,
/// `result` (when finished), `log` (its folder).
fn run_json(r: &LocalRun) -> Value {
    let a = r.assignment.as_ref();
    json!({
        "run": r.run_id,
        "state": r.state.as_str(),
        "agent": a.map(|a| a.deployment.as_str()),
        "prompt": a.map(|a| a.input.as_str()),
        "started": match r.started_at() { "" => Value::Null, s => Value::String(s.to_string()) },
        "attempts": r.attempts(),
        "bundle": r.origin.as_ref().map(|o| o.bundle.display().to_string()),
        "result": r.result(),
        "log": r.dir.display().to_string(),
    })
}
