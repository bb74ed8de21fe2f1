//! A pooled client's login after its startup packet: authentication, its
//! pool, the parameters it is told (its startup settings checked on a
//! server), its cancel key and wait budget, the greeting, and its listing
//! for SHOW CLIENTS and KILL; what its session then starts from (`Pooled`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use weir_metrics::ConnAddr;

use super::authenticate::authenticate_pooled;
use super::error::ClientError;
use super::greet::{client_params, greeting};
use super::stream::ClientStream;
use super::{count_login, Start};
use crate::cancel_keys::Registration;
use crate::config::{Config, PoolMode};
use crate::params::ParamMap;
use crate::pool::{Lease, Pool};
use crate::protocol::sqlstate;
use crate::server::exchange;
use crate::state::client_list::{ClientGuard, NewClient, Owner};
use crate::state::Shared;

/// A pooled client, logged in and greeted: what its session starts from.
#[derive(Debug)]
pub struct Pooled {
    /// Bytes the client sent past its login, unread.
    pub buf: BytesMut,
    pub login: LoggedIn,
    /// Session mode: the server taken at login, for the first request.
    pub held: Option<Box<Lease>>,
    /// The client's listing for SHOW CLIENTS and KILL, until it leaves.
    pub listed: ClientGuard,
}

/// What a login settled for a pooled session: its pool and mode, the
/// parameters the client was told and the settings it asked for, its cancel
/// key, its wait budget, its message limit and the drain signal.
#[derive(Debug)]
pub struct LoggedIn {
    pub pool: Arc<Pool>,
    pub mode: PoolMode,
    pub params: ParamMap,
    pub settings: ParamMap,
    pub reg: Registration,
    pub budget: Budget,
    pub max_message: u32,
    pub shutdown: crate::signal::Signal,
}

/// A client's wait budget, the one rule for the login's wait and every
/// queue wait after: the pool's query_wait_timeout as configured at each
/// wait (so a reload applies to connected clients at once), capped by a
/// share (client_deadline_fraction at login) of the deadline the client
/// declared at startup.
#[derive(Debug, Clone, Copy)]
pub struct Budget {
    /// The declared deadline's share, and the declared deadline, in
    /// microseconds; `u32::MAX` when none was declared (8 bytes in all
    /// where two `Option<Duration>` take 32: part of every idle client's
    /// task, see `app/footprint.rs`). A deadline past 71 minutes counts as
    /// 71 minutes.
    share_us: u32,
    deadline_us: u32,
}

impl Budget {
    pub fn new(declared: Option<Duration>, fraction: f64) -> Self {
        let us = |d: Duration| u32::try_from(d.as_micros()).unwrap_or(u32::MAX - 1).min(u32::MAX - 1);
        Budget {
            share_us: declared.map_or(u32::MAX, |d| us(d.mul_f64(fraction))),
            deadline_us: declared.map_or(u32::MAX, us),
        }
    }

    /// The wait budget under `query_wait_timeout`: all of it, or less when
    /// the client declared a deadline (its share, so weir answers before the
    /// client gives up), but never below 1 ms.
    pub fn under(&self, query_wait_timeout: Duration) -> Duration {
        match self.share_us {
            u32::MAX => query_wait_timeout,
            us => query_wait_timeout.min(Duration::from_micros(us.into())).max(Duration::from_millis(1)),
        }
    }

    /// The deadline the client declared at login, if it did.
    pub fn declared(&self) -> Option<Duration> {
        (self.deadline_us != u32::MAX).then(|| Duration::from_micros(self.deadline_us.into()))
    }
}

