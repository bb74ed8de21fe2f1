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

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
pub use stream::ClientStream;
use tokio::io::AsyncWriteExt;

use crate::auth::query::AuthQueryError;
use crate::config::Config;
use crate::pool::PoolKey;
use crate::state::Shared;
pub use error::ClientError;
use login::{auth_method, Request};
pub use session::Session;

/// The pooled session's login, after the startup packet: authenticates,
/// finds the pool and greets the client. The caller bounds it by the login
/// timer, counts it and lists the client.
pub(crate) async fn log_in<'a>(
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
    let budget = session::Budget::new(req.declared_deadline, cfg.weir.client_deadline_fraction);
    let deadline = Instant::now() + budget.under(settings.query_wait_timeout);
    let server_params = pool.server_params(deadline).await?;
    let mut params = login::client_params(&req, &server_params);
    login::check_startup_settings(&pool, deadline, &mut params, &req.settings, &server_params).await?;
    let reg = shared.cancels.register();
    let hello = login::greeting(&server_params, &params, (reg.pid, reg.secret), minor, &req.protocol_options);
    socket.write_all(&hello).await.map_err(ClientError::Io)?;
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
    Ok(Session::new(socket, std::mem::take(buf), login))
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
