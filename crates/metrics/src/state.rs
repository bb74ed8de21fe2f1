//! Connection-state vocabularies for the pool gauges: [`ServerState`]
//! (`weir_pool_servers`) and [`ClientState`] (`weir_pool_clients`).

use crate::close::label_enum;

label_enum! {
    /// State of a server connection, as shown by `SHOW POOLS`.
    ServerState {
        /// Linked to a client.
        Active => "active",
        /// Idle in the pool, ready for use.
        Idle => "idle",
        /// Connecting / authenticating.
        Login => "login",
        /// Running a health check or reset query.
        Tested => "tested",
        /// A replication client's own connection (never pooled).
        Replication => "replication",
    }
}

label_enum! {
    /// State of a client connection, as shown by `SHOW POOLS`.
    ClientState {
        /// Linked to a server connection.
        Active => "active",
        /// Waiting for a server connection.
        Waiting => "waiting",
        /// Connected, not in a transaction, holding no server.
        Idle => "idle",
    }
}
