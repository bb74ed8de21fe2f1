//! The server pool of one (database, user): idle connections (LIFO), a FIFO of
//! waiters, parallel bounded connects, recovery of connections a client left
//! dirty, and upkeep. Server connections belong to the pool, never to a client:
//! a client borrows one through a `Lease`. Admission control (the queue's
//! bound, shedding, deadline-aware start) is in `admission`; the end of
//! waits whose budget ran out, one timer per pool, in `expiry`; the places
//! replication clients hold, each with a server of its own, in
//! `replication`.

mod admission;
mod backoff;
mod connector;
mod control;
mod counts;
mod error;
mod evict;
mod expiry;
mod fleet;
mod hosts;
mod inspect;
mod lease;
mod places;
mod pools;
mod queries;
mod recovery;
mod replication;
mod retiring;
mod room;
mod snapshot;
mod state;
mod upkeep;

use std::pin::Pin;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use weir_metrics::{CloseReason, PoolMetrics};

use crate::config::PoolSettings;
use crate::server::{ConnectSpec, ServerConn};
use crate::timer::within;

pub use admission::{AdmissionConfig, Estimator, QueueCount};
pub use error::PoolError;
pub use hosts::{HostKey, HostSet, HostView, HostsConfig};
pub use inspect::IdleServer;
pub use lease::Lease;
pub use pools::{PoolKey, Pools};
pub use queries::{QueryStats, QueryTag};
pub use replication::ReplicationPlace;
pub use snapshot::PoolSnapshot;
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
    pub admission: AdmissionConfig,
    /// The database's hosts, balancing, target and name look-ups.
    pub hosts: HostsConfig,
    /// max_fingerprint_share: the part of pool_size one statement
    /// fingerprint may hold while others wait.
    pub fingerprint_share: f64,
    /// top_queries: statement fingerprints exported on `/metrics`.
    pub top_queries: u32,
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
    /// Server hold time per transaction, and the admission switches.
    pub estimate: Estimator,
    state: Mutex<State>,
    db_servers: Arc<pools::DbCount>,
    /// This user's server count across databases (max_user_connections).
    user_servers: Arc<pools::DbCount>,
    /// Waiters across all pools (`max_waiting_clients_total`).
    queued_total: Arc<QueueCount>,
    /// The database's hosts, shared with its other users' pools.
    hosts: Arc<HostSet>,
    /// max_prepared_statements now, read by each client as a lease begins
    /// (a load, where `settings` takes the state's lock).
    max_prepared: AtomicU32,
}

impl Pool {
    pub(crate) fn new(
        key: PoolKey,
        opts: PoolOptions,
        db_servers: Arc<pools::DbCount>,
        user_servers: Arc<pools::DbCount>,
        queued_total: Arc<QueueCount>,
        hosts: Arc<HostSet>,
    ) -> Arc<Pool> {
        let metrics = PoolMetrics::new(key.database.clone(), key.user.clone());
        metrics.set_limits(limits(&opts.settings));
        let max_prepared = opts.settings.max_prepared_statements;
        let pool = Arc::new(Pool {
            key,
            metrics,
            stamps: Default::default(),
            estimate: Estimator::new(&opts.admission),
            state: Mutex::new(State::new(opts)),
            db_servers,
            user_servers,
            queued_total,
            hosts,
            max_prepared: AtomicU32::new(max_prepared),
        });
        pool.hosts.join(&pool);
        pool.db_servers.pools.lock().push(Arc::downgrade(&pool));
        pool.user_servers.pools.lock().push(Arc::downgrade(&pool));
        pool.state.lock().opts.spec.probe_room = pool.probe_room();
        upkeep::spawn(&pool);
        expiry::spawn(&pool);
        fleet::spawn(&pool);
        pool
    }

    /// Replaces the settings (config reload). Connections are kept.
    pub fn reconfigure(self: &Arc<Self>, mut opts: PoolOptions) {
        opts.spec.probe_room = self.probe_room();
        self.metrics.set_limits(limits(&opts.settings));
        self.estimate.configure(&opts.admission);
        self.hosts.configure(opts.hosts.clone());
        self.max_prepared.store(opts.settings.max_prepared_statements, Ordering::Relaxed);
        let mut st = self.state.lock();
        st.opts = opts;
        self.want_connects(&mut st);
    }

    /// max_prepared_statements now.
    #[inline]
    pub fn max_prepared_statements(&self) -> u32 {
        self.max_prepared.load(Ordering::Relaxed)
    }

