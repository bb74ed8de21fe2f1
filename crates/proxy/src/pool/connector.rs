//! Opening server connections for a pool: as many in parallel as demand
//! needs, bounded by `server_connect_concurrency`, the pool limit and
//! `max_db_connections`; failures back off with jitter. A connect always
//! lands in the pool, whether or not the waiter that caused it is still there.
//!
//! Demand is the live waiters not covered by idle or connecting servers, or
//! the shortfall below `min_pool_size`, whichever is larger. The limit is
//! `pool_size`, plus `reserve_pool_size` once the oldest waiter has waited
//! `reserve_pool_timeout` (PgBouncer's meaning); a timer wakes the connector at
//! that moment, and at the end of a back-off. A database at
//! `max_db_connections` is retried by the pool's upkeep every 500 ms.
//!
//! Server failures are PgBouncer's: while Postgres cannot be reached (a
//! connect refused, timed out or reset), connects back off and retry and
//! clients keep waiting within their `query_wait_timeout`, logins of a pool
//! that never connected too, so a restart of a second costs a login only
//! that second. A login Postgres refuses (a password, pg_hba.conf, no such
//! role or database) fails the waiting clients at once with Postgres's own
//! SQLSTATE and message, and the pool tries again after `server_login_retry`.
//!
//! A refusal with 53300 (a role's or database's CONNECTION LIMIT,
//! max_connections, reserved slots) is backpressure, not a failure: the pool
//! backs off with jitter, probes one connect at a time until one succeeds,
//! and its clients keep waiting within their budget for the servers it has.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::Rng;

use super::backoff::refusal_backoff;
use super::room::Cap;
use super::state::State;
use super::{Handed, Lease, Pool, PoolError};
use crate::params::ParamMap;
use crate::server::{ConnectError, CountSlot, ServerConn};

impl Pool {
    /// Starts the connects that demand and limits call for. Called with the lock held.
    pub(super) fn want_connects(self: &Arc<Self>, st: &mut State) {
        let total = st.total();
        // A full pool with no reserve and no back-off can open or schedule
        // nothing: skip the walk over every waiter (this runs on each enqueue).
        if total >= st.opts.settings.pool_size && st.opts.settings.reserve_pool_size == 0 && !st.backoff().is_set() {
            self.release_room(st);
            return;
        }
        let mut want = st.unmet_demand();
        // An eviction made room for this pool: the connect is made even if
        // the demand went meanwhile (as PgBouncer's, whose launch follows its
        // eviction at once), so the database (or user) stays at its cap.
        if want == 0 && st.room_mut().kept() && !st.is_paused() && total < st.limit() {
            want = 1;
        }
        if want == 0 {
            self.release_room(st);
            return;
        }
        if let Some(at) = st.backoff().holds_until(Instant::now()) {
            self.wake_at(st, at);
            return;
        }
        // fleet_share: no connect past this instance's share of the fleet's
        // budget while the fleet is at its limit.
        let room = st.limit().min(st.fleet().cap.unwrap_or(u32::MAX)).saturating_sub(total);
        if room < want {
            if let Some(at) = reserve_due_at(st) {
                self.wake_at(st, at);
            }
        }
        // Refused for too many connections: one probe at a time, not a burst.
        let concurrency = if st.backoff().refusing() { 1 } else { st.opts.connect_concurrency };
        let slots = concurrency.saturating_sub(st.counts().connecting());
        for _ in 0..want.min(room).min(slots) {
            let max_db = st.opts.settings.max_db_connections;
            let Some(slot) = st.room_mut().take(Cap::Db).or_else(|| CountSlot::take(&self.db_servers.count, max_db))
            else {
                self.make_room(st, Cap::Db);
                break;
            };
            let max_user = st.opts.settings.max_user_connections;
            let Some(user_slot) =
                st.room_mut().take(Cap::User).or_else(|| CountSlot::take(&self.user_servers.count, max_user))
            else {
                st.room_mut().give(Cap::Db, slot);
                self.make_room(st, Cap::User);
                break;
            };
            if st.total() >= st.opts.settings.pool_size {
                self.log_reserve(st);
            }
            st.counts_mut().connect_started();
            let pool = self.clone();
            let spec = Arc::new(st.opts.spec.clone());
            tokio::spawn(async move {
                let result = super::hosts::connect(&pool, spec).await;
                pool.connected(result, (slot, user_slot));
            });
        }
    }

