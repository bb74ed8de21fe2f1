//! [`PoolMetrics`]: all per-pool (database, user) accounting — server
//! connection opens/closes with reasons and their rates, connect failures,
//! dropped queries, traffic counters, latency histograms, the configured
//! limits and the state gauges — as plain atomics, read by the admin console
//! and rendered for `/metrics` by [`crate::text`].
//!
//! Also owns the process-wide list of live pools that `/metrics` renders: a
//! pool's series are exported exactly as long as its `PoolMetrics` lives.
//!
//! Server-connection opens and closes are only recorded through
//! [`ServerConnGuard`](crate::ServerConnGuard), which guarantees exactly one
//! close per open.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use std::time::{Duration, SystemTime};

use crate::close::{CloseReason, ConnectFailure, ConnectRefusal, DropReason};
use crate::hist::{Histogram, Snapshot};
use crate::rate::{RateWindow, Window};
use crate::state::{ClientState, ServerState};
use crate::stats::{Period, StatTotals};

const R: Ordering = Ordering::Relaxed;

/// Live pools, for `/metrics`. Dead entries are pruned on each render.
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
/// Two live instances with the same labels (two weirs in one process) are
/// summed in `/metrics`.
pub struct PoolMetrics {
    database: String,
    user: String,
    opened: AtomicU64,
    closed: [AtomicU64; CloseReason::COUNT],
    connect_failures: [AtomicU64; ConnectFailure::COUNT],
    connect_refusals: [AtomicU64; ConnectRefusal::COUNT],
    dropped: [AtomicU64; DropReason::COUNT],
    transactions: AtomicU64,
    xact_time_us: AtomicU64,
    queries: AtomicU64,
    assignments: AtomicU64,
    wait_time_us: AtomicU64,
    bytes_received: AtomicU64,
    bytes_sent: AtomicU64,
    server_bytes_received: AtomicU64,
    server_bytes_sent: AtomicU64,
    /// Servers waiting, after their client let go, for a cancel sent to
    /// them to be answered (SHOW POOLS' sv_being_canceled).
    being_canceled: AtomicI64,
    query_time_us: AtomicU64,
    /// The counters at the start of the current stats period, and the last
    /// completed period (`roll_period`).
    period: Mutex<(StatTotals, Period)>,
    client_parses: AtomicU64,
    server_parses: AtomicU64,
    pinned: AtomicU64,
    stalled: AtomicU64,
    /// Bumped whenever weir's shared prepared statements may be stale (DDL,
    /// or a server error meaning one is): each server connection re-prepares
    /// its statements on first use after a change.
    statements_epoch: AtomicU64,
    settings_unfollowed: AtomicU64,
    opens: RateWindow,
    closes: RateWindow,
    servers: [AtomicI64; ServerState::COUNT],
    clients: [AtomicI64; ClientState::COUNT],
    maxwait_us: AtomicU64,
    predicted_wait_us: AtomicU64,
    live: Mutex<BTreeMap<u64, ServerInfo>>,
    next_live: AtomicU64,
    connect_duration: Histogram,
    client_wait: Histogram,
    transaction_duration: Histogram,
    limits: Mutex<Limits>,
}

/// A pool's configured limits, exported so that utilisation can be alerted on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Limits {
    /// `pool_size` (or `default_pool_size`).
    pub pool_size: u64,
    /// `reserve_pool_size`.
    pub reserve_pool_size: u64,
    /// `max_db_connections`; 0 means no limit.
    pub max_db_connections: u64,
}

