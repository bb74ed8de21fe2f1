//! weir's own short exchanges on a server connection: write bytes, run a
//! simple query, and drain output until every ReadyForQuery owed has come.
//! Used by recovery, health checks, parameter re-application and the
//! goodbye of an evicted connection.

use std::time::Duration;

use bytes::{Buf, BytesMut};
use tokio::io::AsyncWriteExt;
use weir_metrics::CloseReason;

use super::conversation::MAX_SERVER_MESSAGE;
use super::ServerConn;
use crate::params::ParamMap;
use crate::protocol::messages::{self, ErrorFields};
use crate::protocol::tags::{backend as be, frontend as fe};
use crate::wire::{self, WireError};

/// How long weir's own statements around a client's transaction may take:
/// the client's settings applied before it, read back after it. They answer
/// at once on a live server; one silent this long is taken for dead (a path
/// that froze while still acknowledging, which neither keepalive nor
/// TCP_USER_TIMEOUT notices).
pub(crate) const SETTINGS_LIMIT: Duration = Duration::from_secs(10);

impl ServerConn {
    /// Makes this server's session parameters match a client's reported
    /// `params` and unreported `settings`. Skipped outright when the four
    /// maps are as they were when this server last matched (the same client
    /// back on the same server). True when it sent SQL to the server.
    ///
    /// A value the server reports back in another spelling (`DateStyle`
    /// ISO becomes "ISO, MDY") is its canonical one: the client's `params`
    /// take it, so that the next server already holding it needs no SET.
    /// Both steps are logged with PgBouncer's words at verbose 1.
    pub async fn sync_params(&mut self, params: &mut ParamMap, settings: &ParamMap) -> Result<bool, CloseReason> {
        if self.matched == Some(self.stamps(params, settings)) {
            return Ok(false);
        }
        let sql = ParamMap::sync_sql(params, settings, &self.params, &self.settings);
        if let Some(sql) = &sql {
            crate::span::client_event!(debug, pid = self.cancel.pid, "varcache_apply: {sql}");
            let before = self.params.clone();
            // Boxed: rare, and kept out of every request's future.
            match Box::pin(tokio::time::timeout(SETTINGS_LIMIT, run(self, sql))).await {
                Ok(ran) => ran?,
                Err(_) => {
                    crate::span::client_event!(
                        warn,
                        pid = self.cancel.pid,
                        "the server did not answer the client's settings within {SETTINGS_LIMIT:?}; closing it"
                    );
                    return Err(CloseReason::Unresponsive);
                }
            }
            self.settings = settings.clone();
            let mut canonical = Vec::new();
            for (k, v) in params.iter() {
                match self.params.get(k) {
                    Some(reported) if reported != v && before.get(k) != Some(reported) => {
                        crate::span::client_event!(
                            debug,
                            "varcache_set_canonical: setting {k} to its canonical version {v} -> {reported}"
                        );
                        canonical.push((k.to_owned(), reported.to_owned()));
                    }
                    _ => self.params.set(k, v),
                }
            }
            for (k, v) in canonical {
                params.set(&k, &v);
            }
        }
        self.matched = Some(self.stamps(params, settings));
        Ok(sql.is_some())
    }

    /// The unreported settings read back from this server after a client's
    /// transaction are what it holds now; the next `sync_params` compares
    /// against them.
    pub(crate) fn adopt_settings(&mut self, on_server: ParamMap) {
        self.settings = on_server;
        self.matched = None;
    }

    /// The unreported settings this server holds now.
    pub(crate) fn settings(&self) -> &ParamMap {
        &self.settings
    }

    /// The stamps of a client's maps and this server's.
    fn stamps(&self, params: &ParamMap, settings: &ParamMap) -> crate::params::Stamps {
        [params.stamp(), settings.stamp(), self.params.stamp(), self.settings.stamp()]
    }
}

/// Writes bytes weir made itself to the server.
pub(crate) async fn write(conn: &mut ServerConn, bytes: &[u8]) -> Result<(), CloseReason> {
    if bytes.is_empty() {
        return Ok(());
    }
    conn.stream.write_all(bytes).await.map_err(|_| CloseReason::ServerClosed)
}

