//! The pool's mutable state behind its one mutex: idle stack, waiter queue,
//! counters and connect back-off. Short critical sections only; never awaited.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use weir_metrics::CloseReason;

use super::PoolOptions;
use crate::params::ParamMap;
use crate::server::ServerConn;

#[derive(Debug)]
pub(super) struct WaiterEntry {
    pub id: u64,
    pub tx: oneshot::Sender<Box<ServerConn>>,
    pub since: Instant,
    /// The end of this waiter's budget: past it, a server is no use to it.
    pub deadline: Instant,
}

#[derive(Debug)]
pub(super) struct State {
    pub opts: PoolOptions,
    /// Boxed on purpose: a connection leaves this stack for a lease, a
    /// waiter's channel or recovery, and a pointer moves where the struct
    /// would be copied.
    #[allow(clippy::vec_box)]
    pub idle: Vec<Box<ServerConn>>,
    pub waiters: VecDeque<WaiterEntry>,
    next_waiter: u64,
    /// Lent to clients.
    pub active: u32,
    /// Connects in flight.
    pub connecting: u32,
    /// Being cleaned up after a client left them dirty.
    pub recovering: u32,
    pub paused: bool,
    pub failures: u32,
    pub retry_at: Option<Instant>,
    /// When the connector's wake-up timer is set to fire (retry or reserve).
    pub wake_at: Option<Instant>,
    pub last_error: Option<String>,
    /// The SQLSTATE a client sees for `last_error`.
    pub last_error_code: Option<crate::protocol::SqlState>,
    /// Woken whenever a connect fails (logins of a brand-new pool wait on it).
    pub connect_failed: std::sync::Arc<tokio::sync::Notify>,
    pub server_params: Option<ParamMap>,
}

/// Counters for SHOW POOLS and tests.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolSnapshot {
    pub idle: u32,
    pub active: u32,
    pub connecting: u32,
    pub recovering: u32,
    pub waiting: u32,
    pub maxwait: Duration,
    pub paused: bool,
    pub pool_size: u32,
}

impl State {
    pub fn new(opts: PoolOptions) -> Self {
        State {
            opts,
            idle: Vec::new(),
            waiters: VecDeque::new(),
            next_waiter: 0,
            active: 0,
            connecting: 0,
            recovering: 0,
            paused: false,
            failures: 0,
            retry_at: None,
            wake_at: None,
            last_error: None,
            last_error_code: None,
            connect_failed: Default::default(),
            server_params: None,
        }
    }

    pub fn push_waiter(&mut self, tx: oneshot::Sender<Box<ServerConn>>, deadline: Instant) -> u64 {
        self.next_waiter += 1;
        let id = self.next_waiter;
        self.waiters.push_back(WaiterEntry { id, tx, since: Instant::now(), deadline });
        id
    }

    /// Takes the oldest waiter that can still use a server: its client is
    /// there and its budget has not run out. Gone waiters met on the way are
    /// dropped; expired ones stay until their own timeout removes them (they
    /// answer their client with the wait-timeout error).
    pub fn next_waiter(&mut self) -> Option<WaiterEntry> {
        let now = Instant::now();
        self.waiters.retain(|w| !w.tx.is_closed());
        let i = self.waiters.iter().position(|w| w.deadline > now)?;
        self.waiters.remove(i)
    }

    pub fn remove_waiter(&mut self, id: u64) {
        if let Some(i) = self.waiters.iter().position(|w| w.id == id) {
            self.waiters.remove(i);
        }
    }

    /// Waiters whose clients are still there and whose budget has not run
    /// out (the others need no server).
    pub fn live_waiters(&self) -> usize {
        let now = Instant::now();
        self.waiters.iter().filter(|w| !w.tx.is_closed() && w.deadline > now).count()
    }

    /// All server connections the pool accounts for.
    pub fn total(&self) -> u32 {
        self.idle.len() as u32 + self.active + self.connecting + self.recovering
    }

    /// The size limit now: pool_size, plus the reserve once a waiter has
    /// waited longer than reserve_pool_timeout.
    pub fn limit(&self) -> u32 {
        let s = &self.opts.settings;
        let reserve_due = self.waiters.front().is_some_and(|w| w.since.elapsed() >= self.opts.reserve_pool_timeout);
        s.pool_size + if reserve_due { s.reserve_pool_size } else { 0 }
    }

    pub fn over_capacity(&self) -> bool {
        self.total() > self.opts.settings.pool_size + self.opts.settings.reserve_pool_size
    }

    /// Why an idle connection must not be lent out, if it must not.
    pub fn unusable(&self, conn: &mut ServerConn) -> Option<CloseReason> {
        if conn.has_unexpected_input() {
            return Some(CloseReason::ServerClosed);
        }
        if Instant::now() >= conn.retire_at {
            return Some(CloseReason::Lifetime);
        }
        None
    }

    pub fn maxwait(&self) -> Duration {
        self.waiters.front().map(|w| w.since.elapsed()).unwrap_or_default()
    }

    pub fn snapshot(&self) -> PoolSnapshot {
        PoolSnapshot {
            idle: self.idle.len() as u32,
            active: self.active,
            connecting: self.connecting,
            recovering: self.recovering,
            waiting: self.waiters.len() as u32,
            maxwait: self.maxwait(),
            paused: self.paused,
            pool_size: self.opts.settings.pool_size,
        }
    }
}
