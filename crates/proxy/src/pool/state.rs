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
    pub tx: oneshot::Sender<super::Handed>,
    pub since: Instant,
    /// The end of this waiter's budget: past it, a server is no use to it.
    pub deadline: Instant,
    /// Its place in `max_waiting_clients_total`, given up with the entry.
    _counted: super::admission::Counted,
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
    /// When the pool's expiry (`expiry.rs`) is set to look for waiters past
    /// their deadline: never later than the earliest deadline queued (it may
    /// be earlier: a waiter served in time leaves it stale). None: no waiter.
    pub expiry_at: Option<Instant>,
    /// Wakes the expiry when a waiter's deadline comes before `expiry_at`.
    pub expiry: std::sync::Arc<tokio::sync::Notify>,
    /// Lent to clients.
    pub active: u32,
    /// Connects in flight.
    pub connecting: u32,
    /// Being cleaned up after a client left them dirty.
    pub recovering: u32,
    /// Liveness probe sessions holding a place of the pool (`places.rs`).
    pub probing: u32,
    pub paused: bool,
    pub failures: u32,
    /// Connects refused in a row with 53300 (too many connections): while
    /// non-zero the pool backs off and probes one connect at a time, and
    /// its waiters keep waiting (`connector::refused`).
    pub refusals: u32,
    pub retry_at: Option<Instant>,
    /// When the connector's wake-up timer is set to fire (retry or reserve).
    pub wake_at: Option<Instant>,
    /// A task is closing another pool's idle connection to make room
    /// under max_db_connections (`evict.rs`).
    pub evicting: bool,
    /// A place in the database's or user's count an eviction freed for
    /// this pool's next connect.
    pub room: super::evict::Room,
    pub last_error: Option<String>,
    /// Postgres's message for the pool's last login, when Postgres refused
    /// it (cleared by the next server that logs in).
    pub rejected: Option<String>,
    pub server_params: Option<std::sync::Arc<ParamMap>>,
    /// RECONNECT: connections opened before this close when released.
    pub reconnect_before: Option<Instant>,
    /// The pool's part in a fleet of weirs sharing one budget (`fleet`).
    pub fleet: super::fleet::Fleet,
    /// Hosts whose servers opened before a moment retire when released
    /// (`retire_host`, `retired`).
    retiring: Vec<Retiring>,
    /// Places replication clients hold (`replication.rs`): each is a server
    /// connection of its client's alone, never lent, counted in `total`.
    replicating: u32,
    /// SHUTDOWN WAIT_FOR_SERVERS: no server is lent again.
    stopping: bool,
}

/// The servers of one host opened before `before` retire with `reason`.
#[derive(Debug)]
struct Retiring {
    host: super::HostKey,
    before: Instant,
    reason: CloseReason,
}

impl Retiring {
    fn applies(&self, conn: &ServerConn) -> bool {
        let spec = &conn.spec;
        let same_host = match &self.host {
            super::HostKey::Addr(a) => spec.addr == Some(*a),
            super::HostKey::Named(h, p) => spec.addr.is_none() && spec.host == *h && spec.port == *p,
        };
        same_host && conn.created < self.before
    }
}

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

impl State {
    /// Lends no server from now on (SHUTDOWN WAIT_FOR_SERVERS): the pool
    /// is paused for good; its waiters are let go by the next upkeep
    /// (`let_waiters_go`), as PgBouncer's janitor lets them go.
    pub(super) fn stop_lending(&mut self) {
        self.paused = true;
        self.stopping = true;
    }

    /// A pool that stopped lending lets its waiters go (they learn why
    /// from `is_stopping`).
    pub(super) fn let_waiters_go(&mut self) {
        if self.stopping {
            self.waiters.clear();
        }
    }

    pub(super) fn is_stopping(&self) -> bool {
        self.stopping
    }

