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

label_enum! {
    /// What a database's host was last found to be (`weir_host_role`, SHOW
    /// SERVERS and SHOW DATABASES).
    HostRole {
        /// Not in recovery, and accepts writes.
        Primary => "primary",
        /// Not in recovery, but default_transaction_read_only is on.
        ReadOnly => "read_only",
        /// In recovery (a hot standby).
        Standby => "standby",
        /// The last connect to it failed.
        Unreachable => "unreachable",
        /// Not known yet, or in doubt since its last answer.
        Unknown => "unknown",
    }
}
