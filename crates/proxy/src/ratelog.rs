//! [`RateLimited`]: at most one line a second for a warning that overload can
//! repeat thousands of times a second ("query dropped", "max_client_conn
//! reached"), with the count of the lines it held back. One static per call
//! site; it holds no configuration, only its own clock and count.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

/// How often a rate-limited line may be written.
pub(crate) const PERIOD: Duration = Duration::from_secs(1);

/// One call site's limiter. `const`-constructible, so it can be a `static`.
#[derive(Debug, Default)]
pub(crate) struct RateLimited {
    /// Milliseconds since [`epoch`] before which no line is written.
    next_ms: AtomicU64,
    /// Lines held back since the last one written.
    held: AtomicU64,
}

fn epoch() -> Instant {
    static EPOCH: OnceLock<Instant> = OnceLock::new();
    *EPOCH.get_or_init(Instant::now)
}

impl RateLimited {
    /// A limiter that lets the first line through.
    pub(crate) const fn new() -> Self {
        RateLimited { next_ms: AtomicU64::new(0), held: AtomicU64::new(0) }
    }

    /// `Some(n)` when a line may be written now, `n` being how many were
    /// held back since the last; `None` (and one more held back) otherwise.
    pub(crate) fn allow(&self) -> Option<u64> {
        self.allow_at(u64::try_from(epoch().elapsed().as_millis()).unwrap_or(u64::MAX))
    }

    fn allow_at(&self, now_ms: u64) -> Option<u64> {
        let next = self.next_ms.load(Ordering::Relaxed);
        let period = u64::try_from(PERIOD.as_millis()).unwrap_or(u64::MAX);
        let won = now_ms >= next
            && self
                .next_ms
                .compare_exchange(next, now_ms.saturating_add(period), Ordering::AcqRel, Ordering::Relaxed)
                .is_ok();
        if won {
            Some(self.held.swap(0, Ordering::AcqRel))
        } else {
            self.held.fetch_add(1, Ordering::AcqRel);
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_a_period_with_the_count_held_back() {
        let r = RateLimited::new();
        assert_eq!(r.allow_at(5), Some(0));
        assert_eq!(r.allow_at(6), None);
        assert_eq!(r.allow_at(1004), None);
        assert_eq!(r.allow_at(1005), Some(2));
        assert_eq!(r.allow_at(1006), None);
        assert_eq!(r.allow_at(9000), Some(1));
    }
}
