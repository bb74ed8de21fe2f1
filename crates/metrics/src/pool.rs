//! [`PoolMetrics`]: all per-pool (database, user) accounting — server
//! connection opens/closes with reasons and their rates, connect failures,
//! dropped queries, traffic counters, and the state gauges — readable as
//! plain numbers (admin console, tests) and mirrored into the `metrics` facade.
//!
//! Also owns the process-wide registry of live pools used by
//! [`publish_all`] (the exporter calls it before every scrape).
//!
//! Server-connection opens and closes are only recorded through
//! [`ServerConnGuard`](crate::ServerConnGuard), which guarantees exactly one
//! close per open.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use std::time::{Duration, SystemTime};

use crate::close::{CloseReason, ConnectFailure, DropReason};
use crate::handles::PoolHandles;
use crate::rate::{RateWindow, Window};
use crate::state::{ClientState, ServerState};

const R: Ordering = Ordering::Relaxed;

/// Live pools, for [`publish_all`]. Dead entries are pruned on each publish.
static REGISTRY: Mutex<Vec<Weak<PoolMetrics>>> = Mutex::new(Vec::new());

fn zeroed<const N: usize>() -> [AtomicU64; N] {
    std::array::from_fn(|_| AtomicU64::new(0))
}

fn zeroed_i<const N: usize>() -> [AtomicI64; N] {
    std::array::from_fn(|_| AtomicI64::new(0))
}

fn sum(a: &[AtomicU64]) -> u64 {
    a.iter().map(|c| c.load(R)).sum()
}

/// Metrics for one pool. Create with [`PoolMetrics::new`], share as `Arc`.
///
/// Keep one instance per (database, user) per process: two live instances
/// with the same labels add up in counters but overwrite each other's gauges.
pub struct PoolMetrics {
    database: String,
    user: String,
    opened: AtomicU64,
    closed: [AtomicU64; CloseReason::COUNT],
    connect_failures: [AtomicU64; ConnectFailure::COUNT],
    dropped: [AtomicU64; DropReason::COUNT],
    transactions: AtomicU64,
    xact_time_us: AtomicU64,
    queries: AtomicU64,
    assignments: AtomicU64,
    wait_time_us: AtomicU64,
    client_parses: AtomicU64,
    server_parses: AtomicU64,
    pinned: AtomicU64,
    opens: RateWindow,
    closes: RateWindow,
    servers: [AtomicI64; ServerState::COUNT],
    clients: [AtomicI64; ClientState::COUNT],
    maxwait_us: AtomicU64,
    live: Mutex<BTreeMap<u64, ServerInfo>>,
    next_live: AtomicU64,
    h: PoolHandles,
}

/// What the admin console shows about one open server connection
/// (`SHOW SERVERS`). Registered through
/// [`ServerConnGuard::describe`](crate::ServerConnGuard::describe) and removed
/// when the guard counts the close.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// The backend's process id (its BackendKeyData).
    pub pid: i32,
    /// The server's address.
    pub addr: std::net::SocketAddr,
    /// weir's end of the connection.
    pub local_addr: Option<std::net::SocketAddr>,
    /// When the connection was opened (wall clock).
    pub connected_at: SystemTime,
    /// Prepared statements weir keeps on it (transaction mode), kept up to
    /// date by the connection itself.
    pub prepared_statements: SharedCount,
}

/// A number one side keeps up to date and others read (e.g. a server
/// connection's prepared statements, for `SHOW SERVERS`). Compares by value.
#[derive(Debug, Clone, Default)]
pub struct SharedCount(Arc<AtomicU64>);

impl SharedCount {
    /// Sets the number.
    pub fn set(&self, n: u64) {
        self.0.store(n, R);
    }

    /// The number now.
    pub fn get(&self) -> u64 {
        self.0.load(R)
    }
}

impl PartialEq for SharedCount {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for SharedCount {}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

impl std::fmt::Debug for PoolMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PoolMetrics")
            .field("database", &self.database)
            .field("user", &self.user)
            .field("opened", &self.opened())
            .field("closed_total", &self.closed_total())
            .finish_non_exhaustive()
    }
}

