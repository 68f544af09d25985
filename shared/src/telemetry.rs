//! Logging setup shared by every binary: `tracing` to stderr (stdout is for command output
//! and, for `agen mcp …` and `agen instance`, for protocols), filtered by `RUST_LOG`.
//!
//! Invariants: colour (ANSI) only when stderr is a terminal; under systemd (`JOURNAL_STREAM`
//! names our stderr) every text line starts with its syslog priority (`<3>` error … `<7>`
//! debug), which journald reads as the entry's level; libraries (rmcp, hyper, h2, sled, …) log
//! at `warn` unless `RUST_LOG` says otherwise, Agen's own targets at the daemon's level.

use std::io::IsTerminal;

use tracing::{Event, Level, Subscriber};
use tracing_subscriber::fmt::format::{Format, Full, Writer};
use tracing_subscriber::fmt::{FmtContext, FormatEvent, FormatFields};
use tracing_subscriber::registry::LookupSpan;
use tracing_subscriber::EnvFilter;

/// `--log-format`: human text or one JSON object per line.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum LogFormat {
    #[default]
    Text,
    Json,
}

impl std::str::FromStr for LogFormat {
    type Err = String;
    fn from_str(s: &str) -> Result<LogFormat, String> {
        match s {
            "text" => Ok(LogFormat::Text),
            "json" => Ok(LogFormat::Json),
            other => Err(format!(
                "log format `{other}` is not known; use `text` or `json`"
            )),
        }
    }
}

/// The variable that selects the format of a process that has no `--log-format` flag (the
/// Nest sets it to `json` for its instances, so that it can read their lines back).
pub const LOG_FORMAT_ENV: &str = "AGEN_LOG_FORMAT";

/// Installs the stderr subscriber once; later calls are no-ops. `default` is the level of
/// Agen's own targets when `RUST_LOG` is unset (e.g. `"info"` for daemons, `"warn"` for client
/// commands). The format comes from `AGEN_LOG_FORMAT` (`text` when unset or unknown).
pub fn init(default: &str) {
    let format = std::env::var(LOG_FORMAT_ENV)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_default();
    init_with(default, format);
}

/// [`init`] with an explicit format (a daemon's `--log-format`).
pub fn init_with(default: &str, format: LogFormat) {
    let _ = init_reloadable(None, default, format);
}

/// The filter of a daemon's log: `level` (its `--log-level`: a level such as `debug`, or
/// directives such as `agen=debug,h2=warn`) when given, else `RUST_LOG`, else `default`; the
/// tool servers' lines are kept whatever it says. An unparsable `level` is an error naming it.
pub fn filter_for(level: Option<&str>, default: &str) -> Result<EnvFilter, String> {
    let filter = match level {
        Some(l) => EnvFilter::try_new(filter_directives(l)).map_err(|e| {
            format!("log level `{l}`: {e}; use error, warn, info, debug, trace or directives such as agen=debug")
        })?,
        None => match std::env::var("RUST_LOG") {
            Ok(v) => EnvFilter::try_new(filter_directives(&v))
                .unwrap_or_else(|_| EnvFilter::new(default_directives(default))),
            Err(_) => EnvFilter::new(default_directives(default)),
        },
    };
    // A tool server's stderr lines are its log, not ours: kept whatever the level.
    Ok(match KEPT_TARGET.parse() {
        Ok(d) => filter.add_directive(d),
        Err(_) => filter,
    })
}

/// Changes the filter of the subscriber that [`init_reloadable`] installed (SIGHUP).
pub struct LogFilter {
    set: Box<dyn Fn(EnvFilter) -> Result<(), String> + Send + Sync>,
}

impl LogFilter {
    /// Replaces the filter in force: later events follow `filter`.
    pub fn set(&self, filter: EnvFilter) -> Result<(), String> {
        (self.set)(filter)
    }
}

