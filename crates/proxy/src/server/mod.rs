//! Server connections: weir's logins to Postgres (`handshake`), socket
//! options for fast dead-peer detection, the per-connection protocol
//! conversation state, cancel forwarding, and the liveness probe behind the
//! watchdog. A `ServerConn` never belongs to a client; the pool lends it
//! out.

pub mod auth_lookup;
pub mod cancel;
pub mod conn;
pub mod conversation;
pub mod exchange;
pub mod handshake;
pub mod probe;
pub mod readback;
pub mod scram_client;
pub mod socket;
pub mod statements;
pub mod stream;

pub use cancel::{forward_cancel, CancelGate};
pub use conn::{connect, ConnParts, ConnectError, ConnectSpec, CountSlot, ServerConn};
pub use conversation::Conversation;
