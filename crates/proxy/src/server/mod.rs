//! Server connections: weir's logins to Postgres, socket options for fast
//! dead-peer detection, the per-connection protocol conversation state,
//! cancel forwarding, and the liveness probe behind the watchdog. A
//! `ServerConn` never belongs to a client; the pool lends it out.

pub mod auth_lookup;
pub mod cancel;
pub mod conn;
pub mod conversation;
pub mod exchange;
pub mod login;
pub mod probe;
pub mod readback;
mod recover;
pub mod scram_client;
pub mod socket;
pub mod statements;
pub mod stream;

pub use cancel::forward_cancel;
pub use conn::{connect, ConnectError, ConnectSpec, CountSlot, ServerConn, ServerSide};
pub use conversation::Conversation;
