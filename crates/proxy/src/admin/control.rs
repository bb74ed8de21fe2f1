//! The console commands that change weir: PAUSE, RESUME, KILL, RELOAD,
//! SHUTDOWN, RECONNECT, WAIT_CLOSE, DISABLE, ENABLE and SUSPEND (refused),
//! with PgBouncer's semantics (SET is in `set.rs`). PAUSE holds new transactions and
//! returns once the servers in use are released (they are then closed, as
//! PgBouncer does before a database restart); RESUME releases the held
//! clients, and ends a PAUSE still waiting (57014). A cancel of the console
//! client (psql's ^C) ends a waiting PAUSE, which is undone, as in PgBouncer,
//! or a waiting WAIT_CLOSE or KILL (57014). KILL disconnects a database's
//! clients, closes its servers and leaves it paused until RESUME.

use std::sync::Arc;
use std::time::Duration;

use weir_metrics::CloseReason;

use super::command::Shutdown;
use super::Notices;
use crate::config::PoolMode;
use crate::protocol::{sqlstate, SqlState};
use crate::state::{quiesce, Quiesced, Shared, StopMode};

/// A command that was refused or failed, with the SQLSTATE to report.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct AdminError {
    pub code: SqlState,
    pub message: String,
    /// The reason is in the log already (with more detail): the console's
    /// own line for the refusal leaves it out.
    pub logged: bool,
}

impl AdminError {
    pub fn new(code: SqlState, message: impl Into<String>) -> Self {
        AdminError { code, message: message.into(), logged: false }
    }

    /// An error whose reason was logged where it arose.
    fn logged(code: SqlState, message: impl Into<String>) -> Self {
        AdminError { logged: true, ..AdminError::new(code, message) }
    }
}

pub(super) type Outcome = Result<Notices, AdminError>;

fn notice(text: impl Into<String>) -> (SqlState, String) {
    (sqlstate::SUCCESSFUL_COMPLETION, text.into())
}

/// A database name must be configured (or have a pool) to be paused or
/// killed (PgBouncer's words; Postgres's SQLSTATE for an unknown database,
/// where PgBouncer sends 08P01).
fn known(shared: &Shared, db: &str) -> Result<(), AdminError> {
    let configured = shared.config.load().databases.contains_key(db);
    if configured || shared.pools.all().iter().any(|p| p.key.database == db) {
        Ok(())
    } else {
        Err(AdminError::new(sqlstate::INVALID_CATALOG_NAME, format!("no such database: {db}")))
    }
}

/// PAUSE [db]: waits until no server of the paused pools is in use, closing
/// each as it comes back (reason admin).
pub async fn pause(shared: &Arc<Shared>, db: Option<&str>) -> Outcome {
    if let Some(db) = db {
        known(shared, db)?;
    }
    let pools = shared.set_paused(db, true);
    let busy: u32 = pools.iter().map(|p| p.snapshot().active).sum();
    tracing::info!(
        database = db.unwrap_or("*"),
        servers_in_use = busy,
        "PAUSE: waiting for servers in use to be released"
    );
    match quiesce(&pools, CloseReason::Admin, None).await {
        Quiesced::Resumed => Err(AdminError::new(
            sqlstate::QUERY_CANCELED,
            "PAUSE ended: RESUME came before the servers in use were released",
        )),
        Quiesced::Closed | Quiesced::TimedOut => {
            Ok(vec![notice(format!("paused {}; RESUME releases it", db.unwrap_or("all databases")))])
        }
    }
}

/// A waiting command the console client cancelled (a CancelRequest with its key).
pub fn cancelled() -> Outcome {
    Err(AdminError::new(sqlstate::QUERY_CANCELED, "canceling statement due to user request"))
}

/// A waiting PAUSE the console client cancelled: what it paused is resumed
/// (PgBouncer resumes on a cancel too), and the client gets 57014.
pub fn pause_cancelled(shared: &Arc<Shared>, db: Option<&str>) -> Outcome {
    let pools = shared.set_paused(db, false);
    tracing::info!(database = db.unwrap_or("*"), pools = pools.len(), "PAUSE cancelled: resumed");
    cancelled()
}

/// RESUME [db]; refused during SHUTDOWN WAIT_FOR_* (PgBouncer's words).
pub fn resume(shared: &Arc<Shared>, db: Option<&str>) -> Outcome {
    if shared.is_stopping() {
        return Err(AdminError::new(sqlstate::PROTOCOL_VIOLATION, "pooler is shutting down"));
    }
    if let Some(db) = db {
        known(shared, db)?;
        if shared.paused_databases().iter().any(|d| d == "*") {
            let msg = "every database is paused (PAUSE without a name); RESUME without a name releases them";
            return Err(AdminError::new(sqlstate::OBJECT_NOT_IN_PREREQUISITE_STATE, msg));
        }
    }
    let pools = shared.set_paused(db, false);
    tracing::info!(database = db.unwrap_or("*"), pools = pools.len(), "RESUME");
    Ok(Vec::new())
}

