//! How a client proves who it is: the method (auth_type, or the matching
//! line of auth_hba_file), whom `trust` admits, the verifier of a user the
//! auth_file lacks (auth_query), and a pooled client's authentication up to
//! the pool it belongs to and the credentials weir presents for it.

use std::time::Instant;

use bytes::BytesMut;

use super::error::ClientError;
use super::startup::Request;
use super::stream::ClientStream;
use crate::auth::query::AuthQueryError;
use crate::auth::Credentials;
use crate::config::{AuthType, Config};
use crate::pool::PoolKey;
use crate::state::Shared;

/// Whom `trust` admits: the auth_file's users when there is an auth_file
/// (PgBouncer's rule), anyone when there is none.
pub(super) fn trust_names(cfg: &Config, found_by_auth_query: bool) -> crate::auth::TrustNames {
    match cfg.weir.auth_file {
        // A user auth_query found is as known as one the auth_file names.
        Some(_) if !found_by_auth_query => crate::auth::TrustNames::Listed,
        _ => crate::auth::TrustNames::Any,
    }
}

/// How this client authenticates: auth_type, or with auth_type = "hba" the
/// first matching line of auth_hba_file (a `reject` line or no line:
/// refused); a physical replication client matches the `replication` lines.
pub(super) fn auth_method(
    shared: &Shared,
    cfg: &Config,
    peer: weir_metrics::ConnAddr,
    tls: bool,
    req: &Request,
) -> Result<AuthType, ClientError> {
    let hba = shared.hba.load();
    let (db, user) = (&req.database, &req.user);
    let auth_type = cfg.weir.auth_type;
    Ok(crate::auth::hba::method_for_client(auth_type, hba.as_deref(), peer.ip(), tls, db, user, req.replication)?)
}

/// Authenticates a client of a configured database and names its pool: the
/// key (a forced user's pool, whoever the client is) and the credentials
/// weir presents to its servers. `req`'s names move into the key.
pub(super) async fn authenticate_pooled(
    socket: &mut ClientStream,
    buf: &mut BytesMut,
    shared: &Shared,
    cfg: &Config,
    req: &mut Request,
    peer: weir_metrics::ConnAddr,
) -> Result<(PoolKey, Credentials), ClientError> {
    let users = shared.users.load();
    let looked_up;
    // auth_query runs only for a database weir serves: a client of any
    // other is asked for its password like an unknown user (PgBouncer's
    // order), and told "no such database" only if it knows the password.
    let known = cfg.database(&req.database).is_some();
    let (secret, queried) = match users.get(&req.user) {
        None if known && !cfg.auth_user(&req.database).is_empty() => {
            looked_up = auth_query(shared, cfg, req).await?;
            (looked_up.as_ref().and_then(Option::as_ref), looked_up.is_some())
        }
        found => (found, false),
    };
    let method = auth_method(shared, cfg, peer, socket.is_tls(), req)?;
    if method == AuthType::Any && cfg.forced_user(&req.database).is_none() {
        tracing::error!("auth_type=any requires forced user");
        return Err(ClientError::BouncerConfig);
    }
    let trust = trust_names(cfg, queried);
    let authed = crate::auth::authenticate(socket, buf, method, &req.user, secret, trust).await?;
    let mut credentials = crate::auth::server_credentials(secret, &authed);
    // The names move into the key: nothing after this reads them from `req`.
    let mut key = PoolKey { database: std::mem::take(&mut req.database), user: std::mem::take(&mut req.user) };
    // A forced user: the pool is that user's, whoever the client is.
    if let Some((forced, password)) = cfg.forced_user(&key.database) {
        credentials = match password {
            Some(p) => Credentials::Password(p.to_owned()),
            None => Credentials::of_stored(users.get(forced)),
        };
        forced.clone_into(&mut key.user);
    }
    Ok((key, credentials))
}

/// The verifier of a user not in auth_file, by auth_query (None: no such
/// user). Bounded by the login deadline around `authenticate`. The console
/// uses it too, for admin and stats users.
pub(super) async fn auth_query(
    shared: &Shared,
    cfg: &Config,
    req: &Request,
) -> Result<Option<crate::auth::query::Found>, ClientError> {
    check_auth_dbname(shared, cfg, &req.database)?;
    let deadline = Instant::now() + cfg.weir.client_login_timeout;
    let users = shared.users.load();
    let sql = cfg.auth_query(&req.database);
    let fetch = |database, auth_user, credentials| {
        let key = PoolKey { database, user: auth_user };
        run_auth_query(shared, cfg, key, credentials, (sql, &req.user), deadline)
    };
    crate::auth::query::lookup(&shared.auth_query_cache, &users, cfg, &req.database, &req.user, fetch).await.map_err(
        |e| {
            tracing::warn!(error = %e, "auth_query failed");
            match e {
                // The config's fault, not the client's (PgBouncer's words).
                AuthQueryError::Query(_) | AuthQueryError::UnknownDatabase(_) => ClientError::BouncerConfig,
                AuthQueryError::Rejected { code, .. } => {
                    ClientError::NoServer(crate::pool::PoolError::LoginRejected { code, message: e.to_string() })
                }
                e => ClientError::Auth(crate::auth::AuthError::Refused(e.to_string())),
            }
        },
    )
}

/// The auth_dbname of `database`'s clients must be a database weir serves
/// (the fallback database counts) and not DISABLEd (PgBouncer's words).
fn check_auth_dbname(shared: &Shared, cfg: &Config, database: &str) -> Result<(), ClientError> {
    let Some(auth_db) = cfg.auth_dbname(database) else { return Ok(()) };
    if super::is_console_db(auth_db) {
        tracing::error!("cannot use the reserved \"{auth_db}\" database as an auth_dbname");
        return Err(ClientError::BouncerConfig);
    }
    if cfg.database(auth_db).is_none() {
        tracing::error!("authentication database \"{auth_db}\" is not configured");
        return Err(ClientError::BouncerConfig);
    }
    if shared.admin.is_disabled(auth_db) {
        let msg = format!("authentication database \"{auth_db}\" is disabled");
        return Err(ClientError::Auth(crate::auth::AuthError::Refused(msg)));
    }
    Ok(())
}

/// Runs auth_query for `user` on a server of the pool `key` (auth_user's), by `deadline`;
/// a connection that failed or timed out mid-answer is closed, not reused.
async fn run_auth_query(
    shared: &Shared,
    cfg: &Config,
    key: PoolKey,
    credentials: Credentials,
    (sql, user): (&str, &str),
    deadline: Instant,
) -> Result<crate::auth::query::Answer, AuthQueryError> {
    let pool = shared.pool_for(cfg, &key, credentials).ok_or(AuthQueryError::UnknownDatabase(key.database))?;
    let no_server = |why: String| AuthQueryError::NoServer { user: key.user.clone(), why };
    let mut lease = pool.acquire(deadline).await.map_err(|e| match e {
        crate::pool::PoolError::LoginRejected { code, message } => {
            AuthQueryError::Rejected { user: key.user.clone(), code, message }
        }
        e => no_server(e.to_string()),
    })?;
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
