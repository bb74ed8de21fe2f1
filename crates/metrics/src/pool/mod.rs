//! [`PoolMetrics`]: all per-pool (database, user) accounting — server
//! connection opens/closes with reasons and their rates, connect failures,
//! dropped queries, traffic counters, latency histograms, the configured
//! limits and the state gauges — as plain atomics, grouped by what they
//! describe (`groups`): the servers, the clients, the waits for a server and
//! weir's prepared statements.
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

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use crate::stats::{Period, StatTotals};
use groups::{Clients, Servers, Statements, Waits};

mod groups;
mod live;
mod queries;
mod read;
mod record;
pub(crate) mod sample;

pub use live::{ServerInfo, SharedCount};
pub use queries::{QuerySeries, OTHER};

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
    servers: Servers,
    clients: Clients,
    waits: Waits,
    statements: Statements,
    /// The counters at the start of the current stats period, and the last
    /// completed period (`roll_period`).
    period: Mutex<(StatTotals, Period)>,
    /// The configured limits.
    limits: Mutex<Limits>,
    /// fleet_share: this instance's share of the fleet's budget, and the
    /// instances announcing (both 0 without fleet_share).
    fleet_share: AtomicU64,
    fleet_instances: AtomicU64,
    /// The statement fingerprints' series (`queries`).
    fingerprints: Mutex<Vec<QuerySeries>>,
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
            servers: Servers::new(),
            clients: Clients::new(),
            waits: Waits::new(),
            statements: Statements::new(),
            period: Mutex::new(Default::default()),
            limits: Mutex::new(Limits::default()),
            fleet_share: AtomicU64::new(0),
            fleet_instances: AtomicU64::new(0),
            fingerprints: Mutex::new(Vec::new()),
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
        self.0.servers.being_canceled.fetch_sub(1, R);
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
