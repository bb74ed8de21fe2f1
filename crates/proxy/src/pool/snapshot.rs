//! `PoolSnapshot`: a pool's counters at one moment, for SHOW POOLS,
//! `/metrics`' state gauges (`upkeep.rs`) and tests.

use std::time::Duration;

/// Counters for SHOW POOLS and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolSnapshot {
    pub idle: u32,
    pub active: u32,
    pub connecting: u32,
    /// Being cleaned up after a dirty client, or running the fleet's query
    /// (`fleet_share`) between transactions: PgBouncer's sv_tested.
    pub recovering: u32,
    pub waiting: u32,
    pub maxwait: Duration,
    pub paused: bool,
    pub pool_size: u32,
    /// What a client queued now would wait, as predicted (zero while the
    /// pool has room or the estimate is young).
    pub predicted_wait: Duration,
    /// Server connections of replication clients, each its client's alone
    /// (counted under pool_size, never in `active`).
    pub replication: u32,
}

impl PoolSnapshot {
    /// Nothing lent, opening, being cleaned up or waited for.
    pub fn is_unused(&self) -> bool {
        self.active == 0 && self.connecting == 0 && self.recovering == 0 && self.waiting == 0 && self.replication == 0
    }
}
