//! The admin console: a client that asks for the virtual database `weir`
//! (or `pgbouncer`, so existing scripts and pgbouncer_exporter keep working)
//! and is listed in `admin_users` or `stats_users` gets PgBouncer's console
//! commands over the simple query protocol. No server is involved. Users
//! log in (`login`) like any client; stats users may only SHOW.

pub mod command;
pub mod control;
pub mod result;
mod set;
pub mod show;
mod show_connections;
mod show_pools;
mod show_process;
mod show_queries;
pub mod stats;

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;

use crate::login::{ClientError, ClientStream, Role};
use crate::protocol::messages::{self, Severity};
use crate::protocol::tags::{frontend as fe, status};
use crate::protocol::{frame::read_cstr, sqlstate, Frame, ProtocolError, SqlState};
use crate::state::Shared;
use crate::wire::{self, WireError};
use command::Command;
pub use control::AdminError;

/// Serves a logged-in console client: its commands until it leaves.
pub async fn serve(
    socket: &mut ClientStream,
    console: crate::login::Console,
    shared: &Arc<Shared>,
) -> Result<(), ClientError> {
    // Its cancel key and listing are held until it leaves.
    let crate::login::Console { buf, role, reg, listed: _listed } = console;
    let max_message = shared.config.load().weir.max_message_size as usize;
    Console { socket, buf, shared: shared.clone(), role, reg, max_message, skipping: false }.run().await
}

/// One logged-in console client.
struct Console<'a> {
    socket: &'a mut ClientStream,
    buf: BytesMut,
    shared: Arc<Shared>,
    role: Role,
    /// The client's cancel key: a CancelRequest with it ends a waiting command.
    reg: crate::cancel_keys::Registration,
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
        self.shared.admin.count_query();
        match command::parse(&sql) {
            Ok(cmds) if cmds.is_empty() => result::empty_query(out),
            Ok(cmds) => {
                for cmd in cmds {
                    if let Err(e) = self.command(&cmd, out).await? {
                        match e.logged {
                            true => tracing::info!(command = ?cmd, "admin command refused"),
                            false => tracing::info!(command = ?cmd, error = %e, "admin command refused"),
                        }
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
            Command::Pause(db) => match self.watching(control::pause(&shared, db.as_deref())).await? {
                Some(done) => done,
                None => control::pause_cancelled(&shared, db.as_deref()),
            },
            Command::Kill(db) => {
                self.watching(control::kill(&shared, db.as_deref())).await?.unwrap_or_else(control::cancelled)
            }
            Command::KillClient(id) => control::kill_client(&shared, id),
            Command::Resume(db) => control::resume(&shared, db.as_deref()),
            Command::Reload => control::reload(&shared),
            Command::Shutdown(mode) => control::shutdown(&shared, *mode),
            Command::Set { key, value } => set::set(&shared, key, value),
            Command::Reconnect(db) => control::reconnect(&shared, db.as_deref()),
            Command::WaitClose(db) => {
                self.watching(control::wait_close(&shared, db.as_deref())).await?.unwrap_or_else(control::cancelled)
            }
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
    /// leaves (or weir starts draining), the wait ends; if it cancels (a
    /// CancelRequest with its key), the wait ends with None.
    async fn watching<T>(&mut self, work: impl std::future::Future<Output = T>) -> Result<Option<T>, ClientError> {
        tokio::pin!(work);
        // Waiting, for the cancel registry: a cancel now marks the slot and wakes this task.
        self.reg.slot.set_waiting(std::time::Instant::now());
        let done = loop {
            tokio::select! {
                done = &mut work => break Some(done),
                () = self.reg.slot.cancelled_in_queue() => break None,
                r = wire::fill(self.socket, &mut self.buf), if self.buf.len() < self.max_message => {
                    r?;
                }
                _ = self.shared.shutdown.cancelled() => return Err(ClientError::ShuttingDown),
            }
        };
        self.reg.slot.set_idle();
        Ok(done)
    }
}

/// Notices sent before a command's CommandComplete.
pub type Notices = Vec<(SqlState, String)>;
