//! weir: a transparent PostgreSQL wire-protocol pooling proxy.
//!
//! Dependencies point one way: `client` → `pool` → `server` → `protocol`;
//! everything may use `config`, `params`, `wire` and the `weir-metrics` crate.
#![forbid(unsafe_code)]

pub mod admin;
pub mod app;
pub mod auth;
pub mod cancel;
pub mod client;
pub mod config;
#[doc(hidden)]
pub mod fuzzing;
pub mod params;
pub mod pool;
pub mod protocol;
pub mod server;
pub mod signal;
pub mod state;
pub mod tls;
pub mod wire;

pub use app::Weir;
pub use config::Config;