    /// The current settings.
    pub fn settings(&self) -> PoolSettings {
        self.state.lock().opts.settings.clone()
    }

    /// client_idle_timeout for this pool's clients (zero: off).
    pub fn client_idle_timeout(&self) -> Duration {
        self.state.lock().opts.settings.client_idle_timeout
    }

    /// query_wait_notify for this pool's clients (zero: off).
    pub fn query_wait_notify(&self) -> Duration {
        self.state.lock().opts.settings.query_wait_notify
    }

    /// The current wait limit: query_wait_timeout, or query_timeout when
    /// shorter (cheap: read at every wait).
    pub fn query_wait_timeout(&self) -> Duration {
        self.state.lock().opts.settings.wait_limit().0
    }

    /// The current query_wait_timeout and configured client_deadline.
    pub fn wait_settings(&self) -> (Duration, Option<Duration>) {
        let st = self.state.lock();
        (st.opts.settings.wait_limit().0, st.opts.settings.client_deadline)
    }

    /// Borrows a server, waiting in FIFO order until `deadline`.
    ///
    /// Cancel-safe: dropping the future removes the waiter at once, and a
    /// server handed over in that instant goes back to the pool.
    pub async fn acquire(self: &Arc<Self>, deadline: Instant) -> Result<Lease, PoolError> {
        self.acquire_with(Instant::now(), deadline, None).await
    }

