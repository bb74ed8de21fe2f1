//! A client's login: the startup packet (TLS or its refusal, cancel requests,
//! protocol version), startup parameters, authentication against the
//! auth_file, and the greeting (AuthenticationOk, ParameterStatus,
//! BackendKeyData, ReadyForQuery) in one write.

use std::pin::Pin;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::time::Sleep;
use weir_metrics::ClientResult;

use super::error::ClientError;
use super::stream::ClientStream;
use crate::config::Config;
use crate::params::{self, ParamMap, TRACKED};
use crate::pool::Pool;
use crate::protocol::{
    messages::{self, Severity},
    sqlstate,
    startup::{self, StartupPacket},
    tags::{auth, status},
};
use crate::server::exchange;
use crate::state::Shared;
use crate::tls::ClientTls;
use crate::wire;

/// The byte that refuses SSLRequest and GSSENCRequest.
const REFUSE_ENCRYPTION: u8 = b'N';

/// The byte that accepts SSLRequest: the TLS handshake follows.
const ACCEPT_SSL: u8 = b'S';

/// The first byte of a TLS record carrying a handshake (a ClientHello sent
/// straight away: Postgres 17's `sslnegotiation=direct`).
const TLS_HANDSHAKE_RECORD: u8 = 0x16;

/// Startup parameter with which a client declares its own deadline.
pub const DEADLINE_PARAM: &str = "weir.client_deadline";

/// The first packet that matters. Not boxed: it lives only until the
/// caller matches on it, and a box would cost every login an allocation.
#[allow(clippy::large_enum_variant)]
pub enum First {
    /// A CancelRequest: its key is 4 bytes (3.0) or longer (3.2).
    Cancel { pid: i32, key: bytes::Bytes },
    /// A StartupMessage, its parameters sorted by `interpret`; `minor` is
    /// the version negotiated (NegotiateProtocolVersion, if due, is sent).
    Startup { minor: u16, req: Request },
}

/// Reads the startup packet. SSLRequest gets `S` and a TLS handshake when
/// client TLS is configured, `N` otherwise; GSSENCRequest always `N`. A
/// client that opens with a TLS ClientHello (direct TLS) gets the handshake
/// at once, and must have negotiated ALPN "postgresql". With a mode that
/// requires TLS, a plaintext startup packet is refused (cancels are not:
/// they carry only the key, as in Postgres). A Unix-socket client is never
/// offered TLS nor required to use it (as in Postgres and PgBouncer).
pub async fn read_startup(
    stream: &mut ClientStream,
    buf: &mut BytesMut,
    tls: Option<&ClientTls>,
    cfg: &Config,
) -> Result<First, ClientError> {
    let tls = tls.filter(|_| !stream.is_unix());
    if let Some(tls) = tls {
        if starts_with_client_hello(stream).await? {
            handshake(stream, tls).await?;
            if stream.alpn().as_deref() != Some(crate::tls::ALPN_POSTGRESQL) {
                tracing::info!("direct TLS without ALPN \"postgresql\": closed");
                return Err(ClientError::Gone);
            }
        }
    }
    loop {
        let packet = wire::read_startup_packet(stream, buf).await?;
        match startup::parse(&packet)? {
            StartupPacket::SslRequest | StartupPacket::GssEncRequest if !buf.is_empty() => {
                // Bytes sent before the answer to an encryption request
                // would be accepted as plaintext (CVE-2021-23222's class).
                return Err(crate::protocol::ProtocolError::TrailingBytes.into());
            }
            StartupPacket::SslRequest if tls.is_some() && !stream.is_tls() => {
                stream.write_all(&[ACCEPT_SSL]).await.map_err(ClientError::Io)?;
                handshake(stream, tls.expect("checked")).await?;
            }
            StartupPacket::SslRequest | StartupPacket::GssEncRequest => {
                stream.write_all(&[REFUSE_ENCRYPTION]).await.map_err(ClientError::Io)?;
            }
            StartupPacket::Cancel { pid, key } => {
                return Ok(First::Cancel { pid, key: packet.slice_ref(key) });
            }
            _ if tls.is_some_and(|t| t.mode.required()) && !stream.is_tls() => return Err(ClientError::TlsRequired),
            StartupPacket::Startup { major: 3, minor, params } => {
                let req = interpret(&params, cfg)?;
                negotiate(stream, minor, &req.protocol_options).await?;
                return Ok(First::Startup { minor: startup::negotiated_minor(minor), req });
            }
            StartupPacket::Startup { major, minor, .. } => return Err(ClientError::UnsupportedProtocol(major, minor)),
        }
    }
}

