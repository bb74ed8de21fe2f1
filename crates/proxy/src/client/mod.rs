//! One task per client: login, then the session loop. Each client runs in
//! one tracing span `client{peer,user,db}`.

pub mod error;
pub mod login;
pub mod prepared;
pub mod registry;
pub mod session;
pub mod stream;
pub mod transfer;
pub mod watchdog;

#[cfg(test)]
mod footprint;

use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::Poll;
use std::time::{Duration, Instant};

use bytes::BytesMut;
pub use stream::ClientStream;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::time::Sleep;
use tracing::Instrument;
use weir_metrics::ClientResult;

use crate::app::Shared;
use crate::auth::query::AuthQueryError;
use crate::config::Config;
use crate::pool::PoolKey;
use crate::protocol::messages::{self, Severity};
pub use error::ClientError;
use login::{First, Request};
use session::Session;

/// Serves one accepted client connection to the end, then takes it off
/// `Shared::clients` (the accept loop counted it in). A plain function
/// returning the instrumented future (not an `async fn` around it), so the
/// client's task does not also keep the arguments' slots and a second copy
/// of `peer` for its whole life.
pub fn serve(socket: TcpStream, peer: SocketAddr, shared: Arc<Shared>) -> impl std::future::Future<Output = ()> {
    let span = tracing::info_span!("client", %peer, user = tracing::field::Empty, db = tracing::field::Empty);
    let mut socket = ClientStream::Plain(socket);
    async move {
        let started = shared.config.load().weir.log_disconnections.then(Instant::now);
        // The refusal is boxed, like every step an idle client is not in:
        // the task's future is as large as its largest state (and an error
        // held here across an await would be part of every state).
        let refusal = run(&mut socket, &peer, &shared).await.err().map(|e| Box::pin(refuse(&mut socket, e)));
        if let Some(refusal) = refusal {
            refusal.await;
        }
        if let Some(started) = started {
            tracing::info!(age = ?started.elapsed(), "client disconnected");
        }
        shared.clients.fetch_sub(1, std::sync::atomic::Ordering::AcqRel);
    }
    .instrument(span)
}

/// Tells a client the error that ended it (unless it is one the client
/// cannot be told), then closes.
async fn refuse(socket: &mut ClientStream, e: ClientError) {
    if e.is_silent() {
        return;
    }
    tracing::info!(error = %e, sqlstate = e.sqlstate().code(), "client refused or closed with an error");
    fatal_and_close(socket, e.sqlstate(), &e.client_message()).await;
}

/// How long a refused client's unread bytes are drained after its FATAL.
const ERROR_LINGER: Duration = Duration::from_millis(500);

