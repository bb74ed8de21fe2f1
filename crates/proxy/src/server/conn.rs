//! One logged-in server connection (`ServerConn`): opened through `dial`
//! with a bound on the whole handshake and the database's connect_query,
//! counted open and closed, and carrying the state the pool and sessions
//! need (including the spec it was opened with, for watchdog probes, and
//! whether someone found it broken).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use weir_metrics::{CloseReason, ConnAddr, PoolMetrics, ServerConnGuard};

use super::cancel::{CancelAddr, CancelGate, CancelTarget};
use super::conversation::Conversation;
use super::dial::{open, socket_path, ConnectError, ConnectSpec};
use super::statements::ServerStatements;
use super::stream::ServerStream;
use crate::params::ParamMap;

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// A logged-in server connection. Owned by the pool; lent to one client at a time.
#[derive(Debug)]
pub struct ServerConn {
    pub(crate) id: u64,
    pub(crate) stream: ServerStream,
    /// Bytes read from the server and not yet passed on.
    pub(crate) rbuf: BytesMut,
    pub(crate) conv: Conversation,
    /// Reported parameters (ParameterStatus) as the server has them now.
    pub(crate) params: ParamMap,
    /// Unreported settings weir applied with SET for a client (from `options`).
    pub(super) settings: ParamMap,
    /// The stamps (client params, client settings, `params`, `settings`)
    /// from when this server last matched a client's parameters.
    pub(super) matched: Option<crate::params::Stamps>,
    pub(crate) cancel: CancelTarget,
    pub(crate) created: Instant,
    last_used: Instant,
    /// When a client's checkout last took this connection from the pool
    /// (that client's transaction time starts there; see `pool::Lease`).
    taken_at: Instant,
    /// The fingerprint of the transaction it is lent to, when that
    /// transaction queued for it (`pool::queries`); 0: none.
    query: u64,
    /// When this connection retires (server_lifetime with jitter).
    retire_at: Instant,
    /// Holds this connection's place in its database's connection count.
    slot: Option<CountSlot>,
    /// Its place under max_user_connections.
    user_slot: Option<CountSlot>,
    /// What it was opened with (the pool's upkeep refreshes it after a reload).
    spec: Arc<ConnectSpec>,
    /// Set by whoever found the connection unusable (a watchdog): the pool
    /// closes it with this reason instead of recovering it.
    pub(crate) broken: Option<CloseReason>,
    /// weir's prepared statements on this server (transaction mode).
    pub(crate) statements: ServerStatements,
    /// Its place among its host's servers (`tether`): the pool ends it at
    /// once when the host fails over.
    tether: Option<super::tether::Tether>,
    /// Its database wants writes (target_session_attrs = read-write): a
    /// 25006 from it retires it when released.
    wants_writes: bool,
    /// It refused a write (25006) during this loan. Weighed when released,
    /// with the parameters it has reported by then (the ParameterStatus that
    /// says it turned read-only may come after the error).
    pub(super) refused_write: bool,
    guard: ServerConnGuard,
}

/// The parts of a lent connection that the transfer loop works on, borrowed
/// together (each one apart, so the loop can hold several at once): the
/// socket, what the watchdog needs, and the state the bytes change.
pub struct ConnParts<'a> {
    pub stream: &'a mut ServerStream,
    pub spec: &'a Arc<ConnectSpec>,
    pub cancel: &'a CancelTarget,
    pub side: ServerSide<'a>,
}

/// What the bytes passing from and to a lent connection change: those read
/// and not yet passed on, the conversation, the parameters the server
/// reports, whether it broke, and weir's prepared statements on it.
pub struct ServerSide<'a> {
    /// Bytes read from the server and not yet passed on.
    pub unread: &'a mut BytesMut,
    pub conv: &'a mut Conversation,
    pub params: &'a mut ParamMap,
    pub broken: &'a mut Option<CloseReason>,
    pub statements: &'a mut ServerStatements,
    /// A refused write (25006) retires the server (read-write databases).
    pub wants_writes: bool,
    /// Set when it refused a write where writes are wanted.
    pub refused_write: &'a mut bool,
}

/// A place in a shared connection count, given back on drop.
#[derive(Debug)]
pub(crate) struct CountSlot(Arc<std::sync::atomic::AtomicU32>);

