//! One module per subcommand. Each exposes `Args` (clap) and `run(args) -> anyhow::Result<i32>`
//! returning the exit code. Helpers shared by several commands live here.

pub mod a2a;
pub mod a2a_serve;
pub mod approvals;
pub mod artifacts;
pub mod audit;
pub mod bench;
pub mod cancel;
pub mod complete;
pub mod completions;
pub mod deploy;
pub mod fake_model;
pub mod history;
pub mod hub;
pub mod hub_rotate_ca;
pub mod hub_snapshot;
pub mod hub_store;
pub mod init;
pub mod instance;
pub mod logs;
pub mod mcp;
pub mod nest;
pub mod nests;
pub mod ps;
pub mod query;
pub mod reload;
pub mod rm;
pub mod rollback;
pub mod run;
pub mod runs;
pub mod scale;
pub mod schedules;
pub mod secrets;
pub mod submit;
pub mod task_webhooks;
pub mod tasks;
pub mod tokens;
pub mod top;
pub mod trace;
pub mod trace_events;
pub mod trace_local;
pub mod trace_tree;
pub mod up;
pub mod version;
pub mod wait;

use std::collections::BTreeMap;
use std::path::Path;
use std::time::Duration;

use agen_shared::client_config::ClientConfig;
use tokio_util::sync::CancellationToken;

/// Parses `90s`, `10m`, `1h30m`, `500ms`.
pub fn parse_duration(s: &str) -> Result<Duration, String> {
    humantime::parse_duration(s).map_err(|e| format!("{e}: expected a duration such as 90s or 10m"))
}

/// The token of `--metrics-token-file` (surrounding whitespace trimmed); unreadable or empty
/// is an error naming the file.
pub fn read_token_file(path: &std::path::Path) -> Result<String, String> {
    let text = std::fs::read_to_string(path).map_err(|e| {
        format!(
            "--metrics-token-file {}: cannot read it: {e}; give a readable file holding the token",
            path.display()
        )
    })?;
    let token = text.trim();
    if token.is_empty() {
        return Err(format!(
            "--metrics-token-file {}: the file is empty; put the bearer token in it",
            path.display()
        ));
    }
    Ok(token.to_string())
}

/// SIGINT/SIGTERM cancel `token` (graceful shutdown of daemons). The handlers are installed
/// before this returns, so a signal that comes right after start is never the default kill.
pub fn cancel_on_signals(token: CancellationToken) {
    use tokio::signal::unix::{signal, SignalKind};
    let (mut term, mut int) = match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(term), Ok(int)) => (term, int),
        (Err(e), _) | (_, Err(e)) => {
            tracing::warn!("cannot listen for SIGTERM and SIGINT: {e}");
            tokio::spawn(async move {
                let _ = tokio::signal::ctrl_c().await;
                token.cancel();
            });
            return;
        }
    };
    tokio::spawn(async move {
        tokio::select! {
            _ = int.recv() => {}
            _ = term.recv() => {}
        }
        tracing::info!("shutting down");
        token.cancel();
    });
}

/// Writes `cfg` as `<data_dir>/client.toml`, and as the user's client config when there is
/// none yet (or when the existing one points at this same data dir's CA).
/// Raises this process's soft open-file limit to its hard limit (the units set
/// `LimitNOFILE`): a Hub holds a connection per Nest and client, a Nest one per instance and
/// tool server, and the soft default (often 1024) is reached long before the hard one. A
/// failure leaves the limit as it was.
#[allow(unsafe_code)]
pub fn raise_open_file_limit() {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit only read and write the struct passed by pointer.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 && lim.rlim_cur < lim.rlim_max {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
}

pub fn write_client_config(cfg: &ClientConfig, data_dir: &Path) -> anyhow::Result<()> {
    cfg.write(&data_dir.join("client.toml"))?;
    let path = ClientConfig::default_path();
    let existing = ClientConfig::load(&path).unwrap_or_default();
    let ours = match (&existing.ca_file, &cfg.ca_file) {
        (Some(a), Some(b)) => a == b,
        _ => existing.hub == cfg.hub,
    };
    if existing == ClientConfig::default() || ours {
        cfg.write(&path)?;
        eprintln!("client config written to {}", path.display());
    } else {
        eprintln!(
            "client config {} points at another Hub; for this one: export AGEN_CONFIG={}",
            path.display(),
            data_dir.join("client.toml").display()
        );
    }
    Ok(())
}

/// Parses `k=v` labels; the error names the bad one.
pub fn parse_labels(labels: &[String]) -> Result<BTreeMap<String, String>, String> {
    let mut out = BTreeMap::new();
    for l in labels {
        match l.split_once('=') {
            Some((k, v)) if !k.trim().is_empty() => {
                out.insert(k.trim().to_string(), v.trim().to_string());
            }
            _ => {
                return Err(format!(
                    "--label {l}: expected key=value, e.g. --label zone=eu-1"
                ))
            }
        }
    }
    Ok(out)
}
