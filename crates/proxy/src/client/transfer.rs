//! The active phase: bytes flow both ways between a client and the server it
//! borrowed, with one read and one write per batch and no per-message
//! allocation. Only message headers are looked at (through `Conversation`),
//! to know when the server can go back to the pool.
//!
//! Every branch of the `select!` is cancel-safe: `read_buf` and `write` on a
//! socket half either complete or leave the buffers as they were.
//!
//! Beside the bytes runs the watchdog (`watchdog.rs`): query_timeout, the
//! silent-server probe and idle_transaction_timeout. When it fires, the
//! server is marked broken (or left to recovery) and the client gets its error.

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::error::ClientError;
use super::prepared::Stage;
use super::stream::ClientStream;
use super::watchdog::Watchdog;
use crate::params::ParamMap;
use crate::server::statements::ServerStatements;
use crate::server::{Conversation, ServerConn};

/// Read no more from a side while this much of its output is unsent.
const HIGH_WATER: usize = 256 * 1024;

/// How long a departed client's last bytes may take to reach the server.
const FLUSH_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How the active phase ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The server owes nothing and no transaction is open (transaction mode).
    Released,
    /// The client closed its socket or sent Terminate.
    ClientGone,
    /// The server closed or broke; `told` is true if its FATAL reached the client.
    ServerGone { told: bool },
}

/// Moves bytes until the server can be released (when `release` is true) or
/// one side goes away. Client bytes not yet sent stay in `cbuf`.
/// A plain client uses TcpStream's zero-cost halves; a TLS client
/// `tokio::io::split` (its reads flush what rustls still holds, see `stream`).
pub async fn run(
    client: &mut ClientStream,
    cbuf: &mut BytesMut,
    server: &mut ServerConn,
    client_params: &mut ParamMap,
    max_message: usize,
    release: bool,
    prepared: &mut Stage,
) -> Result<Ended, ClientError> {
    match client {
        ClientStream::Plain(tcp) => {
            let (cr, cw) = tcp.split();
            forward(cr, cw, cbuf, server, client_params, max_message, release, prepared).await
        }
        other => {
            let (cr, cw) = tokio::io::split(other);
            forward(cr, cw, cbuf, server, client_params, max_message, release, prepared).await
        }
    }
}