    pub(super) fn new(opts: PoolOptions) -> Self {
        State {
            opts,
            idle: Vec::new(),
            waiters: VecDeque::new(),
            next_waiter: 0,
            expiry_at: None,
            expiry: Default::default(),
            active: 0,
            connecting: 0,
            recovering: 0,
            probing: 0,
            paused: false,
            stopping: false,
            failures: 0,
            refusals: 0,
            retry_at: None,
            wake_at: None,
            evicting: false,
            room: Default::default(),
            last_error: None,
            rejected: None,
            server_params: None,
            reconnect_before: None,
            fleet: Default::default(),
            retiring: Vec::new(),
            replicating: 0,
        }
    }

    /// The servers of `host` open now retire with `reason`: the idle ones
    /// are returned (to close now), lent ones close when released. Rules
    /// older than server_lifetime go (their servers have retired anyway).
    /// Boxed as in `idle`.
    #[allow(clippy::vec_box)]
    pub(super) fn retire_host(
        &mut self,
        host: &super::HostKey,
        reason: CloseReason,
        now: Instant,
    ) -> Vec<Box<ServerConn>> {
        let lifetime = self.opts.lifetime;
        self.retiring.retain(|r| now.saturating_duration_since(r.before) < lifetime && r.host != *host);
        let rule = Retiring { host: host.clone(), before: now, reason };
        let (doomed, kept) = std::mem::take(&mut self.idle).into_iter().partition(|c| rule.applies(c));
        self.idle = kept;
        self.retiring.push(rule);
        doomed
    }

    /// Why a released server must close instead of going back, if a host
    /// rule says so. Nothing to look at (one length check) unless a host's
    /// role changed or its name moved within server_lifetime.
    pub(super) fn retired(&self, conn: &ServerConn) -> Option<CloseReason> {
        if self.retiring.is_empty() {
            return None;
        }
        self.retiring.iter().find(|r| r.applies(conn)).map(|r| r.reason)
    }

    /// A replication client took a place of the pool.
    pub(super) fn replication_started(&mut self) {
        self.replicating += 1;
    }

    /// A replication client gave its place back.
    pub(super) fn replication_ended(&mut self) {
        self.replicating -= 1;
    }

    pub(super) fn push_waiter(
        &mut self,
        tx: oneshot::Sender<super::Handed>,
        since: Instant,
        deadline: Instant,
        counted: super::admission::Counted,
    ) -> u64 {
        self.next_waiter += 1;
        let id = self.next_waiter;
        self.waiters.push_back(WaiterEntry { id, tx, since, deadline, _counted: counted });
        // Deadlines mostly grow with the queue: the expiry is woken only when
        // the queue was empty, or a waiter has a shorter budget than those
        // ahead of it.
        if self.expiry_at.is_none_or(|at| deadline < at) {
            self.expiry_at = Some(deadline);
            self.expiry.notify_one();
        }
        id
    }

    /// Takes the oldest waiter that can still use a server: its client is
    /// there and its budget has not run out. Gone waiters met on the way are
    /// dropped; expired ones stay until their own timeout removes them (they
    /// answer their client with the wait-timeout error). Looks only as far
    /// as the first usable waiter, which is almost always the front one: a
    /// hand-over costs O(1) however long the queue (1,000 clients on a pool
    /// of 20 keep about 980 waiting).
    pub(super) fn next_waiter(&mut self, now: Instant) -> Option<WaiterEntry> {
        let mut i = 0;
        while i < self.waiters.len() {
            let w = &self.waiters[i];
            if w.tx.is_closed() {
                self.waiters.remove(i);
            } else if w.deadline > now {
                return self.waiters.remove(i);
            } else {
                i += 1;
            }
        }
        None
    }

    /// Ids only grow and the queue keeps their order: a binary search.
    pub(super) fn remove_waiter(&mut self, id: u64) {
        if let Ok(i) = self.waiters.binary_search_by_key(&id, |w| w.id) {
            self.waiters.remove(i);
        }
    }

