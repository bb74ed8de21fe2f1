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

use super::prepared::ClientStatements;
use super::transfer_watchdog::{AlarmTimer, Watchdog, WatchdogError};
use crate::login::{ClientError, ClientStream};
use crate::params::ParamMap;
use crate::server::role::IN_HOT_STANDBY;
use crate::server::{ServerConn, ServerSide};

/// Read no more from a side while this much of its output is unsent.
const HIGH_WATER: usize = 256 * 1024;

/// How long the last bytes of a side that left may take to reach the other.
const FLUSH_LIMIT: std::time::Duration = std::time::Duration::from_secs(5);

/// How the active phase ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Ended {
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
pub(crate) struct ClientSide<'a> {
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
pub(crate) fn run<'a>(
    client: &'a mut ClientStream,
    side: ClientSide<'a>,
    server: &'a mut ServerConn,
    alarm: &'a mut AlarmTimer,
    release: bool,
) -> impl std::future::Future<Output = Result<Ended, ClientError>> + 'a {
    match client {
        ClientStream::Plain(tcp) => {
            let (reader, writer) = tcp.split();
            Either::Left(forward(reader, writer, side, server, alarm, release))
        }
        ClientStream::Unix(unix) => {
            let (reader, writer) = unix.split();
            Either::Right(Either::Left(forward(reader, writer, side, server, alarm, release)))
        }
        other => {
            let (reader, writer) = tokio::io::split(other);
            Either::Right(Either::Right(forward(reader, writer, side, server, alarm, release)))
        }
    }
}

/// `alarm`: the client's watchdog timer.
async fn forward<CR: AsyncRead + Unpin, CW: AsyncWrite + Unpin>(
    mut cr: CR,
    mut cw: CW,
    mut side: ClientSide<'_>,
    server: &mut ServerConn,
    alarm: &mut AlarmTimer,
    release: bool,
) -> Result<Ended, ClientError> {
    let metrics = server.metrics().clone();
    // When the first byte of the queries now running went to the server
    // (query time). The first query's is the hand-over's reading (the
    // server's `taken_at`): the write follows it by microseconds, and it
    // saves a clock reading.
    let mut flow = Flow::new(server.taken_at(), release);
    // The parts are used in place, not bound to locals of their own: each
    // local held across an await is another slot in a request's future.
    let mut s = server.parts();
    let mut wd = Watchdog::new(s.spec, s.cancel, alarm);
    let (mut sr, mut sw) = s.stream.split();
    loop {
        // A statement of its own: the `?`'s temporary would otherwise stay
        // in the future across the flush's await.
        let next = flow.step(&mut side, &mut s.side, (&mut sw, &mut cw), &metrics, &mut wd)?;
        match next {
            Next::Go => {}
            Next::End(ended) => return Ok(ended),
            Next::ClientGone => return Ok(client_gone(&mut sw, &flow.to_server).await),
        }
        let unsent = !flow.to_server.is_empty();
        let client_quiet = !unsent && !flow.terminating;
        let held = client_quiet && holds_whole_message(side.unread, side.max_message);
        wd.update(s.side.conv, s.side.unread.len() < HIGH_WATER, unsent, client_quiet, flow.query_started, held);
        tokio::select! {
            biased;
            r = sw.write(&flow.to_server), if !flow.to_server.is_empty() => match r {
                Ok(n) => {
                    flow.to_server.advance(n);
                    metrics.record_server_sent(n);
                    flow.query_started.get_or_insert_with(std::time::Instant::now);
                    // Its socket had been full: the server took bytes, it is alive.
                    wd.heard();
                }
                Err(_) => return Ok(Ended::ServerGone { told: flow.told }),
            },
            r = cw.write(&flow.to_client), if !flow.to_client.is_empty() => match r {
                Ok(n) => {
                    flow.to_client.advance(n);
                    metrics.record_sent(n);
                }
                Err(_) => return Ok(client_gone(&mut sw, &flow.to_server).await),
            },
            r = sr.read_buf(s.side.unread), if s.side.unread.len() < HIGH_WATER => match r {
                Ok(0) | Err(_) => return Ok(server_gone(&mut cw, &flow).await),
                Ok(n) => {
                    wd.heard();
                    metrics.record_server_received(n);
                }
            },
            r = cr.read_buf(side.unread), if side.unread.len() < HIGH_WATER && !flow.terminating => match r {
                Ok(0) | Err(_) => return Ok(client_gone(&mut sw, &flow.to_server).await),
                Ok(n) => {
                    wd.client_spoke();
                    metrics.record_received(n);
                }
            },
            e = std::future::poll_fn(|cx| wd.poll_alarm(cx)), if wd.armed() => {
                if matches!(e, WatchdogError::Stalled) {
                    metrics.record_stalled_pipeline();
                    continue;
                }
                *s.side.broken = e.close_reason();
                return Err(e.into());
            }
        }
    }
}

