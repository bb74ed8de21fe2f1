//! weir's own short exchanges on a server connection: write bytes, run a
//! simple query, and drain output until every ReadyForQuery owed has come.
//! Used by recovery, health checks and parameter re-application.

use bytes::{Buf, BytesMut};
use tokio::io::AsyncWriteExt;
use weir_metrics::CloseReason;

use super::ServerConn;
use crate::protocol::{messages, tags::frontend as fe};
use crate::wire;

/// Writes bytes weir made itself to the server.
pub async fn write(conn: &mut ServerConn, bytes: &[u8]) -> Result<(), CloseReason> {
    if bytes.is_empty() {
        return Ok(());
    }
    conn.stream.write_all(bytes).await.map_err(|_| CloseReason::ServerClosed)
}

/// Sends one simple query and drains its answer (errors included).
pub async fn run(conn: &mut ServerConn, sql: &str) -> Result<(), CloseReason> {
    let mut out = BytesMut::new();
    messages::query(&mut out, sql);
    conn.conv.note_client(fe::QUERY);
    write(conn, &out).await?;
    drain(conn).await
}

/// Reads and discards server output until every ReadyForQuery owed has come.
pub async fn drain(conn: &mut ServerConn) -> Result<(), CloseReason> {
    while conn.conv.pending_rfq > 0 || conn.conv.from_server_partial > 0 {
        if conn.rbuf.is_empty() {
            fill(conn).await?;
        }
        let ServerConn { rbuf, conv, params, .. } = conn;
        let inb = conv.scan_server(rbuf, |k, v| params.set(k, v)).map_err(|_| CloseReason::ProtocolError)?;
        rbuf.advance(inb.forward);
        if inb.fatal {
            return Err(CloseReason::ServerClosed);
        }
        if inb.forward == 0 {
            fill(conn).await?;
        }
    }
    Ok(())
}

async fn fill(conn: &mut ServerConn) -> Result<(), CloseReason> {
    wire::fill(&mut conn.stream, &mut conn.rbuf).await.map(|_| ()).map_err(|_| CloseReason::ServerClosed)
}
