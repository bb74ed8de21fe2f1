//! The `storm` benchmark: the incident's load shape (the README's "Why
//! weir exists"). A pool of 10, 200 clients with 100 ms deadlines, queries of
//! about 20 ms server time, and a burst that triples the rate for 10 s. A
//! client whose deadline expires does what pgx does: CancelRequest on a new
//! socket, then Terminate and close, then reconnect.
//!
//! It runs against weir (in-process, on its own runtime) twice, with
//! admission control (shedding, deadline-aware start) on and then off, and,
//! where Debian's
//! `pgbouncer` is installed, against PgBouncer in the same run, on one
//! throwaway Postgres, and prints a table: client outcomes and latencies,
//! server connections opened and closed (counted from Postgres's own log),
//! and the ledger rows against each client's recorded deadline: statements
//! that reached Postgres after their client had given up (the incident), and
//! commits after the deadline (also queries already running at the deadline
//! whose cancel arrived too late). Not a pass/fail test.
//!
//! weir's query_wait_timeout is 40 ms: the 100 ms deadline, less the 20 ms
//! query, less room for scheduling delays on a busy two-core machine.
//! PgBouncer's cannot go below 1 s, so there it sits above the deadline.
//!
//! `weir-bench storm [--base-rate N] [--burst-factor F] [--burst-secs N]
//! [--after-secs N] [--wait-timeout-ms N] [--no-pgbouncer]`; `--burst-factor 1 --burst-secs
//! 11` is a steady 15 s run at the base rate (half the pool's capacity);
//! `WEIR_STORM_KEEP=1` keeps the work folder (PgBouncer's ini and log).

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod table;

use crate::pgbouncer::PgBouncer;
use anyhow::{bail, Context};
use rand::{rngs::StdRng, Rng, SeedableRng};
use table::print_table;
use tokio_postgres::{Client, NoTls};
use weir_metrics::CloseReason;
use weir_testkit::{PgOptions, PgServer, APP_DB, TRUST_PASS, TRUST_USER};

/// The load shape.
#[derive(Debug, Clone)]
struct Shape {
    pool: u32,
    clients: usize,
    deadline: Duration,
    query: Duration,
    base_rate: f64,
    burst_factor: f64,
    before: Duration,
    burst: Duration,
    after: Duration,
    /// weir's query_wait_timeout: below the deadline, with room for the query.
    wait_timeout: Duration,
}

/// The storm's flags (`--help`).
const USAGE: &str = "storm [--base-rate N] [--burst-factor F] [--burst-secs N] [--after-secs N] \
                     [--wait-timeout-ms N] [--no-pgbouncer]";

impl Shape {
    fn parse(args: &[String]) -> anyhow::Result<(Shape, bool)> {
        let mut s = Shape {
            pool: 10,
            clients: 200,
            deadline: Duration::from_millis(100),
            query: Duration::from_millis(20),
            base_rate: 250.0,
            burst_factor: 3.0,
            before: Duration::from_secs(2),
            burst: Duration::from_secs(10),
            after: Duration::from_secs(2),
            wait_timeout: Duration::from_millis(40),
        };
        let mut pgbouncer = true;
        let mut it = args.iter();
        while let Some(a) = it.next() {
            match a.as_str() {
                "--base-rate" => s.base_rate = it.next().context("--base-rate N")?.parse()?,
                "--wait-timeout-ms" => {
                    s.wait_timeout = Duration::from_millis(it.next().context("--wait-timeout-ms N")?.parse()?)
                }
                "--burst-factor" => s.burst_factor = it.next().context("--burst-factor F")?.parse()?,
                "--burst-secs" => s.burst = Duration::from_secs(it.next().context("--burst-secs N")?.parse()?),
                "--after-secs" => s.after = Duration::from_secs(it.next().context("--after-secs N")?.parse()?),
                "--no-pgbouncer" => pgbouncer = false,
                "-h" | "--help" => {
                    println!("usage: {USAGE}");
                    std::process::exit(0);
                }
                other => bail!("unknown option {other} ({USAGE})"),
            }
        }
        Ok((s, pgbouncer))
    }

    fn total(&self) -> Duration {
        self.before + self.burst + self.after
    }

