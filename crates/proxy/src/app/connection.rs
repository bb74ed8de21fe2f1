//! One accepted socket's task: the startup packet (a CancelRequest ends
//! here), then either the admin console (`admin`) or the pooled session
//! (`client`) until the client leaves or weir ends it; then the FATAL that
//! says why, if any. Each client runs in one tracing span `client{peer,user,db}`.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use bytes::BytesMut;
use tracing::Instrument;
use weir_metrics::ConnAddr;

use crate::client::login::{self, count_login, fatal_and_close, within, First};
use crate::client::{ClientError, ClientStream, Session};
use crate::state::client_list::{NewClient, Owner};
use crate::state::Shared;

/// Serves one accepted client connection to the end, then takes it off
/// `Shared::clients` (the accept loop counted it in). A plain function
/// returning the future (not an `async fn` around it), so the client's task
/// does not also keep the arguments' slots and a second copy of `peer` for
/// its whole life.
///
/// The span is entered at each poll of the login and of the last steps;
/// the session's polls only name it (see `span.rs`): they are most of a
/// client's polls, and entering a span costs each one.
pub fn serve(socket: ClientStream, peer: ConnAddr, shared: Arc<Shared>) -> impl std::future::Future<Output = ()> {
    let span = tracing::info_span!("client", %peer, user = tracing::field::Empty, db = tracing::field::Empty);
    let mut socket = socket;
    async move {
        let started = shared.config.load().weir.log_disconnections.then(Instant::now);
        // The refusal is boxed, like every step an idle client is not in:
        // the task's future is as large as its largest state (and an error
        // held here across an await would be part of every state).
        let ended = run(&mut socket, &peer, &shared, &span).await;
        // By value, not borrowed: a borrowed local would be kept in the
        // task's future across the refusal's await.
        let ended = log_closing(ended, started, &span);
        let refusal = ended.err().map(|e| Box::pin(refuse(&mut socket, e).instrument(span.clone())));
        if let Some(refusal) = refusal {
            refusal.await;
        }
        shared.clients.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
}

/// PgBouncer's `closing because: <reason> (age=<s>s)`, with log_disconnections.
fn log_closing(
    ended: Result<Option<&'static str>, ClientError>,
    started: Option<Instant>,
    span: &tracing::Span,
) -> Result<Option<&'static str>, ClientError> {
    if let Some(started) = started {
        let reason = closing_reason(&ended);
        let age = started.elapsed().as_secs();
        span.in_scope(|| tracing::info!("closing because: {reason} (age={age}s)"));
    }
    ended
}

/// Why a client's connection closes, in PgBouncer's words where it has
/// the same reason: the client's Terminate or end of input, the message of
/// the error that refused or ended it, or weir's reason for ending it.
fn closing_reason(ended: &Result<Option<&'static str>, ClientError>) -> std::borrow::Cow<'static, str> {
    match ended {
        Ok(None) => "client close request".into(),
        Ok(Some(why)) => (*why).into(),
        Err(e) if e.is_silent() => "client unexpected eof".into(),
        Err(e) => e.client_message().into(),
    }
}

/// Tells a client the error that ended it (unless it is one the client
/// cannot be told), then closes.
async fn refuse(socket: &mut ClientStream, e: ClientError) {
    if e.is_silent() {
        return;
    }
    tracing::warn!(sqlstate = e.sqlstate().code(), "pooler error: {e}");
    fatal_and_close(socket, e.sqlstate(), &e.client_message()).await;
}

/// A client's life: the login (boxed: it runs once, so the task's own
/// future stays as small as its longest-lived state, an idle logged-in
/// client), then the session until the client leaves (None) or weir ends
/// it (why).
async fn run(
    socket: &mut ClientStream,
    peer: &ConnAddr,
    shared: &Arc<Shared>,
    span: &tracing::Span,
) -> Result<Option<&'static str>, ClientError> {
    let login = Box::pin(log_in(socket, *peer, shared).instrument(span.clone())).await;
    let Some(mut session) = login? else { return Ok(None) };
    // The session, raced against the client's switch (a KILL), by hand
    // rather than by `select!` or a function of its own: this is part of
    // every idle client's task. Each poll names the client's span for the
    // events of the session (`span::client_event!`).
    let why = {
        let slot = session.reg.slot.clone();
        let mut run = std::pin::pin!(session.run());
        std::future::poll_fn(move |cx| {
            let _scope = crate::span::Scope::enter(crate::span::id_of(span));
            if let Poll::Ready(r) = run.as_mut().poll(cx) {
                return Poll::Ready(r.map(|()| None));
            }
            slot.switch.poll_killed(cx).map(|why| Ok(Some(why)))
        })
        .await
    };
    let Some(why) = why? else { return Ok(None) };
    // KILL or the end of a drain: the lease (if any) went back to the pool,
    // which recovers the server; the session ends and the client is told why.
    // (`why` comes back out of the box: held here across the await, it
    // would be part of every client's task.)
    Ok(Some(Box::pin(farewell(session.into_client(), why).instrument(span.clone())).await))
}

