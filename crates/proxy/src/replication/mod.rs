//! Replication connections through weir (`replication=database` for
//! logical replication and SQL on a logical walsender; `replication=true`
//! for physical: pg_basebackup, pg_receivewal, a standby). Each client,
//! once authenticated (`login::replicating`), gets a server connection of
//! its own, never pooled: it takes a place of its pool (`pool::replication`:
//! counted under pool_size, max_db_connections and max_user_connections, as
//! PgBouncer counts it; an idle server gives up its place when none is
//! free), waiting for one within its wait budget; the server logs in with
//! the client's startup parameters (its `options` whole); the client is
//! greeted with the server's own parameters and weir's cancel key; then the
//! bytes pass both ways untouched (`relay`) until either side ends.
//!
//! A client that leaves ends its server at once (a Terminate first, when
//! the client's stream stopped between messages). A server that closes or
//! fails ends its client at once: what the server said last reaches the
//! client, then a FATAL 08006 if the server said no error itself, then
//! the close. KILL (and the end of a drain's shutdown_timeout) lets the
//! server's current message through, then sends FATAL 57P01. A server that
//! refuses the login (no REPLICATION role, no pg_hba.conf line for
//! replication) fails the client's login with PgBouncer's "login failed",
//! Postgres's message in DETAIL; connects that fail for a while (refused,
//! timed out, the database starting up) are retried within the wait budget.

mod relay;

use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use weir_metrics::{CloseReason, PoolMetrics};

use crate::login::replicating::{self, Replicating};
use crate::login::stream::close_after_error;
use crate::login::{ClientError, ClientStream};
use crate::pool::{Pool, ReplicationPlace};
use crate::protocol::messages::{self, Severity};
use crate::protocol::{tags, SqlState};
use crate::server::{ConnectError, ServerConn};
use crate::state::client_list::farewell_code;
use crate::state::Shared;
use relay::{Pipe, Stop};

/// Client bytes buffered, at most, while the client waits for its server.
const LOGIN_WAIT_READ_LIMIT: usize = 64 * 1024;

/// The longest pause between two connects of a replication server that
/// failed for a while (refused, timed out, the database starting up).
const RETRY_MAX: Duration = Duration::from_secs(1);

/// How long weir's own last message to either side may take.
const LAST_WORDS_LIMIT: Duration = Duration::from_secs(1);

/// Why the server's login did not give the client a connection.
enum Refused {
    /// The client's own error (it left, no place within its budget, ...).
    Client(ClientError),
    /// Postgres refused the login: its SQLSTATE and message.
    Login(SqlState, String),
}

impl From<ClientError> for Refused {
    fn from(e: ClientError) -> Self {
        Refused::Client(e)
    }
}

/// Serves a replication client to its end. Ok(None): it left; Ok(Some(why)):
/// weir ended it (or its server did), and told it so where it could.
pub async fn serve(
    socket: &mut ClientStream,
    mut login: Replicating,
    shared: &Arc<Shared>,
) -> Result<Option<&'static str>, ClientError> {
    let (reg, secret) = login.register(shared);
    let mut buf = std::mem::take(&mut login.buf);
    let opened = open(socket, &mut buf, &login).await;
    let (place, mut conn) = match opened {
        Ok(v) => v,
        Err(Refused::Client(e)) => return Err(replicating::finish(Err(e), shared, &mut login, &reg, "").unwrap_err()),
        Err(Refused::Login(code, detail)) => {
            // Told by the caller, after the log line that says why it closes.
            let refused = Err(ClientError::ServerLoginFailed { code, detail });
            return Err(replicating::finish(refused, shared, &mut login, &reg, "").unwrap_err());
        }
    };
    let greeted = replicating::greet(socket, &conn.params, (reg.pid, secret.as_bytes())).await;
    let application_name = conn.params.get("application_name").unwrap_or_default().to_owned();
    let _listed = match replicating::finish(greeted, shared, &mut login, &reg, &application_name) {
        Ok(listed) => listed,
        Err(e) => {
            conn.close(CloseReason::ReplicationEnded);
            return Err(e);
        }
    };
    reg.slot.set_active(conn.cancel.clone());
    let ended = relay(socket, &mut conn, &buf, &reg.slot, place.pool()).await;
    finish(socket, conn, ended).await
}