    /// Waiters whose clients are still there and whose budget has not run
    /// out (the others need no server), counted up to `cap`: callers need
    /// to know only whether demand exceeds what the pool could open.
    pub(super) fn live_waiters_up_to(&self, cap: usize) -> usize {
        let now = Instant::now();
        self.waiters.iter().filter(|w| !w.tx.is_closed() && w.deadline > now).take(cap).count()
    }

    /// Connects demand calls for: the live waiters not covered by idle or
    /// connecting servers, or the shortfall below min_pool_size (capped by
    /// pool_size, as PgBouncer caps it), whichever is larger. None while
    /// paused (PAUSE, KILL, drain open nothing, as PgBouncer's).
    pub(super) fn unmet_demand(&self) -> u32 {
        if self.paused {
            return 0;
        }
        let spare = self.idle.len() as u32 + self.connecting;
        // More waiters than spare + the pool's limit change nothing.
        let waiting = self.live_waiters_up_to((spare + self.limit() + 1) as usize) as u32;
        let min = self.opts.settings.min_pool_size.min(self.opts.settings.pool_size);
        waiting.saturating_sub(spare).max(min.saturating_sub(self.total()))
    }

    /// PgBouncer's check_fast_fail: while the pool waits out
    /// server_login_retry after Postgres refused its login, and holds no
    /// server, a client that would queue is failed at once with the cached
    /// error instead.
    /// No clock reading unless a login was refused.
    pub(super) fn login_failing(&self) -> Option<String> {
        let message = self.rejected.as_ref()?;
        let no_server = self.idle.is_empty() && self.active == 0 && self.recovering == 0;
        let waiting_retry = self.retry_at.is_some_and(|at| at > Instant::now());
        (no_server && waiting_retry).then(|| message.clone())
    }

    /// All server connections the pool accounts for.
    pub(super) fn total(&self) -> u32 {
        self.idle.len() as u32
            + self.active
            + self.connecting
            + self.recovering
            + self.probing
            + self.fleet.busy
            + self.replicating
    }

    /// The size limit now: pool_size, plus the reserve once a waiter has
    /// waited longer than reserve_pool_timeout.
    pub(super) fn limit(&self) -> u32 {
        let s = &self.opts.settings;
        let reserve_due = self.waiters.front().is_some_and(|w| w.since.elapsed() >= self.opts.reserve_pool_timeout);
        s.pool_size + if reserve_due { s.reserve_pool_size } else { 0 }
    }

    /// The most servers the pool may hold at once (pool and reserve).
    pub(super) fn capacity(&self) -> u32 {
        self.opts.settings.pool_size + self.opts.settings.reserve_pool_size
    }

    /// Every server the pool may open is open or opening, and none is idle:
    /// a new waiter must wait for a transaction to end.
    pub(super) fn saturated(&self) -> bool {
        !self.paused && self.idle.is_empty() && self.total() >= self.capacity()
    }

    pub(super) fn over_capacity(&self) -> bool {
        self.total() > self.opts.settings.pool_size + self.opts.settings.reserve_pool_size
    }

    /// server_check_query is due for a connection last used at `last_used`
    /// and opened at `created`: one never lent yet has just logged in and is
    /// not checked (PgBouncer's).
    pub(super) fn check_due(&self, (created, last_used): (Instant, Instant), now: Instant) -> bool {
        last_used != created && now.saturating_duration_since(last_used) >= self.opts.check_delay
    }

    /// Why an idle connection must not be lent out, if it must not.
    pub(super) fn unusable(conn: &mut ServerConn, now: Instant) -> Option<CloseReason> {
        if conn.has_unexpected_input() {
            return Some(CloseReason::ServerClosed);
        }
        if now >= conn.retire_at {
            return Some(CloseReason::Lifetime);
        }
        None
    }

    pub(super) fn maxwait(&self) -> Duration {
        self.waiters.front().map(|w| w.since.elapsed()).unwrap_or_default()
    }