    /// `acquire` for a wait that began at `started` (the caller's clock
    /// reading, so the wait costs one reading of its own, when a server
    /// comes), for a transaction that starts with `query` (counted and
    /// handed a server by fingerprint: `queries`). The wait has no timer of
    /// its own: the pool's expiry (`expiry.rs`) ends it when `deadline`
    /// passes.
    pub async fn acquire_with(
        self: &Arc<Self>,
        started: Instant,
        deadline: Instant,
        query: Option<&QueryTag>,
    ) -> Result<Lease, PoolError> {
        let timed_out = || {
            let (last_error, key) = {
                let st = self.state.lock();
                (st.backoff().last_error(), st.opts.settings.wait_limit().1)
            };
            // Rounded to whole milliseconds: the budget as configured.
            let budget =
                Duration::from_millis(((deadline.saturating_duration_since(started).as_micros() + 500) / 1000) as u64);
            PoolError::WaitTimeout { budget, waited: started.elapsed(), last_error, key }
        };
        // The clock for the checkout: the caller's reading at first, then
        // the one taken when a server came (or after its check).
        let mut now = started;
        loop {
            let conn = match self.checkout_or_enqueue(now, deadline, query)? {
                Ok(conn) => conn,
                Err(mut waiting) => {
                    let Some(handed) = waiting.handed_by(deadline).await else { return Err(timed_out()) };
                    waiting.settled = handed.is_ok();
                    match handed {
                        Ok(Handed::Server(conn)) => conn,
                        Ok(Handed::Shed(predicted)) => {
                            let left = deadline.saturating_duration_since(Instant::now());
                            return Err(PoolError::Shed { predicted, left });
                        }
                        Ok(Handed::Expired) => return Err(timed_out()),
                        Ok(Handed::Rejected(code, message)) => return Err(PoolError::LoginRejected { code, message }),
                        Err(_) if self.state.lock().is_stopping() => return Err(PoolError::ShuttingDown),
                        Err(_) => return Err(PoolError::Closed),
                    }
                }
            };
            // Held as a Lease from here: if this future is dropped mid-check,
            // the connection goes back to the pool through recovery.
            now = Instant::now();
            let lease = Lease::new(self.clone(), conn, now);
            let used = (lease.conn().created, lease.conn().last_used());
            let vetted = if self.state.lock().check_due(used, now) {
                // Boxed: rare, and kept out of every wait's future.
                let checked = Box::pin(self.check_within(lease, deadline)).await;
                now = Instant::now();
                checked
            } else {
                Some(Some(lease))
            };
            match vetted {
                // Handed over just as the budget ran out (or this task ran
                // late): the client may be giving up right now, so its query
                // must not start. The server goes on to the next waiter.
                Some(Some(lease)) if now >= deadline => {
                    drop(lease);
                    return Err(timed_out());
                }
                Some(Some(mut lease)) => {
                    lease.restamp(now);
                    self.metrics.record_client_wait(now.saturating_duration_since(started));
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
    /// `acquire` deals with those (and the queue). `now`: the caller's clock
    /// reading, taken just before (the lease counts as taken then).
    pub fn try_checkout_at(self: &Arc<Self>, now: Instant) -> Option<Lease> {
        let mut st = self.state.lock();
        let conn = st.lend_idle(now)?;
        drop(st);
        self.metrics.record_client_wait(Duration::ZERO);
        Some(Lease::new(self.clone(), conn, now))
    }

    /// Takes a healthy idle server, or joins the queue (and starts
    /// connects), or is refused at once by admission control.
    #[allow(clippy::type_complexity)]
    fn checkout_or_enqueue(
        self: &Arc<Self>,
        now: Instant,
        deadline: Instant,
        query: Option<&QueryTag>,
    ) -> Result<Result<Box<ServerConn>, Waiting>, PoolError> {
        let mut st = self.state.lock();
        if st.is_stopping() {
            return Err(PoolError::ShuttingDown);
        }
        // A fingerprint held back (`State::may_lend_to`) takes no idle server.
        let may_lend = st.may_lend_to(query, now);
        while let Some(top) = may_lend.then(|| st.lend_top(now)).flatten() {
            match top {
                Ok(mut conn) => {
                    if let Some(tag) = query {
                        conn.lent_for(tag.fp);
                        self.query_lent(&mut st, tag.fp, Duration::ZERO);
                    }
                    return Ok(Ok(conn));
                }
                Err((conn, reason)) => {
                    drop(st);
                    self.discard(conn, reason);
                    st = self.state.lock();
                }
            }
        }
        if let Some(message) = st.login_failing() {
            return Err(PoolError::LoginFailing { message });
        }
        self.admit(&st, now, deadline)?;
        let total_limit = st.opts.admission.max_waiting_total;
        let Some(counted) = self.queued_total.join(total_limit) else {
            return Err(PoolError::QueueFull { waiting: total_limit, key: "max_waiting_clients_total" });
        };
        let (tx, rx) = oneshot::channel();
        let id = st.push_waiter(tx, now, deadline, counted, query);
        let fleet_share = st.opts.settings.fleet_share;
        st.fleet_mut().waiter_queued(fleet_share, now);
        self.want_connects(&mut st);
        Ok(Err(Waiting { pool: self.clone(), id, rx, settled: false }))
    }

    /// Refuses a new waiter at once when the pool's queue is at its bound,
    /// or when the pool is full and the waiters ahead hold more work than it
    /// can serve before `deadline`.
    fn admit(&self, st: &State, now: Instant, deadline: Instant) -> Result<(), PoolError> {
        let ahead = st.waiting();
        let max = st.opts.settings.max_waiting_clients;
        if max != 0 && ahead >= max as usize {
            return Err(PoolError::QueueFull { waiting: max, key: "max_waiting_clients" });
        }
        if !st.saturated() {
            return Ok(());
        }
        let left = deadline.saturating_duration_since(now);
        match self.estimate.shed(ahead, st.capacity(), left) {
            Some(predicted) => Err(PoolError::Shed { predicted, left }),
            None => Ok(()),
        }
    }

    /// The queue moved: the last waiter (the one with the most ahead of it)
    /// is told at once when its predicted wait has grown past what is left
    /// of its budget, and so on forward until one can still be served.
    /// O(1) per waiter shed; nothing when the queue is empty.
    fn shed_tail(&self, st: &mut State, now: Instant) {
        if st.waiting() == 0 || !st.saturated() {
            return;
        }
        let servers = st.capacity();
        while let Some(deadline) = st.last_waiter_deadline() {
            let left = deadline.saturating_duration_since(now);
            if left.is_zero() {
                return;
            }
            let Some(predicted) = self.estimate.shed(st.waiting() - 1, servers, left) else { return };
            if let Some(w) = st.pop_last_waiter() {
                let _ = w.tx.send(Handed::Shed(predicted));
            }
        }
    }

    /// `check`, given up (None) if `deadline` passes first.
    async fn check_within(self: &Arc<Self>, lease: Lease, deadline: Instant) -> Option<Option<Lease>> {
        let timer = std::pin::pin!(tokio::time::sleep_until(deadline.into()));
        within(timer, self.check(lease)).await
    }

    /// A server about to be lent (from idle or handed to a waiter) that sat
    /// idle past server_check_delay: run server_check_query on it first,
    /// within server_check_timeout. A failed check closes it.
    async fn check(self: &Arc<Self>, mut lease: Lease) -> Option<Lease> {
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
    /// idle; anything else is recovered first. `now`: the caller's clock
    /// reading, if it has one.
    pub(crate) fn give_back(self: &Arc<Self>, mut conn: Box<ServerConn>, needs_reset: bool, now: Option<Instant>) {
        let query = conn.take_query();
        if let Some(reason) = conn.close_reason_at_release() {
            let mut st = self.state.lock();
            st.counts_mut().returned();
            Self::query_returned(&mut st, &conn, query, now);
            drop(st);
            if reason == CloseReason::RoleChanged {
                // It answered 25006 where writes are wanted, or reported a
                // new in_hot_standby: its host's role is asked again.
                self.hosts.doubt(&HostKey::of(conn.spec()));
            }
            self.discard(conn, reason);
            return;
        }
        if needs_reset || !conn.conv.is_clean() || !conn.cancel.gate.is_open() {
            let opts = {
                let mut st = self.state.lock();
                st.counts_mut().returned_dirty();
                Self::query_returned(&mut st, &conn, query, now);
                st.opts.clone()
            };
            recovery::spawn(self.clone(), conn, opts, needs_reset);
            return;
        }
        let now = now.unwrap_or_else(Instant::now);
        conn.used_at(now);
        let mut st = self.state.lock();
        st.counts_mut().returned();
        Self::query_returned(&mut st, &conn, query, Some(now));
        self.hand_over(&mut st, conn, now);
    }

    /// A server lent to a transaction that queued (`query`: its
    /// fingerprint and the errors it met) is back at `now`.
    fn query_returned(st: &mut State, conn: &ServerConn, query: Option<(u64, u8)>, now: Option<Instant>) {
        if let Some((fp, errors)) = query {
            let held = now.unwrap_or_else(Instant::now).saturating_duration_since(conn.taken_at());
            st.queries_mut().returned(fp, held, errors);
        }
    }

    /// Called by recovery when it is done with a connection.
    pub(crate) fn recovered(self: &Arc<Self>, result: Result<Box<ServerConn>, (Box<ServerConn>, CloseReason)>) {
        let mut st = self.state.lock();
        st.counts_mut().recovery_ended();
        match result {
            Ok(mut conn) => {
                let now = Instant::now();
                conn.used_at(now);
                self.hand_over(&mut st, conn, now);
            }
            Err((conn, reason)) => {
                drop(st);
                self.discard(conn, reason);
            }
        }
    }

    /// Gives `conn` to the waiter `State::next_waiter` picks at `now`, else
    /// parks it idle. True when a waiter got it.
    fn hand_over(self: &Arc<Self>, st: &mut State, conn: Box<ServerConn>, now: Instant) -> bool {
        let retired = match st.opened_before_reconnect(conn.created) {
            true => Some(CloseReason::Admin),
            false => st.retired(&conn),
        };
        if let Some(reason) = retired {
            conn.close(reason);
            self.want_connects(st);
            self.wake_blocked_siblings();
            return false;
        }
        let Some(mut conn) = self.fleet_release(st, conn) else { return false };
        if !st.is_paused() {
            while let Some(w) = st.next_waiter(now) {
                conn.lent_for(w.fp);
                match w.tx.send(Handed::Server(conn)) {
                    Ok(()) => {
                        st.counts_mut().lent();
                        self.query_lent(st, w.fp, now.saturating_duration_since(w.since));
                        self.shed_tail(st, now);
                        return true;
                    }
                    Err(back) => conn = back.into_server().expect("sent a server"),
                }
            }
            conn.lent_for(0);
        }
        if let Some(conn) = st.park(conn) {
            conn.close(CloseReason::PoolShrink);
        }
        // Closed, or idle where a pool held back by max_db_connections may evict it.
        self.wake_blocked_siblings();
        false
    }

    /// Idle servers go to the waiters that may have them now (after
    /// RESUME, or a fingerprint's cap no longer holding them back), until
    /// one is parked again or none is left.
    fn serve_from_idle(self: &Arc<Self>, st: &mut State) {
        while st.live_waiters_up_to(1) > 0 {
            let Some(conn) = st.unpark() else { break };
            if !self.hand_over(st, conn, Instant::now()) {
                break;
            }
        }
    }

    /// A waiter of fingerprint `fp` (0: none) took a server after waiting
    /// `waited`. Logged (at most once a second) when that fingerprint now
    /// holds over half of pool_size while other clients wait.
    fn query_lent(&self, st: &mut State, fp: u64, waited: Duration) {
        if fp == 0 {
            return;
        }
        let pool_size = st.opts.settings.pool_size;
        let Some((held, text)) = st.queries_mut().lent(fp, waited, pool_size) else { return };
        static HOLDS: crate::ratelog::RateLimited = crate::ratelog::RateLimited::new();
        if let Some(more) = HOLDS.allow() {
            tracing::warn!(
                database = %self.key.database, user = %self.key.user, fingerprint = %format!("{fp:016x}"), query = %text,
                "one statement holds {held} of the pool's {pool_size} servers while other clients wait \
                 (SHOW QUERIES; {more} more since the last line)"
            );
        }
    }

    /// The statements that queued in this pool, by fingerprint, ordered
    /// by servers held now, then server time.
    pub fn queries(&self) -> Vec<QueryStats> {
        self.state.lock().queries().listing()
    }

    /// Closes a connection the pool held, and refills if there is demand.
    pub(crate) fn discard(self: &Arc<Self>, conn: Box<ServerConn>, reason: CloseReason) {
        conn.close(reason);
        let mut st = self.state.lock();
        self.want_connects(&mut st);
        drop(st);
        self.wake_blocked_siblings();
    }

    /// Counters for the admin console and tests.
    pub fn snapshot(&self) -> PoolSnapshot {
        let st = self.state.lock();
        let mut snap = st.snapshot();
        if st.saturated() {
            let predicted = self.estimate.predicted_wait(st.waiting(), st.capacity());
            snap.predicted_wait = predicted.unwrap_or_default();
        }
        snap
    }

    /// The database's hosts as the pool knows them.
    pub fn hosts(&self) -> &Arc<HostSet> {
        &self.hosts
    }
}

/// What a waiter is sent.
#[derive(Debug)]
pub(crate) enum Handed {
    /// A server for it.
    Server(Box<ServerConn>),
    /// Shed: its predicted wait, grown past what is left of its budget.
    Shed(Duration),
    /// Its budget ran out in the queue (the pool's expiry took it out).
    Expired,
    /// Postgres refused the pool's login: its SQLSTATE and message.
    Rejected(crate::protocol::SqlState, String),
}

impl Handed {
    fn into_server(self) -> Option<Box<ServerConn>> {
        match self {
            Handed::Server(conn) => Some(conn),
            Handed::Shed(_) | Handed::Expired | Handed::Rejected(..) => None,
        }
    }
}

/// A place in the queue. Dropping it leaves the queue at once.
#[derive(Debug)]
struct Waiting {
    pool: Arc<Pool>,
    id: u64,
    rx: oneshot::Receiver<Handed>,
    settled: bool,
}

impl Waiting {
    /// What the pool sends, or None when this future is polled at or past
    /// `deadline` with nothing come (the wait then ends at once rather than
    /// when the pool's expiry runs: a timeout that shares the deadline, such
    /// as the login's, sees this wait's error first, as with a timer of its
    /// own). The clock is read only at polls after the first that find
    /// nothing: the first follows the enqueue, and a hand-over needs none.
    /// Cancel-safe, like the channel.
    fn handed_by(&mut self, deadline: Instant) -> impl std::future::Future<Output = Option<HandedResult>> + '_ {
        let mut first = true;
        std::future::poll_fn(move |cx| match std::future::Future::poll(Pin::new(&mut self.rx), cx) {
            std::task::Poll::Ready(r) => std::task::Poll::Ready(Some(r)),
            std::task::Poll::Pending if !std::mem::take(&mut first) && Instant::now() >= deadline => {
                std::task::Poll::Ready(None)
            }
            std::task::Poll::Pending => std::task::Poll::Pending,
        })
    }
}

/// The channel's output: what was sent, or the pool gone.
type HandedResult = Result<Handed, oneshot::error::RecvError>;

impl Drop for Waiting {
    fn drop(&mut self) {
        if self.settled {
            return;
        }
        self.rx.close();
        let handed = self.rx.try_recv().ok().and_then(Handed::into_server);
        let mut st = self.pool.state.lock();
        st.remove_waiter(self.id);
        if let Some(conn) = handed {
            st.counts_mut().returned();
            self.pool.hand_over(&mut st, conn, Instant::now());
        }
    }
}