/// Sends NegotiateProtocolVersion when it is due, before authentication, as
/// Postgres 18 does: weir's newest version (3.2), or the client's if older,
/// as a whole version number, and every `_pq_.` option the client sent (weir
/// knows none).
async fn negotiate(stream: &mut ClientStream, requested: u16, options: &[String]) -> Result<(), ClientError> {
    if !startup::needs_negotiation(requested, options.len()) {
        return Ok(());
    }
    let version = (3 << 16) | i32::from(startup::negotiated_minor(requested));
    let opts: Vec<&str> = options.iter().map(String::as_str).collect();
    let mut out = BytesMut::new();
    messages::negotiate_protocol_version(&mut out, version, &opts);
    stream.write_all(&out).await.map_err(ClientError::Io)
}

/// Whether the client's first byte opens a TLS handshake (without reading it).
async fn starts_with_client_hello(stream: &ClientStream) -> Result<bool, ClientError> {
    let Some(tcp) = stream.tcp() else { return Err(ClientError::Gone) };
    let mut first = [0u8; 1];
    match tcp.peek(&mut first).await.map_err(ClientError::Io)? {
        0 => Err(ClientError::Gone),
        _ => Ok(first[0] == TLS_HANDSHAKE_RECORD),
    }
}

/// The TLS handshake; a failure (a client certificate that does not verify,
/// no common protocol) is logged and closes the connection: no plaintext
/// error can follow a failed handshake. Its (large) state is boxed, so a
/// plaintext login does not carry it in `read_startup`'s future.
async fn handshake(stream: &mut ClientStream, tls: &ClientTls) -> Result<(), ClientError> {
    Box::pin(stream.upgrade(&tls.acceptor)).await.map_err(|e| {
        tracing::info!(error = crate::tls::explain(&e, "client"), "client TLS handshake failed");
        ClientError::Io(e)
    })
}

/// What a client asked for at startup.
#[derive(Debug, Clone, Default)]
pub struct Request {
    pub user: String,
    pub database: String,
    /// Tracked parameters the client set.
    pub params: ParamMap,
    /// Other settings the client set (from `options` or plain parameters).
    pub settings: ParamMap,
    pub declared_deadline: Option<Duration>,
    /// `_pq_.*` protocol options, which weir does not support.
    pub protocol_options: Vec<String>,
}

/// Sorts the startup parameters. Nothing is silently lost: each is used,
/// applied to servers, explicitly ignored by config, or refused.
pub fn interpret(raw: &[(&str, &str)], cfg: &Config) -> Result<Request, ClientError> {
    let mut req = Request::default();
    for &(k, v) in raw {
        match k {
            "user" => v.clone_into(&mut req.user),
            "database" => v.clone_into(&mut req.database),
            "options" => {
                for (name, value) in params::parse_options(v).map_err(ClientError::BadStartupParameter)? {
                    take_setting(&mut req, &name, &value, cfg)?;
                }
            }
            "replication" if v != "false" && v != "0" => {
                return Err(ClientError::BadStartupParameter(
                    "replication connections are not supported by weir".into(),
                ))
            }
            "replication" => {}
            _ if k.starts_with("_pq_.") => req.protocol_options.push(k.to_owned()),
            _ => take_setting(&mut req, k, v, cfg)?,
        }
    }
    if req.user.is_empty() {
        return Err(ClientError::NoUser);
    }
    if req.database.is_empty() {
        req.database = req.user.clone();
    }
    Ok(req)
}