impl CountSlot {
    /// Takes a place if fewer than `limit` are taken (0 = no limit).
    pub(crate) fn take(count: &Arc<std::sync::atomic::AtomicU32>, limit: u32) -> Option<CountSlot> {
        let mut cur = count.load(Ordering::Relaxed);
        loop {
            if limit != 0 && cur >= limit {
                return None;
            }
            match count.compare_exchange_weak(cur, cur + 1, Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => return Some(CountSlot(count.clone())),
                Err(now) => cur = now,
            }
        }
    }
}

impl Drop for CountSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

impl ServerConn {
    /// The parts the transfer loop works on.
    pub fn parts(&mut self) -> ConnParts<'_> {
        ConnParts {
            stream: &mut self.stream,
            spec: &self.spec,
            cancel: &self.cancel,
            side: ServerSide {
                unread: &mut self.rbuf,
                conv: &mut self.conv,
                params: &mut self.params,
                broken: &mut self.broken,
                statements: &mut self.statements,
                wants_writes: self.wants_writes,
                refused_write: &mut self.refused_write,
            },
        }
    }

    /// Holds the connection's places in its database's and its user's
    /// connection counts, and sets when it retires: `lifetime` after it
    /// opened (server_lifetime, with the pool's jitter).
    pub(crate) fn admit(&mut self, db: CountSlot, user: CountSlot, lifetime: Duration) {
        self.slot = Some(db);
        self.user_slot = Some(user);
        self.retire_at = self.created + lifetime;
    }

    /// Ties the connection to its host (`tether`: the pool ends it at once
    /// when the host fails over) and says whether its database wants writes
    /// (target_session_attrs = read-write: a 25006 then retires it).
    pub(crate) fn bind_to_host(&mut self, tether: Option<super::tether::Tether>, wants_writes: bool) {
        self.tether = tether;
        self.wants_writes = wants_writes;
    }

    /// Gives up its place in the database's count, to whoever takes it over
    /// (an eviction, a probe, a replication client); None if it holds none.
    pub(crate) fn take_db_slot(&mut self) -> Option<CountSlot> {
        self.slot.take()
    }

    /// Gives up its place under max_user_connections, as `take_db_slot`.
    pub(crate) fn take_user_slot(&mut self) -> Option<CountSlot> {
        self.user_slot.take()
    }

    /// When the connection retires (server_lifetime).
    pub(crate) fn retire_at(&self) -> Instant {
        self.retire_at
    }

    /// When the connection was last used (released to the pool, or checked).
    pub(crate) fn last_used(&self) -> Instant {
        self.last_used
    }

    /// The connection was used at `now`.
    pub(crate) fn used_at(&mut self, now: Instant) {
        self.last_used = now;
    }

    /// When a client's checkout last took the connection from the pool.
    pub(crate) fn taken_at(&self) -> Instant {
        self.taken_at
    }

    /// A client's checkout took the connection at `at` (its transaction time
    /// starts there).
    pub(crate) fn taken(&mut self, at: Instant) {
        self.taken_at = at;
    }

    /// It is lent to a transaction of fingerprint `fp` (non-zero): the
    /// errors counted for it start now.
    pub(crate) fn lent_for(&mut self, fp: u64) {
        self.query = fp;
        self.conv.take_errors();
    }

    /// Back from a loan: the fingerprint it was lent for (if any), and the
    /// errors the server sent meanwhile.
    pub(crate) fn take_query(&mut self) -> Option<(u64, u8)> {
        match std::mem::take(&mut self.query) {
            0 => None,
            fp => Some((fp, self.conv.take_errors())),
        }
    }

    /// What the connection was opened with (or, after a reload, what the
    /// pool would open it with now).
    pub(crate) fn spec(&self) -> &Arc<ConnectSpec> {
        &self.spec
    }

    /// After a reload: the connection carries the pool's current spec, so
    /// the watchdog settings in it apply from its next loan. The open
    /// connection itself is unchanged.
    pub(crate) fn respec(&mut self, spec: Arc<ConnectSpec>) {
        self.spec = spec;
    }

    pub fn backend_pid(&self) -> i32 {
        self.cancel.pid
    }

    /// Closes the connection, counting the close once with `reason`.
    pub fn close(self, reason: CloseReason) {
        crate::span::client_event!(
            debug,
            server = self.id,
            pid = self.cancel.pid,
            reason = reason.as_label(),
            "closing server connection"
        );
        self.guard.close(reason);
    }

    /// The metrics of the pool this connection belongs to.
    pub fn metrics(&self) -> &Arc<PoolMetrics> {
        self.guard.pool()
    }

    /// The reason counted if this connection is dropped without `close`.
    pub fn set_close_reason(&mut self, reason: CloseReason) {
        self.guard.set_reason(reason);
    }

    /// The connection has unread bytes or EOF waiting without anyone having
    /// asked: Postgres closed it (FATAL) or something is wrong. Checked on
    /// every checkout, so the common case costs no syscall: the reactor's
    /// read readiness is consulted first (a connection whose last read
    /// drained its socket is not ready until something arrives), and only a
    /// ready one is confirmed with a non-blocking MSG_PEEK (a WouldBlock
    /// clears the stale readiness). Readiness lags the kernel by at most one
    /// reactor turn; a FIN that lands inside that window is found by the
    /// query that then fails, as one landing just after any check would be.
    pub fn has_unexpected_input(&mut self) -> bool {
        if !self.rbuf.is_empty() {
            return true;
        }
        self.stream.peek_ready()
    }
}

