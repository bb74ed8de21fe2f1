//! The console's SHUTDOWN WAIT_FOR_SERVERS and SHUTDOWN WAIT_FOR_CLIENTS,
//! with PgBouncer's meanings. Both stop listening on TCP at once (the Unix
//! socket stays, for the console) and refuse new pooled clients.
//! WAIT_FOR_SERVERS lends no server for a new transaction (a client asking
//! for one is closed: "server shutting down"; one inside a transaction
//! finishes it) and stops once no server is in use. WAIT_FOR_CLIENTS lets
//! every client go on and stops once the last has left. RESUME and SIGUSR2
//! cannot undo either.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::Shared;

/// How often the end condition is looked at.
const LOOK_EVERY: Duration = Duration::from_millis(100);

/// SHUTDOWN's waiting modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    WaitForServers,
    WaitForClients,
}

impl Shared {
    /// Starts a SHUTDOWN WAIT_FOR_SERVERS or WAIT_FOR_CLIENTS; a second one
    /// changes nothing.
    pub fn stop_when_done(self: &Arc<Self>, mode: StopMode) {
        if self.stopping.is_cancelled() || self.draining.load(Ordering::SeqCst) {
            return;
        }
        self.stopping.cancel();
        if mode == StopMode::WaitForServers {
            for pool in self.pools.all() {
                pool.stop_lending();
            }
        }
        tracing::info!(mode = ?mode, "SHUTDOWN: no new clients; stopped listening on TCP");
        let shared = self.clone();
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(LOOK_EVERY).await;
                let done = match mode {
                    StopMode::WaitForServers => shared.pools.all().iter().all(|p| p.snapshot().active == 0),
                    StopMode::WaitForClients => shared.clients.load(Ordering::SeqCst) == 0,
                };
                if done || shared.stopped.is_cancelled() {
                    break;
                }
            }
            tracing::info!(mode = ?mode, "SHUTDOWN: done waiting; stopping");
            shared.stop_now();
        });
    }

    /// A SHUTDOWN WAIT_FOR_* is under way (new pooled clients are refused,
    /// TCP listeners are closed).
    pub fn is_stopping(&self) -> bool {
        self.stopping.is_cancelled()
    }
}
