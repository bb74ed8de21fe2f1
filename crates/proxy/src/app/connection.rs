//! One accepted socket's task: the login (`login`), then what it became: a
//! cancel forwarded, the admin console (`admin`), the pooled session
//! (`client`) or a replication client's relay (`replication`) until the
//! client leaves or weir ends it; then the FATAL that
//! says why, if any. Each client runs in one tracing span `client{peer,user,db}`.

use std::future::Future;
use std::sync::Arc;
use std::task::Poll;
use std::time::Instant;

use tracing::Instrument;
use weir_metrics::ConnAddr;

use crate::client::Session;
use crate::login::{fatal_and_close, ClientError, ClientStream, Login};
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
    crate::login::stream::fatal_detail_and_close(socket, e.sqlstate(), &e.client_message(), e.detail()).await;
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
    let login = Box::pin(enter(socket, *peer, shared).instrument(span.clone())).await;
    let mut session = match login? {
        Entered::Session(session) => session,
        Entered::Done(why) => return Ok(why),
    };
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

/// What a login became, once `enter` returns. Unpacked at once: the
/// session is not boxed (its task holds it either way).
#[allow(clippy::large_enum_variant)]
enum Entered<'a> {
    /// The pooled session, to run.
    Session(Session<'a>),
    /// Nothing more: a cancel forwarded, the console or a replication
    /// client ended (and why, if weir or its server ended it).
    Done(Option<&'static str>),
}

/// The login, then what it became: the pooled session to run, or nothing
/// more once a cancel has been forwarded, or the console or a replication
/// client has ended.
async fn enter<'a>(
    socket: &'a mut ClientStream,
    peer: ConnAddr,
    shared: &Arc<Shared>,
) -> Result<Entered<'a>, ClientError> {
    match crate::login::log_in(socket, peer, shared).await? {
        Login::Pooled(pooled) => Ok(Entered::Session(crate::client::start(socket, pooled))),
        Login::Cancel(cancel) => {
            cancel.forward(shared).await;
            Ok(Entered::Done(None))
        }
        Login::Console(console) => {
            Box::pin(crate::admin::serve(socket, console, shared)).await.map(|()| Entered::Done(None))
        }
        Login::Replication(login) => {
            Box::pin(crate::replication::serve(socket, login, shared)).await.map(Entered::Done)
        }
        Login::Ended => Ok(Entered::Done(None)),
    }
}

/// Tells a client that weir ended it, and why; then closes. Returns why.
async fn farewell(socket: &mut ClientStream, why: &'static str) -> &'static str {
    tracing::info!(reason = why, "client disconnected by weir");
    fatal_and_close(socket, crate::state::client_list::farewell_code(why), why).await;
    why
}
