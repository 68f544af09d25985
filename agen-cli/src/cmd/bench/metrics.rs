//! The Hub's durability counters as `agen bench` sees them: one scrape of the bench Hub's
//! Prometheus text (`--metrics-listen`, loopback, port 0) before and one after the measured
//! phase; the difference is what the measured window cost in store flushes (fsyncs, and the
//! time spent in them) and how many run events each flush made durable.
//!
//! Invariants: a counter the Hub does not export, or a scrape that fails, is `None` (reported
//! as "n/a"), never zero; the scrape is one plain HTTP/1.1 `GET /metrics` with a deadline, so
//! it cannot hang the benchmark.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{bail, Context};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// The Hub's store flushes (`hub/src/metrics.rs`).
const FSYNCS: &str = "agen_store_fsyncs";
/// Run events the Hub stored (each is durable once the next flush returns).
const RUN_EVENTS: &str = "agen_run_events_appended";
/// Seconds spent in store flushes (the sum of the flush-duration histogram).
const FSYNC_SECONDS: &str = "agen_store_fsync_duration_seconds_sum";
/// A scrape that takes longer than this counts as failed.
const SCRAPE_TIMEOUT: Duration = Duration::from_secs(5);
/// A metrics page larger than this is refused.
const MAX_BODY: usize = 4 * 1024 * 1024;

/// The counters read in one scrape.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub(super) struct Counters {
    pub fsyncs: Option<f64>,
    pub run_events: Option<f64>,
    pub fsync_seconds: Option<f64>,
}

impl Counters {
    /// The counters found in a Prometheus / OpenMetrics text page.
    pub fn parse(text: &str) -> Counters {
        Counters {
            fsyncs: counter(text, FSYNCS),
            run_events: counter(text, RUN_EVENTS),
            fsync_seconds: counter(text, FSYNC_SECONDS),
        }
    }

    /// What changed from `before` to `self`; a counter missing on either side is `None`.
    pub fn since(&self, before: &Counters) -> Counters {
        let d = |a: Option<f64>, b: Option<f64>| Some(a? - b?);
        Counters {
            fsyncs: d(self.fsyncs, before.fsyncs),
            run_events: d(self.run_events, before.run_events),
            fsync_seconds: d(self.fsync_seconds, before.fsync_seconds),
        }
    }
}

/// Scrapes the Hub at `addr`; `None` (with a warning) when it cannot be read.
pub(super) async fn scrape(addr: Option<SocketAddr>) -> Counters {
    let Some(addr) = addr else {
        return Counters::default();
    };
    match tokio::time::timeout(SCRAPE_TIMEOUT, get_metrics(addr)).await {
        Ok(Ok(text)) => Counters::parse(&text),
        Ok(Err(e)) => {
            eprintln!("agen bench: cannot read the Hub's metrics at {addr}: {e:#}");
            Counters::default()
        }
        Err(_) => {
            eprintln!(
                "agen bench: the Hub's metrics at {addr} did not answer within {SCRAPE_TIMEOUT:?}"
            );
            Counters::default()
        }
    }
}

async fn get_metrics(addr: SocketAddr) -> anyhow::Result<String> {
    let mut stream = tokio::net::TcpStream::connect(addr)
        .await
        .context("cannot connect")?;
    stream
        .write_all(
            format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n")
                .as_bytes(),
        )
        .await
        .context("cannot send the request")?;
    let mut raw = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        let n = stream
            .read(&mut buf)
            .await
            .context("cannot read the answer")?;
        if n == 0 {
            break;
        }
        raw.extend_from_slice(&buf[..n]);
        if raw.len() > MAX_BODY {
            bail!("the metrics page is larger than {MAX_BODY} bytes");
        }
    }
    let text = String::from_utf8_lossy(&raw);
    let Some((head, body)) = text.split_once("\r\n\r\n") else {
        bail!("the answer has no HTTP head");
    };
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        bail!("the answer is {status:?}, not 200");
    }
    Ok(body.to_owned())
}

/// The sum over every sample of counter `name` (`name_total` in OpenMetrics, any labels).
fn counter(text: &str, name: &str) -> Option<f64> {
    let total = format!("{name}_total");
    let mut sum = None;
    for line in text.lines().filter(|l| !l.starts_with('#')) {
        let name_end = line.find(['{', ' ']).unwrap_or(line.len());
        let metric = &line[..name_end];
        if metric != name && metric != total {
            continue;
        }
        let rest = &line[name_end..];
        let after_labels = match rest.strip_prefix('{') {
            Some(labels) => labels.rfind('}').map(|i| &labels[i + 1..]),
            None => Some(rest),
        };
        let value = after_labels
            .and_then(|r| r.split_whitespace().next())
            .and_then(|v| v.parse::<f64>().ok());
        if let Some(v) = value {
            *sum.get_or_insert(0.0) += v;
        }
    }
    sum
}

#[cfg(test)]
mod tests {
    use super::Counters;

    #[test]
    fn counters_are_read_from_openmetrics_text() {
        let before = Counters::parse(
            "# HELP agen_store_fsyncs Store flushes to disk.\n\
             # TYPE agen_store_fsyncs counter\n\
             agen_store_fsyncs_total 10\n\
             agen_store_fsync_duration_seconds_sum 0.5\n\
             agen_run_events_appended_total 40\n\
             # EOF\n",
        );
        assert_eq!(
            before,
            Counters {
                fsyncs: Some(10.0),
                run_events: Some(40.0),
                fsync_seconds: Some(0.5)
            }
        );
        let after = Counters::parse(
            "agen_store_fsyncs_total{store=\"a\"} 12\nagen_store_fsyncs_total{store=\"b\"} 3\n\
             agen_run_events_appended_total 100\n\
             agen_store_fsync_duration_seconds_sum 0.75\n",
        );
        assert_eq!(
            after.since(&before),
            Counters {
                fsyncs: Some(5.0),
                run_events: Some(60.0),
                fsync_seconds: Some(0.25)
            }
        );
        let old_hub = Counters::parse("agen_tasks_total 3\n");
        assert_eq!(old_hub, Counters::default());
        assert_eq!(after.since(&old_hub), Counters::default());
    }
}