/// Opens and logs in one server connection within `spec.connect_timeout`:
/// TCP connect, socket options, startup, authentication and the first
/// ReadyForQuery all count against it.
pub(crate) async fn connect(spec: Arc<ConnectSpec>, metrics: &Arc<PoolMetrics>) -> Result<ServerConn, ConnectError> {
    let mut conn = connect_plain(spec, metrics).await?;
    if conn.spec.connect_query.is_empty() {
        return Ok(conn);
    }
    let sql = conn.spec.connect_query.clone();
    let ran = tokio::time::timeout(conn.spec.connect_timeout, super::exchange::run_checked(&mut conn, &sql)).await;
    let failed = match ran {
        Ok(Ok(None)) => return Ok(conn),
        Ok(Ok(Some(refused))) => refused.message_text(),
        Ok(Err(reason)) => format!("the server connection failed ({reason:?})"),
        Err(_) => "timed out".to_owned(),
    };
    conn.close(CloseReason::ServerError);
    Err(ConnectError::ConnectQuery(failed))
}

/// `connect` without the connect_query.
async fn connect_plain(spec: Arc<ConnectSpec>, metrics: &Arc<PoolMetrics>) -> Result<ServerConn, ConnectError> {
    let started = Instant::now();
    let id = super::next_socket_id();
    let result = tokio::time::timeout(spec.connect_timeout, open(&spec)).await;
    let (stream, rbuf, login) = match result {
        Ok(Ok(v)) => v,
        Ok(Err(e)) => return Err(e),
        Err(_) => return Err(ConnectError::Timeout(spec.connect_timeout)),
    };
    let (addr, local_addr) = match stream.tcp() {
        Some(tcp) => (CancelAddr::Tcp(tcp.peer_addr()?), tcp.local_addr().ok().map(ConnAddr::Tcp)),
        None => (CancelAddr::Unix(socket_path(&spec.host, spec.port).into()), Some(ConnAddr::Unix(spec.port))),
    };
    let mut guard = ServerConnGuard::opened(metrics.clone(), started.elapsed());
    let statements = ServerStatements::default();
    guard.describe(weir_metrics::ServerInfo {
        id,
        pid: login.backend_pid,
        addr: addr.shown(spec.port),
        local_addr,
        connected_at: std::time::SystemTime::now(),
        prepared_statements: statements.shown(),
    });
    let mut params = ParamMap::new();
    for (k, v) in &login.server_params {
        params.set(k, v);
    }
    let key = login.backend_key.into_boxed_slice();
    let cancel = cancel_target(addr, login.backend_pid, key, stream.is_tls().then_some(&spec));
    let now = Instant::now();
    Ok(ServerConn {
        id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
        stream,
        rbuf,
        conv: Conversation::default(),
        params,
        settings: ParamMap::new(),
        matched: None,
        cancel,
        created: now,
        last_used: now,
        taken_at: now,
        query: 0,
        retire_at: now + Duration::from_secs(3600),
        slot: None,
        user_slot: None,
        spec,
        broken: None,
        statements,
        tether: None,
        wants_writes: false,
        refused_write: false,
        guard,
    })
}

fn cancel_target(addr: CancelAddr, pid: i32, key: Box<[u8]>, tls: Option<&ConnectSpec>) -> CancelTarget {
    let tls = tls.and_then(|s| Some((s.tls.clone()?, s.host.clone())));
    CancelTarget { addr, pid, gate: Arc::new(CancelGate::new(key, tls)) }
}
