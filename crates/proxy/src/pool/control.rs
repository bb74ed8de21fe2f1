//! What operators and host changes do to a pool's servers: PAUSE, RESUME,
//! SHUTDOWN WAIT_FOR_SERVERS, RECONNECT, a server TLS change, a host that
//! retires its servers or comes to match, and closing the idle ones.

use std::sync::Arc;
use std::time::Instant;

use super::{HostKey, Pool};
use weir_metrics::CloseReason;

impl Pool {
    pub fn pause(self: &Arc<Self>) {
        self.state.lock().pause();
    }

    /// SHUTDOWN WAIT_FOR_SERVERS: lends no server again; its waiters (at
    /// the next upkeep) and every later request get `PoolError::ShuttingDown`.
    pub fn stop_lending(self: &Arc<Self>) {
        self.state.lock().stop_lending();
    }

    pub fn resume(self: &Arc<Self>) {
        let mut st = self.state.lock();
        st.unpause();
        self.serve_from_idle(&mut st);
        self.want_connects(&mut st);
    }

    /// A change of how servers are reached (server TLS): the cached login
    /// error and the back-off are forgotten, so the next client tries the
    /// new settings at once (PgBouncer's), and every connection open now
    /// closes once released, as after RECONNECT.
    pub fn new_server_settings(self: &Arc<Self>) {
        tracing::info!(
            "{}/{}: server TLS settings changed: closing each obsolete connection once released",
            self.key.database,
            self.key.user
        );
        self.state.lock().backoff_mut().forget_failures();
        self.reconnect();
    }

    /// RECONNECT: every connection open now closes once released (idle ones
    /// at once); new ones replace them as needed.
    pub fn reconnect(self: &Arc<Self>) {
        self.state.lock().mark_reconnect(Instant::now());
        self.close_idle(CloseReason::Admin);
        self.want_connects(&mut self.state.lock());
    }

    /// When the last RECONNECT marked this pool's connections, if one did.
    pub fn reconnect_mark(&self) -> Option<Instant> {
        self.state.lock().reconnect_mark()
    }

    /// True while a connection RECONNECT marked is still open (WAIT_CLOSE).
    pub fn reconnect_pending(&self) -> bool {
        let Some(mark) = self.reconnect_mark() else { return false };
        let wall = std::time::SystemTime::now() - mark.elapsed();
        self.metrics.live_servers().iter().any(|s| s.connected_at < wall)
    }

    /// The servers of host `key` retire: idle ones close now, lent ones
    /// when released (its role changed, or its name points elsewhere).
    pub(crate) fn retire_host(self: &Arc<Self>, key: &HostKey, reason: CloseReason) {
        let doomed = self.state.lock().retire_host(key, reason, Instant::now());
        for conn in doomed {
            conn.close(reason);
        }
        self.want_connects(&mut self.state.lock());
    }

    /// A host of the database came to match: a connect backing off after
    /// failures tries again now.
    pub(crate) fn host_found(self: &Arc<Self>) {
        let mut st = self.state.lock();
        st.backoff_mut().host_found();
        self.want_connects(&mut st);
    }

    /// Closes every idle connection (KILL, shutdown).
    pub fn close_idle(self: &Arc<Self>, reason: CloseReason) {
        let idle = self.state.lock().take_all_idle();
        for conn in idle {
            conn.close(reason);
        }
        self.wake_blocked_siblings();
    }
}
