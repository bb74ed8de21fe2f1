//! The `SHOW` commands: snapshots of pools, clients, servers, databases and
//! settings as result sets, with PgBouncer's columns first (PgBouncer 1.23's,
//! in its order and with its types; the later columns of newer versions
//! after them), and weir's own columns (opens/closes per second, drops) after them. Reads
//! shared state only; changes nothing. The statistics are in `stats.rs`, the
//! lists PgBouncer has and weir mostly does not in `show_more.rs`.
//!
//! SHOW POOLS' sv_active_cancel counts cancels being forwarded to servers
//! that clients hold; sv_being_canceled counts servers whose client let go
//! while a query ran, and which wait in recovery for the cancel weir (or the
//! client) sent them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use weir_metrics::{ConnAddr, HostRole, Window};

use super::command::{Show, SYNOPSIS};
use super::result::{float, int, text, Cell, Kind, ResultSet};
use super::{show_more, stats};
use crate::config::keys;
use crate::pool::{HostKey, Pool};
use crate::state::Shared;

use Kind::{Float, Int, Int4, Text};

/// Runs one SHOW.
pub fn show(what: Show, shared: &Arc<Shared>) -> ResultSet {
    match what {
        Show::Pools => pools(shared),
        Show::Stats => stats::stats(shared),
        Show::StatsTotals => stats::stats_part(shared, false),
        Show::StatsAverages => stats::stats_part(shared, true),
        Show::Totals => stats::totals(shared),
        Show::Clients => clients(shared),
        Show::Servers => servers(shared),
        Show::Databases => databases(shared),
        Show::Users => show_more::users(shared),
        Show::Config => config(shared),
        Show::Lists => lists(shared),
        Show::Mem => show_more::mem(),
        Show::Sockets => show_more::sockets(shared, false),
        Show::ActiveSockets => show_more::sockets(shared, true),
        Show::DnsHosts => show_more::dns_hosts(),
        Show::DnsZones => show_more::dns_zones(),
        Show::Fds => show_more::fds(),
        Show::State => show_more::state(shared),
        Show::Peers => show_more::peers(shared),
        Show::PeerPools => show_more::peer_pools(shared),
        Show::Version => version(),
        Show::Help => help(),
    }
}

fn timestamp(t: SystemTime) -> Cell {
    text(humantime::format_rfc3339_seconds(t).to_string())
}

/// The wall-clock time of `at`.
fn wall(at: Instant) -> SystemTime {
    SystemTime::now() - at.elapsed()
}

fn addr_cells(addr: Option<ConnAddr>) -> [Cell; 2] {
    match addr {
        Some(a) => [text(a.host()), int(a.port())],
        None => [None, None],
    }
}

/// sv_used: idle connections due for server_check_query before their next use.
fn used_servers(pool: &Pool, check_delay: Duration) -> usize {
    pool.idle_servers().iter().filter(|s| s.idle_for >= check_delay).count()
}

/// SHOW POOLS: PgBouncer's columns, then weir's own.
const POOLS_COLUMNS: &[(&str, Kind)] = &[
    ("database", Text),
    ("user", Text),
    ("cl_active", Int4),
    ("cl_waiting", Int4),
    ("cl_active_cancel_req", Int4),
    ("cl_waiting_cancel_req", Int4),
    ("sv_active", Int4),
    ("sv_active_cancel", Int4),
    ("sv_being_canceled", Int4),
    ("sv_idle", Int4),
    ("sv_used", Int4),
    ("sv_tested", Int4),
    ("sv_login", Int4),
    ("maxwait", Int4),
    ("maxwait_us", Int4),
    ("pool_mode", Text),
    // weir's own.
    ("cl_idle", Int),
    ("pool_size", Int),
    ("paused", Int),
    ("opens_per_sec", Float),
    ("closes_per_sec", Float),
    ("sv_opened", Int),
    ("sv_closed", Int),
    ("connect_failures", Int),
    ("dropped", Int),
    ("predicted_wait_us", Int),
    // Replication clients' own servers (also in sv_active, as PgBouncer
    // counts them).
    ("sv_replication", Int),
    ("connect_refused", Int),
    // With fleet_share: this instance's share of the fleet's budget and
    // the instances announcing (0 and 0 without it).
    ("fleet_share", Int),
    ("fleet_instances", Int),
];

