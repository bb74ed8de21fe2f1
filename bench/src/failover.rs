//! The `failover` benchmark: a replay of a primary failing over, measured by
//! how long clients hang, not by how many requests succeed. Two Postgres
//! stream on one port at two loopback addresses (`PgPair`: the primary at
//! 127.0.0.2, its `pg_basebackup -R` standby at 127.0.0.3); the pooler lists
//! the standby first (`host = "127.0.0.3,127.0.0.2"`), so it must skip it.
//! Writers hold one pooler connection each and insert ledger rows in a loop
//! (each insert bounded: one that takes longer counts as hung).
//!
//! - Scenario 1: the primary stops (`pg_ctl stop -m fast`) and the standby is
//!   promoted (`pg_ctl promote -w`).
//! - Scenario 2: the old primary comes back at its address as a standby of
//!   the new one (`pg_rewind -R`, then a start), and every pooled server on
//!   the new primary is terminated, so the pooler must connect again and
//!   choose a host.
//!
//! Per scenario it prints the time from the promote (or the return) to the
//! first acknowledged write, the errors by SQLSTATE and when they came
//! (relative to the stop or the return; in flight = the insert began before
//! it), the longest insert, the hung ones, the 25006s, and the rows
//! acknowledged against the rows of those on the primary at the end.
//!
//! weir runs in-process with `target_session_attrs = "read-write"`;
//! PgBouncer, where Debian's `pgbouncer` is installed, with the same host
//! list (it has had host lists since 1.17, without a role check and
//! without `load_balance_hosts` before 1.24). Each pooler gets a fresh pair.
//! Not a pass/fail test.
//!
//! `weir-bench failover [--writers N] [--settle-ms N] [--budget-ms N] [--no-pgbouncer]`

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

use crate::pgbouncer::Running;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};
use weir_testkit::{PgOptions, PgPair, APP_DB, TRUST_PASS, TRUST_USER};

const USAGE: &str = "failover [--writers N] [--settle-ms N] [--budget-ms N] [--no-pgbouncer]";

struct Args {
    writers: usize,
    /// How long writers run before each event and after it.
    settle: Duration,
    /// The pooler's wait budget (query_wait_timeout).
    budget: Duration,
    pgbouncer: bool,
}

