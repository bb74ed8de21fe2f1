//! The server pool of one (database, user): idle connections (LIFO), a FIFO of
//! waiters, parallel bounded connects, recovery of connections a client left
//! dirty, and upkeep. Server connections belong to the pool, never to a client:
//! a client borrows one through a `Lease`.

mod connector;
mod evict;
mod inspect;
mod lease;
mod pools;
mod recovery;
mod state;
mod upkeep;

use std::pin::Pin;
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use tokio::time::Sleep;
use weir_metrics::{CloseReason, PoolMetrics};

use crate::config::PoolSettings;
use crate::server::{ConnectSpec, ServerConn};

pub use inspect::IdleServer;
pub use lease::Lease;
pub use pools::{PoolKey, Pools};
pub use state::PoolSnapshot;
use state::State;

/// Settings the pool needs beyond `PoolSettings`.
#[derive(Debug, Clone)]
pub struct PoolOptions {
    pub settings: PoolSettings,
    pub spec: ConnectSpec,
    pub connect_concurrency: u32,
    pub reserve_pool_timeout: Duration,
    pub login_retry_max: Duration,
    pub reset_query: Option<String>,
    pub reset_timeout: Duration,
    pub idle_timeout: Duration,
    pub lifetime: Duration,
    pub check_delay: Duration,
    pub check_query: String,
    pub check_timeout: Duration,
}

/// Why a client got no server.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PoolError {
    /// SQLSTATE 53300 (class 53, insufficient resources): the pool had no
    /// server to spare, which is not the client's own cancel (57014).
    #[error(
        "no server connection became free within the wait budget of {} (query_wait_timeout); the query was not run{}",
        humantime::format_duration(*budget),
        last_error.as_ref().map(|e| format!(" (last connect error: {e})")).unwrap_or_default()
    )]
    WaitTimeout { budget: Duration, waited: Duration, last_error: Option<String> },
    /// A brand-new pool could not connect: the login gets the connect error
    /// at once instead of waiting out its budget.
    #[error("cannot connect to the server: {error}")]
    ServerDown { error: String, code: crate::protocol::SqlState },
    #[error("the pool is shutting down")]
    Closed,
}

/// A pool's configured limits, as `/metrics` exports them.
fn limits(s: &PoolSettings) -> weir_metrics::Limits {
    weir_metrics::Limits {
        pool_size: s.pool_size.into(),
        reserve_pool_size: s.reserve_pool_size.into(),
        max_db_connections: s.max_db_connections.into(),
    }
}

/// One pool. Shared as `Arc<Pool>`.
#[derive(Debug)]
pub struct Pool {
    pub key: PoolKey,
    pub metrics: Arc<PoolMetrics>,
    /// Clients' parameter maps by content, for `ServerConn::sync_params`.
    pub stamps: crate::params::StampCache,
    state: Mutex<State>,
    db_servers: Arc<pools::DbCount>,
    /// This user's server count across databases (max_user_connections).
    user_servers: Arc<pools::DbCount>,
}

impl Pool {
    pub(crate) fn new(
        key: PoolKey,
        opts: PoolOptions,
        db_servers: Arc<pools::DbCount>,
        user_servers: Arc<pools::DbCount>,
    ) -> Arc<Pool> {
        let metrics = PoolMetrics::new(key.database.clone(), key.user.clone());
        metrics.set_limits(limits(&opts.settings));
        let pool = Arc::new(Pool {
            key,
            metrics,
            stamps: Default::default(),
            state: Mutex::new(State::new(opts)),
            db_servers,
            user_servers,
        });
        pool.db_servers.pools.lock().push(Arc::downgrade(&pool));
        upkeep::spawn(&pool);
        pool
    }

    /// Replaces the settings (config reload). Connections are kept.
    pub fn reconfigure(self: &Arc<Self>, opts: PoolOptions) {
        self.metrics.set_limits(limits(&opts.settings));
        let mut st = self.state.lock();
        st.opts = opts;
        self.want_connects(&mut st);
    }

    /// The current settings.
    pub fn settings(&self) -> PoolSettings {
        self.state.lock().opts.settings.clone()
    }

    /// The current query_wait_timeout (cheap: read at every wait).
    pub fn query_wait_timeout(&self) -> Duration {
        self.state.lock().opts.settings.query_wait_timeout
    }

    /// Borrows a server, waiting in FIFO order until `deadline`.
    ///
    /// Cancel-safe: dropping the future removes the waiter at once, and a
    /// server handed over in that instant goes back to the pool.
    pub async fn acquire(self: &Arc<Self>, deadline: Instant) -> Result<Lease, PoolError> {
        let mut timer = Box::pin(tokio::time::sleep_until(deadline.into()));
        self.acquire_with(deadline, &mut timer).await
    }