fn pools(shared: &Arc<Shared>) -> ResultSet {
    let mut rs = ResultSet::new(POOLS_COLUMNS);
    let cfg = shared.config.load();
    let counts = shared.client_list.states();
    let clients = shared.client_list.all();
    // sv_active_cancel: cancels being forwarded to servers that clients hold.
    let mut cancels: HashMap<(&str, &str), usize> = HashMap::new();
    for c in &clients {
        *cancels.entry((c.database(), c.pool_user())).or_default() += c.cancels_in_flight();
    }
    for pool in shared.pools.all() {
        let s = pool.snapshot();
        let m = &pool.metrics;
        // All three client columns from one pass over the clients, so they
        // add up even while other worker threads move clients.
        let n = counts.get(&(pool.key.database.clone(), pool.key.user.clone())).copied().unwrap_or_default();
        let used = used_servers(&pool, cfg.weir.server_check_delay) as u32;
        let (fleet_share, fleet_instances) = m.fleet();
        rs.push(vec![
            text(&pool.key.database),
            text(&pool.key.user),
            int(n.active),
            int(n.waiting),
            // weir answers a queued client's cancel itself, and closes a
            // cancel request's connection once it is forwarded: no client
            // waits on a cancel.
            int(0u8),
            int(0u8),
            int(s.active + s.replication),
            int(cancels.get(&(pool.key.database.as_str(), pool.key.user.as_str())).copied().unwrap_or(0) as u64),
            int(m.servers_being_canceled()),
            int(s.idle.saturating_sub(used)),
            int(used),
            int(s.recovering),
            int(s.connecting),
            int(s.maxwait.as_secs()),
            int(s.maxwait.subsec_micros()),
            text(pool.settings().pool_mode.as_str()),
            int(n.idle),
            int(s.pool_size),
            int(u8::from(s.paused)),
            float(m.opens_per_second(Window::S10)),
            float(m.closes_per_second(Window::S10)),
            int(m.opened()),
            int(m.closed_total()),
            int(m.connect_failures_total()),
            int(m.dropped_queries_total()),
            int(s.predicted_wait.as_micros().min(i64::MAX as u128) as i64),
            int(s.replication),
            int(m.connect_refusals_total()),
            int(fleet_share),
            int(fleet_instances),
        ]);
    }
    rs
}

/// The leading columns SHOW CLIENTS and SHOW SERVERS share, in PgBouncer's order.
pub(super) const CONNECTION_COLUMNS: &[(&str, Kind)] = &[
    ("type", Text),
    ("user", Text),
    ("database", Text),
    ("replication", Text),
    ("state", Text),
    ("addr", Text),
    ("port", Int4),
    ("local_addr", Text),
    ("local_port", Int4),
    ("connect_time", Text),
    ("request_time", Text),
    ("wait", Int4),
    ("wait_us", Int4),
    ("close_needed", Int4),
    ("ptr", Text),
    ("link", Text),
    ("remote_pid", Int4),
    ("tls", Text),
    ("application_name", Text),
    ("prepared_statements", Int4),
    ("id", Int4),
];

/// One connection's cells under `CONNECTION_COLUMNS`.
struct Connection<'a> {
    kind: &'static str,
    user: &'a str,
    database: &'a str,
    /// none, logical or physical.
    replication: &'static str,
    state: &'a str,
    peer: ConnAddr,
    local: Option<ConnAddr>,
    since: SystemTime,
    /// The latest request (clients) or use (servers).
    request: SystemTime,
    /// How long a client has waited for a server so far.
    wait: Duration,
    close_needed: bool,
    /// This connection's and its partner's ids (ptr, link).
    ptr: String,
    link: Option<String>,
    remote_pid: i32,
    application_name: Option<&'a str>,
    /// A server's prepared statements (a client's are not counted: NULL).
    prepared: Option<u64>,
    /// The connection's id (KILL_CLIENT's argument for a client).
    id: u64,
}

impl Connection<'_> {
    fn cells(&self, more: impl IntoIterator<Item = Cell>) -> Vec<Cell> {
        let [addr, port] = addr_cells(Some(self.peer));
        let [laddr, lport] = addr_cells(self.local);
        let head = [
            text(self.kind),
            text(self.user),
            text(self.database),
            text(self.replication),
            text(self.state),
            addr,
            port,
            laddr,
            lport,
            timestamp(self.since),
            timestamp(self.request),
            int(self.wait.as_secs()),
            int(self.wait.subsec_micros()),
            int(u8::from(self.close_needed)),
            text(&self.ptr),
            self.link.clone().map(text).unwrap_or_else(|| text("")),
            int(self.remote_pid),
            // weir does not keep whether a connection uses TLS.
            None,
            self.application_name.and_then(text),
            self.prepared.and_then(int),
            int(self.id),
        ];
        head.into_iter().chain(more).collect()
    }
}