/// What one turn of the forwarding loop found before it waits.
enum Next {
    /// Wait for the sockets and the watchdog.
    Go,
    /// The transfer ends.
    End(Ended),
    /// The client left: what is owed the server is flushed first.
    ClientGone,
}

/// The forwarding loop's state between turns: bytes taken and not yet
/// written each way, and what the server's replies settled.
struct Flow {
    to_server: Bytes,
    to_client: Bytes,
    /// The last ReadyForQuery passed on settled what the server owed.
    settled: bool,
    /// The client's bytes end with a Terminate.
    terminating: bool,
    /// A FATAL from the server reached the client.
    told: bool,
    /// The server goes back to the pool once it owes nothing.
    release: bool,
    /// When the first byte of the queries now running went to the server.
    query_started: Option<std::time::Instant>,
}

impl Flow {
    fn new(taken_at: std::time::Instant, release: bool) -> Self {
        Flow {
            to_server: Bytes::new(),
            to_client: Bytes::new(),
            settled: false,
            terminating: false,
            told: false,
            release,
            query_started: Some(taken_at),
        }
    }

    /// Takes what each side has buffered for the other (writing what the
    /// sockets take at once) and decides whether the transfer ends.
    fn step<SW: AsyncWrite + Unpin, CW: AsyncWrite + Unpin>(
        &mut self,
        client: &mut ClientSide<'_>,
        server: &mut ServerSide<'_>,
        (sw, cw): (&mut SW, &mut CW),
        metrics: &weir_metrics::PoolMetrics,
        wd: &mut Watchdog<'_>,
    ) -> Result<Next, ClientError> {
        if self.to_server.is_empty() && !client.unread.is_empty() && !self.terminating {
            let Some(batch) = to_server_batch(client, server, sw)? else {
                return Ok(Next::End(Ended::ServerGone { told: self.told }));
            };
            self.terminating = batch.terminate;
            if !self.release && (batch.sent > 0 || !batch.out.is_empty()) {
                wd.timer().session_xact_begun();
            }
            self.to_server = batch.out;
            if batch.sent > 0 {
                metrics.record_server_sent(batch.sent);
                self.query_started.get_or_insert_with(std::time::Instant::now);
            }
        }
        // Once the server owes nothing and goes back, bytes it sent after
        // the settling ReadyForQuery were not asked for: they stay with the
        // connection (which the pool then closes), never reach this client.
        // When it does not go back, they are the replies to what the client
        // pipelined behind its Sync, and are taken in this turn too: no
        // other event may come to take them.
        while self.to_client.is_empty() && !server.unread.is_empty() && !self.releasing(client, server) {
            let Some(got) = from_server(server, client, cw)? else { return Ok(Next::ClientGone) };
            if got.sent > 0 {
                metrics.record_sent(got.sent);
            }
            self.to_client = got.out;
            self.settled |= got.settled;
            self.told |= got.fatal;
            if got.answered > 0 {
                wd.answered();
                // One query per ReadyForQuery (a simple Query, or a batch up to Sync).
                (0..got.answered).for_each(|_| metrics.record_query());
                client.prepared.publish_counts();
                if let Some(t) = self.query_started.take() {
                    metrics.record_query_time(t.elapsed());
                }
                // Session mode: a transaction ends where its server is idle
                // again (transaction mode counts it as the server goes back).
                if !self.release && got.settled && server.conv.is_clean() {
                    if let Some(held) = wd.timer().session_xact_ended() {
                        metrics.record_transaction(held);
                    }
                }
            }
            if !got.settled {
                // Every whole message was taken.
                break;
            }
        }
        if let Some(owed) = self.to_client.is_empty().then(|| client.prepared.synthetic()).flatten() {
            self.to_client = owed.bytes;
            self.settled |= owed.settled;
        }
        if self.to_server.is_empty() && self.to_client.is_empty() {
            if self.terminating {
                return Ok(Next::ClientGone);
            }
            if self.releasing(client, server) {
                return Ok(Next::End(Ended::Released));
            }
            self.settled = false;
        }
        Ok(Next::Go)
    }
}

