//! weir's own login to a Postgres server, as its client: the startup
//! message, the authentication exchange (trust, cleartext, md5,
//! SCRAM-SHA-256), then ParameterStatus and BackendKeyData up to the first
//! ReadyForQuery.

use bytes::BytesMut;
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use super::scram_client::PassthroughClient;
use crate::auth::Credentials;
use crate::protocol::startup::MAX_CANCEL_KEY_LEN;
use crate::protocol::{messages, sqlstate, tags, Frame, SqlState};
use crate::wire::{self, WireError};

/// Largest message accepted from a server during login.
const MAX_LOGIN_MESSAGE_LEN: usize = 1 << 20;
/// The only SASL mechanism weir uses with servers.
const SCRAM_SHA_256: &str = "SCRAM-SHA-256";

/// What weir needs to log in.
#[derive(Debug, Clone, Copy)]
pub struct LoginParams<'a> {
    pub user: &'a str,
    pub credentials: &'a Credentials,
    pub database: &'a str,
    /// Extra startup parameters (e.g. application_name), already filtered.
    pub startup_params: &'a [(String, String)],
    /// The minor version of protocol 3 asked for; the server may offer an
    /// older one (NegotiateProtocolVersion), which weir then speaks.
    pub minor: u16,
}

/// What the server told weir during login.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct LoginResult {
    pub server_params: Vec<(String, String)>,
    pub backend_pid: i32,
    /// The server's cancel key: 4 bytes in 3.0, longer in 3.2 (32 from Postgres 18).
    pub backend_key: Vec<u8>,
    /// The minor version of protocol 3 the server speaks.
    pub minor: u16,
}

/// Why a login failed.
#[derive(Debug, thiserror::Error)]
pub enum LoginError {
    /// The server sent an ErrorResponse. `code` is empty if it sent no SQLSTATE.
    #[error("server error {code}: {message}")]
    Server { code: String, message: String },
    #[error("the server asked for a password but none is configured")]
    NoPassword,
    /// The server asked for a password and weir holds only a SCRAM
    /// verifier for the user (PgBouncer's words).
    #[error("wrong password type")]
    WrongPasswordType,
    /// The server asked for a method the stored credentials cannot serve
    /// (e.g. cleartext with only a SCRAM ClientKey).
    #[error(
        "the server asked for {asked} authentication, which weir cannot do with the {held} it holds for this user"
    )]
    WrongCredentials { asked: &'static str, held: &'static str },
    /// SCRAM pass-through: the server's salt/iterations are not those of
    /// the verifier the client authenticated against.
    #[error("SCRAM pass-through failed: the server's verifier for this user differs from weir's: its password changed, or the role cannot log in (password expired or unset)")]
    StaleVerifier,
    #[error("server closed the connection during login")]
    Eof,
    #[error("i/o error during login: {0}")]
    Io(#[from] std::io::Error),
    #[error("protocol error during login: {0}")]
    Protocol(String),
}

/// SQLSTATEs a server's code is mapped onto when it is one weir names.
const KNOWN_CODES: &[SqlState] = &[
    sqlstate::INVALID_PASSWORD,
    sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
    sqlstate::INVALID_CATALOG_NAME,
    sqlstate::TOO_MANY_CONNECTIONS,
    sqlstate::CANNOT_CONNECT_NOW,
    sqlstate::ADMIN_SHUTDOWN,
    sqlstate::INSUFFICIENT_PRIVILEGE,
    sqlstate::FEATURE_NOT_SUPPORTED,
    sqlstate::PROTOCOL_VIOLATION,
    sqlstate::INVALID_PARAMETER_VALUE,
    sqlstate::PROGRAM_LIMIT_EXCEEDED,
    sqlstate::CONNECTION_EXCEPTION,
    sqlstate::CONNECTION_FAILURE,
    sqlstate::SQLCLIENT_UNABLE_TO_ESTABLISH_SQLCONNECTION,
    sqlstate::INTERNAL_ERROR,
];

