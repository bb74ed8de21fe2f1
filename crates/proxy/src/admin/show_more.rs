//! The SHOW commands for things PgBouncer keeps and weir mostly does not:
//! USERS, MEM, SOCKETS / ACTIVE_SOCKETS, DNS_HOSTS, DNS_ZONES, FDS, STATE.
//! Each has PgBouncer's columns and types; where weir has no such thing the
//! set is empty, never filled with made-up figures.

use std::collections::BTreeSet;
use std::sync::Arc;

use super::result::{text, Kind, ResultSet};
use super::show::{clients, servers, CONNECTION_COLUMNS};
use crate::state::Shared;

use Kind::{Bytea, Int, Int4, Text};

/// Users weir knows: the auth_file's and those with a pool (auth_query,
/// trust). The console's own virtual user is not one.
pub fn user_names(shared: &Shared) -> BTreeSet<String> {
    let mut names: BTreeSet<String> = shared.users.load().names().map(str::to_owned).collect();
    names.extend(shared.pools.all().iter().map(|p| p.key.user.clone()));
    names
}

/// SHOW USERS: weir has no per-user settings, so pool_mode is NULL (the
/// database's or the global one applies), as PgBouncer shows for a user
/// without one.
pub fn users(shared: &Shared) -> ResultSet {
    let mut rs = ResultSet::new(&[("name", Text), ("pool_mode", Text)]);
    for name in user_names(shared) {
        rs.push(vec![text(name), None]);
    }
    rs
}

/// SHOW MEM: PgBouncer's slab caches; weir allocates per connection and has none.
pub fn mem() -> ResultSet {
    ResultSet::new(&[("name", Text), ("size", Int4), ("used", Int4), ("free", Int4), ("memtotal", Int4)])
}

/// The buffer columns SOCKETS adds; weir does not expose its buffer
/// positions, so they are NULL.
const BUFFER_COLUMNS: &[(&str, Kind)] = &[
    ("recv_pos", Int4),
    ("pkt_pos", Int4),
    ("pkt_remain", Int4),
    ("send_pos", Int4),
    ("send_remain", Int4),
    ("pkt_avail", Int4),
    ("send_avail", Int4),
];

/// SHOW SOCKETS (every client and server) or ACTIVE_SOCKETS (those in use).
pub fn sockets(shared: &Arc<Shared>, active_only: bool) -> ResultSet {
    let mut rs = ResultSet::new(&[CONNECTION_COLUMNS, BUFFER_COLUMNS].concat());
    let state = rs.column("state").unwrap_or(3);
    for set in [clients(shared), servers(shared)] {
        for row in set.rows {
            if active_only && row[state].as_deref() != Some("active") {
                continue;
            }
            let mut row: Vec<_> = row.into_iter().take(CONNECTION_COLUMNS.len()).collect();
            row.extend(BUFFER_COLUMNS.iter().map(|_| None));
            rs.push(row);
        }
    }
    rs
}

/// SHOW DNS_HOSTS: weir resolves with the system resolver and caches nothing.
pub fn dns_hosts() -> ResultSet {
    ResultSet::new(&[("hostname", Text), ("ttl", Int), ("addrs", Text)])
}

/// SHOW DNS_ZONES: no DNS cache, so no zones.
pub fn dns_zones() -> ResultSet {
    ResultSet::new(&[("zonename", Text), ("serial", Int), ("count", Int4)])
}

/// SHOW FDS: the sockets an online restart would pass on; weir has no
/// online restart.
pub fn fds() -> ResultSet {
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
pub fn state(shared: &Shared) -> ResultSet {
    let yes_no = |b: bool| text(if b { "yes" } else { "no" });
    let mut rs = ResultSet::new(&[("active", Text), ("paused", Text), ("suspended", Text)]);
    let paused = shared.paused_databases().iter().any(|d| d == "*");
    rs.push(vec![yes_no(!shared.shutdown.is_cancelled() && !paused), yes_no(paused), yes_no(false)]);
    rs
}
