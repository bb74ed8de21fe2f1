//! The `refill` benchmark: how fast a pool of 50 refills after
//! every server connection is killed at once, at 0, 50 and 100 ms of
//! handshake delay (a testkit Relay's connect delay between the pooler and
//! Postgres). 50 clients keep the pool busy (`select pg_sleep(0.05)` in a
//! loop, reconnecting after an error); then `pg_terminate_backend` hits every
//! pool backend, and Postgres's own `pg_stat_activity` is sampled every 50 ms
//! for the new backends. weir runs in-process with its defaults
//! (server_connect_concurrency 8); PgBouncer, when Debian's `pgbouncer` is
//! installed, runs daemonised (as `postgres` when root) behind its own relay
//! with the same delay. Prints the curve and the time to 50 connections.
//! Not a pass/fail test.
//!
//! `weir-bench refill [--pool N] [--delays 0,50,100] [--window-ms 3000] [--no-pgbouncer]`

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::pgbouncer::Running;
use tokio_postgres::{Client, NoTls};
use weir_testkit::{PgOptions, PgServer, Relay, APP_DB, TRUST_PASS, TRUST_USER};

const SAMPLE: Duration = Duration::from_millis(50);
/// How long to keep sampling after the window if the pool is not full yet.
const MAX_WAIT: Duration = Duration::from_secs(20);

struct Args {
    pool: usize,
    delays: Vec<u64>,
    window: Duration,
    pgbouncer: bool,
}

/// The refill bench's flags (`--help`).
const USAGE: &str = "refill [--pool N] [--delays 0,50,100] [--window-ms N] [--no-pgbouncer]";

impl Args {
    fn parse(args: &[String]) -> anyhow::Result<Args> {
        let mut a = Args { pool: 50, delays: vec![0, 50, 100], window: Duration::from_secs(3), pgbouncer: true };
        let mut it = args.iter();
        while let Some(x) = it.next() {
            match x.as_str() {
                "--pool" => a.pool = it.next().context("--pool N")?.parse()?,
                "--delays" => {
                    a.delays =
                        it.next().context("--delays 0,50,100")?.split(',').map(str::parse).collect::<Result<_, _>>()?
                }
                "--window-ms" => a.window = Duration::from_millis(it.next().context("--window-ms N")?.parse()?),
                "--no-pgbouncer" => a.pgbouncer = false,
                "-h" | "--help" => {
                    println!("usage: {USAGE}");
                    std::process::exit(0);
                }
                other => bail!("unknown option {other} ({USAGE})"),
            }
        }
        Ok(a)
    }
}

/// One measured refill.
struct Curve {
    name: String,
    /// New backends at each 50 ms sample after the termination.
    samples: Vec<usize>,
    /// Time until `pool` new backends were up, if they came within MAX_WAIT.
    full_after: Option<Duration>,
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let args = Args::parse(args)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(refill(args))
}

