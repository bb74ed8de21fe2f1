//! The `convoy` benchmark: a lock convoy (or a long job) on one route of a
//! transaction pool, and what it costs an unrelated route sharing the pool.
//!
//! This module owns the run: its flags, the throwaway Postgres and its data
//! (`pgbench -i -s 10` plus a two-row `packages` table), the poolers (weir,
//! the binary given or target/release/weir, and Debian's PgBouncer, each a
//! subprocess with pool_size 20 in transaction mode, one fresh instance per
//! variant, in `pooler`), the pgbench processes (`pgbench`: their
//! summaries and per-transaction logs), and the watch on weir's
//! `SHOW QUERIES`. `report` prints the table and writes results.md and
//! results.json.
//!
//! Variants: `convoy`, 100 clients each updating one of two rows in a
//! transaction that also sleeps 10 ms (every one queues on the row lock while
//! holding a server); `long-job`, 30 clients each running `pg_sleep(2)`. For
//! each pooler and variant the unrelated route (10 clients, a primary-key
//! SELECT on pgbench_accounts) runs alone for `--duration` seconds, then
//! beside the variant, which starts one second earlier. Not a pass/fail test.

mod pgbench;
mod pooler;
mod report;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio_postgres::{NoTls, SimpleQueryMessage};
use weir_testkit::{PgOptions, PgServer, APP_DB, TRUST_PASS, TRUST_USER};

use crate::suite::env::workspace_root;
use pgbench::{latencies, pgbench_cmd, Latency, Pgbench, Summary};
use pooler::Running;

const USAGE: &str = "convoy [--weir-bin PATH] [--duration SECS] [--targets weir,pgbouncer] \
                     [--variants convoy,long-job] [--weir-extra KEY=VALUE]... [--out DIR]";
const POOL_SIZE: u32 = 20;
const SCALE: u32 = 10;
const UNRELATED_CLIENTS: u32 = 10;
const PGBOUNCER_BIN: &str = "/usr/sbin/pgbouncer";
/// How long the convoy runs before the unrelated route starts.
const LEAD: Duration = Duration::from_secs(1);
/// SHOW QUERIES: polled this often, for this long from the convoy's start,
/// and its first row kept at `SAMPLE_AT`.
const POLL_EVERY: Duration = Duration::from_millis(250);
const POLL_FOR: Duration = Duration::from_secs(10);
const SAMPLE_AT: Duration = Duration::from_secs(3);
const CONSOLE_LIMIT: Duration = Duration::from_secs(2);

const UNRELATED_SQL: &str = "\\set aid random(1, 1000000)\nSELECT abalance FROM pgbench_accounts WHERE aid = :aid;\n";
const CONVOY_SQL: &str = "\\set id random(1, 2)\nBEGIN;\n\
                          UPDATE packages SET last_downloaded_at = now() WHERE id = :id;\n\
                          SELECT pg_sleep(0.01);\nEND;\n";
const LONG_JOB_SQL: &str = "SELECT pg_sleep(2);\n";
/// Opens the pool's servers before anything is measured.
const WARM_SQL: &str = "SELECT pg_sleep(0.05);\n";
const SETUP_SQL: &str = "CREATE TABLE packages (id int primary key, last_downloaded_at timestamptz);\n\
                         INSERT INTO packages SELECT g, now() FROM generate_series(1,2) g;\n\
                         GRANT ALL ON packages TO PUBLIC;";

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pooler {
    Weir,
    PgBouncer,
}

impl Pooler {
    fn label(self) -> &'static str {
        match self {
            Pooler::Weir => "weir",
            Pooler::PgBouncer => "pgbouncer",
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Variant {
    Convoy,
    LongJob,
}

impl Variant {
    fn label(self) -> &'static str {
        match self {
            Variant::Convoy => "convoy",
            Variant::LongJob => "long-job",
        }
    }

    fn clients(self) -> u32 {
        match self {
            Variant::Convoy => 100,
            Variant::LongJob => 30,
        }
    }

    fn script(self) -> &'static str {
        match self {
            Variant::Convoy => CONVOY_SQL,
            Variant::LongJob => LONG_JOB_SQL,
        }
    }

    /// What SHOW QUERIES' first row names once weir has seen the variant.
    fn needle(self) -> &'static str {
        match self {
            Variant::Convoy => "update packages",
            Variant::LongJob => "pg_sleep",
        }
    }
}

