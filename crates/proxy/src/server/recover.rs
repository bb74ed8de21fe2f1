//! Putting a server connection its client left dirty back in order:
//! complete a half-sent message, end COPY, close the batch with Sync, cancel
//! what is running, drain to ReadyForQuery, ROLLBACK and run the reset query.
//! The pool bounds the whole sequence and decides what a failure costs.

use std::time::Duration;

use bytes::BytesMut;
use weir_metrics::CloseReason;

use super::exchange::{drain, run, write};
use super::{forward_cancel, ServerConn};
use crate::protocol::tags::status;

/// How long weir waits for Postgres to take a cancel request.
const CANCEL_TIMEOUT: Duration = Duration::from_secs(2);

/// How long recovery waits for a cancelled query to end before it sends the
/// cancel again.
const RECANCEL_AFTER: Duration = Duration::from_millis(500);

/// The most filler weir writes to complete a message its client left half
/// sent; a longer rest closes the connection instead (and bounds the memory).
const MAX_FILLER: usize = 16 << 20;

impl ServerConn {
    /// A cancel is (or is about to be) on its way to this server: a query
    /// is owed an answer, or a cancel request is still out.
    pub(crate) fn being_canceled(&self) -> bool {
        self.conv.owed() > 0 || !self.cancel.gate.is_open()
    }

    /// Brings the connection back to a clean, idle state, running
    /// `reset_query` (if any) on the way. An error names why it could not.
    pub(crate) async fn recover(&mut self, reset_query: Option<&str>) -> Result<(), CloseReason> {
        self.finish_client_side().await?;
        if self.conv.owed() > 0 {
            let _ = forward_cancel(self.cancel.clone(), CANCEL_TIMEOUT).await;
            self.drain_cancelling().await?;
        }
        drain(self).await?;
        if self.conv.status() != status::IDLE {
            run(self, "ROLLBACK").await?;
        }
        if let Some(q) = reset_query.filter(|q| !q.is_empty()) {
            run(self, q).await?;
            self.forget_session_state();
        }
        if !self.cancel.gate.wait_clear(CANCEL_TIMEOUT).await {
            return Err(CloseReason::ResetFailed);
        }
        if self.conv.is_clean() {
            Ok(())
        } else {
            Err(CloseReason::ResetFailed)
        }
    }

    /// Drains, cancelling again each `RECANCEL_AFTER` while the server still
    /// owes an answer: Postgres ignores a cancel that reaches a backend still
    /// waiting for its query's bytes (they can trail the cancel, which goes
    /// on a connection of its own), and the query would then run its full
    /// length. A cancel once sent is always finished, never dropped, so the
    /// gate keeps counting it.
    async fn drain_cancelling(&mut self) -> Result<(), CloseReason> {
        let target = self.cancel.clone();
        let drained = drain(self);
        tokio::pin!(drained);
        loop {
            tokio::select! {
                r = &mut drained => return r,
                () = tokio::time::sleep(RECANCEL_AFTER) => {}
            }
            let again = forward_cancel(target.clone(), CANCEL_TIMEOUT);
            tokio::pin!(again);
            let mut result = None;
            loop {
                tokio::select! {
                    r = &mut drained, if result.is_none() => result = Some(r),
                    _ = &mut again => break,
                }
            }
            if let Some(r) = result {
                return r;
            }
        }
    }

    /// True when the client left no message half sent and no COPY open:
    /// all it sent stands whole on the server (see `settle`).
    pub(crate) fn can_settle(&self) -> bool {
        self.conv.is_whole()
    }

    /// Waits, with no cancel, for the server to answer all its client sent
    /// before leaving: that is when Postgres, serving the client itself,
    /// would read the client's Terminate and close. A batch left open gets
    /// its Sync (Postgres would read the Terminate right after the batch's
    /// last message; the Sync's ReadyForQuery comes just then); the
    /// server's replies are read and dropped until it owes nothing. Only
    /// for a connection that `can_settle`. Cancel-safe: dropped during the
    /// Sync's write, the connection stays marked broken (the pool closes
    /// it); dropped while reading, recovery carries on from there.
    pub(crate) async fn settle(&mut self) -> Result<(), CloseReason> {
        let mut out = BytesMut::new();
        self.conv.finish_client_side(&mut out, 0);
        if !out.is_empty() {
            let was = self.broken.replace(CloseReason::ResetFailed);
            write(self, &out).await?;
            self.broken = was;
        }
        drain(self).await
    }

    /// The reset query ran: RESET ALL in it dropped what weir had SET, and
    /// DISCARD ALL / DEALLOCATE ALL may have dropped weir's statements.
    fn forget_session_state(&mut self) {
        self.settings = crate::params::ParamMap::new();
        self.statements.mark_all_uncertain();
        self.statements.publish();
    }

    /// Puts the client→server stream back on a message boundary and out of
    /// any batch or COPY, without ever making a fragment runnable.
    async fn finish_client_side(&mut self) -> Result<(), CloseReason> {
        let mut out = BytesMut::new();
        if !self.conv.finish_client_side(&mut out, MAX_FILLER) {
            // A gigabyte Query abandoned after its first megabytes: pushing the
            // rest through costs more than a new connection.
            return Err(CloseReason::ResetFailed);
        }
        write(self, &out).await
    }
}
