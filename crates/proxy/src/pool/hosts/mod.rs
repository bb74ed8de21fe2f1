//! A database's hosts (`HostSet`), shared by the pools of every user of the
//! database: the hosts in the configured order (a name counts once per
//! address it resolves to), each with its role (primary, read-only,
//! standby, unreachable, unknown) and when that was learned. The connector
//! asks the set which host to dial (`pick`, per connect, never per query);
//! what a login or a probe finds is told back (`learned`).
//!
//! When no host is known to match the database's `target_session_attrs`
//! (at the start, or after the matching one failed), the set searches:
//! one task probes every host at once, again and again with back-off
//! (`search.rs`), until one matches; the pools' connects wait for it within
//! `server_connect_timeout`, their clients within their own budgets.
//!
//! A role change is logged. A host that stops matching has its servers
//! retired (idle ones closed now, lent ones when released) and, when
//! another host takes its place (a failover) or it answers in another role,
//! the servers still lent to it are cut (`server::tether`): a transaction
//! in flight there gets its error at once. A failover is counted with the
//! time from the first failed connect to the first matching server.
//!
//! A set of one host with `target_session_attrs = any` never searches: its
//! pools dial the host and back off on their own, as they always have.

mod choose;
mod connect;
mod names;
mod search;

use std::net::SocketAddr;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use tokio::sync::Notify;
use weir_metrics::{CloseReason, HostRole, HostSetMetrics};

use super::Pool;
use crate::config::{HostPort, LoadBalanceHosts, TargetSessionAttrs};
use crate::server::role::matches;
use crate::server::tether::Tethers;
use crate::server::ConnectSpec;

pub(super) use connect::connect;

/// Which host: its address, or (a Unix socket, a name that did not
/// resolve) its configured text and port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum HostKey {
    Addr(SocketAddr),
    Named(String, u16),
}

impl HostKey {
    /// The host a connection opened with `spec` went to.
    pub(crate) fn of(spec: &ConnectSpec) -> HostKey {
        match spec.addr {
            Some(a) => HostKey::Addr(a),
            None => HostKey::Named(spec.host.clone(), spec.port),
        }
    }
}

impl std::fmt::Display for HostKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            HostKey::Addr(a) => write!(f, "{a}"),
            HostKey::Named(h, p) => write!(f, "{h}:{p}"),
        }
    }
}

/// What a set is configured with (from the pool's options).
#[derive(Debug, Clone, PartialEq)]
pub struct HostsConfig {
    pub hosts: Vec<HostPort>,
    pub load_balance: LoadBalanceHosts,
    pub target: TargetSessionAttrs,
    pub dns_max_ttl: Duration,
    /// server_connect_timeout: bounds each probe and each look-up.
    pub connect_timeout: Duration,
    /// server_login_retry: the search's slowest pace.
    pub retry_max: Duration,
}

/// One host as SHOW and the metrics present it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostView {
    pub host: HostKey,
    pub role: HostRole,
    /// How long ago the role was learned (None: never).
    pub learned_ago: Option<Duration>,
    /// The role matches target_session_attrs.
    pub matches: bool,
}

#[derive(Debug)]
struct Host {
    key: HostKey,
    /// The configured host it came from (its name is the TLS server name).
    name: String,
    port: u16,
    addr: Option<SocketAddr>,
    role: HostRole,
    learned: Option<Instant>,
    last_error: Option<String>,
    /// It matched, then a server of it answered as another role: unknown
    /// until a login tells, and its servers retired if it no longer matches.
    doubted: bool,
    tethers: Arc<Tethers>,
}

impl Host {
    fn new(name: &str, port: u16, addr: Option<SocketAddr>) -> Host {
        let key = match addr {
            Some(a) => HostKey::Addr(a),
            None => HostKey::Named(name.to_owned(), port),
        };
        Host {
            key,
            name: name.to_owned(),
            port,
            addr,
            role: HostRole::Unknown,
            learned: None,
            last_error: None,
            doubted: false,
            tethers: Default::default(),
        }
    }
}

/// The host a connect is to dial.
#[derive(Debug, Clone)]
pub(super) struct Target {
    pub key: HostKey,
    pub host: String,
    pub port: u16,
    pub addr: Option<SocketAddr>,
    pub tethers: Arc<Tethers>,
}