/// A place in the pool, then the server's login, while watching the client
/// (one that leaves meanwhile gives its place up); its early bytes stay in
/// `buf`.
async fn open(
    socket: &mut ClientStream,
    buf: &mut BytesMut,
    login: &Replicating,
) -> Result<(ReplicationPlace, ServerConn), Refused> {
    let pool = &login.pool;
    let deadline = Instant::now() + login.budget.under(pool.query_wait_timeout());
    let opening = async {
        let place = pool.replication_place(deadline).await.map_err(ClientError::from)?;
        let conn = connect(pool, &login.startup, deadline).await?;
        Ok::<_, Refused>((place, conn))
    };
    let mut opening = std::pin::pin!(opening);
    loop {
        tokio::select! {
            biased;
            r = &mut opening => return r,
            r = crate::wire::fill(socket, buf), if buf.len() < LOGIN_WAIT_READ_LIMIT => {
                r.map_err(ClientError::from)?;
            }
        }
    }
}

/// Logs the replication server in, trying again (until `deadline`) while
/// the failure is one that passes (refused, timed out, reset, 57P03, 53300).
async fn connect(pool: &Arc<Pool>, startup: &[(String, String)], deadline: Instant) -> Result<ServerConn, Refused> {
    let spec = Arc::new(pool.replication_spec(startup));
    let mut pause = Duration::from_millis(100);
    loop {
        let started = Instant::now();
        let e = match pool.open_replication(spec.clone()).await {
            Ok(conn) => return Ok(conn),
            Err(e) => e,
        };
        pool.metrics.record_connect_failure(e.failure_label());
        if let Some((code, message)) = e.rejection() {
            log_refused(pool, &e, started);
            return Err(Refused::Login(code, message));
        }
        if Instant::now() + pause >= deadline {
            log_refused(pool, &e, started);
            return Err(Refused::Login(e.sqlstate(), e.to_string()));
        }
        tracing::warn!(database = %pool.key.database, user = %pool.key.user, error = %e, "replication server connect failed; trying again");
        tokio::time::sleep(pause).await;
        pause = (pause * 2).min(RETRY_MAX);
    }
}

/// PgBouncer's lines for a replication server whose login failed: the
/// server's error, then the connection's close.
fn log_refused(pool: &Pool, e: &ConnectError, started: Instant) {
    let (db, user) = (&pool.key.database, &pool.key.user);
    tracing::warn!("S: {db}/{user} login failed: {e}");
    let age = started.elapsed().as_secs_f64();
    tracing::info!("S: {db}/{user} closing because: login failed (age={age:.3}s)");
}

