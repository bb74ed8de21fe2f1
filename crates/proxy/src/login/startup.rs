//! A client's first packets: the startup packet (TLS or its refusal, direct
//! TLS, cancel requests, the protocol version and its negotiation) and the
//! startup parameters, sorted into what the client asked for (`Request`).

use std::time::Duration;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;

use super::error::ClientError;
use super::stream::ClientStream;
use crate::config::Config;
use crate::params::{self, ParamMap, TRACKED};
use crate::protocol::{
    messages,
    replication::Replication,
    startup::{self, StartupPacket},
};
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
    /// The `replication` parameter: a replication client gets a server of
    /// its own (`crate::replication`).
    pub replication: Replication,
    /// A replication client's `options`, as it sent them: its server is its
    /// alone, so they go to Postgres whole (CREATE SUBSCRIPTION's
    /// `extra_float_digits` among them), as PgBouncer sends them.
    pub raw_options: Option<String>,
}

/// The start of the refusal of a parameter weir does not take (PgBouncer's words).
const UNSUPPORTED: &str = "unsupported startup parameter:";

/// Sorts the startup parameters. Nothing is silently lost: each is used,
/// applied to servers, explicitly ignored by config, or refused.
pub fn interpret(raw: &[(&str, &str)], cfg: &Config) -> Result<Request, ClientError> {
    let mut req = Request::default();
    // First whether this is a replication client, wherever the parameter
    // stands: its `options` are then kept whole, not read.
    for &(_, v) in raw.iter().filter(|(k, _)| *k == "replication") {
        req.replication = Replication::parse(v).ok_or_else(|| {
            ClientError::BadStartupParameter(format!("invalid value for parameter \"replication\": \"{v}\""))
        })?;
    }
    for &(k, v) in raw {
        match k {
            "user" => v.clone_into(&mut req.user),
            "database" => v.clone_into(&mut req.database),
            "options" if req.replication.is_some() => req.raw_options = Some(v.to_owned()),
            "options" => {
                // With `options` in ignore_startup_parameters, what weir cannot
                // use in it is dropped; what it can is still used (PgBouncer's).
                let lenient = cfg.weir.ignore_startup_parameters.iter().any(|p| p.eq_ignore_ascii_case("options"));
                for (name, value) in params::parse_options(v).map_err(ClientError::BadStartupParameter)? {
                    match take_setting(&mut req, &name, &value, cfg) {
                        Err(ClientError::BadStartupParameter(m)) if m.starts_with(UNSUPPORTED) && lenient => {}
                        Err(ClientError::BadStartupParameter(m)) if m.starts_with(UNSUPPORTED) => {
                            let msg = format!("unsupported startup parameter in options: {name}");
                            return Err(ClientError::BadStartupParameter(msg));
                        }
                        other => other?,
                    }
                }
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
        return Err(ClientError::BadStartupParameter(format!("{UNSUPPORTED} {name}")));
    }
    Ok(())
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
        let repl = interpret(&[("user", "u"), ("replication", "maybe")], &cfg());
        assert!(matches!(repl, Err(ClientError::BadStartupParameter(_))));
    }

    #[test]
    fn a_replication_clients_options_are_kept_whole() {
        let opts = "-c extra_float_digits=3 -c work_mem=1GB";
        let r = interpret(&[("user", "u"), ("options", opts), ("replication", "database")], &cfg()).unwrap();
        assert_eq!(r.replication, Replication::Logical);
        assert_eq!(r.raw_options.as_deref(), Some(opts), "read before the parameter that says so");
        assert!(r.settings.is_empty());
        let r = interpret(&[("user", "u"), ("replication", "on"), ("application_name", "a")], &cfg()).unwrap();
        assert_eq!((r.replication, r.params.get("application_name")), (Replication::Physical, Some("a")));
        let r = interpret(&[("user", "u"), ("replication", "false"), ("options", "-c search_path=s")], &cfg()).unwrap();
        assert_eq!((r.replication, r.raw_options), (Replication::None, None));
        assert_eq!(r.settings.get("search_path"), Some("s"));
    }

    #[test]
    fn only_the_allow_list_is_forwarded() {
        let unlisted = interpret(&[("user", "u"), ("options", "-c work_mem=1GB")], &cfg());
        match unlisted {
            Err(ClientError::BadStartupParameter(m)) => {
                assert_eq!(m, "unsupported startup parameter in options: work_mem")
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
