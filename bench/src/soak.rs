//! The `soak` benchmark: a long run of churn and faults against a throwaway
//! Postgres, with weir (a subprocess, transaction mode) or PgBouncer in
//! front, that checks from Postgres's own data that no acknowledged commit
//! was lost or applied twice, and that the pooler recovered from every fault
//! without leaking memory or descriptors.
//!
//! Submodules: `wire` (the raw client), `load` (the steady mix), `faults`
//! (the schedule, injection and recovery), `target` (starting the pooler),
//! `sample` (the per-second CSV), `verdict` (the ledger and done-means checks).
//! Writes `soak.csv`, `faults.csv`, `summary.txt` and `soak.png` (when
//! matplotlib is importable) to `--out`; exits 1 when a check fails.
//!
//! `weir-bench soak [--minutes N] [--out DIR] [--target weir|pgbouncer]
//! [--weir-bin PATH] [--pgbouncer-bin PATH]`

mod faults;
mod load;
mod sample;
mod target;
#[cfg(test)]
mod tests;
mod verdict;
mod wire;

use std::collections::HashMap;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context};
use weir_testkit::{PgOptions, PgServer, Relay, APP_DB, TRUST_USER};

use crate::suite::env;
use load::{Ctx, Protocol, Stats};
use target::{Kind, Target, MIN_POOL_SIZE, POOL_SIZE};
use verdict::Check;

const USAGE: &str = "soak [--minutes N] [--out DIR] [--target weir|pgbouncer] [--weir-bin PATH] [--pgbouncer-bin PATH]";
/// How long the load's clients get to finish after the stop before they count as hung.
const STOP_LIMIT: Duration = Duration::from_secs(45);

struct Opts {
    minutes: f64,
    out: PathBuf,
    kind: Kind,
    weir_bin: Option<PathBuf>,
    pgbouncer_bin: Option<PathBuf>,
}

impl Opts {
    fn parse(args: &[String]) -> anyhow::Result<Opts> {
        let mut o = Opts {
            minutes: 30.0,
            out: PathBuf::from("soak-out"),
            kind: Kind::Weir,
            weir_bin: None,
            pgbouncer_bin: None,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut val = || it.next().with_context(|| format!("{a} needs a value ({USAGE})"));
            match a.as_str() {
                "--minutes" => o.minutes = val()?.parse()?,
                "--out" => o.out = PathBuf::from(val()?),
                "--target" => {
                    o.kind = match val()?.as_str() {
                        "weir" => Kind::Weir,
                        "pgbouncer" => Kind::PgBouncer,
                        other => bail!("--target weir|pgbouncer, not {other}"),
                    }
                }
                "--weir-bin" => o.weir_bin = Some(PathBuf::from(val()?)),
                "--pgbouncer-bin" => o.pgbouncer_bin = Some(PathBuf::from(val()?)),
                "-h" | "--help" => {
                    println!("usage: {USAGE}");
                    std::process::exit(0);
                }
                other => bail!("unknown option {other} ({USAGE})"),
            }
        }
        if o.minutes.is_nan() || o.minutes <= 0.0 {
            bail!("--minutes must be positive");
        }
        Ok(o)
    }
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let opts = Opts::parse(args)?;
    env::ensure_fd_limit(20_000)?;
    let bin = match opts.kind {
        Kind::Weir => match &opts.weir_bin {
            Some(p) => p.clone(),
            None => build_weir()?,
        },
        Kind::PgBouncer => opts
            .pgbouncer_bin
            .clone()
            .or_else(env::find_pgbouncer)
            .context("pgbouncer not found (apt-get install -y pgbouncer, or --pgbouncer-bin)")?,
    };
    std::fs::create_dir_all(&opts.out).with_context(|| format!("creating {}", opts.out.display()))?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let passed = rt.block_on(soak(&opts, &bin))?;
    rt.shutdown_timeout(Duration::from_secs(2));
    if !passed {
        eprintln!("soak: a check failed (see {})", opts.out.join("summary.txt").display());
        std::process::exit(1);
    }
    Ok(())
}

