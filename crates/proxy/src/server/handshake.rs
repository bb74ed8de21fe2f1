//! weir's handshake with a Postgres server, as its client (the other
//! direction from `login`, where clients log in to weir): the startup
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
mod tests;
