//! The SHOW commands about this process rather than its pools and
//! connections: CONFIG, USERS, PEERS and PEER_POOLS, STATE, and the lists
//! PgBouncer keeps and weir does not (MEM, DNS_HOSTS, DNS_ZONES, FDS). Each
//! has PgBouncer's columns and types; where weir has no such thing the set is
//! empty, never filled with made-up figures.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::result::{int, text, Kind, ResultSet};
use crate::config::keys;
use crate::state::Shared;

use Kind::{Bytea, Int, Int4, Text};

pub(super) fn config(shared: &Arc<Shared>) -> ResultSet {
    let mut rs = ResultSet::new(&[("key", Text), ("value", Text), ("default", Text), ("changeable", Text)]);
    for row in keys::config_rows(&shared.config.load()) {
        rs.push(vec![text(row.key), row.value, row.default, text(if row.changeable { "yes" } else { "no" })]);
    }
    rs
}

/// Users weir knows: the auth_file's, the `[users]` section's, those with
/// a pool (auth_query, trust) and those with a client now. The console's
/// own virtual user is not one.
pub(super) fn user_names(shared: &Shared) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = shared.users.load().names().map(str::to_owned).collect();
    names.extend(shared.config.load().users.keys().cloned());
    names.extend(shared.pools.all().iter().map(|p| p.key.user.clone()));
    names.extend(shared.caps.users());
    names
}

/// SHOW USERS, with PgBouncer 1.25's columns: a user's own settings from
/// `[users]` (NULL where it has none: the database's or the global one
/// applies), its server connections and its client connections with their
/// limits.
pub(super) fn users(shared: &Shared) -> ResultSet {
    let mut rs = ResultSet::new(&[
        ("name", Text),
        ("pool_size", Text),
        ("reserve_pool_size", Text),
        ("pool_mode", Text),
        ("max_user_connections", Int4),
        ("current_connections", Int4),
        ("max_user_client_connections", Int4),
        ("current_client_connections", Int4),
    ]);
    let pools = shared.pools.all();
    let cfg = shared.config.load();
    for name in user_names(shared) {
        let servers = |s: crate::pool::PoolSnapshot| s.idle + s.active + s.connecting + s.recovering;
        let current: u32 = pools.iter().filter(|p| p.key.user == name).map(|p| servers(p.snapshot())).sum();
        let own = cfg.users.get(&name).cloned().unwrap_or_default();
        let max_servers = own.max_user_connections.unwrap_or(cfg.weir.max_user_connections);
        let clients = [int(cfg.user_client_cap(&name)), int(shared.caps.user_count(&name))];
        let [max_clients, current_clients] = clients;
        rs.push(vec![
            text(name),
            own.pool_size.and_then(|n| text(n.to_string())),
            own.reserve_pool_size.and_then(|n| text(n.to_string())),
            own.pool_mode.and_then(|m| text(m.as_str())),
            int(max_servers),
            int(current),
            max_clients,
            current_clients,
        ]);
    }
    rs
}

/// SHOW PEERS: the `[peers]` this weir forwards cancel requests to (its
/// own entry, which it ignores, left out), as PgBouncer lists them.
pub(super) fn peers(shared: &Shared) -> ResultSet {
    let mut rs = ResultSet::new(&[("peer_id", Int4), ("host", Text), ("port", Int4), ("pool_size", Int4)]);
    let cfg = shared.config.load();
    let mut ids: Vec<u16> = cfg.peers.keys().filter_map(|k| k.parse().ok()).collect();
    ids.sort_unstable();
    for id in ids {
        let Some(peer) = cfg.peer(id) else { continue };
        let size = peer.pool_size.unwrap_or(cfg.weir.default_pool_size);
        rs.push(vec![int(id), text(&peer.host), int(peer.port), int(size)]);
    }
    rs
}

/// SHOW PEER_POOLS: per peer a cancel went to, the forwards under way
/// (each on a connection of its own: cl_active_cancel_req and
/// sv_active_cancel) and those waiting for a turn under its pool_size.
pub(super) fn peer_pools(shared: &Shared) -> ResultSet {
    let mut rs = ResultSet::new(&[
        ("peer_id", Int4),
        ("cl_active_cancel_req", Int4),
        ("cl_waiting_cancel_req", Int4),
        ("sv_active_cancel", Int4),
        ("sv_login", Int4),
    ]);
    for (id, active, waiting) in shared.cancels.peer_forwards() {
        rs.push(vec![int(id), int(active as u64), int(waiting as u64), int(active as u64), int(0u8)]);
    }
    rs
}

/// SHOW MEM: PgBouncer's slab caches; weir allocates per connection and has none.
pub(super) fn mem() -> ResultSet {
    ResultSet::new(&[("name", Text), ("size", Int4), ("used", Int4), ("free", Int4), ("memtotal", Int4)])
}

/// SHOW DNS_HOSTS: weir resolves with the system resolver and caches nothing.
pub(super) fn dns_hosts() -> ResultSet {
    ResultSet::new(&[("hostname", Text), ("ttl", Int), ("addrs", Text)])
}

/// SHOW DNS_ZONES: no DNS cache, so no zones.
pub(super) fn dns_zones() -> ResultSet {
    ResultSet::new(&[("zonename", Text), ("serial", Int), ("count", Int4)])
}

/// SHOW FDS: the sockets an online restart would pass on; weir has no
/// online restart.
pub(super) fn fds() -> ResultSet {
    ResultSet::new(&[
        ("fd", Int4),
        ("task", Text),
        ("user", Text),
        ("database", Text),
        ("addr", Text),
        ("port", Int4),
        ("cancel", Int),
        ("link", Int4),
        ("client_encoding", Text),
        ("std_strings", Text),
        ("datestyle", Text),
        ("timezone", Text),
        ("password", Text),
        ("scram_client_key", Bytea),
        ("scram_server_key", Bytea),
    ])
}

/// SHOW STATE (PgBouncer 1.23): active unless draining, paused when every
/// database is, never suspended.
pub(super) fn state(shared: &Shared) -> ResultSet {
    let yes_no = |b: bool| text(if b { "yes" } else { "no" });
    let mut rs = ResultSet::new(&[("key", Text), ("value", Text)]);
    let paused = shared.paused_databases().iter().any(|d| d == "*");
    rs.push(vec![text("active"), yes_no(!shared.shutdown.is_cancelled() && !paused)]);
    rs.push(vec![text("paused"), yes_no(paused)]);
    rs.push(vec![text("suspended"), yes_no(false)]);
    rs
}
