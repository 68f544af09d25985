//! Exponential back-off with jitter, used for instance restarts and Hub reconnects.
//!
//! Invariants: delays double from `base` up to `cap`; jitter only ever shortens a delay (by up
//! to a quarter), so `cap` is a true upper bound; `reset` after a success starts over.

use std::time::Duration;

#[derive(Debug, Clone)]
pub struct Backoff {
    base: Duration,
    cap: Duration,
    attempt: u32,
}

impl Backoff {
    pub fn new(base: Duration, cap: Duration) -> Backoff {
        Backoff {
            base,
            cap,
            attempt: 0,
        }
    }

    /// The delay before the next try, without jitter (for messages and tests).
    pub fn peek(&self) -> Duration {
        let factor = 1u32.checked_shl(self.attempt.min(20)).unwrap_or(u32::MAX);
        self.base.saturating_mul(factor).min(self.cap)
    }

    /// The delay before the next try (with jitter), and counts the try.
    pub fn next_delay(&mut self) -> Duration {
        let d = self.peek();
        self.attempt = self.attempt.saturating_add(1);
        let jitter: f64 = rand::random::<f64>() * 0.25;
        d.mul_f64(1.0 - jitter)
    }

    pub fn attempts(&self) -> u32 {
        self.attempt
    }

    pub fn reset(&mut self) {
        self.attempt = 0;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_double_up_to_the_cap_and_reset_starts_over() {
        let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
        let expected = [100, 200, 400, 800, 1000, 1000];
        for ms in expected {
            assert_eq!(b.peek(), Duration::from_millis(ms));
            let d = b.next_delay();
            assert!(
                d <= Duration::from_millis(ms) && d >= Duration::from_millis(ms * 3 / 4),
                "{d:?} vs {ms}"
            );
        }
        b.reset();
        assert_eq!(b.peek(), Duration::from_millis(100));
    }

    #[test]
    fn many_attempts_do_not_overflow() {
        let mut b = Backoff::new(Duration::from_secs(1), Duration::from_secs(5));
        for _ in 0..100 {
            assert!(b.next_delay() <= Duration::from_secs(5));
        }
    }
}
