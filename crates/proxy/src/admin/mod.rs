//! The admin console: a client that asks for the virtual database `weir`
//! (or `pgbouncer`, so existing scripts and pgbouncer_exporter keep working)
//! and is listed in `admin_users` or `stats_users` gets PgBouncer's console
//! commands over the simple query protocol. No server is involved. Users
//! authenticate against the auth_file like any client; stats users may only
//! SHOW.

pub mod command;
pub mod control;
pub mod result;
mod set;
pub mod show;
mod show_more;
pub mod stats;

use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use weir_metrics::ClientResult;

use crate::cancel_keys::Registration;
use crate::client::login::{self, Request};
use crate::client::login::{auth_method, count_login, fatal_and_close, trust_names};
use crate::client::{ClientError, ClientStream};
use crate::config::Config;
use crate::params::ParamMap;
use crate::pool::PoolKey;
use crate::protocol::messages::{self, Severity};
use crate::protocol::tags::{frontend as fe, status};
use crate::protocol::{frame::read_cstr, sqlstate, Frame, ProtocolError, SqlState};
use crate::state::client_list::{NewClient, Owner};
use crate::state::Shared;
use crate::wire::{self, WireError};
use command::Command;
pub use control::AdminError;

/// Database names that reach the console instead of a pool.
pub const CONSOLE_DATABASES: &[&str] = &["weir", "pgbouncer"];

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

/// A console client's startup, as read by the client task.
#[derive(Debug)]
pub struct Login {
    pub req: Request,
    pub minor: u16,
    pub peer: weir_metrics::ConnAddr,
    pub local: Option<weir_metrics::ConnAddr>,
    pub deadline: Instant,
}

/// Serves one console client: login, then commands until it leaves.
pub async fn serve(
    socket: &mut ClientStream,
    mut buf: BytesMut,
    shared: &Arc<Shared>,
    cfg: &Arc<Config>,
    login: Login,
) -> Result<(), ClientError> {
    let greeted = tokio::time::timeout_at(login.deadline.into(), greet(socket, &mut buf, shared, cfg, &login)).await;
    let greeted = greeted.map_err(|_| ClientError::LoginTimeout).and_then(|r| r);
    // A user refused the console (None) has been counted and told already.
    if !matches!(greeted, Ok(None)) {
        count_login(shared, &greeted);
    }
    let Some((role, key)) = greeted? else { return Ok(()) };
    if cfg.weir.log_connections {
        tracing::info!(role = ?role, "admin console login");
    }
    let _listed = shared.client_list.register(NewClient {
        owner: Owner::Console(Box::new(PoolKey { user: login.req.user.clone(), database: login.req.database.clone() })),
        peer: login.peer,
        local: login.local,
        application_name: login.req.params.get("application_name").unwrap_or_default().to_owned(),
        key_pid: key.pid,
        slot: None,
    });
    let max_message = cfg.weir.max_message_size as usize;
    Console { socket, buf, shared: shared.clone(), role, max_message, skipping: false }.run().await
}

/// Authenticates and greets; None when the user may not use the console
/// (it has been told so).
async fn greet(
    socket: &mut ClientStream,
    buf: &mut BytesMut,
    shared: &Arc<Shared>,
    cfg: &Arc<Config>,
    login: &Login,
) -> Result<Option<(Role, Registration)>, ClientError> {
    let user = &login.req.user;
    if is_own_user(socket, user) {
        if cfg.weir.log_connections {
            tracing::info!("pgbouncer access from unix socket");
        }
        return greet_as(socket, shared, login, Role::Admin).await.map(Some);
    }
    let users = shared.users.load();
    let looked_up;
    // An admin or stats user not in the auth_file is looked up by auth_query
    // (in auth_dbname), as PgBouncer does; nobody else costs a query.
    let secret = match users.get(user) {
        None if Role::of(cfg, user).is_some() && !cfg.auth_user(&login.req.database).is_empty() => {
            looked_up = crate::client::auth_query(shared, cfg, &login.req).await?;
            looked_up.as_ref()
        }
        found => found,
    };
    let method = auth_method(shared, cfg, login.peer, socket.is_tls(), &login.req)?;
    crate::auth::authenticate(socket, buf, method, user, secret, trust_names(cfg)).await?;
    let Some(role) = Role::of(cfg, user) else {
        shared.cancels.metrics.record_client_connection(ClientResult::Refused);
        let msg = format!("user \"{user}\" may not use the admin console: list it in admin_users or stats_users");
        tracing::info!("{msg}");
        fatal_and_close(socket, sqlstate::INSUFFICIENT_PRIVILEGE, &msg).await;
        return Ok(None);
    };
    greet_as(socket, shared, login, role).await.map(Some)
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

/// Sends the console's greeting to a client admitted as `role`.
async fn greet_as(
    socket: &mut ClientStream,
    shared: &Arc<Shared>,
    login: &Login,
    role: Role,
) -> Result<(Role, Registration), ClientError> {
    let server = console_params();
    let params = login::client_params(&login.req, &server);
    let (key, secret) = shared.cancels.register_as(None, login.minor >= crate::protocol::startup::LONG_KEY_MINOR);
    let hello = login::greeting(&server, &params, (key.pid, secret.as_bytes()));
    socket.write_all(&hello).await.map_err(ClientError::Io)?;
    Ok((role, key))
}

/// The parameters the console reports, as PgBouncer's console does.
fn console_params() -> ParamMap {
    let mut p = ParamMap::new();
    p.set("server_version", concat!(env!("CARGO_PKG_VERSION"), "/weir"));
    p.set("server_encoding", "UTF8");
    p.set("client_encoding", "UTF8");
    p.set("DateStyle", "ISO");
    p.set("TimeZone", "UTC");
    p.set("integer_datetimes", "on");
    p.set("standard_conforming_strings", "on");
    p
}

/// One logged-in console client.
struct Console<'a> {
    socket: &'a mut ClientStream,
    buf: BytesMut,
    shared: Arc<Shared>,
    role: Role,
    max_message: usize,
    /// Extended-protocol messages are being discarded up to the next Sync.
    skipping: bool,
}