impl Flow {
    /// The server owes nothing and goes back to the pool.
    #[inline]
    fn releasing(&self, client: &ClientSide<'_>, server: &ServerSide<'_>) -> bool {
        self.settled && self.release && client.prepared.pinned().is_none() && server.conv.is_clean()
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
    client: &mut ClientSide<'_>,
    server: &mut ServerSide<'_>,
    sw: &mut SW,
) -> Result<Option<ToServer>, ClientError> {
    let ready = client.prepared.outbound(client.unread, server.conv, server.statements, client.max_message)?;
    let scanned = server.conv.scan_client(&client.unread[..ready], client.max_message)?;
    let Ok(sent) = write_at_once(sw, client.unread, scanned.forward) else { return Ok(None) };
    let out =
        if sent < scanned.forward { client.unread.split_to(scanned.forward - sent).freeze() } else { Bytes::new() };
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
    server: &mut ServerSide<'_>,
    client: &mut ClientSide<'_>,
    cw: &mut CW,
) -> Result<Option<FromServer>, ClientError> {
    let owed = server.conv.owed();
    let (server_params, client_params) = (&mut *server.params, &mut *client.params);
    let mut role_changed = false;
    let scan = server.conv.scan_server(server.unread, |k, v| {
        role_changed |= k == IN_HOT_STANDBY && server_params.get(k) != Some(v);
        server_params.set(k, v);
        if !crate::params::is_fixed(k) {
            client_params.set(k, v);
        }
    });
    let scanned = scan.map_err(|e| {
        *server.broken = Some(weir_metrics::CloseReason::ProtocolError);
        ClientError::BadServerMessage(e)
    })?;
    // A standby promoted under this server: it retires when released, and
    // its host's role is asked again. A write it refused where writes are
    // wanted is weighed at the release (`Pool::give_back`).
    if role_changed {
        server.broken.get_or_insert(weir_metrics::CloseReason::RoleChanged);
    }
    if scanned.refused_write && server.wants_writes {
        *server.refused_write = true;
    }
    let answered = owed.saturating_sub(server.conv.owed()) as usize;
    // A tracked client's replies may be rewritten: they go through `inbound` whole.
    let tracking = client.prepared.is_tracking();
    let sent = if tracking {
        0
    } else {
        client.prepared.observe(&server.unread[..scanned.forward]);
        match write_at_once(cw, server.unread, scanned.forward) {
            Ok(n) => n,
            Err(_) => return Ok(None),
        }
    };
    let out = if tracking || sent < scanned.forward {
        client.prepared.inbound(server.unread.split_to(scanned.forward - sent).freeze(), server.statements)
    } else {
        Bytes::new()
    };
    Ok(Some(FromServer { sent, out, settled: scanned.settled, fatal: scanned.fatal, answered }))
}

/// The server closed. What it sent before goes on to the client, for at
/// most `FLUSH_LIMIT`: a client that does not read must not keep the dead
/// server's place in the pool.
async fn server_gone<CW: AsyncWrite + Unpin>(cw: &mut CW, flow: &Flow) -> Ended {
    // Boxed: rare, and kept out of every request's future.
    let flush = Box::pin(tokio::time::timeout(FLUSH_LIMIT, async {
        cw.write_all(&flow.to_client).await?;
        cw.flush().await
    }));
    let _ = flush.await;
    Ended::ServerGone { told: flow.told }
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
