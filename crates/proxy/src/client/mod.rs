//! The pooled session: a client of a configured database, from its
//! authentication (after `app::connection` read its startup packet) through
//! the session loop that borrows servers from its pool. The admin console
//! (`admin`) is the other kind of client; it shares this module's login
//! steps (`login`) and stream, and never touches a pool.

pub mod error;
pub mod login;
pub mod prepared;
pub mod session;
pub mod stream;
pub mod transfer;
pub mod transfer_watchdog;

use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
pub use stream::ClientStream;
use tokio::io::AsyncWriteExt;

use crate::auth::query::AuthQueryError;
use crate::config::{Config, PoolMode};
use crate::pool::PoolKey;
use crate::state::Shared;
pub use error::ClientError;
use login::{auth_method, Request};
pub use session::Session;

/// What the greeting needs once the client is authenticated.
pub(crate) struct Hello {
    server_params: Arc<crate::params::ParamMap>,
    /// The secret of the client's cancel key (4 bytes, or 32 for 3.2).
    secret: crate::cancel_keys::Secret,
    /// The end of the client's wait budget for a server.
    deadline: Instant,
}

/// The pooled session's login, after the startup packet: authenticates and
/// finds the pool; [`greet`] then greets the client. The caller bounds this
/// by the login timer, counts the login and lists the client.
pub(crate) async fn log_in<'a>(
    socket: &'a mut ClientStream,
    buf: &mut BytesMut,
    shared: &Arc<Shared>,
    cfg: &Arc<Config>,
    mut req: Request,
    minor: u16,
    peer: weir_metrics::ConnAddr,
) -> Result<(Session<'a>, Hello), ClientError> {
    let users = shared.users.load();
    let looked_up;
    // auth_query runs only for a database weir serves: a client of any
    // other is asked for its password like an unknown user (PgBouncer's
    // order), and told "no such database" only if it knows the password.
    let known = cfg.database(&req.database).is_some();
    let secret = match users.get(&req.user) {
        None if known && !cfg.auth_user(&req.database).is_empty() => {
            looked_up = auth_query(shared, cfg, &req).await?;
            looked_up.as_ref()
        }
        found => found,
    };
    let method = auth_method(shared, cfg, peer, socket.is_tls(), &req)?;
    if method == crate::config::AuthType::Any && cfg.forced_user(&req.database).is_none() {
        tracing::error!("auth_type=any requires forced user");
        return Err(ClientError::BouncerConfig);
    }
    let trust = login::trust_names(cfg);
    let authed = crate::auth::authenticate(socket, buf, method, &req.user, secret, trust).await?;
    let mut credentials = crate::auth::server_credentials(secret, &authed);
    // The names move into the key: nothing after this reads them from `req`.
    let mut key = PoolKey { database: std::mem::take(&mut req.database), user: std::mem::take(&mut req.user) };
    // A forced user: the pool is that user's, whoever the client is.
    if let Some((forced, password)) = cfg.forced_user(&key.database) {
        credentials = match password {
            Some(p) => crate::auth::Credentials::Password(p.to_owned()),
            None => crate::auth::Credentials::of_stored(users.get(forced)),
        };
        forced.clone_into(&mut key.user);
    }
    if shared.admin.is_disabled(&key.database) {
        return Err(ClientError::Disabled(key.database));
    }
    let Some(pool) = shared.pool_for(cfg, &key, credentials) else {
        return Err(ClientError::UnknownDatabase(key.database));
    };
    let settings = pool.settings();
    let budget = session::Budget::new(req.declared_deadline, cfg.weir.client_deadline_fraction);
    let deadline = Instant::now() + budget.under(settings.wait_limit().0);
    let server_params = pool.server_params(deadline).await?;
    let mut params = login::client_params(&req, &server_params);
    login::check_startup_settings(&pool, deadline, &mut params, &req.settings, &server_params).await?;
    let long_key = minor >= crate::protocol::startup::LONG_KEY_MINOR;
    let (reg, secret) = shared.cancels.register_as(None, long_key);
    let login = session::LoggedIn {
        pool,
        mode: settings.pool_mode,
        params,
        settings: req.settings,
        reg,
        budget,
        max_message: cfg.weir.max_message_size,
        shutdown: shared.shutdown.clone(),
    };
    let hello = Hello { server_params, secret, deadline };
    Ok((Session::new(socket, std::mem::take(buf), login), hello))
}

/// Greets an authenticated client. In session mode its server for life is
/// taken first, so that BackendKeyData carries the server's own pid (the
/// secret stays weir's, and cancels still pass through weir's map). That wait
/// is bounded by the client's wait budget (query_wait_timeout), as a first
/// query's would be, not by client_login_timeout.
pub(crate) async fn greet<'a>(
    mut session: Session<'a>,
    mut hello: Hello,
    shared: &Arc<Shared>,
) -> Result<Session<'a>, ClientError> {
    if session.mode == PoolMode::Session {
        let lease = take_server(&mut session, hello.deadline).await?;
        let long_key = hello.secret.as_bytes().len() == crate::cancel_keys::LONG_KEY_LEN;
        (session.reg, hello.secret) = shared.cancels.register_as(Some(lease.conn().backend_pid()), long_key);
        session.held = Some(Box::new(lease));
    }
    let key = (session.reg.pid, hello.secret.as_bytes());
    let out = login::greeting(&hello.server_params, &session.params, key);
    session.client.write_all(&out).await.map_err(ClientError::Io)?;
    Ok(session)
}

/// Client bytes buffered, at most, while a session-mode login waits.
const LOGIN_WAIT_READ_LIMIT: usize = 64 * 1024;

/// Queues for a session-mode client's server, watching the client: one that
/// leaves meanwhile leaves the queue. Bytes it sends early stay buffered.
async fn take_server(session: &mut Session<'_>, deadline: Instant) -> Result<crate::pool::Lease, ClientError> {
    let pool = session.pool.clone();
    let mut acquire = std::pin::pin!(pool.acquire(deadline));
    loop {
        tokio::select! {
            biased;
            r = &mut acquire => return Ok(r?),
            r = crate::wire::fill(session.client, &mut session.client_in), if session.client_in.len() < LOGIN_WAIT_READ_LIMIT => {
                r?;
            }
        }
    }
}

/// The verifier of a user not in auth_file, by auth_query (None: no such
/// user). Bounded by the login deadline around `authenticate`. The console
/// uses it too, for admin and stats users.
pub(crate) async fn auth_query(
    shared: &Shared,
    cfg: &Config,
    req: &Request,
) -> Result<Option<crate::auth::Secret>, ClientError> {
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
    let no_server = |why: String| AuthQueryError::NoServer { user: key.user.clone(), why };
    let mut lease = pool.acquire(deadline).await.map_err(|e| no_server(e.to_string()))?;
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
            Err(no_server("timed out".into()))
        }
    }
}
