//! Recovery of a server connection its client left dirty, in a task of its
//! own: the connection's own `recover` (complete a half-sent message, end
//! COPY, Sync, cancel, drain, ROLLBACK, reset) bounded by
//! `server_reset_timeout`, then back to the pool; only a failure closes the
//! connection, counted with its reason. Also the pre-lend health check.

use std::sync::Arc;
use std::time::Duration;

use weir_metrics::CloseReason;

use super::{Pool, PoolOptions};
use crate::server::exchange::run;
use crate::server::ServerConn;

pub(super) fn spawn(pool: Arc<Pool>, mut conn: Box<ServerConn>, opts: PoolOptions, reset: bool) {
    conn.set_close_reason(CloseReason::ResetFailed);
    tokio::spawn(async move {
        let reset_query = reset.then_some(opts.reset_query.as_deref()).flatten();
        // A cancel is (or is about to be) on its way to this server: SHOW
        // POOLS counts it in sv_being_canceled until recovery ends.
        let _being_canceled = conn.being_canceled().then(|| pool.metrics.being_canceled());
        let result = match tokio::time::timeout(opts.reset_timeout, conn.recover(reset_query)).await {
            Ok(Ok(())) => Ok(conn),
            Ok(Err(reason)) => Err((conn, reason)),
            Err(_) => Err((conn, CloseReason::ResetFailed)),
        };
        if let Err((conn, reason)) = &result {
            tracing::info!(server = conn.id, reason = reason.as_label(), "server connection could not be recovered");
        }
        pool.recovered(result);
    });
}

/// Runs the server check query before an idle-too-long server is lent out.
pub(super) async fn check(conn: &mut ServerConn, query: &str, limit: Duration) -> Result<(), CloseReason> {
    match tokio::time::timeout(limit, run(conn, query)).await {
        Ok(Ok(())) if conn.conv.is_clean() => Ok(()),
        _ => Err(CloseReason::CheckFailed),
    }
}