    pub(super) fn snapshot(&self) -> PoolSnapshot {
        PoolSnapshot {
            idle: self.idle.len() as u32,
            active: self.active,
            connecting: self.connecting,
            recovering: self.recovering + self.fleet.busy,
            waiting: self.waiters.len() as u32,
            maxwait: self.maxwait(),
            paused: self.paused,
            pool_size: self.opts.settings.pool_size,
            predicted_wait: Duration::ZERO,
            replication: self.replicating,
        }
    }
}

/// A pool's state for unit tests: database `app` with the keys `db_keys`
/// (TOML lines of its `[databases.app]` table), user `u`, trust auth.
#[cfg(test)]
pub(super) fn test_state(db_keys: &str) -> State {
    let toml = format!("[weir]\nauth_type = \"trust\"\n[databases.app]\n{db_keys}");
    let cfg = crate::config::Config::from_toml(&toml, std::path::Path::new(".")).unwrap();
    let key = super::PoolKey { database: "app".into(), user: "u".into() };
    State::new(PoolOptions::from_config(&cfg, &key, crate::auth::Credentials::None).unwrap())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state() -> State {
        test_state("")
    }

    #[test]
    fn the_queue_is_served_in_order_skipping_gone_and_expired_waiters() {
        let mut st = state();
        let now = Instant::now();
        let later = now + Duration::from_secs(60);
        let mut rxs = Vec::new();
        let count = std::sync::Arc::new(super::super::QueueCount::default());
        let mut push = |st: &mut State, deadline| {
            let (tx, rx) = oneshot::channel();
            rxs.push(rx);
            st.push_waiter(tx, now, deadline, count.join(0).unwrap())
        };
        let gone = push(&mut st, later);
        let expired = push(&mut st, now);
        let first_live = push(&mut st, later);
        let removed = push(&mut st, later);
        let second_live = push(&mut st, later);
        rxs[(gone - 1) as usize].close();
        st.remove_waiter(removed);
        assert_eq!(st.live_waiters_up_to(10), 2);
        assert_eq!(st.live_waiters_up_to(1), 1, "counting stops at the cap");
        assert_eq!(st.next_waiter(now).map(|w| w.id), Some(first_live));
        assert_eq!(st.next_waiter(now).map(|w| w.id), Some(second_live));
        assert!(st.next_waiter(now).is_none());
        let left: Vec<u64> = st.waiters.iter().map(|w| w.id).collect();
        assert_eq!(left, vec![expired], "the expired waiter stays for its own timeout to answer; the gone one went");
    }

    #[test]
    fn server_check_query_is_due_only_for_a_connection_lent_before() {
        let st = state();
        let opened = Instant::now();
        let later = opened + st.opts.check_delay + Duration::from_secs(1);
        assert!(!st.check_due((opened, opened), later), "a fresh login is not checked");
        assert!(st.check_due((opened, opened + Duration::from_millis(1)), later), "a returned one is");
    }

    #[test]
    fn a_pool_that_stopped_lending_lets_its_waiters_go_at_upkeep() {
        let mut st = state();
        let now = Instant::now();
        let count = std::sync::Arc::new(super::super::QueueCount::default());
        let (tx, _rx) = oneshot::channel();
        st.push_waiter(tx, now, now + Duration::from_secs(60), count.join(0).unwrap());
        st.let_waiters_go();
        assert_eq!(st.live_waiters_up_to(10), 1, "a lending pool keeps its queue");
        st.stop_lending();
        assert_eq!(st.live_waiters_up_to(10), 1, "kept until the next upkeep");
        st.let_waiters_go();
        assert_eq!(st.live_waiters_up_to(10), 0);
        assert!(st.is_stopping());
    }

    #[test]
    fn a_server_running_the_fleet_query_is_counted_as_tested() {
        let mut st = state();
        st.recovering = 1;
        st.fleet.busy = 1;
        let s = st.snapshot();
        assert_eq!(s.recovering, 2, "the fleet query's server is held, not gone");
        assert_eq!(st.total(), 2);
        assert!(!s.is_unused());
    }
}