/// Every number of one pool at one moment, for rendering (and summing pools
/// that share labels).
#[derive(Debug, Clone, Default)]
pub(crate) struct Sample {
    pub opened: u64,
    pub closed: [u64; CloseReason::COUNT],
    pub connect_failures: [u64; ConnectFailure::COUNT],
    pub connect_refusals: [u64; ConnectRefusal::COUNT],
    pub dropped: [u64; DropReason::COUNT],
    pub transactions: u64,
    pub queries: u64,
    pub client_parses: u64,
    pub server_parses: u64,
    pub pinned: u64,
    pub stalled: u64,
    pub settings_unfollowed: u64,
    pub received: u64,
    pub sent: u64,
    pub server_received: u64,
    pub server_sent: u64,
    pub opens_rate: [f64; Window::ALL.len()],
    pub closes_rate: [f64; Window::ALL.len()],
    pub servers: [i64; ServerState::COUNT],
    pub clients: [i64; ClientState::COUNT],
    pub maxwait_us: u64,
    pub predicted_wait_us: u64,
    pub limits: Limits,
    pub connect_duration: Snapshot,
    pub client_wait: Snapshot,
    pub transaction_duration: Snapshot,
}

fn add_all<T: Copy + std::ops::AddAssign>(a: &mut [T], b: &[T]) {
    a.iter_mut().zip(b).for_each(|(x, y)| *x += *y);
}

impl Sample {
    /// Adds another pool's numbers with the same labels (maxwait: the larger).
    pub fn add(&mut self, o: &Sample) {
        self.opened += o.opened;
        add_all(&mut self.closed, &o.closed);
        add_all(&mut self.connect_failures, &o.connect_failures);
        add_all(&mut self.connect_refusals, &o.connect_refusals);
        add_all(&mut self.dropped, &o.dropped);
        self.transactions += o.transactions;
        self.queries += o.queries;
        self.client_parses += o.client_parses;
        self.server_parses += o.server_parses;
        self.pinned += o.pinned;
        self.stalled += o.stalled;
        self.settings_unfollowed += o.settings_unfollowed;
        self.received += o.received;
        self.sent += o.sent;
        self.server_received += o.server_received;
        self.server_sent += o.server_sent;
        add_all(&mut self.opens_rate, &o.opens_rate);
        add_all(&mut self.closes_rate, &o.closes_rate);
        add_all(&mut self.servers, &o.servers);
        add_all(&mut self.clients, &o.clients);
        self.maxwait_us = self.maxwait_us.max(o.maxwait_us);
        self.predicted_wait_us = self.predicted_wait_us.max(o.predicted_wait_us);
        self.limits.pool_size += o.limits.pool_size;
        self.limits.reserve_pool_size += o.limits.reserve_pool_size;
        self.limits.max_db_connections += o.limits.max_db_connections;
        self.connect_duration.add(&o.connect_duration);
        self.client_wait.add(&o.client_wait);
        self.transaction_duration.add(&o.transaction_duration);
    }
}

