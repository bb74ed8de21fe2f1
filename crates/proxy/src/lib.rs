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
/// The fuzz targets' entry points: with the `fuzzing` feature (the fuzz
/// crate turns it on) and in unit tests, never in a default build.
#[cfg(any(test, feature = "fuzzing"))]
#[doc(hidden)]
pub mod fuzzing;
pub mod params;
pub mod pool;
pub mod protocol;
pub mod ratelog;
pub mod server;
pub mod signal;
pub mod tls;
pub mod wire;

pub use app::Weir;
pub use config::Config;