    /// Queries per second across all clients, `at` into the run.
    fn rate_at(&self, at: Duration) -> f64 {
        self.base_rate * if self.phase(at) == 1 { self.burst_factor } else { 1.0 }
    }

    /// Where `at` into the run falls: 0 before the burst, 1 in it, 2 after.
    fn phase(&self, at: Duration) -> u8 {
        if at < self.before {
            0
        } else if at < self.before + self.burst {
            1
        } else {
            2
        }
    }
}

/// How one query ended for its client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Outcome {
    Ok,
    /// The pooler's own "no server in time" error.
    WaitTimeout,
    /// The client's deadline expired first; it cancelled and reconnected.
    DeadlineExpired,
    Other,
}

/// One query as its client saw it.
#[derive(Debug, Clone, Copy)]
struct Sent {
    id: i64,
    /// The client's deadline, microseconds since the Unix epoch (wall clock,
    /// comparable with Postgres's clock_timestamp() on the same machine).
    deadline_us: i64,
    outcome: Outcome,
    /// How long the client waited for its answer (or its deadline).
    latency: Duration,
    /// When it was sent, into the run (for the before / burst / after split).
    at: Duration,
}

/// What one target's run produced.
#[derive(Debug, Default)]
struct Report {
    name: String,
    sent: Vec<Sent>,
    reconnects: u64,
    connect_failures: u64,
    opened: usize,
    closed: usize,
    late: Late,
    other_errors: Vec<String>,
    weir_closes: Option<String>,
    weir_drops: Option<String>,
    note: Option<String>,
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let (shape, with_pgbouncer) = Shape::parse(args)?;
    // The clients get their own runtime, so weir (on another) is not slowed
    // by the load generator's scheduling, nor the clients' clocks by weir's.
    let clients = runtime("storm-client")?;
    let pg = PgServer::start(PgOptions::default())?;
    pg.psql(
        APP_DB,
        "create table ledger (id bigint primary key, \
         started timestamptz not null default statement_timestamp(), \
         ts timestamptz not null default clock_timestamp());
         grant all on ledger to public;",
    )?;
    let dir = work_dir()?;
    std::fs::write(dir.join("userlist.txt"), format!("\"{TRUST_USER}\" \"{TRUST_PASS}\"\n"))?;

    let mut reports = vec![run_weir(&clients, &pg, &dir, &shape, true)?, run_weir(&clients, &pg, &dir, &shape, false)?];
    let pgbouncer_note = if !with_pgbouncer {
        Some("PgBouncer skipped (--no-pgbouncer)".to_string())
    } else if !crate::pgbouncer::installed() {
        Some("PgBouncer not installed, skipped".to_string())
    } else {
        reports.push(run_pgbouncer(&clients, &pg, &dir, &shape)?);
        None
    };
    print_table(&shape, &reports, pgbouncer_note.as_deref());
    if std::env::var_os("WEIR_STORM_KEEP").is_some() {
        println!("kept {} (WEIR_STORM_KEEP)", dir.display());
    } else {
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(())
}

fn runtime(name: &str) -> std::io::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).thread_name(name).enable_all().build()
}

fn work_dir() -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("weir-storm-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    // PgBouncer runs as postgres when we are root and writes its log here.
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))?;
    Ok(dir)
}

