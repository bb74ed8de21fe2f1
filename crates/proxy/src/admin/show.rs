//! The `SHOW` commands: snapshots of pools, clients, servers, databases and
//! settings as result sets, with PgBouncer's column names where PgBouncer has
//! the column, and weir's own columns (opens/closes per second, drops) after
//! them. Reads shared state only; changes nothing.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use weir_metrics::Window;

use super::command::{Show, SYNOPSIS};
use super::result::{float, int, text, Cell, Kind, ResultSet};
use crate::config::keys;
use crate::pool::Pool;
use crate::state::Shared;

use Kind::{Float, Int, Text};

/// Runs one SHOW.
pub fn show(what: Show, shared: &Arc<Shared>) -> ResultSet {
    match what {
        Show::Pools => pools(shared),
        Show::Stats => stats(shared),
        Show::Clients => clients(shared),
        Show::Servers => servers(shared),
        Show::Databases => databases(shared),
        Show::Config => config(shared),
        Show::Lists => lists(shared),
        Show::Version => version(),
        Show::Help => help(),
    }
}

fn micros(d: Duration) -> Cell {
    int(d.as_micros().min(i64::MAX as u128) as i64)
}

fn timestamp(t: SystemTime) -> Cell {
    text(humantime::format_rfc3339_seconds(t).to_string())
}

fn addr_cells(addr: Option<SocketAddr>) -> [Cell; 2] {
    match addr {
        Some(a) => [text(a.ip().to_string()), int(a.port())],
        None => [None, None],
    }
}

/// sv_used: idle connections due for server_check_query before their next use.
fn used_servers(pool: &Pool, check_delay: Duration) -> usize {
    pool.idle_servers().iter().filter(|s| s.idle_for >= check_delay).count()
}

fn pools(shared: &Arc<Shared>) -> ResultSet {
    let mut rs = ResultSet::new(&[
        ("database", Text),
        ("user", Text),
        ("cl_active", Int),
        ("cl_waiting", Int),
        ("cl_idle", Int),
        ("sv_active", Int),
        ("sv_idle", Int),
        ("sv_used", Int),
        ("sv_tested", Int),
        ("sv_login", Int),
        ("maxwait", Int),
        ("maxwait_us", Int),
        ("pool_mode", Text),
        ("pool_size", Int),
        ("paused", Int),
        ("opens_per_sec", Float),
        ("closes_per_sec", Float),
        ("sv_opened", Int),
        ("sv_closed", Int),
        ("connect_failures", Int),
        ("dropped", Int),
    ]);
    let cfg = shared.config.load();
    let counts = shared.client_list.idle_and_active();
    for pool in shared.pools.all() {
        let s = pool.snapshot();
        let m = &pool.metrics;
        let (idle, active) =
            counts.get(&(pool.key.database.clone(), pool.key.user.clone())).copied().unwrap_or_default();
        let used = used_servers(&pool, cfg.weir.server_check_delay) as u32;
        rs.push(vec![
            text(&pool.key.database),
            text(&pool.key.user),
            int(active),
            int(s.waiting),
            int(idle),
            int(s.active),
            int(s.idle.saturating_sub(used)),
            int(used),
            int(s.recovering),
            int(s.connecting),
            int(s.maxwait.as_secs()),
            int(s.maxwait.subsec_micros()),
            text(pool.settings().pool_mode.as_str()),
            int(s.pool_size),
            int(u8::from(s.paused)),
            float(m.opens_per_second(Window::S10)),
            float(m.closes_per_second(Window::S10)),
            int(m.opened()),
            int(m.closed_total()),
            int(m.connect_failures_total()),
            int(m.dropped_queries_total()),
        ]);
    }
    rs
}

/// Per-database sums over that database's pools.
#[derive(Default)]
struct DbStats {
    assignments: u64,
    xacts: u64,
    queries: u64,
    xact_time: Duration,
    wait_time: Duration,
    opened: u64,
    closed: u64,
    failures: u64,
    dropped: u64,
}

fn stats(shared: &Arc<Shared>) -> ResultSet {
    let mut rs = ResultSet::new(&[
        ("database", Text),
        ("total_server_assignment_count", Int),
        ("total_xact_count", Int),
        ("total_query_count", Int),
        ("total_xact_time", Int),
        ("total_wait_time", Int),
        ("avg_xact_time", Int),
        ("avg_wait_time", Int),
        ("total_server_opened", Int),
        ("total_server_closed", Int),
        ("total_connect_failures", Int),
        ("total_dropped", Int),
    ]);
    let mut by_db: std::collections::BTreeMap<String, DbStats> = Default::default();
    for pool in shared.pools.all() {
        let (m, d) = (&pool.metrics, by_db.entry(pool.key.database.clone()).or_default());
        d.assignments += m.server_assignments();
        d.xacts += m.transactions();
        d.queries += m.queries();
        d.xact_time += m.transaction_time();
        d.wait_time += m.wait_time();
        d.opened += m.opened();
        d.closed += m.closed_total();
        d.failures += m.connect_failures_total();
        d.dropped += m.dropped_queries_total();
    }
    let avg = |total: Duration, n: u64| int((total.as_micros() / u128::from(n.max(1))).min(i64::MAX as u128) as i64);
    for (db, d) in by_db {
        rs.push(vec![
            text(db),
            int(d.assignments),
            int(d.xacts),
            int(d.queries),
            micros(d.xact_time),
            micros(d.wait_time),
            avg(d.xact_time, d.xacts),
            avg(d.wait_time, d.assignments),
            int(d.opened),
            int(d.closed),
            int(d.failures),
            int(d.dropped),
        ]);
    }
    rs
}

