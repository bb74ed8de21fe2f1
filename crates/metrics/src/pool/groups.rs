//! The parts of a [`PoolMetrics`](super::PoolMetrics), one for each thing
//! its numbers describe: the server connections, the clients, the waits for
//! a server and weir's prepared statements. Plain atomics; the methods that
//! count into them and read them back are `record`, `read` and `live`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicI64, AtomicU64};

use parking_lot::Mutex;

use super::live::ServerInfo;
use super::{zeroed, zeroed_i};
use crate::close::{CloseReason, ConnectFailure, ConnectRefusal, DropReason};
use crate::hist::Histogram;
use crate::rate::RateWindow;
use crate::state::{ClientState, ServerState};

/// Server connections: opens and closes (with reasons, and their rates),
/// connects that failed or that Postgres refused, how long connects took,
/// the servers in each state and those waiting for a cancel, the bytes
/// exchanged with them while clients held them, and the open ones that
/// `SHOW SERVERS` lists.
pub(super) struct Servers {
    pub(super) opened: AtomicU64,
    pub(super) closed: [AtomicU64; CloseReason::COUNT],
    pub(super) connect_failures: [AtomicU64; ConnectFailure::COUNT],
    pub(super) connect_refusals: [AtomicU64; ConnectRefusal::COUNT],
    pub(super) opens: RateWindow,
    pub(super) closes: RateWindow,
    pub(super) connect_duration: Histogram,
    pub(super) states: [AtomicI64; ServerState::COUNT],
    /// Servers waiting, after their client let go, for a cancel sent to
    /// them to be answered (SHOW POOLS' sv_being_canceled).
    pub(super) being_canceled: AtomicI64,
    pub(super) bytes_received: AtomicU64,
    pub(super) bytes_sent: AtomicU64,
    pub(super) live: Mutex<BTreeMap<u64, ServerInfo>>,
    pub(super) next_live: AtomicU64,
}

/// Clients: those in each state, their transactions and queries (counts,
/// time, durations), the bytes they sent and were sent, their queries
/// dropped (with reasons), sessions pinned, pipelines found stalled, and
/// session settings that could not be followed.
pub(super) struct Clients {
    pub(super) states: [AtomicI64; ClientState::COUNT],
    pub(super) transactions: AtomicU64,
    pub(super) xact_time_us: AtomicU64,
    pub(super) transaction_duration: Histogram,
    pub(super) queries: AtomicU64,
    pub(super) query_time_us: AtomicU64,
    pub(super) bytes_received: AtomicU64,
    pub(super) bytes_sent: AtomicU64,
    pub(super) dropped: [AtomicU64; DropReason::COUNT],
    pub(super) pinned: AtomicU64,
    pub(super) stalled: AtomicU64,
    pub(super) settings_unfollowed: AtomicU64,
}

/// Waits for a server: the assignments and their total wait, how long each
/// took, and how long the oldest waiting client has waited and a client
/// queued now would wait.
pub(super) struct Waits {
    pub(super) assignments: AtomicU64,
    pub(super) total_us: AtomicU64,
    pub(super) durations: Histogram,
    pub(super) oldest_us: AtomicU64,
    pub(super) predicted_us: AtomicU64,
}

/// weir's prepared statements: Parses from clients and to servers, clients'
/// Binds of named statements, unnamed Parses answered from a statement the
/// server had or prepared as weir's own, statements closed to stay within a
/// server's cache, and the generation of the pool's shared statements.
pub(super) struct Statements {
    pub(super) client_parses: AtomicU64,
    pub(super) server_parses: AtomicU64,
    /// Binds of clients' named prepared statements.
    pub(super) binds: AtomicU64,
    pub(super) unnamed_hits: AtomicU64,
    pub(super) unnamed_prepares: AtomicU64,
    pub(super) evictions: AtomicU64,
    /// Bumped whenever weir's shared prepared statements may be stale (DDL,
    /// or a server error meaning one is): each server connection re-prepares
    /// its statements on first use after a change.
    pub(super) epoch: AtomicU64,
}

impl Servers {
    pub(super) fn new() -> Self {
        Servers {
            opened: AtomicU64::new(0),
            closed: zeroed(),
            connect_failures: zeroed(),
            connect_refusals: zeroed(),
            opens: RateWindow::new(),
            closes: RateWindow::new(),
            connect_duration: Histogram::default(),
            states: zeroed_i(),
            being_canceled: AtomicI64::new(0),
            bytes_received: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            live: Mutex::new(BTreeMap::new()),
            next_live: AtomicU64::new(1),
        }
    }
}

impl Clients {
    pub(super) fn new() -> Self {
        Clients {
            states: zeroed_i(),
            transactions: AtomicU64::new(0),
            xact_time_us: AtomicU64::new(0),
            transaction_duration: Histogram::default(),
            queries: AtomicU64::new(0),
            query_time_us: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            dropped: zeroed(),
            pinned: AtomicU64::new(0),
            stalled: AtomicU64::new(0),
            settings_unfollowed: AtomicU64::new(0),
        }
    }
}

impl Waits {
    pub(super) fn new() -> Self {
        Waits {
            assignments: AtomicU64::new(0),
            total_us: AtomicU64::new(0),
            durations: Histogram::default(),
            oldest_us: AtomicU64::new(0),
            predicted_us: AtomicU64::new(0),
        }
    }
}

impl Statements {
    pub(super) fn new() -> Self {
        Statements {
            client_parses: AtomicU64::new(0),
            server_parses: AtomicU64::new(0),
            binds: AtomicU64::new(0),
            unnamed_hits: AtomicU64::new(0),
            unnamed_prepares: AtomicU64::new(0),
            evictions: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
        }
    }
}
