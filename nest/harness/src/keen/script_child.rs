//! Script tools run in a child process (`agen keen-script`, hidden) that is killed at the
//! deadline, so a script stuck inside a native loop the engine's interrupt cannot reach (a
//! backtracking RegExp, `new Array(2e8).indexOf(1)`) stops using CPU, and one that crashes the
//! engine (a native stack overflow) takes down only its child, never the instance.
//!
//! Invariants:
//! - the child gets one [`ScriptRequest`] as JSON on stdin and answers one [`ScriptOutcome`] as
//!   JSON on stdout; its stderr (the script's `console.*` through `tracing`) is the instance's;
//! - the child runs in its own process group with `RLIMIT_AS` ([`address_space_limit`]) and
//!   `RLIMIT_CPU` (the time limit + 2 s) set before `exec`, and is killed (SIGKILL to its group)
//!   at the time limit + [`KILL_GRACE`] if it has not answered; a dropped call kills it too;
//! - without a runner (unit tests, the embedded SDK) scripts run in-process as before.

use std::path::PathBuf;
use std::sync::OnceLock;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::script::{run_script_blocking, ScriptLimits, ScriptOutcome};

/// How long past its time limit a child may take to answer before it is killed.
pub const KILL_GRACE: Duration = Duration::from_millis(500);
/// The hidden subcommand of the `agen` binary that runs one script.
pub const SUBCOMMAND: &str = "keen-script";
/// The largest answer read from a child (a dictionary is bounded well below this).
const MAX_ANSWER_BYTES: u64 = 64 * 1024 * 1024;

/// One script run, as sent to the child.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ScriptRequest {
    pub source: String,
    pub label: String,
    pub dictionary: Json,
    pub timeout_ms: u64,
    pub memory_bytes: usize,
    pub max_stack_bytes: usize,
}

static RUNNER: OnceLock<PathBuf> = OnceLock::new();

/// Makes script tools run in children of `agen_bin` (`agen keen-script`). Set once by the
/// `agen` binary at start.
pub fn set_runner(agen_bin: PathBuf) {
    let _ = RUNNER.set(agen_bin);
}

/// The binary that runs script children, when one was set.
pub fn runner() -> Option<&'static PathBuf> {
    RUNNER.get()
}

/// The address-space limit of a child: generous for the engine's own heap limit, small
/// enough that a script can never take the machine's memory.
pub fn address_space_limit(limits: &ScriptLimits) -> u64 {
    (limits.memory_bytes as u64).saturating_mul(4).max(1 << 30)
}

/// The child's side: reads one request from stdin, runs it, writes the outcome to stdout.
/// Returns the process exit code.
pub fn serve_stdio() -> i32 {
    use std::io::{Read, Write};
    let mut input = String::new();
    if let Err(e) = std::io::stdin().read_to_string(&mut input) {
        eprintln!("agen keen-script: cannot read the request: {e}");
        return 70;
    }
    let request: ScriptRequest = match serde_json::from_str(&input) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("agen keen-script: the request is not a script request ({e}); this command is started by agen itself");
            return 64;
        }
    };
    let limits = ScriptLimits {
        timeout: Duration::from_millis(request.timeout_ms),
        memory_bytes: request.memory_bytes,
        max_stack_bytes: request.max_stack_bytes,
    };
    let outcome = run_script_blocking(&request.source, &request.label, request.dictionary, &limits);
    let answer = match serde_json::to_string(&outcome) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("agen keen-script: cannot encode the outcome: {e}");
            return 70;
        }
    };
    let mut out = std::io::stdout().lock();
    if out
        .write_all(answer.as_bytes())
        .and_then(|()| out.flush())
        .is_err()
    {
        return 70;
    }
    0
}

