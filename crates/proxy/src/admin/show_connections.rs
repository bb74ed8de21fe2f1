//! SHOW CLIENTS, SERVERS, SOCKETS and ACTIVE_SOCKETS: every client and
//! server connection, one row each, under the columns they share
//! (`CONNECTION_COLUMNS`).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use weir_metrics::{ConnAddr, HostRole};

use super::result::{int, text, Cell, Kind, ResultSet};
use crate::pool::{HostKey, Pool};
use crate::state::Shared;

use Kind::{Int, Int4, Text};

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

/// The leading columns SHOW CLIENTS and SHOW SERVERS share, in PgBouncer's order.
const CONNECTION_COLUMNS: &[(&str, Kind)] = &[
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
pub(super) fn sockets(shared: &Arc<Shared>, active_only: bool) -> ResultSet {
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
