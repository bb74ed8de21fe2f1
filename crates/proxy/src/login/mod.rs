//! A client's login, from its first byte to what its connection becomes:
//! the startup packet (`startup`: TLS, cancel requests, the protocol
//! version, the startup parameters), authentication (`authenticate`), the
//! console's login (`console`), a pooled client's (`pooled`: its pool,
//! parameters, cancel key and wait budget) or a replication client's
//! (`replicating`: its pool, its server's startup parameters, its greeting
//! once that server is open), the greeting (`greet`), and the
//! login's count and the client's listing. One entry, [`log_in`], bounded by
//! one timer (client_login_timeout); `app` hands what it returns to `admin`
//! or `client`. Also the client's connection (`stream`) and the error every
//! client connection ends with (`error`), which `admin` and `client` share.

mod authenticate;
pub mod console;
pub mod error;
mod greet;
pub mod pooled;
pub mod replicating;
pub mod startup;
pub mod stream;

use std::pin::Pin;
use std::sync::Arc;
use std::time::Instant;

use bytes::{Bytes, BytesMut};
use tokio::time::Sleep;
use weir_metrics::{ClientResult, ConnAddr};

pub use console::{is_console_db, Console, Role, CONSOLE_DATABASE};
pub use error::ClientError;
pub use pooled::{Budget, LoggedIn, Pooled};
pub use replicating::Replicating;
pub(crate) use stream::fatal_and_close;
pub use stream::ClientStream;

use crate::config::Config;
use crate::state::caps::{CapGuard, Caps};
use crate::state::Shared;
use startup::{First, Request};

/// What a client's connection becomes once logged in. Not boxed: it lives
/// only until the caller matches on it.
#[derive(Debug)]
#[allow(clippy::large_enum_variant)]
pub enum Login {
    /// A CancelRequest: forward it, then close.
    Cancel(Cancel),
    /// The admin console.
    Console(Console),
    /// A pooled session.
    Pooled(Pooled),
    /// A replication client, authenticated: `crate::replication` opens its
    /// own server, greets it and relays.
    Replication(Replicating),
    /// Nothing more: the login told the client why it ends (a user the
    /// console refuses).
    Ended,
}

/// A CancelRequest's key: 4 bytes (3.0) or longer (3.2).
#[derive(Debug)]
pub struct Cancel {
    pid: i32,
    key: Bytes,
}

impl Cancel {
    /// Cancels the query of the client holding this key, if any, or sends
    /// the request on to the peer that minted the key. Held open until the
    /// cancel has reached Postgres (or the peer has closed its end; at most
    /// the forward's own 5 s limit), then closed, as Postgres answers.
    pub async fn forward(self, shared: &Shared) {
        let cfg = shared.config.load();
        if let Some(forwarding) = shared.cancels.route(&cfg, self.pid, &self.key) {
            let _ = forwarding.await;
        }
    }
}

/// A startup packet's request, as the console's and the pooled login take it.
pub(crate) struct Start {
    req: Request,
    /// The protocol version negotiated (3.0 to 3.2).
    minor: u16,
    peer: ConnAddr,
}

/// What a client is listed with once logged in: its connection id (taken
/// when its login started), weir's end of its connection, and its place in
/// the per-database and per-user client counts.
#[derive(Debug)]
pub(crate) struct Listing {
    id: u64,
    local: Option<ConnAddr>,
    counted: CapGuard,
}

