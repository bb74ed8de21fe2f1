//! Why a client's login or session ends, or a request fails, each with a
//! client-safe message and a SQLSTATE: the one error of a client connection,
//! which the console and the pooled session share with the login.

use crate::auth::AuthError;
use crate::pool::PoolError;
use crate::protocol::{sqlstate, ProtocolError, SqlState};
use crate::wire::WireError;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("{0}")]
    Protocol(#[from] ProtocolError),
    #[error("client closed the connection")]
    Gone,
    #[error("i/o error: {0}")]
    Io(std::io::Error),
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// PgBouncer's words.
    #[error("no such database: {0}")]
    UnknownDatabase(String),
    /// A config that cannot serve this login (PgBouncer's words; the log
    /// says why).
    #[error("bouncer config error")]
    BouncerConfig,
    #[error("no PostgreSQL user name specified in startup packet")]
    NoUser,
    #[error("unsupported frontend protocol {0}.{1}: server supports 3.0 to 3.2")]
    UnsupportedProtocol(u16, u16),
    #[error("{0}")]
    BadStartupParameter(String),
    /// Postgres refused a startup setting or parameter value the client sent.
    #[error("{message}")]
    RefusedSetting { code: SqlState, message: String },
    #[error("sorry, too many clients already (max_client_conn)")]
    TooManyClients,
    /// max_db_client_connections or max_user_client_connections (PgBouncer's words).
    #[error("client connections exceeded ({})", .0.key())]
    ClientCap(crate::state::caps::CapExceeded),
    /// The console's DISABLE closed the database to new clients.
    #[error("{}", crate::state::disabled::disabled_message(.0))]
    Disabled(String),
    #[error("client_login_timeout expired before login completed")]
    LoginTimeout,
    #[error("{0}")]
    NoServer(#[from] PoolError),
    #[error("the connection to the server was lost")]
    ServerLost,
    /// The server sent bytes that break the protocol; its connection is closed.
    #[error("the server sent a malformed message ({0}); its connection is closed")]
    BadServerMessage(ProtocolError),
    /// query_timeout, idle_transaction_timeout or a dead server found by
    /// the session's watchdog: its SQLSTATE and message (`client` makes it).
    #[error("{message}")]
    Watchdog { code: SqlState, message: String },
    #[error("weir is shutting down")]
    ShuttingDown,
    /// client_tls_sslmode requires TLS and the client did not ask for it.
    #[error("SSL required: this server accepts only TLS connections (client_tls_sslmode)")]
    TlsRequired,
    /// Postgres refused a replication client's own server (no REPLICATION
    /// attribute, no pg_hba.conf line for replication): PgBouncer's words,
    /// Postgres's SQLSTATE, and its message as the DETAIL.
    #[error("login failed")]
    ServerLoginFailed { code: SqlState, detail: String },
}

impl From<WireError> for ClientError {
    fn from(e: WireError) -> Self {
        match e {
            WireError::Eof => ClientError::Gone,
            WireError::Io(e) => ClientError::Io(e),
            WireError::Protocol(p) => ClientError::Protocol(p),
        }
    }
}

impl ClientError {
    pub fn sqlstate(&self) -> SqlState {
        match self {
            ClientError::Protocol(p) => p.sqlstate(),
            ClientError::Auth(a) => a.sqlstate(),
            ClientError::UnknownDatabase(_) => sqlstate::INVALID_CATALOG_NAME,
            ClientError::BouncerConfig => sqlstate::PROTOCOL_VIOLATION,
            ClientError::NoUser | ClientError::TlsRequired => sqlstate::INVALID_AUTHORIZATION_SPECIFICATION,
            ClientError::UnsupportedProtocol(..) => sqlstate::FEATURE_NOT_SUPPORTED,
            ClientError::BadStartupParameter(_) => sqlstate::PROTOCOL_VIOLATION,
            ClientError::RefusedSetting { code, .. } => *code,
            ClientError::TooManyClients | ClientError::ClientCap(_) => sqlstate::TOO_MANY_CONNECTIONS,
            ClientError::Disabled(_) => sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE,
            ClientError::LoginTimeout => sqlstate::PROTOCOL_VIOLATION,
            ClientError::NoServer(
                PoolError::WaitTimeout { .. }
                | PoolError::QueueFull { .. }
                | PoolError::Shed { .. }
                | PoolError::TooLate { .. },
            ) => sqlstate::TOO_MANY_CONNECTIONS,
            ClientError::NoServer(PoolError::LoginRejected { code, .. }) => *code,
            ClientError::NoServer(PoolError::LoginFailing { .. }) => sqlstate::PROTOCOL_VIOLATION,
            ClientError::Watchdog { code, .. } | ClientError::ServerLoginFailed { code, .. } => *code,
            ClientError::NoServer(PoolError::Closed | PoolError::ShuttingDown) | ClientError::ShuttingDown => {
                sqlstate::ADMIN_SHUTDOWN
            }
            ClientError::ServerLost => sqlstate::CONNECTION_FAILURE,
            ClientError::BadServerMessage(_) => sqlstate::PROTOCOL_VIOLATION,
            ClientError::Gone | ClientError::Io(_) => sqlstate::CONNECTION_FAILURE,
        }
    }

    /// The client is gone, so there is nobody to tell.
    pub fn is_silent(&self) -> bool {
        matches!(self, ClientError::Gone | ClientError::Io(_) | ClientError::Auth(AuthError::Eof | AuthError::Io(_)))
    }

    pub fn client_message(&self) -> String {
        match self {
            ClientError::Auth(a) => a.client_message(),
            other => other.to_string(),
        }
    }

    /// What the client's ErrorResponse says in DETAIL, if anything.
    pub fn detail(&self) -> Option<&str> {
        match self {
            ClientError::ServerLoginFailed { detail, .. } => Some(detail),
            _ => None,
        }
    }
}
