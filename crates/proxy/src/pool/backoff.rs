//! A pool's connect back-off (`Backoff`): the failures and the 53300
//! refusals in a row, the moment before which no connect starts, the last
//! connect error (which a wait that times out names) and Postgres's message
//! for a login it refused (which a client that finds no server is failed
//! with). Each outcome of a connect sets them together; the connector
//! (`connector.rs`) says which outcome came.

use std::time::{Duration, Instant};

use rand::Rng;

/// The connect back-off of one pool, inside its `State`.
#[derive(Debug, Default)]
pub(super) struct Backoff {
    /// Connects failed in a row (Postgres unreachable, or a login refused).
    failures: u32,
    /// Connects refused in a row with 53300 (too many connections): while
    /// non-zero the pool backs off and probes one connect at a time, and
    /// its waiters keep waiting (`connector::refused`).
    refusals: u32,
    /// No connect starts before this.
    retry_at: Option<Instant>,
    last_error: Option<String>,
    /// Postgres's message for the pool's last login, when Postgres refused
    /// it (cleared by the next server that logs in).
    rejected: Option<String>,
}

impl Backoff {
    /// A server logged in: every failure and refusal is forgotten.
    pub(super) fn succeeded(&mut self) {
        *self = Backoff::default();
    }

    /// A connect failed (Postgres unreachable, a timeout, a reset): the
    /// next starts after an exponential back-off up to `max`.
    pub(super) fn failed(&mut self, error: String, max: Duration, now: Instant) {
        self.failures += 1;
        self.last_error = Some(error);
        self.rejected = None;
        self.retry_at = Some(now + backoff(self.failures, max));
    }

    /// Postgres refused the login with `message`: the next connect starts
    /// after `retry` (server_login_retry), and until then a client that finds
    /// no server is failed with `message` (`login_refused`).
    pub(super) fn rejected(&mut self, error: String, message: String, retry: Duration, now: Instant) {
        self.failures += 1;
        self.last_error = Some(error);
        self.retry_at = Some(now + retry);
        self.rejected = Some(message);
    }

    /// Postgres refused a connect with 53300: the next starts after
    /// `pause(refusals in a row, this one counted)`. True for the first
    /// refusal of a run.
    pub(super) fn refused(&mut self, error: String, pause: impl FnOnce(u32) -> Duration, now: Instant) -> bool {
        let first = self.refusals == 0;
        self.refusals += 1;
        self.retry_at = Some(now + pause(self.refusals));
        self.last_error = Some(error);
        self.rejected = None;
        first
    }

    /// How servers are reached changed (server TLS): the cached login error
    /// and the failures' back-off are forgotten; a run of refusals is not.
    pub(super) fn forget_failures(&mut self) {
        self.rejected = None;
        self.retry_at = None;
        self.failures = 0;
    }

    /// A host of the database came to match: a back-off after failures
    /// ends now (one after refusals, or after a refused login, stays).
    pub(super) fn host_found(&mut self) {
        if self.refusals == 0 && self.rejected.is_none() {
            self.retry_at = None;
        }
    }

    /// Refused while below the fleet's enforced share, and the others have
    /// given servers back: the next connect may start now.
    pub(super) fn end_refusal_pause(&mut self) {
        if self.refusals > 0 {
            self.retry_at = None;
        }
    }

    /// A back-off is set (it may have passed).
    pub(super) fn is_set(&self) -> bool {
        self.retry_at.is_some()
    }

    /// When the back-off ends, if it is still running at `now`.
    pub(super) fn holds_until(&self, now: Instant) -> Option<Instant> {
        self.retry_at.filter(|at| *at > now)
    }

    /// Refused with 53300 in a row: connects go one at a time.
    pub(super) fn refusing(&self) -> bool {
        self.refusals > 0
    }

    /// The last connect error, until a server logs in.
    pub(super) fn last_error(&self) -> Option<String> {
        self.last_error.clone()
    }

    /// Postgres's message while the pool waits out server_login_retry after
    /// it refused the pool's login. Reads the clock only when a login was
    /// refused.
    pub(super) fn login_refused(&self) -> Option<&str> {
        let message = self.rejected.as_deref()?;
        self.retry_at.is_some_and(|at| at > Instant::now()).then_some(message)
    }
}

/// Exponential back-off from 50 ms up to `max`, with full jitter in its upper half.
fn backoff(failures: u32, max: Duration) -> Duration {
    let base = Duration::from_millis(50).saturating_mul(1 << failures.min(10)).min(max);
    base.mul_f64(rand::thread_rng().gen_range(0.5..=1.0))
}

/// The back-off after `refusals` 53300s in a row: from 100 ms doubling to
/// 500 ms, each drawn from its upper half, so an instance refused for as long
/// as its fleet stays at its limit tries at most 4 times a second.
pub(super) fn refusal_backoff(refusals: u32) -> Duration {
    let base = Duration::from_millis(100).saturating_mul(1 << refusals.min(4)).min(Duration::from_millis(500));
    base.mul_f64(rand::thread_rng().gen_range(0.5..=1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let max = Duration::from_secs(2);
        assert!(backoff(1, max) <= Duration::from_millis(100));
        assert!(backoff(20, max) <= max);
        assert!(backoff(20, max) >= Duration::from_secs(1));
    }

    #[test]
    fn refusal_backoff_tries_at_most_four_times_a_second() {
        for n in 4..20 {
            let d = refusal_backoff(n);
            assert!(d >= Duration::from_millis(250) && d <= Duration::from_millis(500), "{d:?}");
        }
        assert!(refusal_backoff(1) <= Duration::from_millis(200));
    }

    #[test]
    fn a_refused_login_fails_clients_until_its_retry_and_a_login_clears_all() {
        let mut b = Backoff::default();
        let now = Instant::now();
        b.rejected("refused".into(), "no such role".into(), Duration::from_secs(60), now);
        assert_eq!(b.login_refused(), Some("no such role"));
        assert_eq!(b.last_error().as_deref(), Some("refused"));
        b.host_found();
        assert!(b.holds_until(now).is_some(), "a found host does not end a refused login's wait");
        b.failed("reset".into(), Duration::from_secs(2), now);
        assert_eq!(b.login_refused(), None, "a failure that is no refusal clears the message");
        b.succeeded();
        assert!(!b.is_set() && b.last_error().is_none() && !b.refusing());
    }

    #[test]
    fn refusals_count_in_a_row_and_the_first_is_told() {
        let mut b = Backoff::default();
        let now = Instant::now();
        assert!(b.refused("53300".into(), |n| Duration::from_secs(n.into()), now));
        assert!(!b.refused("53300".into(), |n| Duration::from_secs(n.into()), now));
        assert_eq!(b.holds_until(now), Some(now + Duration::from_secs(2)), "the pause sees the refusals so far");
        assert!(b.refusing());
        b.end_refusal_pause();
        assert!(!b.is_set());
        b.forget_failures();
        assert!(b.refusing(), "a settings change keeps the run of refusals");
    }
}