fn load<const N: usize>(a: &[AtomicU64; N]) -> [u64; N] {
    std::array::from_fn(|i| a[i].load(R))
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
    pub addr: crate::ConnAddr,
    /// weir's end of the connection.
    pub local_addr: Option<crate::ConnAddr>,
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
    /// Creates the metrics for pool (`database`, `user`) and lists it for
    /// `/metrics` until it is dropped.
    pub fn new(database: impl Into<String>, user: impl Into<String>) -> Arc<Self> {
        let (database, user) = (database.into(), user.into());
        let pool = Arc::new(PoolMetrics {
            database,
            user,
            opened: AtomicU64::new(0),
            closed: zeroed(),
            connect_failures: zeroed(),
            connect_refusals: zeroed(),
            dropped: zeroed(),
            transactions: AtomicU64::new(0),
            xact_time_us: AtomicU64::new(0),
            queries: AtomicU64::new(0),
            assignments: AtomicU64::new(0),
            wait_time_us: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            server_bytes_received: AtomicU64::new(0),
            server_bytes_sent: AtomicU64::new(0),
            being_canceled: AtomicI64::new(0),
            query_time_us: AtomicU64::new(0),
            period: Mutex::new(Default::default()),
            client_parses: AtomicU64::new(0),
            server_parses: AtomicU64::new(0),
            pinned: AtomicU64::new(0),
            stalled: AtomicU64::new(0),
            statements_epoch: AtomicU64::new(0),
            settings_unfollowed: AtomicU64::new(0),
            opens: RateWindow::new(),
            closes: RateWindow::new(),
            servers: zeroed_i(),
            clients: zeroed_i(),
            maxwait_us: AtomicU64::new(0),
            predicted_wait_us: AtomicU64::new(0),
            live: Mutex::new(BTreeMap::new()),
            next_live: AtomicU64::new(1),
            connect_duration: Histogram::default(),
            client_wait: Histogram::default(),
            transaction_duration: Histogram::default(),
            limits: Mutex::new(Limits::default()),
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
        self.connect_duration.record(connect_duration);
    }

    pub(crate) fn record_close(&self, reason: CloseReason) {
        self.closed[reason.index()].fetch_add(1, R);
        self.closes.record();
    }

    // ---- recording: everything else ----

    /// A server connection attempt failed (not an open, never a close).
    pub fn record_connect_failure(&self, reason: ConnectFailure) {
        self.connect_failures[reason.index()].fetch_add(1, R);
    }

    /// Postgres refused a server connect with 53300 (too many connections).
    pub fn record_connect_refused(&self, reason: ConnectRefusal) {
        self.connect_refusals[reason.index()].fetch_add(1, R);
    }

    /// A client query was dropped before completing.
    pub fn record_dropped_query(&self, reason: DropReason) {
        self.dropped[reason.index()].fetch_add(1, R);
    }

    /// A transaction completed after `duration`.
    pub fn record_transaction(&self, duration: Duration) {
        self.transactions.fetch_add(1, R);
        self.xact_time_us.fetch_add(micros(duration), R);
        self.transaction_duration.record(duration);
    }

    /// A query was forwarded to a server.
    pub fn record_query(&self) {
        self.queries.fetch_add(1, R);
    }

    /// A client was assigned a server after waiting `wait` (histogram, plus
    /// the assignment count and total wait time for `SHOW STATS`).
    pub fn record_client_wait(&self, wait: Duration) {
        self.assignments.fetch_add(1, R);
        self.wait_time_us.fetch_add(micros(wait), R);
        self.client_wait.record(wait);
    }

    /// `n` bytes were read from a client (per chunk, on the query path).
    pub fn record_received(&self, n: usize) {
        self.bytes_received.fetch_add(n as u64, R);
    }

    /// `n` bytes were sent to a client (per chunk, on the query path).
    pub fn record_sent(&self, n: usize) {
        self.bytes_sent.fetch_add(n as u64, R);
    }

    /// `n` bytes were read from a server while a client held it (per chunk,
    /// on the query path).
    pub fn record_server_received(&self, n: usize) {
        self.server_bytes_received.fetch_add(n as u64, R);
    }

    /// `n` bytes were written to a server while a client held it: the
    /// client's bytes as weir forwarded them (prepared statements renamed or
    /// answered by weir), plus the settings weir applied for it.
    pub fn record_server_sent(&self, n: usize) {
        self.server_bytes_sent.fetch_add(n as u64, R);
    }

    /// A server its client let go waits for a cancel sent to it; the guard
    /// counts it in `being_canceled` until dropped.
    pub fn being_canceled(self: &Arc<Self>) -> BeingCanceled {
        self.being_canceled.fetch_add(1, R);
        BeingCanceled(self.clone())
    }

    /// Servers waiting for a cancel to be answered before they are idle.
    pub fn servers_being_canceled(&self) -> u64 {
        self.being_canceled.load(R).max(0) as u64
    }

    /// Queries were running on a server for `d` (first byte forwarded to
    /// ReadyForQuery).
    pub fn record_query_time(&self, d: Duration) {
        self.query_time_us.fetch_add(micros(d), R);
    }

    /// A client sent a Parse message.
    pub fn record_client_parse(&self) {
        self.client_parses.fetch_add(1, R);
    }

    /// weir sent a Parse message to a server.
    pub fn record_server_parse(&self) {
        self.server_parses.fetch_add(1, R);
    }

    /// A pipeline was found stalled inside weir.
    pub fn record_stalled_pipeline(&self) {
        self.stalled.fetch_add(1, R);
    }

    /// A client session got pinned to a server connection.
    pub fn record_pinned(&self) {
        self.pinned.fetch_add(1, R);
    }

    /// The generation of the pool's shared prepared statements.
    pub fn statements_epoch(&self) -> u64 {
        self.statements_epoch.load(R)
    }

    /// Every shared prepared statement of the pool may be stale: Parses from
    /// now on belong to a new generation.
    pub fn invalidate_statements(&self) {
        self.statements_epoch.fetch_add(1, R);
    }

    /// A client's session settings could not be read back from a server
    /// (transaction mode): the server is reset, the client keeps its old ones.
    pub fn record_settings_unfollowed(&self) {
        self.settings_unfollowed.fetch_add(1, R);
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

    /// Sets the predicted wait of a client queued now (zero if none).
    pub fn set_predicted_wait(&self, wait: Duration) {
        self.predicted_wait_us.store(micros(wait), R);
    }

    /// The predicted wait of a client queued now, as last published.
    pub fn predicted_wait(&self) -> Duration {
        Duration::from_micros(self.predicted_wait_us.load(R))
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

    /// Server connects refused with 53300, naming `reason`.
    pub fn connect_refusals(&self, reason: ConnectRefusal) -> u64 {
        self.connect_refusals[reason.index()].load(R)
    }

    /// Server connects refused with 53300, all reasons.
    pub fn connect_refusals_total(&self) -> u64 {
        sum(&self.connect_refusals)
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

    /// Bytes received from clients.
    pub fn bytes_received(&self) -> u64 {
        self.bytes_received.load(R)
    }

    /// Bytes sent to clients.
    pub fn bytes_sent(&self) -> u64 {
        self.bytes_sent.load(R)
    }

    /// Bytes read from servers while clients held them.
    pub fn server_bytes_received(&self) -> u64 {
        self.server_bytes_received.load(R)
    }

    /// Bytes written to servers while clients held them.
    pub fn server_bytes_sent(&self) -> u64 {
        self.server_bytes_sent.load(R)
    }

    /// Total time queries ran on servers.
    pub fn query_time(&self) -> Duration {
        Duration::from_micros(self.query_time_us.load(R))
    }

    /// Every `SHOW STATS` counter now.
    pub fn totals(&self) -> StatTotals {
        StatTotals {
            xacts: self.transactions(),
            queries: self.queries(),
            received: self.bytes_received(),
            sent: self.bytes_sent(),
            xact_time_us: self.xact_time_us.load(R),
            query_time_us: self.query_time_us.load(R),
            wait_time_us: self.wait_time_us.load(R),
            assignments: self.server_assignments(),
            client_parses: self.client_parses(),
            server_parses: self.server_parses(),
        }
    }

    /// Ends the current stats period, which lasted `length`: its changes
    /// become the last completed period (`SHOW STATS` averages).
    pub fn roll_period(&self, length: Duration) {
        let now = self.totals();
        let mut p = self.period.lock();
        *p = (now, Period { delta: now - p.0, length });
    }

    /// The last completed stats period.
    pub fn last_period(&self) -> Period {
        self.period.lock().1
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

    /// Pipelines found stalled inside weir.
    pub fn stalled_pipelines(&self) -> u64 {
        self.stalled.load(R)
    }

    /// Session-settings read-backs that failed.
    pub fn settings_unfollowed(&self) -> u64 {
        self.settings_unfollowed.load(R)
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

    /// Sets the configured limits (at pool creation and on every reload).
    pub fn set_limits(&self, limits: Limits) {
        *self.limits.lock() = limits;
    }

    /// The configured limits, as last set.
    pub fn limits(&self) -> Limits {
        *self.limits.lock()
    }

    // ---- rendering ----

    pub(crate) fn sample(&self) -> Sample {
        Sample {
            opened: self.opened(),
            closed: load(&self.closed),
            connect_failures: load(&self.connect_failures),
            connect_refusals: load(&self.connect_refusals),
            dropped: load(&self.dropped),
            transactions: self.transactions(),
            queries: self.queries(),
            client_parses: self.client_parses(),
            server_parses: self.server_parses(),
            pinned: self.pinned(),
            stalled: self.stalled_pipelines(),
            settings_unfollowed: self.settings_unfollowed(),
            received: self.bytes_received(),
            sent: self.bytes_sent(),
            server_received: self.server_bytes_received(),
            server_sent: self.server_bytes_sent(),
            opens_rate: std::array::from_fn(|i| self.opens.per_second(Window::ALL[i])),
            closes_rate: std::array::from_fn(|i| self.closes.per_second(Window::ALL[i])),
            servers: std::array::from_fn(|i| self.servers[i].load(R)),
            clients: std::array::from_fn(|i| self.clients[i].load(R)),
            maxwait_us: self.maxwait_us.load(R),
            predicted_wait_us: self.predicted_wait_us.load(R),
            limits: self.limits(),
            connect_duration: self.connect_duration.snapshot(),
            client_wait: self.client_wait.snapshot(),
            transaction_duration: self.transaction_duration.snapshot(),
        }
    }
}

/// Counts one server in `PoolMetrics::being_canceled` while it lives.
#[derive(Debug)]
pub struct BeingCanceled(Arc<PoolMetrics>);

impl Drop for BeingCanceled {
    fn drop(&mut self) {
        self.0.being_canceled.fetch_sub(1, R);
    }
}

fn register(pool: &Arc<PoolMetrics>) {
    let mut reg = REGISTRY.lock();
    reg.retain(|w| w.strong_count() > 0);
    reg.push(Arc::downgrade(pool));
}

/// Every live pool in the process.
pub(crate) fn live_pools() -> Vec<Arc<PoolMetrics>> {
    let mut reg = REGISTRY.lock();
    reg.retain(|w| w.strong_count() > 0);
    reg.iter().filter_map(Weak::upgrade).collect()
}

/// The Prometheus text of every live pool's series.
pub fn render_all() -> String {
    crate::text::render_pools(&live_pools())
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
        p.record_settings_unfollowed();
        assert_eq!(p.settings_unfollowed(), 1);
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
        assert!(render_all().contains("db_pool_test"));
        assert_eq!((p.database(), p.user()), ("db_pool_test", "u"));
    }

    #[test]
    fn traffic_and_stats_periods() {
        let p = PoolMetrics::new("db_period_test", "u");
        p.record_received(100);
        p.record_sent(40);
        p.record_query_time(Duration::from_millis(2));
        p.record_transaction(Duration::from_millis(3));
        assert_eq!((p.bytes_received(), p.bytes_sent(), p.query_time()), (100, 40, Duration::from_millis(2)));
        assert_eq!(p.last_period(), Period::default(), "no period has completed");
        p.roll_period(Duration::from_secs(2));
        let last = p.last_period();
        assert_eq!((last.delta.received, last.delta.xacts, last.length), (100, 1, Duration::from_secs(2)));
        p.record_sent(10);
        p.roll_period(Duration::from_secs(2));
        let last = p.last_period();
        assert_eq!((last.delta.sent, last.delta.received, last.delta.xacts), (10, 0, 0), "only the last period");
        assert_eq!(p.totals().sent, 50);
    }

    #[test]
    fn server_bytes_and_servers_being_canceled() {
        let p = PoolMetrics::new("db_server_bytes_test", "u");
        p.record_server_sent(30);
        p.record_server_received(70);
        assert_eq!((p.server_bytes_sent(), p.server_bytes_received(), p.bytes_received()), (30, 70, 0));
        let text = render_all();
        let line = |name: &str| {
            text.lines().find(|l| l.starts_with(name) && l.contains("db_server_bytes_test")).map(str::to_owned)
        };
        assert!(line("weir_server_bytes_sent_total").is_some_and(|l| l.ends_with(" 30")), "{text}");
        assert!(line("weir_server_bytes_received_total").is_some_and(|l| l.ends_with(" 70")), "{text}");
        let (a, b) = (p.being_canceled(), p.being_canceled());
        assert_eq!(p.servers_being_canceled(), 2);
        drop(a);
        assert_eq!(p.servers_being_canceled(), 1);
        drop(b);
        assert_eq!(p.servers_being_canceled(), 0);
    }
}
