//! weir-testkit: test infrastructure shared by weir's end-to-end tests, its
//! benchmarks and the `weir demo` command.
//!
//! * [`PgServer`] — a throwaway PostgreSQL (initdb into a temp dir, started on
//!   a free port, with pre-created `scram_user` / `md5_user` / `trust_user`
//!   roles and an `app` database), cleaned up on drop; [`PgPair`], a primary
//!   and its streaming standby on one port at two loopback addresses.
//! * [`Relay`] — a fault-injecting TCP relay (latency, connect delay, freeze,
//!   RST, refusal) to put between weir and Postgres.
//! * [`pgbouncer::PgBouncer`] — Debian's PgBouncer, for side-by-side
//!   comparisons in benchmarks and tests.
#![forbid(unsafe_code)]

mod error;
pub mod pgbouncer;
pub mod postgres;
pub mod relay;

pub use error::TestkitError;
pub use postgres::{
    PgOptions, PgPair, PgServer, StopMode, APP_DB, MD5_PASS, MD5_USER, SCRAM_PASS, SCRAM_USER, TRUST_PASS, TRUST_USER,
};
pub use relay::Relay;

/// Returns a TCP port on 127.0.0.1 that was free a moment ago (bind to port
/// 0, read the port, release it). Racy by nature: callers that can, retry.
///
/// # Panics
/// If binding `127.0.0.1:0` fails, which means the machine has no usable
/// loopback interface.
pub fn free_port() -> u16 {
    try_free_port().expect("binding 127.0.0.1:0 to find a free port")
}

/// `N` distinct free ports: each listener stays bound until all are picked,
/// so two calls cannot return the same port (as two `free_port` calls can).
pub fn free_ports<const N: usize>() -> [u16; N] {
    let listeners: Vec<_> = (0..N)
        .map(|_| std::net::TcpListener::bind(("127.0.0.1", 0)).expect("binding 127.0.0.1:0 to find a free port"))
        .collect();
    std::array::from_fn(|i| listeners[i].local_addr().expect("a bound listener's address").port())
}

pub(crate) fn try_free_port() -> std::io::Result<u16> {
    let listener = std::net::TcpListener::bind(("127.0.0.1", 0))?;
    Ok(listener.local_addr()?.port())
}
