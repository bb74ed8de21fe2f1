//! Recovery of a server connection its client left dirty: complete a
//! half-sent message, end COPY, close the batch with Sync, cancel what is
//! running, drain to ReadyForQuery, ROLLBACK, reset, and give it back. The
//! whole sequence is bounded by `server_reset_timeout`; only a failure closes
//! the connection, counted with its reason. Also the pre-lend health check.

use std::sync::Arc;
use std::time::Duration;

use bytes::BytesMut;
use weir_metrics::CloseReason;

use super::{Pool, PoolOptions};
use crate::protocol::{messages, tags::frontend as fe, tags::status};
use crate::server::exchange::{drain, run, write};
use crate::server::{forward_cancel, ServerConn};

/// How long weir waits for Postgres to take a cancel request.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(2);

/// The most filler weir writes to complete a message its client left half
/// sent; a longer rest closes the connection instead (and bounds the memory).
const MAX_FILLER: usize = 16 << 20;

pub(super) fn spawn(pool: Arc<Pool>, mut conn: Box<ServerConn>, opts: PoolOptions, reset: bool) {
    conn.set_close_reason(CloseReason::ResetFailed);
    tokio::spawn(async move {
        let reset_query = reset.then_some(opts.reset_query.as_deref()).flatten();
        // A cancel is (or is about to be) on its way to this server: SHOW
        // POOLS counts it in sv_being_canceled until recovery ends.
        let canceling = conn.conv.pending_rfq > 0 || !conn.cancel.gate.is_open();
        let _being_canceled = canceling.then(|| pool.metrics.being_canceled());
        let result = match tokio::time::timeout(opts.reset_timeout, recover(&mut conn, reset_query)).await {
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

async fn recover(conn: &mut ServerConn, reset_query: Option<&str>) -> Result<(), CloseReason> {
    finish_client_side(conn).await?;
    if conn.conv.pending_rfq > 0 {
        let _ = forward_cancel(conn.cancel.clone(), CANCEL_TIMEOUT).await;
    }
    drain(conn).await?;
    if conn.conv.status != status::IDLE {
        run(conn, "ROLLBACK").await?;
    }
    if let Some(q) = reset_query.filter(|q| !q.is_empty()) {
        run(conn, q).await?;
        // RESET ALL inside the reset query dropped what weir had SET.
        conn.settings = crate::params::ParamMap::new();
        // DISCARD ALL / DEALLOCATE ALL in it may have dropped weir's statements.
        conn.statements.mark_all_uncertain();
        conn.statements.publish();
    }
    if !conn.cancel.gate.wait_clear(CANCEL_TIMEOUT).await {
        return Err(CloseReason::ResetFailed);
    }
    if conn.conv.is_clean() {
        Ok(())
    } else {
        Err(CloseReason::ResetFailed)
    }
}

/// Puts the client→server stream back on a message boundary and out of any
/// batch or COPY, without ever making a fragment runnable.
async fn finish_client_side(conn: &mut ServerConn) -> Result<(), CloseReason> {
    let mut out = BytesMut::new();
    if conn.conv.to_server_partial > MAX_FILLER {
        // A gigabyte Query abandoned after its first megabytes: pushing the
        // rest through costs more than a new connection.
        return Err(CloseReason::ResetFailed);
    }
    if conn.conv.to_server_partial > 0 {
        // Filler with no NUL byte: the half-sent string never terminates, so
        // Postgres rejects the message instead of running a fragment.
        out.resize(conn.conv.to_server_partial, 0x01);
        conn.conv.to_server_partial = 0;
    }
    if conn.conv.copy_in {
        copy_fail(&mut out, "client disconnected during COPY");
        conn.conv.note_client(fe::COPY_FAIL);
    }
    if conn.conv.in_batch {
        messages::sync(&mut out);
        conn.conv.note_client(fe::SYNC);
    }
    write(conn, &out).await
}

fn copy_fail(buf: &mut BytesMut, why: &str) {
    use bytes::BufMut;
    buf.put_u8(fe::COPY_FAIL);
    buf.put_i32((4 + why.len() + 1) as i32);
    buf.put_slice(why.as_bytes());
    buf.put_u8(0);
}

/// Runs the server check query before an idle-too-long server is lent out.
pub(super) async fn check(conn: &mut ServerConn, query: &str, limit: Duration) -> Result<(), CloseReason> {
    match tokio::time::timeout(limit, run(conn, query)).await {
        Ok(Ok(())) if conn.conv.is_clean() => Ok(()),
        _ => Err(CloseReason::CheckFailed),
    }
}