/// What to dial now.
#[derive(Debug)]
pub(super) enum Pick {
    Dial(Target),
    /// No host is known to match: wait for the set's search.
    Search,
    /// The set's one host was tried (a lone host with target `any` is not
    /// searched for: its pool backs off).
    Done,
}

/// What a connect or a probe found out about a host.
#[derive(Debug, Clone)]
pub(super) enum Outcome {
    Role(HostRole),
    /// It could not be reached (or is starting up, shutting down).
    Unreachable(String),
    /// It answered but told no role (a refused login, a failed query).
    Answered(String),
}

/// The first failed connect to the matching host, while none matches.
#[derive(Debug, Clone)]
struct Outage {
    since: Instant,
    from: Option<HostKey>,
}

#[derive(Debug)]
struct SetState {
    cfg: HostsConfig,
    names: Vec<names::Name>,
    hosts: Vec<Host>,
    cursor: usize,
    search: search::Search,
    outage: Option<Outage>,
}

/// A database's hosts. Shared as `Arc<HostSet>` by its pools.
#[derive(Debug)]
pub struct HostSet {
    database: String,
    metrics: Arc<HostSetMetrics>,
    state: Mutex<SetState>,
    /// Woken when a host comes to match, or the search's login was refused.
    found: Notify,
    pools: Mutex<Vec<Weak<Pool>>>,
}

/// Done after the set's lock is released (they take pools' locks).
#[derive(Debug)]
enum Action {
    Retire(HostKey, CloseReason),
    Cut(Arc<Tethers>, HostKey),
    WakePools,
}

impl HostSet {
    pub(crate) fn new(database: &str, cfg: HostsConfig) -> Arc<HostSet> {
        let names = names::Name::for_hosts(&cfg.hosts);
        let mut st = SetState { cfg, names, hosts: Vec::new(), cursor: 0, search: Default::default(), outage: None };
        st.hosts = names::expand(&st.cfg.hosts, &st.names, Vec::new());
        let set = Arc::new(HostSet {
            database: database.to_owned(),
            metrics: HostSetMetrics::new(database),
            state: Mutex::new(st),
            found: Notify::new(),
            pools: Mutex::new(Vec::new()),
        });
        set.publish(&set.state.lock());
        set
    }

    /// A pool of this database uses the set (it is woken when a host matches).
    pub(super) fn join(&self, pool: &Arc<Pool>) {
        let mut pools = self.pools.lock();
        pools.retain(|p| p.strong_count() > 0);
        pools.push(Arc::downgrade(pool));
    }

    /// True while some pool still uses the set.
    pub(super) fn in_use(&self) -> bool {
        self.pools.lock().iter().any(|p| p.strong_count() > 0)
    }

    /// A reload: a changed host list keeps what is known of the hosts that
    /// stay and retires the servers of those that left.
    pub fn configure(&self, cfg: HostsConfig) {
        let mut actions = Vec::new();
        {
            let mut st = self.state.lock();
            if st.cfg == cfg {
                return;
            }
            let hosts_changed = st.cfg.hosts != cfg.hosts;
            st.cfg = cfg;
            if hosts_changed {
                st.names = names::Name::for_hosts(&st.cfg.hosts);
                let old = std::mem::take(&mut st.hosts);
                let (hosts, gone) = names::rebuild(&st.cfg.hosts, &st.names, old);
                st.hosts = hosts;
                actions.extend(gone.into_iter().map(|k| Action::Retire(k, CloseReason::HostGone)));
            }
            self.publish(&st);
        }
        self.act(actions);
    }

    /// The hosts and what is known of them, in order.
    pub fn view(&self) -> Vec<HostView> {
        let st = self.state.lock();
        let target = st.cfg.target;
        st.hosts
            .iter()
            .map(|h| HostView {
                host: h.key.clone(),
                role: h.role,
                learned_ago: h.learned.map(|t| t.elapsed()),
                matches: matches(h.role, target),
            })
            .collect()
    }

    pub fn metrics(&self) -> &Arc<HostSetMetrics> {
        &self.metrics
    }

    /// The target servers must match.
    pub(super) fn target(&self) -> TargetSessionAttrs {
        self.state.lock().cfg.target
    }