    /// A place an eviction kept for this pool that nothing here needs now
    /// goes back to the count, and the pools held back by it are woken.
    fn release_room(self: &Arc<Self>, st: &mut State) {
        if st.room_mut().release().is_some() {
            self.wake_blocked_siblings();
        }
    }

    /// PgBouncer's warning when a connect goes beyond pool_size.
    fn log_reserve(&self, st: &State) {
        crate::span::client_event!(warn,
            database = %self.key.database,
            user = %self.key.user,
            servers = st.total(),
            pool_size = st.opts.settings.pool_size,
            "taking connection from reserve_pool"
        );
    }

    /// Runs `want_connects` again at `at` (the end of a back-off, or when the
    /// reserve opens), unless a wake-up at or before `at` is already set.
    fn wake_at(self: &Arc<Self>, st: &mut State, at: Instant) {
        if !st.set_wake(at, Instant::now()) {
            return;
        }
        let pool = Arc::downgrade(self);
        tokio::spawn(async move {
            tokio::time::sleep_until(at.into()).await;
            if let Some(pool) = pool.upgrade() {
                let mut st = pool.state.lock();
                st.woke(at);
                pool.want_connects(&mut st);
            }
        });
    }

    fn connected(self: &Arc<Self>, result: Result<ServerConn, ConnectError>, slots: (CountSlot, CountSlot)) {
        let (slot, user_slot) = slots;
        let mut st = self.state.lock();
        st.counts_mut().connect_ended();
        match result {
            Ok(mut conn) => {
                st.backoff_mut().succeeded();
                conn.admit(slot, user_slot, jittered(st.opts.lifetime));
                st.keep_server_params(|| Arc::new(conn.params.clone()));
                self.hand_over(&mut st, Box::new(conn), Instant::now());
            }
            Err(e) if e.refusal().is_some() => {
                drop(slot);
                self.refused(&mut st, &e);
            }
            Err(e) => {
                drop(slot);
                self.metrics.record_connect_failure(e.failure_label());
                match e.rejection() {
                    Some((code, message)) => self.login_rejected(&mut st, &e, code, message),
                    None => {
                        let (db, user) = (&self.key.database, &self.key.user);
                        let reason = e.close_reason();
                        tracing::warn!(error = %e, "S: {db}/{user} server connect failed, closing because: {reason}");
                        let max = st.opts.login_retry_max;
                        st.backoff_mut().failed(e.to_string(), max, Instant::now());
                    }
                }
            }
        }
        self.want_connects(&mut st);
    }

    /// A server that logged in is idle, or lent and not marked by RECONNECT
    /// (one that is marks closes as it comes back: PgBouncer counts it out
    /// as its pool is dirty).
    fn has_usable_server(&self, st: &State) -> bool {
        if !st.idle().is_empty() {
            return true;
        }
        if st.counts().active() == 0 && st.counts().recovering() == 0 {
            return false;
        }
        let Some(mark) = st.reconnect_mark() else { return true };
        let wall = std::time::SystemTime::now() - mark.elapsed();
        self.metrics.live_servers().iter().any(|s| s.connected_at >= wall)
    }

    /// Postgres refused a connect with 53300: count it by the limit it named
    /// and back off (with jitter, so a fleet of weirs does not retry in step).
    /// Waiters are not failed, nor is a login waiting for a first server:
    /// they wait within their budget for a server freed here or a later
    /// connect, and a wait that times out names this error.
    fn refused(&self, st: &mut State, e: &ConnectError) {
        let reason = e.refusal().unwrap_or(weir_metrics::ConnectRefusal::Other);
        self.metrics.record_connect_refused(reason);
        // Below its enforced share, the others are giving servers back: the
        // next try comes at the fleet round's pace (at most 5 a second).
        let below_share = st.fleet().below_share(st.total());
        let pause = |refusals| if below_share { super::fleet::refusal_pause() } else { refusal_backoff(refusals) };
        if st.backoff_mut().refused(e.to_string(), pause, Instant::now()) {
            tracing::warn!(database = %self.key.database, user = %self.key.user, error = %e,
                "server connect refused: too many connections; backing off");
        }
    }

