//! Client authentication: the auth_file (`userlist`), the md5 and
//! SCRAM-SHA-256 verifiers (`md5`, `scram`, and `derived` for the ones
//! derived from plaintext passwords), and the async exchange over a client
//! socket (`authenticate`). AuthenticationOk is the caller's to send.

mod credentials;
mod derived;
pub mod hba;
pub(crate) mod md5;
pub(crate) mod query;
pub(crate) mod scram;
pub(crate) mod userlist;

use bytes::BytesMut;
use rand::RngCore;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};

use crate::config::AuthType;
use crate::protocol::{frame::read_cstr, messages, sqlstate, tags, SqlState};
use crate::wire::{self, WireError};

pub use credentials::{stored_login_problems, Credentials, ScramKeys};
pub use scram::{ScramError, ScramSecret, ScramServer, ScramSuccess};
pub use userlist::{Secret, UserList, UserListError};

/// Largest authentication message accepted from a client.
const MAX_AUTH_MESSAGE_LEN: usize = 10_000;

/// Why a client failed to authenticate.
#[derive(Debug, thiserror::Error)]
pub enum AuthError {
    /// Wrong password, unknown user, or a secret that cannot serve the
    /// method, in a cleartext or md5 exchange (PgBouncer's words).
    #[error("password authentication failed")]
    WrongPassword { user: String },
    /// The same in a SCRAM exchange (PgBouncer's words).
    #[error("SASL authentication failed")]
    SaslFailed { user: String },
    /// auth_type trust with an auth_file that does not name the user.
    #[error("\"trust\" authentication failed")]
    TrustFailed { user: String },
    /// A PasswordMessage with an empty password (refused as Postgres does).
    #[error("empty password returned by client")]
    EmptyPassword,
    #[error("protocol violation during authentication: {0}")]
    Protocol(String),
    #[error("client selected an invalid SASL authentication mechanism")]
    UnsupportedMechanism,
    /// Refused by auth_hba_file (a `reject` line, or no line matched).
    #[error("{0}")]
    Refused(String),
    #[error("client closed the connection during authentication")]
    Eof,
    #[error("i/o error during authentication: {0}")]
    Io(#[from] std::io::Error),
}

impl AuthError {
    pub fn sqlstate(&self) -> SqlState {
        match self {
            AuthError::WrongPassword { .. } | AuthError::SaslFailed { .. } | AuthError::EmptyPassword => {
                sqlstate::INVALID_PASSWORD
            }
            AuthError::UnsupportedMechanism | AuthError::Refused(_) | AuthError::TrustFailed { .. } => {
                sqlstate::INVALID_AUTHORIZATION_SPECIFICATION
            }
            AuthError::Protocol(_) => sqlstate::PROTOCOL_VIOLATION,
            AuthError::Eof | AuthError::Io(_) => sqlstate::CONNECTION_FAILURE,
        }
    }

    /// The message for the client's ErrorResponse. `Eof`/`Io` need none (the
    /// client is gone) but get a generic text anyway.
    pub fn client_message(&self) -> String {
        match self {
            AuthError::Protocol(m) => m.clone(),
            other => other.to_string(),
        }
    }
}

impl From<WireError> for AuthError {
    fn from(e: WireError) -> Self {
        match e {
            WireError::Eof => AuthError::Eof,
            WireError::Io(e) => AuthError::Io(e),
            WireError::Protocol(p) => AuthError::Protocol(p.to_string()),
        }
    }
}

/// A successful authentication.
#[derive(Clone, Default, PartialEq, Eq)]
pub struct Authenticated {
    /// The ClientKey recovered from a SCRAM exchange, for SCRAM pass-through.
    pub scram_client_key: Option<[u8; 32]>,
}

impl std::fmt::Debug for Authenticated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Authenticated").field("scram_client_key", &self.scram_client_key.map(|_| "..")).finish()
    }
}

/// What weir logs in to the server with for a client that authenticated
/// as `authed` against `secret`: the plaintext password; SCRAM pass-through
/// with the ClientKey the client proved against a SCRAM verifier; md5
/// pass-through with a stored md5 hash; nothing otherwise (trust).
pub fn server_credentials(secret: Option<&Secret>, authed: &Authenticated) -> Credentials {
    match (secret, authed.scram_client_key) {
        (Some(Secret::Plain(p)), _) => Credentials::Password(p.clone()),
        (Some(Secret::Scram(s)), Some(key)) => Credentials::ScramKeys(ScramKeys::new(s, key)),
        (Some(Secret::Md5(m)), _) => Credentials::Md5(m.clone()),
        _ => Credentials::None,
    }
}