/// `cargo build --release -p weir --bin weir`, as the suite does.
pub(crate) fn build_weir() -> anyhow::Result<PathBuf> {
    let target_dir =
        std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| env::workspace_root().join("target"));
    eprintln!("== cargo build --release -p weir --bin weir");
    let status = Command::new(std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into()))
        .args(["build", "--release", "-p", "weir", "--bin", "weir"])
        .current_dir(env::workspace_root())
        .status()
        .context("running cargo build")?;
    if !status.success() {
        bail!("building weir failed ({status}); or pass --weir-bin PATH");
    }
    Ok(target_dir.join("release/weir"))
}

/// Everything the run produced, for the summary.
struct Outcome {
    plan: faults::Plan,
    records: Vec<faults::Record>,
    samples: Vec<sample::Sample>,
    errors: Vec<load::ErrorEvent>,
    ledger: verdict::Ledger,
    load_end: f64,
    idle_start: (Option<usize>, u64),
    idle_end: (Option<usize>, u64),
    hung: usize,
    panics: usize,
    alive: bool,
    done: u64,
    cancels: (u64, u64),
    vanished: u64,
    messages: std::collections::BTreeMap<String, String>,
}

async fn soak(opts: &Opts, bin: &Path) -> anyhow::Result<bool> {
    let total = Duration::from_secs_f64(opts.minutes * 60.0);
    let pg = tokio::task::block_in_place(|| {
        PgServer::start(PgOptions { max_connections: 400, log_connections: true, ..PgOptions::default() })
    })
    .context("starting the throwaway Postgres")?;
    create_schema(&pg).await?;
    let relay = Relay::start(format!("127.0.0.1:{}", pg.port()).parse()?).await?;
    let dir = work_dir()?;
    let mut target = Target::start(opts.kind, bin, &dir, relay.addr().port())?;
    let run = drive(opts, total, &pg, &relay, &mut target).await;
    let out = match run {
        Ok(o) => o,
        Err(e) => {
            eprintln!("soak: {e:#}; pooler log: {}", target.log.display());
            drop(target);
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    };
    let (report, passed) = summary(opts, &out);
    print!("{report}");
    std::fs::write(opts.out.join("summary.txt"), &report)?;
    plot(&opts.out);
    drop(target);
    if std::env::var_os("WEIR_BENCH_KEEP").is_none() {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(passed)
}

async fn create_schema(pg: &PgServer) -> anyhow::Result<()> {
    let direct = faults::direct(pg).await?;
    direct
        .batch_execute(
            "create table soak_ledger(id bigint not null, writer text not null, at timestamptz not null default clock_timestamp());
             create index on soak_ledger(id);
             create table soak_counter(id int primary key, n bigint not null);
             insert into soak_counter values (1, 0);
             grant all on soak_ledger, soak_counter to public;",
        )
        .await?;
    Ok(())
}

fn work_dir() -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("weir-soak-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
    Ok(dir)
}

/// Starts the sampler and the load, runs the faults, stops, and checks.
async fn drive(
    opts: &Opts,
    total: Duration,
    pg: &PgServer,
    relay: &Relay,
    target: &mut Target,
) -> anyhow::Result<Outcome> {
    wait_for_minimum(&target.addr()).await?;
    let stats = Arc::new(Stats::new());
    let stop_sampler = Arc::new(AtomicBool::new(false));
    let sources = sample::Sources {
        pid: target.pid,
        addr: target.addr(),
        pg_log: pg.log_file(),
        stats: stats.clone(),
        csv: opts.out.join("soak.csv"),
    };
    let sampler = tokio::spawn(sample::run(sources, stop_sampler.clone()));
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let idle_start = idle_state(target).await;
    let ctx = Arc::new(Ctx { addr: target.addr(), user: TRUST_USER.into(), db: APP_DB.into(), stats: stats.clone() });
    let tasks = start_load(&ctx, opts.kind);
    let plan = faults::plan(total);
    println!(
        "soak: {} for {:.0} s, pool {POOL_SIZE} (min {MIN_POOL_SIZE}), {} faults, baseline at {} s",
        opts.kind.label(),
        total.as_secs_f64(),
        plan.faults.len(),
        plan.baseline.as_secs()
    );
    let env = faults::Env { pg, relay, target, ctx: ctx.clone() };
    let mut records = Vec::new();
    // The warm-up: one connect burst well before the baseline, so the
    // baseline RSS already holds what the pooler's first 2,000 connections
    // grow once (buffers, tables); the RSS check then looks for growth
    // across the faults, not for that first step.
    sleep_until(&stats, plan.warmup.as_secs_f64()).await;
    let mut warm = faults::run(&env, faults::Fault::ConnectBurst).await;
    warm.detail = format!("warm-up before the baseline: {}", warm.detail);
    records.push(warm);
    let mut earliest = 0.0f64;
    for &(at, fault) in &plan.faults {
        let start = at.as_secs_f64().max(earliest);
        sleep_until(&stats, start).await;
        let rec = faults::run(&env, fault).await;
        let recovered = rec.recovered_after.unwrap_or(0.0);
        earliest = rec.end + recovered + faults::min_gap(fault).as_secs_f64();
        records.push(rec);
    }
    let last_end = records.last().map(|r| r.end + r.recovered_after.unwrap_or(0.0)).unwrap_or(0.0);
    sleep_until(&stats, total.as_secs_f64().max(last_end + plan.tail.as_secs_f64().min(15.0))).await;
    let load_end = stats.now();
    stats.stop.store(true, Ordering::SeqCst);
    let hung = join_load(tasks).await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let idle_end = idle_state(target).await;
    stop_sampler.store(true, Ordering::SeqCst);
    let samples = sampler.await??;
    let records_ledger = std::mem::take(&mut *stats.ledger.lock().expect("ledger"));
    let ledger = check_ledger(pg, &records_ledger).await?;
    let errors = stats.errors.lock().expect("errors").clone();
    let messages = stats.messages.lock().expect("messages").clone();
    Ok(Outcome {
        plan,
        records,
        samples,
        errors,
        ledger,
        load_end,
        idle_start,
        idle_end,
        hung,
        panics: target.panics(),
        alive: target.alive(),
        done: stats.total_done.load(Ordering::Relaxed),
        cancels: (stats.cancels_sent.load(Ordering::Relaxed), stats.cancels_honoured.load(Ordering::Relaxed)),
        vanished: stats.vanished.load(Ordering::Relaxed),
        messages,
    })
}

async fn sleep_until(stats: &Stats, t: f64) {
    let left = t - stats.now();
    if left > 0.0 {
        tokio::time::sleep(Duration::from_secs_f64(left)).await;
    }
}

/// Opens the pool (poolers create it at a client's first login) and waits
/// (up to 15 s, with that client connected) until it holds its minimum of servers.
async fn wait_for_minimum(addr: &str) -> anyhow::Result<()> {
    let mut first = wire::Conn::connect(addr, TRUST_USER, APP_DB, Duration::from_secs(10))
        .await
        .map_err(|e| anyhow::anyhow!("first login through the pooler: {}", e.label()))?;
    first.simple("select 1", Duration::from_secs(10)).await.map_err(|e| anyhow::anyhow!("{}", e.label()))?;
    // Held until then: PgBouncer fills min_pool_size only while a client is connected.
    let admin = target::admin(addr).await?;
    for _ in 0..150 {
        if target::pool_counts(&admin).await?.0 >= u64::from(MIN_POOL_SIZE) {
            first.terminate().await;
            return Ok(());
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    bail!("the pool never reached its minimum of {MIN_POOL_SIZE} servers")
}

/// (open fds, pool servers) while no client is connected but the sampler's console.
async fn idle_state(target: &Target) -> (Option<usize>, u64) {
    let servers = match target::admin(&target.addr()).await {
        Ok(a) => target::pool_counts(&a).await.map(|c| c.0).unwrap_or(0),
        Err(_) => 0,
    };
    // Measured after the console connection above has closed.
    tokio::time::sleep(Duration::from_millis(300)).await;
    (target.fds(), servers)
}

fn start_load(ctx: &Arc<Ctx>, kind: Kind) -> Vec<tokio::task::JoinHandle<()>> {
    let mut tasks = Vec::new();
    for _ in 0..2 {
        tasks.push(tokio::spawn(load::churn(ctx.clone())));
        tasks.push(tokio::spawn(load::long_lived(ctx.clone(), Protocol::Simple)));
        tasks.push(tokio::spawn(load::long_lived(ctx.clone(), Protocol::Extended)));
        // PgBouncer 1.18 has no protocol-level named statements in transaction mode.
        if kind == Kind::Weir {
            tasks.push(tokio::spawn(load::long_lived(ctx.clone(), Protocol::Named)));
        }
        tasks.push(tokio::spawn(load::canceller(ctx.clone())));
    }
    for w in 1..=4 {
        tasks.push(tokio::spawn(load::ledger(ctx.clone(), w)));
    }
    tasks.push(tokio::spawn(load::vanisher(ctx.clone())));
    tasks.push(tokio::spawn(load::pipeline(ctx.clone())));
    tasks
}

/// Waits for the load's clients; returns how many did not finish in time.
async fn join_load(tasks: Vec<tokio::task::JoinHandle<()>>) -> usize {
    let deadline = tokio::time::Instant::now() + STOP_LIMIT;
    let mut hung = 0;
    for t in tasks {
        let abort = t.abort_handle();
        if tokio::time::timeout_at(deadline, t).await.is_err() {
            abort.abort();
            hung += 1;
        }
    }
    hung
}

async fn check_ledger(pg: &PgServer, records: &[(i64, load::Outcome)]) -> anyhow::Result<verdict::Ledger> {
    let direct = faults::direct(pg).await?;
    let rows: HashMap<i64, i64> = direct
        .query("select id, count(*) from soak_ledger group by id", &[])
        .await?
        .iter()
        .map(|r| (r.get(0), r.get(1)))
        .collect();
    let total: i64 = direct.query_one("select count(*) from soak_ledger", &[]).await?.get(0);
    let counter: i64 = direct.query_one("select n from soak_counter where id = 1", &[]).await?.get(0);
    Ok(verdict::Ledger::check(records, &rows, total, counter))
}

/// The summary text and whether every check passed.
fn summary(opts: &Opts, o: &Outcome) -> (String, bool) {
    let mut s = String::new();
    let l = &o.ledger;
    let _ = writeln!(s, "\n== soak summary: {}, {:.0} s of load", opts.kind.label(), o.load_end);
    let _ = writeln!(
        s,
        "load: {} transactions/statement rounds completed; {} clients vanished; {} cancels sent, {} answered 57014",
        o.done, o.vanished, o.cancels.0, o.cancels.1
    );
    if opts.kind == Kind::PgBouncer {
        let _ =
            writeln!(s, "(no named-prepared clients: PgBouncer 1.18 has no prepared statements in transaction mode)");
    }
    let _ = writeln!(
        s,
        "ledger: {} acknowledged, {} failed, {} ambiguous ({} of them committed), {} vanished mid-transaction",
        l.acked, l.failed, l.ambiguous, l.ambiguous_committed, l.vanished
    );
    let _ = writeln!(s, "lost {}", l.lost);
    let _ = writeln!(s, "duplicated {}", l.duplicated);
    let _ = writeln!(s, "rows of failed transactions {}", l.phantom);
    let _ = writeln!(s, "rows no client wrote {}", l.unrecorded);
    let _ = writeln!(s, "counter {} rows {}", l.counter, l.rows);
    let _ = writeln!(s, "\nfaults:\n{}", verdict::fault_table(&o.records, &o.errors, &o.samples));
    let mut by_code = std::collections::BTreeMap::<&str, u64>::new();
    for e in &o.errors {
        *by_code.entry(e.code.as_str()).or_default() += 1;
    }
    let _ = writeln!(s, "errors by SQLSTATE (all): {by_code:?}");
    for (code, m) in &o.messages {
        let _ = writeln!(s, "  {code}: {m}");
    }
    let outside = verdict::unexplained(&o.errors, &o.records);
    let _ = writeln!(s, "errors outside fault windows: {outside:?}");
    let (base, last) = verdict::rss_pair(&o.samples, o.plan.baseline.as_secs_f64(), o.load_end);
    let peak = o.samples.iter().filter_map(|x| x.rss_kib).max().unwrap_or(0);
    let tps: Vec<u64> = o.samples.iter().filter(|x| x.t > 2.0 && x.t <= o.load_end).map(|x| x.tps).collect();
    let mean_tps = tps.iter().sum::<u64>() as f64 / tps.len().max(1) as f64;
    let _ = writeln!(s, "mean TPS {mean_tps:.0}; peak RSS {:.1} MiB", peak as f64 / 1024.0);
    let checks = checks(o, opts.kind, base, last, &outside);
    let _ = writeln!(s, "\ndone-means checks:");
    for c in &checks {
        let _ = writeln!(s, "  {} {}: {}", if c.ok { "PASS" } else { "FAIL" }, c.name, c.detail);
    }
    let passed = checks.iter().all(|c| c.ok);
    let _ = writeln!(s, "soak: {}", if passed { "PASS" } else { "FAIL" });
    let _ = writeln!(s, "files: {}/{{soak.csv,faults.csv,summary.txt,soak.png}}", opts.out.display());
    let _ = write_faults_csv(&opts.out, &o.records);
    (s, passed)
}

fn checks(
    o: &Outcome,
    kind: Kind,
    base: Option<u64>,
    last: Option<u64>,
    outside: &std::collections::BTreeMap<String, u64>,
) -> Vec<Check> {
    let l = &o.ledger;
    // weir holds two descriptors per server connection: its socket and the
    // duplicate that lets a failover end it at once (server/tether.rs).
    let per_server: i64 = match kind {
        Kind::Weir => 2,
        Kind::PgBouncer => 1,
    };
    let adj = |(fds, servers): (Option<usize>, u64)| fds.map(|f| f as i64 - per_server * servers as i64);
    let (fa, fb) = (adj(o.idle_start), adj(o.idle_end));
    vec![
        Check {
            name: "0 lost and 0 duplicated acknowledged commits; no row of a failed transaction; counter = rows",
            ok: l.ok(),
            detail: format!(
                "lost {}, duplicated {}, failed-but-present {}, unrecorded {}, counter {} / rows {}",
                l.lost, l.duplicated, l.phantom, l.unrecorded, l.counter, l.rows
            ),
        },
        verdict::rss_check(base, last, o.plan.baseline.as_secs_f64()),
        Check {
            name: "fds back to the baseline (idle, less server connections)",
            ok: matches!((fa, fb), (Some(a), Some(b)) if (b - a).abs() <= 2),
            detail: format!(
                "before the load {} fds with {} servers, after it {} fds with {} servers",
                o.idle_start.0.map_or("?".into(), |f| f.to_string()),
                o.idle_start.1,
                o.idle_end.0.map_or("?".into(), |f| f.to_string()),
                o.idle_end.1
            ),
        },
        Check {
            name: "no panic, still running",
            ok: o.panics == 0 && o.alive,
            detail: format!("{} panic lines, {}", o.panics, if o.alive { "running" } else { "EXITED" }),
        },
        Check {
            name: "no error outside a fault's window",
            ok: outside.is_empty(),
            detail: format!("{} outside", outside.values().sum::<u64>()),
        },
        verdict::recovery_check(&o.records),
        Check {
            name: "no client hung",
            ok: o.hung == 0,
            detail: format!("{} load clients still running {} s after the stop", o.hung, STOP_LIMIT.as_secs()),
        },
    ]
}

fn write_faults_csv(out: &Path, records: &[faults::Record]) -> anyhow::Result<()> {
    let mut s = String::from("fault,start_s,end_s,recovered_after_s,limit_s,detail\n");
    for r in records {
        let _ = writeln!(
            s,
            "{},{:.1},{:.1},{},{},\"{}\"",
            r.fault.name(),
            r.start,
            r.end,
            r.recovered_after.map(|x| format!("{x:.2}")).unwrap_or_default(),
            r.fault.recovery_limit().as_secs(),
            r.detail.replace('"', "'")
        );
    }
    std::fs::write(out.join("faults.csv"), s)?;
    Ok(())
}

/// Draws soak.png with bench/soak_plot.py when matplotlib is importable.
fn plot(out: &Path) {
    let script = env::workspace_root().join("bench/soak_plot.py");
    let status = Command::new("python3").arg(&script).arg(out).status();
    match status {
        Ok(s) if s.success() => println!("plot: {}", out.join("soak.png").display()),
        _ => println!("plot: skipped (python3 with matplotlib is needed: pip install matplotlib)"),
    }
}