/// weir with admission control on (its defaults) or off (`wait_shedding`
/// and `deadline_start` false: the wait timeout alone).
fn run_weir(
    clients: &tokio::runtime::Runtime,
    pg: &PgServer,
    dir: &Path,
    shape: &Shape,
    admission: bool,
) -> anyhow::Result<Report> {
    let text = format!(
        "[weir]\nlisten_addr = \"127.0.0.1:0\"\nauth_type = \"trust\"\nauth_file = \"userlist.txt\"\n\
         pool_mode = \"transaction\"\ndefault_pool_size = {pool}\nmax_client_conn = 2000\n\
         query_wait_timeout = \"{wait}ms\"\nclient_deadline = \"{deadline}ms\"\n\
         wait_shedding = {admission}\ndeadline_start = {admission}\n\
         [databases.{APP_DB}]\nhost = \"127.0.0.1\"\nport = {port}\n",
        pool = shape.pool,
        wait = shape.wait_timeout.as_millis(),
        deadline = shape.deadline.as_millis(),
        port = pg.port(),
    );
    let cfg = weir::Config::from_toml(&text, dir)?;
    let server = runtime("weir")?;
    let weir = server.block_on(weir::Weir::start(cfg))?;
    let url = format!("postgres://{TRUST_USER}:{TRUST_PASS}@{}/{APP_DB}", weir.local_addr());
    let (name, first_id) = if admission { ("weir", 1) } else { ("weir-noadm", 50_000_000) };
    let mut report = clients.block_on(drive(pg, name, &url, shape, first_id))?;
    if let Some(pool) = weir.shared().pools.get(APP_DB, TRUST_USER) {
        let m = &pool.metrics;
        report.weir_closes = Some(by_label(CloseReason::ALL.iter().map(|r| (r.as_label(), m.closed(*r)))));
        report.weir_drops =
            Some(by_label(weir_metrics::DropReason::ALL.iter().map(|r| (r.as_label(), m.dropped_queries(*r)))));
    }
    server.block_on(weir.shutdown());
    Ok(report)
}

fn by_label<'a>(counts: impl Iterator<Item = (&'a str, u64)>) -> String {
    let parts: Vec<String> = counts.filter(|(_, n)| *n > 0).map(|(l, n)| format!("{l}={n}")).collect();
    if parts.is_empty() {
        "none".into()
    } else {
        parts.join(", ")
    }
}

/// Runs the load through `url` and measures what Postgres saw.
async fn drive(pg: &PgServer, name: &str, url: &str, shape: &Shape, first_id: i64) -> anyhow::Result<Report> {
    warm_up(url, shape.pool).await?;
    let log_before = server_log_counts(pg);
    let ids = Arc::new(AtomicI64::new(first_id));
    let sent = Arc::new(Mutex::new(Vec::new()));
    let counters = Arc::new(Counters::default());
    let start = Instant::now() + Duration::from_millis(200);
    let tasks: Vec<_> = (0..shape.clients)
        .map(|i| {
            let ctx = ClientCtx {
                url: url.to_string(),
                shape: shape.clone(),
                start,
                ids: ids.clone(),
                sent: sent.clone(),
                counters: counters.clone(),
                seed: i as u64,
            };
            tokio::spawn(client_loop(ctx))
        })
        .collect();
    for t in tasks {
        t.await?;
    }
    // Let anything the pooler still runs finish before counting.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log_after = server_log_counts(pg);
    let sent = std::mem::take(&mut *sent.lock().unwrap());
    let late = late_rows(pg, &sent, first_id)?;
    let other_errors = std::mem::take(&mut *counters.errors.lock().unwrap());
    Ok(Report {
        name: name.into(),
        sent,
        reconnects: counters.reconnects.load(Ordering::Relaxed),
        connect_failures: counters.connect_failures.load(Ordering::Relaxed),
        opened: log_after.0 - log_before.0,
        closed: log_after.1 - log_before.1,
        late,
        other_errors,
        weir_closes: None,
        weir_drops: None,
        note: None,
    })
}

/// Opens the pool's servers before counting, so the table shows only churn.
async fn warm_up(url: &str, pool: u32) -> anyhow::Result<()> {
    let mut clients = Vec::new();
    for _ in 0..pool {
        clients.push(connect(url).await?);
    }
    // Opening the servers may take longer than the short wait budget: retry
    // until one round runs on all of them at once.
    for _ in 0..50 {
        let runs = clients.iter().map(|c| c.simple_query("select pg_sleep(0.1)"));
        if futures_util::future::join_all(runs).await.iter().all(Result::is_ok) {
            return Ok(());
        }
    }
    bail!("could not open {pool} server connections through the pooler")
}

#[derive(Debug, Default)]
struct Counters {
    reconnects: AtomicU64,
    connect_failures: AtomicU64,
    errors: Mutex<Vec<String>>,
}

struct ClientCtx {
    url: String,
    shape: Shape,
    start: Instant,
    ids: Arc<AtomicI64>,
    sent: Arc<Mutex<Vec<Sent>>>,
    counters: Arc<Counters>,
    seed: u64,
}