/// The end of a pooled client's login, once greeted (or refused): counts
/// the login, logs it, and lists the client (with its `listing`) for SHOW CLIENTS
/// and KILL until its session ends.
pub(super) fn finish_pooled(
    greeted: Result<(LoggedIn, Option<Box<Lease>>), ClientError>,
    buf: BytesMut,
    shared: &Shared,
    cfg: &Config,
    peer: ConnAddr,
    listing: super::Listing,
) -> Result<Pooled, ClientError> {
    count_login(shared, &greeted);
    let (login, held) = greeted?;
    let application_name = login.params.get("application_name").unwrap_or_default();
    if cfg.weir.log_connections {
        tracing::info!(application_name, "client logged in");
    }
    let listed = shared.client_list.register(NewClient {
        id: listing.id,
        owner: Owner::Pool(login.pool.clone()),
        peer,
        local: listing.local,
        application_name: application_name.to_owned(),
        key_pid: login.reg.pid,
        slot: Some(login.reg.slot.clone()),
        replication: Default::default(),
        counted: Some(listing.counted),
    });
    Ok(Pooled { buf, login, held, listed })
}

/// Authenticates and finds the pool; then the client's parameters (its
/// startup settings checked on a server), its wait budget and cancel key.
pub(super) async fn settle(
    socket: &mut ClientStream,
    buf: &mut BytesMut,
    shared: &Arc<Shared>,
    cfg: &Arc<Config>,
    start: Start,
) -> Result<(LoggedIn, Hello), ClientError> {
    let Start { mut req, minor, peer } = start;
    if shared.is_stopping() {
        return Err(ClientError::ShuttingDown);
    }
    let (key, credentials) = authenticate_pooled(socket, buf, shared, cfg, &mut req, peer).await?;
    if shared.admin.is_disabled(&key.database) {
        return Err(ClientError::Disabled(key.database));
    }
    let Some(pool) = shared.pool_for(cfg, &key, credentials) else {
        return Err(ClientError::UnknownDatabase(key.database));
    };
    let settings = pool.settings();
    let budget = Budget::new(req.declared_deadline, cfg.weir.client_deadline_fraction);
    let deadline = Instant::now() + budget.under(settings.wait_limit().0);
    let session = settings.pool_mode == PoolMode::Session;
    let (server_params, mut lease) = pool.server_params(deadline, session).await?;
    let mut params = client_params(&req, &server_params);
    let startup = (&req.settings, server_params.as_ref());
    check_startup_settings(&pool, deadline, &mut lease, session, &mut params, startup).await?;
    let long_key = minor >= crate::protocol::startup::LONG_KEY_MINOR;
    let (reg, secret) = shared.cancels.register_as(None, long_key);
    let login = LoggedIn {
        pool,
        mode: settings.pool_mode,
        params,
        settings: req.settings,
        reg,
        budget,
        max_message: cfg.weir.max_message_size,
        shutdown: shared.shutdown.clone(),
    };
    Ok((login, Hello { server_params, secret, deadline, lease: lease.map(Box::new) }))
}

/// What the pooled greeting needs once the client is authenticated.
pub(super) struct Hello {
    server_params: Arc<ParamMap>,
    /// The secret of the client's cancel key (4 bytes, or 32 for 3.2).
    secret: crate::cancel_keys::Secret,
    /// The end of the client's wait budget for a server.
    deadline: Instant,
    /// Session mode: the server the login already took (to learn the
    /// server's parameters, or to check the client's settings on it), which
    /// the session keeps.
    lease: Option<Box<Lease>>,
}

/// Greets an authenticated pooled client. In session mode its server for
/// life is taken first (unless the login already holds it) and handed back,
/// so that BackendKeyData carries the server's own pid (the secret stays weir's, and cancels still pass through
/// weir's map). That wait is bounded by the client's wait budget
/// (query_wait_timeout), as a first query's would be, not by
/// client_login_timeout.
pub(super) async fn greet_pooled(
    socket: &mut ClientStream,
    buf: &mut BytesMut,
    mut login: LoggedIn,
    mut hello: Hello,
    shared: &Shared,
) -> Result<(LoggedIn, Option<Box<Lease>>), ClientError> {
    let mut held = None;
    if login.mode == PoolMode::Session {
        let lease = match hello.lease.take() {
            Some(lease) => lease,
            None => Box::new(take_server(socket, buf, &login, hello.deadline).await?),
        };
        let long_key = hello.secret.as_bytes().len() == crate::cancel_keys::LONG_KEY_LEN;
        (login.reg, hello.secret) = shared.cancels.register_as(Some(lease.conn().backend_pid()), long_key);
        held = Some(lease);
    }
    let key = (login.reg.pid, hello.secret.as_bytes());
    let out = greeting(&hello.server_params, &login.params, key);
    socket.write_all(&out).await.map_err(ClientError::Io)?;
    Ok((login, held))
}