fn connection_set(more: &[(&'static str, Kind)]) -> ResultSet {
    ResultSet::new(&[CONNECTION_COLUMNS, more].concat())
}

/// A client's or server's id in ptr and link: the client's key pid, the
/// server's backend pid, in hex as PgBouncer shows pointers.
fn id(pid: i32) -> String {
    format!("{:x}", pid as u32)
}

pub(super) fn clients(shared: &Arc<Shared>) -> ResultSet {
    let mut rs = connection_set(&[("client_key", Int), ("server_pid", Int)]);
    for c in shared.client_list.all() {
        let state = c.state();
        let requested = c.requested_at();
        let waiting = state == weir_metrics::ClientState::Waiting;
        let conn = Connection {
            kind: "C",
            user: c.user(),
            database: c.database(),
            replication: c.replication.as_label(),
            state: state.as_label(),
            peer: c.peer,
            local: c.local,
            since: c.connected_at,
            request: requested.map_or(c.connected_at, wall),
            wait: requested.filter(|_| waiting).map(|t| t.elapsed()).unwrap_or_default(),
            close_needed: false,
            ptr: id(c.key_pid),
            link: c.server_pid().map(id),
            remote_pid: 0,
            application_name: Some(&c.application_name),
            prepared: None,
            id: c.id,
        };
        rs.push(conn.cells([int(c.key_pid), c.server_pid().and_then(int)]));
    }
    rs
}

/// The role each server address of `pool`'s database was last found in.
fn host_roles(pool: &Pool) -> HashMap<ConnAddr, HostRole> {
    let addr = |k: &HostKey| match k {
        HostKey::Addr(a) => Some(ConnAddr::Tcp(*a)),
        HostKey::Named(h, p) if h.starts_with('/') => Some(ConnAddr::Unix(*p)),
        HostKey::Named(..) => None,
    };
    pool.hosts().view().into_iter().filter_map(|v| Some((addr(&v.host)?, v.role))).collect()
}

pub(super) fn servers(shared: &Arc<Shared>) -> ResultSet {
    // weir's own: the role of the server's host (target_session_attrs).
    let mut rs = connection_set(&[("client_key", Int), ("host_role", Text)]);
    let check_delay = shared.config.load().weir.server_check_delay;
    let clients = shared.client_list.all();
    let linked: HashMap<i32, i32> = clients.iter().filter_map(|c| Some((c.server_pid()?, c.key_pid))).collect();
    let requested: HashMap<i32, Instant> =
        clients.iter().filter_map(|c| Some((c.server_pid()?, c.requested_at()?))).collect();
    let replication: HashMap<i32, &'static str> = clients
        .iter()
        .filter(|c| c.replication.is_some())
        .filter_map(|c| Some((c.server_pid()?, c.replication.as_label())))
        .collect();
    for pool in shared.pools.all() {
        let roles = host_roles(&pool);
        let reconnecting = pool.reconnect_pending();
        let idle: HashMap<i32, Duration> = pool.idle_servers().into_iter().map(|s| (s.pid, s.idle_for)).collect();
        for s in pool.metrics.live_servers() {
            let state = match (idle.get(&s.pid), linked.get(&s.pid)) {
                (Some(d), _) if *d >= check_delay => "used",
                (Some(_), _) => "idle",
                (None, Some(_)) => "active",
                (None, None) => "tested",
            };
            let conn = Connection {
                kind: "S",
                user: &pool.key.user,
                database: &pool.key.database,
                replication: replication.get(&s.pid).copied().unwrap_or("none"),
                state,
                peer: s.addr,
                local: s.local_addr,
                since: s.connected_at,
                request: match (idle.get(&s.pid), requested.get(&s.pid)) {
                    (Some(d), _) => SystemTime::now() - *d,
                    (None, Some(t)) => wall(*t),
                    (None, None) => s.connected_at,
                },
                wait: Duration::ZERO,
                close_needed: reconnecting && s.connected_at < marked_before(&pool),
                ptr: id(s.pid),
                link: linked.get(&s.pid).map(|k| id(*k)),
                remote_pid: s.pid,
                application_name: None,
                prepared: Some(s.prepared_statements.get()),
                id: s.id,
            };
            let role = roles.get(&s.addr).and_then(|r| text(r.as_label()));
            rs.push(conn.cells([linked.get(&s.pid).and_then(|k| int(*k)), role]));
        }
    }
    rs
}

/// When RECONNECT marked `pool`'s servers (the far past if it did not).
fn marked_before(pool: &Pool) -> SystemTime {
    pool.reconnect_mark().map_or(SystemTime::UNIX_EPOCH, wall)
}

fn databases(shared: &Arc<Shared>) -> ResultSet {
    let mut rs = ResultSet::new(&[
        ("name", Text),
        ("host", Text),
        ("port", Int4),
        ("database", Text),
        ("force_user", Text),
        ("pool_size", Int4),
        ("min_pool_size", Int4),
        ("reserve_pool", Int4),
        ("server_lifetime", Int4),
        ("pool_mode", Text),
        ("max_connections", Int4),
        ("current_connections", Int4),
        ("max_client_connections", Int4),
        ("current_client_connections", Int4),
        ("paused", Int4),
        ("disabled", Int4),
        // weir's own.
        ("query_wait_timeout_ms", Int),
        ("target_session_attrs", Text),
        // Each host and its role: `address:port role`, comma-separated.
        ("host_roles", Text),
    ]);
    let cfg = shared.config.load();
    let pools = shared.pools.all();
    let clients = |name: &str| [int(cfg.db_client_cap(name)), int(shared.caps.database_count(name))];
    for name in cfg.databases.keys() {
        let Some(s) = cfg.pool_settings(name) else { continue };
        let current: u32 = pools.iter().filter(|p| &p.key.database == name).map(|p| servers_total(p)).sum();
        let mut row = vec![
            text(name),
            text(&s.host),
            int(s.port),
            text(&s.dbname),
            cfg.forced_user(name).map(|(u, _)| text(u)).unwrap_or(None),
            int(s.pool_size),
            int(s.min_pool_size),
            int(s.reserve_pool_size),
            int(s.server_lifetime.as_secs()),
            text(s.pool_mode.as_str()),
            int(s.max_db_connections),
            int(current),
        ];
        row.extend(clients(name));
        row.extend([
            int(u8::from(shared.is_paused(name))),
            int(u8::from(shared.admin.is_disabled(name))),
            int(s.query_wait_timeout.as_millis().min(i64::MAX as u128) as i64),
            text(s.target_session_attrs.as_str()),
            text(roles_of(shared, name, &s)),
        ]);
        rs.push(row);
    }
    // The console, as PgBouncer lists its own virtual database.
    let name = crate::login::CONSOLE_DATABASE;
    let mut console = vec![text(name), None, int(cfg.weir.listen_addr.port()), text(name)];
    console.extend([text(name), int(2u8), int(0u8), int(0u8), int(0u8), text("statement"), int(0u8), int(0u8)]);
    console.extend(clients(name));
    // No wait budget, target or hosts of its own.
    console.extend([int(0u8), int(0u8), None, None, None]);
    rs.push(console);
    rs
}

/// `address:port role` for each host of database `name` (the configured
/// hosts, unknown, before any pool of it connected).
fn roles_of(shared: &Shared, name: &str, s: &crate::config::PoolSettings) -> String {
    let listed: Vec<String> = match shared.pools.hosts(name) {
        Some(set) => set.view().iter().map(|v| format!("{} {}", v.host, v.role.as_label())).collect(),
        None => s.hosts.iter().map(|h| format!("{}:{} {}", h.host, h.port, HostRole::Unknown.as_label())).collect(),
    };
    listed.join(", ")
}

fn servers_total(pool: &Pool) -> u32 {
    let s = pool.snapshot();
    s.idle + s.active + s.connecting + s.recovering
}

fn config(shared: &Arc<Shared>) -> ResultSet {
    let mut rs = ResultSet::new(&[("key", Text), ("value", Text), ("default", Text), ("changeable", Text)]);
    for row in keys::config_rows(&shared.config.load()) {
        rs.push(vec![text(row.key), row.value, row.default, text(if row.changeable { "yes" } else { "no" })]);
    }
    rs
}

fn lists(shared: &Arc<Shared>) -> ResultSet {
    let mut rs = ResultSet::new(&[("list", Text), ("items", Int4)]);
    let registered = shared.client_list.all();
    let pools = shared.pools.all();
    let connected = shared.clients.load(std::sync::atomic::Ordering::Relaxed);
    // weir keeps no free lists of client or server objects and no DNS cache:
    // those rows are 0.
    let items: [(&str, usize); 13] = [
        ("databases", shared.config.load().databases.len()),
        ("users", show_more::user_names(shared).len()),
        ("pools", pools.len()),
        ("free_clients", 0),
        ("used_clients", registered.iter().filter(|c| !c.console).count()),
        ("login_clients", connected.saturating_sub(registered.len())),
        ("free_servers", 0),
        ("used_servers", pools.iter().map(|p| servers_total(p) as usize).sum()),
        ("dns_names", 0),
        ("dns_zones", 0),
        ("dns_queries", 0),
        ("dns_pending", 0),
        ("paused_databases", shared.paused_databases().len()),
    ];
    for (name, n) in items {
        rs.push(vec![text(name), int(n as u64)]);
    }
    rs
}

fn version() -> ResultSet {
    let mut rs = ResultSet::new(&[("version", Text)]);
    rs.push(vec![text(format!("weir {}", env!("CARGO_PKG_VERSION")))]);
    rs
}

fn help() -> ResultSet {
    let mut rs = ResultSet::new(&[("command", Text), ("description", Text)]);
    for (cmd, what) in SYNOPSIS {
        rs.push(vec![text(*cmd), text(*what)]);
    }
    rs
}
