//! Logging setup shared by every binary: `tracing` to stderr (stdout is for command output
//! and, for `agen mcp …` and `agen instance`, for protocols), filtered by `RUST_LOG`.

use tracing_subscriber::EnvFilter;

/// Installs the stderr subscriber once; later calls are no-ops. `default` is the filter used
/// when `RUST_LOG` is unset (e.g. `"info"` for daemons, `"warn"` for client commands).
pub fn init(default: &str) {
    let filter = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(default));
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_target(false)
        .try_init();
}
