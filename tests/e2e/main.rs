//! weir's end-to-end tests, one module per concern, built as one binary.
//!
//! Each module starts its own throwaway PostgreSQL and weir through the
//! support kit (`weir_e2e`). `scripts/run-tests.py` runs each module in a
//! process of its own, as when they were separate binaries; modules whose
//! tests hold timing windows (`serial()`/`exclusive()`) run with nothing
//! beside them. Run one module by hand with `cargo test -p weir-e2e --test
//! e2e -- queue::`.

mod admin;
mod admission;
mod auth_query;
mod client_close;
mod console_parity;
mod console_set_sequence;
mod core;
mod core_edges;
mod core_protocol;
mod drivers;
mod dropin;
mod encoding;
mod failover;
mod fingerprints;
mod fleet;
mod fleet_share;
mod hangs;
mod hba;
mod hostile;
mod hostile_flood;
mod libpq18;
mod listen;
mod liveness;
mod liveness_watchdog;
mod load_balance;
mod ops;
mod peers;
mod pgbouncer125;
mod pgbouncer_corpus;
mod pgbouncer_login;
mod pipeline;
mod pool_parity;
mod prepared;
mod prepared_ddl;
mod prepared_edges;
mod prepared_unnamed;
mod protocol32;
mod queue;
mod replication;
mod session_backend;
mod settings;
mod signals;
mod smoke;
mod statement_fuzz;
mod threads;
mod tls;
mod tls_v1;