    /// `acquire` on the caller's timer, set here to `deadline`: a client
    /// that waits often keeps one, and moving it later is one atomic
    /// operation where a new timer is an insert into and a removal from
    /// tokio's timer wheel per wait.
    pub async fn acquire_with(
        self: &Arc<Self>,
        deadline: Instant,
        timer: &mut Pin<Box<Sleep>>,
    ) -> Result<Lease, PoolError> {
        timer.as_mut().reset(deadline.into());
        let started = Instant::now();
        let timed_out = || {
            let last_error = self.state.lock().last_error.clone();
            // Rounded to whole milliseconds: the budget as configured.
            let budget =
                Duration::from_millis(((deadline.saturating_duration_since(started).as_micros() + 500) / 1000) as u64);
            PoolError::WaitTimeout { budget, waited: started.elapsed(), last_error }
        };
        loop {
            let conn = match self.checkout_or_enqueue(deadline) {
                Ok(conn) => conn,
                Err(mut waiting) => match within(timer.as_mut(), &mut waiting.rx).await {
                    Some(Ok(conn)) => {
                        waiting.settled = true;
                        conn
                    }
                    Some(Err(_)) => return Err(PoolError::Closed),
                    None => return Err(timed_out()),
                },
            };
            // Held as a Lease from here: if this future is dropped mid-check,
            // the connection goes back to the pool through recovery.
            match within(timer.as_mut(), self.vet(Lease::new(self.clone(), conn))).await {
                // Handed over just as the budget ran out (or this task ran
                // late): the client may be giving up right now, so its query
                // must not start. The server goes on to the next waiter.
                Some(Some(lease)) if Instant::now() >= deadline => {
                    drop(lease);
                    return Err(timed_out());
                }
                Some(Some(lease)) => {
                    self.metrics.record_client_wait(started.elapsed());
                    return Ok(lease);
                }
                Some(None) => continue,
                None => return Err(timed_out()),
            }
        }
    }

    /// The fast path of a checkout: a healthy idle server that needs no
    /// server_check_query, taken under one short lock with nothing awaited.
    /// None: nothing idle, a check is due, or the top server is unusable;
    /// `acquire` deals with those (and the queue).
    pub fn try_checkout(self: &Arc<Self>) -> Option<Lease> {
        let mut st = self.state.lock();
        if st.paused {
            return None;
        }
        let now = Instant::now();
        let last_used = st.idle.last()?.last_used;
        if st.check_due(last_used, now) {
            return None;
        }
        let conn = st.idle.last_mut()?;
        if State::unusable(conn, now).is_some() {
            return None;
        }
        let conn = st.idle.pop()?;
        st.active += 1;
        drop(st);
        self.metrics.record_client_wait(Duration::ZERO);
        Some(Lease::new(self.clone(), conn))
    }

    /// Takes a healthy idle server, or joins the queue (and starts connects).
    fn checkout_or_enqueue(self: &Arc<Self>, deadline: Instant) -> Result<Box<ServerConn>, Waiting> {
        let mut st = self.state.lock();
        if !st.paused {
            while let Some(mut conn) = st.idle.pop() {
                if let Some(reason) = State::unusable(&mut conn, Instant::now()) {
                    drop(st);
                    self.discard(conn, reason);
                    st = self.state.lock();
                    continue;
                }
                st.active += 1;
                return Ok(conn);
            }
        }
        let (tx, rx) = oneshot::channel();
        let id = st.push_waiter(tx, deadline);
        self.want_connects(&mut st);
        Err(Waiting { pool: self.clone(), id, rx, settled: false })
    }

    /// A server about to be lent (from idle or handed to a waiter) may have
    /// sat idle past server_check_delay: run server_check_query on it first,
    /// within server_check_timeout. A failed check closes it.
    async fn vet(self: &Arc<Self>, mut lease: Lease) -> Option<Lease> {
        if !self.state.lock().check_due(lease.conn().last_used, Instant::now()) {
            return Some(lease);
        }
        let (query, timeout) = {
            let st = self.state.lock();
            (st.opts.check_query.clone(), st.opts.check_timeout)
        };
        match recovery::check(lease.conn_mut(), &query, timeout).await {
            Ok(()) => Some(lease),
            Err(reason) => {
                lease.close(reason);
                None
            }
        }
    }

