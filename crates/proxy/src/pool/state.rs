//! The pool's mutable state behind its one mutex: idle stack, waiter queue,
//! counters and connect back-off. Short critical sections only; never awaited.
//!
//! Every server the pool holds is in exactly one place: the idle stack here,
//! one of the `Counts` (lent, connecting, recovering, a probe's or a
//! replication client's place) or the fleet's query, so that `total` is what
//! the pool holds. Servers leave and join the idle stack only through the
//! methods here, which count them where they go.

use std::collections::VecDeque;
use std::time::{Duration, Instant};

use tokio::sync::oneshot;
use weir_metrics::CloseReason;

use super::backoff::Backoff;
use super::counts::Counts;
use super::fleet::part::Fleet;
use super::queries::{Queries, QueryTag};
use super::retiring::Retiring;
use super::room::Room;
use super::snapshot::PoolSnapshot;
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
    /// The fingerprint of the transaction it waits to run (`queries`); 0:
    /// none (a login's wait), counted nowhere.
    pub fp: u64,
}

#[derive(Debug)]
pub(super) struct State {
    /// The pool's settings, replaced whole on a reload (`Pool::reconfigure`).
    pub opts: PoolOptions,
    /// Boxed on purpose: a connection leaves this stack for a lease, a
    /// waiter's channel or recovery, and a pointer moves where the struct
    /// would be copied.
    #[allow(clippy::vec_box)]
    idle: Vec<Box<ServerConn>>,
    waiters: VecDeque<WaiterEntry>,
    next_waiter: u64,
    /// When the pool's expiry (`expiry.rs`) is set to look for waiters past
    /// their deadline: never later than the earliest deadline queued (it may
    /// be earlier: a waiter served in time leaves it stale). None: no waiter.
    expiry_at: Option<Instant>,
    /// Wakes the expiry when a waiter's deadline comes before `expiry_at`.
    expiry: std::sync::Arc<tokio::sync::Notify>,
    /// The servers lent, opening, being cleaned up, or holding a place.
    counts: Counts,
    /// PAUSE (or SHUTDOWN WAIT_FOR_SERVERS): nothing is lent or opened.
    paused: bool,
    /// Failures, refusals and the wait before the next connect.
    backoff: Backoff,
    /// When the connector's wake-up timer is set to fire (retry or reserve).
    wake_at: Option<Instant>,
    /// A task is closing another pool's idle connection to make room
    /// under max_db_connections (`evict.rs`).
    evicting: bool,
    /// A place in the database's or user's count an eviction freed for
    /// this pool's next connect.
    room: Room,
    server_params: Option<std::sync::Arc<ParamMap>>,
    /// RECONNECT: connections opened before this close when released.
    reconnect_before: Option<Instant>,
    /// The pool's part in a fleet of weirs sharing one budget (`fleet`).
    fleet: Fleet,
    /// Hosts whose servers opened before a moment retire when released
    /// (`retire_host`, `retired`).
    retiring: Retiring,
    /// SHUTDOWN WAIT_FOR_SERVERS: no server is lent again.
    stopping: bool,
    /// The statements that queued, by fingerprint, and the fair hand-over's
    /// choice among them.
    queries: Queries,
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
            for w in self.waiters.drain(..) {
                self.queries.unqueued(w.fp);
            }
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
            counts: Counts::default(),
            paused: false,
            stopping: false,
            backoff: Backoff::default(),
            wake_at: None,
            evicting: false,
            room: Room::default(),
            server_params: None,
            reconnect_before: None,
            fleet: Default::default(),
            retiring: Retiring::default(),
            queries: Queries::default(),
        }
    }

    /// The idle servers, bottom (longest idle) first.
    pub(super) fn idle(&self) -> &[Box<ServerConn>] {
        &self.idle
    }

    /// The idle servers, to change in place (none comes or goes).
    pub(super) fn idle_mut(&mut self) -> &mut [Box<ServerConn>] {
        &mut self.idle
    }

    /// The servers lent, opening, being cleaned up, or holding a place.
    pub(super) fn counts(&self) -> Counts {
        self.counts
    }

    /// The counts, to move a server that is not idle from one to another.
    pub(super) fn counts_mut(&mut self) -> &mut Counts {
        &mut self.counts
    }

    /// The fast checkout at `now`: the top idle server, lent, unless the
    /// pool is paused, the server is due a server_check_query, or it is
    /// unusable (the slow path deals with those).
    pub(super) fn lend_idle(&mut self, now: Instant) -> Option<Box<ServerConn>> {
        // A server idle while clients wait is kept for another statement
        // (`Queries::held_back`): the slow path, which knows the request's
        // fingerprint, decides.
        if self.paused || !self.waiters.is_empty() {
            return None;
        }
        let top = self.idle.last()?;
        if self.check_due((top.created, top.last_used()), now) {
            return None;
        }
        if Self::unusable(self.idle.last_mut()?, now).is_some() {
            return None;
        }
        let conn = self.idle.pop()?;
        self.counts.lent();
        Some(conn)
    }

    /// Lends the top idle server at `now` (none while paused). An unusable
    /// one comes out uncounted, with why, for the caller to close (Err).
    #[allow(clippy::type_complexity)]
    pub(super) fn lend_top(&mut self, now: Instant) -> Option<Result<Box<ServerConn>, (Box<ServerConn>, CloseReason)>> {
        if self.paused {
            return None;
        }
        let mut conn = self.idle.pop()?;
        if let Some(reason) = Self::unusable(&mut conn, now) {
            return Some(Err((conn, reason)));
        }
        self.counts.lent();
        Some(Ok(conn))
    }

    /// The top idle server, for a hand-over at once (`Pool::hand_over`).
    pub(super) fn unpark(&mut self) -> Option<Box<ServerConn>> {
        self.idle.pop()
    }

    /// Keeps `conn` idle; gives it back (Some, to close) when the pool
    /// holds more than its capacity (a reload lowered it).
    pub(super) fn park(&mut self, conn: Box<ServerConn>) -> Option<Box<ServerConn>> {
        if self.over_capacity() {
            return Some(conn);
        }
        self.idle.push(conn);
        None
    }

    /// The longest-idle server, for another's use (an eviction, a probe's
    /// or a replication client's place).
    pub(super) fn take_longest_idle(&mut self) -> Option<Box<ServerConn>> {
        (!self.idle.is_empty()).then(|| self.idle.remove(0))
    }

    /// Every idle server, to close (KILL, shutdown, RECONNECT).
    #[allow(clippy::vec_box)]
    pub(super) fn take_all_idle(&mut self) -> Vec<Box<ServerConn>> {
        std::mem::take(&mut self.idle)
    }

    /// Takes out, bottom up, each idle server `doom` names a close reason
    /// for; `doom` is given the servers the pool holds at that moment.
    pub(super) fn take_idle_where(
        &mut self,
        mut doom: impl FnMut(&mut ServerConn, u32) -> Option<CloseReason>,
    ) -> Vec<(Box<ServerConn>, CloseReason)> {
        let mut doomed = Vec::new();
        let mut i = 0;
        while i < self.idle.len() {
            let total = self.total();
            match doom(&mut self.idle[i], total) {
                Some(reason) => doomed.push((self.idle.remove(i), reason)),
                None => i += 1,
            }
        }
        doomed
    }

    /// After a reload lowered pool_size or reserve_pool_size, the idle
    /// servers above the new capacity, longest idle first, to close.
    #[allow(clippy::vec_box)]
    pub(super) fn take_idle_over_capacity(&mut self) -> Vec<Box<ServerConn>> {
        let mut doomed = Vec::new();
        while self.over_capacity() && !self.idle.is_empty() {
            let oldest = (0..self.idle.len()).min_by_key(|&i| self.idle[i].last_used()).unwrap_or(0);
            doomed.push(self.idle.remove(oldest));
        }
        doomed
    }

    /// Idle servers, bottom up and sparing server `keep`, until the pool
    /// holds at most `limit` (the fleet's enforced share), to close.
    #[allow(clippy::vec_box)]
    pub(super) fn take_idle_above(&mut self, limit: u32, keep: Option<u64>) -> Vec<Box<ServerConn>> {
        let mut doomed = Vec::new();
        while self.total() > limit {
            let Some(i) = self.idle.iter().position(|c| Some(c.id) != keep) else { break };
            doomed.push(self.idle.remove(i));
        }
        doomed
    }

    /// The idle server for the fleet's query: `beacon` if idle, else (no
    /// beacon) the top one, counted as the fleet's from now. An unusable one
    /// comes out uncounted, to close (Err). None: none to take.
    #[allow(clippy::type_complexity)]
    pub(super) fn lend_to_fleet(
        &mut self,
        beacon: Option<u64>,
        now: Instant,
    ) -> Option<Result<Box<ServerConn>, Box<ServerConn>>> {
        let at = match beacon {
            Some(b) => self.idle.iter().position(|c| c.id == b),
            None => self.idle.len().checked_sub(1),
        }?;
        let mut conn = self.idle.remove(at);
        if Self::unusable(&mut conn, now).is_some() {
            return Some(Err(conn));
        }
        self.fleet.took_server();
        Some(Ok(conn))
    }

    /// PAUSE: nothing is lent or opened until `unpause`.
    pub(super) fn pause(&mut self) {
        self.paused = true;
    }

    /// RESUME (the caller serves the waiters from idle).
    pub(super) fn unpause(&mut self) {
        self.paused = false;
    }

    pub(super) fn is_paused(&self) -> bool {
        self.paused
    }

    /// The connect back-off: failures, refusals, the next try.
    pub(super) fn backoff(&self) -> &Backoff {
        &self.backoff
    }

    pub(super) fn backoff_mut(&mut self) -> &mut Backoff {
        &mut self.backoff
    }

    /// The place an eviction kept for this pool's next connect.
    pub(super) fn room_mut(&mut self) -> &mut Room {
        &mut self.room
    }

    /// The pool's part in its fleet.
    pub(super) fn fleet(&self) -> &Fleet {
        &self.fleet
    }

    pub(super) fn fleet_mut(&mut self) -> &mut Fleet {
        &mut self.fleet
    }

    /// Waiters queued (live or not).
    pub(super) fn waiting(&self) -> usize {
        self.waiters.len()
    }

    /// When the waiter queued longest came.
    pub(super) fn oldest_since(&self) -> Option<Instant> {
        self.waiters.front().map(|w| w.since)
    }

    /// Every waiter, taken out of the queue in order.
    pub(super) fn drain_waiters(&mut self) -> Vec<WaiterEntry> {
        let drained: Vec<WaiterEntry> = self.waiters.drain(..).collect();
        for w in &drained {
            self.queries.unqueued(w.fp);
        }
        drained
    }

    /// The deadline of the waiter queued last.
    pub(super) fn last_waiter_deadline(&self) -> Option<Instant> {
        self.waiters.back().map(|w| w.deadline)
    }

    /// Takes the waiter queued last out of the queue.
    pub(super) fn pop_last_waiter(&mut self) -> Option<WaiterEntry> {
        let w = self.waiters.pop_back()?;
        self.queries.unqueued(w.fp);
        Some(w)
    }

    /// When the expiry is set to look for waiters past their deadline.
    pub(super) fn expiry_at(&self) -> Option<Instant> {
        self.expiry_at
    }

    /// What wakes the expiry when a waiter's deadline comes before `expiry_at`.
    pub(super) fn expiry_wake(&self) -> std::sync::Arc<tokio::sync::Notify> {
        self.expiry.clone()
    }

    /// Tells every waiter whose deadline has passed by `now` that its wait
    /// is over (gone clients are dropped on the way), and sets the expiry to
    /// the earliest deadline left.
    pub(super) fn expire_waiters(&mut self, now: Instant) {
        let mut next: Option<Instant> = None;
        let mut i = 0;
        while i < self.waiters.len() {
            let w = &self.waiters[i];
            if w.deadline <= now || w.tx.is_closed() {
                if let Some(w) = self.take_waiter(i) {
                    let _ = w.tx.send(super::Handed::Expired);
                }
                continue;
            }
            next = Some(next.map_or(w.deadline, |n| n.min(w.deadline)));
            i += 1;
        }
        self.expiry_at = next;
    }

    /// Marks an eviction for this pool under way; false if one already is.
    pub(super) fn begin_eviction(&mut self) -> bool {
        !std::mem::replace(&mut self.evicting, true)
    }

    /// The eviction under way ended.
    pub(super) fn end_eviction(&mut self) {
        self.evicting = false;
    }

    /// RECONNECT at `at`: connections opened before it close when released.
    pub(super) fn mark_reconnect(&mut self, at: Instant) {
        self.reconnect_before = Some(at);
    }

    /// When the last RECONNECT marked the pool's connections, if one did.
    pub(super) fn reconnect_mark(&self) -> Option<Instant> {
        self.reconnect_before
    }

    /// A connection opened at `created` is older than the last RECONNECT.
    pub(super) fn opened_before_reconnect(&self, created: Instant) -> bool {
        self.reconnect_before.is_some_and(|t| created < t)
    }

    /// Sets the connector's wake-up for `at`, unless one at or before it is
    /// still to come (then false: nothing to set).
    pub(super) fn set_wake(&mut self, at: Instant, now: Instant) -> bool {
        if self.wake_at.is_some_and(|w| w <= at && w > now) {
            return false;
        }
        self.wake_at = Some(at);
        true
    }

    /// The wake-up set for `at` has fired (a later one may have replaced it).
    pub(super) fn woke(&mut self, at: Instant) {
        if self.wake_at == Some(at) {
            self.wake_at = None;
        }
    }

    /// The server's reported parameters, once a connection has logged in.
    pub(super) fn server_params(&self) -> Option<std::sync::Arc<ParamMap>> {
        self.server_params.clone()
    }

    /// The server's reported parameters, keeping `params()` if none are kept
    /// yet (the first server to log in sets them).
    pub(super) fn keep_server_params(
        &mut self,
        params: impl FnOnce() -> std::sync::Arc<ParamMap>,
    ) -> std::sync::Arc<ParamMap> {
        self.server_params.get_or_insert_with(params).clone()
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
        let rule = self.retiring.add(host, reason, now, self.opts.lifetime);
        let (doomed, kept) = std::mem::take(&mut self.idle).into_iter().partition(|c| rule.applies(c));
        self.idle = kept;
        doomed
    }

    /// Why a released server must close instead of going back, if a host
    /// rule says so. Nothing to look at (one length check) unless a host's
    /// role changed or its name moved within server_lifetime.
    pub(super) fn retired(&self, conn: &ServerConn) -> Option<CloseReason> {
        self.retiring.reason_for(conn)
    }

    pub(super) fn push_waiter(
        &mut self,
        tx: oneshot::Sender<super::Handed>,
        since: Instant,
        deadline: Instant,
        counted: super::admission::Counted,
        query: Option<&QueryTag>,
    ) -> u64 {
        self.next_waiter += 1;
        let id = self.next_waiter;
        if let Some(tag) = query {
            self.queries.queued(tag, since);
        }
        let fp = query.map_or(0, |t| t.fp);
        self.waiters.push_back(WaiterEntry { id, tx, since, deadline, _counted: counted, fp });
        // Deadlines mostly grow with the queue: the expiry is woken only when
        // the queue was empty, or a waiter has a shorter budget than those
        // ahead of it.
        if self.expiry_at.is_none_or(|at| deadline < at) {
            self.expiry_at = Some(deadline);
            self.expiry.notify_one();
        }
        id
    }

    /// Takes the waiter a freed server goes to: the oldest that can still
    /// use a server (its client is there and its budget has not run out)
    /// among those of the fingerprints `Queries::preferred` names, when
    /// more than one fingerprint waits; else the oldest usable one. Gone
    /// waiters met on the way are dropped; expired ones stay until their
    /// own timeout removes them (they answer their client with the
    /// wait-timeout error). With one fingerprint waiting it looks only as
    /// far as the first usable waiter, almost always the front one: a
    /// hand-over costs O(1) however long the queue (1,000 clients on a pool
    /// of 20 keep about 980 waiting).
    pub(super) fn next_waiter(&mut self, now: Instant) -> Option<WaiterEntry> {
        if self.waiters.is_empty() {
            return None;
        }
        let cap = fingerprint_cap(&self.opts);
        let preferred = self.queries.preferred(cap);
        let mut first_usable = None;
        let mut i = 0;
        while i < self.waiters.len() {
            let w = &self.waiters[i];
            if w.tx.is_closed() {
                self.take_waiter(i);
                continue;
            }
            if w.deadline > now {
                match &preferred {
                    Some(fps) if !fps.contains(&w.fp) => {
                        first_usable.get_or_insert(i);
                    }
                    None if self.queries.held_back(w.fp, cap, now) => return None,
                    _ => return self.take_waiter(i),
                }
            }
            i += 1;
        }
        first_usable.and_then(|i| self.take_waiter(i))
    }

    /// A request of `tag`'s fingerprint may take an idle server at `now`
    /// (it asked while clients wait, or none is idle): not while its
    /// fingerprint is held back for another (`Queries::held_back`).
    pub(super) fn may_lend_to(&mut self, tag: Option<&QueryTag>, now: Instant) -> bool {
        let Some(tag) = tag.filter(|_| !self.idle.is_empty()) else { return true };
        self.queries.seen(tag, now);
        !self.queries.held_back(tag.fp, fingerprint_cap(&self.opts), now)
    }

    /// Takes the waiter at `i` out of the queue.
    fn take_waiter(&mut self, i: usize) -> Option<WaiterEntry> {
        let w = self.waiters.remove(i)?;
        self.queries.unqueued(w.fp);
        Some(w)
    }

    /// The statements that queued, by fingerprint.
    pub(super) fn queries(&self) -> &Queries {
        &self.queries
    }

    pub(super) fn queries_mut(&mut self) -> &mut Queries {
        &mut self.queries
    }

    /// Ids only grow and the queue keeps their order: a binary search.
    pub(super) fn remove_waiter(&mut self, id: u64) {
        if let Ok(i) = self.waiters.binary_search_by_key(&id, |w| w.id) {
            self.take_waiter(i);
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
        let spare = self.idle.len() as u32 + self.counts.connecting();
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
        let message = self.backoff.login_refused()?;
        let no_server = self.idle.is_empty() && self.counts.active() == 0 && self.counts.recovering() == 0;
        no_server.then(|| message.to_owned())
    }

    /// All server connections the pool accounts for.
    pub(super) fn total(&self) -> u32 {
        self.idle.len() as u32 + self.counts.sum() + self.fleet.busy()
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
        if now >= conn.retire_at() {
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
            active: self.counts.active(),
            connecting: self.counts.connecting(),
            recovering: self.counts.recovering() + self.fleet.busy(),
            waiting: self.waiters.len() as u32,
            maxwait: self.maxwait(),
            paused: self.paused,
            pool_size: self.opts.settings.pool_size,
            predicted_wait: Duration::ZERO,
            replication: self.counts.replicating(),
        }
    }
}

/// The most servers one fingerprint may hold while others are active
/// (`opts`' max_fingerprint_share of its pool_size, at least one), when
/// asked.
fn fingerprint_cap(opts: &PoolOptions) -> impl Fn() -> u32 + Copy {
    let (size, share) = (opts.settings.pool_size, opts.fingerprint_share);
    move || ((f64::from(size) * share).ceil() as u32).max(1)
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
mod tests;
