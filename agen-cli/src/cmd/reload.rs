//! SIGHUP for the daemons `agen hub` and `agen nest`: parse the same argv and environment
//! again with the config file read anew ([`crate::daemon_config::reparse`]), apply the keys that
//! can change live, and log what changed and what waits for a restart.
//!
//! Live: `log-level` (the tracing filter is swapped); on the Hub `task-retention` and
//! `audit-retention` (the sweep follows at once); on a Nest `label` and `cordon` (sent to the
//! Hub at once, `NestSettings`: `agen nests` shows the new labels and placement follows them). Every other changed key is logged as needing
//! a restart and keeps its value in force (and is named again at the next SIGHUP until the
//! restart). A file that no longer parses changes nothing and is logged as an error.

use std::sync::Arc;

use agen_hub::core::retention::LiveRetention;
use agen_shared::telemetry::LogFilter;
use anyhow::Context;

use crate::daemon_config::{live_keys, Effective};

/// What a reload can change in a running daemon.
pub struct Live {
    pub log: LogFilter,
    /// The Hub's retentions (`None` on a Nest).
    pub retention: Option<Arc<LiveRetention>>,
    /// A Nest's labels and cordon (`None` on the Hub).
    pub nest: Option<agen_nest::config::LiveSettings>,
}

/// The SIGHUP handler, installed before the daemon starts so that a SIGHUP never kills it.
pub struct Reloads {
    hup: tokio::signal::unix::Signal,
}

impl Reloads {
    pub fn listen() -> anyhow::Result<Reloads> {
        use tokio::signal::unix::{signal, SignalKind};
        let hup = signal(SignalKind::hangup()).context("while installing the SIGHUP handler")?;
        Ok(Reloads { hup })
    }

    /// Reloads on every SIGHUP from `current` on, until the process ends.
    pub fn spawn(mut self, mut current: Effective, live: Live) {
        tokio::spawn(async move {
            while self.hup.recv().await.is_some() {
                current = reload(current, &live);
            }
        });
    }
}

/// One reload: returns the configuration now in force.
fn reload(current: Effective, live: &Live) -> Effective {
    let daemon = current.daemon.clone();
    let new = match crate::daemon_config::reparse() {
        Ok(cli) => match cli.command {
            crate::Command::Hub(a) => a.effective,
            crate::Command::Nest(a) => a.effective,
            _ => return current,
        },
        Err(e) => {
            tracing::error!(
                "SIGHUP: the configuration was not reloaded: {e}; the one in force is kept"
            );
            return current;
        }
    };
    let mut applied = Vec::new();
    let mut refused = Vec::new();
    let mut restart = Vec::new();
    let mut in_force = new.clone();
    for key in current.changed(&new) {
        let change = format!("{key} {} -> {}", current.shown(&key), new.shown(&key));
        let result = match key.as_str() {
            _ if !live_keys(&daemon).contains(&key.as_str()) => None,
            "log-level" => Some(set_log_level(&new, live)),
            "task-retention" | "audit-retention" => Some(set_retention(&new, live)),
            "label" | "cordon" => Some(set_node(&new, live)),
            _ => None,
        };
        match result {
            Some(Ok(())) => {
                applied.push(change);
                continue;
            }
            Some(Err(e)) => refused.push(format!("{change}: {e}")),
            None => restart.push(change),
        }
        keep(&mut in_force, &current, &key);
    }
    if applied.is_empty() && refused.is_empty() && restart.is_empty() {
        tracing::info!("SIGHUP: agen {daemon}: the configuration is unchanged");
    }
    if !applied.is_empty() {
        tracing::info!(
            "SIGHUP: agen {daemon}: applied without a restart: {}",
            applied.join("; ")
        );
    }
    if !refused.is_empty() {
        tracing::error!(
            "SIGHUP: agen {daemon}: not applied: {}; the values in force are kept",
            refused.join("; ")
        );
    }
    if !restart.is_empty() {
        tracing::warn!(
            "SIGHUP: agen {daemon}: changed but applied only at a restart: {}",
            restart.join("; ")
        );
    }
    in_force
}

/// `in_force`'s setting of `key` put back to `old`'s (a change not applied).
fn keep(in_force: &mut Effective, old: &Effective, key: &str) {
    in_force.settings.retain(|s| s.key != key);
    if let Some(s) = old.get(key) {
        in_force.settings.push(s.clone());
        in_force.settings.sort_by(|a, b| a.key.cmp(&b.key));
    }
}

fn set_log_level(new: &Effective, live: &Live) -> Result<(), String> {
    let level = new.get("log-level").and_then(|s| s.values.first().cloned());
    let filter = agen_shared::telemetry::filter_for(level.as_deref(), "info")?;
    live.log.set(filter)
}

fn set_retention(new: &Effective, live: &Live) -> Result<(), String> {
    let Some(retention) = &live.retention else {
        return Err("no retention on this daemon".into());
    };
    let read = |key: &str| -> Result<std::time::Duration, String> {
        let text = new
            .get(key)
            .and_then(|s| s.values.first().cloned())
            .ok_or_else(|| format!("{key} has no value"))?;
        let d = crate::cmd::parse_duration(&text).map_err(|e| format!("{key}: {e}"))?;
        if d < std::time::Duration::from_secs(1) {
            return Err(format!("{key} must be at least 1s"));
        }
        Ok(d)
    };
    retention.set(read("task-retention")?, read("audit-retention")?);
    Ok(())
}

fn set_node(new: &Effective, live: &Live) -> Result<(), String> {
    let Some(settings) = &live.nest else {
        return Err("no labels on this daemon".into());
    };
    let labels = new
        .get("label")
        .map(|s| s.values.clone())
        .unwrap_or_default();
    let labels = crate::cmd::parse_labels(&labels)?;
    let cordon = new
        .get("cordon")
        .and_then(|s| s.values.first())
        .is_some_and(|v| v == "true");
    settings.set(agen_nest::config::NodeSettings { labels, cordon });
    Ok(())
}