impl LoginError {
    /// The SQLSTATE to forward to clients. A server code weir has no constant
    /// for becomes `08006`; `server_code()` gives the exact one.
    pub fn sqlstate(&self) -> SqlState {
        match self {
            LoginError::Server { code, .. } => {
                KNOWN_CODES.iter().copied().find(|s| s.code() == code).unwrap_or(sqlstate::CONNECTION_FAILURE)
            }
            LoginError::NoPassword | LoginError::WrongCredentials { .. } => {
                sqlstate::INVALID_AUTHORIZATION_SPECIFICATION
            }
            LoginError::StaleVerifier => sqlstate::INVALID_PASSWORD,
            // PgBouncer's code for its own login refusals.
            LoginError::WrongPasswordType => sqlstate::PROTOCOL_VIOLATION,
            LoginError::Eof | LoginError::Io(_) => sqlstate::CONNECTION_FAILURE,
            LoginError::Protocol(_) => sqlstate::PROTOCOL_VIOLATION,
        }
    }

    /// The server's own SQLSTATE, when it sent one.
    #[cfg(test)]
    pub fn server_code(&self) -> Option<&str> {
        match self {
            LoginError::Server { code, .. } if !code.is_empty() => Some(code),
            _ => None,
        }
    }

    /// Whether the server refused the startup packet's protocol version: a
    /// server that does not negotiate answers 3.2 with a protocol violation
    /// (PgBouncer's "bad packet header") or "unsupported frontend protocol".
    pub fn refuses_version(&self) -> bool {
        matches!(self, LoginError::Server { code, .. }
            if code == sqlstate::PROTOCOL_VIOLATION.code() || code == sqlstate::FEATURE_NOT_SUPPORTED.code())
    }

    /// Whether the credentials were refused (or missing): retrying will not
    /// help until the configuration changes.
    pub fn is_auth_failure(&self) -> bool {
        match self {
            LoginError::Server { code, .. } => {
                code == sqlstate::INVALID_PASSWORD.code()
                    || code == sqlstate::INVALID_AUTHORIZATION_SPECIFICATION.code()
            }
            LoginError::NoPassword
            | LoginError::WrongCredentials { .. }
            | LoginError::StaleVerifier
            | LoginError::WrongPasswordType => true,
            _ => false,
        }
    }

    /// A message fit for a client: the server's text for `Server`.
    pub fn client_message(&self) -> String {
        match self {
            LoginError::Server { message, .. } => message.clone(),
            other => format!("server login failed: {other}"),
        }
    }
}

impl From<WireError> for LoginError {
    fn from(e: WireError) -> Self {
        match e {
            WireError::Eof => LoginError::Eof,
            WireError::Io(e) => LoginError::Io(e),
            WireError::Protocol(p) => LoginError::Protocol(p.to_string()),
        }
    }
}

fn protocol(msg: impl Into<String>) -> LoginError {
    LoginError::Protocol(msg.into())
}

/// Logs in on a freshly connected `stream`. Bytes the server sent after
/// ReadyForQuery stay in `buf`.
pub async fn login<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    p: &LoginParams<'_>,
) -> Result<LoginResult, LoginError> {
    let mut out = BytesMut::with_capacity(256);
    write_startup(&mut out, p);
    flush(stream, &mut out).await?;
    let minor = authenticate(stream, buf, &mut out, p).await?;
    let mut result = collect_until_ready(stream, buf).await?;
    result.minor = minor;
    Ok(result)
}