/// Closes after a FATAL without losing it to a reset: closing a socket with
/// unread input sends RST, which can discard the error before the client
/// reads it. So FIN first, then read and drop what the client still sends
/// until it closes too (or briefly).
pub async fn close_after_error(socket: &mut ClientStream) {
    let _ = socket.shutdown().await;
    let mut sink = [0u8; 4096];
    let drain = async {
        while let Ok(n) = socket.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(ERROR_LINGER, drain).await;
}

/// A client's life: the login (boxed: it runs once, so the task's own
/// future stays as small as its longest-lived state, an idle logged-in
/// client), then the session until the client leaves or weir ends it.
async fn run(socket: &mut ClientStream, peer: &SocketAddr, shared: &Arc<Shared>) -> Result<(), ClientError> {
    let Some(mut session) = Box::pin(log_in(socket, *peer, shared)).await? else { return Ok(()) };
    // The session, raced against the client's switch (a KILL), by hand
    // rather than by `select!` or a function of its own: this is part of
    // every idle client's task.
    let why = {
        let slot = session.reg.slot.clone();
        let mut run = std::pin::pin!(session.run());
        std::future::poll_fn(|cx| {
            if let Poll::Ready(r) = run.as_mut().poll(cx) {
                return Poll::Ready(r.map(|()| None));
            }
            slot.switch.poll_killed(cx).map(|why| Ok(Some(why)))
        })
        .await?
    };
    let Some(why) = why else { return Ok(()) };
    // KILL or the end of a drain: the lease (if any) went back to the pool,
    // which recovers the server; the session ends and the client is told why.
    Box::pin(farewell(session.into_client(), why)).await;
    Ok(())
}

/// Tells a client that weir ended it, and why; then closes.
async fn farewell(socket: &mut ClientStream, why: &'static str) {
    tracing::info!(reason = why, "client disconnected by weir");
    fatal_and_close(socket, crate::protocol::sqlstate::ADMIN_SHUTDOWN, why).await;
}

/// Sends a FATAL and closes (see `close_after_error`).
async fn fatal_and_close(socket: &mut ClientStream, code: crate::protocol::SqlState, message: &str) {
    let mut out = BytesMut::new();
    messages::error_response(&mut out, Severity::Fatal, code, message);
    if socket.write_all(&out).await.is_ok() {
        close_after_error(socket).await;
    }
}

/// Startup, authentication and greeting. None: nothing more to do (a
/// CancelRequest, or an admin-console session that has ended).
async fn log_in<'a>(
    socket: &'a mut ClientStream,
    peer: SocketAddr,
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
        First::Cancel { pid, secret } => {
            shared.cancels.cancel(pid, secret);
            return Ok(None);
        }
        First::Startup { minor, req } => (minor, req),
    };
    let span = tracing::Span::current();
    span.record("user", req.user.as_str());
    span.record("db", req.database.as_str());
    if crate::admin::is_console_db(&req.database) {
        let local = socket.local_addr();
        let login = crate::admin::Login { req, minor, peer, local, deadline: login_deadline };
        return Box::pin(crate::admin::serve(socket, buf, shared, cfg, login)).await.map(|()| None);
    }
    let session = within(timer, Box::pin(authenticate(socket, &mut buf, shared, cfg, req, minor, peer))).await;
    count_login(shared, &session);
    let mut session = session?;
    if cfg.weir.log_connections {
        tracing::info!(application_name = session.params.get("application_name").unwrap_or(""), "client logged in");
    }
    // Listed for SHOW CLIENTS and KILL until the session ends.
    session.listed = Some(shared.registry.register(registry::NewClient {
        owner: registry::Owner::Pool(session.pool.clone()),
        peer,
        local: session.client.local_addr(),
        application_name: session.params.get("application_name").unwrap_or_default().to_owned(),
        key_pid: session.reg.pid,
        slot: Some(session.reg.slot.clone()),
    }));
    Ok(Some(session))
}

/// Counts a login attempt in weir_client_connections_total by its result.
pub(crate) fn count_login<T>(shared: &Shared, login: &Result<T, ClientError>) {
    let result = match login {
        Ok(_) => ClientResult::Ok,
        Err(ClientError::Auth(_)) => ClientResult::AuthFailed,
        Err(_) => ClientResult::Refused,
    };
    shared.cancels.metrics.record_client_connection(result);
}

/// Runs `f` until the login timer fires (LoginTimeout then).
async fn within<T>(
    timer: Pin<&mut Sleep>,
    f: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    crate::pool::within(timer, f).await.unwrap_or(Err(ClientError::LoginTimeout))
}

