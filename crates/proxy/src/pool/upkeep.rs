//! A pool's upkeep every 500 ms: drop idle connections that Postgres closed
//! (EOF or a FATAL waiting unread: a restart, pg_terminate_backend) or that
//! passed server_idle_timeout / server_lifetime (each spread over 85–100% per
//! connection, so a pool does not expire all at once), keep min_pool_size
//! warm, retry connects held back by max_db_connections, point idle
//! connections at the current settings after a reload, close idle ones
//! above a capacity a reload lowered, let the waiters of a pool that stopped
//! lending (SHUTDOWN WAIT_FOR_SERVERS) go, publish the state gauges, and let
//! the database's host set ask its hosts that do not match again (`survey`).

use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use weir_metrics::{ClientState, CloseReason, ServerState};

use super::snapshot::PoolSnapshot;
use super::Pool;

const PERIOD: Duration = Duration::from_millis(500);

pub(super) fn spawn(pool: &Arc<Pool>) {
    let weak = Arc::downgrade(pool);
    tokio::spawn(async move {
        let mut last = PoolSnapshot::default();
        let mut tick = tokio::time::interval(PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(pool) = Weak::upgrade(&weak) else { return };
            sweep(&pool);
            last = publish(&pool, last);
        }
    });
}

/// Closes idle connections that must go, oldest-used first, keeping min_pool_size.
fn sweep(pool: &Arc<Pool>) {
    let doomed = {
        let mut st = pool.state.lock();
        let min = st.opts.settings.min_pool_size as usize;
        let idle_timeout = st.opts.idle_timeout;
        st.let_waiters_go();
        refresh_specs(&mut st);
        let mut doomed = st.take_idle_where(|conn, total| {
            let reason = if conn.has_unexpected_input() {
                CloseReason::ServerClosed
            } else if Instant::now() >= conn.retire_at() {
                CloseReason::Lifetime
            } else if conn.last_used().elapsed() >= idle_limit(idle_timeout, conn.id) {
                CloseReason::IdleTimeout
            } else {
                return None;
            };
            let keep_for_min = reason == CloseReason::IdleTimeout && total as usize <= min;
            (!keep_for_min).then_some(reason)
        });
        // After a reload lowered pool_size or reserve_pool_size, idle
        // connections above the new capacity close, longest idle first
        // (PgBouncer's janitor closes "too many servers in the pool" the same
        // way); busy ones close when they are released.
        doomed.extend(st.take_idle_over_capacity().into_iter().map(|c| (c, CloseReason::PoolShrink)));
        doomed
    };
    for (conn, reason) in doomed {
        pool.discard(conn, reason);
    }
    let mut st = pool.state.lock();
    // Servers a fingerprint's cap kept idle go on once it no longer does.
    if !st.is_paused() {
        pool.serve_from_idle(&mut st);
    }
    pool.want_connects(&mut st);
    // Under the pool's lock: the set takes its own and never a pool's
    // while it holds it.
    if !st.is_paused() {
        pool.hosts.survey(&st.opts.spec);
    }
}

/// After a reload, idle connections take the pool's current connect spec,
/// so the watchdog settings it carries apply from their next loan.
/// Each keeps the host it was opened to.
fn refresh_specs(st: &mut super::state::State) {
    let Some(stale) = st.idle().iter().position(|c| !c.spec().same_settings(&st.opts.spec)) else { return };
    let spec = st.opts.spec.clone();
    for conn in &mut st.idle_mut()[stale..] {
        if !conn.spec().same_settings(&spec) {
            let aimed = spec.aimed(&conn.spec().host, conn.spec().port, conn.spec().addr);
            conn.respec(Arc::new(aimed));
        }
    }
}

/// server_idle_timeout spread over 85–100% per connection.
fn idle_limit(timeout: Duration, id: u64) -> Duration {
    timeout.mul_f64(0.85 + (id % 16) as f64 / 100.0)
}

fn publish(pool: &Arc<Pool>, last: PoolSnapshot) -> PoolSnapshot {
    let now = pool.snapshot();
    let m = &pool.metrics;
    let d = |a: u32, b: u32| a as i64 - b as i64;
    m.add_servers(ServerState::Idle, d(now.idle, last.idle));
    m.add_servers(ServerState::Active, d(now.active + now.recovering, last.active + last.recovering));
    m.add_servers(ServerState::Login, d(now.connecting, last.connecting));
    m.add_servers(ServerState::Replication, d(now.replication, last.replication));
    m.add_clients(ClientState::Waiting, d(now.waiting, last.waiting));
    m.set_maxwait(now.maxwait);
    m.set_predicted_wait(now.predicted_wait);
    let queries = {
        let st = pool.state.lock();
        st.queries().top(st.opts.top_queries as usize)
    };
    m.set_queries(queries);
    now
}