async fn refill(args: Args) -> anyhow::Result<()> {
    let pg = PgServer::start(PgOptions { max_connections: 300, log_connections: false, ..PgOptions::default() })
        .context("starting the throwaway Postgres")?;
    let dir = crate::pgbouncer::work_dir("refill")?;
    let pgbouncer = args.pgbouncer && crate::pgbouncer::installed();
    let mut curves = Vec::new();
    for &delay in &args.delays {
        let delay = Duration::from_millis(delay);
        curves.push(measure(&pg, &args, delay, Pooler::Weir, &dir).await?);
        if pgbouncer {
            curves.push(measure(&pg, &args, delay, Pooler::PgBouncer, &dir).await?);
        }
    }
    let note = if !args.pgbouncer {
        Some("PgBouncer skipped (--no-pgbouncer)")
    } else if !pgbouncer {
        Some("PgBouncer not installed, skipped (apt-get install -y pgbouncer)")
    } else {
        None
    };
    print_table(&args, &curves, note);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Pooler {
    Weir,
    PgBouncer,
}

/// Runs one scenario: pooler behind a relay with `delay`, 50 busy clients,
/// mass termination, sampling.
async fn measure(pg: &PgServer, args: &Args, delay: Duration, pooler: Pooler, dir: &Path) -> anyhow::Result<Curve> {
    let direct = connect(&format!("postgres://postgres@127.0.0.1:{}/{APP_DB}", pg.port())).await?;
    let relay = Relay::start(format!("127.0.0.1:{}", pg.port()).parse()?).await?;
    relay.set_connect_delay(delay);
    let name = format!("{} {}ms", if pooler == Pooler::Weir { "weir" } else { "pgbouncer" }, delay.as_millis());
    eprintln!("== {name}");
    let (url, running) = match pooler {
        Pooler::Weir => start_weir(relay.addr().port(), args.pool, dir).await?,
        Pooler::PgBouncer => start_pgbouncer(relay.addr().port(), args.pool, dir).await?,
    };
    let stop = Arc::new(AtomicBool::new(false));
    let clients: Vec<_> = (0..args.pool).map(|_| tokio::spawn(busy_client(url.clone(), stop.clone()))).collect();
    let warm = Instant::now() + Duration::from_secs(60);
    while count(&direct, "true").await? < args.pool as i64 {
        if Instant::now() > warm {
            bail!("{name}: the pool never reached {} connections", args.pool);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    tokio::time::sleep(Duration::from_millis(300)).await;
    let since: String = direct.query_one("select clock_timestamp()::text", &[]).await?.get(0);
    direct
        .simple_query(&format!("select pg_terminate_backend(pid) from pg_stat_activity where usename = '{TRUST_USER}'"))
        .await?;
    let t0 = Instant::now();
    let fresh = format!("backend_start > '{since}'");
    let mut samples = Vec::new();
    let mut full_after = None;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + SAMPLE, SAMPLE);
    while t0.elapsed() < args.window || (full_after.is_none() && t0.elapsed() < MAX_WAIT) {
        tick.tick().await;
        let n = count(&direct, &fresh).await? as usize;
        if t0.elapsed() <= args.window + SAMPLE / 2 {
            samples.push(n);
        }
        if n >= args.pool && full_after.is_none() {
            full_after = Some(t0.elapsed());
        }
    }
    stop.store(true, Ordering::SeqCst);
    for c in clients {
        let _ = c.await;
    }
    running.stop().await;
    drop(relay);
    // Leave no backend behind for the next scenario.
    let quiet = Instant::now() + Duration::from_secs(10);
    while count(&direct, "true").await? > 0 && Instant::now() < quiet {
        direct
            .simple_query(&format!(
                "select pg_terminate_backend(pid) from pg_stat_activity where usename = '{TRUST_USER}'"
            ))
            .await?;
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(Curve { name, samples, full_after })
}

/// Backends of the benchmark's user matching `filter`.
async fn count(direct: &Client, filter: &str) -> anyhow::Result<i64> {
    let sql = format!("select count(*) from pg_stat_activity where usename = '{TRUST_USER}' and {filter}");
    Ok(direct.query_one(&sql, &[]).await?.get(0))
}

async fn connect(url: &str) -> anyhow::Result<Client> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

/// Keeps one server busy: short queries in a loop, reconnecting after errors.
async fn busy_client(url: String, stop: Arc<AtomicBool>) {
    let mut client: Option<Client> = None;
    while !stop.load(Ordering::SeqCst) {
        let ok = match &client {
            Some(c) => tokio::time::timeout(Duration::from_secs(30), c.simple_query("select pg_sleep(0.05)"))
                .await
                .is_ok_and(|r| r.is_ok()),
            None => match tokio::time::timeout(Duration::from_secs(30), connect(&url)).await {
                Ok(Ok(c)) => {
                    client = Some(c);
                    true
                }
                _ => false,
            },
        };
        if !ok {
            client = None;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
}

async fn start_weir(port: u16, pool: usize, dir: &Path) -> anyhow::Result<(String, Running)> {
    let text = format!(
        "[weir]\nlisten_addr = \"127.0.0.1:0\"\nauth_type = \"trust\"\npool_mode = \"transaction\"\n\
         default_pool_size = {pool}\nmax_client_conn = 500\nquery_wait_timeout = \"10s\"\n\
         [databases.{APP_DB}]\nhost = \"127.0.0.1\"\nport = {port}\n"
    );
    let weir = weir::Weir::start(weir::Config::from_toml(&text, dir)?).await?;
    let url = format!("postgres://{TRUST_USER}:{TRUST_PASS}@{}/{APP_DB}", weir.local_addr());
    Ok((url, Running::Weir(weir)))
}

async fn start_pgbouncer(port: u16, pool: usize, dir: &Path) -> anyhow::Result<(String, Running)> {
    std::fs::write(dir.join("userlist.txt"), format!("\"{TRUST_USER}\" \"{TRUST_PASS}\"\n"))?;
    let databases = format!("{APP_DB} = host=127.0.0.1 port={port} dbname={APP_DB}");
    let settings = format!(
        "auth_type = trust\nauth_file = {users}\npool_mode = transaction\ndefault_pool_size = {pool}\n\
         max_client_conn = 500\nquery_wait_timeout = 10\nserver_login_retry = 1\n\
         ignore_startup_parameters = extra_float_digits,options",
        users = dir.join("userlist.txt").display(),
    );
    let _ = std::fs::remove_file(dir.join("pgbouncer.pid"));
    let dir = dir.to_path_buf();
    let bouncer =
        tokio::task::spawn_blocking(move || crate::pgbouncer::PgBouncer::start(&dir, &databases, &settings)).await??;
    let url = format!("postgres://{TRUST_USER}:{TRUST_PASS}@{}/{APP_DB}", bouncer.addr);
    Ok((url, Running::PgBouncer(bouncer)))
}

fn print_table(args: &Args, curves: &[Curve], note: Option<&str>) {
    println!(
        "refill: pool {}, {} busy clients, every pool backend terminated at t=0; new server connections \
         (pg_stat_activity) sampled every {} ms",
        args.pool,
        args.pool,
        SAMPLE.as_millis()
    );
    print!("{:>8}", "t (ms)");
    for c in curves {
        print!("{:>16}", c.name);
    }
    println!();
    let rows = curves.iter().map(|c| c.samples.len()).max().unwrap_or(0);
    for i in (1..=rows).filter(|i| i % 2 == 0 || *i == 1) {
        print!("{:>8}", i as u128 * SAMPLE.as_millis());
        for c in curves {
            match c.samples.get(i - 1) {
                Some(n) => print!("{n:>16}"),
                None => print!("{:>16}", ""),
            }
        }
        println!();
    }
    print!("{:>8}", "full");
    for c in curves {
        match c.full_after {
            Some(d) => print!("{:>16}", format!("{} ms", d.as_millis())),
            None => print!("{:>16}", format!("> {} s", MAX_WAIT.as_secs())),
        }
    }
    println!();
    println!(
        "full = time until {} new server connections were up (to within one {} ms sample)",
        args.pool,
        SAMPLE.as_millis()
    );
    if let Some(n) = note {
        println!("{n}");
    }
}
