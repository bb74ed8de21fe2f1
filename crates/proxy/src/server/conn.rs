//! One server connection: connect with a bound on the whole handshake, apply
//! socket options, log in, and carry the state the pool and sessions need
//! (including the spec it was opened with, for watchdog probes, and whether
//! someone found it broken).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use weir_metrics::{CloseReason, ConnAddr, ConnectFailure, ConnectRefusal, PoolMetrics, ServerConnGuard};

use super::cancel::{CancelAddr, CancelGate, CancelTarget};
use super::conversation::Conversation;
use super::handshake::{login, LoginError, LoginParams};
use super::probe::Watch;
use super::socket::Liveness;
use super::statements::ServerStatements;
use super::stream::ServerStream;
use crate::params::ParamMap;
use crate::protocol::startup::NEWEST_MINOR;
use crate::protocol::{sqlstate, SqlState};

static NEXT_ID: AtomicU64 = AtomicU64::new(1);

/// Everything needed to open one server connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConnectSpec {
    /// The host to dial: a name or address (also the TLS server name), or a
    /// Unix socket folder starting with `/`.
    pub host: String,
    pub port: u16,
    /// The address the pool chose for `host` (one of its addresses); None:
    /// `host` is looked up at the connect.
    pub addr: Option<std::net::SocketAddr>,
    pub user: String,
    pub credentials: crate::auth::Credentials,
    pub dbname: String,
    pub liveness: Liveness,
    pub connect_timeout: Duration,
    /// Watchdog settings for conversations on connections opened with this spec.
    pub watch: Watch,
    /// TLS towards the server (server_tls_sslmode); None: plain TCP.
    pub tls: Option<Arc<crate::tls::ServerTls>>,
    /// Startup parameters sent to the server (a database's application_name,
    /// client_encoding, datestyle, timezone).
    pub startup_params: Vec<(String, String)>,
    /// Run once after login (a database's connect_query); empty: none.
    pub connect_query: String,
    /// Where the silence probe's connection counts (the pool's places).
    pub probe_room: super::probe::ProbeRoom,
    /// Set once the server has refused a protocol 3.2 startup outright (a
    /// pooler that does not negotiate, such as PgBouncer 1.18): its
    /// connections then ask for 3.0.
    pub refuses_3_2: Learned,
}

/// A fact learned from the server, not configured: copied with the spec,
/// and never a difference between two specs.
#[derive(Debug, Default)]
pub struct Learned(std::sync::atomic::AtomicBool);

impl Learned {
    fn get(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }

    fn set(&self) {
        self.0.store(true, Ordering::Relaxed)
    }
}

impl Clone for Learned {
    fn clone(&self) -> Self {
        Learned(self.get().into())
    }
}

