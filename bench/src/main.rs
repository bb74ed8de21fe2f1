//! `weir-bench`: benchmarks that print tables. Never pass/fail timing tests.
//!
//! - `suite`  — pgbench workloads against direct Postgres, weir and PgBouncer
//! - `storm`  — the incident's load shape: short deadlines, queued cancels
//! - `refill` — the pool refill curve after a mass termination
//! - `soak`   — a long run of churn and faults, checked from Postgres's data
#![forbid(unsafe_code)]

mod pgbouncer;
mod refill;
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
        _ => {
            eprintln!("usage: weir-bench suite|storm|refill|soak [options]");
            std::process::exit(2);
        }
    }
}