/// Where one startup setting goes: weir's declared deadline, dropped
/// (ignore_startup_parameters), a tracked parameter, a setting applied on
/// every server (track_extra_parameters), or refused. Nothing reaches
/// Postgres before the client has authenticated.
fn take_setting(req: &mut Request, name: &str, value: &str, cfg: &Config) -> Result<(), ClientError> {
    let listed = |list: &[String]| list.iter().any(|p| p.eq_ignore_ascii_case(name));
    let tracked = TRACKED.iter().find(|t| t.eq_ignore_ascii_case(name));
    if name.eq_ignore_ascii_case(DEADLINE_PARAM) {
        let d = humantime::parse_duration(value)
            .map_err(|e| ClientError::BadStartupParameter(format!("invalid {DEADLINE_PARAM} \"{value}\": {e}")))?;
        req.declared_deadline = Some(d);
    } else if listed(&cfg.weir.ignore_startup_parameters) {
    } else if let Some(canonical) = tracked {
        req.params.set(canonical, value);
    } else if listed(&cfg.weir.track_extra_parameters) && params::valid_name(name) {
        req.settings.set(&name.to_ascii_lowercase(), value);
    } else {
        return Err(ClientError::BadStartupParameter(format!("unsupported startup parameter: {name}")));
    }
    Ok(())
}

/// Parameters Postgres reports that no client can change: never synced.
const FIXED: &[&str] = &[
    "server_version",
    "server_encoding",
    "integer_datetimes",
    "is_superuser",
    "session_authorization",
    "in_hot_standby",
];

/// The client's reported parameters: its own values over the server's
/// defaults, for every one a client can change (a SET of any of them, such
/// as default_transaction_read_only, is then undone on the next client's
/// server).
pub fn client_params(req: &Request, server: &ParamMap) -> ParamMap {
    let mut p = ParamMap::new();
    for name in TRACKED {
        if let Some(v) = req.params.get(name).or_else(|| server.get(name)) {
            p.set(name, v);
        }
    }
    let listed = |list: &[&str], k: &str| list.iter().any(|f| f.eq_ignore_ascii_case(k));
    for (k, v) in server.iter().filter(|(k, _)| !listed(FIXED, k) && !listed(TRACKED, k)) {
        p.set(k, v);
    }
    p
}

/// Tracked parameters that take any value, so need no check at login.
const ANY_VALUE: &[&str] = &["application_name"];

/// Applies the client's startup settings and parameter values on a server
/// once, at login, so a name or value Postgres refuses is refused now, with
/// Postgres's own SQLSTATE and message (as Postgres does at connection
/// start), instead of failing silently on every later server. Costs one
/// round trip on a pooled server, and only when the client asked for
/// something other than the server's defaults. The client's tracked
/// parameters take the server's spelling (DateStyle "ISO" is "ISO, MDY").
pub async fn check_startup_settings(
    pool: &Arc<Pool>,
    deadline: Instant,
    params: &mut ParamMap,
    settings: &ParamMap,
    server_defaults: &ParamMap,
) -> Result<(), ClientError> {
    let needs_check = !settings.is_empty()
        || params.iter().any(|(k, v)| !ANY_VALUE.contains(&k) && server_defaults.get(k) != Some(v));
    if !needs_check {
        return Ok(());
    }
    let mut lease = pool.acquire(deadline).await?;
    let conn = lease.conn_mut();
    let Some(sql) = ParamMap::sync_sql(params, settings, &conn.params, &conn.settings) else { return Ok(()) };
    match exchange::run_checked(conn, &sql).await {
        Err(reason) => {
            lease.close(reason);
            Err(ClientError::ServerLost)
        }
        Ok(Some(refused)) => Err(ClientError::RefusedSetting {
            code: sqlstate::lookup(&refused.code).unwrap_or(sqlstate::INVALID_PARAMETER_VALUE),
            message: refused.message_text(),
        }),
        Ok(None) => {
            conn.settings = settings.clone();
            let names: Vec<String> = params.iter().map(|(k, _)| k.to_owned()).collect();
            for k in names {
                if let Some(v) = conn.params.get(&k) {
                    params.set(&k, v);
                }
            }
            Ok(())
        }
    }
}

