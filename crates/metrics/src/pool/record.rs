//! Recording: what the proxy counts into a pool, from the per-query path
//! (relaxed atomic adds) and from the pool's own bookkeeping (state gauges,
//! the oldest and the predicted wait, the configured limits). Server
//! connection opens and closes come only through
//! [`ServerConnGuard`](crate::ServerConnGuard).

use std::sync::Arc;
use std::time::Duration;

use super::{micros, BeingCanceled, Limits, PoolMetrics, R};
use crate::close::{CloseReason, ConnectFailure, ConnectRefusal, DropReason};
use crate::state::{ClientState, ServerState};

impl PoolMetrics {
    pub(crate) fn record_open(&self, connect_duration: Duration) {
        self.servers.opened.fetch_add(1, R);
        self.servers.opens.record();
        self.servers.connect_duration.record(connect_duration);
    }

    pub(crate) fn record_close(&self, reason: CloseReason) {
        self.servers.closed[reason.index()].fetch_add(1, R);
        self.servers.closes.record();
    }

    /// A server connection attempt failed (not an open, never a close).
    pub fn record_connect_failure(&self, reason: ConnectFailure) {
        self.servers.connect_failures[reason.index()].fetch_add(1, R);
    }

    /// Postgres refused a server connect with 53300 (too many connections).
    pub fn record_connect_refused(&self, reason: ConnectRefusal) {
        self.servers.connect_refusals[reason.index()].fetch_add(1, R);
    }

    /// A client query was dropped before completing.
    pub fn record_dropped_query(&self, reason: DropReason) {
        self.clients.dropped[reason.index()].fetch_add(1, R);
    }

    /// A transaction completed after `duration`.
    pub fn record_transaction(&self, duration: Duration) {
        self.clients.transactions.fetch_add(1, R);
        self.clients.xact_time_us.fetch_add(micros(duration), R);
        self.clients.transaction_duration.record(duration);
    }

    /// A query was forwarded to a server.
    pub fn record_query(&self) {
        self.clients.queries.fetch_add(1, R);
    }

    /// A client was assigned a server after waiting `wait` (histogram, plus
    /// the assignment count and total wait time for `SHOW STATS`).
    pub fn record_client_wait(&self, wait: Duration) {
        self.waits.assignments.fetch_add(1, R);
        self.waits.total_us.fetch_add(micros(wait), R);
        self.waits.durations.record(wait);
    }

    /// `n` bytes were read from a client (per chunk, on the query path).
    pub fn record_received(&self, n: usize) {
        self.clients.bytes_received.fetch_add(n as u64, R);
    }

    /// `n` bytes were sent to a client (per chunk, on the query path).
    pub fn record_sent(&self, n: usize) {
        self.clients.bytes_sent.fetch_add(n as u64, R);
    }

    /// `n` bytes were read from a server while a client held it (per chunk,
    /// on the query path).
    pub fn record_server_received(&self, n: usize) {
        self.servers.bytes_received.fetch_add(n as u64, R);
    }

    /// `n` bytes were written to a server while a client held it: the
    /// client's bytes as weir forwarded them (prepared statements renamed or
    /// answered by weir), plus the settings weir applied for it.
    pub fn record_server_sent(&self, n: usize) {
        self.servers.bytes_sent.fetch_add(n as u64, R);
    }

    /// A server its client let go waits for a cancel sent to it; the guard
    /// counts it in `being_canceled` until dropped.
    pub fn being_canceled(self: &Arc<Self>) -> BeingCanceled {
        self.servers.being_canceled.fetch_add(1, R);
        BeingCanceled(self.clone())
    }

    /// Queries were running on a server for `d` (first byte forwarded to
    /// ReadyForQuery).
    pub fn record_query_time(&self, d: Duration) {
        self.clients.query_time_us.fetch_add(micros(d), R);
    }

    /// A client sent a Parse message.
    pub fn record_client_parse(&self) {
        self.statements.client_parses.fetch_add(1, R);
    }

    /// weir sent a Parse message to a server.
    pub fn record_server_parse(&self) {
        self.statements.server_parses.fetch_add(1, R);
    }

    /// Clients sent `n` Binds of their named prepared statements (counted
    /// by the client's task and added here once per reply batch).
    pub fn record_binds(&self, n: u64) {
        self.statements.binds.fetch_add(n, R);
    }

    /// An unnamed Parse was answered from a statement the server had.
    pub fn record_unnamed_hit(&self) {
        self.statements.unnamed_hits.fetch_add(1, R);
    }

    /// An unnamed Parse was sent as a Parse of weir's named statement.
    pub fn record_unnamed_prepare(&self) {
        self.statements.unnamed_prepares.fetch_add(1, R);
    }

    /// weir closed `n` of its statements on a server to stay within its cache.
    pub fn record_evictions(&self, n: u64) {
        self.statements.evictions.fetch_add(n, R);
    }

    /// A pipeline was found stalled inside weir.
    pub fn record_stalled_pipeline(&self) {
        self.clients.stalled.fetch_add(1, R);
    }

    /// A client session got pinned to a server connection.
    pub fn record_pinned(&self) {
        self.clients.pinned.fetch_add(1, R);
    }

    /// Every shared prepared statement of the pool may be stale: Parses from
    /// now on belong to a new generation.
    pub fn invalidate_statements(&self) {
        self.statements.epoch.fetch_add(1, R);
    }

    /// A client's session settings could not be read back from a server
    /// (transaction mode): the server is reset, the client keeps its old ones.
    pub fn record_settings_unfollowed(&self) {
        self.clients.settings_unfollowed.fetch_add(1, R);
    }

    /// Adds `delta` (may be negative) to the server count in `state`.
    pub fn add_servers(&self, state: ServerState, delta: i64) {
        self.servers.states[state.index()].fetch_add(delta, R);
    }

    /// Moves one server connection from state `from` to state `to`.
    pub fn move_server(&self, from: ServerState, to: ServerState) {
        self.add_servers(from, -1);
        self.add_servers(to, 1);
    }

    /// Adds `delta` (may be negative) to the client count in `state`.
    pub fn add_clients(&self, state: ClientState, delta: i64) {
        self.clients.states[state.index()].fetch_add(delta, R);
    }

    /// Moves one client from state `from` to state `to`.
    pub fn move_client(&self, from: ClientState, to: ClientState) {
        self.add_clients(from, -1);
        self.add_clients(to, 1);
    }

    /// Sets the predicted wait of a client queued now (zero if none).
    pub fn set_predicted_wait(&self, wait: Duration) {
        self.waits.predicted_us.store(micros(wait), R);
    }

    /// Sets this instance's share of its fleet's connection budget and the
    /// instances of the fleet (both zero when it shares none).
    pub fn set_fleet(&self, share: u64, instances: u64) {
        self.fleet_share.store(share, R);
        self.fleet_instances.store(instances, R);
    }

    /// Sets how long the oldest waiting client has waited (zero if none).
    pub fn set_maxwait(&self, wait: Duration) {
        let us = u64::try_from(wait.as_micros()).unwrap_or(u64::MAX);
        self.waits.oldest_us.store(us, R);
    }

    /// Sets the configured limits (at pool creation and on every reload).
    pub fn set_limits(&self, limits: Limits) {
        *self.limits.lock() = limits;
    }
}
