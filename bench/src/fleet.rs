//! The `fleet` benchmark: a fleet of poolers (sidecars) in front of one
//! Postgres whose role has a `CONNECTION LIMIT`, the fleet's real budget.
//!
//! It starts one throwaway Postgres (pgbench data at scale 1, the bench role
//! limited to `--limit` connections) and N+1 weirs (`--instances N`, pool
//! `--pool` each, transaction mode, `fleet_share = true` unless
//! `--no-share`, which leaves the key out): N loaded instances and a spare
//! one with no load, which is where the load moves to. Each loaded instance
//! gets its own `pgbench -c C -P 1` running the `--script`: `select`
//! (pgbench -S, the default: on a small machine the poolers, the pgbenches
//! and Postgres share the CPU, so TPS is bound by CPU as much as by the
//! servers each instance holds) or `sleep` (`select pg_sleep(0.005)`: a
//! transaction holds its server 5 ms, so TPS follows the servers held, the
//! share). Three phases of `--duration` seconds:
//!
//! 1. load on instances 1..N, the same on each;
//! 2. the load moves: instance 1's pgbench ends, the spare's starts;
//! 3. instance 2 is killed with SIGKILL, its pgbench with it (the pod is gone).
//!
//! SHOW POOLS of every instance is read every 100 ms (servers held, maxwait),
//! refused connects once a second. Then the same fleet of PgBouncers. Prints
//! per instance TPS per phase, servers held, errors, peak wait, refused
//! connects per second after the first second, how long the spare took to
//! hold its share after the move, and how long the survivors took to take up
//! the killed instance's share. Not a pass/fail test.
//!
//! `weir-bench fleet [--instances N] [--limit L] [--pool P] [--clients C]
//! [--duration S] [--script select|sleep] [--no-share] [--skip-pgbouncer]
//! [--weir-bin PATH]`;
//! `WEIR_BENCH_KEEP=1` keeps the work folder (configs and the poolers' logs).

mod load;
mod member;
mod report;
mod sample;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use weir_testkit::{PgOptions, PgServer, APP_DB, TRUST_USER};

use load::{Load, Script};
use member::{Kind, Member, Setup};
use sample::{Sampler, Watch};

/// The fleet bench's flags (`--help`).
const USAGE: &str = "fleet [--instances N] [--limit L] [--pool P] [--clients C] [--duration S] \
                     [--script select|sleep] [--no-share] [--skip-pgbouncer] [--weir-bin PATH]";

#[derive(Debug, Clone)]
pub struct Opts {
    /// Loaded instances; one more, idle at first, receives the moved load.
    pub instances: usize,
    pub limit: u32,
    pub pool: u32,
    pub clients: u32,
    pub duration: u64,
    pub script: Script,
    pub share: bool,
    pub pgbouncer: bool,
    pub weir_bin: Option<PathBuf>,
}

impl Opts {
    fn parse(args: &[String]) -> anyhow::Result<Opts> {
        let mut o = Opts {
            instances: 3,
            limit: 12,
            pool: 10,
            clients: 20,
            duration: 10,
            script: Script::Select,
            share: true,
            pgbouncer: true,
            weir_bin: None,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = || it.next().with_context(|| format!("{a} needs a value ({USAGE})"));
            match a.as_str() {
                "--instances" => o.instances = value()?.parse()?,
                "--limit" => o.limit = value()?.parse()?,
                "--pool" => o.pool = value()?.parse()?,
                "--clients" => o.clients = value()?.parse()?,
                "--duration" => o.duration = value()?.parse()?,
                "--script" => o.script = Script::parse(value()?)?,
                "--weir-bin" => o.weir_bin = Some(PathBuf::from(value()?)),
                "--no-share" => o.share = false,
                "--skip-pgbouncer" => o.pgbouncer = false,
                "-h" | "--help" => {
                    println!("usage: {USAGE}");
                    std::process::exit(0);
                }
                other => bail!("unknown option {other} ({USAGE})"),
            }
        }
        if o.instances < 2 || o.duration < 2 || o.limit == 0 || o.pool == 0 || o.clients == 0 {
            bail!("--instances must be at least 2, --duration at least 2, the others positive");
        }
        Ok(o)
    }
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let opts = Opts::parse(args)?;
    let weir_bin = match &opts.weir_bin {
        Some(p) => p.clone(),
        None => crate::soak::build_weir()?,
    };
    let pgbouncer_bin = if opts.pgbouncer { crate::suite::env::find_pgbouncer() } else { None };
    let work = work_dir()?;
    let done = run_all(&opts, &weir_bin, pgbouncer_bin.as_deref(), &work);
    if std::env::var_os("WEIR_BENCH_KEEP").is_some() {
        eprintln!("kept {} (WEIR_BENCH_KEEP)", work.display());
    } else {
        let _ = std::fs::remove_dir_all(&work);
    }
    done
}

