//! [`PoolMetrics`]: all per-pool (database, user) accounting — server
//! connection opens/closes with reasons and their rates, connect failures,
//! dropped queries, traffic counters, latency histograms, the configured
//! limits and the state gauges — as plain atomics.
//!
//! This module owns the struct, its construction and the process-wide list
//! of live pools that `/metrics` renders: a pool's series are exported
//! exactly as long as its `PoolMetrics` lives. The methods are split by who
//! calls them:
//!
//! * `record` — the proxy counting into the pool (per query, per
//!   assignment, per state change);
//! * `read` — the admin console reading figures back for `SHOW`;
//! * `live` — the open server connections `SHOW SERVERS` lists;
//! * `sample` — one consistent copy of every number, which `crate::text`
//!   renders for `/metrics`.
//!
//! Server-connection opens and closes are only recorded through
//! [`ServerConnGuard`](crate::ServerConnGuard), which guarantees exactly one
//! close per open.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use crate::close::{CloseReason, ConnectFailure, ConnectRefusal, DropReason};
use crate::hist::Histogram;
use crate::rate::RateWindow;
use crate::state::{ClientState, ServerState};
use crate::stats::{Period, StatTotals};

mod live;
mod read;
mod record;
pub(crate) mod sample;

pub use live::{ServerInfo, SharedCount};

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
    binds: AtomicU64,
    unnamed_hits: AtomicU64,
    unnamed_prepares: AtomicU64,
    evictions: AtomicU64,
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
    /// fleet_share: this instance's share of the fleet's budget, and the
    /// instances announcing (both 0 without fleet_share).
    fleet_share: AtomicU64,
    fleet_instances: AtomicU64,
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
            binds: AtomicU64::new(0),
            unnamed_hits: AtomicU64::new(0),
            unnamed_prepares: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
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
            fleet_share: AtomicU64::new(0),
            fleet_instances: AtomicU64::new(0),
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

#[cfg(test)]
mod tests;
