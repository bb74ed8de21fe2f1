//! `weir-bench`: benchmarks that print tables. Never pass/fail timing tests.
//!
//! - `suite`  — pgbench workloads against direct Postgres, weir and PgBouncer
//! - `storm`  — the incident's load shape: short deadlines, queued cancels
//! - `refill` — the pool refill curve after a mass termination
//! - `soak`   — a long run of churn and faults, checked from Postgres's data
//! - `fleet`  — N poolers sharing one Postgres's connection limit: fairness, moved load, a killed instance
//! - `failover` — a primary stopped and its standby promoted, then the old primary back as a standby: writers' errors, waits and rows
//! - `replication` — a logical replication stream through weir, and weir's memory meanwhile
//! - `convoy` — a lock convoy or a long job on one route of the pool, and the unrelated route's TPS and latency beside it
#![forbid(unsafe_code)]

mod convoy;
mod failover;
mod fleet;
mod listening;
mod pgbouncer;
mod refill;
mod replication;
mod soak;
mod storm;
mod suite;

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let rest = args.get(1..).unwrap_or(&[]);
    match args.first().map(String::as_str) {
        Some("suite") => suite::run(rest),
        Some("storm") => storm::run(rest),
        Some("refill") => refill::run(rest),
        Some("soak") => soak::run(rest),
        Some("fleet") => fleet::run(rest),
        Some("failover") => failover::run(rest),
        Some("replication") => replication::run(rest),
        Some("convoy") => convoy::run(rest),
        _ => {
            eprintln!("usage: weir-bench suite|storm|refill|soak|fleet|failover|replication|convoy [options]");
            std::process::exit(2);
        }
    }
}