/// [`init_with`] whose filter ([`filter_for`] `level`) can be replaced later through the
/// returned [`LogFilter`]. An unknown `level` falls back to `default` (the caller validated it).
pub fn init_reloadable(level: Option<&str>, default: &str, format: LogFormat) -> LogFilter {
    let filter = filter_for(level, default)
        .or_else(|_| filter_for(None, default))
        .unwrap_or_else(|_| EnvFilter::new(default_directives(default)));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match format {
        // The target stays in JSON: a reader (the Nest) routes tool-server lines by it.
        LogFormat::Json => {
            let b = builder
                .json()
                .flatten_event(false)
                .with_current_span(false)
                .with_filter_reloading();
            let handle = b.reload_handle();
            let _ = b.try_init();
            LogFilter {
                set: Box::new(move |f| handle.reload(f).map_err(|e| e.to_string())),
            }
        }
        LogFormat::Text => {
            let ansi = std::io::stderr().is_terminal() && std::env::var_os("NO_COLOR").is_none();
            let inner = Format::default().with_target(false).with_ansi(ansi);
            let b = builder
                .with_target(false)
                .with_ansi(ansi)
                .event_format(Journal {
                    inner,
                    priorities: under_journald(),
                })
                .with_filter_reloading();
            let handle = b.reload_handle();
            let _ = b.try_init();
            LogFilter {
                set: Box::new(move |f| handle.reload(f).map_err(|e| e.to_string())),
            }
        }
    }
}

/// The target of tool servers' stderr lines (one event per line): always at `info`, whatever
/// `RUST_LOG` says, because `agen logs --server` reads them from the instance's log.
pub const KEPT_TARGET: &str = "agen::mcp::server=info";

/// The filter used when `RUST_LOG` is unset: libraries at `warn`, Agen at `level`.
pub fn default_directives(level: &str) -> String {
    format!("warn,agen={level}")
}

/// `RUST_LOG` as given, except that a bare `error`, `warn` or `info` sets Agen's level and
/// leaves libraries at `warn`: their chatter shows only at `debug` or when named.
pub fn filter_directives(rust_log: &str) -> String {
    match rust_log.trim() {
        level @ ("error" | "warn" | "info") => default_directives(level),
        other => other.to_string(),
    }
}

/// Whether stderr is connected to the journal (systemd sets `JOURNAL_STREAM` to its
/// `device:inode`).
fn under_journald() -> bool {
    let Some(stream) = std::env::var_os("JOURNAL_STREAM") else {
        return false;
    };
    let Some((dev, ino)) = stream.to_str().and_then(|s| s.split_once(':')) else {
        return false;
    };
    use std::os::unix::fs::MetadataExt;
    let Ok(meta) = std::fs::metadata("/proc/self/fd/2") else {
        return false;
    };
    dev.parse() == Ok(meta.dev()) && ino.parse() == Ok(meta.ino())
}

/// The syslog priority journald reads from a `<N>` line prefix.
pub fn syslog_priority(level: &Level) -> u8 {
    match *level {
        Level::ERROR => 3,
        Level::WARN => 4,
        Level::INFO => 6,
        Level::DEBUG | Level::TRACE => 7,
    }
}

/// The text format, with the syslog priority first under journald.
struct Journal {
    inner: Format<Full>,
    priorities: bool,
}

impl<S, N> FormatEvent<S, N> for Journal
where
    S: Subscriber + for<'a> LookupSpan<'a>,
    N: for<'a> FormatFields<'a> + 'static,
{
    fn format_event(
        &self,
        ctx: &FmtContext<'_, S, N>,
        mut writer: Writer<'_>,
        event: &Event<'_>,
    ) -> std::fmt::Result {
        if self.priorities {
            write!(writer, "<{}>", syslog_priority(event.metadata().level()))?;
        }
        self.inner.format_event(ctx, writer, event)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats_parse_and_unknown_ones_say_what_is_known() {
        assert_eq!("json".parse::<LogFormat>(), Ok(LogFormat::Json));
        assert_eq!("text".parse::<LogFormat>(), Ok(LogFormat::Text));
        assert_eq!(
            "xml".parse::<LogFormat>(),
            Err("log format `xml` is not known; use `text` or `json`".to_string())
        );
    }

    #[test]
    fn libraries_log_at_warn_and_agen_at_the_daemon_level() {
        assert_eq!(default_directives("info"), "warn,agen=info");
        assert_eq!(filter_directives("info"), "warn,agen=info");
        assert_eq!(filter_directives("debug"), "debug");
        assert_eq!(filter_directives("rmcp=info"), "rmcp=info");
        assert_eq!(syslog_priority(&Level::ERROR), 3);
        assert_eq!(syslog_priority(&Level::DEBUG), 7);
    }
}