/// KILL [db]: the database's clients (every database's without a name;
/// the console's are not touched) are disconnected at once (a running
/// query is cancelled and its server recovered), then its servers are
/// closed; it stays paused until RESUME.
pub async fn kill(shared: &Arc<Shared>, db: Option<&str>) -> Outcome {
    if let Some(db) = db {
        known(shared, db)?;
    }
    let pools = shared.set_paused(db, true);
    let n = shared.client_list.kill_database(db, "terminating connection due to administrator command (KILL)");
    let name = db.unwrap_or("every database");
    tracing::info!(database = db.unwrap_or("*"), clients = n, "KILL");
    let cfg = shared.config.load();
    let settle = cfg.weir.server_reset_timeout.max(cfg.weir.server_connect_timeout) + Duration::from_secs(1);
    let resume = db.map_or("RESUME".to_owned(), |d| format!("RESUME {d}"));
    let mut notices = vec![notice(format!("disconnected {n} client(s) of {name}; it stays paused until {resume}"))];
    if quiesce(&pools, CloseReason::Admin, Some(settle)).await == Quiesced::TimedOut {
        notices
            .push((sqlstate::WARNING, format!("some server connections of {name} were still busy after {settle:?}")));
    }
    Ok(notices)
}

/// KILL_CLIENT id: disconnects the client with that id (SHOW CLIENTS' `id`;
/// PgBouncer's words when there is none).
pub fn kill_client(shared: &Arc<Shared>, id: &str) -> Outcome {
    let Ok(id) = id.parse::<u64>() else {
        return Err(AdminError::new(sqlstate::PROTOCOL_VIOLATION, "invalid client pointer supplied"));
    };
    if !shared.client_list.kill_id(id, "admin forced disconnect") {
        return Err(AdminError::new(sqlstate::PROTOCOL_VIOLATION, "client not found"));
    }
    tracing::info!(id, "KILL_CLIENT");
    Ok(Vec::new())
}

/// RELOAD: the config file and auth_file, without dropping clients. A file
/// that does not validate changes nothing.
pub fn reload(shared: &Arc<Shared>) -> Outcome {
    match shared.reload_from_disk() {
        Ok(notes) => {
            tracing::info!(notes = notes.len(), "config reloaded (RELOAD)");
            notes.iter().for_each(|n| tracing::warn!("{n}"));
            Ok(notes.into_iter().map(|n| (sqlstate::WARNING, n)).collect())
        }
        Err(e) => {
            tracing::error!(error = %e, "RELOAD failed; keeping the old config");
            Err(AdminError::logged(
                sqlstate::CONFIG_FILE_ERROR,
                format!("RELOAD failed, see logs for additional details; the old config stays in effect: {e}"),
            ))
        }
    }
}

/// SHUTDOWN: drain as on SIGTERM (the console client itself is told to go
/// right after this command completes). SHUTDOWN WAIT_FOR_SERVERS and
/// WAIT_FOR_CLIENTS: see `state::stopping`; the console stays.
pub fn shutdown(shared: &Arc<Shared>, mode: Shutdown) -> Outcome {
    let mode = match mode {
        Shutdown::Drain => {
            let shared = shared.clone();
            tokio::spawn(async move { shared.drain().await });
            return Ok(vec![notice("weir is draining: no new clients; running transactions may finish")]);
        }
        Shutdown::WaitForServers => StopMode::WaitForServers,
        Shutdown::WaitForClients => StopMode::WaitForClients,
    };
    shared.stop_when_done(mode);
    Ok(vec![notice(format!("{mode:?}: no new clients; weir stops when done"))])
}

/// The pools of `db` (every pool for None), which must be known.
fn pools_of(shared: &Shared, db: Option<&str>) -> Result<Vec<Arc<crate::pool::Pool>>, AdminError> {
    if let Some(db) = db {
        known(shared, db)?;
    }
    Ok(shared.pools.all().into_iter().filter(|p| db.is_none_or(|d| p.key.database == d)).collect())
}

/// RECONNECT [db]: each server connection open now closes once it is
/// released (idle ones at once); new ones replace them as clients need.
pub fn reconnect(shared: &Arc<Shared>, db: Option<&str>) -> Outcome {
    let pools = pools_of(shared, db)?;
    pools.iter().for_each(|p| p.reconnect());
    tracing::info!(database = db.unwrap_or("*"), pools = pools.len(), "RECONNECT");
    if shared.config.load().weir.server_fast_close {
        // Session-mode clients keep their server until they leave: they go now.
        let session: Vec<_> = pools.iter().filter(|p| p.settings().pool_mode == PoolMode::Session).cloned().collect();
        let n = shared.client_list.kill_of_pools(&session, crate::state::client_list::FAST_CLOSE);
        tracing::info!(clients = n, "server_fast_close: closing because: database configuration changed");
    }
    Ok(vec![notice("server connections close as they are released; WAIT_CLOSE waits for them")])
}

/// WAIT_CLOSE [db]: returns once no server connection a RECONNECT marked
/// is still open. (A reload closes none in weir: new settings apply to new
/// connections, so only RECONNECT leaves connections to wait for.)
pub async fn wait_close(shared: &Arc<Shared>, db: Option<&str>) -> Outcome {
    let pools = pools_of(shared, db)?;
    while pools.iter().any(|p| p.reconnect_pending()) {
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(Vec::new())
}

/// DISABLE db / ENABLE db: new clients of db are refused / accepted again.
/// Logged-in clients stay.
pub fn disable(shared: &Arc<Shared>, db: &str, disabled: bool) -> Outcome {
    known(shared, db)?;
    let changed = shared.admin.set_disabled(db, disabled);
    tracing::info!(database = db, changed, "{}", if disabled { "DISABLE" } else { "ENABLE" });
    Ok(Vec::new())
}

/// SUSPEND: PgBouncer's step before an online restart, which weir lacks.
pub fn suspend() -> Outcome {
    Err(AdminError::new(
        sqlstate::FEATURE_NOT_SUPPORTED,
        "SUSPEND is not supported: weir has no online restart (use PAUSE to hold new transactions)",
    ))
}
