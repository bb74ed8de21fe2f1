//! Reads: the figures behind the admin console's `SHOW POOLS`, `SHOW STATS`,
//! `SHOW TOTALS` and friends, one number at a time, plus the stats periods
//! `SHOW STATS` averages over.

use std::time::Duration;

use super::{sum, Limits, PoolMetrics, R};
use crate::close::{CloseReason, ConnectFailure, ConnectRefusal, DropReason};
use crate::rate::{RateWindow, Window};
use crate::state::{ClientState, ServerState};
use crate::stats::{Period, StatTotals};

impl PoolMetrics {
    /// Server connections opened.
    pub fn opened(&self) -> u64 {
        self.servers.opened.load(R)
    }

    /// Server connections closed with `reason`.
    pub fn closed(&self, reason: CloseReason) -> u64 {
        self.servers.closed[reason.index()].load(R)
    }

    /// Server connections closed, all reasons.
    pub fn closed_total(&self) -> u64 {
        sum(&self.servers.closed)
    }

    /// Server connect failures with `reason`.
    pub fn connect_failures(&self, reason: ConnectFailure) -> u64 {
        self.servers.connect_failures[reason.index()].load(R)
    }

    /// Server connect failures, all reasons.
    pub fn connect_failures_total(&self) -> u64 {
        sum(&self.servers.connect_failures)
    }

    /// Server connects refused with 53300, naming `reason`.
    pub fn connect_refusals(&self, reason: ConnectRefusal) -> u64 {
        self.servers.connect_refusals[reason.index()].load(R)
    }

    /// Server connects refused with 53300, all reasons.
    pub fn connect_refusals_total(&self) -> u64 {
        sum(&self.servers.connect_refusals)
    }

    /// Queries dropped with `reason`.
    pub fn dropped_queries(&self, reason: DropReason) -> u64 {
        self.clients.dropped[reason.index()].load(R)
    }

    /// Queries dropped, all reasons.
    pub fn dropped_queries_total(&self) -> u64 {
        sum(&self.clients.dropped)
    }

    /// Transactions completed.
    pub fn transactions(&self) -> u64 {
        self.clients.transactions.load(R)
    }

    /// Queries forwarded.
    pub fn queries(&self) -> u64 {
        self.clients.queries.load(R)
    }

    /// Total duration of completed transactions.
    pub fn transaction_time(&self) -> Duration {
        Duration::from_micros(self.clients.xact_time_us.load(R))
    }

    /// Times a client was assigned a server connection.
    pub fn server_assignments(&self) -> u64 {
        self.waits.assignments.load(R)
    }

    /// Total time clients waited for a server connection.
    pub fn wait_time(&self) -> Duration {
        Duration::from_micros(self.waits.total_us.load(R))
    }

    /// Bytes received from clients.
    pub fn bytes_received(&self) -> u64 {
        self.clients.bytes_received.load(R)
    }

    /// Bytes sent to clients.
    pub fn bytes_sent(&self) -> u64 {
        self.clients.bytes_sent.load(R)
    }

    /// Bytes read from servers while clients held them.
    pub fn server_bytes_received(&self) -> u64 {
        self.servers.bytes_received.load(R)
    }

    /// Bytes written to servers while clients held them.
    pub fn server_bytes_sent(&self) -> u64 {
        self.servers.bytes_sent.load(R)
    }

    /// Total time queries ran on servers.
    pub fn query_time(&self) -> Duration {
        Duration::from_micros(self.clients.query_time_us.load(R))
    }

    /// Every `SHOW STATS` counter now.
    pub fn totals(&self) -> StatTotals {
        StatTotals {
            xacts: self.transactions(),
            queries: self.queries(),
            received: self.bytes_received(),
            sent: self.bytes_sent(),
            xact_time_us: self.clients.xact_time_us.load(R),
            query_time_us: self.clients.query_time_us.load(R),
            wait_time_us: self.waits.total_us.load(R),
            assignments: self.server_assignments(),
            client_parses: self.client_parses(),
            server_parses: self.server_parses(),
            binds: self.binds(),
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

    /// Client Parse messages.
    pub fn client_parses(&self) -> u64 {
        self.statements.client_parses.load(R)
    }

    /// Server Parse messages.
    pub fn server_parses(&self) -> u64 {
        self.statements.server_parses.load(R)
    }

    /// Binds of clients' named prepared statements.
    pub fn binds(&self) -> u64 {
        self.statements.binds.load(R)
    }

    /// Unnamed Parses answered from a statement the server had.
    pub fn unnamed_hits(&self) -> u64 {
        self.statements.unnamed_hits.load(R)
    }

    /// Unnamed Parses sent as a Parse of weir's named statement.
    pub fn unnamed_prepares(&self) -> u64 {
        self.statements.unnamed_prepares.load(R)
    }

    /// Statements closed to stay within a server's cache.
    pub fn statement_evictions(&self) -> u64 {
        self.statements.evictions.load(R)
    }

    /// Pinned sessions.
    pub fn pinned(&self) -> u64 {
        self.clients.pinned.load(R)
    }

    /// Pipelines found stalled inside weir.
    pub fn stalled_pipelines(&self) -> u64 {
        self.clients.stalled.load(R)
    }

    /// Session-settings read-backs that failed.
    pub fn settings_unfollowed(&self) -> u64 {
        self.clients.settings_unfollowed.load(R)
    }

    /// Server connection opens per second over `window`.
    pub fn opens_per_second(&self, window: Window) -> f64 {
        self.servers.opens.per_second(window)
    }

    /// Server connection closes per second over `window`.
    pub fn closes_per_second(&self, window: Window) -> f64 {
        self.servers.closes.per_second(window)
    }

    /// The opens rate window (for inspection with an injected clock).
    pub fn opens_window(&self) -> &RateWindow {
        &self.servers.opens
    }

    /// The closes rate window.
    pub fn closes_window(&self) -> &RateWindow {
        &self.servers.closes
    }

    /// Current server connections in `state`.
    pub fn servers(&self, state: ServerState) -> i64 {
        self.servers.states[state.index()].load(R)
    }

    /// Current clients in `state`.
    pub fn clients(&self, state: ClientState) -> i64 {
        self.clients.states[state.index()].load(R)
    }

    /// Wait of the oldest waiting client, as last set.
    pub fn maxwait(&self) -> Duration {
        Duration::from_micros(self.waits.oldest_us.load(R))
    }

    /// The configured limits, as last set.
    pub fn limits(&self) -> Limits {
        *self.limits.lock()
    }

    /// Servers waiting for a cancel to be answered before they are idle.
    pub fn servers_being_canceled(&self) -> u64 {
        self.servers.being_canceled.load(R).max(0) as u64
    }

    /// The generation of the pool's shared prepared statements.
    pub fn statements_epoch(&self) -> u64 {
        self.statements.epoch.load(R)
    }

    /// With fleet_share: this instance's share and the fleet's instances.
    pub fn fleet(&self) -> (u64, u64) {
        (self.fleet_share.load(R), self.fleet_instances.load(R))
    }

    /// The predicted wait of a client queued now, as last published.
    pub fn predicted_wait(&self) -> Duration {
        Duration::from_micros(self.waits.predicted_us.load(R))
    }
}