/// The leading columns SHOW CLIENTS and SHOW SERVERS share, in PgBouncer's order.
const CONNECTION_COLUMNS: &[(&str, Kind)] = &[
    ("type", Text),
    ("user", Text),
    ("database", Text),
    ("state", Text),
    ("addr", Text),
    ("port", Int),
    ("local_addr", Text),
    ("local_port", Int),
    ("connect_time", Text),
];

/// One connection's cells under `CONNECTION_COLUMNS`.
struct Connection<'a> {
    kind: &'static str,
    user: &'a str,
    database: &'a str,
    state: &'a str,
    peer: SocketAddr,
    local: Option<SocketAddr>,
    since: SystemTime,
}

impl Connection<'_> {
    fn cells(&self, more: impl IntoIterator<Item = Cell>) -> Vec<Cell> {
        let [addr, port] = addr_cells(Some(self.peer));
        let [laddr, lport] = addr_cells(self.local);
        let head = [
            text(self.kind),
            text(self.user),
            text(self.database),
            text(self.state),
            addr,
            port,
            laddr,
            lport,
            timestamp(self.since),
        ];
        head.into_iter().chain(more).collect()
    }
}

fn connection_set(more: &[(&'static str, Kind)]) -> ResultSet {
    ResultSet::new(&[CONNECTION_COLUMNS, more].concat())
}

fn clients(shared: &Arc<Shared>) -> ResultSet {
    let mut rs = connection_set(&[("application_name", Text), ("client_key", Int), ("server_pid", Int)]);
    for c in shared.client_list.all() {
        let state = c.state();
        let conn = Connection {
            kind: "C",
            user: c.user(),
            database: c.database(),
            state: state.as_label(),
            peer: c.peer,
            local: c.local,
            since: c.connected_at,
        };
        rs.push(conn.cells([text(&c.application_name), int(c.key_pid), c.server_pid().and_then(int)]));
    }
    rs
}

fn servers(shared: &Arc<Shared>) -> ResultSet {
    let mut rs = connection_set(&[("remote_pid", Int), ("client_key", Int), ("prepared_statements", Int)]);
    let check_delay = shared.config.load().weir.server_check_delay;
    let linked: HashMap<i32, i32> =
        shared.client_list.all().iter().filter_map(|c| Some((c.server_pid()?, c.key_pid))).collect();
    for pool in shared.pools.all() {
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
                state,
                peer: s.addr,
                local: s.local_addr,
                since: s.connected_at,
            };
            let prepared = int(s.prepared_statements.get());
            rs.push(conn.cells([int(s.pid), linked.get(&s.pid).and_then(|k| int(*k)), prepared]));
        }
    }
    rs
}

fn databases(shared: &Arc<Shared>) -> ResultSet {
    let mut rs = ResultSet::new(&[
        ("name", Text),
        ("host", Text),
        ("port", Int),
        ("database", Text),
        ("force_user", Text),
        ("pool_size", Int),
        ("min_pool_size", Int),
        ("reserve_pool", Int),
        ("pool_mode", Text),
        ("max_connections", Int),
        ("current_connections", Int),
        ("paused", Int),
        ("disabled", Int),
        ("query_wait_timeout_ms", Int),
    ]);
    let cfg = shared.config.load();
    let pools = shared.pools.all();
    for name in cfg.databases.keys() {
        let Some(s) = cfg.pool_settings(name) else { continue };
        let current: u32 = pools.iter().filter(|p| &p.key.database == name).map(|p| servers_total(p)).sum();
        rs.push(vec![
            text(name),
            text(&s.host),
            int(s.port),
            text(&s.dbname),
            None,
            int(s.pool_size),
            int(s.min_pool_size),
            int(s.reserve_pool_size),
            text(s.pool_mode.as_str()),
            int(s.max_db_connections),
            int(current),
            int(u8::from(shared.is_paused(name))),
            int(0u8),
            int(s.query_wait_timeout.as_millis().min(i64::MAX as u128) as i64),
        ]);
    }
    rs
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
    let mut rs = ResultSet::new(&[("list", Text), ("items", Int)]);
    let registered = shared.client_list.all();
    let pools = shared.pools.all();
    let connected = shared.clients.load(std::sync::atomic::Ordering::Relaxed);
    let items: [(&str, usize); 7] = [
        ("databases", shared.config.load().databases.len()),
        ("users", shared.users.load().len()),
        ("pools", pools.len()),
        ("used_clients", registered.iter().filter(|c| !c.console).count()),
        ("login_clients", connected.saturating_sub(registered.len())),
        ("used_servers", pools.iter().map(|p| servers_total(p) as usize).sum()),
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
