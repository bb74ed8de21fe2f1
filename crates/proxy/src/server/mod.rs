//! Server connections: weir's logins to Postgres (`handshake`), socket
//! options for fast dead-peer detection, the per-connection protocol
//! conversation state, cancel forwarding, and the liveness probe behind the
//! watchdog, dialling (`dial`: names looked up, the stream to the host the
//! pool chose), a server's role for target_session_attrs (`role`), and the
//! tie that ends a host's servers at once on a failover (`tether`). A
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

pub(crate) use cancel::forward_cancel;
pub(crate) use conn::{connect, ConnectError, ConnectSpec, CountSlot, ServerConn, ServerSide};
pub(crate) use conversation::Conversation;
