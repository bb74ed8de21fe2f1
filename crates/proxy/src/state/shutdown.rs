//! SIGTERM with `sigterm = "wait_for_clients"`, and `Weir::wait_for_clients`:
//! PgBouncer's SHUTDOWN WAIT_FOR_CLIENTS (`stopping`), awaited. The TCP
//! listeners close at once, so new connections go to the other weirs on
//! the port or address; the Unix socket takes cancel requests (a peer's
//! forward) and the console, and refuses new clients.

use std::sync::Arc;

use super::{Shared, StopMode};

impl Shared {
    /// Stops accepting and returns once every client has left and weir has
    /// stopped.
    pub async fn wait_for_clients(self: &Arc<Self>) {
        self.stop_when_done(StopMode::WaitForClients);
        self.stopped.cancelled().await;
    }
}
