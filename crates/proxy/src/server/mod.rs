//! Server connections: dialling Postgres (`dial`: names looked up, the
//! stream to the host the pool chose, the login) and weir's logins to it
//! (`handshake`), the connection the pool lends (`conn`), socket options for
//! fast dead-peer detection, the per-connection protocol conversation state,
//! cancel forwarding, the watchdog's settings and liveness probe (`watch`,
//! `probe`), a server's role for target_session_attrs (`role`), and the tie
//! that ends a host's servers at once on a failover (`tether`). A
//! `ServerConn` never belongs to a client; the pool lends it out.

pub(crate) mod auth_lookup;
pub(crate) mod cancel;
pub(crate) mod conn;
pub(crate) mod conversation;
pub(crate) mod dial;
pub(crate) mod exchange;
pub(crate) mod handshake;
pub(crate) mod probe;
pub(crate) mod readback;
mod recover;
pub(crate) mod role;
pub(crate) mod scram_client;
pub(crate) mod socket;
pub(crate) mod statements;
pub(crate) mod stream;
pub(crate) mod tether;
pub(crate) mod watch;

pub(crate) use cancel::forward_cancel;
pub(crate) use conn::{connect, CountSlot, ServerConn, ServerSide};
pub(crate) use conversation::Conversation;
pub(crate) use dial::{ConnectError, ConnectSpec};

/// The next connection id: one sequence for clients and server connections
/// alike, as PgBouncer numbers its sockets (the `id` of SHOW CLIENTS,
/// SERVERS and SOCKETS, and KILL_CLIENT's argument). A client takes its id
/// when its login starts, a server connection when it is opened.
pub(crate) fn next_socket_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}
