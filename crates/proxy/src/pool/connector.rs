//! Opening server connections for a pool: as many in parallel as demand
//! needs, bounded by `server_connect_concurrency`, the pool limit and
//! `max_db_connections`; failures back off with jitter. A connect always
//! lands in the pool, whether or not the waiter that caused it is still there.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;

use super::state::State;
use super::Pool;
use crate::server::{self, ConnectError, CountSlot, ServerConn};

impl Pool {
    /// Starts the connects that demand and limits call for. Called with the lock held.
    pub(super) fn want_connects(self: &Arc<Self>, st: &mut State) {
        let total = st.total();
        let waiting = st.live_waiters() as u32;
        let spare = st.idle.len() as u32 + st.connecting;
        // A paused pool (PAUSE, KILL, drain) opens nothing, as PgBouncer's.
        let for_waiters = if st.paused { 0 } else { waiting.saturating_sub(spare) };
        let for_min = if st.paused { 0 } else { st.opts.settings.min_pool_size.saturating_sub(total) };
        let want = for_waiters.max(for_min);
        let room = st.limit().saturating_sub(total);
        let slots = st.opts.connect_concurrency.saturating_sub(st.connecting);
        let n = want.min(room).min(slots);
        if n == 0 {
            return;
        }
        if let Some(at) = st.retry_at.filter(|at| *at > Instant::now()) {
            self.schedule_retry(st, at);
            return;
        }
        for _ in 0..n {
            let Some(slot) = CountSlot::take(&self.db_servers.0, st.opts.settings.max_db_connections) else {
                break;
            };
            st.connecting += 1;
            let pool = self.clone();
            let spec = st.opts.spec.clone();
            tokio::spawn(async move {
                let result = server::connect(&spec, &pool.metrics).await;
                pool.connected(result, slot);
            });
        }
    }

    fn schedule_retry(self: &Arc<Self>, st: &mut State, at: Instant) {
        if st.retry_scheduled {
            return;
        }
        st.retry_scheduled = true;
        let pool = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            if let Some(pool) = pool.upgrade() {
                let mut st = pool.lock();
                st.retry_scheduled = false;
                pool.want_connects(&mut st);
            }
        });
    }

    fn connected(self: &Arc<Self>, result: Result<ServerConn, ConnectError>, slot: CountSlot) {
        let mut st = self.lock();
        st.connecting -= 1;
        match result {
            Ok(mut conn) => {
                st.failures = 0;
                st.retry_at = None;
                st.last_error = None;
                conn.slot = Some(slot);
                conn.retire_at = conn.created + jittered(st.opts.lifetime);
                if st.server_params.is_none() {
                    st.server_params = Some(conn.params.clone());
                }
                self.hand_over(&mut st, conn);
            }
            Err(e) => {
                drop(slot);
                tracing::warn!(database = %self.key.database, user = %self.key.user, error = %e, "server connect failed");
                self.metrics.record_connect_failure(e.failure_label());
                st.failures += 1;
                st.retry_at = Some(Instant::now() + backoff(st.failures, st.opts.login_retry_max));
                st.last_error = Some(e.to_string());
            }
        }
        self.want_connects(&mut st);
    }
}

/// `d` shortened by up to 15% at random, so a pool's connections do not all
/// retire at the same moment.
pub(super) fn jittered(d: Duration) -> Duration {
    d.mul_f64(rand::thread_rng().gen_range(0.85..=1.0))
}

/// Exponential back-off from 50 ms up to `max`, with full jitter in its upper half.
fn backoff(failures: u32, max: Duration) -> Duration {
    let base = Duration::from_millis(50).saturating_mul(1 << failures.min(10)).min(max);
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
    fn jitter_stays_within_fifteen_percent() {
        for _ in 0..100 {
            let d = jittered(Duration::from_secs(100));
            assert!(d >= Duration::from_secs(85) && d <= Duration::from_secs(100));
        }
    }
}
