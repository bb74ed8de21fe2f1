//! A logged-in client's life: Idle (no server held) → Waiting (queued for a
//! server, still watching the socket and the cancel registry) → Active
//! (bytes flow) → back to Idle when the transaction ends, until the client
//! leaves. A queued query whose client leaves or cancels is dropped, never run.

use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use bytes::{Buf, BytesMut};
use futures_util::FutureExt;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir_metrics::{CloseReason, DropReason};

use super::prepared::ClientStatements;
use super::transfer::{self, ClientSide, Ended};
use super::transfer_watchdog::AlarmTimer;
use crate::cancel_keys::Registration;
use crate::config::PoolMode;
use crate::login::{Budget, ClientError, ClientStream, LoggedIn};
use crate::params::ParamMap;
use crate::pool::{Lease, Pool, PoolError};
use crate::protocol::{
    messages::{self, Severity},
    peek_header, sqlstate,
    tags::frontend as fe,
};
use crate::server::exchange::SETTINGS_LIMIT;
use crate::server::readback::Readback;
use crate::wire;
use statement::{BeginSent, Begun, Statements};
use wait::Wait;

mod statement;
mod wait;

/// Postgres's own words for a cancelled statement.
const CANCELED_MESSAGE: &str = "canceling statement due to user request";

/// One client's session state.
pub struct Session<'a> {
    pub(crate) client: &'a mut ClientStream,
    pub(crate) client_in: BytesMut,
    pub(crate) pool: Arc<Pool>,
    pub(crate) mode: PoolMode,
    pub(crate) params: ParamMap,
    pub(crate) settings: ParamMap,
    pub(crate) reg: Registration,
    /// How long this client may wait for a server.
    pub(crate) budget: Budget,
    pub(crate) max_message: u32,
    pub(crate) shutdown: crate::signal::Signal,
    /// Client messages are being discarded up to the next Sync.
    skipping: bool,
    /// Named prepared statements and pinning (transaction mode).
    prepared: ClientStatements,
    /// The client's listing for SHOW CLIENTS and KILL (set once logged in).
    pub(crate) listed: Option<crate::state::client_list::ClientGuard>,
    /// Session mode: the server taken at login, for the first request.
    pub(crate) held: Option<Box<Lease>>,
    /// The transfer watchdog's timer, kept from one request to the next.
    alarm: Box<AlarmTimer>,
    /// The last statement it queued with, and a BEGIN held back (made the
    /// first time the pool makes it queue).
    statements: Option<Box<Statements>>,
}

/// How a wait between requests ended.
#[derive(Debug, PartialEq, Eq)]
enum Woke {
    /// Bytes arrived (or, for `idle_wait`, can be read).
    Data,
    Drained,
    Gone,
}

impl<'a> Session<'a> {
    /// A session for `client`, whose unread bytes are `client_in`.
    pub(crate) fn new(client: &'a mut ClientStream, client_in: BytesMut, login: LoggedIn) -> Self {
        let LoggedIn { pool, mode, mut params, mut settings, reg, budget, max_message, shutdown } = login;
        // RESET goes back to the startup settings, as in Postgres.
        settings.keep_as_reset_values();
        // Clients with the same values share stamps (see `ServerConn::sync_params`).
        pool.stamps.canonicalize(&mut params);
        pool.stamps.canonicalize(&mut settings);
        let transaction = mode == PoolMode::Transaction;
        let pool_settings = pool.settings();
        let mut prepared =
            ClientStatements::new(transaction, pool_settings.max_prepared_statements, pool.metrics.clone());
        // A search_path of its own resolves names unlike the pool's other
        // clients: its unnamed statements are not shared.
        if settings.get("search_path").is_none() {
            prepared.prepare_unnamed_after(pool_settings.prepare_unnamed_after);
        }
        prepared.resolves_names_with(settings.get("search_path"));
        Session {
            client,
            client_in,
            pool,
            mode,
            params,
            settings,
            reg,
            budget,
            max_message,
            shutdown,
            skipping: false,
            prepared,
            listed: None,
            held: None,
            alarm: Box::default(),
            statements: None,
        }
    }