impl Console<'_> {
    async fn run(&mut self) -> Result<(), ClientError> {
        loop {
            let frame = tokio::select! {
                f = wire::read_frame(self.socket, &mut self.buf, self.max_message) => match f {
                    Ok(f) => f,
                    Err(WireError::Eof) => return Ok(()),
                    Err(e) => return Err(e.into()),
                },
                _ = self.shared.shutdown.cancelled() => return Err(ClientError::ShuttingDown),
            };
            let mut out = BytesMut::new();
            match frame.tag {
                fe::QUERY => self.query(&frame, &mut out).await?,
                fe::TERMINATE => return Ok(()),
                fe::SYNC => {
                    self.skipping = false;
                    messages::ready_for_query(&mut out, status::IDLE);
                }
                fe::FLUSH => {}
                fe::PARSE | fe::BIND | fe::DESCRIBE | fe::EXECUTE | fe::CLOSE if !self.skipping => {
                    self.skipping = true;
                    let msg = "the admin console takes simple queries only (no extended protocol)";
                    messages::error_response(&mut out, Severity::Error, sqlstate::FEATURE_NOT_SUPPORTED, msg);
                }
                fe::PARSE | fe::BIND | fe::DESCRIBE | fe::EXECUTE | fe::CLOSE => {}
                other => return Err(ProtocolError::UnexpectedTag(other).into()),
            }
            if !out.is_empty() {
                self.socket.write_all(&out).await.map_err(ClientError::Io)?;
            }
        }
    }

    /// Runs every command in a simple Query; stops at the first error.
    async fn query(&mut self, frame: &Frame, out: &mut BytesMut) -> Result<(), ClientError> {
        let mut body = frame.body();
        let sql = read_cstr(&mut body)?.to_owned();
        match command::parse(&sql) {
            Ok(cmds) if cmds.is_empty() => result::empty_query(out),
            Ok(cmds) => {
                for cmd in cmds {
                    if let Err(e) = self.command(&cmd, out).await? {
                        tracing::info!(command = ?cmd, error = %e, "admin command refused");
                        messages::error_response(out, Severity::Error, e.code, &e.message);
                        break;
                    }
                }
            }
            Err(e) => messages::error_response(out, Severity::Error, sqlstate::SYNTAX_ERROR, &e.0),
        }
        messages::ready_for_query(out, status::IDLE);
        Ok(())
    }

    /// One command. The outer error ends the session (the client left while
    /// PAUSE waited); the inner one is reported and the session goes on.
    async fn command(&mut self, cmd: &Command, out: &mut BytesMut) -> Result<Result<(), AdminError>, ClientError> {
        if cmd.needs_admin() && self.role != Role::Admin {
            return Ok(Err(AdminError::new(
                sqlstate::INSUFFICIENT_PRIVILEGE,
                format!(
                    "permission denied: {} needs a user listed in admin_users (this user is a stats user)",
                    cmd.tag()
                ),
            )));
        }
        if cmd.needs_admin() {
            tracing::info!(command = ?cmd, "admin command");
        }
        let shared = self.shared.clone();
        let done = match cmd {
            Command::Show(what) => {
                show::show(*what, &self.shared).encode(out, cmd.tag());
                return Ok(Ok(()));
            }
            Command::Pause(db) => self.watching(control::pause(&shared, db.as_deref())).await?,
            Command::Kill(db) => self.watching(control::kill(&shared, db)).await?,
            Command::Resume(db) => control::resume(&shared, db.as_deref()),
            Command::Reload => control::reload(&shared),
            Command::Shutdown => control::shutdown(&shared),
            Command::Set { key, value } => set::set(&shared, key, value),
            Command::Reconnect(db) => control::reconnect(&shared, db.as_deref()),
            Command::WaitClose(db) => self.watching(control::wait_close(&shared, db.as_deref())).await?,
            Command::Disable(db) => control::disable(&shared, db, true),
            Command::Enable(db) => control::disable(&shared, db, false),
            Command::Suspend => control::suspend(),
        };
        Ok(done.map(|notices| {
            for (code, text) in notices {
                let severity =
                    if code == sqlstate::SUCCESSFUL_COMPLETION { Severity::Notice } else { Severity::Warning };
                messages::error_response(out, severity, code, &text);
            }
            result::command_complete(out, cmd.tag());
        }))
    }

    /// Awaits a command that may take long while watching the client: if it
    /// leaves (or weir starts draining), the wait ends.
    async fn watching<T>(&mut self, work: impl std::future::Future<Output = T>) -> Result<T, ClientError> {
        tokio::pin!(work);
        loop {
            tokio::select! {
                done = &mut work => return Ok(done),
                r = wire::fill(self.socket, &mut self.buf), if self.buf.len() < self.max_message => {
                    r?;
                }
                _ = self.shared.shutdown.cancelled() => return Err(ClientError::ShuttingDown),
            }
        }
    }
}

/// Notices sent before a command's CommandComplete.
pub type Notices = Vec<(SqlState, String)>;
