//! One connect of a pool through its host set: the host the set picks is
//! dialled and logged in to (`server::connect`), its role read (from the
//! login's parameters on Postgres 14+, else one query, within
//! `server_connect_timeout`) and told to the set. A server that does not
//! match the target is closed (`role_mismatch`) and the next host is tried,
//! as libpq does. When no host is known to match, the connect waits for the
//! set's search, within `server_connect_timeout` from its start, and fails
//! then with what the hosts were found to be: the pool backs off and its
//! clients keep waiting within their own budgets. A connect never dials
//! the same host twice unless the search found it matching meanwhile. A
//! name the connect looked up and could not resolve is logged as PgBouncer
//! logs it (`closing because: server DNS lookup failed`).

use std::sync::Arc;
use std::time::Instant;

use weir_metrics::{CloseReason, HostRole};

use super::search::Found;
use super::{HostKey, HostSet, Outcome, Pick, Target};
use crate::config::TargetSessionAttrs;
use crate::pool::Pool;
use crate::server::role::{matches, ServerRole};
use crate::server::{self, ConnectError, ConnectSpec, ServerConn};

/// How many times one connect turns (a dial, or a wait for the search)
/// at most: a host list is short, and each turn is bounded.
const MAX_TURNS: usize = 16;

/// Opens one server connection of `pool` that matches its target.
pub(in crate::pool) async fn connect(pool: &Arc<Pool>, base: Arc<ConnectSpec>) -> Result<ServerConn, ConnectError> {
    let set = pool.hosts.clone();
    let target = set.target();
    let deadline = Instant::now() + base.connect_timeout;
    let mut tried: Vec<HostKey> = Vec::new();
    let mut last: Option<ConnectError> = None;
    for _ in 0..MAX_TURNS {
        for (host, port) in set.refresh_names(false).await {
            // PgBouncer's line for a server whose host did not resolve; the
            // connect goes on to the next host at once.
            let (db, user) = (&pool.key.database, &pool.key.user);
            tracing::info!("S: {db}/{user}@{host}:{port} closing because: server DNS lookup failed (age=0s)");
        }
        let host = match set.pick(&tried) {
            Pick::Dial(host) => host,
            Pick::Done => break,
            Pick::Search => {
                set.want_search(&base);
                match set.found_by(deadline).await {
                    Found::Host => {
                        tried.clear();
                        continue;
                    }
                    Found::Refused(code, message) => return Err(ConnectError::Rejected { code, message }),
                    Found::TimedOut => break,
                }
            }
        };
        tried.push(host.key.clone());
        match dial(pool, &base, &host, target).await {
            Dialled::Server(conn) => return Ok(*conn),
            Dialled::Next(e) => last = e.or(last),
            Dialled::Failed(e) => return Err(e),
        }
        if Instant::now() >= deadline {
            break;
        }
    }
    Err(last.unwrap_or_else(|| no_match(&set, target)))
}

/// What dialling one host gave.
enum Dialled {
    Server(Box<ServerConn>),
    /// Try the next host: this one could not be reached (the error kept
    /// for the pool), or answered in a role that does not match.
    Next(Option<ConnectError>),
    /// A refused login, a connection limit, a failing connect_query: the
    /// pool's to handle, as with one host.
    Failed(ConnectError),
}

/// Dials `host`, learns its role and tells the set.
async fn dial(pool: &Arc<Pool>, base: &ConnectSpec, host: &Target, target: TargetSessionAttrs) -> Dialled {
    let set = &pool.hosts;
    let spec = Arc::new(base.aimed(&host.host, host.port, host.addr));
    let mut conn = match server::connect(spec, &pool.metrics).await {
        Ok(conn) => conn,
        Err(e) if e.unreachable() => {
            set.learned(&host.key, Outcome::Unreachable(e.to_string()));
            return Dialled::Next(Some(e));
        }
        Err(e) => {
            set.learned(&host.key, Outcome::Answered(e.to_string()));
            return Dialled::Failed(e);
        }
    };
    let role = match learn_role(&mut conn, target).await {
        Ok(role) => role,
        Err(why) => {
            set.learned(&host.key, Outcome::Answered(why.clone()));
            conn.close(CloseReason::ServerError);
            return Dialled::Next(Some(ConnectError::ConnectQuery(format!("reading the server's role: {why}"))));
        }
    };
    match role {
        Some(role) => set.learned(&host.key, Outcome::Role(role)),
        None => set.learned(&host.key, Outcome::Answered(String::new())),
    }
    if role.is_some_and(|r| !matches(r, target)) {
        crate::span::client_event!(info, server = %host.key, role = ?role.map(HostRole::as_label),
            target = target.as_str(), "the server does not match target_session_attrs; trying the next host");
        conn.close(CloseReason::RoleMismatch);
        return Dialled::Next(None);
    }
    let tether = conn.stream.tcp().and_then(|tcp| host.tethers.tie(tcp));
    conn.bind_to_host(tether, target == TargetSessionAttrs::ReadWrite);
    Dialled::Server(Box::new(conn))
}

/// The role of a fresh server. With target `any` only what the login told
/// (nothing is asked of a server older than 14: any role will do).
async fn learn_role(conn: &mut ServerConn, target: TargetSessionAttrs) -> Result<Option<HostRole>, String> {
    if let Some(role) = ServerRole::from_params(&conn.params) {
        return Ok(Some(role.host_role()));
    }
    if target == TargetSessionAttrs::Any {
        return Ok(None);
    }
    let limit = conn.spec().connect_timeout;
    match tokio::time::timeout(limit, conn.role()).await {
        Ok(Ok(role)) => Ok(Some(role.host_role())),
        Ok(Err(reason)) => Err(format!("the role query failed ({})", reason.as_label())),
        Err(_) => Err(format!("the role query took longer than {limit:?}")),
    }
}

/// The error of a connect that found no matching host in time.
fn no_match(set: &HostSet, target: TargetSessionAttrs) -> ConnectError {
    let hosts: Vec<String> = set
        .state
        .lock()
        .hosts
        .iter()
        .map(|h| match &h.last_error {
            Some(e) if h.role == HostRole::Unreachable => format!("{}: unreachable: {e}", h.key),
            _ => format!("{}: {}", h.key, h.role.as_label()),
        })
        .collect();
    ConnectError::NoMatchingHost { target: target.as_str(), hosts: hosts.join(", ") }
}