/// Logs a client in: the startup packet, then the console's login or a
/// pooled client's. Refusals are errors (a SQLSTATE and a message the
/// caller sends in a FATAL); each login is counted in
/// weir_client_connections_total.
pub async fn log_in(socket: &mut ClientStream, peer: ConnAddr, shared: &Arc<Shared>) -> Result<Login, ClientError> {
    // The config as it is at login (a reload applies to later logins).
    let cfg = &shared.config.load();
    let id = crate::server::next_socket_id();
    let mut buf = BytesMut::with_capacity(crate::wire::LOGIN_READ_CHUNK);
    let tls = shared.client_tls.load_full();
    // One timer for the whole login: the startup packet and the authentication.
    let mut timer = std::pin::pin!(tokio::time::sleep_until((Instant::now() + cfg.weir.client_login_timeout).into()));
    let first =
        within_login_timeout(timer.as_mut(), startup::read_startup(socket, &mut buf, tls.as_deref(), cfg)).await?;
    let (minor, req) = match first {
        First::Cancel { pid, key } => return Ok(Login::Cancel(Cancel { pid, key })),
        First::Startup { minor, req } => (minor, req),
    };
    let span = tracing::Span::current();
    span.record("user", req.user.as_str());
    span.record("db", req.database.as_str());
    if shared.is_stopping() && !is_console_db(&req.database) {
        // Waiting for its clients to leave: the Unix socket still takes
        // cancel requests and the console, no new client.
        let refused = Err(ClientError::ShuttingDown);
        count_login::<Login>(shared, &refused);
        return refused;
    }
    let start = Start { req, minor, peer };
    let counted = count_client(shared, cfg, &start.req)?;
    if start.req.replication.is_some() {
        let listing = Listing { id, local: socket.local_addr(&peer), counted };
        return replication_login(socket, buf, shared, cfg, start, timer, listing).await;
    }
    if is_console_db(&start.req.database) {
        let admitted =
            within_login_timeout(timer, Box::pin(console::admit(socket, &mut buf, shared, cfg, &start))).await;
        let listing = Listing { id, local: socket.local_addr(&peer), counted };
        return console::finish_console(admitted, buf, shared, cfg, start, listing);
    }
    // Authentication and the pool by the login timer; the greeting after,
    // bounded by the client's wait budget.
    let settled = within_login_timeout(timer, Box::pin(pooled::settle(socket, &mut buf, shared, cfg, start))).await;
    let greeted = match settled {
        Ok((login, hello)) => Box::pin(pooled::greet_pooled(socket, &mut buf, login, hello, shared)).await,
        Err(e) => Err(e),
    };
    let listing = Listing { id, local: socket.local_addr(&peer), counted };
    pooled::finish_pooled(greeted, buf, shared, cfg, peer, listing).map(Login::Pooled)
}

/// Counts the client against its database's and its user's client limits
/// (max_db_client_connections, max_user_client_connections), from its
/// startup packet on, as PgBouncer counts it; refuses it over either. An
/// admin user on the console is counted but never refused.
fn count_client(shared: &Arc<Shared>, cfg: &Config, req: &startup::Request) -> Result<CapGuard, ClientError> {
    let console = is_console_db(&req.database);
    // The console's clients count under PgBouncer's name for it, whichever
    // name they asked for.
    let database = if console { CONSOLE_DATABASE } else { req.database.as_str() };
    let exempt = console && cfg.weir.admin_users.contains(&req.user);
    let caps = Caps { database: cfg.db_client_cap(database), user: cfg.user_client_cap(&req.user), exempt };
    shared.caps.admit(database, &req.user, caps).map_err(|exceeded| {
        tracing::info!("refusing client: {}", exceeded.key());
        shared.cancels.metrics.record_client_connection(ClientResult::Refused);
        ClientError::ClientCap(exceeded)
    })
}

/// A replication client's login up to its pool, by the login timer; a
/// failure is counted here (a success once greeted, `replicating::finish`).
async fn replication_login(
    socket: &mut ClientStream,
    mut buf: BytesMut,
    shared: &Arc<Shared>,
    cfg: &Arc<crate::config::Config>,
    start: Start,
    timer: Pin<&mut Sleep>,
    listing: Listing,
) -> Result<Login, ClientError> {
    if is_console_db(&start.req.database) {
        let refused =
            Err(ClientError::BadStartupParameter("the admin console takes no replication connections".into()));
        count_login::<Login>(shared, &refused);
        return refused;
    }
    let settled =
        within_login_timeout(timer, Box::pin(replicating::settle(socket, &mut buf, shared, cfg, start))).await;
    if settled.is_err() {
        count_login(shared, &settled);
    }
    let mut replicating = settled?;
    replicating.buf = buf;
    replicating.listing = Some(listing);
    Ok(Login::Replication(replicating))
}

/// Counts a login attempt in weir_client_connections_total by its result.
fn count_login<T>(shared: &Shared, login: &Result<T, ClientError>) {
    let result = match login {
        Ok(_) => ClientResult::Ok,
        Err(ClientError::Auth(_)) => ClientResult::AuthFailed,
        Err(_) => ClientResult::Refused,
    };
    shared.cancels.metrics.record_client_connection(result);
}

/// Runs `f` until the login timer fires (LoginTimeout then).
async fn within_login_timeout<T>(
    timer: Pin<&mut Sleep>,
    f: impl std::future::Future<Output = Result<T, ClientError>>,
) -> Result<T, ClientError> {
    crate::timer::within(timer, f).await.unwrap_or(Err(ClientError::LoginTimeout))
}
