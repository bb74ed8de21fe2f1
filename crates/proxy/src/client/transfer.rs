//! The active phase: bytes flow both ways between a client and the server it
//! borrowed, with one read and one write per batch and no per-message
//! allocation. Only message headers are looked at (through `Conversation`),
//! to know when the server can go back to the pool.
//!
//! Every branch of the `select!` is cancel-safe: `read_buf` and `write` on a
//! socket half either complete or leave the buffers as they were.
//!
//! Beside the bytes runs the watchdog (`transfer_watchdog.rs`): query_timeout, the
//! silent-server probe and idle_transaction_timeout. When it fires, the
//! server is marked broken (or left to recovery) and the client gets its error.

use bytes::{Buf, Bytes, BytesMut};
use futures_util::future::Either;
use futures_util::FutureExt;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

use super::error::ClientError;
use super::prepared::ClientStatements;
use super::stream::ClientStream;
use super::transfer_watchdog::{Watchdog, WatchdogError};
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

/// The client's side of a transfer: the bytes read from it and not yet
/// handled, the parameters it was told (a server's ParameterStatus updates
/// them), its message limit and its prepared statements.
pub struct ClientSide<'a> {
    pub unread: &'a mut BytesMut,
    pub params: &'a mut ParamMap,
    pub max_message: usize,
    pub prepared: &'a mut ClientStatements,
}

/// Moves bytes until the server can be released (when `release` is true) or
/// one side goes away. Client bytes not yet sent stay in `side.unread`.
/// A plain client (TCP or Unix socket) uses its socket's zero-cost halves; a
/// TLS client `tokio::io::split` (its reads flush what rustls still holds,
/// see `stream`). All three run the same `forward`.
///
/// A plain function choosing between two futures, not an `async fn` around
/// them: an `async fn` would keep its own copy of the arguments beside the
/// inner future's, in every request's future.
pub fn run<'a>(
    client: &'a mut ClientStream,
    side: ClientSide<'a>,
    server: &'a mut ServerConn,
    release: bool,
) -> impl std::future::Future<Output = Result<Ended, ClientError>> + 'a {
    match client {
        ClientStream::Plain(tcp) => {
            let (reader, writer) = tcp.split();
            Either::Left(forward(reader, writer, side, server, release))
        }
        ClientStream::Unix(unix) => {
            let (reader, writer) = unix.split();
            Either::Right(Either::Left(forward(reader, writer, side, server, release)))
        }
        other => {
            let (reader, writer) = tokio::io::split(other);
            Either::Right(Either::Right(forward(reader, writer, side, server, release)))
        }
    }
}