    /// The host a new connection should dial, skipping `tried`, or
    /// `Search` when none is known to match.
    pub(super) fn pick(&self, tried: &[HostKey]) -> Pick {
        let mut st = self.state.lock();
        let st = &mut *st;
        let choice = choose::choose(&st.hosts, st.cfg.target, st.cfg.load_balance, &mut st.cursor, tried);
        match choice {
            Some(i) => {
                let h = &st.hosts[i];
                Pick::Dial(Target {
                    key: h.key.clone(),
                    host: h.name.clone(),
                    port: h.port,
                    addr: h.addr,
                    tethers: h.tethers.clone(),
                })
            }
            None if st.hosts.len() == 1 && st.cfg.target == TargetSessionAttrs::Any => Pick::Done,
            None => Pick::Search,
        }
    }

    /// True when a connect now would find a host to dial.
    fn can_pick(st: &SetState) -> bool {
        let mut cursor = st.cursor;
        choose::choose(&st.hosts, st.cfg.target, st.cfg.load_balance, &mut cursor, &[]).is_some()
    }

    /// Records what a connect or probe found of host `key`.
    pub(super) fn learned(&self, key: &HostKey, outcome: Outcome) {
        let mut actions = Vec::new();
        {
            let mut st = self.state.lock();
            let Some(i) = st.hosts.iter().position(|h| h.key == *key) else { return };
            self.note(&mut st, i, outcome, &mut actions);
            self.publish(&st);
            if Self::can_pick(&st) {
                self.found.notify_waiters();
            }
        }
        self.act(actions);
    }

    /// A server of host `key` answered 25006 or reported a new
    /// in_hot_standby: its role is in doubt until a login tells it again.
    pub(super) fn doubt(&self, key: &HostKey) {
        let mut st = self.state.lock();
        let target = st.cfg.target;
        let Some(h) = st.hosts.iter_mut().find(|h| h.key == *key) else { return };
        if h.role == HostRole::Unknown {
            return;
        }
        tracing::info!(database = %self.database, host = %h.key, from = h.role.as_label(), target = target.as_str(),
            "host role in doubt: a server of it answered as another role; asking again");
        let was_matching = matches(h.role, target);
        h.role = HostRole::Unknown;
        h.learned = Some(Instant::now());
        if was_matching {
            // Its servers stay until a login tells the role: retired then
            // if it no longer matches (`note`).
            h.doubted = true;
            self.outage_starts(&mut st, key);
        }
        self.publish(&st);
    }

    /// One outcome applied to host `i`: its role, the log line of a change,
    /// the start or end of an outage, and what its servers must undergo.
    fn note(&self, st: &mut SetState, i: usize, outcome: Outcome, actions: &mut Vec<Action>) {
        let target = st.cfg.target;
        let now = Instant::now();
        let h = &mut st.hosts[i];
        let before = h.role;
        let (role, error) = match outcome {
            Outcome::Role(r) => (r, None),
            Outcome::Unreachable(e) => (HostRole::Unreachable, Some(e)),
            Outcome::Answered(e) => (if before == HostRole::Unreachable { HostRole::Unknown } else { before }, Some(e)),
        };
        h.learned = Some(now);
        h.last_error = error;
        // A role (or none: unreachable) settles a doubt (the role is then
        // unknown, so it changes); the host counts as matching before it.
        let doubted = role != HostRole::Unknown && std::mem::take(&mut h.doubted);
        if role == before {
            return;
        }
        h.role = role;
        let key = h.key.clone();
        match &h.last_error {
            Some(e) => {
                tracing::warn!(database = %self.database, host = %key, from = before.as_label(), to = role.as_label(),
                error = %e, "host role changed")
            }
            None => {
                tracing::info!(database = %self.database, host = %key, from = before.as_label(), to = role.as_label(),
                "host role changed")
            }
        }
        let (was, now_matches) = (matches(before, target) || doubted, matches(role, target));
        if was && !now_matches {
            // It answered in another role: what it still runs is not what
            // the clients asked for. (One that could not be reached keeps
            // its servers: a connect that timed out under load proves
            // nothing about them, and a dead one's end by themselves.)
            if role != HostRole::Unreachable {
                actions.push(Action::Retire(key.clone(), CloseReason::RoleChanged));
                actions.push(Action::Cut(h.tethers.clone(), key.clone()));
            }
            self.outage_starts(st, &key);
        }
        if now_matches && (!was || doubted) {
            let displaced = self.displace(st, &key, actions);
            self.outage_ends(st, &key, displaced, actions);
        }
    }

