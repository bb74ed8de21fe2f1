//! SHOW POOLS, DATABASES and LISTS: the pools, the databases they serve,
//! and how many of each thing weir holds.
//!
//! SHOW POOLS' sv_active_cancel counts cancels being forwarded to servers
//! that clients hold; sv_being_canceled counts servers whose client let go
//! while a query ran, and which wait in recovery for the cancel weir (or the
//! client) sent them.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use weir_metrics::{HostRole, Window};

use super::result::{float, int, text, Kind, ResultSet};
use super::show_process::user_names;
use crate::pool::Pool;
use crate::state::Shared;

use Kind::{Float, Int, Int4, Text};

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
    ("load_balance_hosts", Text),
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

pub(super) fn pools(shared: &Arc<Shared>) -> ResultSet {
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
        let settings = pool.settings();
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
            text(settings.pool_mode.as_str()),
            balance_shown(&settings),
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

pub(super) fn databases(shared: &Arc<Shared>) -> ResultSet {
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
        ("load_balance_hosts", Text),
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
            balance_shown(&s),
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
    console.extend([text(name), int(2u8), int(0u8), int(0u8), int(0u8), text("statement"), None, int(0u8), int(0u8)]);
    console.extend(clients(name));
    console.extend([int(0u8), int(0u8), None, None, None]);
    rs.push(console);
    rs
}

/// load_balance_hosts, shown (as PgBouncer does) only for a host list.
fn balance_shown(s: &crate::config::PoolSettings) -> Option<String> {
    (s.hosts.len() > 1).then(|| s.load_balance_hosts.as_str().to_owned())
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

pub(super) fn lists(shared: &Arc<Shared>) -> ResultSet {
    let mut rs = ResultSet::new(&[("list", Text), ("items", Int4)]);
    let registered = shared.client_list.all();
    let pools = shared.pools.all();
    let connected = shared.clients.load(std::sync::atomic::Ordering::Relaxed);
    // weir keeps no free lists of client or server objects and no DNS cache:
    // those rows are 0.
    let items: [(&str, usize); 13] = [
        ("databases", shared.config.load().databases.len()),
        ("users", user_names(shared).len()),
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