#[derive(Debug, Clone)]
pub(crate) struct Opts {
    weir_bin: PathBuf,
    pub(crate) duration: u64,
    targets: Vec<Pooler>,
    variants: Vec<Variant>,
    /// `(key, value)` lines for weir's config; a `pool.` key goes in the
    /// database section, any other in `[weir]`.
    pub(crate) weir_extra: Vec<(String, String)>,
    out: Option<PathBuf>,
}

impl Opts {
    fn parse(args: &[String]) -> anyhow::Result<Opts> {
        let mut o = Opts {
            weir_bin: default_weir_bin(),
            duration: 15,
            targets: vec![Pooler::Weir, Pooler::PgBouncer],
            variants: vec![Variant::Convoy, Variant::LongJob],
            weir_extra: vec![],
            out: None,
        };
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = || it.next().with_context(|| format!("{a} needs a value ({USAGE})"));
            match a.as_str() {
                "--weir-bin" => o.weir_bin = PathBuf::from(value()?),
                "--duration" => o.duration = value()?.parse().context("--duration SECS")?,
                "--targets" => o.targets = parse_list(value()?, parse_pooler)?,
                "--variants" => o.variants = parse_list(value()?, parse_variant)?,
                "--weir-extra" => o.weir_extra.push(parse_extra(value()?)?),
                "--out" => o.out = Some(PathBuf::from(value()?)),
                "-h" | "--help" => {
                    println!("usage: {USAGE}");
                    std::process::exit(0);
                }
                other => bail!("unknown option {other} ({USAGE})"),
            }
        }
        if o.duration < 2 {
            bail!("--duration must be at least 2");
        }
        Ok(o)
    }
}

/// target/release/weir (under CARGO_TARGET_DIR when set).
fn default_weir_bin() -> PathBuf {
    let target =
        std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target"));
    target.join("release/weir")
}

fn parse_list<T>(list: &str, one: fn(&str) -> anyhow::Result<T>) -> anyhow::Result<Vec<T>> {
    list.split(',').map(|s| one(s.trim())).collect()
}

fn parse_pooler(s: &str) -> anyhow::Result<Pooler> {
    match s {
        "weir" => Ok(Pooler::Weir),
        "pgbouncer" => Ok(Pooler::PgBouncer),
        other => bail!("unknown target {other:?} (weir, pgbouncer)"),
    }
}

fn parse_variant(s: &str) -> anyhow::Result<Variant> {
    match s {
        "convoy" => Ok(Variant::Convoy),
        "long-job" => Ok(Variant::LongJob),
        other => bail!("unknown variant {other:?} (convoy, long-job)"),
    }
}

/// `KEY=VALUE`, the value a TOML value as written (`1.0`, `"5s"`, `true`).
fn parse_extra(s: &str) -> anyhow::Result<(String, String)> {
    let (k, v) = s.split_once('=').with_context(|| format!("--weir-extra {s:?}: KEY=VALUE"))?;
    let (k, v) = (k.trim(), v.trim());
    if k.is_empty() || v.is_empty() {
        bail!("--weir-extra {s:?}: KEY=VALUE");
    }
    Ok((k.to_string(), v.to_string()))
}

/// weir's SHOW QUERIES while the convoy ran.
#[derive(Debug, Clone, Default)]
pub(crate) struct Watch {
    /// The error when the command is refused (a weir without it).
    pub(crate) unavailable: Option<String>,
    pub(crate) at_3s: Option<String>,
    pub(crate) at_end: Option<String>,
    /// Seconds from the convoy's start until the first row named it.
    pub(crate) named_after: Option<f64>,
}