fn write_startup(out: &mut BytesMut, p: &LoginParams<'_>) {
    let mut params = vec![("user", p.user), ("database", p.database)];
    params.extend(p.startup_params.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    messages::startup_message(out, (3 << 16) | i32::from(p.minor), &params);
}

/// The minor version a server's NegotiateProtocolVersion offers: one of 3
/// no newer than asked for (weir asks for no `_pq_.` options, so any it
/// lists are ignored).
fn offered_minor(body: &[u8], asked: u16) -> Result<u16, LoginError> {
    let Some(version) = body.first_chunk::<4>().map(|b| i32::from_be_bytes(*b)) else {
        return Err(protocol("truncated NegotiateProtocolVersion"));
    };
    let (major, minor) = (version >> 16, (version & 0xffff) as u16);
    if major != 3 || minor > asked {
        return Err(protocol(format!("the server offered protocol {major}.{minor}, weir asked for 3.{asked}")));
    }
    Ok(minor)
}

async fn flush<S: AsyncWrite + Unpin>(stream: &mut S, out: &mut BytesMut) -> Result<(), LoginError> {
    stream.write_all(out).await?;
    stream.flush().await?;
    out.clear();
    Ok(())
}

/// Reads the next frame, handling ErrorResponse and skipping NoticeResponse.
async fn next_frame<S: AsyncRead + Unpin>(stream: &mut S, buf: &mut BytesMut) -> Result<Frame, LoginError> {
    loop {
        let frame = wire::read_frame(stream, buf, MAX_LOGIN_MESSAGE_LEN).await?;
        match frame.tag {
            tags::backend::NOTICE_RESPONSE => continue,
            tags::backend::ERROR_RESPONSE => return Err(server_error(frame.body())),
            _ => return Ok(frame),
        }
    }
}

fn server_error(body: &[u8]) -> LoginError {
    match messages::parse_error_fields(body) {
        Ok(f) => LoginError::Server { message: f.message_text(), code: f.code },
        Err(e) => protocol(format!("malformed ErrorResponse: {e}")),
    }
}

/// Splits an Authentication body into its request code and payload.
fn auth_request(frame: &Frame) -> Result<(i32, &[u8]), LoginError> {
    if frame.tag != tags::backend::AUTHENTICATION {
        return Err(protocol(format!(
            "expected an authentication request, got message type {:?}",
            char::from(frame.tag)
        )));
    }
    let Some((code, payload)) = frame.body().split_first_chunk::<4>() else {
        return Err(protocol("truncated authentication request"));
    };
    Ok((i32::from_be_bytes(*code), payload))
}

/// Runs the authentication exchange up to AuthenticationOk; returns the
/// minor version the server speaks (a NegotiateProtocolVersion before the
/// first request may lower the one asked for).
async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    out: &mut BytesMut,
    p: &LoginParams<'_>,
) -> Result<u16, LoginError> {
    let mut scram: Option<Sasl> = None;
    let mut scram_finished = false;
    let mut minor = p.minor;
    let mut first = true;
    loop {
        let frame = next_frame(stream, buf).await?;
        if first && frame.tag == tags::backend::NEGOTIATE_PROTOCOL_VERSION {
            minor = offered_minor(frame.body(), p.minor)?;
            first = false;
            continue;
        }
        first = false;
        let (code, payload) = auth_request(&frame)?;
        match code {
            tags::auth::OK if scram.is_some() && !scram_finished => {
                return Err(protocol("server skipped the SCRAM final message"));
            }
            tags::auth::OK => return Ok(minor),
            tags::auth::CLEARTEXT_PASSWORD => {
                let pw = password(p, "cleartext")?;
                frontend::password_message(pw.as_bytes(), out).map_err(encode_error)?;
            }
            tags::auth::MD5_PASSWORD => {
                let salt: [u8; 4] = payload.try_into().map_err(|_| protocol("bad MD5 salt length"))?;
                let hash = md5_response(p, salt)?;
                frontend::password_message(hash.as_bytes(), out).map_err(encode_error)?;
            }
            tags::auth::SASL if scram.is_none() => {
                scram = Some(start_scram(payload, p.credentials, out)?);
            }
            tags::auth::SASL_CONTINUE => {
                let s = scram.as_mut().ok_or_else(|| protocol("unexpected SASLContinue"))?;
                let msg = s.update(payload)?;
                frontend::sasl_response(&msg, out).map_err(encode_error)?;
            }
            tags::auth::SASL_FINAL if !scram_finished => {
                let s = scram.as_mut().ok_or_else(|| protocol("unexpected SASLFinal"))?;
                s.finish(payload)?;
                scram_finished = true;
                continue;
            }
            other => return Err(protocol(format!("unsupported or unexpected authentication request {other}"))),
        }
        flush(stream, out).await?;
    }
}

fn password<'a>(p: &LoginParams<'a>, asked: &'static str) -> Result<&'a str, LoginError> {
    match p.credentials {
        Credentials::Password(pw) => Ok(pw),
        Credentials::None => Err(LoginError::NoPassword),
        Credentials::VerifierOnly => Err(LoginError::WrongPasswordType),
        other => Err(wrong_credentials(asked, other)),
    }
}

fn wrong_credentials(asked: &'static str, held: &Credentials) -> LoginError {
    let held = match held {
        Credentials::None => "nothing",
        Credentials::Password(_) => "password",
        Credentials::Md5(_) => "md5 hash",
        Credentials::ScramKeys(_) => "SCRAM key",
        Credentials::VerifierOnly => "SCRAM verifier",
    };
    LoginError::WrongCredentials { asked, held }
}

