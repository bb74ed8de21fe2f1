//! The end of queue waits whose budget ran out: one timer per pool, set to
//! the earliest deadline among its waiters, instead of one per waiter. A
//! waiter past its deadline is taken out of the queue and told `Expired`;
//! its client gets the wait-timeout error (53300), as before.
//!
//! A timer per waiter was reset at every wait (an atomic and, at a full
//! pool, a cold line per queued request) and polled beside the waiter's
//! channel. This one moves only when a waiter's deadline comes before the
//! one it is set to: when the queue was empty, or a waiter has a shorter
//! budget than those ahead of it. Served waiters leave it set too early; it
//! then fires, finds nothing past its deadline, and moves on to the
//! earliest one left (one pass over the queue).

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::Pool;

/// With no waiter, how often the task looks whether its pool still exists.
const IDLE_RECHECK: Duration = Duration::from_secs(1);

pub(super) fn spawn(pool: &Arc<Pool>) {
    let weak = Arc::downgrade(pool);
    let wake = pool.state.lock().expiry_wake();
    tokio::spawn(async move {
        let mut timer = Box::pin(tokio::time::sleep(IDLE_RECHECK));
        loop {
            // The pool is not held across the wait: the task ends with it.
            let Some(at) = Weak::upgrade(&weak).map(|pool| pool.state.lock().expiry_at()) else { return };
            timer.as_mut().reset(at.unwrap_or_else(|| Instant::now() + IDLE_RECHECK).into());
            // Both branches are cancel-safe: a notification not taken stays
            // stored for the next `notified`, and the timer is reset above.
            tokio::select! {
                biased;
                _ = wake.notified() => {}
                _ = timer.as_mut() => {
                    let Some(pool) = Weak::upgrade(&weak) else { return };
                    pool.expire_waiters(Instant::now());
                }
            }
        }
    });
}

impl Pool {
    fn expire_waiters(&self, now: Instant) {
        self.state.lock().expire_waiters(now);
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use crate::config::Config;
    use crate::pool::{PoolError, PoolKey, Pools};

    #[tokio::test]
    async fn a_shorter_budget_behind_a_longer_one_ends_on_its_own_deadline() {
        // Port 1 on loopback: nothing listens, and the pool is paused anyway,
        // so no waiter is ever served.
        let cfg = Config::from_toml(
            "[weir]\nauth_type = \"trust\"\n[databases.app]\nhost = \"127.0.0.1\"\nport = 1\n",
            std::path::Path::new("."),
        )
        .unwrap();
        let key = PoolKey { database: "app".into(), user: "u".into() };
        let pool = Pools::new().get_or_create(&cfg, &key, None).unwrap();
        pool.pause();
        let started = Instant::now();
        let long = tokio::spawn({
            let pool = pool.clone();
            async move { pool.acquire(started + Duration::from_secs(30)).await.map(drop) }
        });
        while pool.snapshot().waiting < 1 {
            tokio::task::yield_now().await;
        }
        let short = pool.acquire(Instant::now() + Duration::from_millis(50));
        // Bounded, so that an expiry that never fires fails the test.
        let short = tokio::time::timeout(Duration::from_secs(10), short).await.expect("the wait ended");
        assert!(matches!(short, Err(PoolError::WaitTimeout { .. })), "{short:?}");
        assert!(!long.is_finished(), "the longer wait ahead is still queued");
        assert_eq!(pool.snapshot().waiting, 1, "the expired waiter left the queue");
        long.abort();
    }
}