/// Room for a whole greeting (Postgres reports about 15 parameters).
const GREETING_CAPACITY: usize = 1024;

/// AuthenticationOk, every ParameterStatus, BackendKeyData and ReadyForQuery,
/// in one buffer: the server's parameters with the client's values, then
/// any the client has and the server does not report. The key is the pid
/// and weir's secret (4 bytes, or 32 for a 3.2 client).
pub fn greeting(server: &ParamMap, client: &ParamMap, key: (i32, &[u8])) -> BytesMut {
    let mut out = BytesMut::with_capacity(GREETING_CAPACITY);
    messages::authentication(&mut out, auth::OK, &[]);
    let mut overridden = 0;
    for (k, v) in server.iter() {
        let value = client.get(k).inspect(|_| overridden += 1);
        messages::parameter_status(&mut out, k, value.unwrap_or(v));
    }
    if overridden < client.len() {
        for (k, v) in client.iter().filter(|(k, _)| server.get(k).is_none()) {
            messages::parameter_status(&mut out, k, v);
        }
    }
    messages::backend_key(&mut out, key.0, key.1);
    messages::ready_for_query(&mut out, status::IDLE);
    out
}

/// How long a refused client's unread bytes are drained after its FATAL.
const ERROR_LINGER: Duration = Duration::from_millis(500);