/// How a relay ended.
enum Ended {
    /// The client left (Terminate, EOF, a failed write to it).
    ClientLeft,
    /// The server closed or failed; the last tag it sent, and whether its
    /// stream to the client stopped between two messages.
    ServerLost { last_tag: u8, at_boundary: bool },
    /// KILL, or a drain's shutdown_timeout: `why`.
    Killed(&'static str),
}

/// The relay itself, both directions in one poll, with the client's KILL
/// switch beside them. Traffic is counted in the pool's byte counters.
async fn relay(
    socket: &mut ClientStream,
    conn: &mut ServerConn,
    early: &[u8],
    slot: &crate::cancel_keys::CancelSlot,
    pool: &Arc<Pool>,
) -> Ended {
    let metrics = &pool.metrics;
    let mut up = Pipe::new(early);
    let mut down = Pipe::new(&conn.rbuf);
    conn.rbuf.clear();
    let server = &mut conn.stream;
    let (mut up_seen, mut down_seen) = (0, 0);
    let ended = relay::run_until(|cx| {
        if let Poll::Ready(why) = slot.switch.poll_killed(cx) {
            return Poll::Ready(Some(Ended::Killed(why)));
        }
        let mut moved = false;
        match up.poll_move(cx, socket, server) {
            Poll::Ready(Ok(())) => moved = true,
            Poll::Ready(Err(Stop::SourceGone | Stop::Garbled)) => return Poll::Ready(Some(Ended::ClientLeft)),
            Poll::Ready(Err(Stop::DestinationGone)) => {
                return Poll::Ready(Some(Ended::ServerLost { last_tag: down.marks.last_tag(), at_boundary: false }))
            }
            Poll::Pending => {}
        }
        match down.poll_move(cx, server, socket) {
            Poll::Ready(Ok(())) => moved = true,
            Poll::Ready(Err(Stop::SourceGone | Stop::Garbled)) if said_goodbye(&up) => {
                return Poll::Ready(Some(Ended::ClientLeft))
            }
            Poll::Ready(Err(Stop::SourceGone | Stop::Garbled)) => {
                let (last_tag, at_boundary) = (down.marks.last_tag(), down.marks.at_boundary());
                return Poll::Ready(Some(Ended::ServerLost { last_tag, at_boundary }));
            }
            Poll::Ready(Err(Stop::DestinationGone)) => return Poll::Ready(Some(Ended::ClientLeft)),
            Poll::Pending => {}
        }
        if !moved {
            return Poll::Pending;
        }
        count(metrics, up.passed - std::mem::replace(&mut up_seen, up.passed), down.passed - down_seen);
        down_seen = down.passed;
        Poll::Ready(None)
    })
    .await;
    if let Ended::Killed(_) = ended {
        // The server's message under way reaches the client whole, so that
        // weir's FATAL can follow it.
        if !down.finish_message(server, socket).await {
            return Ended::ServerLost { last_tag: 0, at_boundary: false };
        }
    }
    if let Ended::ClientLeft = ended {
        // A client gone between two messages without its Terminate: send
        // it for the client, so the walsender ends as a client's would.
        if up.marks.at_boundary() && !said_goodbye(&up) {
            let mut out = BytesMut::new();
            messages::terminate(&mut out);
            relay::write_within(server, &out, LAST_WORDS_LIMIT).await;
        }
    }
    ended
}

/// The client's last message to the server was its Terminate (the
/// server's close that follows is the client's leaving).
fn said_goodbye(up: &Pipe) -> bool {
    up.marks.at_boundary() && up.marks.last_tag() == tags::frontend::TERMINATE
}

/// Counts `up` bytes from the client to the server and `down` back.
fn count(metrics: &PoolMetrics, up: u64, down: u64) {
    if up > 0 {
        metrics.record_received(up as usize);
        metrics.record_server_sent(up as usize);
    }
    if down > 0 {
        metrics.record_server_received(down as usize);
        metrics.record_sent(down as usize);
    }
}

/// The end: the server closes (with the reason), the client is told what
/// it can be told.
async fn finish(
    socket: &mut ClientStream,
    conn: ServerConn,
    ended: Ended,
) -> Result<Option<&'static str>, ClientError> {
    match ended {
        Ended::ClientLeft => {
            conn.close(CloseReason::ReplicationEnded);
            Ok(None)
        }
        Ended::Killed(why) => {
            conn.close(CloseReason::Admin);
            fatal(socket, farewell_code(why), why).await;
            Ok(Some(why))
        }
        Ended::ServerLost { last_tag, at_boundary } => {
            conn.close(CloseReason::ServerClosed);
            if at_boundary && last_tag != tags::backend::ERROR_RESPONSE {
                return Err(ClientError::ServerLost);
            }
            Ok(Some("server closed the replication connection"))
        }
    }
}

/// Sends a FATAL and closes.
async fn fatal(socket: &mut ClientStream, code: SqlState, message: &str) {
    let mut out = BytesMut::new();
    messages::error_response(&mut out, Severity::Fatal, code, message);
    let sent = tokio::time::timeout(LAST_WORDS_LIMIT, socket.write_all(&out)).await;
    if matches!(sent, Ok(Ok(()))) {
        close_after_error(socket).await;
    }
}