/// Who a `trust` login admits: with an auth_file, only the users it names
/// (or auth_query finds); without one, every user name (weir's rule where
/// PgBouncer would refuse them all).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrustNames {
    Listed,
    Any,
}

/// Runs the authentication exchange for `method` with a client whose startup
/// packet has been read. `secret` is the user's auth_file entry (`None` for
/// unknown users, who are still asked for a password and then fail like a
/// wrong password). Does not send AuthenticationOk.
///
/// With `Md5`, a user whose secret is a SCRAM verifier is authenticated with
/// SCRAM instead (as Postgres and PgBouncer do).
pub async fn authenticate<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    method: AuthType,
    user: &str,
    secret: Option<&Secret>,
    trust: TrustNames,
) -> Result<Authenticated, AuthError> {
    if secret.is_none() && matches!(method, AuthType::Md5 | AuthType::ScramSha256 | AuthType::Plain) {
        // PgBouncer's log line. Only the log says it: the client is asked
        // for a password and fails as with a wrong one, so a login does
        // not tell which user names exist.
        tracing::info!("no such user: {user}");
    }
    match (method, secret) {
        (AuthType::Trust, None) if trust == TrustNames::Listed => Err(AuthError::TrustFailed { user: user.into() }),
        (AuthType::Trust | AuthType::Any, _) => Ok(Authenticated::default()),
        (AuthType::Md5, Some(Secret::Scram(_))) | (AuthType::ScramSha256, _) => {
            scram_exchange(stream, buf, user, secret).await
        }
        (AuthType::Md5, _) => md5_exchange(stream, buf, user, secret).await,
        (AuthType::Plain, _) => cleartext_exchange(stream, buf, user, secret).await,
        // Resolved per client by `hba::method_for` before this is called.
        (AuthType::Hba, _) => Err(AuthError::Refused("auth_type \"hba\" was not resolved for this client".into())),
    }
}

async fn send<S: AsyncWrite + Unpin>(stream: &mut S, code: i32, payload: &[u8]) -> Result<(), AuthError> {
    let mut out = BytesMut::with_capacity(payload.len() + 9);
    messages::authentication(&mut out, code, payload);
    stream.write_all(&out).await?;
    stream.flush().await?;
    Ok(())
}

/// Reads the body of the client's next `p` message.
async fn read_password_message<S: AsyncRead + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
) -> Result<bytes::Bytes, AuthError> {
    let frame = wire::read_frame_by(stream, buf, MAX_AUTH_MESSAGE_LEN, wire::LOGIN_READ_CHUNK).await?;
    match frame.tag {
        tags::frontend::PASSWORD => Ok(frame.bytes.slice(crate::protocol::HEADER_LEN..)),
        tags::frontend::TERMINATE => Err(AuthError::Eof),
        t => Err(AuthError::Protocol(format!("expected password response, got message type {:?}", char::from(t)))),
    }
}

fn wrong_password(user: &str) -> AuthError {
    AuthError::WrongPassword { user: user.to_owned() }
}

async fn md5_exchange<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    user: &str,
    secret: Option<&Secret>,
) -> Result<Authenticated, AuthError> {
    let mut salt = [0u8; 4];
    rand::thread_rng().fill_bytes(&mut salt);
    send(stream, tags::auth::MD5_PASSWORD, &salt).await?;
    let body = read_password_message(stream, buf).await?;
    let mut rest = &body[..];
    let response = read_cstr(&mut rest).map_err(|e| AuthError::Protocol(format!("invalid password packet: {e}")))?;
    if !rest.is_empty() {
        return Err(AuthError::Protocol("invalid password packet: trailing bytes".into()));
    }
    match secret {
        Some(s) if md5::verify_md5_response(s, user, salt, response.as_bytes()) => Ok(Authenticated::default()),
        Some(_) => Err(wrong_password(user)),
        None => {
            tracing::debug!(user, "md5 authentication for a user not in auth_file");
            Err(wrong_password(user))
        }
    }
}

