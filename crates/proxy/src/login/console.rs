//! A console client's login: who reaches the console (the virtual
//! databases `weir` and `pgbouncer`), who may use it and as what (`Role`),
//! weir's own OS user on the Unix socket, and the login that ends in the
//! console's greeting and listing (`Console`); `admin` serves it after.

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use weir_metrics::ClientResult;

use super::authenticate::{auth_method, auth_query, trust_names};
use super::error::ClientError;
use super::greet::{client_params, console_params, greeting};
use super::startup::Request;
use super::stream::{fatal_and_close, ClientStream};
use super::{count_login, Login, Start};
use crate::cancel_keys::Registration;
use crate::config::Config;
use crate::pool::PoolKey;
use crate::protocol::sqlstate;
use crate::state::client_list::{ClientGuard, NewClient, Owner};
use crate::state::Shared;

/// Database names that reach the console instead of a pool.
pub const CONSOLE_DATABASES: &[&str] = &["weir", "pgbouncer"];

/// The console's name in SHOW DATABASES and in the client counts.
pub const CONSOLE_DATABASE: &str = "pgbouncer";

/// Whether clients asking for `database` get the console.
pub fn is_console_db(database: &str) -> bool {
    CONSOLE_DATABASES.contains(&database)
}

/// What the console may do for a user.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// admin_users: every command.
    Admin,
    /// stats_users: SHOW only.
    Stats,
}

impl Role {
    pub fn of(cfg: &Config, user: &str) -> Option<Role> {
        if cfg.weir.admin_users.iter().any(|u| u == user) {
            Some(Role::Admin)
        } else if cfg.weir.stats_users.iter().any(|u| u == user) {
            Some(Role::Stats)
        } else {
            None
        }
    }
}

/// A console client, logged in and greeted: what the console serves.
#[derive(Debug)]
pub struct Console {
    /// Bytes the client sent past its login, unread.
    pub buf: BytesMut,
    pub role: Role,
    /// Its cancel key, held until it leaves.
    pub reg: Registration,
    /// Its listing for SHOW CLIENTS, until it leaves.
    pub(crate) listed: ClientGuard,
}

/// The end of a console client's login, once admitted (or refused): counts
/// the login, logs it, and lists the client (with its `listing`) for SHOW CLIENTS.
/// `Login::Ended` for a user who may not use the console (it has been told
/// so, and counted).
pub(super) fn finish_console(
    admitted: Result<Option<(Role, Registration)>, ClientError>,
    buf: BytesMut,
    shared: &Shared,
    cfg: &Config,
    start: Start,
    listing: super::Listing,
) -> Result<Login, ClientError> {
    // A user refused the console (None) has been counted and told already.
    if !matches!(admitted, Ok(None)) {
        count_login(shared, &admitted);
    }
    let Some((role, reg)) = admitted? else { return Ok(Login::Ended) };
    if cfg.weir.log_connections {
        tracing::info!(role = ?role, "admin console login");
    }
    let Start { req, peer, .. } = start;
    let listed = shared.client_list.register(NewClient {
        id: listing.id,
        owner: Owner::Console(Box::new(PoolKey { user: req.user, database: req.database })),
        peer,
        local: listing.local,
        application_name: req.params.get("application_name").unwrap_or_default().to_owned(),
        key_pid: reg.pid,
        slot: None,
        replication: Default::default(),
        counted: Some(listing.counted),
    });
    Ok(Login::Console(Console { buf, role, reg, listed }))
}

/// Authenticates and greets; None when the user may not use the console
/// (it has been told so).
pub(super) async fn admit(
    socket: &mut ClientStream,
    buf: &mut BytesMut,
    shared: &Arc<Shared>,
    cfg: &Arc<Config>,
    start: &Start,
) -> Result<Option<(Role, Registration)>, ClientError> {
    let Start { req, minor, peer } = start;
    let user = &req.user;
    if is_own_user(socket, user) {
        if cfg.weir.log_connections {
            tracing::info!("pgbouncer access from unix socket");
        }
        return greet_console(socket, shared, req, *minor).await.map(|reg| Some((Role::Admin, reg)));
    }
    let users = shared.users.load();
    let looked_up;
    // An admin or stats user not in the auth_file is looked up by auth_query
    // (in auth_dbname), as PgBouncer does; nobody else costs a query.
    let (secret, queried) = match users.get(user) {
        None if Role::of(cfg, user).is_some() && !cfg.auth_user(&req.database).is_empty() => {
            looked_up = auth_query(shared, cfg, req).await?;
            (looked_up.as_ref().and_then(Option::as_ref), looked_up.is_some())
        }
        found => (found, false),
    };
    let method = auth_method(shared, cfg, *peer, socket.is_tls(), req)?;
    crate::auth::authenticate(socket, buf, method, user, secret, trust_names(cfg, queried)).await?;
    let Some(role) = Role::of(cfg, user) else {
        shared.cancels.metrics.record_client_connection(ClientResult::Refused);
        let msg = format!("user \"{user}\" may not use the admin console: list it in admin_users or stats_users");
        tracing::info!("{msg}");
        fatal_and_close(socket, sqlstate::INSUFFICIENT_PRIVILEGE, &msg).await;
        return Ok(None);
    };
    greet_console(socket, shared, req, *minor).await.map(|reg| Some((role, reg)))
}

/// The console user PgBouncer admits without a password: `pgbouncer`, on
/// the Unix socket, from a process of weir's own OS user (the socket's peer
/// credentials say who).
const OWN_USER: &str = "pgbouncer";

/// Whether this client is weir's own OS user asking for the console as
/// `pgbouncer` over the Unix socket (admin_users need not list it).
fn is_own_user(socket: &ClientStream, user: &str) -> bool {
    user == OWN_USER && socket.peer_uid().is_some_and(|uid| Some(uid) == process_uid())
}

/// weir's real OS user id (the `Uid:` line of /proc/self/status), read once.
fn process_uid() -> Option<u32> {
    static UID: std::sync::OnceLock<Option<u32>> = std::sync::OnceLock::new();
    *UID.get_or_init(|| {
        let status = std::fs::read_to_string("/proc/self/status").ok()?;
        let line = status.lines().find_map(|l| l.strip_prefix("Uid:"))?;
        line.split_whitespace().next()?.parse().ok()
    })
}

/// Sends the console's greeting to an admitted client; its cancel key.
pub(super) async fn greet_console(
    socket: &mut ClientStream,
    shared: &Shared,
    req: &Request,
    minor: u16,
) -> Result<Registration, ClientError> {
    let server = console_params();
    let params = client_params(req, &server);
    let (key, secret) = shared.cancels.register_as(None, minor >= crate::protocol::startup::LONG_KEY_MINOR);
    let hello = greeting(&server, &params, (key.pid, secret.as_bytes()));
    socket.write_all(&hello).await.map_err(ClientError::Io)?;
    Ok(key)
}