/// Closes after a FATAL without losing it to a reset: closing a socket with
/// unread input sends RST, which can discard the error before the client
/// reads it. So FIN first, then read and drop what the client still sends
/// until it closes too (or briefly).
pub(crate) async fn close_after_error(socket: &mut ClientStream) {
    let _ = socket.shutdown().await;
    let mut sink = [0u8; 4096];
    let drain = async {
        while let Ok(n) = socket.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(ERROR_LINGER, drain).await;
}

/// How long a client that left mid-query is given to close its end first.
const CLIENT_CLOSE_LINGER: Duration = Duration::from_secs(1);

/// After a client left mid-query (Terminate, or EOF): waits, briefly, for
/// its own close before weir closes. Postgres reads a Terminate only once the
/// running query is done, so a client that sends Terminate and then closes
/// (libpq's PQfinish) never sees the server's FIN in between; one from weir
/// would wake a wait on the socket that the client is closing (psycopg then
/// reports "connection pointer is NULL" instead of "connection socket
/// closed"). Bytes still sent are dropped.
pub(crate) async fn await_client_close(socket: &mut ClientStream) {
    let mut sink = [0u8; 1024];
    let drain = async {
        while let Ok(n) = socket.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(CLIENT_CLOSE_LINGER, drain).await;
}

/// Sends a FATAL and closes (see `close_after_error`).
pub(crate) async fn fatal_and_close(socket: &mut ClientStream, code: crate::protocol::SqlState, message: &str) {
    let mut out = BytesMut::new();
    messages::error_response(&mut out, Severity::Fatal, code, message);
    if socket.write_all(&out).await.is_ok() {
        close_after_error(socket).await;
    }
}

/// Counts a login attempt in weir_client_connections_total by its result.
pub(crate) fn count_login<T>(shared: &Shared, login: &Result<T, ClientError>) {
    let result = match login {
        Ok(_) => ClientResult::Ok,
        Err(ClientError::Auth(_)) => ClientResult::AuthFailed,
        Err(_) => ClientResult::Refused,
    };
    shared.cancels.metrics.record_client_connection(result);
}

/// Runs `f` until the login timer fires (LoginTimeout then).
pub(crate) async fn within<T>(
    timer: Pin<&mut Sleep>,
    f: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    crate::pool::within(timer, f).await.unwrap_or(Err(ClientError::LoginTimeout))
}

/// Whom `trust` admits: the auth_file's users when there is an auth_file
/// (PgBouncer's rule), anyone when there is none.
pub(crate) fn trust_names(cfg: &Config) -> crate::auth::TrustNames {
    match cfg.weir.auth_file {
        Some(_) => crate::auth::TrustNames::Listed,
        None => crate::auth::TrustNames::Any,
    }
}

/// How this client authenticates: auth_type, or with auth_type = "hba" the
/// first matching line of auth_hba_file (a `reject` line or no line: refused).
pub(crate) fn auth_method(
    shared: &Shared,
    cfg: &Config,
    peer: weir_metrics::ConnAddr,
    tls: bool,
    req: &Request,
) -> Result<crate::config::AuthType, ClientError> {
    let hba = shared.hba.load();
    Ok(crate::auth::hba::method_for(cfg.weir.auth_type, hba.as_deref(), peer.ip(), tls, &req.database, &req.user)?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        Config::from_toml("[weir]\nauth_type = \"trust\"\n[databases.app]\n", std::path::Path::new(".")).unwrap()
    }

    #[test]
    fn sorts_parameters() {
        let r = interpret(
            &[
                ("user", "bob"),
                ("application_name", "x"),
                ("options", "-c weir.client_deadline=800ms -c search_path=s"),
                ("extra_float_digits", "2"),
                ("datestyle", "ISO"),
            ],
            &cfg(),
        )
        .unwrap();
        assert_eq!(r.database, "bob");
        assert_eq!(r.declared_deadline, Some(Duration::from_millis(800)));
        assert_eq!(r.params.get("application_name"), Some("x"));
        assert_eq!(r.params.get("DateStyle"), Some("ISO"));
        assert_eq!(r.settings.get("search_path"), Some("s"));
        assert_eq!(r.settings.get("extra_float_digits"), None, "ignored by default config");
    }

    #[test]
    fn refuses_what_it_cannot_honour() {
        assert!(matches!(interpret(&[("database", "x")], &cfg()), Err(ClientError::NoUser)));
        let bad = interpret(&[("user", "u"), ("weir.bogus", "1")], &cfg());
        assert!(matches!(bad, Err(ClientError::BadStartupParameter(_))));
        let repl = interpret(&[("user", "u"), ("replication", "database")], &cfg());
        assert!(matches!(repl, Err(ClientError::BadStartupParameter(_))));
    }

    #[test]
    fn only_the_allow_list_is_forwarded() {
        let unlisted = interpret(&[("user", "u"), ("options", "-c work_mem=1GB")], &cfg());
        match unlisted {
            Err(ClientError::BadStartupParameter(m)) => {
                assert_eq!(m, "unsupported startup parameter: work_mem")
            }
            other => panic!("{other:?}"),
        }
        let plain = interpret(&[("user", "u"), ("enable_seqscan", "off")], &cfg());
        assert!(matches!(plain, Err(ClientError::BadStartupParameter(_))), "plain parameters too");
        let text = "[weir]\nauth_type = \"trust\"\ntrack_extra_parameters = [\"Work_Mem\"]\n[databases.app]\n";
        let allowing = Config::from_toml(text, std::path::Path::new(".")).unwrap();
        let r = interpret(&[("user", "u"), ("options", "-c WORK_MEM=1GB")], &allowing).unwrap();
        assert_eq!(r.settings.get("work_mem"), Some("1GB"));
        let search = interpret(&[("user", "u"), ("search_path", "s")], &allowing);
        assert!(matches!(search, Err(ClientError::BadStartupParameter(_))), "the list replaces the default");
        let text = "[weir]\nauth_type = \"trust\"\nignore_startup_parameters = [\"search_path\"]\n[databases.app]\n";
        let ignoring = Config::from_toml(text, std::path::Path::new(".")).unwrap();
        let r = interpret(&[("user", "u"), ("search_path", "s")], &ignoring).unwrap();
        assert_eq!(r.settings.get("search_path"), None, "a name on both lists is ignored");
    }
}
