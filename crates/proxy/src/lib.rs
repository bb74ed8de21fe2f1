//! weir: a transparent PostgreSQL wire-protocol pooling proxy.
//!
//! Dependencies point one way, down these layers (a module uses only lower
//! layers; `tests/layering.rs` checks it on the source):
//!
//! - `app`: the listener, the accept loop, one task per connection;
//! - `admin`: the console;
//! - `client`, `replication`: the pooled session; a replication client's
//!   own server and the relay to it;
//! - `login`: a client's startup, authentication and greeting, up to what
//!   its connection becomes (a cancel, the console, a pooled session); the
//!   client's stream and error;
//! - `state`: what every client shares, and its lifecycle (pause, reload, drain);
//! - `pool`, `cancel_keys`: server pools and leases; the cancel keys clients hold;
//! - `server`: weir's connections to Postgres;
//! - `auth`: client authentication, the auth_file, hba, the credentials weir
//!   presents to servers;
//! - `tls`; then `wire`, `config`; then `protocol`, `params`, `signal`,
//!   `ratelog`, `span` (how session events find the client span), `verbosity`
//!   (the log level SET verbose raises), `timer` (a future raced against a
//!   timer), which use
//!   nothing of weir. Everything may use the `weir-metrics` crate.
#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod auth;
pub(crate) mod cancel_keys;
pub(crate) mod client;
pub mod config;
/// The fuzz targets' entry points: with the `fuzzing` feature (the fuzz
/// crate turns it on) and in unit tests, never in a default build.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub(crate) mod login;
pub(crate) mod params;
pub mod pool;
pub mod protocol;
pub(crate) mod ratelog;
pub(crate) mod replication;
pub(crate) mod server;
pub(crate) mod signal;
pub(crate) mod span;
pub(crate) mod state;
pub(crate) mod timer;
pub mod tls;
pub mod verbosity;
pub mod wire;

pub use app::Weir;
pub use config::Config;