#[allow(clippy::too_many_arguments)]
async fn forward<CR: AsyncRead + Unpin, CW: AsyncWrite + Unpin>(
    mut cr: CR,
    mut cw: CW,
    cbuf: &mut BytesMut,
    server: &mut ServerConn,
    client_params: &mut ParamMap,
    max_message: usize,
    release: bool,
    prepared: &mut Stage,
) -> Result<Ended, ClientError> {
    let metrics = server.metrics().clone();
    let ServerConn { stream, rbuf: sbuf, conv, params: server_params, broken, statements, spec, cancel, alarm, .. } =
        server;
    let mut wd = Watchdog::new(spec, cancel, alarm);
    let (mut sr, mut sw) = stream.split();
    let mut c_out = Bytes::new();
    let mut s_out = Bytes::new();
    let mut settled = false;
    let mut terminating = false;
    let mut told = false;
    // When the first byte of the queries now running went to the server (query time).
    let mut query_started: Option<std::time::Instant> = None;
    loop {
        if c_out.is_empty() && !cbuf.is_empty() && !terminating {
            let ready = prepared.outbound(cbuf, conv, statements, max_message)?;
            let out = conv.scan_client(&cbuf[..ready], max_message)?;
            c_out = cbuf.split_to(out.forward).freeze();
            terminating = out.terminate;
        }
        // Once the server owes nothing and goes back, bytes it sent after
        // the settling ReadyForQuery were not asked for: they stay with the
        // connection (which the pool then closes), never reach this client.
        let releasing = settled && release && prepared.pinned().is_none() && conv.is_clean();
        if s_out.is_empty() && !sbuf.is_empty() && !releasing {
            let got = from_server(sbuf, conv, server_params, client_params, broken, statements, prepared)?;
            s_out = got.out;
            settled |= got.settled;
            told |= got.fatal;
            if got.answered > 0 {
                wd.answered();
                // One query per ReadyForQuery (a simple Query, or a batch up to Sync).
                (0..got.answered).for_each(|_| metrics.record_query());
                if let Some(t) = query_started.take() {
                    metrics.record_query_time(t.elapsed());
                }
            }
        }
        if let Some(owed) = s_out.is_empty().then(|| prepared.synthetic()).flatten() {
            s_out = owed.bytes;
            settled |= owed.settled;
        }
        if c_out.is_empty() && s_out.is_empty() {
            if terminating {
                return Ok(client_gone(&mut sw, &c_out).await);
            }
            if settled && release && prepared.pinned().is_none() && conv.is_clean() {
                return Ok(Ended::Released);
            }
            settled = false;
        }
        wd.update(conv, sbuf.len() < HIGH_WATER, c_out.is_empty() && !terminating);
        tokio::select! {
            biased;
            r = sw.write(&c_out), if !c_out.is_empty() => match r {
                Ok(n) => {
                    c_out.advance(n);
                    metrics.record_received(n);
                    query_started.get_or_insert_with(std::time::Instant::now);
                }
                Err(_) => return Ok(Ended::ServerGone { told }),
            },
            r = cw.write(&s_out), if !s_out.is_empty() => match r {
                Ok(n) => {
                    s_out.advance(n);
                    metrics.record_sent(n);
                }
                Err(_) => return Ok(client_gone(&mut sw, &c_out).await),
            },
            r = sr.read_buf(sbuf), if sbuf.len() < HIGH_WATER => match r {
                Ok(0) | Err(_) => {
                    let _ = cw.write_all(&s_out).await;
                    let _ = cw.flush().await;
                    return Ok(Ended::ServerGone { told });
                }
                Ok(_) => wd.heard(),
            },
            r = cr.read_buf(cbuf), if cbuf.len() < HIGH_WATER && !terminating => match r {
                Ok(0) | Err(_) => return Ok(client_gone(&mut sw, &c_out).await),
                Ok(_) => wd.client_spoke(),
            },
            e = wd.alarm(), if wd.armed() => {
                *broken = e.close_reason();
                return Err(e.into());
            }
        }
    }
}

/// What the server's buffered bytes gave the client.
struct FromServer {
    /// The bytes to pass on.
    out: Bytes,
    /// They end what the server owed (its last ReadyForQuery).
    settled: bool,
    /// They carry a FATAL.
    fatal: bool,
    /// ReadyForQuery messages among them.
    answered: usize,
}

/// Takes the whole messages buffered from the server: parameters it reports
/// go to both the server's and the client's maps, prepared-statement
/// replies are reconciled, and a server that breaks the protocol is marked
/// broken (it is not recovered).
fn from_server(
    sbuf: &mut BytesMut,
    conv: &mut Conversation,
    server_params: &mut ParamMap,
    client_params: &mut ParamMap,
    broken: &mut Option<weir_metrics::CloseReason>,
    statements: &mut ServerStatements,
    prepared: &mut Stage,
) -> Result<FromServer, ClientError> {
    let owed = conv.pending_rfq;
    let scanned = conv.scan_server(sbuf, |k, v| {
        server_params.set(k, v);
        client_params.set(k, v);
    });
    let inb = scanned.map_err(|e| {
        *broken = Some(weir_metrics::CloseReason::ProtocolError);
        ClientError::BadServerMessage(e)
    })?;
    let out = prepared.inbound(sbuf.split_to(inb.forward).freeze(), statements);
    let answered = owed.saturating_sub(conv.pending_rfq) as usize;
    Ok(FromServer { out, settled: inb.settled, fatal: inb.fatal, answered })
}

/// The client left. Client bytes already counted as sent are sent, so the
/// server's stream stays on a message boundary for recovery.
async fn client_gone(sw: &mut crate::server::stream::ServerWriter<'_>, c_out: &[u8]) -> Ended {
    if c_out.is_empty() {
        return Ended::ClientGone;
    }
    match tokio::time::timeout(FLUSH_LIMIT, sw.write_all(c_out)).await {
        Ok(Ok(())) => Ended::ClientGone,
        _ => Ended::ServerGone { told: true },
    }
}