/// The md5 PasswordMessage: from a password, or passed through from a
/// stored `md5...` hash.
fn md5_response(p: &LoginParams<'_>, salt: [u8; 4]) -> Result<String, LoginError> {
    match p.credentials {
        Credentials::Md5(stored) => Ok(crate::auth::md5::expected_response(stored, salt)),
        _ => Ok(md5_hash(p.user.as_bytes(), password(p, "md5")?.as_bytes(), salt)),
    }
}

/// A SCRAM exchange as a client: with a password, or passed through with a
/// ClientKey.
enum Sasl {
    Password(ScramSha256),
    Keys(PassthroughClient),
}

impl Sasl {
    /// Handles the server-first; returns the client-final.
    fn update(&mut self, server_first: &[u8]) -> Result<Vec<u8>, LoginError> {
        match self {
            Sasl::Password(s) => {
                s.update(server_first).map_err(|e| protocol(format!("SCRAM: {e}")))?;
                Ok(s.message().to_vec())
            }
            Sasl::Keys(c) => Ok(c.handle_server_first(server_first).map_err(passthrough_error)?.into_bytes()),
        }
    }

    fn finish(&mut self, server_final: &[u8]) -> Result<(), LoginError> {
        match self {
            Sasl::Password(s) => {
                s.finish(server_final).map_err(|e| protocol(format!("SCRAM server verification failed: {e}")))
            }
            Sasl::Keys(c) => c.verify_server_final(server_final).map_err(passthrough_error),
        }
    }
}

fn passthrough_error(e: super::scram_client::ScramClientError) -> LoginError {
    use super::scram_client::ScramClientError as E;
    match e {
        E::StaleVerifier => LoginError::StaleVerifier,
        other => protocol(format!("SCRAM pass-through: {other}")),
    }
}

fn encode_error(e: std::io::Error) -> LoginError {
    protocol(format!("cannot encode password message: {e}"))
}

/// Checks the offered mechanisms and writes the SASLInitialResponse.
fn start_scram(mechanisms: &[u8], credentials: &Credentials, out: &mut BytesMut) -> Result<Sasl, LoginError> {
    let offered = mechanisms.split(|&b| b == 0).take_while(|m| !m.is_empty());
    if !offered.into_iter().any(|m| m == SCRAM_SHA_256.as_bytes()) {
        return Err(protocol(format!("server offers no {SCRAM_SHA_256} authentication")));
    }
    let (sasl, first) = match credentials {
        Credentials::Password(pw) => {
            let s = ScramSha256::new(pw.as_bytes(), ChannelBinding::unsupported());
            let first = s.message().to_vec();
            (Sasl::Password(s), first)
        }
        Credentials::ScramKeys(keys) => {
            let c = PassthroughClient::new(keys.clone());
            let first = c.client_first().into_bytes();
            (Sasl::Keys(c), first)
        }
        Credentials::None => return Err(LoginError::NoPassword),
        Credentials::VerifierOnly => return Err(LoginError::WrongPasswordType),
        other => return Err(wrong_credentials("SCRAM-SHA-256", other)),
    };
    frontend::sasl_initial_response(SCRAM_SHA_256, &first, out).map_err(encode_error)?;
    Ok(sasl)
}