    /// Host `key` came to match a target only one server can meet at a
    /// time (read-write, primary): another host that still matched was
    /// switched over without weir seeing it fail (its connections quiet, a
    /// path gone silent). Its role is in doubt, its servers retired and
    /// cut. Returns the hosts displaced.
    fn displace(&self, st: &mut SetState, key: &HostKey, actions: &mut Vec<Action>) -> Vec<HostKey> {
        if !matches!(st.cfg.target, TargetSessionAttrs::ReadWrite | TargetSessionAttrs::Primary) {
            return Vec::new();
        }
        let target = st.cfg.target;
        let mut displaced = Vec::new();
        for h in st.hosts.iter_mut().filter(|h| h.key != *key && matches(h.role, target)) {
            tracing::warn!(database = %self.database, host = %h.key, from = h.role.as_label(), now = %key,
                "another host now matches target_session_attrs; this one is in doubt");
            h.role = HostRole::Unknown;
            h.learned = Some(Instant::now());
            actions.push(Action::Retire(h.key.clone(), CloseReason::RoleChanged));
            actions.push(Action::Cut(h.tethers.clone(), h.key.clone()));
            displaced.push(h.key.clone());
        }
        displaced
    }

    /// The matching host `key` failed: if no other matches, an outage begins.
    fn outage_starts(&self, st: &mut SetState, key: &HostKey) {
        let other = st.hosts.iter().any(|h| h.key != *key && matches(h.role, st.cfg.target));
        if !other && st.outage.is_none() {
            st.outage = Some(Outage { since: Instant::now(), from: Some(key.clone()) });
        }
    }

    /// Host `key` matches: an outage ends, as a failover when another host
    /// matched before (timed from the first failed connect), or the hosts
    /// it `displaced` are a failover weir saw no connect fail in (untimed).
    fn outage_ends(&self, st: &mut SetState, key: &HostKey, displaced: Vec<HostKey>, actions: &mut Vec<Action>) {
        actions.push(Action::WakePools);
        let Some(outage) = st.outage.take() else {
            if let Some(from) = displaced.first() {
                self.metrics.record_failover(None);
                tracing::warn!(database = %self.database, from = %from, to = %key, target = st.cfg.target.as_str(),
                    "failover: another host now matches");
            }
            return;
        };
        let took = outage.since.elapsed();
        match outage.from {
            Some(from) if from != *key => {
                self.metrics.record_failover(Some(took));
                tracing::warn!(database = %self.database, from = %from, to = %key, target = st.cfg.target.as_str(),
                    took_ms = took.as_millis() as u64, "failover: another host now matches");
                if let Some(old) = st.hosts.iter().find(|h| h.key == from) {
                    actions.push(Action::Retire(from.clone(), CloseReason::RoleChanged));
                    actions.push(Action::Cut(old.tethers.clone(), from));
                }
            }
            _ => tracing::info!(database = %self.database, host = %key, took_ms = took.as_millis() as u64,
                "the matching host answers again"),
        }
    }

    /// Roles and the matching count to the metrics.
    fn publish(&self, st: &SetState) {
        let target = st.cfg.target;
        self.metrics.set_hosts(st.hosts.iter().map(|h| (h.key.to_string(), h.role)).collect());
        self.metrics.set_matching(st.hosts.iter().filter(|h| matches(h.role, target)).count() as u64);
    }

    fn act(&self, actions: Vec<Action>) {
        if actions.is_empty() {
            return;
        }
        let pools: Vec<Arc<Pool>> = self.pools.lock().iter().filter_map(Weak::upgrade).collect();
        for a in actions {
            match a {
                Action::Retire(key, reason) => pools.iter().for_each(|p| p.retire_host(&key, reason)),
                Action::Cut(tethers, key) => {
                    let n = tethers.cut_all();
                    if n > 0 {
                        tracing::warn!(database = %self.database, host = %key, servers = n,
                            "ending the servers still lent to a host that no longer matches");
                    }
                }
                Action::WakePools => pools.iter().for_each(|p| p.host_found()),
            }
        }
    }
}

#[cfg(test)]
mod tests;