/// Client bytes buffered, at most, while a session-mode login waits.
const LOGIN_WAIT_READ_LIMIT: usize = 64 * 1024;

/// Queues for a session-mode client's server, watching the client: one that
/// leaves meanwhile leaves the queue. Bytes it sends early stay buffered.
async fn take_server(
    socket: &mut ClientStream,
    buf: &mut BytesMut,
    login: &LoggedIn,
    deadline: Instant,
) -> Result<Lease, ClientError> {
    let mut acquire = std::pin::pin!(login.pool.acquire(deadline));
    loop {
        tokio::select! {
            biased;
            r = &mut acquire => return Ok(r?),
            r = crate::wire::fill(socket, buf), if buf.len() < LOGIN_WAIT_READ_LIMIT => {
                r?;
            }
        }
    }
}

/// Tracked parameters that take any value, so need no check at login.
const ANY_VALUE: &[&str] = &["application_name"];

/// Applies the client's startup settings and parameter values on a server
/// once, at login, so a name or value Postgres refuses is refused now, with
/// Postgres's own SQLSTATE and message (as Postgres does at connection
/// start), instead of failing silently on every later server. Costs one
/// round trip on a pooled server, and only when the client asked for
/// something other than the server's defaults. The client's tracked
/// parameters take the server's spelling (DateStyle "ISO" is "ISO, MDY").
/// A session login checks them on its own server (`held`, taken here if it
/// has none yet), which it keeps.
async fn check_startup_settings(
    pool: &Arc<Pool>,
    deadline: Instant,
    held: &mut Option<Lease>,
    session: bool,
    params: &mut ParamMap,
    (settings, server_defaults): (&ParamMap, &ParamMap),
) -> Result<(), ClientError> {
    let needs_check = !settings.is_empty()
        || params.iter().any(|(k, v)| !ANY_VALUE.contains(&k) && server_defaults.get(k) != Some(v));
    if !needs_check {
        return Ok(());
    }
    let mut own = None;
    let lease = match held {
        Some(lease) => lease,
        None => {
            let taken = pool.acquire(deadline).await?;
            if session {
                held.insert(taken)
            } else {
                own.insert(taken)
            }
        }
    };
    let conn = lease.conn_mut();
    let Some(sql) = ParamMap::sync_sql(params, settings, &conn.params, conn.settings()) else { return Ok(()) };
    // PgBouncer's words for its own SETs (logged at verbose 1).
    crate::span::client_event!(debug, pid = conn.cancel.pid, "varcache_apply: {sql}");
    match exchange::run_checked(conn, &sql).await {
        Err(reason) => {
            if let Some(lease) = held.take().or(own) {
                lease.close(reason);
            }
            Err(ClientError::ServerLost)
        }
        Ok(Some(refused)) => Err(ClientError::RefusedSetting {
            code: sqlstate::lookup(&refused.code).unwrap_or(sqlstate::INVALID_PARAMETER_VALUE),
            message: refused.message_text(),
        }),
        Ok(None) => {
            conn.adopt_settings(settings.clone());
            let names: Vec<String> = params.iter().map(|(k, _)| k.to_owned()).collect();
            for k in names {
                if let Some(v) = conn.params.get(&k) {
                    if let Some(asked) = params.get(&k).filter(|asked| *asked != v) {
                        crate::span::client_event!(
                            debug,
                            "varcache_set_canonical: setting {k} to its canonical version {asked} -> {v}"
                        );
                    }
                    params.set(&k, v);
                }
            }
            Ok(())
        }
    }
}
