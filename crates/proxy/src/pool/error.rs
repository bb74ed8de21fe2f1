//! Why a client got no server: each refusal's message (PgBouncer's where it
//! has one) and the dropped-query reason it is counted under.

use std::time::Duration;

/// Why a client got no server.
#[derive(Debug, Clone, thiserror::Error)]
pub enum PoolError {
    /// SQLSTATE 53300 (class 53, insufficient resources): the pool had no
    /// server to spare, which is not the client's own cancel (57014).
    #[error(
        "no server connection became free within the wait budget of {} ({key}); the query was not run{}",
        humantime::format_duration(*budget),
        last_error.as_ref().map(|e| format!(" (last connect error: {e})")).unwrap_or_default()
    )]
    WaitTimeout { budget: Duration, waited: Duration, last_error: Option<String>, key: &'static str },
    /// Postgres refused the pool's login (a password, pg_hba.conf, no such
    /// role or database): the clients waiting when it did get its SQLSTATE
    /// and its own message at once, as PgBouncer's.
    #[error("{message}")]
    LoginRejected { code: crate::protocol::SqlState, message: String },
    /// A client that finds no server while the pool waits out
    /// server_login_retry after a refused login (PgBouncer's text; 08P01).
    #[error("server login has been failing, cached error: {message} (server_login_retry)")]
    LoginFailing { message: String },
    #[error("the pool is shutting down")]
    Closed,
    /// SHUTDOWN WAIT_FOR_SERVERS lends no server for a new transaction
    /// (PgBouncer's words); the client is closed.
    #[error("server shutting down")]
    ShuttingDown,
    /// 53300 at once: the queue is at its bound.
    #[error(
        "the queue for a server is full ({waiting} clients already waiting, {key} = {waiting}); the query was not run"
    )]
    QueueFull { waiting: u32, key: &'static str },
    /// 53300 at once: the queue ahead holds more work than the pool can
    /// serve within what is left of the wait budget.
    #[error(
        "query shed: the predicted wait for a server ({}) exceeds the wait budget left ({}); the query was not run",
        humantime::format_duration(*predicted),
        humantime::format_duration(*left)
    )]
    Shed { predicted: Duration, left: Duration },
    /// 53300 before the query starts: the client's deadline leaves less time
    /// than this pool's transactions take.
    #[error(
        "query not started: {} left of the client deadline, below this pool's recent transaction time ({}); \
         the query was not run",
        humantime::format_duration(*left),
        humantime::format_duration(*needed)
    )]
    TooLate { left: Duration, needed: Duration },
}

impl PoolError {
    /// The `weir_queries_dropped_total` reason of a refused query, if it is one.
    pub fn drop_reason(&self) -> Option<weir_metrics::DropReason> {
        use weir_metrics::DropReason as D;
        match self {
            PoolError::WaitTimeout { .. } => Some(D::WaitTimeout),
            PoolError::QueueFull { .. } => Some(D::QueueFull),
            PoolError::Shed { .. } => Some(D::Shed),
            PoolError::TooLate { .. } => Some(D::Deadline),
            PoolError::LoginRejected { .. }
            | PoolError::LoginFailing { .. }
            | PoolError::Closed
            | PoolError::ShuttingDown => None,
        }
    }
}