/// Sends one simple query and drains its answer (errors included).
pub(crate) async fn run(conn: &mut ServerConn, sql: &str) -> Result<(), CloseReason> {
    let mut out = BytesMut::new();
    messages::query(&mut out, sql);
    conn.conv.note_client(fe::QUERY);
    write(conn, &out).await?;
    drain(conn).await
}

/// Reads and discards server output until every ReadyForQuery owed has come.
pub(crate) async fn drain(conn: &mut ServerConn) -> Result<(), CloseReason> {
    while conn.conv.owes_output() {
        if conn.rbuf.is_empty() {
            fill(conn).await?;
        }
        let ServerConn { rbuf, conv, params, .. } = conn;
        let scanned = conv.scan_server(rbuf, |k, v| params.set(k, v)).map_err(|_| CloseReason::ProtocolError)?;
        rbuf.advance(scanned.forward);
        if scanned.fatal {
            return Err(CloseReason::ServerClosed);
        }
        if scanned.forward == 0 {
            fill(conn).await?;
        }
    }
    Ok(())
}

/// Sends one simple query on a quiet connection and reads its whole answer,
/// returning the first ErrorResponse (the statement Postgres refused), if any.
/// ParameterStatus updates `conn.params`; ReadyForQuery sets the status.
pub(crate) async fn run_checked(conn: &mut ServerConn, sql: &str) -> Result<Option<ErrorFields>, CloseReason> {
    run_rows(conn, sql, |_| {}).await
}

/// `run_checked`, passing each DataRow's body to `on_row`.
pub(crate) async fn run_rows(
    conn: &mut ServerConn,
    sql: &str,
    mut on_row: impl FnMut(&[u8]),
) -> Result<Option<ErrorFields>, CloseReason> {
    let mut out = BytesMut::new();
    messages::query(&mut out, sql);
    write(conn, &out).await?;
    let mut first_error = None;
    loop {
        let read = wire::read_frame(&mut conn.stream, &mut conn.rbuf, MAX_SERVER_MESSAGE);
        let frame = read.await.map_err(read_failure)?;
        let body = frame.body();
        match frame.tag {
            be::DATA_ROW => on_row(body),
            be::ERROR_RESPONSE => {
                let f = messages::parse_error_fields(body).map_err(|_| CloseReason::ProtocolError)?;
                if f.severity == "FATAL" || f.severity == "PANIC" {
                    return Err(CloseReason::ServerError);
                }
                first_error.get_or_insert(f);
            }
            be::PARAMETER_STATUS => {
                let param = messages::parameter_status_text(body).map_err(|_| CloseReason::ProtocolError)?;
                if let Some((k, v)) = param {
                    conn.params.set(k, v);
                }
            }
            be::READY_FOR_QUERY => {
                conn.conv.set_status(*body.first().ok_or(CloseReason::ProtocolError)?);
                return Ok(first_error);
            }
            _ => {}
        }
    }
}

fn read_failure(e: WireError) -> CloseReason {
    match e {
        WireError::Protocol(_) => CloseReason::ProtocolError,
        _ => CloseReason::ServerClosed,
    }
}

async fn fill(conn: &mut ServerConn) -> Result<(), CloseReason> {
    wire::fill(&mut conn.stream, &mut conn.rbuf).await.map(|_| ()).map_err(|_| CloseReason::ServerClosed)
}

/// Ends a connection weir no longer wants while Postgres still counts it:
/// Terminate, then wait (at most `limit`) for Postgres to close the socket,
/// which it does once the backend has left pg_stat_activity; only then is
/// the connection closed with `reason`, and its place in its database's
/// count freed.
pub(crate) async fn goodbye(mut conn: Box<ServerConn>, limit: Duration, reason: CloseReason) {
    let mut out = BytesMut::new();
    messages::terminate(&mut out);
    let wait = async {
        if write(&mut conn, &out).await.is_ok() {
            while crate::wire::fill(&mut conn.stream, &mut conn.rbuf).await.is_ok() {
                conn.rbuf.clear();
            }
        }
    };
    let _ = tokio::time::timeout(limit, wait).await;
    conn.close(reason);
}
