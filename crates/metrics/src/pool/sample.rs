//! [`Sample`]: every number of one pool at one moment, the input of the
//! `/metrics` renderer (`crate::text`), which sums pools that share labels.

use std::sync::atomic::AtomicU64;

use super::{Limits, PoolMetrics, R};
use crate::close::{CloseReason, ConnectFailure, ConnectRefusal, DropReason};
use crate::hist::Snapshot;
use crate::rate::Window;
use crate::state::{ClientState, ServerState};

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
    pub binds: u64,
    pub unnamed_hits: u64,
    pub unnamed_prepares: u64,
    pub evictions: u64,
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
    pub fleet_share: u64,
    pub fleet_instances: u64,
    pub limits: Limits,
    pub connect_duration: Snapshot,
    pub client_wait: Snapshot,
    pub transaction_duration: Snapshot,
    pub fingerprints: Vec<super::QuerySeries>,
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
        self.binds += o.binds;
        self.unnamed_hits += o.unnamed_hits;
        self.unnamed_prepares += o.unnamed_prepares;
        self.evictions += o.evictions;
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
        self.fleet_share += o.fleet_share;
        self.fleet_instances = self.fleet_instances.max(o.fleet_instances);
        self.limits.pool_size += o.limits.pool_size;
        self.limits.reserve_pool_size += o.limits.reserve_pool_size;
        self.limits.max_db_connections += o.limits.max_db_connections;
        self.connect_duration.add(&o.connect_duration);
        self.client_wait.add(&o.client_wait);
        self.transaction_duration.add(&o.transaction_duration);
        super::queries::merge(&mut self.fingerprints, &o.fingerprints);
    }
}

fn load<const N: usize>(a: &[AtomicU64; N]) -> [u64; N] {
    std::array::from_fn(|i| a[i].load(R))
}

impl PoolMetrics {
    /// This pool now, for rendering.
    pub(crate) fn sample(&self) -> Sample {
        Sample {
            opened: self.opened(),
            closed: load(&self.servers.closed),
            connect_failures: load(&self.servers.connect_failures),
            connect_refusals: load(&self.servers.connect_refusals),
            dropped: load(&self.clients.dropped),
            transactions: self.transactions(),
            queries: self.queries(),
            client_parses: self.client_parses(),
            server_parses: self.server_parses(),
            binds: self.binds(),
            unnamed_hits: self.unnamed_hits(),
            unnamed_prepares: self.unnamed_prepares(),
            evictions: self.statement_evictions(),
            pinned: self.pinned(),
            stalled: self.stalled_pipelines(),
            settings_unfollowed: self.settings_unfollowed(),
            received: self.bytes_received(),
            sent: self.bytes_sent(),
            server_received: self.server_bytes_received(),
            server_sent: self.server_bytes_sent(),
            opens_rate: std::array::from_fn(|i| self.servers.opens.per_second(Window::ALL[i])),
            closes_rate: std::array::from_fn(|i| self.servers.closes.per_second(Window::ALL[i])),
            servers: std::array::from_fn(|i| self.servers.states[i].load(R)),
            clients: std::array::from_fn(|i| self.clients.states[i].load(R)),
            maxwait_us: self.waits.oldest_us.load(R),
            predicted_wait_us: self.waits.predicted_us.load(R),
            fleet_share: self.fleet_share.load(R),
            fleet_instances: self.fleet_instances.load(R),
            limits: self.limits(),
            connect_duration: self.servers.connect_duration.snapshot(),
            client_wait: self.waits.durations.snapshot(),
            transaction_duration: self.clients.transaction_duration.snapshot(),
            fingerprints: self.fingerprint_series(),
        }
    }
}