fn run_all(opts: &Opts, weir_bin: &Path, pgbouncer_bin: Option<&Path>, work: &Path) -> anyhow::Result<()> {
    let pg = PgServer::start(PgOptions { max_connections: 100, log_connections: false, ..PgOptions::default() })
        .context("starting the throwaway Postgres")?;
    prepare(&pg, opts.limit)?;
    let mut runs = vec![run_fleet(Kind::Weir, weir_bin, opts, &pg, work)?];
    let note = match pgbouncer_bin {
        Some(bin) => {
            runs.push(run_fleet(Kind::PgBouncer, bin, opts, &pg, work)?);
            None
        }
        None if !opts.pgbouncer => Some("PgBouncer skipped (--skip-pgbouncer)"),
        None => Some("PgBouncer not installed, skipped (apt-get install -y pgbouncer)"),
    };
    report::print_header(opts);
    for r in &runs {
        report::print_run(r);
    }
    if let Some(n) = note {
        println!("{n}");
    }
    Ok(())
}

/// pgbench's tables (scale 1), then the role's connection limit: the budget.
fn prepare(pg: &PgServer, limit: u32) -> anyhow::Result<()> {
    eprintln!("== pgbench -i -s 1, then {TRUST_USER} CONNECTION LIMIT {limit}");
    let out = std::process::Command::new("pgbench")
        .args(["-h", "127.0.0.1", "-p", &pg.port().to_string(), "-U", TRUST_USER, "-i", "-q", "-s", "1", APP_DB])
        .env_remove("PGHOST")
        .env_remove("PGPORT")
        .output()
        .context("running pgbench -i (is pgbench installed?)")?;
    if !out.status.success() {
        bail!("pgbench -i failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    pg.psql(APP_DB, &format!("alter role {TRUST_USER} connection limit {limit}"))?;
    Ok(())
}

/// The three phases against a fleet of `kind`.
fn run_fleet(kind: Kind, bin: &Path, opts: &Opts, pg: &PgServer, work: &Path) -> anyhow::Result<report::Run> {
    let n = opts.instances;
    let share = (kind == Kind::Weir && opts.share).then_some(true);
    let setup = Setup { pool: opts.pool, share, pg_port: pg.port() };
    let mut members = (1..=n + 1).map(|i| Member::start(kind, i, bin, work, setup)).collect::<Result<Vec<_>, _>>()?;
    eprintln!("== {} × {} started; {} s per phase", kind.label(), n + 1, opts.duration);
    let d = opts.duration;
    let watch = Watch {
        addrs: members.iter().map(Member::addr).collect(),
        refusals: members.iter().map(Member::refusals).collect(),
        pg_port: pg.port(),
    };
    let t0 = Instant::now();
    let sampler = Sampler::start(watch, t0);
    let mut loads: Vec<Option<Load>> = Vec::new();
    for m in &members[..n] {
        let secs = if m.index == 1 { d } else { 3 * d };
        loads.push(Some(Load::start(m.port, opts.script, opts.clients, secs, t0)?));
    }
    sleep_until(t0, d as f64);
    let moved_at = t0.elapsed().as_secs_f64();
    loads.push(Some(Load::start(members[n].port, opts.script, opts.clients, 2 * d, t0)?));
    sleep_until(t0, 2.0 * d as f64);
    if let Some(l) = loads[1].as_mut() {
        l.kill();
    }
    members[1].kill9()?;
    let killed_at = t0.elapsed().as_secs_f64();
    sleep_until(t0, 3.0 * d as f64 + 0.5);
    let samples = sampler.finish()?;
    let outcomes = loads.into_iter().flatten().map(Load::finish).collect::<Result<Vec<_>, _>>()?;
    let names = members.iter().map(Member::name).collect();
    drop(members);
    drain(pg)?;
    let label = match (kind, share) {
        (Kind::Weir, Some(_)) => "weir, fleet_share = true".to_string(),
        (Kind::Weir, None) => "weir, no fleet_share key".to_string(),
        (Kind::PgBouncer, _) => crate::suite::env::first_line("pgbouncer", &["--version"]),
    };
    Ok(report::Run {
        label,
        names,
        samples,
        outcomes,
        phase_secs: d as f64,
        moved_at,
        killed_at,
        limit: opts.limit,
        pool: opts.pool,
    })
}

fn sleep_until(t0: Instant, secs: f64) {
    let left = secs - t0.elapsed().as_secs_f64();
    if left > 0.0 {
        std::thread::sleep(Duration::from_secs_f64(left));
    }
}

/// Waits until the role has no backend left (a killed pooler's backends end
/// when Postgres reads its closed sockets), terminating stragglers after 5 s.
fn drain(pg: &PgServer) -> anyhow::Result<()> {
    let count = format!("select count(*) from pg_stat_activity where usename = '{TRUST_USER}'");
    let end = Instant::now() + Duration::from_secs(5);
    while pg.psql(APP_DB, &count)?.trim() != "0" {
        if Instant::now() > end {
            pg.psql(
                APP_DB,
                &format!("select pg_terminate_backend(pid) from pg_stat_activity where usename = '{TRUST_USER}'"),
            )?;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    Ok(())
}

fn work_dir() -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("weir-fleet-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // PgBouncer runs as postgres when we are root and writes its log and pid here.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))?;
    Ok(dir)
}