async fn forward<CR: AsyncRead + Unpin, CW: AsyncWrite + Unpin>(
    mut cr: CR,
    mut cw: CW,
    mut side: ClientSide<'_>,
    server: &mut ServerConn,
    release: bool,
) -> Result<Ended, ClientError> {
    let metrics = server.metrics().clone();
    let taken_at = server.taken_at;
    // The parts are used in place, not bound to locals of their own: each
    // local held across an await is another slot in a request's future.
    let s = server.parts();
    let mut wd = Watchdog::new(s.spec, s.cancel, s.alarm);
    let (mut sr, mut sw) = s.stream.split();
    let mut to_server = Bytes::new();
    let mut to_client = Bytes::new();
    let mut settled = false;
    let mut terminating = false;
    let mut told = false;
    // When the first byte of the queries now running went to the server
    // (query time). The first query's is the hand-over's reading (the
    // server's `taken_at`): the write follows it by microseconds, and it
    // saves a clock reading.
    let mut query_started = Some(taken_at);
    loop {
        if to_server.is_empty() && !side.unread.is_empty() && !terminating {
            let Some(batch) = to_server_batch(&mut side, s.conv, s.statements, &mut sw)? else {
                return Ok(Ended::ServerGone { told });
            };
            terminating = batch.terminate;
            to_server = batch.out;
            if batch.sent > 0 {
                metrics.record_server_sent(batch.sent);
                query_started.get_or_insert_with(std::time::Instant::now);
            }
        }
        // Once the server owes nothing and goes back, bytes it sent after
        // the settling ReadyForQuery were not asked for: they stay with the
        // connection (which the pool then closes), never reach this client.
        let releasing = settled && release && side.prepared.pinned().is_none() && s.conv.is_clean();
        if to_client.is_empty() && !s.unread.is_empty() && !releasing {
            let Some(got) = from_server(s.unread, s.conv, s.params, s.broken, s.statements, &mut side, &mut cw)? else {
                return Ok(client_gone(&mut sw, &to_server).await);
            };
            if got.sent > 0 {
                metrics.record_sent(got.sent);
            }
            to_client = got.out;
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
        if let Some(owed) = to_client.is_empty().then(|| side.prepared.synthetic()).flatten() {
            to_client = owed.bytes;
            settled |= owed.settled;
        }
        if to_server.is_empty() && to_client.is_empty() {
            if terminating {
                return Ok(client_gone(&mut sw, &to_server).await);
            }
            if settled && release && side.prepared.pinned().is_none() && s.conv.is_clean() {
                return Ok(Ended::Released);
            }
            settled = false;
        }
        let held = to_server.is_empty() && !terminating && holds_whole_message(side.unread, side.max_message);
        wd.update(s.conv, s.unread.len() < HIGH_WATER, to_server.is_empty() && !terminating, query_started, held);
        tokio::select! {
            biased;
            r = sw.write(&to_server), if !to_server.is_empty() => match r {
                Ok(n) => {
                    to_server.advance(n);
                    metrics.record_server_sent(n);
                    query_started.get_or_insert_with(std::time::Instant::now);
                }
                Err(_) => return Ok(Ended::ServerGone { told }),
            },
            r = cw.write(&to_client), if !to_client.is_empty() => match r {
                Ok(n) => {
                    to_client.advance(n);
                    metrics.record_sent(n);
                }
                Err(_) => return Ok(client_gone(&mut sw, &to_server).await),
            },
            r = sr.read_buf(s.unread), if s.unread.len() < HIGH_WATER => match r {
                Ok(0) | Err(_) => {
                    let _ = cw.write_all(&to_client).await;
                    let _ = cw.flush().await;
                    return Ok(Ended::ServerGone { told });
                }
                Ok(n) => {
                    wd.heard();
                    metrics.record_server_received(n);
                }
            },
            r = cr.read_buf(side.unread), if side.unread.len() < HIGH_WATER && !terminating => match r {
                Ok(0) | Err(_) => return Ok(client_gone(&mut sw, &to_server).await),
                Ok(n) => {
                    wd.client_spoke();
                    metrics.record_received(n);
                }
            },
            e = wd.alarm(), if wd.armed() => {
                if matches!(e, WatchdogError::Stalled) {
                    metrics.record_stalled_pipeline();
                    continue;
                }
                *s.broken = e.close_reason();
                return Err(e.into());
            }
        }
    }
}

/// Client bytes not sent begin with a whole message: weir holds it back.
fn holds_whole_message(unread: &BytesMut, max_message: usize) -> bool {
    !unread.is_empty()
        && matches!(crate::protocol::peek_header(unread, max_message), Ok(Some((_, total))) if unread.len() >= total)
}

/// Writes as much of `buf`'s first `len` bytes as `w` takes at once,
/// straight from `buf` (no split into a `Bytes`, whose shared count is one
/// more cold line by the time a queued request runs, and no `select!` round
/// before the biased write there), and advances past what it took. What it
/// did not take the caller splits off for that write. On an error all `len`
/// bytes leave `buf`, as if they had been split off: the side that failed
/// never sees them, and recovery's drain scans only what follows them.
fn write_at_once<W: AsyncWrite + Unpin>(w: &mut W, buf: &mut BytesMut, len: usize) -> std::io::Result<usize> {
    if len == 0 {
        return Ok(0);
    }
    match w.write(&buf[..len]).now_or_never() {
        Some(Ok(n)) => {
            buf.advance(n);
            Ok(n)
        }
        Some(Err(e)) => {
            buf.advance(len);
            Err(e)
        }
        None => Ok(0),
    }
}

/// What the client's buffered bytes gave the server.
struct ToServer {
    /// How many bytes went to the server at once.
    sent: usize,
    /// The rest to send.
    out: Bytes,
    /// They end with a Terminate.
    terminate: bool,
}

/// Takes the client's next batch for the server: rewritten for this
/// server's statements and scanned, then written straight from the buffer
/// as far as the server's socket takes it at once. None: that write failed
/// (the server is gone).
fn to_server_batch<SW: AsyncWrite + Unpin>(
    side: &mut ClientSide<'_>,
    conv: &mut Conversation,
    statements: &mut ServerStatements,
    sw: &mut SW,
) -> Result<Option<ToServer>, ClientError> {
    let ready = side.prepared.outbound(side.unread, conv, statements, side.max_message)?;
    let scanned = conv.scan_client(&side.unread[..ready], side.max_message)?;
    let Ok(sent) = write_at_once(sw, side.unread, scanned.forward) else { return Ok(None) };
    let out = if sent < scanned.forward { side.unread.split_to(scanned.forward - sent).freeze() } else { Bytes::new() };
    Ok(Some(ToServer { sent, out, terminate: scanned.terminate }))
}

/// What the server's buffered bytes gave the client.
struct FromServer {
    /// How many bytes went to the client at once.
    sent: usize,
    /// The rest to pass on.
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
/// broken (it is not recovered). When no statement is tracked (nothing to
/// rewrite), what the client's socket takes at once goes straight from the
/// buffer. None: that write failed (the client is gone).
fn from_server<CW: AsyncWrite + Unpin>(
    server_in: &mut BytesMut,
    conv: &mut Conversation,
    server_params: &mut ParamMap,
    broken: &mut Option<weir_metrics::CloseReason>,
    statements: &mut ServerStatements,
    side: &mut ClientSide<'_>,
    cw: &mut CW,
) -> Result<Option<FromServer>, ClientError> {
    let owed = conv.pending_rfq;
    let scan = conv.scan_server(server_in, |k, v| {
        server_params.set(k, v);
        side.params.set(k, v);
    });
    let scanned = scan.map_err(|e| {
        *broken = Some(weir_metrics::CloseReason::ProtocolError);
        ClientError::BadServerMessage(e)
    })?;
    let answered = owed.saturating_sub(conv.pending_rfq) as usize;
    // A tracked client's replies may be rewritten: they go through `inbound` whole.
    let tracking = side.prepared.is_tracking();
    let sent = if tracking {
        0
    } else {
        side.prepared.observe(&server_in[..scanned.forward]);
        match write_at_once(cw, server_in, scanned.forward) {
            Ok(n) => n,
            Err(_) => return Ok(None),
        }
    };
    let out = if tracking || sent < scanned.forward {
        side.prepared.inbound(server_in.split_to(scanned.forward - sent).freeze(), statements)
    } else {
        Bytes::new()
    };
    Ok(Some(FromServer { sent, out, settled: scanned.settled, fatal: scanned.fatal, answered }))
}

/// The client left. Client bytes already counted as sent are sent, so the
/// server's stream stays on a message boundary for recovery.
async fn client_gone(sw: &mut crate::server::stream::ServerWriter<'_>, to_server: &[u8]) -> Ended {
    if to_server.is_empty() {
        return Ended::ClientGone;
    }
    match tokio::time::timeout(FLUSH_LIMIT, sw.write_all(to_server)).await {
        Ok(Ok(())) => Ended::ClientGone,
        _ => Ended::ServerGone { told: true },
    }
}