impl PoolMetrics {
    /// Creates the metrics for pool (`database`, `user`), resolves its facade
    /// handles against the currently installed recorder, and registers it for
    /// [`publish_all`].
    pub fn new(database: impl Into<String>, user: impl Into<String>) -> Arc<Self> {
        let (database, user) = (database.into(), user.into());
        let h = PoolHandles::new(&database, &user);
        let pool = Arc::new(PoolMetrics {
            database,
            user,
            opened: AtomicU64::new(0),
            closed: zeroed(),
            connect_failures: zeroed(),
            dropped: zeroed(),
            transactions: AtomicU64::new(0),
            xact_time_us: AtomicU64::new(0),
            queries: AtomicU64::new(0),
            assignments: AtomicU64::new(0),
            wait_time_us: AtomicU64::new(0),
            client_parses: AtomicU64::new(0),
            server_parses: AtomicU64::new(0),
            pinned: AtomicU64::new(0),
            opens: RateWindow::new(),
            closes: RateWindow::new(),
            servers: zeroed_i(),
            clients: zeroed_i(),
            maxwait_us: AtomicU64::new(0),
            live: Mutex::new(BTreeMap::new()),
            next_live: AtomicU64::new(1),
            h,
        });
        register(&pool);
        pool
    }

    /// Database label.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// User label.
    pub fn user(&self) -> &str {
        &self.user
    }

    // ---- recording: server connections (via ServerConnGuard only) ----

    pub(crate) fn record_open(&self, connect_duration: Duration) {
        self.opened.fetch_add(1, R);
        self.opens.record();
        self.h.opened.increment(1);
        self.h.connect_duration.record(connect_duration.as_secs_f64());
    }

    pub(crate) fn record_close(&self, reason: CloseReason) {
        self.closed[reason.index()].fetch_add(1, R);
        self.closes.record();
        self.h.closed[reason.index()].increment(1);
    }

    // ---- recording: everything else ----

    /// A server connection attempt failed (not an open, never a close).
    pub fn record_connect_failure(&self, reason: ConnectFailure) {
        self.connect_failures[reason.index()].fetch_add(1, R);
        self.h.connect_failures[reason.index()].increment(1);
    }

    /// A client query was dropped before completing.
    pub fn record_dropped_query(&self, reason: DropReason) {
        self.dropped[reason.index()].fetch_add(1, R);
        self.h.dropped[reason.index()].increment(1);
    }

    /// A transaction completed after `duration`.
    pub fn record_transaction(&self, duration: Duration) {
        self.transactions.fetch_add(1, R);
        self.xact_time_us.fetch_add(micros(duration), R);
        self.h.transactions.increment(1);
        self.h.transaction_duration.record(duration.as_secs_f64());
    }

    /// A query was forwarded to a server.
    pub fn record_query(&self) {
        self.queries.fetch_add(1, R);
        self.h.queries.increment(1);
    }

    /// A client was assigned a server after waiting `wait` (histogram, plus
    /// the assignment count and total wait time for `SHOW STATS`).
    pub fn record_client_wait(&self, wait: Duration) {
        self.assignments.fetch_add(1, R);
        self.wait_time_us.fetch_add(micros(wait), R);
        self.h.client_wait.record(wait.as_secs_f64());
    }

    /// A client sent a Parse message.
    pub fn record_client_parse(&self) {
        self.client_parses.fetch_add(1, R);
        self.h.client_parses.increment(1);
    }

    /// weir sent a Parse message to a server.
    pub fn record_server_parse(&self) {
        self.server_parses.fetch_add(1, R);
        self.h.server_parses.increment(1);
    }

    /// A client session got pinned to a server connection.
    pub fn record_pinned(&self) {
        self.pinned.fetch_add(1, R);
        self.h.pinned.increment(1);
    }

    // ---- gauges maintained by the proxy ----

    /// Adds `delta` (may be negative) to the server count in `state`.
    pub fn add_servers(&self, state: ServerState, delta: i64) {
        self.servers[state.index()].fetch_add(delta, R);
    }