/// One pooler × variant.
#[derive(Debug, Clone)]
pub(crate) struct Row {
    pub(crate) pooler: Pooler,
    pub(crate) variant: Variant,
    pub(crate) alone: (Summary, Latency),
    pub(crate) beside: (Summary, Latency),
    pub(crate) convoy: Summary,
    pub(crate) watch: Option<Watch>,
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let opts = Opts::parse(args)?;
    let mut targets = opts.targets.clone();
    if targets.contains(&Pooler::Weir) && !opts.weir_bin.is_file() {
        bail!("{} not found: cargo build --release -p weir, or pass --weir-bin PATH", opts.weir_bin.display());
    }
    let mut notes = vec![];
    if targets.contains(&Pooler::PgBouncer) && !Path::new(PGBOUNCER_BIN).is_file() {
        notes.push(format!("PgBouncer not installed ({PGBOUNCER_BIN}): skipped"));
        targets.retain(|p| *p != Pooler::PgBouncer);
    }
    let work = crate::pgbouncer::work_dir("convoy")?;
    let rows = run_all(&opts, &targets, &work);
    if std::env::var_os("WEIR_BENCH_KEEP").is_some() {
        eprintln!("kept {} (WEIR_BENCH_KEEP)", work.display());
    } else {
        let _ = std::fs::remove_dir_all(&work);
    }
    let rows = rows?;
    report::print(&opts, &rows, &notes);
    if let Some(out) = &opts.out {
        report::write(out, &opts, &rows, &notes)?;
    }
    Ok(())
}

fn run_all(opts: &Opts, targets: &[Pooler], work: &Path) -> anyhow::Result<Vec<Row>> {
    eprintln!("== starting a throwaway Postgres");
    let pg = PgServer::start(PgOptions { max_connections: 100, log_connections: false, ..PgOptions::default() })
        .context("starting the throwaway Postgres")?;
    setup(&pg)?;
    std::fs::write(work.join("unrelated.sql"), UNRELATED_SQL)?;
    std::fs::write(work.join("warm.sql"), WARM_SQL)?;
    for v in &opts.variants {
        std::fs::write(work.join(format!("{}.sql", v.label())), v.script())?;
    }
    let mut rows = vec![];
    for &pooler in targets {
        for &variant in &opts.variants {
            rows.push(measure(opts, pooler, variant, work, pg.port())?);
        }
    }
    Ok(rows)
}