/// Authenticates, finds the pool and greets the client.
async fn authenticate<'a>(
    socket: &'a mut ClientStream,
    buf: &mut BytesMut,
    shared: &Arc<Shared>,
    cfg: &Arc<Config>,
    mut req: Request,
    minor: u16,
    peer: SocketAddr,
) -> Result<Session<'a>, ClientError> {
    let users = shared.users.load();
    let looked_up;
    let secret = match users.get(&req.user) {
        None if !cfg.weir.auth_user.is_empty() => {
            looked_up = auth_query(shared, cfg, &req).await?;
            looked_up.as_ref()
        }
        found => found,
    };
    let method = auth_method(shared, cfg, peer, socket.is_tls(), &req)?;
    let authed = crate::auth::authenticate(socket, buf, method, &req.user, secret).await?;
    let credentials = crate::auth::server_credentials(secret, &authed);
    // The names move into the key: nothing after this reads them from `req`.
    let key = PoolKey { database: std::mem::take(&mut req.database), user: std::mem::take(&mut req.user) };
    let Some(pool) = shared.pool_for(cfg, &key, credentials) else {
        return Err(ClientError::UnknownDatabase(key.database));
    };
    let settings = pool.settings();
    let budget = wait_budget(settings.query_wait_timeout, req.declared_deadline, cfg.weir.client_deadline_fraction);
    let deadline = Instant::now() + budget;
    let server_params = pool.server_params(deadline).await?;
    let mut params = login::client_params(&req, &server_params);
    login::check_startup_settings(&pool, deadline, &mut params, &req.settings, &server_params).await?;
    let reg = shared.cancels.register();
    let hello = login::greeting(&server_params, &params, (reg.pid, reg.secret), minor, &req.protocol_options);
    socket.write_all(&hello).await.map_err(ClientError::Io)?;
    Ok(Session::new(
        socket,
        std::mem::take(buf),
        pool,
        settings.pool_mode,
        params,
        req.settings,
        reg,
        session::Budget::new(req.declared_deadline, cfg.weir.client_deadline_fraction),
        cfg.weir.max_message_size,
        shared.shutdown.clone(),
    ))
}

/// The verifier of a user not in auth_file, by auth_query (None: no such
/// user). Bounded by the login deadline around `authenticate`.
async fn auth_query(shared: &Shared, cfg: &Config, req: &Request) -> Result<Option<crate::auth::Secret>, ClientError> {
    let deadline = Instant::now() + cfg.weir.client_login_timeout;
    let users = shared.users.load();
    let fetch = |database, auth_user, credentials| {
        run_auth_query(shared, cfg, PoolKey { database, user: auth_user }, credentials, &req.user, deadline)
    };
    crate::auth::query::lookup(&shared.auth_query_cache, &users, cfg, &req.database, &req.user, fetch).await.map_err(
        |e| {
            tracing::warn!(error = %e, "auth_query failed");
            ClientError::Auth(crate::auth::AuthError::Refused(e.to_string()))
        },
    )
}

/// Runs auth_query for `user` on a server of the pool `key` (auth_user's), by `deadline`;
/// a connection that failed or timed out mid-answer is closed, not reused.
async fn run_auth_query(
    shared: &Shared,
    cfg: &Config,
    key: PoolKey,
    credentials: crate::auth::Credentials,
    user: &str,
    deadline: Instant,
) -> Result<crate::auth::query::Answer, AuthQueryError> {
    let pool = shared.pool_for(cfg, &key, credentials).ok_or(AuthQueryError::UnknownDatabase(key.database))?;
    let mut lease = pool.acquire(deadline).await.map_err(|e| AuthQueryError::NoServer(e.to_string()))?;
    let sql = &cfg.weir.auth_query;
    let answer = tokio::time::timeout_at(deadline.into(), crate::server::auth_lookup::run(lease.conn_mut(), sql, user));
    match answer.await {
        Ok(Ok(a)) => Ok(a),
        Ok(Err(e)) => {
            lease.close(weir_metrics::CloseReason::ServerError);
            Err(e)
        }
        Err(_) => {
            lease.close(weir_metrics::CloseReason::ServerError);
            Err(AuthQueryError::NoServer("timed out".into()))
        }
    }
}

/// How this client authenticates: auth_type, or with auth_type = "hba" the
/// first matching line of auth_hba_file (a `reject` line or no line: refused).
pub(crate) fn auth_method(
    shared: &Shared,
    cfg: &Config,
    peer: SocketAddr,
    tls: bool,
    req: &Request,
) -> Result<crate::config::AuthType, ClientError> {
    let hba = shared.hba.load();
    Ok(crate::auth::hba::method_for(cfg.weir.auth_type, hba.as_deref(), peer.ip(), tls, &req.database, &req.user)?)
}

/// The wait budget: query_wait_timeout, or less when the client declared a
/// deadline (a share of it, so weir answers before the client gives up).
pub fn wait_budget(query_wait_timeout: Duration, declared: Option<Duration>, fraction: f64) -> Duration {
    match declared {
        Some(d) => query_wait_timeout.min(d.mul_f64(fraction)).max(Duration::from_millis(1)),
        None => query_wait_timeout,
    }
}