    /// Moves one server connection from state `from` to state `to`.
    pub fn move_server(&self, from: ServerState, to: ServerState) {
        self.add_servers(from, -1);
        self.add_servers(to, 1);
    }

    /// Adds `delta` (may be negative) to the client count in `state`.
    pub fn add_clients(&self, state: ClientState, delta: i64) {
        self.clients[state.index()].fetch_add(delta, R);
    }

    /// Moves one client from state `from` to state `to`.
    pub fn move_client(&self, from: ClientState, to: ClientState) {
        self.add_clients(from, -1);
        self.add_clients(to, 1);
    }

    /// Sets how long the oldest waiting client has waited (zero if none).
    pub fn set_maxwait(&self, wait: Duration) {
        let us = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX);
        self.maxwait_us.store(us, R);
    }

    // ---- reading ----

    /// Server connections opened.
    pub fn opened(&self) -> u64 {
        self.opened.load(R)
    }

    /// Server connections closed with `reason`.
    pub fn closed(&self, reason: CloseReason) -> u64 {
        self.closed[reason.index()].load(R)
    }

    /// Server connections closed, all reasons.
    pub fn closed_total(&self) -> u64 {
        sum(&self.closed)
    }

    /// Server connect failures with `reason`.
    pub fn connect_failures(&self, reason: ConnectFailure) -> u64 {
        self.connect_failures[reason.index()].load(R)
    }

    /// Server connect failures, all reasons.
    pub fn connect_failures_total(&self) -> u64 {
        sum(&self.connect_failures)
    }

    /// Queries dropped with `reason`.
    pub fn dropped_queries(&self, reason: DropReason) -> u64 {
        self.dropped[reason.index()].load(R)
    }

    /// Queries dropped, all reasons.
    pub fn dropped_queries_total(&self) -> u64 {
        sum(&self.dropped)
    }

    /// Transactions completed.
    pub fn transactions(&self) -> u64 {
        self.transactions.load(R)
    }

    /// Queries forwarded.
    pub fn queries(&self) -> u64 {
        self.queries.load(R)
    }

    /// Total duration of completed transactions.
    pub fn transaction_time(&self) -> Duration {
        Duration::from_micros(self.xact_time_us.load(R))
    }

    /// Times a client was assigned a server connection.
    pub fn server_assignments(&self) -> u64 {
        self.assignments.load(R)
    }

    /// Total time clients waited for a server connection.
    pub fn wait_time(&self) -> Duration {
        Duration::from_micros(self.wait_time_us.load(R))
    }

    /// The open server connections described so far, oldest first.
    pub fn live_servers(&self) -> Vec<ServerInfo> {
        self.live.lock().values().cloned().collect()
    }

    pub(crate) fn add_live(&self, info: ServerInfo) -> u64 {
        let id = self.next_live.fetch_add(1, R);
        self.live.lock().insert(id, info);
        id
    }

    pub(crate) fn remove_live(&self, id: u64) {
        self.live.lock().remove(&id);
    }

    /// Client Parse messages.
    pub fn client_parses(&self) -> u64 {
        self.client_parses.load(R)
    }

    /// Server Parse messages.
    pub fn server_parses(&self) -> u64 {
        self.server_parses.load(R)
    }

    /// Pinned sessions.
    pub fn pinned(&self) -> u64 {
        self.pinned.load(R)
    }

    /// Server connection opens per second over `window`.
    pub fn opens_per_second(&self, window: Window) -> f64 {
        self.opens.per_second(window)
    }

    /// Server connection closes per second over `window`.
    pub fn closes_per_second(&self, window: Window) -> f64 {
        self.closes.per_second(window)
    }

    /// The opens rate window (for inspection with an injected clock).
    pub fn opens_window(&self) -> &RateWindow {
        &self.opens
    }

    /// The closes rate window.
    pub fn closes_window(&self) -> &RateWindow {
        &self.closes
    }

    /// Current server connections in `state`.
    pub fn servers(&self, state: ServerState) -> i64 {
        self.servers[state.index()].load(R)
    }

    /// Current clients in `state`.
    pub fn clients(&self, state: ClientState) -> i64 {
        self.clients[state.index()].load(R)
    }

    /// Wait of the oldest waiting client, as last set.
    pub fn maxwait(&self) -> Duration {
        Duration::from_micros(self.maxwait_us.load(R))
    }

    // ---- publishing ----

    /// Writes the rate and state gauges into the `metrics` facade.
    pub fn publish_gauges(&self) {
        for &w in Window::ALL {
            self.h.opens_rate[w.index()].set(self.opens.per_second(w));
            self.h.closes_rate[w.index()].set(self.closes.per_second(w));
        }
        for &s in ServerState::ALL {
            self.h.servers[s.index()].set(self.servers(s) as f64);
        }
        for &c in ClientState::ALL {
            self.h.clients[c.index()].set(self.clients(c) as f64);
        }
        self.h.maxwait.set(self.maxwait().as_secs_f64());
    }

    fn zero_gauges(&self) {
        let all = self.h.opens_rate.iter().chain(&self.h.closes_rate);
        all.chain(&self.h.servers).chain(&self.h.clients).for_each(|g| g.set(0.0));
        self.h.maxwait.set(0.0);
    }
}