/// Runs one script in a child of `runner`, killed at the deadline.
pub async fn run_in_child(
    runner: &std::path::Path,
    source: String,
    label: String,
    dictionary: Json,
    limits: &ScriptLimits,
) -> ScriptOutcome {
    let request = ScriptRequest {
        source,
        label: label.clone(),
        dictionary,
        timeout_ms: u64::try_from(limits.timeout.as_millis()).unwrap_or(u64::MAX),
        memory_bytes: limits.memory_bytes,
        max_stack_bytes: limits.max_stack_bytes,
    };
    let body = match serde_json::to_vec(&request) {
        Ok(b) => b,
        Err(e) => return ScriptOutcome::Threw(format!("cannot encode the script request: {e}")),
    };
    let mut cmd = tokio::process::Command::new(runner);
    cmd.arg(SUBCOMMAND)
        .env_clear()
        .env(
            "RUST_LOG",
            std::env::var("RUST_LOG").unwrap_or_else(|_| "info".into()),
        )
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::inherit())
        .process_group(0)
        .kill_on_drop(true);
    let address_space = address_space_limit(limits);
    let cpu_seconds = limits.timeout.as_secs() + 2;
    // SAFETY: between fork and exec the closure only calls setrlimit, which is
    // async-signal-safe, and allocates nothing.
    #[allow(unsafe_code)]
    unsafe {
        cmd.pre_exec(move || {
            let set = |resource, soft: u64, hard: u64| {
                let limit = libc::rlimit {
                    rlim_cur: soft as libc::rlim_t,
                    rlim_max: hard as libc::rlim_t,
                };
                if libc::setrlimit(resource, &limit) == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            };
            set(libc::RLIMIT_AS, address_space, address_space)?;
            set(libc::RLIMIT_CPU, cpu_seconds, cpu_seconds + 1)?;
            Ok(())
        });
    }
    // Managed: an instance's reaper of adopted orphans must leave this child to us.
    let mut child = match agen_shared::process::spawn_managed(|| cmd.spawn(), |c| c.id()) {
        Ok(c) => c,
        Err(e) => {
            return ScriptOutcome::Threw(format!(
                "cannot start the script process {} {SUBCOMMAND}: {e}",
                runner.display()
            ))
        }
    };
    let pid = child.id();
    let (Some(mut stdin), Some(stdout)) = (child.stdin.take(), child.stdout.take()) else {
        return ScriptOutcome::Threw("the script process has no stdin/stdout".into());
    };
    let exchange = async move {
        stdin.write_all(&body).await?;
        drop(stdin);
        let mut answer = Vec::new();
        stdout
            .take(MAX_ANSWER_BYTES)
            .read_to_end(&mut answer)
            .await?;
        Ok::<_, std::io::Error>(answer)
    };
    let outcome = tokio::time::timeout(limits.timeout + KILL_GRACE, exchange).await;
    let outcome = match outcome {
        Err(_) => {
            kill_group(pid);
            let _ = child.wait().await;
            return ScriptOutcome::TimedOut;
        }
        Ok(Err(e)) => {
            kill_group(pid);
            let _ = child.wait().await;
            return ScriptOutcome::Threw(format!("the script process failed: {e}"));
        }
        Ok(Ok(answer)) => answer,
    };
    let status = child.wait().await;
    match serde_json::from_slice::<ScriptOutcome>(&outcome) {
        Ok(o) => o,
        Err(_) => {
            let how = match status {
                Ok(s) => describe_exit(s),
                Err(e) => e.to_string(),
            };
            tracing::warn!(script = %label, how = %how, "script process ended without an answer");
            ScriptOutcome::Threw(format!(
                "the script engine stopped without an answer ({how}): the script may nest values too deeply \
                 or use too much memory; keep values in dictionary shallow and small"
            ))
        }
    }
}

fn kill_group(pid: Option<u32>) {
    let Some(pid) = pid.and_then(|p| i32::try_from(p).ok()) else {
        return;
    };
    let _ = nix::sys::signal::killpg(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGKILL,
    );
}

fn describe_exit(status: std::process::ExitStatus) -> String {
    use std::os::unix::process::ExitStatusExt;
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit code {code}"),
        (None, Some(sig)) => format!("killed by signal {sig}"),
        _ => "unknown exit".into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(source: &str) -> ScriptOutcome {
        run_script_blocking(
            source,
            "tools/t.js",
            serde_json::json!({"context": ""}),
            &ScriptLimits::default(),
        )
    }

    #[test]
    fn deep_or_huge_dictionary_values_are_refused_naming_the_limit() {
        let deep = "exports.exec = (p, d) => { const o = {}; let c = o; for (let i = 0; i < 10000; i++) { c.x = {}; c = c.x; } d.deep = o; d.result = 'x'; };";
        match run(deep) {
            ScriptOutcome::Threw(m) => assert!(m.contains("nested deeper than 64 levels"), "{m}"),
            other => panic!("{other:?}"),
        }
        let wide =
            "exports.exec = (p, d) => { d.many = Array.from({length: 300000}, (_, i) => i); };";
        match run(wide) {
            ScriptOutcome::Threw(m) => assert!(m.contains("more than 200000 values"), "{m}"),
            other => panic!("{other:?}"),
        }
        let cyclic =
            "exports.exec = (p, d) => { const o = {}; o.self = o; d.o = o; d.result = 'ok'; };";
        assert!(matches!(run(cyclic), ScriptOutcome::Ok { result: Some(r), .. } if r == "ok"));
        let fine =
            "exports.exec = (p, d) => { d.a = {b: {c: [1, 2, {d: 'e'}]}}; d.result = 'ok'; };";
        assert!(matches!(run(fine), ScriptOutcome::Ok { result: Some(r), .. } if r == "ok"));
    }

    #[test]
    fn outcomes_cross_the_process_boundary_unchanged() {
        for outcome in [
            ScriptOutcome::Ok {
                result: Some("r".into()),
                tool_status_error: true,
                dictionary: serde_json::json!({"a": [1, {"b": null}]}),
            },
            ScriptOutcome::Threw("TypeError: x".into()),
            ScriptOutcome::TimedOut,
            ScriptOutcome::OutOfMemory,
            ScriptOutcome::BadEntry("no exec".into()),
        ] {
            let text = serde_json::to_string(&outcome).expect("encode");
            let back: ScriptOutcome = serde_json::from_str(&text).expect("decode");
            assert_eq!(back, outcome);
        }
    }
}
