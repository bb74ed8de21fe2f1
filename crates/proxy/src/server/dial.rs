//! Dialling a server: everything needed to open one connection
//! (`ConnectSpec`), a host name looked up into its addresses (bounded by the
//! caller), the stream to one host of a database (TCP to the address the
//! pool chose, with socket options and TLS, or the server's Unix socket),
//! the login over it, and why that failed (`ConnectError`). Which host to
//! dial is the pool's choice (`pool::hosts`); a connect spec carries it
//! (`ConnectSpec::aimed`). What the pool keeps of a connection once it is
//! open is `conn::ServerConn`; the cancel forwarder, the liveness probe and
//! the role check dial here too.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use tokio::net::{TcpStream, UnixStream};
use weir_metrics::{ConnectFailure, ConnectRefusal};

use super::handshake::{login, LoginError, LoginParams, LoginResult};
use super::socket::{self, Liveness};
use super::stream::ServerStream;
use super::watch::{ProbeRoom, Watch};
use crate::protocol::startup::NEWEST_MINOR;
use crate::protocol::{sqlstate, SqlState};

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
    pub probe_room: ProbeRoom,
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

impl ConnectSpec {
    /// This spec, dialling `host` and `port` (at `addr`, when the pool has
    /// looked the name up; else the name is looked up at the connect).
    pub(crate) fn aimed(&self, host: &str, port: u16, addr: Option<SocketAddr>) -> ConnectSpec {
        ConnectSpec { host: host.to_owned(), port, addr, ..self.clone() }
    }

    /// True when `self` and `other` open connections the same way, wherever
    /// each dials (a reload changed nothing a connection carries).
    pub(crate) fn same_settings(&self, other: &ConnectSpec) -> bool {
        // Every field named, so that a new one is not forgotten here.
        let ConnectSpec {
            host: _,
            port: _,
            addr: _,
            user,
            credentials,
            dbname,
            liveness,
            connect_timeout,
            watch,
            tls,
            startup_params,
            connect_query,
            probe_room: _,
            refuses_3_2: _,
        } = self;
        *user == other.user
            && *credentials == other.credentials
            && *dbname == other.dbname
            && *liveness == other.liveness
            && *connect_timeout == other.connect_timeout
            && *watch == other.watch
            && *tls == other.tls
            && *startup_params == other.startup_params
            && *connect_query == other.connect_query
    }

    /// Where this spec dials: the address chosen, else `host:port`.
    pub(crate) fn shown(&self) -> String {
        match self.addr {
            Some(a) => a.to_string(),
            None => format!("{}:{}", self.host, self.port),
        }
    }
}

/// The addresses of `host` (a name or an IP address), in the resolver's
/// order, each once. Unbounded: the caller bounds it (a stuck resolver must
/// not hold anyone past a budget).
pub(crate) async fn resolve(host: &str, port: u16) -> std::io::Result<Vec<SocketAddr>> {
    if let Ok(ip) = host.parse::<IpAddr>() {
        return Ok(vec![SocketAddr::new(ip, port)]);
    }
    let mut addrs: Vec<SocketAddr> = Vec::new();
    for a in tokio::net::lookup_host((host, port)).await? {
        if !addrs.contains(&a) {
            addrs.push(a);
        }
    }
    if addrs.is_empty() {
        return Err(std::io::Error::new(std::io::ErrorKind::NotFound, format!("{host} has no address")));
    }
    Ok(addrs)
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
pub(super) async fn open(spec: &ConnectSpec) -> Result<(ServerStream, BytesMut, LoginResult), ConnectError> {
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
async fn open_with(spec: &ConnectSpec, minor: u16) -> Result<(ServerStream, BytesMut, LoginResult), ConnectError> {
    let mut stream = stream(spec).await?;
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

/// The stream to the server `spec` aims at (a `host` starting with `/` is
/// the server's Unix socket, never TLS, as libpq), before the startup
/// packet. Unbounded (callers bound it).
pub(super) async fn stream(spec: &ConnectSpec) -> Result<ServerStream, ConnectError> {
    if spec.host.starts_with('/') {
        return Ok(ServerStream::Unix(UnixStream::connect(socket_path(&spec.host, spec.port)).await?));
    }
    let tcp = tcp(spec).await?;
    socket::apply(&tcp, &spec.liveness)?;
    match &spec.tls {
        Some(tls) => negotiate_tls(tcp, tls, &spec.host).await,
        None => Ok(ServerStream::Plain(tcp)),
    }
}

/// A TCP connection to the address chosen, else to `host:port` (looked up now).
pub(super) async fn tcp(spec: &ConnectSpec) -> std::io::Result<TcpStream> {
    match spec.addr {
        Some(addr) => TcpStream::connect(addr).await,
        None => TcpStream::connect((spec.host.as_str(), spec.port)).await,
    }
}

/// The server's one-byte answers to SSLRequest.
const SSL_ACCEPTED: u8 = b'S';
const SSL_REFUSED: u8 = b'N';

/// SSLRequest, then exactly one byte: `S` starts the handshake (anything
/// the server sent after its `S` is read by rustls as TLS records and fails
/// the handshake, never taken as plaintext: CVE-2021-23222's class); `N`
/// continues in plaintext only with `prefer`.
pub(super) async fn negotiate_tls(
    mut tcp: TcpStream,
    tls: &crate::tls::ServerTls,
    host: &str,
) -> Result<ServerStream, ConnectError> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let fail = |why: String| ConnectError::Tls { mode: tls.mode.as_str(), why };
    tcp.write_all(&crate::protocol::messages::encryption_request(crate::protocol::tags::startup::SSL_REQUEST)).await?;
    match tcp.read_u8().await? {
        SSL_ACCEPTED => {}
        SSL_REFUSED if tls.mode == crate::config::ServerTlsMode::Prefer => return Ok(ServerStream::Plain(tcp)),
        SSL_REFUSED => return Err(fail("the server does not accept TLS".into())),
        other => return Err(fail(format!("unexpected answer to SSLRequest: byte {other:#04x}"))),
    }
    let name = rustls::pki_types::ServerName::try_from(host.to_owned())
        .map_err(|e| fail(format!("host \"{host}\" is not a valid TLS server name: {e}")))?;
    let connector = tls.connector.as_ref().map_err(|e| fail(e.clone()))?;
    let stream = connector.connect(name, tcp).await.map_err(|e| fail(crate::tls::explain(&e, "server")))?;
    Ok(ServerStream::Tls(Box::new(stream)))
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

    #[tokio::test]
    async fn addresses_resolve_without_a_lookup_and_names_through_one() {
        assert_eq!(resolve("127.0.0.2", 5).await.unwrap(), vec!["127.0.0.2:5".parse().unwrap()]);
        assert_eq!(resolve("::1", 5).await.unwrap(), vec!["[::1]:5".parse().unwrap()]);
        let local = resolve("localhost", 7).await.unwrap();
        assert!(!local.is_empty() && local.iter().all(|a| a.ip().is_loopback() && a.port() == 7), "{local:?}");
        let mut seen = local.clone();
        seen.dedup();
        assert_eq!(seen.len(), local.len(), "each address once");
    }
}
