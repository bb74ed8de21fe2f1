//! Closed label vocabularies: why a server connection closed ([`CloseReason`]),
//! why a connect failed ([`ConnectFailure`]), why a query was dropped
//! ([`DropReason`]), what happened to a cancel request ([`CancelOutcome`]) and
//! how a client connection attempt ended ([`ClientResult`]).
//!
//! Each enum has `as_label()` (the exported label value), `ALL`, `COUNT` and a
//! dense `index()` used to address per-variant counter arrays.

/// Defines a fieldless enum with a label per variant plus `ALL`/`COUNT`/`index()`.
macro_rules! label_enum {
    ($(#[$m:meta])* $name:ident { $($(#[$vm:meta])* $var:ident => $label:literal),+ $(,)? }) => {
        $(#[$m])*
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum $name { $($(#[$vm])* $var),+ }

        impl $name {
            /// Every variant, in declaration order (`ALL[v.index()] == v`).
            pub const ALL: &'static [$name] = &[$($name::$var),+];
            /// Number of variants.
            pub const COUNT: usize = Self::ALL.len();

            /// The exported label value.
            pub const fn as_label(self) -> &'static str {
                match self { $($name::$var => $label),+ }
            }

            /// Dense index in `0..COUNT`.
            pub const fn index(self) -> usize {
                self as usize
            }
        }

        impl std::fmt::Display for $name {
            fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
                f.write_str(self.as_label())
            }
        }
    };
}
pub(crate) use label_enum;

label_enum! {
    /// Why a server connection that was successfully opened got closed.
    ///
    /// Failed connection attempts are not opens and therefore never closes;
    /// they are counted with [`ConnectFailure`].
    CloseReason {
        /// The client vanished mid-transaction, so the server state is unknown.
        ClientGoneUnclean => "client_gone_unclean",
        /// Idle longer than `server_idle_timeout`.
        IdleTimeout => "idle_timeout",
        /// Older than `server_lifetime`.
        Lifetime => "lifetime",
        /// The server sent a fatal error.
        ServerError => "server_error",
        /// The server closed the socket (EOF / reset).
        ServerClosed => "server_closed",
        /// The health check query failed.
        CheckFailed => "check_failed",
        /// The reset query (`DISCARD ALL`, …) failed.
        ResetFailed => "reset_failed",
        /// A query exceeded `query_timeout`.
        QueryTimeout => "query_timeout",
        /// The server owed an answer, stayed silent, and a liveness probe on a
        /// fresh connection found the path or the backend dead.
        Unresponsive => "unresponsive",
        /// Closed by an admin command (KILL, RECONNECT, …).
        Admin => "admin",
        /// weir is shutting down.
        Shutdown => "shutdown",
        /// The pool shrank (e.g. pool size lowered on reload).
        PoolShrink => "pool_shrink",
        /// Idle, and closed to make room under `max_db_connections` for
        /// another user's pool of the same database that had clients waiting
        /// (PgBouncer evicts the same way), or under `pool_size` for a
        /// replication client's own connection.
        Evicted => "evicted",
        /// Above this weir's share of the connection budget a fleet of weirs
        /// shares, while the fleet is at its limit (`fleet_share`).
        FleetShare => "fleet_share",
        /// The server violated the wire protocol.
        ProtocolError => "protocol_error",
        /// Logged in, but not what the database's `target_session_attrs`
        /// asks for (a standby where writes are wanted): weir tries the next host.
        RoleMismatch => "role_mismatch",
        /// Its host's role changed (a standby promoted, a primary that
        /// answered 25006 or came back read-only): retired when released.
        RoleChanged => "role_changed",
        /// Its host name now resolves elsewhere, or the host left the
        /// database's list: retired when released.
        HostGone => "host_gone",
        /// A replication connection ended with its client: the server is the
        /// client's alone, never pooled, and closes when the client leaves.
        ReplicationEnded => "replication_ended",
        /// Closed by a code path that gave no reason: a
        /// [`ServerConnGuard`](crate::ServerConnGuard) was dropped without
        /// `close()` or `set_reason()`. Non-zero values indicate a weir bug or a
        /// cancelled task, and are exported on purpose so they are visible.
        Dropped => "dropped",
    }
}

label_enum! {
    /// Why an attempt to open a server connection failed.
    ConnectFailure {
        /// Connect or login took too long.
        Timeout => "timeout",
        /// TCP connection refused.
        Refused => "refused",
        /// Authentication with the server failed.
        Auth => "auth",
        /// Other I/O error.
        Io => "io",
        /// The server violated the protocol during startup.
        Protocol => "protocol",
        /// No host of the database matched its `target_session_attrs`.
        NoMatchingHost => "no_matching_host",
    }
}

label_enum! {
    /// Which limit Postgres named when it refused a connection with 53300
    /// (too many connections): backpressure, not a failure.
    ConnectRefusal {
        /// The role's CONNECTION LIMIT (`too many connections for role`).
        RoleLimit => "role_limit",
        /// The database's CONNECTION LIMIT (`too many connections for database`).
        DatabaseLimit => "database_limit",
        /// `max_connections` (`sorry, too many clients already`).
        MaxConnections => "max_connections",
        /// Only reserved slots left (superuser_reserved_connections,
        /// reserved_connections).
        ReservedSlots => "reserved_slots",
        /// A 53300 whose message names none of the above.
        Other => "other",
    }
}

label_enum! {
    /// Why a client query was dropped before it completed.
    DropReason {
        /// The client disconnected while the query was queued or running.
        ClientGone => "client_gone",
        /// The client cancelled it.
        Cancelled => "cancelled",
        /// The client waited longer than `query_wait_timeout` for a server.
        WaitTimeout => "wait_timeout",
        /// Refused at once: the queue was at `max_waiting_clients(_total)`.
        QueueFull => "queue_full",
        /// Refused at once: its predicted wait exceeded its wait budget.
        Shed => "shed",
        /// Not started: the client's deadline left less time than the
        /// pool's transactions take.
        Deadline => "deadline",
    }
}

label_enum! {
    /// What weir did with a CancelRequest.
    CancelOutcome {
        /// Forwarded to the server running the query.
        Forwarded => "forwarded",
        /// Handled inside weir (e.g. the client was only waiting).
        AnsweredLocally => "answered_locally",
        /// The key matched no known client (or named a peer weir does not
        /// know, or one it may not forward to again).
        Unknown => "unknown",
        /// Sent on to the peer that minted the key (another weir, or a
        /// PgBouncer, behind the same address).
        Peer => "peer",
    }
}

label_enum! {
    /// How a client connection attempt ended.
    ClientResult {
        /// Authenticated and admitted.
        Ok => "ok",
        /// Authentication failed.
        AuthFailed => "auth_failed",
        /// Refused (limits, unknown database, shutting down, …).
        Refused => "refused",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check<T: Copy + PartialEq + std::fmt::Debug>(
        all: &[T],
        idx: impl Fn(T) -> usize,
        label: impl Fn(T) -> &'static str,
    ) {
        let mut labels = std::collections::HashSet::new();
        for (i, v) in all.iter().enumerate() {
            assert_eq!(idx(*v), i);
            let l = label(*v);
            assert!(l.chars().all(|c| c.is_ascii_lowercase() || c == '_'), "{l}");
            assert!(labels.insert(l));
        }
    }

    #[test]
    fn labels_are_dense_unique_snake_case() {
        check(CloseReason::ALL, CloseReason::index, CloseReason::as_label);
        check(ConnectFailure::ALL, ConnectFailure::index, ConnectFailure::as_label);
        check(ConnectRefusal::ALL, ConnectRefusal::index, ConnectRefusal::as_label);
        check(DropReason::ALL, DropReason::index, DropReason::as_label);
        check(CancelOutcome::ALL, CancelOutcome::index, CancelOutcome::as_label);
        check(ClientResult::ALL, ClientResult::index, ClientResult::as_label);
        assert_eq!(CloseReason::COUNT, 20);
        assert_eq!(CloseReason::ClientGoneUnclean.to_string(), "client_gone_unclean");
        assert_eq!(CloseReason::Dropped.as_label(), "dropped");
    }
}