/// One client: queries at its share of the current rate (Poisson arrivals),
/// each with the deadline; on expiry cancel, Terminate, reconnect.
async fn client_loop(ctx: ClientCtx) {
    let mut rng = StdRng::seed_from_u64(0x5707_u64 ^ ctx.seed);
    let end = ctx.start + ctx.shape.total();
    let mut conn: Option<Client> = None;
    let mut next = ctx.start + gap(&mut rng, &ctx.shape, Duration::ZERO);
    let mut log = Vec::new();
    let mut first = true;
    while next < end {
        tokio::time::sleep_until(next.into()).await;
        let client = match conn.take() {
            Some(c) if !c.is_closed() => c,
            _ => match reconnect(&ctx, !std::mem::take(&mut first)).await {
                Some(c) => c,
                None => break,
            },
        };
        let (sent, keep) = one_query(&ctx, client).await;
        conn = keep;
        log.push(sent);
        let at = next.saturating_duration_since(ctx.start);
        next = (next + gap(&mut rng, &ctx.shape, at)).max(Instant::now());
    }
    ctx.sent.lock().unwrap().extend(log);
}

fn gap(rng: &mut StdRng, shape: &Shape, at: Duration) -> Duration {
    let per_client = shape.rate_at(at) / shape.clients as f64;
    let u: f64 = rng.gen_range(f64::EPSILON..1.0);
    Duration::from_secs_f64(-u.ln() / per_client)
}