/// PgBouncer's `plain`: AuthenticationCleartextPassword, then the password
/// checked against a plaintext, md5 or SCRAM entry. An unknown user is
/// asked too, and fails like a wrong password.
async fn cleartext_exchange<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    user: &str,
    secret: Option<&Secret>,
) -> Result<Authenticated, AuthError> {
    send(stream, tags::auth::CLEARTEXT_PASSWORD, &[]).await?;
    let body = read_password_message(stream, buf).await?;
    let mut rest = &body[..];
    let password = read_cstr(&mut rest).map_err(|e| AuthError::Protocol(format!("invalid password packet: {e}")))?;
    if !rest.is_empty() {
        return Err(AuthError::Protocol("invalid password packet: trailing bytes".into()));
    }
    if password.is_empty() {
        return Err(AuthError::EmptyPassword);
    }
    let ok = match secret {
        Some(Secret::Plain(p)) => !p.is_empty() && constant_eq(p.as_bytes(), password.as_bytes()),
        Some(Secret::Md5(m)) => constant_eq(m.as_bytes(), md5::md5_hex_password(password, user).as_bytes()),
        Some(Secret::Scram(s)) => {
            let derived = ScramSecret::from_password_with(password, s.salt.clone(), s.iterations);
            constant_eq(&derived.stored_key, &s.stored_key)
        }
        None => false,
    };
    if ok {
        Ok(Authenticated::default())
    } else {
        Err(wrong_password(user))
    }
}

/// Equality that takes the same time wherever the first difference is.
fn constant_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The verifier to run SCRAM against; a mock one when the user has none usable.
fn scram_secret_for(user: &str, secret: Option<&Secret>) -> ScramSecret {
    match secret {
        Some(Secret::Scram(s)) => s.clone(),
        Some(Secret::Plain(p)) if !p.is_empty() => derived::verifier(user, p),
        Some(Secret::Plain(_)) => {
            tracing::debug!(user, "empty password in auth_file; SCRAM will fail");
            ScramSecret::mock_for(user)
        }
        Some(Secret::Md5(_)) => {
            tracing::debug!(user, "auth_file holds an md5 password, which cannot do SCRAM; SCRAM will fail");
            ScramSecret::mock_for(user)
        }
        None => {
            tracing::debug!(user, "SCRAM authentication for a user not in auth_file");
            ScramSecret::mock_for(user)
        }
    }
}

fn scram_failure(user: &str, e: ScramError) -> AuthError {
    match e {
        ScramError::InvalidProof => AuthError::SaslFailed { user: user.to_owned() },
        other => AuthError::Protocol(other.to_string()),
    }
}

/// The payload of AuthenticationSASL: mechanism names, each NUL-terminated,
/// then an empty name.
fn sasl_mechanisms_payload() -> Vec<u8> {
    let mut p = Vec::with_capacity(scram::MECHANISM.len() + 2);
    p.extend_from_slice(scram::MECHANISM.as_bytes());
    p.extend_from_slice(&[0, 0]);
    p
}

/// Splits a SASLInitialResponse body into its mechanism and initial response.
fn parse_sasl_initial_response(body: &[u8]) -> Result<(&str, &[u8]), AuthError> {
    let bad = |why: &str| AuthError::Protocol(format!("invalid SASLInitialResponse: {why}"));
    let mut rest = body;
    let mechanism = read_cstr(&mut rest).map_err(|e| bad(&e.to_string()))?;
    let Some((len, data)) = rest.split_first_chunk::<4>() else {
        return Err(bad("truncated"));
    };
    let len = i32::from_be_bytes(*len);
    if len < 0 {
        return Err(bad("missing initial response"));
    }
    if len as usize != data.len() {
        return Err(bad("length does not match the message"));
    }
    Ok((mechanism, data))
}

async fn scram_exchange<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    buf: &mut BytesMut,
    user: &str,
    secret: Option<&Secret>,
) -> Result<Authenticated, AuthError> {
    let mut server = ScramServer::new(scram_secret_for(user, secret));
    send(stream, tags::auth::SASL, &sasl_mechanisms_payload()).await?;

    let body = read_password_message(stream, buf).await?;
    let (mechanism, client_first) = parse_sasl_initial_response(&body)?;
    if mechanism != scram::MECHANISM {
        tracing::debug!(user, mechanism, "client chose an unsupported SASL mechanism");
        return Err(AuthError::UnsupportedMechanism);
    }
    let server_first = server.handle_client_first(client_first).map_err(|e| scram_failure(user, e))?;
    send(stream, tags::auth::SASL_CONTINUE, server_first.as_bytes()).await?;

    let client_final = read_password_message(stream, buf).await?;
    let ok = server.handle_client_final(&client_final).map_err(|e| scram_failure(user, e))?;
    send(stream, tags::auth::SASL_FINAL, ok.server_final.as_bytes()).await?;
    Ok(Authenticated { scram_client_key: Some(ok.client_key) })
}

#[cfg(test)]
mod tests;
