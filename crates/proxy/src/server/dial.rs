//! Dialling a server: a host name looked up into its addresses (bounded by
//! the caller), and the stream to one host of a database (TCP to the address
//! the pool chose, with socket options and TLS, or a Unix socket). Which
//! host to dial is the pool's choice (`pool::hosts`); a connect spec carries
//! it (`ConnectSpec::aimed`).

use std::net::{IpAddr, SocketAddr};

use tokio::net::{TcpStream, UnixStream};

use super::conn::{socket_path, ConnectError, ConnectSpec};
use super::socket;
use super::stream::ServerStream;

/// The server's one-byte answers to SSLRequest.
const SSL_ACCEPTED: u8 = b'S';
const SSL_REFUSED: u8 = b'N';

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