/// Tells a client that weir ended it, and why; then closes. Returns why.
async fn farewell(socket: &mut ClientStream, why: &'static str) -> &'static str {
    tracing::info!(reason = why, "client disconnected by weir");
    fatal_and_close(socket, crate::protocol::sqlstate::ADMIN_SHUTDOWN, why).await;
    why
}

/// Startup, authentication and greeting. None: nothing more to do (a
/// CancelRequest, or an admin-console session that has ended).
async fn log_in<'a>(
    socket: &'a mut ClientStream,
    peer: ConnAddr,
    shared: &Arc<Shared>,
) -> Result<Option<Session<'a>>, ClientError> {
    // The config as it is at login (a reload applies to later logins).
    let cfg = &shared.config.load();
    let mut buf = BytesMut::with_capacity(crate::wire::LOGIN_READ_CHUNK);
    let tls = shared.client_tls.load_full();
    let login_deadline = Instant::now() + cfg.weir.client_login_timeout;
    // One timer for the whole login: the startup packet and the authentication.
    let mut timer = std::pin::pin!(tokio::time::sleep_until(login_deadline.into()));
    let first = within(timer.as_mut(), login::read_startup(socket, &mut buf, tls.as_deref(), cfg)).await?;
    let (minor, req) = match first {
        First::Cancel { pid, key } => {
            // Held open until the cancel has reached Postgres (at most the
            // forward's own 5 s limit), then closed, as Postgres answers.
            if let (_, Some(forwarding)) = shared.cancels.cancel(pid, &key) {
                let _ = forwarding.await;
            }
            return Ok(None);
        }
        First::Startup { minor, req } => (minor, req),
    };
    let span = tracing::Span::current();
    span.record("user", req.user.as_str());
    span.record("db", req.database.as_str());
    if crate::admin::is_console_db(&req.database) {
        let local = socket.local_addr(&peer);
        let login = crate::admin::Login { req, minor, peer, local, deadline: login_deadline };
        return Box::pin(crate::admin::serve(socket, buf, shared, cfg, login)).await.map(|()| None);
    }
    let authed = within(timer, Box::pin(crate::client::log_in(socket, &mut buf, shared, cfg, req, minor, peer))).await;
    let session = match authed {
        Ok((session, hello)) => Box::pin(crate::client::greet(session, hello, shared)).await,
        Err(e) => Err(e),
    };
    count_login(shared, &session);
    let mut session = session?;
    if cfg.weir.log_connections {
        tracing::info!(application_name = session.params.get("application_name").unwrap_or(""), "client logged in");
    }
    // Listed for SHOW CLIENTS and KILL until the session ends.
    session.listed = Some(shared.client_list.register(NewClient {
        owner: Owner::Pool(session.pool.clone()),
        peer,
        local: session.client.local_addr(&peer),
        application_name: session.params.get("application_name").unwrap_or_default().to_owned(),
        key_pid: session.reg.pid,
        slot: Some(session.reg.slot.clone()),
    }));
    Ok(Some(session))
}