/// `pgbench -i -s 10` and the `packages` table.
fn setup(pg: &PgServer) -> anyhow::Result<()> {
    eprintln!("== pgbench -i -s {SCALE}");
    let out = pgbench_cmd(pg.port())
        .args(["-i", "-q", "-s", &SCALE.to_string(), APP_DB])
        .stdout(Stdio::null())
        .output()
        .context("running pgbench -i (is pgbench installed?)")?;
    if !out.status.success() {
        bail!("pgbench -i failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    pg.psql(APP_DB, SETUP_SQL).context("creating the packages table")?;
    Ok(())
}

/// One pooler (a fresh instance) and one variant: the unrelated route
/// alone, then beside the variant.
fn measure(opts: &Opts, pooler: Pooler, variant: Variant, work: &Path, pg_port: u16) -> anyhow::Result<Row> {
    let dir = work.join(format!("{}-{}", pooler.label(), variant.label()));
    let running = Running::start(pooler, opts, &dir, pg_port)?;
    let port = running.port;
    eprintln!(
        "== {} {}: warm-up, then the unrelated route alone for {} s",
        pooler.label(),
        variant.label(),
        opts.duration
    );
    Pgbench::spawn(port, POOL_SIZE, 1, &work.join("warm.sql"), &dir.join("warm"), false)?.finish()?;
    let alone = unrelated(port, opts.duration, work, &dir.join("alone"))?;
    std::thread::sleep(Duration::from_secs(1));
    eprintln!("== {} {}: beside {} clients of {}", pooler.label(), variant.label(), variant.clients(), variant.label());
    let (beside, convoy, watch) = together(opts, pooler, variant, work, &dir, port)?;
    drop(running);
    Ok(Row { pooler, variant, alone, beside, convoy, watch })
}

/// The unrelated route for `secs`, its log read into latencies.
fn unrelated(port: u16, secs: u64, work: &Path, dir: &Path) -> anyhow::Result<(Summary, Latency)> {
    let run = Pgbench::spawn(port, UNRELATED_CLIENTS, secs, &work.join("unrelated.sql"), dir, true)?;
    let summary = run.finish()?;
    Ok((summary, latencies(&dir.join("log"))?))
}

type Together = ((Summary, Latency), Summary, Option<Watch>);

/// The variant, then (after `LEAD`) the unrelated route beside it; for
/// weir, SHOW QUERIES watched from the variant's start.
fn together(opts: &Opts, pooler: Pooler, v: Variant, work: &Path, dir: &Path, port: u16) -> anyhow::Result<Together> {
    let secs = opts.duration + LEAD.as_secs() + 1;
    let script = work.join(format!("{}.sql", v.label()));
    let convoy = Pgbench::spawn(port, v.clients(), secs, &script, &dir.join("variant"), false)?;
    let started = Instant::now();
    let watcher = (pooler == Pooler::Weir).then(|| std::thread::spawn(move || watch(port, started, v.needle())));
    std::thread::sleep(LEAD);
    let beside = unrelated(port, opts.duration, work, &dir.join("beside"))?;
    let at_end = (pooler == Pooler::Weir).then(|| first_row_now(port));
    let convoy = convoy.finish()?;
    let watch = match watcher {
        Some(w) => {
            let mut w = w.join().map_err(|_| anyhow::anyhow!("the SHOW QUERIES watcher panicked"))?;
            w.at_end = at_end.and_then(|r| r.ok().flatten());
            Some(w)
        }
        None => None,
    };
    Ok((beside, convoy, watch))
}

/// Polls SHOW QUERIES every `POLL_EVERY` for `POLL_FOR` from `started`:
/// the first row's query at `SAMPLE_AT`, and when it first named `needle`.
fn watch(port: u16, started: Instant, needle: &'static str) -> Watch {
    let rt = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => return Watch { unavailable: Some(format!("no runtime: {e}")), ..Watch::default() },
    };
    rt.block_on(watch_loop(port, started, needle))
}

async fn watch_loop(port: u16, started: Instant, needle: &str) -> Watch {
    let mut w = Watch::default();
    let mut client = None;
    while started.elapsed() < POLL_FOR && (w.named_after.is_none() || w.at_3s.is_none()) {
        tokio::time::sleep_until((started + POLL_EVERY * polls_done(started)).into()).await;
        let at = started.elapsed();
        match first_row_retry(&mut client, port).await {
            Err(e) => {
                w.unavailable = Some(e);
                return w;
            }
            Ok(Some(q)) => {
                if w.named_after.is_none() && q.to_lowercase().contains(needle) {
                    w.named_after = Some(at.as_secs_f64());
                }
                if w.at_3s.is_none() && at >= SAMPLE_AT {
                    w.at_3s = Some(q);
                }
            }
            Ok(None) => {}
        }
    }
    w
}

/// How many poll periods have passed since `started`, plus one: the next tick.
fn polls_done(started: Instant) -> u32 {
    (started.elapsed().as_millis() / POLL_EVERY.as_millis()) as u32 + 1
}

/// The first row's query, connecting the console when needed. `Err` when
/// weir refuses the command; `Ok(None)` for no row or no connection yet.
async fn first_row_retry(client: &mut Option<tokio_postgres::Client>, port: u16) -> Result<Option<String>, String> {
    if client.is_none() {
        *client = tokio::time::timeout(CONSOLE_LIMIT, console(port)).await.ok().and_then(Result::ok);
    }
    let Some(c) = client.as_ref() else { return Ok(None) };
    match tokio::time::timeout(CONSOLE_LIMIT, c.simple_query("SHOW QUERIES")).await {
        Ok(Ok(msgs)) => Ok(query_of_first_row(&msgs)),
        Ok(Err(e)) if e.as_db_error().is_some() => {
            Err(e.as_db_error().map(|d| d.message().to_string()).unwrap_or_default())
        }
        _ => {
            *client = None;
            Ok(None)
        }
    }
}

fn query_of_first_row(msgs: &[SimpleQueryMessage]) -> Option<String> {
    msgs.iter().find_map(|m| match m {
        SimpleQueryMessage::Row(r) => Some(r.get("query").unwrap_or("").to_string()),
        _ => None,
    })
}

/// One SHOW QUERIES now, on its own connection and runtime.
fn first_row_now(port: u16) -> Result<Option<String>, String> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    rt.block_on(first_row_retry(&mut None, port))
}

/// weir's admin console: database `pgbouncer`, the bench user (an admin_user).
async fn console(port: u16) -> anyhow::Result<tokio_postgres::Client> {
    let url = format!("postgres://{TRUST_USER}:{TRUST_PASS}@127.0.0.1:{port}/pgbouncer?connect_timeout=2");
    let (client, conn) = tokio_postgres::connect(&url, NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}