    /// Returns a borrowed server: clean ones go straight to the next waiter or
    /// idle; anything else is recovered first.
    pub(crate) fn give_back(self: &Arc<Self>, mut conn: Box<ServerConn>, needs_reset: bool) {
        if let Some(reason) = conn.broken {
            self.state.lock().active -= 1;
            self.discard(conn, reason);
            return;
        }
        if needs_reset || !conn.conv.is_clean() || !conn.cancel.gate.is_open() {
            let opts = {
                let mut st = self.state.lock();
                st.active -= 1;
                st.recovering += 1;
                st.opts.clone()
            };
            recovery::spawn(self.clone(), conn, opts, needs_reset);
            return;
        }
        conn.last_used = Instant::now();
        let mut st = self.state.lock();
        st.active -= 1;
        self.hand_over(&mut st, conn);
    }

    /// Called by recovery when it is done with a connection.
    pub(crate) fn recovered(self: &Arc<Self>, result: Result<Box<ServerConn>, (Box<ServerConn>, CloseReason)>) {
        let mut st = self.state.lock();
        st.recovering -= 1;
        match result {
            Ok(mut conn) => {
                conn.last_used = Instant::now();
                self.hand_over(&mut st, conn);
            }
            Err((conn, reason)) => {
                drop(st);
                self.discard(conn, reason);
            }
        }
    }

    /// Gives `conn` to the oldest waiter that can still use it, else parks it idle.
    fn hand_over(self: &Arc<Self>, st: &mut State, mut conn: Box<ServerConn>) {
        if st.reconnect_before.is_some_and(|t| conn.created < t) {
            conn.close(CloseReason::Admin);
            self.want_connects(st);
            return;
        }
        if !st.paused {
            while let Some(w) = st.next_waiter() {
                match w.tx.send(conn) {
                    Ok(()) => {
                        st.active += 1;
                        return;
                    }
                    Err(back) => conn = back,
                }
            }
        }
        if st.over_capacity() {
            conn.close(CloseReason::PoolShrink);
            return;
        }
        st.idle.push(conn);
    }

    /// Closes a connection the pool held, and refills if there is demand.
    pub(crate) fn discard(self: &Arc<Self>, conn: Box<ServerConn>, reason: CloseReason) {
        conn.close(reason);
        let mut st = self.state.lock();
        self.want_connects(&mut st);
    }

    /// Counters for the admin console and tests.
    pub fn snapshot(&self) -> PoolSnapshot {
        self.state.lock().snapshot()
    }

    pub fn pause(self: &Arc<Self>) {
        self.state.lock().paused = true;
    }

    pub fn resume(self: &Arc<Self>) {
        let mut st = self.state.lock();
        st.paused = false;
        // Each turn either serves a waiter or parks the server and ends.
        while st.live_waiters_up_to(1) > 0 {
            let Some(conn) = st.idle.pop() else { break };
            self.hand_over(&mut st, conn);
        }
        self.want_connects(&mut st);
    }

    /// RECONNECT: every connection open now closes once released (idle ones
    /// at once); new ones replace them as needed.
    pub fn reconnect(self: &Arc<Self>) {
        self.state.lock().reconnect_before = Some(Instant::now());
        self.close_idle(CloseReason::Admin);
        self.want_connects(&mut self.state.lock());
    }

    /// When the last RECONNECT marked this pool's connections, if one did.
    pub fn reconnect_mark(&self) -> Option<Instant> {
        self.state.lock().reconnect_before
    }

    /// True while a connection RECONNECT marked is still open (WAIT_CLOSE).
    pub fn reconnect_pending(&self) -> bool {
        let Some(mark) = self.reconnect_mark() else { return false };
        let wall = std::time::SystemTime::now() - mark.elapsed();
        self.metrics.live_servers().iter().any(|s| s.connected_at < wall)
    }

    /// Closes every idle connection (KILL, shutdown).
    pub fn close_idle(self: &Arc<Self>, reason: CloseReason) {
        let idle = std::mem::take(&mut self.state.lock().idle);
        for conn in idle {
            conn.close(reason);
        }
    }
}

/// `fut`'s output, or None if `timer` fires first.
pub(crate) async fn within<F: std::future::Future>(timer: Pin<&mut Sleep>, fut: F) -> Option<F::Output> {
    tokio::select! {
        biased;
        v = fut => Some(v),
        _ = timer => None,
    }
}

/// A place in the queue. Dropping it leaves the queue at once.
#[derive(Debug)]
struct Waiting {
    pool: Arc<Pool>,
    id: u64,
    rx: oneshot::Receiver<Box<ServerConn>>,
    settled: bool,
}

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        self.rx.close();
        let handed = self.rx.try_recv().ok();
        let mut st = self.pool.state.lock();
        st.remove_waiter(self.id);
        if let Some(conn) = handed {
            st.active -= 1;
            self.pool.hand_over(&mut st, conn);
        }
    }
}
