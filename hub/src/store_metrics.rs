//! The store's flush counters, `agen_store_fsyncs_total` and
//! `agen_store_fsync_duration_seconds`: plain process-wide counters (one process may hold several
//! Hubs in tests; they share these) that the store feeds on every flush and `metrics.rs`
//! registers. A leaf: it knows neither the store nor the core, so the store can count without
//! reaching up.

use std::sync::LazyLock;
use std::time::Duration;

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// 5 ms … ~164 s.
pub(crate) fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.005, 2.0, 16))
}

static STORE_FSYNCS: LazyLock<Counter> = LazyLock::new(Counter::default);
static STORE_FSYNC_SECONDS: LazyLock<Histogram> = LazyLock::new(seconds_histogram);

/// Store flushes counted in this process so far.
pub fn store_fsyncs() -> u64 {
    STORE_FSYNCS.get()
}

/// Records one store flush that took `took`.
pub fn store_flushed(took: Duration) {
    STORE_FSYNCS.inc();
    STORE_FSYNC_SECONDS.observe(took.as_secs_f64());
}

/// Adds the flush counters to the Hub's registry.
pub fn register(registry: &mut Registry) {
    registry.register(
        "agen_store_fsyncs",
        "Store flushes to disk",
        STORE_FSYNCS.clone(),
    );
    registry.register(
        "agen_store_fsync_duration_seconds",
        "One store flush",
        STORE_FSYNC_SECONDS.clone(),
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn store_flushes_are_counted() {
        let before = store_fsyncs();
        store_flushed(Duration::from_millis(3));
        assert!(store_fsyncs() > before);
    }
}