impl Args {
    fn parse(args: &[String]) -> anyhow::Result<Args> {
        let mut a =
            Args { writers: 8, settle: Duration::from_secs(3), budget: Duration::from_secs(10), pgbouncer: true };
        let mut it = args.iter();
        while let Some(x) = it.next() {
            let mut ms =
                |what| -> anyhow::Result<Duration> { Ok(Duration::from_millis(it.next().context(what)?.parse()?)) };
            match x.as_str() {
                "--settle-ms" => a.settle = ms("--settle-ms N")?,
                "--budget-ms" => a.budget = ms("--budget-ms N")?,
                "--writers" => a.writers = it.next().context("--writers N")?.parse()?,
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

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let args = Args::parse(args)?;
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    rt.block_on(failover(args))
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Pooler {
    Weir,
    PgBouncer,
}

impl Pooler {
    fn name(self) -> &'static str {
        match self {
            Pooler::Weir => "weir",
            Pooler::PgBouncer => "pgbouncer",
        }
    }
}

/// One insert: when it began and ended, and its row or its SQLSTATE.
#[derive(Debug, Clone)]
struct Insert {
    began: Instant,
    ended: Instant,
    outcome: Result<i64, String>,
}

/// When a scenario's event happened.
#[derive(Debug, Clone, Copy)]
struct Event {
    /// It was over (the stop returned; the old primary streamed and the
    /// servers were terminated): an insert that began before was in flight.
    over: Instant,
    /// The first write is timed from here (the promote returned, or `over`).
    from: Instant,
}

/// What one scenario measured.
struct Measured {
    pooler: Pooler,
    scenario: &'static str,
    event: Event,
    inserts: Vec<Insert>,
    /// Acknowledged rows of the run found on the primary at the end.
    on_primary: usize,
    acked: usize,
}

async fn failover(args: Args) -> anyhow::Result<()> {
    let dir = crate::pgbouncer::work_dir("failover")?;
    let started = std::time::SystemTime::now();
    let pgbouncer = args.pgbouncer && crate::pgbouncer::installed();
    let mut results = Vec::new();
    let mut version = String::new();
    for pooler in [Pooler::Weir, Pooler::PgBouncer] {
        if pooler == Pooler::PgBouncer && !pgbouncer {
            continue;
        }
        eprintln!("== {}", pooler.name());
        let opts = PgOptions { log_connections: false, ..PgOptions::default() };
        let pair = Arc::new(tokio::task::spawn_blocking(move || PgPair::start(opts)).await??);
        version = blocking({
            let p = pair.clone();
            move || p.first.psql("postgres", "show server_version")
        })
        .await?;
        results.extend(scenarios(&args, pooler, pair, &dir).await?);
    }
    print_report(&args, &results, &version, started, pgbouncer);
    let _ = std::fs::remove_dir_all(&dir);
    Ok(())
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("a blocking task")
}

/// Both scenarios on one pair through `pooler`.
async fn scenarios(args: &Args, pooler: Pooler, pair: Arc<PgPair>, dir: &Path) -> anyhow::Result<Vec<Measured>> {
    let sql = "create table ledger(id bigserial primary key, writer int, n int); \
               grant all on table ledger, ledger_id_seq to public";
    blocking({
        let p = pair.clone();
        move || p.first.psql(APP_DB, sql)
    })
    .await?;
    let (url, running) = match pooler {
        Pooler::Weir => start_weir(&pair, args, dir).await?,
        Pooler::PgBouncer => start_pgbouncer(&pair, args, dir).await?,
    };
    let hang_limit = args.budget + Duration::from_secs(5);
    let log = Arc::new(Mutex::new(Vec::new()));
    let stop = Arc::new(AtomicBool::new(false));
    let writers: Vec<_> = (0..args.writers)
        .map(|i| tokio::spawn(writer(url.clone(), i, stop.clone(), log.clone(), hang_limit)))
        .collect();
    let start = Instant::now();
    tokio::time::sleep(args.settle).await;
    let steady = Event { over: start, from: start };
    let mut out = vec![measure(pooler, "0 both up", steady, take(&log, 0), &pair, false).await?];

    // Scenario 1: stop the primary (fast), promote the standby.
    let mark = log.lock().unwrap().len();
    blocking({
        let p = pair.clone();
        move || p.first.stop()
    })
    .await?;
    let stopped = Instant::now();
    blocking({
        let p = pair.clone();
        move || p.second.promote()
    })
    .await?;
    let promoted = Event { over: stopped, from: Instant::now() };
    tokio::time::sleep(args.settle).await;
    out.push(measure(pooler, "1 stop + promote", promoted, take(&log, mark), &pair, true).await?);

    // Scenario 2: the old primary back as a standby; the pooler's servers
    // on the new primary terminated, so it connects again.
    let mark = log.lock().unwrap().len();
    let back = blocking({
        let p = pair.clone();
        move || {
            p.first.rewind_to_follow(&p.second)?;
            let sql =
                format!("select count(pg_terminate_backend(pid)) from pg_stat_activity where usename = '{TRUST_USER}'");
            p.second.psql("postgres", &sql)?;
            Ok::<_, weir_testkit::TestkitError>(Instant::now())
        }
    })
    .await?;
    tokio::time::sleep(args.settle).await;
    let back = Event { over: back, from: back };
    out.push(measure(pooler, "2 old primary back", back, take(&log, mark), &pair, true).await?);

    stop.store(true, Ordering::SeqCst);
    for w in writers {
        let _ = w.await;
    }
    running.stop().await;
    Ok(out)
}

/// The inserts logged since `mark`.
fn take(log: &Mutex<Vec<Insert>>, mark: usize) -> Vec<Insert> {
    log.lock().unwrap()[mark..].to_vec()
}

/// The rows of `inserts` acknowledged, counted on the primary: the new
/// one once it was promoted, else the first.
async fn measure(
    pooler: Pooler,
    scenario: &'static str,
    event: Event,
    inserts: Vec<Insert>,
    pair: &Arc<PgPair>,
    promoted: bool,
) -> anyhow::Result<Measured> {
    let acked: Vec<i64> = inserts.iter().filter_map(|i| i.outcome.as_ref().ok().copied()).collect();
    let on_primary = if acked.is_empty() {
        0
    } else {
        // The ids on the primary, matched here: a list of the acknowledged
        // ones in the statement would pass the argument limit of psql's exec.
        let sql = "select id from ledger";
        let p = pair.clone();
        let ids =
            blocking(move || if promoted { p.second.psql(APP_DB, sql) } else { p.first.psql(APP_DB, sql) }).await?;
        let there: std::collections::HashSet<i64> = ids.lines().filter_map(|l| l.trim().parse().ok()).collect();
        acked.iter().filter(|id| there.contains(id)).count()
    };
    Ok(Measured { pooler, scenario, event, inserts, on_primary, acked: acked.len() })
}

/// Inserts rows on one connection until `stop`, logging each.
async fn writer(url: String, id: usize, stop: Arc<AtomicBool>, log: Arc<Mutex<Vec<Insert>>>, limit: Duration) {
    let mut client: Option<Client> = None;
    let mut n = 0u64;
    while !stop.load(Ordering::SeqCst) {
        let began = Instant::now();
        let c = match &client {
            Some(c) if !c.is_closed() => c,
            _ => match tokio::time::timeout(limit, connect(&url)).await {
                Ok(Ok(c)) => client.insert(c),
                other => {
                    let code = match other {
                        Ok(Err(e)) => e.as_db_error().map_or("connect".to_owned(), |d| d.code().code().to_owned()),
                        _ => "hung".to_owned(),
                    };
                    log.lock().unwrap().push(Insert { began, ended: Instant::now(), outcome: Err(code) });
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    continue;
                }
            },
        };
        n += 1;
        let sql = format!("insert into ledger(writer, n) values ({id}, {n}) returning id");
        let outcome = match tokio::time::timeout(limit, c.simple_query(&sql)).await {
            Ok(Ok(rows)) => Ok(rows
                .iter()
                .find_map(|m| match m {
                    SimpleQueryMessage::Row(r) => r.get(0).and_then(|v| v.parse().ok()),
                    _ => None,
                })
                .unwrap_or(-1)),
            Ok(Err(e)) => Err(e.as_db_error().map_or("closed".to_owned(), |d| d.code().code().to_owned())),
            Err(_) => {
                client = None;
                Err("hung".to_owned())
            }
        };
        let failed = outcome.is_err();
        log.lock().unwrap().push(Insert { began, ended: Instant::now(), outcome });
        if failed {
            // As an application would: a new connection after an error
            // (a FATAL ends the connection it came on).
            client = None;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
}

async fn connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

fn hosts(pair: &PgPair) -> String {
    format!("{},{}", pair.second.host(), pair.first.host())
}

async fn start_weir(pair: &PgPair, args: &Args, dir: &Path) -> anyhow::Result<(String, Running)> {
    let text = format!(
        "[weir]\nlisten_addr = \"127.0.0.1:0\"\nauth_type = \"trust\"\npool_mode = \"transaction\"\n\
         default_pool_size = {pool}\nquery_wait_timeout = \"{budget}ms\"\nserver_connect_timeout = \"2s\"\n\
         [databases.{APP_DB}]\nhost = \"{hosts}\"\nport = {port}\ntarget_session_attrs = \"read-write\"\n",
        pool = args.writers,
        budget = args.budget.as_millis(),
        hosts = hosts(pair),
        port = pair.first.port(),
    );
    let weir = weir::Weir::start(weir::Config::from_toml(&text, dir)?).await?;
    let url = format!("postgres://{TRUST_USER}:{TRUST_PASS}@{}/{APP_DB}", weir.local_addr());
    Ok((url, Running::Weir(weir)))
}

async fn start_pgbouncer(pair: &PgPair, args: &Args, dir: &Path) -> anyhow::Result<(String, Running)> {
    std::fs::write(dir.join("userlist.txt"), format!("\"{TRUST_USER}\" \"{TRUST_PASS}\"\n"))?;
    let databases = format!("{APP_DB} = host={} port={} dbname={APP_DB}", hosts(pair), pair.first.port());
    let settings = format!(
        "auth_type = trust\nauth_file = {users}\npool_mode = transaction\ndefault_pool_size = {pool}\n\
         query_wait_timeout = {budget}\nserver_login_retry = 1\nserver_connect_timeout = 2\n\
         ignore_startup_parameters = extra_float_digits,options",
        users = dir.join("userlist.txt").display(),
        pool = args.writers,
        budget = args.budget.as_secs().max(1),
    );
    let _ = std::fs::remove_file(dir.join("pgbouncer.pid"));
    let dir = dir.to_path_buf();
    let bouncer =
        tokio::task::spawn_blocking(move || crate::pgbouncer::PgBouncer::start(&dir, &databases, &settings)).await??;
    let url = format!("postgres://{TRUST_USER}:{TRUST_PASS}@{}/{APP_DB}", bouncer.addr);
    Ok((url, Running::PgBouncer(bouncer)))
}

fn ms(d: Duration) -> String {
    format!("{} ms", d.as_millis())
}

/// Errors by SQLSTATE: `code xN (in flight: M) at +first..+last ms`.
fn errors(m: &Measured) -> Vec<String> {
    let mut codes: Vec<&str> = m.inserts.iter().filter_map(|i| i.outcome.as_ref().err().map(String::as_str)).collect();
    codes.sort_unstable();
    codes.dedup();
    codes
        .into_iter()
        .map(|code| {
            let of: Vec<&Insert> =
                m.inserts.iter().filter(|i| i.outcome.as_ref().err().map(String::as_str) == Some(code)).collect();
            let in_flight = of.iter().filter(|i| i.began < m.event.over).count();
            let at = |i: &&Insert| {
                i.ended.saturating_duration_since(m.event.over).as_millis() as i128
                    - m.event.over.saturating_duration_since(i.ended).as_millis() as i128
            };
            let (first, last) = (of.iter().map(at).min().unwrap_or(0), of.iter().map(at).max().unwrap_or(0));
            format!("{code} x{} (in flight {in_flight}) at {first:+}..{last:+} ms", of.len())
        })
        .collect()
}

fn print_report(args: &Args, results: &[Measured], version: &str, started: std::time::SystemTime, pgbouncer: bool) {
    println!(
        "failover: {} writers, one pooler connection each, inserting ledger rows; Postgres {version} primary at \
         127.0.0.2 and its standby at 127.0.0.3 on one port; host = \"127.0.0.3,127.0.0.2\" (standby first); weir \
         with target_session_attrs = read-write; wait budget {} (query_wait_timeout); an insert over {} counts as hung; \
         started {}",
        args.writers,
        ms(args.budget),
        ms(args.budget + Duration::from_secs(5)),
        humantime::format_rfc3339_seconds(started),
    );
    println!(
        "{:<10} {:<20} {:>12} {:>10} {:>5} {:>6} {:>6} {:>15}  errors (SQLSTATE xN: in flight, when vs the event's end)",
        "pooler", "scenario", "first write", "longest", "hung", "25006", "after", "acked/primary"
    );
    for m in results {
        let acked: Vec<&Insert> = m.inserts.iter().filter(|i| i.outcome.is_ok()).collect();
        let from = m.event.from;
        let first = acked.iter().map(|i| i.ended).filter(|t| *t > from).min().map(|t| ms(t.duration_since(from)));
        let longest = m.inserts.iter().map(|i| i.ended.duration_since(i.began)).max().unwrap_or_default();
        let hung = m.inserts.iter().filter(|i| i.outcome.as_ref().err().is_some_and(|e| e == "hung")).count();
        let read_only = m.inserts.iter().filter(|i| i.outcome.as_ref().err().is_some_and(|e| e == "25006")).count();
        // Errors of inserts that began once the event was over: not in flight.
        let after = m.inserts.iter().filter(|i| i.outcome.is_err() && i.began >= m.event.over).count();
        let errs = errors(m);
        println!(
            "{:<10} {:<20} {:>12} {:>10} {:>5} {:>6} {:>6} {:>15}  {}",
            m.pooler.name(),
            m.scenario,
            if m.scenario.starts_with('0') { "-".to_owned() } else { first.unwrap_or_else(|| "none".into()) },
            ms(longest),
            hung,
            read_only,
            after,
            format!("{}/{}", m.acked, m.on_primary),
            if errs.is_empty() { "none".to_owned() } else { errs.join("; ") },
        );
    }
    println!(
        "first write: from the promote returning (1), or the old primary streaming again and the servers terminated (2), \
         to the first acknowledged insert; after: errors of inserts that began once the stop (1) or the return (2) was \
         over, so not in flight; acked/primary: rows acknowledged, and of them those on the primary at the end"
    );
    if !pgbouncer {
        println!(
            "PgBouncer {}",
            if args.pgbouncer {
                "not installed, skipped (apt-get install -y pgbouncer)"
            } else {
                "skipped (--no-pgbouncer)"
            }
        );
    } else {
        println!(
            "PgBouncer takes the listed hosts in turn and checks no role (no target_session_attrs; \
             load_balance_hosts only from 1.24)"
        );
    }
}
