//! The systemd notify protocol (`NOTIFY_SOCKET`) for the daemons: `READY=1`, `STATUS=` lines,
//! `STOPPING=1`, and [`Watchdog`] pets (`WATCHDOG=1`) from the loops that must keep running.
//! Everything is a no-op when the process does not run under a `Type=notify` unit.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

fn under_systemd() -> bool {
    std::env::var_os("NOTIFY_SOCKET").is_some()
}

fn send(states: &[sd_notify::NotifyState]) {
    if !under_systemd() {
        return;
    }
    if let Err(e) = sd_notify::notify(false, states) {
        tracing::warn!(error = %e, "cannot notify systemd");
    }
}

/// `READY=1` with a status line.
pub fn ready(status: &str) {
    send(&[
        sd_notify::NotifyState::Ready,
        sd_notify::NotifyState::Status(status),
    ]);
}

/// A `STATUS=` line (what `systemctl status` shows).
pub fn status(status: &str) {
    send(&[sd_notify::NotifyState::Status(status)]);
}

/// `STOPPING=1`: shutdown has begun.
pub fn stopping() {
    send(&[
        sd_notify::NotifyState::Stopping,
        sd_notify::NotifyState::Status("stopping"),
    ]);
}

/// Sends `WATCHDOG=1` at most every half of `WATCHDOG_USEC`, from wherever [`Watchdog::pet`]
/// is called: a loop that stops calling it gets the process restarted by systemd.
#[derive(Debug)]
pub struct Watchdog {
    every: Option<Duration>,
    start: Instant,
    /// Milliseconds since `start` of the last pet sent (`u64::MAX`: none yet).
    last_ms: AtomicU64,
}

impl Default for Watchdog {
    fn default() -> Self {
        Self::from_env()
    }
}

impl Watchdog {
    /// Reads `WATCHDOG_USEC` (and `WATCHDOG_PID`, which must be this process when set).
    pub fn from_env() -> Watchdog {
        let mine = std::env::var("WATCHDOG_PID")
            .ok()
            .and_then(|p| p.trim().parse::<u32>().ok())
            .is_none_or(|pid| pid == std::process::id());
        let every = std::env::var("WATCHDOG_USEC")
            .ok()
            .and_then(|u| u.trim().parse::<u64>().ok())
            .filter(|u| *u > 0 && mine && under_systemd())
            .map(|u| Duration::from_micros(u) / 2);
        Watchdog {
            every,
            start: Instant::now(),
            last_ms: AtomicU64::new(u64::MAX),
        }
    }

    /// Sends `WATCHDOG=1` when half the watchdog interval has passed since the last one.
    pub fn pet(&self) {
        let Some(every) = self.every else { return };
        let now = self.start.elapsed().as_millis() as u64;
        let last = self.last_ms.load(Ordering::Relaxed);
        if last != u64::MAX && now.saturating_sub(last) < every.as_millis() as u64 {
            return;
        }
        if self
            .last_ms
            .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
            .is_ok()
        {
            send(&[sd_notify::NotifyState::Watchdog]);
        }
    }
}