    /// Postgres refused the pool's login (PgBouncer's
    /// kill_pool_logins_server_error): the clients waiting now get its
    /// SQLSTATE and message at once, unless the pool still has a usable
    /// server that logged in earlier; the next attempt waits
    /// server_login_retry, and until then a client that finds no server is
    /// failed with the cached error (`State::login_failing`).
    fn login_rejected(&self, st: &mut State, e: &ConnectError, code: crate::protocol::SqlState, message: String) {
        tracing::warn!(database = %self.key.database, user = %self.key.user, sqlstate = code.code(), "server login failed: FATAL {message}");
        tracing::info!("S: {}/{} closing because: {message} (age=0s)", self.key.database, self.key.user);
        if !self.has_usable_server(st) {
            for w in st.drain_waiters() {
                let _ = w.tx.send(Handed::Rejected(code, message.clone()));
            }
        }
        let retry = st.opts.login_retry_max;
        st.backoff_mut().rejected(e.to_string(), message, retry, Instant::now());
    }

    /// Server parameters for a client's login. A pool that has never
    /// connected opens a server to learn them, and the login waits for it
    /// within its budget, as any waiter (connect errors are retried with
    /// back-off meanwhile; a login Postgres refuses fails it at once).
    /// With `keep` (a session login, which takes a server next anyway) the
    /// server that was opened for them is handed back with them, so the
    /// login costs one server assignment, not two. Shared, not copied:
    /// every login reads them.
    pub async fn server_params(
        self: &Arc<Self>,
        deadline: Instant,
        keep: bool,
    ) -> Result<(Arc<ParamMap>, Option<Lease>), PoolError> {
        if let Some(p) = self.state.lock().server_params() {
            return Ok((p, None));
        }
        let lease = self.acquire(deadline).await?;
        let params = Arc::new(lease.conn().params.clone());
        // Bound first: a lock guard in the tail expression would outlive
        // `lease`, whose drop takes the same lock.
        let shared = self.state.lock().keep_server_params(|| params);
        Ok((shared, keep.then_some(lease)))
    }
}

/// When the reserve opens for the oldest waiter, if it has not yet.
fn reserve_due_at(st: &State) -> Option<Instant> {
    if st.opts.settings.reserve_pool_size == 0 {
        return None;
    }
    let at = st.oldest_since()? + st.opts.reserve_pool_timeout;
    (at > Instant::now()).then_some(at)
}

/// `d` shortened by up to 15% at random, so a pool's connections do not all
/// retire at the same moment.
pub(super) fn jittered(d: Duration) -> Duration {
    d.mul_f64(rand::thread_rng().gen_range(0.85..=1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connect_concurrency_is_capped_at_pool_size_plus_reserve() {
        let toml =
            "[weir]\nauth_type = \"trust\"\n[databases.small]\npool_size = 3\nreserve_pool_size = 1\n[databases.big]\n";
        let cfg = crate::config::Config::from_toml(toml, std::path::Path::new(".")).unwrap();
        let opts = |db: &str| {
            let key = super::super::PoolKey { database: db.into(), user: "u".into() };
            super::super::PoolOptions::from_config(&cfg, &key, None).unwrap()
        };
        assert_eq!(opts("small").connect_concurrency, 4, "never more than pool_size + reserve");
        assert_eq!(opts("big").connect_concurrency, 8, "server_connect_concurrency's default");
    }

    #[test]
    fn jitter_stays_within_fifteen_percent() {
        for _ in 0..100 {
            let d = jittered(Duration::from_secs(100));
            assert!(d >= Duration::from_secs(85) && d <= Duration::from_secs(100));
        }
    }
}
