//! The `suite` benchmark: pgbench workloads against direct
//! Postgres, weir (the release binary, in a subprocess), PgBouncer (when
//! Debian's `pgbouncer` is installed) and pg_doorman (when given a binary),
//! interleaved round by round, medians reported, optionally beside a busy
//! neighbour; a large-result stream; 10,000 idle clients. Writes
//! `bench/results/results.md` (+ `.json`, and a PNG chart when matplotlib is
//! importable) and prints the table. Never pass/fail: it prints figures.
//!
//! Submodules: `opts` (flags), `env` (fd limit, binaries, temp dir),
//! `procstat` (/proc CPU and RSS), `targets` (starting the proxies),
//! `neighbour` (the spinning thread),
//! `pgbench` (running and parsing pgbench), `workloads` (the list and the
//! interleaved runner), `stream`, `idle`, `results` (what a run measured),
//! `report` (its tables, from `report_rows` and `report_targets`).

pub(crate) mod env;
mod idle;
mod neighbour;
mod opts;
mod pgbench;
pub(crate) mod procstat;
mod report;
mod report_rows;
mod report_targets;
mod results;
mod stream;
mod targets;
mod workloads;

use std::time::Instant;

use anyhow::Context;
use weir_testkit::{PgOptions, PgServer};

pub use opts::Opts;
use targets::{Kind, Target};

/// Postgres `max_connections`: enough for direct pgbench at -c 1000.
const PG_MAX_CONNECTIONS: u32 = 1100;

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let opts = Opts::parse(args)?;
    env::ensure_fd_limit(opts.fd_limit_wanted())?;
    let started = Instant::now();
    let weir_bin = env::weir_binary(opts.weir_bin.as_deref())?;
    let pgbouncer_bin = if opts.want(Kind::PgBouncer) { env::find_pgbouncer() } else { None };
    if opts.want(Kind::PgBouncer) && pgbouncer_bin.is_none() {
        eprintln!("\n*** PgBouncer not installed: skipped (apt-get install -y pgbouncer) ***\n");
    }
    let doorman_bin = if opts.want(Kind::Doorman) { opts.doorman_bin.clone() } else { None };
    let work = env::WorkDir::create()?;

    eprintln!("== starting a throwaway Postgres (max_connections {})", pg_max_connections(&opts));
    let pg = PgServer::start(PgOptions {
        max_connections: pg_max_connections(&opts),
        log_connections: false,
        ..PgOptions::default()
    })
    .context("starting the throwaway Postgres")?;
    pgbench::init(&pg, opts.scale)?;

    let mut targets = vec![];
    if opts.want(Kind::Direct) {
        targets.push(Target::direct(pg.port()));
    }
    for &threads in &opts.threads {
        if opts.want(Kind::Weir) {
            targets.push(Target::start_weir(&weir_bin, &work, pg.port(), threads)?);
        }
    }
    if let Some(bin) = &pgbouncer_bin {
        targets.push(Target::start_pgbouncer(bin, &work, pg.port())?);
    }
    if let Some(bin) = &doorman_bin {
        let hash = pg
            .psql("postgres", &format!("select passwd from pg_shadow where usename = '{}'", weir_testkit::MD5_USER))
            .context("reading the bench user's md5 hash for pg_doorman")?;
        for &threads in &opts.threads {
            targets.push(Target::start_doorman(bin, &work, pg.port(), hash.trim(), threads)?);
        }
    }
    for t in &targets {
        pgbench::warm_up(t)?;
    }

    let mut results = results::Results::new(&opts, &pg, [pgbouncer_bin.as_deref(), doorman_bin.as_deref()], &targets);
    for w in workloads::list(&opts) {
        results.rows.push(workloads::run(&w, &targets, &opts, &work)?);
    }
    if opts.stream_mb > 0 {
        results.stream = Some(stream::run(&targets, &opts)?);
    }
    if opts.idle > 0 {
        results.idle = Some(idle::run(&targets, opts.idle)?);
    }
    results.elapsed = started.elapsed();
    drop(targets);
    drop(pg);
    report::write(&results, &opts)
}

fn pg_max_connections(opts: &Opts) -> u32 {
    if opts.quick {
        100
    } else {
        PG_MAX_CONNECTIONS
    }
}
