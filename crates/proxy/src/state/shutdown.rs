//! The shutdown that keeps its clients (SHUTDOWN WAIT_FOR_CLIENTS, and
//! SIGTERM with `sigterm = "wait_for_clients"`): PgBouncer's way to restart
//! one of several instances that share a port (`so_reuseport`) or sit
//! behind one address. The TCP listeners close at once, so new connections
//! go to the others; the Unix socket takes cancel requests (a peer's
//! forward) and the console, and refuses new clients (57P01); every client
//! here stays, idle or not, for as long as it likes; once the last has
//! left, the server connections close and weir stops. (The drain, which
//! ends clients, is `Shared::drain`.)

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use weir_metrics::CloseReason;

use super::{quiesce, Shared};

/// How often the number of clients left is looked at.
const CLIENTS_POLL: Duration = Duration::from_millis(50);

impl Shared {
    /// Stops accepting and returns once every client has left and the
    /// servers are closed. A drain or stop under way wins: this then waits
    /// for it.
    pub async fn wait_for_clients(self: &Arc<Self>) {
        if self.draining.swap(true, Ordering::SeqCst) {
            return self.stopped.cancelled().await;
        }
        tracing::info!(
            clients = self.client_list.len(),
            "shutting down once every client has left: not accepting new connections"
        );
        self.stop_accepting.cancel();
        let gone = async {
            while self.clients.load(Ordering::Acquire) > 0 {
                tokio::time::sleep(CLIENTS_POLL).await;
            }
        };
        tokio::select! {
            _ = gone => {}
            // A drain or stop that comes meanwhile (a second signal).
            _ = self.stopped.cancelled() => return,
        }
        tracing::info!("the last client has left");
        // Now the Unix socket closes too, and the tasks end.
        self.shutdown.cancel();
        self.tracker.close();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.tracker.wait()).await;
        let cfg = self.config.load();
        let settle = cfg.weir.server_reset_timeout.max(cfg.weir.server_connect_timeout) + Duration::from_millis(500);
        if !quiesce(&self.pools.all(), CloseReason::Shutdown, Some(settle)).await {
            tracing::warn!("some server connections were still busy at the end");
        }
        self.stopped.cancel();
    }
}