/// Connects (again, when `again`: that is counted as a reconnect).
async fn reconnect(ctx: &ClientCtx, again: bool) -> Option<Client> {
    let give_up = ctx.start + ctx.shape.total();
    if again {
        ctx.counters.reconnects.fetch_add(1, Ordering::Relaxed);
    }
    while Instant::now() < give_up {
        match tokio::time::timeout(Duration::from_secs(2), connect(&ctx.url)).await {
            Ok(Ok(c)) => return Some(c),
            _ => {
                ctx.counters.connect_failures.fetch_add(1, Ordering::Relaxed);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
    None
}

/// Runs one INSERT under the client's deadline. Returns the record and the
/// connection if the client keeps it.
async fn one_query(ctx: &ClientCtx, client: Client) -> (Sent, Option<Client>) {
    let id = ctx.ids.fetch_add(1, Ordering::Relaxed);
    let deadline_us = wall_us() + ctx.shape.deadline.as_micros() as i64;
    let sql = format!("insert into ledger(id) select {id} from pg_sleep({})", ctx.shape.query.as_secs_f64());
    let asked = Instant::now();
    let at = asked.saturating_duration_since(ctx.start);
    let outcome = match tokio::time::timeout(ctx.shape.deadline, client.simple_query(&sql)).await {
        Ok(Ok(_)) => Outcome::Ok,
        Ok(Err(e)) => classify(ctx, &e),
        Err(_) => {
            // What pgx does when the context expires: cancel, then close.
            let token = client.cancel_token();
            let _ = tokio::time::timeout(Duration::from_secs(1), token.cancel_query(NoTls)).await;
            drop(client);
            let latency = asked.elapsed();
            return (Sent { id, deadline_us, outcome: Outcome::DeadlineExpired, latency, at }, None);
        }
    };
    let latency = asked.elapsed();
    let keep = (!client.is_closed()).then_some(client);
    (Sent { id, deadline_us, outcome, latency, at }, keep)
}

fn classify(ctx: &ClientCtx, e: &tokio_postgres::Error) -> Outcome {
    let weir_wait = e.code().is_some_and(|c| c.code() == "53300");
    let pgbouncer_wait = e.as_db_error().is_some_and(|d| d.message().contains("query_wait_timeout"));
    if weir_wait || pgbouncer_wait {
        return Outcome::WaitTimeout;
    }
    let mut errors = ctx.counters.errors.lock().unwrap();
    if errors.len() < 5 {
        errors.push(match e.as_db_error() {
            Some(d) => format!("{} {}", d.code().code(), d.message()),
            None => e.to_string(),
        });
    }
    Outcome::Other
}

fn wall_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_micros() as i64).unwrap_or(0)
}

async fn connect(url: &str) -> anyhow::Result<Client> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

/// (backends started, backends ended) for the benchmark's user, from the
/// Postgres log (log_connections / log_disconnections).
fn server_log_counts(pg: &PgServer) -> (usize, usize) {
    let log = std::fs::read(pg.log_file()).unwrap_or_default();
    let log = String::from_utf8_lossy(&log);
    let user = format!("user={TRUST_USER} ");
    let opened = log.lines().filter(|l| l.contains(&format!("connection authorized: {user}"))).count();
    let closed = log.lines().filter(|l| l.contains("disconnection:") && l.contains(&user)).count();
    (opened, closed)
}

/// What the ledger says about queries whose client had given up.
#[derive(Debug, Default)]
struct Late {
    /// Rows whose statement reached Postgres after the client's deadline: a
    /// query run for a client that had already left (the incident).
    started_after: usize,
    /// Rows committed after the client's deadline (includes queries already
    /// running at the deadline whose cancel came too late).
    committed_after: usize,
    /// How far past its deadline the latest such commit landed.
    worst_past: Duration,
    /// Rows of queries whose client saw its deadline expire.
    for_gone_clients: usize,
}

/// Reads this run's ledger rows (statement start and commit time, from
/// Postgres's clock) against each client's recorded deadline.
fn late_rows(pg: &PgServer, sent: &[Sent], first_id: i64) -> anyhow::Result<Late> {
    let last_id = first_id + 10_000_000;
    let epoch_us = |col: &str| format!("(extract(epoch from {col}) * 1000000)::bigint");
    let out = pg.psql(
        APP_DB,
        &format!(
            "select id || ' ' || {} || ' ' || {} from ledger where id >= {first_id} and id < {last_id}",
            epoch_us("started"),
            epoch_us("ts"),
        ),
    )?;
    let by_id: std::collections::HashMap<i64, Sent> = sent.iter().map(|s| (s.id, *s)).collect();
    let mut late = Late::default();
    for line in out.lines().filter(|l| !l.is_empty()) {
        let v: Vec<i64> = line.split_whitespace().map(|v| v.parse().unwrap_or(0)).collect();
        let (Some(s), [_, started, ts]) = (v.first().and_then(|id| by_id.get(id)), v.as_slice()) else {
            continue;
        };
        late.started_after += usize::from(*started > s.deadline_us);
        if *ts > s.deadline_us {
            late.committed_after += 1;
            late.worst_past = late.worst_past.max(Duration::from_micros((ts - s.deadline_us) as u64));
        }
        late.for_gone_clients += usize::from(s.outcome == Outcome::DeadlineExpired);
    }
    Ok(late)
}

// ---- PgBouncer ---------------------------------------------------------

fn run_pgbouncer(
    clients: &tokio::runtime::Runtime,
    pg: &PgServer,
    dir: &Path,
    shape: &Shape,
) -> anyhow::Result<Report> {
    let databases = format!("{APP_DB} = host=127.0.0.1 port={} dbname={APP_DB}", pg.port());
    let settings = format!(
        "auth_type = trust\nauth_file = {users}\npool_mode = transaction\n\
         default_pool_size = {pool}\nmax_client_conn = 2000\n\
         ; 1 s is PgBouncer's smallest query_wait_timeout: above the 100 ms deadline\n\
         query_wait_timeout = 1\nserver_login_retry = 1\n\
         ignore_startup_parameters = extra_float_digits,options",
        users = dir.join("userlist.txt").display(),
        pool = shape.pool,
    );
    let bouncer = PgBouncer::start(dir, &databases, &settings)?;
    let url = format!("postgres://{TRUST_USER}:{TRUST_PASS}@{}/{APP_DB}", bouncer.addr);
    let mut report = clients.block_on(drive(pg, "pgbouncer", &url, shape, 100_000_000))?;
    if !bouncer.alive() {
        let fatal = bouncer.last_fatal().unwrap_or_else(|| "no FATAL line in its log".into());
        report.note = Some(format!("PgBouncer exited during the run; its log: {fatal}"));
    }
    Ok(report)
}