/// After AuthenticationOk: ParameterStatus and BackendKeyData until ReadyForQuery.
async fn collect_until_ready<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
) -> Result<LoginResult, LoginError> {
    let mut result = LoginResult::default();
    loop {
        let frame = next_frame(stream, buf).await?;
        match frame.tag {
            tags::backend::PARAMETER_STATUS => {
                let param = messages::parameter_status_text(frame.body())
                    .map_err(|e| protocol(format!("malformed ParameterStatus: {e}")))?;
                result.server_params.extend(param.map(|(k, v)| (k.to_owned(), v.to_owned())));
            }
            tags::backend::BACKEND_KEY_DATA => {
                let body = frame.body();
                if !(8..=4 + MAX_CANCEL_KEY_LEN).contains(&body.len()) {
                    return Err(protocol("malformed BackendKeyData"));
                }
                result.backend_pid = i32::from_be_bytes([body[0], body[1], body[2], body[3]]);
                result.backend_key = body[4..].to_vec();
            }
            tags::backend::READY_FOR_QUERY => return Ok(result),
            t => return Err(protocol(format!("unexpected message type {:?} during login", char::from(t)))),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{ScramSecret, ScramServer};
    use crate::protocol::startup::{self, StartupPacket};
    use crate::protocol::tags::startup as startup_code;
    use bytes::BufMut;
    use tokio::io::DuplexStream;

    /// A scripted server: reads the startup packet, then runs `script`.
    async fn run<F, Fut>(p: LoginParams<'_>, script: F) -> Result<LoginResult, LoginError>
    where
        F: FnOnce(DuplexStream, BytesMut, Vec<(String, String)>) -> Fut,
        Fut: std::future::Future<Output = ()>,
    {
        let (mut c, mut s) = tokio::io::duplex(1 << 16);
        let server = async move {
            let mut buf = BytesMut::new();
            let packet = wire::read_startup_packet(&mut s, &mut buf).await.unwrap();
            let StartupPacket::Startup { params, .. } = startup::parse(&packet).unwrap() else {
                panic!("not a startup")
            };
            let params = params.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
            script(s, buf, params).await;
        };
        let client = async move {
            let mut buf = BytesMut::new();
            login(&mut c, &mut buf, &p).await
        };
        tokio::join!(client, server).0
    }

    async fn write(s: &mut DuplexStream, build: impl FnOnce(&mut BytesMut)) {
        let mut out = BytesMut::new();
        build(&mut out);
        s.write_all(&out).await.unwrap();
    }

    fn ready(out: &mut BytesMut) {
        messages::authentication(out, tags::auth::OK, &[]);
        messages::parameter_status(out, "server_version", "17.0");
        messages::error_response(out, messages::Severity::Notice, sqlstate::INTERNAL_ERROR, "hello");
        messages::parameter_status(out, "client_encoding", "UTF8");
        messages::backend_key_data(out, 4242, -7);
        messages::ready_for_query(out, tags::status::IDLE);
    }

    fn params<'a>(password: Option<&'a str>, extra: &'a [(String, String)]) -> LoginParams<'a> {
        let credentials: &'static Credentials = match password {
            None => &Credentials::None,
            Some(p) => Box::leak(Box::new(Credentials::Password(p.to_owned()))),
        };
        LoginParams { user: "alice", credentials, database: "db", startup_params: extra, minor: 0 }
    }

    fn expect_ready(r: Result<LoginResult, LoginError>) {
        let r = r.unwrap();
        assert_eq!(r.backend_pid, 4242);
        assert_eq!(r.backend_key, (-7i32).to_be_bytes());
        let want = [("server_version", "17.0"), ("client_encoding", "UTF8")];
        assert_eq!(r.server_params, want.map(|(k, v)| (k.to_owned(), v.to_owned())));
    }

    async fn read_password(s: &mut DuplexStream, buf: &mut BytesMut) -> Vec<u8> {
        let f = wire::read_frame(s, buf, 1 << 16).await.unwrap();
        assert_eq!(f.tag, tags::frontend::PASSWORD);
        f.body().to_vec()
    }

    #[tokio::test]
    async fn trust_collects_params_key_and_ready() {
        let extra = [("application_name".to_owned(), "app".to_owned())];
        let r = run(params(None, &extra), |mut s, _, startup| async move {
            let want = [("user", "alice"), ("database", "db"), ("application_name", "app")];
            assert_eq!(startup, want.map(|(k, v)| (k.to_owned(), v.to_owned())));
            write(&mut s, ready).await;
        })
        .await;
        expect_ready(r);
    }

    #[tokio::test]
    async fn protocol_3_2_takes_what_the_server_offers_and_keeps_a_long_key() {
        let p = LoginParams { minor: 2, ..params(None, &[]) };
        // A server of 3.2: no negotiation, a 32-byte key.
        let r = run(p, |mut s, _, _| async move {
            write(&mut s, |o| {
                messages::authentication(o, tags::auth::OK, &[]);
                messages::backend_key(o, 7, &[9; 32]);
                messages::ready_for_query(o, tags::status::IDLE);
            })
            .await;
        })
        .await
        .unwrap();
        assert_eq!((r.minor, r.backend_pid, r.backend_key), (2, 7, vec![9; 32]));
        // A server of 3.0 offers 3.0 first (Postgres 15 lists no options: weir sends none).
        let r = run(p, |mut s, _, _| async move {
            write(&mut s, |o| {
                messages::negotiate_protocol_version(o, startup_code::PROTOCOL_3_0, &[]);
                ready(o);
            })
            .await;
        })
        .await;
        assert_eq!(r.as_ref().map(|r| r.minor).ok(), Some(0));
        expect_ready(r);
        // An offer newer than asked for, or of another major version, is refused.
        for offered in [(3 << 16) | 3, 4 << 16] {
            let r = run(p, move |mut s, _, _| async move {
                write(&mut s, |o| messages::negotiate_protocol_version(o, offered, &[])).await;
            })
            .await;
            assert!(matches!(r, Err(LoginError::Protocol(_))), "{offered}: {r:?}");
        }
    }

    #[test]
    fn a_server_that_does_not_negotiate_is_recognised() {
        let refused = |code: &str| LoginError::Server { code: code.into(), message: "bad packet header".into() };
        assert!(refused("08P01").refuses_version());
        assert!(refused("0A000").refuses_version());
        assert!(!refused("28P01").refuses_version());
        assert!(!LoginError::Eof.refuses_version());
    }

    #[tokio::test]
    async fn md5_and_cleartext_send_the_right_password() {
        let r = run(params(Some("pw"), &[]), |mut s, mut buf, _| async move {
            write(&mut s, |o| messages::authentication(o, tags::auth::MD5_PASSWORD, &[1, 2, 3, 4])).await;
            let got = read_password(&mut s, &mut buf).await;
            let want = md5_hash(b"alice", b"pw", [1, 2, 3, 4]);
            assert_eq!(got, [want.as_bytes(), b"\0"].concat());
            write(&mut s, ready).await;
        })
        .await;
        expect_ready(r);
        let r = run(params(Some("pw"), &[]), |mut s, mut buf, _| async move {
            write(&mut s, |o| messages::authentication(o, tags::auth::CLEARTEXT_PASSWORD, &[])).await;
            assert_eq!(read_password(&mut s, &mut buf).await, b"pw\0");
            write(&mut s, ready).await;
        })
        .await;
        expect_ready(r);
    }

    #[tokio::test]
    async fn scram_against_weirs_own_server() {
        let r = run(params(Some("pw"), &[]), |mut s, mut buf, _| async move {
            let mut server = ScramServer::new(ScramSecret::from_password("pw"));
            write(&mut s, |o| messages::authentication(o, tags::auth::SASL, b"SCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0"))
                .await;
            let initial = read_password(&mut s, &mut buf).await;
            let client_first = &initial[b"SCRAM-SHA-256\0".len() + 4..];
            let first = server.handle_client_first(client_first).unwrap();
            write(&mut s, |o| messages::authentication(o, tags::auth::SASL_CONTINUE, first.as_bytes())).await;
            let ok = server.handle_client_final(&read_password(&mut s, &mut buf).await).unwrap();
            write(&mut s, |o| messages::authentication(o, tags::auth::SASL_FINAL, ok.server_final.as_bytes())).await;
            write(&mut s, ready).await;
        })
        .await;
        expect_ready(r);
    }

    /// A server that does not know the password: after the client-final it
    /// sends a forged SASLFinal or skips straight to AuthenticationOk.
    async fn impostor(mut s: DuplexStream, mut buf: BytesMut, forge_final: bool) {
        let mut server = ScramServer::new(ScramSecret::from_password("other"));
        write(&mut s, |o| messages::authentication(o, tags::auth::SASL, b"SCRAM-SHA-256\0\0")).await;
        let initial = read_password(&mut s, &mut buf).await;
        let first = server.handle_client_first(&initial[b"SCRAM-SHA-256\0".len() + 4..]).unwrap();
        write(&mut s, |o| messages::authentication(o, tags::auth::SASL_CONTINUE, first.as_bytes())).await;
        let _ = read_password(&mut s, &mut buf).await;
        if forge_final {
            let forged = b"v=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
            write(&mut s, |o| messages::authentication(o, tags::auth::SASL_FINAL, forged)).await;
        }
        write(&mut s, |o| messages::authentication(o, tags::auth::OK, &[])).await;
    }

    #[tokio::test]
    async fn scram_rejects_forged_server_final_and_skipped_final() {
        for forge_final in [true, false] {
            let r = run(params(Some("pw"), &[]), |s, buf, _| impostor(s, buf, forge_final)).await;
            assert!(matches!(r, Err(LoginError::Protocol(_))), "{r:?}");
        }
    }

    #[tokio::test]
    async fn error_response_without_sqlstate() {
        let r = run(params(Some("pw"), &[]), |mut s, _, _| async move {
            write(&mut s, |o| {
                o.put_u8(tags::backend::ERROR_RESPONSE);
                o.put_i32(4 + b"SFATAL\0Mboom\0\0".len() as i32);
                o.put_slice(b"SFATAL\0Mboom\0\0");
            })
            .await;
        })
        .await;
        let e = r.unwrap_err();
        assert!(matches!(&e, LoginError::Server { code, message } if code.is_empty() && message == "boom"), "{e:?}");
        assert_eq!(e.sqlstate(), sqlstate::CONNECTION_FAILURE);
        assert_eq!(e.server_code(), None);
        assert!(!e.is_auth_failure());
    }

    #[tokio::test]
    async fn auth_failures_are_recognised() {
        let r = run(params(Some("pw"), &[]), |mut s, mut buf, _| async move {
            write(&mut s, |o| messages::authentication(o, tags::auth::CLEARTEXT_PASSWORD, &[])).await;
            let _ = read_password(&mut s, &mut buf).await;
            write(&mut s, |o| messages::error_response(o, messages::Severity::Fatal, sqlstate::INVALID_PASSWORD, "no"))
                .await;
        })
        .await;
        let e = r.unwrap_err();
        assert!(e.is_auth_failure());
        assert_eq!(e.sqlstate(), sqlstate::INVALID_PASSWORD);
        assert_eq!(e.server_code(), Some("28P01"));
        assert_eq!(e.client_message(), "no");

        let r = run(params(None, &[]), |mut s, _, _| async move {
            write(&mut s, |o| messages::authentication(o, tags::auth::MD5_PASSWORD, &[0; 4])).await;
        })
        .await;
        let e = r.unwrap_err();
        assert!(matches!(e, LoginError::NoPassword) && e.is_auth_failure(), "{e:?}");
    }

    #[tokio::test]
    async fn md5_pass_through_and_credentials_that_cannot_serve_a_method() {
        let stored = crate::auth::md5::md5_hex_password("pw", "alice");
        let md5 = Credentials::Md5(stored);
        let p = LoginParams { user: "alice", credentials: &md5, database: "db", startup_params: &[], minor: 0 };
        let r = run(p, |mut s, mut buf, _| async move {
            write(&mut s, |o| messages::authentication(o, tags::auth::MD5_PASSWORD, &[1, 2, 3, 4])).await;
            let got = read_password(&mut s, &mut buf).await;
            let want = md5_hash(b"alice", b"pw", [1, 2, 3, 4]);
            assert_eq!(got, [want.as_bytes(), b"\0"].concat(), "same answer as with the password");
            write(&mut s, ready).await;
        })
        .await;
        expect_ready(r);
        // An md5 hash cannot do SCRAM or cleartext; it says so.
        for code in [tags::auth::CLEARTEXT_PASSWORD, tags::auth::SASL] {
            let p = LoginParams { user: "alice", credentials: &md5, database: "db", startup_params: &[], minor: 0 };
            let r = run(p, |mut s, _, _| async move {
                write(&mut s, |o| messages::authentication(o, code, b"SCRAM-SHA-256\0\0")).await;
            })
            .await;
            let e = r.unwrap_err();
            assert!(matches!(e, LoginError::WrongCredentials { held: "md5 hash", .. }) && e.is_auth_failure(), "{e:?}");
        }
    }

    /// AuthenticationGSS, which weir does not support.
    const AUTH_GSS: i32 = 7;

    #[tokio::test]
    async fn unexpected_messages_and_eof_are_errors() {
        let r = run(params(Some("pw"), &[]), |mut s, _, _| async move {
            write(&mut s, |o| messages::authentication(o, AUTH_GSS, &[])).await;
        })
        .await;
        assert!(matches!(r, Err(LoginError::Protocol(_))), "{r:?}");
        let r = run(params(Some("pw"), &[]), |mut s, _, _| async move {
            write(&mut s, |o| messages::authentication(o, tags::auth::OK, &[])).await;
            write(&mut s, |o| messages::query(o, "x")).await;
        })
        .await;
        assert!(matches!(r, Err(LoginError::Protocol(_))), "{r:?}");
        let r = run(params(Some("pw"), &[]), |s, _, _| async move { drop(s) }).await;
        let e = r.unwrap_err();
        assert!(matches!(e, LoginError::Eof | LoginError::Io(_)), "{e:?}");
        assert_eq!(e.sqlstate(), sqlstate::CONNECTION_FAILURE);
    }
}
