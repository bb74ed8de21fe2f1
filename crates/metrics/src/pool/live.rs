//! The open server connections of a pool, as `SHOW SERVERS` lists them.

use std::sync::atomic::AtomicU64;
use std::sync::Arc;
use std::time::SystemTime;

use super::{PoolMetrics, R};
use crate::addr::ConnAddr;

/// What the admin console shows about one open server connection
/// (`SHOW SERVERS`). Registered through
/// [`ServerConnGuard::describe`](crate::ServerConnGuard::describe) and removed
/// when the guard counts the close.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServerInfo {
    /// weir's id of the connection (SHOW SERVERS' `id`).
    pub id: u64,
    /// The backend's process id (its BackendKeyData).
    pub pid: i32,
    /// The server's address.
    pub addr: ConnAddr,
    /// weir's end of the connection.
    pub local_addr: Option<ConnAddr>,
    /// When the connection was opened (wall clock).
    pub connected_at: SystemTime,
    /// Prepared statements weir keeps on it (transaction mode), kept up to
    /// date by the connection itself.
    pub prepared_statements: SharedCount,
}

/// A number one side keeps up to date and others read (e.g. a server
/// connection's prepared statements, for `SHOW SERVERS`). Compares by value.
#[derive(Debug, Clone, Default)]
pub struct SharedCount(Arc<AtomicU64>);

impl SharedCount {
    /// Sets the number.
    pub fn set(&self, n: u64) {
        self.0.store(n, R);
    }

    /// The number now.
    pub fn get(&self) -> u64 {
        self.0.load(R)
    }
}

impl PartialEq for SharedCount {
    fn eq(&self, other: &Self) -> bool {
        self.get() == other.get()
    }
}

impl Eq for SharedCount {}

impl PoolMetrics {
    /// The open server connections described so far, oldest first.
    pub fn live_servers(&self) -> Vec<ServerInfo> {
        self.servers.live.lock().values().cloned().collect()
    }

    pub(crate) fn add_live(&self, info: ServerInfo) -> u64 {
        let id = self.servers.next_live.fetch_add(1, R);
        self.servers.live.lock().insert(id, info);
        id
    }

    pub(crate) fn remove_live(&self, id: u64) {
        self.servers.live.lock().remove(&id);
    }
}