impl PartialEq for Learned {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for Learned {}

/// Why a connect failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ConnectError {
    #[error("connecting to the server timed out after {0:?}")]
    Timeout(Duration),
    #[error("could not connect to the server: {0}")]
    Io(#[from] std::io::Error),
    #[error("server login failed: {0}")]
    Login(#[from] LoginError),
    /// server_tls_sslmode could not be met: no TLS offered, a certificate
    /// that does not verify, a failed handshake.
    #[error("server TLS (server_tls_sslmode = {mode}): {why}")]
    Tls { mode: &'static str, why: String },
    /// The database's connect_query failed.
    #[error("connect_query failed: {0}")]
    ConnectQuery(String),
    /// No host of the database matched its target_session_attrs within
    /// server_connect_timeout (what each was found to be).
    #[error("no host matches target_session_attrs = {target} ({hosts})")]
    NoMatchingHost { target: &'static str, hosts: String },
    /// The login of the database's search for a host was refused: Postgres's
    /// SQLSTATE and message.
    #[error("server login failed: {message}")]
    Rejected { code: SqlState, message: String },
}

impl ConnectError {
    /// PgBouncer's words for a connect that never logged in, in its
    /// `closing because:` line: "connect timeout" or "connect failed".
    pub(crate) fn close_reason(&self) -> &'static str {
        match self {
            ConnectError::Timeout(_) => "connect timeout",
            _ => "connect failed",
        }
    }

    pub(crate) fn failure_label(&self) -> ConnectFailure {
        match self {
            ConnectError::Timeout(_) => ConnectFailure::Timeout,
            ConnectError::Io(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => ConnectFailure::Refused,
            ConnectError::Io(_) => ConnectFailure::Io,
            ConnectError::Login(e) if e.is_auth_failure() => ConnectFailure::Auth,
            ConnectError::Login(_) | ConnectError::Tls { .. } | ConnectError::ConnectQuery(_) => {
                ConnectFailure::Protocol
            }
            ConnectError::NoMatchingHost { .. } => ConnectFailure::NoMatchingHost,
            ConnectError::Rejected { .. } => ConnectFailure::Auth,
        }
    }

    /// The server could not be reached, or is starting up or shutting
    /// down (57P03): its host counts as unreachable. Any other error came
    /// from a server that answered.
    pub(crate) fn unreachable(&self) -> bool {
        match self {
            ConnectError::Timeout(_) | ConnectError::Io(_) => true,
            ConnectError::Login(LoginError::Eof | LoginError::Io(_)) => true,
            ConnectError::Login(LoginError::Server { code, .. }) => code == sqlstate::CANNOT_CONNECT_NOW.code(),
            _ => false,
        }
    }

    /// Which limit Postgres named, if it refused the login with 53300 (too
    /// many connections): backpressure the pool backs off from, not a failure.
    pub(crate) fn refusal(&self) -> Option<ConnectRefusal> {
        let ConnectError::Login(LoginError::Server { code, message }) = self else { return None };
        (code.as_str() == sqlstate::TOO_MANY_CONNECTIONS.code()).then(|| refusal_reason(message))
    }

    /// A login Postgres (or weir's credentials) refused, as PgBouncer tells
    /// its waiting clients: the SQLSTATE and Postgres's own message. Also a
    /// server that breaks the protocol, a TLS requirement it cannot meet and
    /// a failing connect_query, which no retry mends. None for a connect
    /// error (refused, timeout, reset, a connection closed during login),
    /// which is retried while clients wait, and for 57P03 (the database
    /// system is starting up or shutting down), which PgBouncer also treats
    /// as temporary.
    pub(crate) fn rejection(&self) -> Option<(SqlState, String)> {
        match self {
            ConnectError::Timeout(_) | ConnectError::Io(_) | ConnectError::NoMatchingHost { .. } => None,
            ConnectError::Rejected { code, message } => Some((*code, message.clone())),
            ConnectError::Tls { .. } | ConnectError::ConnectQuery(_) => Some((self.sqlstate(), self.to_string())),
            ConnectError::Login(e) => match e {
                LoginError::Server { code, .. } if code == sqlstate::CANNOT_CONNECT_NOW.code() => None,
                // Too many connections: backpressure (`refusal`), not a rejection.
                LoginError::Server { code, .. } if code == sqlstate::TOO_MANY_CONNECTIONS.code() => None,
                LoginError::Eof | LoginError::Io(_) => None,
                LoginError::Server { .. }
                | LoginError::NoPassword
                | LoginError::WrongCredentials { .. }
                | LoginError::StaleVerifier
                | LoginError::WrongPasswordType
                | LoginError::Protocol(_) => Some((e.sqlstate(), e.client_message())),
            },
        }
    }

    /// The SQLSTATE a waiting client sees when this is why it got no server.
    pub(crate) fn sqlstate(&self) -> SqlState {
        match self {
            ConnectError::Login(e) => e.sqlstate(),
            ConnectError::Rejected { code, .. } => *code,
            _ => sqlstate::SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
        }
    }
}

/// The limit a 53300 message names (Postgres's texts, 15 to 18).
fn refusal_reason(message: &str) -> ConnectRefusal {
    if message.contains("too many connections for role") {
        ConnectRefusal::RoleLimit
    } else if message.contains("too many connections for database") {
        ConnectRefusal::DatabaseLimit
    } else if message.contains("too many clients already") {
        ConnectRefusal::MaxConnections
    } else if message.contains("connection slots are reserved") {
        ConnectRefusal::ReservedSlots
    } else {
        ConnectRefusal::Other
    }
}

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
    pub(crate) last_used: Instant,
    /// When a client's checkout last took this connection from the pool
    /// (that client's transaction time starts there; see `pool::Lease`).
    pub(crate) taken_at: Instant,
    /// When this connection retires (server_lifetime with jitter).
    pub(crate) retire_at: Instant,
    /// Holds this connection's place in its database's connection count.
    pub(crate) slot: Option<CountSlot>,
    /// Its place under max_user_connections.
    pub(crate) user_slot: Option<CountSlot>,
    /// What it was opened with (the pool's upkeep refreshes it after a reload).
    pub(crate) spec: Arc<ConnectSpec>,
    /// Set by whoever found the connection unusable (a watchdog): the pool
    /// closes it with this reason instead of recovering it.
    pub(crate) broken: Option<CloseReason>,
    /// weir's prepared statements on this server (transaction mode).
    pub(crate) statements: ServerStatements,
    /// Its place among its host's servers (`tether`): the pool ends it at
    /// once when the host fails over.
    pub(crate) tether: Option<super::tether::Tether>,
    /// Its database wants writes (target_session_attrs = read-write): a
    /// 25006 from it retires it when released.
    pub(crate) wants_writes: bool,
    /// It refused a write (25006) during this loan. Weighed when released,
    /// with the parameters it has reported by then (the ParameterStatus that
    /// says it turned read-only may come after the error).
    pub(crate) refused_write: bool,
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

/// The Unix socket of a Postgres whose `host` is the folder `dir`, as libpq
/// names it: `<dir>/.s.PGSQL.<port>`.
pub(crate) fn socket_path(dir: &str, port: u16) -> PathBuf {
    Path::new(dir).join(format!(".s.PGSQL.{port}"))
}

/// Connect (TCP with socket options, or a `host` starting with `/`: the
/// server's Unix socket, never TLS, as libpq) and login, unbounded (callers
/// bound it). Bytes the server sent after ReadyForQuery stay in the
/// returned buffer.
pub(super) async fn open(
    spec: &ConnectSpec,
) -> Result<(ServerStream, BytesMut, super::handshake::LoginResult), ConnectError> {
    if spec.refuses_3_2.get() {
        return open_with(spec, 0).await;
    }
    match open_with(spec, NEWEST_MINOR).await {
        Err(ConnectError::Login(e)) if e.refuses_version() => {
            tracing::info!(server = %spec.shown(), error = %e, "the server refused protocol 3.2; using 3.0");
            spec.refuses_3_2.set();
            open_with(spec, 0).await
        }
        other => other,
    }
}

/// `open`, asking for protocol 3.`minor`.
async fn open_with(
    spec: &ConnectSpec,
    minor: u16,
) -> Result<(ServerStream, BytesMut, super::handshake::LoginResult), ConnectError> {
    let mut stream = super::dial::stream(spec).await?;
    let mut buf = BytesMut::with_capacity(8192);
    let params = LoginParams {
        user: &spec.user,
        credentials: &spec.credentials,
        database: &spec.dbname,
        startup_params: &spec.startup_params,
        minor,
    };
    let result = login(&mut stream, &mut buf, &params).await?;
    Ok((stream, buf, result))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refused(message: &str) -> Option<ConnectRefusal> {
        let e = LoginError::Server { code: sqlstate::TOO_MANY_CONNECTIONS.code().into(), message: message.into() };
        ConnectError::Login(e).refusal()
    }

    #[test]
    fn a_connect_that_never_logged_in_closes_in_pgbouncer_words() {
        assert_eq!(ConnectError::Timeout(Duration::from_secs(2)).close_reason(), "connect timeout");
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(ConnectError::Io(refused).close_reason(), "connect failed");
    }

    #[test]
    fn refusals_are_classified_by_the_limit_postgres_names() {
        assert_eq!(refused("too many connections for role \"app\""), Some(ConnectRefusal::RoleLimit));
        assert_eq!(refused("too many connections for database \"db\""), Some(ConnectRefusal::DatabaseLimit));
        assert_eq!(refused("sorry, too many clients already"), Some(ConnectRefusal::MaxConnections));
        let reserved = "remaining connection slots are reserved for roles with the SUPERUSER attribute";
        assert_eq!(refused(reserved), Some(ConnectRefusal::ReservedSlots));
        assert_eq!(refused("something new"), Some(ConnectRefusal::Other));
        let other = LoginError::Server { code: "28P01".into(), message: "too many clients already".into() };
        assert_eq!(ConnectError::Login(other).refusal(), None, "only 53300 is a refusal");
    }
}
