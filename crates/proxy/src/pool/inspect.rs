//! Read-only views of a pool for the admin console (`SHOW SERVERS`,
//! `SHOW POOLS` sv_used). Short critical sections; nothing is awaited.

use std::time::Duration;

use super::Pool;

/// One idle server connection as the admin console shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdleServer {
    /// The backend's process id.
    pub pid: i32,
    /// How long it has been idle.
    pub idle_for: Duration,
}

impl Pool {
    /// The idle server connections, most recently used first.
    pub fn idle_servers(&self) -> Vec<IdleServer> {
        let st = self.state.lock();
        st.idle().iter().rev().map(|c| IdleServer { pid: c.backend_pid(), idle_for: c.last_used().elapsed() }).collect()
    }
}