impl Drop for PoolMetrics {
    /// A removed pool stops reporting stale connection counts.
    fn drop(&mut self) {
        self.zero_gauges();
    }
}

fn register(pool: &Arc<PoolMetrics>) {
    let mut reg = REGISTRY.lock();
    reg.retain(|w| w.strong_count() > 0);
    reg.push(Arc::downgrade(pool));
}

/// Calls [`PoolMetrics::publish_gauges`] on every live pool in the process.
/// The exporter runs this before each scrape and on every upkeep tick.
pub fn publish_all() {
    let live: Vec<Arc<PoolMetrics>> = {
        let mut reg = REGISTRY.lock();
        reg.retain(|w| w.strong_count() > 0);
        reg.iter().filter_map(Weak::upgrade).collect()
    };
    live.iter().for_each(|p| p.publish_gauges());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_and_gauges_read_back() {
        let p = PoolMetrics::new("db_pool_test", "u");
        p.record_connect_failure(ConnectFailure::Timeout);
        p.record_connect_failure(ConnectFailure::Auth);
        p.record_dropped_query(DropReason::WaitTimeout);
        p.record_transaction(Duration::from_millis(3));
        p.record_query();
        p.record_query();
        p.record_client_parse();
        p.record_server_parse();
        p.record_pinned();
        p.record_client_wait(Duration::from_millis(1));
        assert_eq!(p.connect_failures(ConnectFailure::Timeout), 1);
        assert_eq!(p.connect_failures_total(), 2);
        assert_eq!(p.dropped_queries(DropReason::WaitTimeout), 1);
        assert_eq!(p.dropped_queries_total(), 1);
        assert_eq!((p.transactions(), p.queries()), (1, 2));
        assert_eq!(p.transaction_time(), Duration::from_millis(3));
        assert_eq!((p.server_assignments(), p.wait_time()), (1, Duration::from_millis(1)));
        assert_eq!((p.client_parses(), p.server_parses(), p.pinned()), (1, 1, 1));
        assert_eq!(p.opened(), 0, "connect failures are not opens");

        p.add_servers(ServerState::Login, 1);
        p.move_server(ServerState::Login, ServerState::Idle);
        p.move_server(ServerState::Idle, ServerState::Active);
        p.add_clients(ClientState::Waiting, 2);
        p.move_client(ClientState::Waiting, ClientState::Active);
        p.set_maxwait(Duration::from_millis(1500));
        assert_eq!(p.servers(ServerState::Active), 1);
        assert_eq!(p.servers(ServerState::Login), 0);
        assert_eq!(p.clients(ClientState::Waiting), 1);
        assert_eq!(p.maxwait(), Duration::from_millis(1500));
        p.publish_gauges();
        publish_all();
        assert_eq!((p.database(), p.user()), ("db_pool_test", "u"));
    }
}