    /// Ends the session (its registration, pool handle and statement state
    /// are dropped here) and hands back the client's socket.
    pub(crate) fn into_client(self) -> &'a mut ClientStream {
        self.client
    }

    /// Runs until the client leaves.
    pub(crate) async fn run(&mut self) -> Result<(), ClientError> {
        loop {
            if !self.next_request().await? {
                return Ok(());
            }
            // Boxed: a request's state (the lease, the forwarding loop) is on
            // the heap only while it runs, so an idle client's task stays small.
            if !Box::pin(self.one_request()).await? {
                return Ok(());
            }
        }
    }

    /// Gets a server for the buffered request and serves it. Returns false
    /// when the session is over.
    pub(crate) async fn one_request(&mut self) -> Result<bool, ClientError> {
        if self.begun() != Begun::No {
            if let Some(done) = self.end_without_server().await? {
                return Ok(done);
            }
        }
        if let Some(e) = self.too_late(None) {
            return self.refused(e).await;
        }
        // One clock reading for the request's start: its place in SHOW
        // CLIENTS, the idle server's checkout and, when it must queue, its
        // wait.
        let arrived = Instant::now();
        self.reg.slot.set_waiting(arrived);
        // The common case, with nothing awaited: a server is idle and ready.
        // The queue's wait is not boxed apart: its state shares the request
        // future's room with `serve`'s (one runs after the other), so it
        // adds no bytes there (920 either way, see app/footprint.rs), where
        // a box of its own was one more allocation, a 624-byte copy and one
        // more cold line per queued request.
        let outcome = match self.ready_server(arrived) {
            Some(lease) => Wait::Got(lease),
            // Transaction mode: a bare BEGIN that would queue is answered
            // here, and the statement after it queues instead.
            None if self.mode == PoolMode::Transaction && self.request_is_bare_begin() => {
                self.reg.slot.set_idle();
                return self.hold_begin().await;
            }
            None => self.wait_for_server(arrived).await,
        };
        let lease = match self.settle(outcome) {
            Wait::Got(lease) => lease,
            Wait::Gone => {
                self.pool.metrics.record_dropped_query(DropReason::ClientGone);
                return Ok(false);
            }
            Wait::Cancelled => {
                self.pool.metrics.record_dropped_query(DropReason::Cancelled);
                self.refuse_request(sqlstate::QUERY_CANCELED, CANCELED_MESSAGE).await?;
                return Ok(true);
            }
            // SHUTDOWN WAIT_FOR_SERVERS: no new transaction; the client goes.
            // So does a client whose pool cannot log in to Postgres (a
            // password, pg_hba.conf, a role or database gone): it gets
            // Postgres's FATAL, as a direct connection would (PgBouncer's).
            Wait::Failed(
                e @ (PoolError::ShuttingDown | PoolError::LoginRejected { .. } | PoolError::LoginFailing { .. }),
            ) => return Err(ClientError::NoServer(e)),
            Wait::Failed(e) => return self.refused(e).await,
        };
        self.serve(lease).await
    }

    /// The server a request gets with nothing awaited, taken at `arrived`:
    /// the one held since login (session mode), or an idle one.
    fn ready_server(&mut self, arrived: Instant) -> Option<Lease> {
        match self.held.take() {
            Some(held) => {
                let mut lease = *held;
                lease.restamp(arrived);
                Some(lease)
            }
            None => self.pool.try_checkout_at(arrived),
        }
    }

    /// Answers a query the pool gave no server (or admission refused): the
    /// client gets the error and keeps its connection.
    async fn refused(&mut self, e: PoolError) -> Result<bool, ClientError> {
        if let Some(reason) = e.drop_reason() {
            self.pool.metrics.record_dropped_query(reason);
        }
        static DROPPED: crate::ratelog::RateLimited = crate::ratelog::RateLimited::new();
        if let Some(held) = DROPPED.allow() {
            crate::span::client_event!(warn, error = %e, "query dropped: no server in time ({held} more since the last line)");
        }
        let err = ClientError::NoServer(e);
        self.refuse_request(err.sqlstate(), &err.client_message()).await?;
        Ok(true)
    }

    /// Waits, holding no server, until a request that needs one is buffered.
    /// Returns false when the client leaves.
    async fn next_request(&mut self) -> Result<bool, ClientError> {
        loop {
            // Draining: a client between transactions starts no new one,
            // even if its next request is already buffered.
            if self.shutdown.is_cancelled() {
                // Boxed: rare, and kept out of the idle client's future.
                Box::pin(self.say_shutting_down()).await;
                return Ok(false);
            }
            if let Some((tag, total)) = peek_header(&self.client_in, self.max_message as usize)? {
                let whole = self.client_in.len() >= total;
                if tag == fe::TERMINATE {
                    return Ok(false);
                }
                if !crate::server::conversation::is_session_message(tag) {
                    // Refused without taking a server (transfer refuses it too).
                    return Err(crate::protocol::ProtocolError::UnexpectedTag(tag).into());
                }
                if self.skipping || tag == fe::SYNC || tag == fe::FLUSH {
                    // Sync (ending a skip, or alone) gets ReadyForQuery;
                    // Flush and skipped messages get nothing.
                    if whole {
                        self.client_in.advance(total);
                        if tag == fe::SYNC {
                            self.skipping = false;
                            let ready = messages::ready(self.status_between());
                            self.client.write_all(&ready).await.map_err(ClientError::Io)?;
                        }
                        continue;
                    }
                } else {
                    return Ok(true);
                }
            }
            if self.client_in.is_empty() {
                // Idle between transactions: hold no read buffer (8 KiB per
                // idle client otherwise); the thread keeps it for the next.
                wire::give_buffer(std::mem::take(&mut self.client_in));
                match self.idle_wait().await {
                    Woke::Data => {}
                    Woke::Drained => continue,
                    Woke::Gone => return Ok(false),
                }
                // A plain socket that is readable is read at once, without a
                // second wait on the drain switch (a TLS one has no
                // readiness of its own and goes through `fill` below).
                self.client_in = wire::take_buffer();
                if !self.client.is_tls() {
                    // Polled once rather than `try_read_buf`: a short read
                    // this way also clears the socket's readiness, so the
                    // reads that follow (`left_meanwhile`, the transfer
                    // loop) make no system call just to get EAGAIN.
                    match self.client.read_buf(&mut self.client_in).now_or_never() {
                        None => continue,
                        Some(Ok(0) | Err(_)) => return Ok(false),
                        Some(Ok(n)) => {
                            self.pool.metrics.record_received(n);
                            continue;
                        }
                    }
                }
            }
            if self.read_more().await == Woke::Gone {
                return Ok(false);
            }
        }
    }

    /// The wait of an idle client: for its socket to turn readable or for
    /// the drain. A poll function, not an `async fn` (no state of its own
    /// while it waits), as this is where every idle client's task spends its
    /// time. Cancel-safe.
    fn idle_wait(&self) -> impl std::future::Future<Output = Woke> + '_ {
        std::future::poll_fn(|cx| {
            if self.reg.slot.switch.poll_drained(cx).is_ready() {
                return Poll::Ready(Woke::Drained);
            }
            self.client.poll_read_ready(cx).map(|r| if r.is_ok() { Woke::Data } else { Woke::Gone })
        })
    }

    /// Reads more of a request begun, unless the drain comes first; EOF or
    /// an error is `Gone`. A poll function like `idle_wait`. Cancel-safe.
    fn read_more(&mut self) -> impl std::future::Future<Output = Woke> + use<'_, 'a> {
        wire::make_room(&mut self.client_in);
        // One pointer held across the wait (the future's size counts, see
        // app/footprint.rs), split into the fields at each poll.
        std::future::poll_fn(move |cx| {
            if self.reg.slot.switch.poll_drained(cx).is_ready() {
                return Poll::Ready(Woke::Drained);
            }
            let (client, client_in) = (&mut *self.client, &mut self.client_in);
            tokio_util::io::poll_read_buf(Pin::new(client), cx, client_in).map(|r| match r {
                Ok(0) | Err(_) => Woke::Gone,
                Ok(n) => {
                    self.pool.metrics.record_received(n);
                    Woke::Data
                }
            })
        })
    }

    /// Answers the buffered request with an error and skips the rest of it:
    /// a simple Query ends there; an extended batch ends at its Sync.
    async fn refuse_request(&mut self, code: crate::protocol::SqlState, message: &str) -> Result<(), ClientError> {
        let Some((tag, total)) = peek_header(&self.client_in, self.max_message as usize)? else { return Ok(()) };
        let mut out = BytesMut::new();
        messages::error_response(&mut out, Severity::Error, code, message);
        // A statement refused after a BEGIN weir held back fails the
        // transaction the client is in.
        if self.begun() == Begun::Held {
            self.set_begun(Begun::Failed);
        }
        if tag == fe::QUERY || tag == fe::FUNCTION_CALL {
            if self.client_in.len() >= total {
                self.client_in.advance(total);
            }
            messages::ready_for_query(&mut out, self.status_between());
        } else {
            self.skipping = true;
        }
        self.client.write_all(&out).await.map_err(ClientError::Io)
    }

    /// The FATAL of a client that the drain ends between transactions.
    async fn say_shutting_down(&mut self) {
        let err = ClientError::ShuttingDown;
        let mut out = BytesMut::new();
        messages::error_response(&mut out, Severity::Fatal, err.sqlstate(), &err.client_message());
        let _ = self.client.write_all(&out).await;
        let _ = self.client.flush().await;
    }

    /// The active phase on one borrowed server. Returns false when the
    /// session is over. The transaction's clock starts when the pool handed
    /// the server over (its reading, not one of our own).
    async fn serve(&mut self, mut lease: Lease) -> Result<bool, ClientError> {
        let session_mode = self.mode == PoolMode::Session;
        if session_mode {
            lease.set_needs_reset();
        }
        match lease.conn_mut().sync_params(&mut self.params, &self.settings).await {
            // Settings went to the server first: the query starts now, and
            // so do its clocks (and, on this rare path, the transaction's
            // hold time, which then leaves out the settings' round trip).
            Ok(true) => lease.restamp(Instant::now()),
            Ok(false) => {}
            Err(reason) => {
                self.reg.slot.set_idle();
                lease.close(reason);
                return self.server_lost(false).await;
            }
        }
        if self.begun() == Begun::Held {
            match self.send_held_begin(lease.conn_mut()).await {
                BeginSent::Ok => {}
                BeginSent::Refused(message) => {
                    self.reg.slot.set_idle();
                    drop(lease);
                    self.refuse_request(sqlstate::INTERNAL_ERROR, &message).await?;
                    return Ok(true);
                }
                BeginSent::Lost(reason) => {
                    self.reg.slot.set_idle();
                    lease.close(reason);
                    return self.server_lost(false).await;
                }
            }
        }
        if !self.reg.slot.set_active(lease.conn().cancel.clone()) {
            // Cancelled while the server was being readied: it never saw the query.
            self.reg.slot.set_idle();
            drop(lease);
            self.pool.metrics.record_dropped_query(DropReason::Cancelled);
            self.refuse_request(sqlstate::QUERY_CANCELED, CANCELED_MESSAGE).await?;
            return Ok(true);
        }
        let conn = lease.conn_mut();
        self.prepared.begin(&mut conn.statements, &conn.conv, self.pool.max_prepared_statements());
        let ended = transfer::run(
            self.client,
            ClientSide {
                unread: &mut self.client_in,
                params: &mut self.params,
                max_message: self.max_message as usize,
                prepared: &mut self.prepared,
            },
            conn,
            &mut self.alarm,
            !session_mode,
        )
        .await;
        let touched = self.transfer_ended(&mut lease, matches!(ended, Ok(Ended::Released)));
        // A statement of its own: the `?`'s temporary (with room for a
        // ClientError) would otherwise stay in the request's future across
        // the read-back's await.
        let ended = ended?;
        match ended {
            Ended::Released => {
                if touched {
                    self.record_held(lease.taken_at(), Instant::now());
                    // Boxed: rare, and kept out of every request's future.
                    let read_back = Box::pin(self.read_back_settings(lease));
                    return read_back.await;
                }
                self.release(lease);
                Ok(true)
            }
            Ended::ClientGone => {
                if lease.conn().conv.query_in_flight() {
                    self.pool.metrics.record_dropped_query(DropReason::ClientGone);
                    // Boxed: rare, and kept out of every request's future.
                    Box::pin(left_mid_query(self.client, lease)).await;
                } else {
                    drop(lease);
                }
                Ok(false)
            }
            Ended::ServerGone { told } => {
                lease.close(CloseReason::ServerClosed);
                self.server_lost(told).await
            }
        }
    }

    /// The statement state's end of a transfer. The server is reset before
    /// anyone else gets it when the client stays on it (LISTEN, locks,
    /// cursors) or changed settings that are not read back (it was not
    /// `released`). True when the client touched its settings.
    fn transfer_ended(&mut self, lease: &mut Lease, released: bool) -> bool {
        self.prepared.end(&mut lease.conn_mut().statements);
        let touched = self.prepared.take_settings_touched();
        if self.prepared.pinned().is_some() || (touched && !released) {
            lease.set_needs_reset();
        }
        self.reg.slot.set_idle();
        touched
    }

    /// The server goes back to the pool after a transaction. One clock
    /// reading for the transaction's time and the server's return (its last
    /// use, the next waiter's wait).
    fn release(&self, lease: Lease) {
        let now = Instant::now();
        self.record_held(lease.taken_at(), now);
        lease.release_at(now);
    }

    /// How long a transaction held its server, from `started` to `now`.
    fn record_held(&self, started: Instant, now: Instant) {
        let held = now.saturating_duration_since(started);
        self.pool.metrics.record_transaction(held);
        self.pool.estimate.record(held);
    }

    /// After a transaction that may have changed unreported session
    /// settings: the server's settings, read back, become the client's (and
    /// are what weir knows this server holds). A server whose settings
    /// cannot be read is reset before another client gets it; the client
    /// keeps its earlier settings (logged and counted, never told).
    async fn read_back_settings(&mut self, mut lease: Lease) -> Result<bool, ClientError> {
        let conn = lease.conn_mut();
        let read = tokio::time::timeout(SETTINGS_LIMIT, conn.read_back_settings()).await;
        match read {
            Ok(Ok(Readback::Settings(on_server))) => {
                let mut settings = self.settings.after_read_back(on_server.clone());
                self.pool.stamps.canonicalize(&mut settings);
                conn.adopt_settings(on_server);
                self.prepared.resolves_names_with(settings.get("search_path"));
                self.settings = settings;
            }
            Ok(Ok(Readback::Unreadable)) => {
                crate::span::client_event!(
                    info,
                    "session settings could not be read back; the server connection will be reset"
                );
                self.pool.metrics.record_settings_unfollowed();
                lease.set_needs_reset();
            }
            Ok(Err(reason)) => {
                self.pool.metrics.record_settings_unfollowed();
                lease.close(reason);
            }
            Err(_) => {
                self.pool.metrics.record_settings_unfollowed();
                lease.close(CloseReason::ServerError);
            }
        }
        Ok(true)
    }

    /// The server is gone. The client gets one FATAL and no more: the
    /// server's own, already passed on (`told`), or weir's, sent by
    /// `app::connection::serve` for the error returned.
    async fn server_lost(&mut self, told: bool) -> Result<bool, ClientError> {
        if told {
            crate::span::client_event!(info, "server connection closed after its FATAL reached the client");
            return Ok(false);
        }
        Err(ClientError::ServerLost)
    }
}

/// A client left while its query was in flight (Terminate, or EOF).
/// Postgres reads a Terminate once it has answered all that came before it
/// and closes then, so weir closes its end when the server has answered
/// (`settle`, no cancel), unless the client closes first or
/// `await_client_close`'s linger ends; only then does the server go back
/// (the pool cancels what still runs). A query the client cancelled, or a
/// batch the server already answered, so closes at once, as with Postgres.
async fn left_mid_query(client: &mut ClientStream, mut lease: Lease) {
    let settles = lease.conn().can_settle();
    let answered = async {
        match settles {
            true => lease.conn_mut().settle().await,
            false => std::future::pending().await,
        }
    };
    let settled = tokio::select! {
        biased;
        () = crate::login::stream::await_client_close(client) => None,
        r = answered => Some(r),
    };
    match settled {
        Some(Ok(())) => {
            // weir's FIN goes before the server does: what the next client
            // on it runs comes after this client saw the close.
            let _ = client.shutdown().now_or_never();
            drop(lease);
        }
        Some(Err(reason)) => lease.close(reason),
        None => drop(lease),
    }
}
