//! The soak's faults, their schedule (scaled to the run's length) and the
//! recovery measured after each: the time from the fault's end until the
//! pool holds its minimum of logged-in servers (SHOW POOLS) and a fresh
//! client gets an answer through the pooler.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_postgres::NoTls;
use weir_testkit::{PgServer, Relay, StopMode, APP_DB, TRUST_USER};

use super::load::{self, Ctx};
use super::target::{self, Target, MIN_POOL_SIZE, POOL_SIZE};
use super::wire::Conn;

/// How long the server path stays silently dropped.
pub const SILENT_DROP: Duration = Duration::from_secs(20);
/// Clients in the connect burst.
const CONNECT_BURST: usize = 2000;
/// Clients in the admission burst, each running `ADMISSION_ROUNDS` sleeps.
const ADMISSION_CLIENTS: usize = 400;
const ADMISSION_ROUNDS: usize = 3;
/// The pool size a SIGHUP switches to, and how long it stays.
const RELOAD_POOL: u32 = 10;
const RELOAD_HOLD: Duration = Duration::from_secs(6);
const PAUSE_HOLD: Duration = Duration::from_secs(3);
/// Recovery is measured for at most this long after a fault's end.
const RECOVERY_WATCH: Duration = Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    Terminate,
    Restart,
    SilentDrop,
    ConnectBurst,
    Reload,
    PauseResume,
    AdmissionBurst,
}

pub const ALL: [Fault; 7] = [
    Fault::Terminate,
    Fault::Restart,
    Fault::SilentDrop,
    Fault::ConnectBurst,
    Fault::Reload,
    Fault::PauseResume,
    Fault::AdmissionBurst,
];

impl Fault {
    pub fn name(self) -> &'static str {
        match self {
            Fault::Terminate => "terminate",
            Fault::Restart => "pg-restart",
            Fault::SilentDrop => "silent-drop",
            Fault::ConnectBurst => "connect-burst",
            Fault::Reload => "sighup-pool",
            Fault::PauseResume => "pause-resume",
            Fault::AdmissionBurst => "admission-burst",
        }
    }

    /// How soon after its end the pool must be back at its minimum.
    pub fn recovery_limit(self) -> Duration {
        match self {
            Fault::SilentDrop => Duration::from_secs(20),
            _ => Duration::from_secs(2),
        }
    }

    /// Roughly how long the fault itself lasts (for the schedule).
    fn nominal(self) -> Duration {
        match self {
            Fault::SilentDrop => SILENT_DROP,
            Fault::Reload => RELOAD_HOLD,
            Fault::PauseResume => PAUSE_HOLD,
            Fault::AdmissionBurst | Fault::ConnectBurst => Duration::from_secs(4),
            Fault::Restart => Duration::from_secs(2),
            Fault::Terminate => Duration::ZERO,
        }
    }
}

/// One fault as it happened (seconds since the soak's start).
#[derive(Debug, Clone)]
pub struct Record {
    pub fault: Fault,
    pub start: f64,
    pub end: f64,
    /// Seconds from `end` until the pool was back at its minimum and answered.
    pub recovered_after: Option<f64>,
    pub detail: String,
}

/// The plan for a run of `total`: a warm-up connect burst, the baseline time
/// (RSS "after the first minute"), the faults' planned start times, and the
/// quiet tail.
pub struct Plan {
    /// When the warm-up connect burst runs (before the baseline).
    pub warmup: Duration,
    pub baseline: Duration,
    pub faults: Vec<(Duration, Fault)>,
    pub tail: Duration,
}

/// Faults in rounds of all seven (one round per 10 minutes, at least one),
/// spread evenly between the baseline and the quiet tail.
pub fn plan(total: Duration) -> Plan {
    let baseline = Duration::from_secs(60).min(total / 6);
    let tail = Duration::from_secs(15).max(total / 10);
    let rounds = (total.as_secs() / 600).max(1) as usize;
    let faults: Vec<Fault> = (0..rounds).flat_map(|_| ALL).collect();
    let span = total.saturating_sub(baseline + tail);
    let slot = span / faults.len() as u32;
    let faults = faults.into_iter().enumerate().map(|(i, f)| (baseline + slot * i as u32, f)).collect();
    Plan { warmup: baseline / 6, baseline, faults, tail }
}

/// Gap kept after a fault's recovery before the next starts, whatever the plan says.
pub fn min_gap(f: Fault) -> Duration {
    f.recovery_limit() + Duration::from_secs(3) + f.nominal() / 4
}

/// What a fault acts on.
pub struct Env<'a> {
    pub pg: &'a PgServer,
    pub relay: &'a Relay,
    pub target: &'a Target,
    pub ctx: Arc<Ctx>,
}

/// Runs `fault`, then measures its recovery.
pub async fn run(env: &Env<'_>, fault: Fault) -> Record {
    let stats = env.ctx.stats.clone();
    let start = stats.now();
    println!("[{start:7.1} s] fault {}: start", fault.name());
    let detail = match inject(env, fault).await {
        Ok(d) => d,
        Err(e) => format!("injection failed: {e:#}"),
    };
    let end = stats.now();
    let recovered_after = recovery(env, end).await;
    let rec = match recovered_after {
        Some(r) => format!("recovered {r:.2} s after"),
        None => format!("NOT recovered within {} s", RECOVERY_WATCH.as_secs()),
    };
    println!("[{end:7.1} s] fault {}: end ({detail}); {rec}", fault.name());
    Record { fault, start, end, recovered_after, detail }
}

async fn inject(env: &Env<'_>, fault: Fault) -> anyhow::Result<String> {
    match fault {
        Fault::Terminate => {
            let direct = direct(env.pg).await?;
            let sql =
                format!("select count(pg_terminate_backend(pid)) from pg_stat_activity where usename = '{TRUST_USER}'");
            let n: i64 = direct.query_one(&sql, &[]).await?.get(0);
            Ok(format!("{n} server backends terminated"))
        }
        Fault::Restart => {
            let t = Instant::now();
            tokio::task::block_in_place(|| env.pg.restart(StopMode::Fast)).context("pg_ctl restart -m fast")?;
            Ok(format!("fast restart took {:.1} s", t.elapsed().as_secs_f64()))
        }
        Fault::SilentDrop => {
            env.relay.freeze();
            tokio::time::sleep(SILENT_DROP).await;
            env.relay.thaw();
            Ok(format!("server path frozen {} s", SILENT_DROP.as_secs()))
        }
        Fault::ConnectBurst => {
            let t = Instant::now();
            let (ok, failed) = load::burst(env.ctx.clone(), CONNECT_BURST, "select 1", 1, "connect-burst").await;
            Ok(format!("{ok} ok, {failed} failed in {:.1} s", t.elapsed().as_secs_f64()))
        }
        Fault::Reload => {
            env.target.reload_with_pool(RELOAD_POOL)?;
            tokio::time::sleep(RELOAD_HOLD / 2).await;
            let admin = target::admin(&env.target.addr()).await?;
            let mut most = 0;
            let until = Instant::now() + RELOAD_HOLD / 2;
            while Instant::now() < until {
                most = most.max(target::pool_counts(&admin).await?.0);
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            env.target.reload_with_pool(POOL_SIZE)?;
            Ok(format!("pool {POOL_SIZE} -> {RELOAD_POOL} -> {POOL_SIZE}; at most {most} servers in the 2nd half"))
        }
        Fault::PauseResume => {
            let admin = target::admin(&env.target.addr()).await?;
            let t = Instant::now();
            tokio::time::timeout(Duration::from_secs(30), admin.simple_query("PAUSE")).await.context("PAUSE")??;
            let paused = t.elapsed().as_secs_f64();
            tokio::time::sleep(PAUSE_HOLD).await;
            admin.simple_query("RESUME").await?;
            Ok(format!("PAUSE took {paused:.2} s, held {} s, RESUME", PAUSE_HOLD.as_secs()))
        }
        Fault::AdmissionBurst => {
            let t = Instant::now();
            let (ok, failed) = load::burst(
                env.ctx.clone(),
                ADMISSION_CLIENTS,
                "select pg_sleep(0.05)",
                ADMISSION_ROUNDS,
                "admission-burst",
            )
            .await;
            Ok(format!(
                "{ADMISSION_CLIENTS} clients x {ADMISSION_ROUNDS} sleeps: {ok} ok, {failed} failed in {:.1} s",
                t.elapsed().as_secs_f64()
            ))
        }
    }
}

/// Seconds after `end` until the pool holds MIN_POOL_SIZE servers and a new
/// client's `select 1` is answered; None if not within RECOVERY_WATCH.
async fn recovery(env: &Env<'_>, end: f64) -> Option<f64> {
    let stats = &env.ctx.stats;
    let addr = env.target.addr();
    let mut admin = None;
    while stats.now() - end < RECOVERY_WATCH.as_secs_f64() {
        if admin.is_none() {
            admin = target::admin(&addr).await.ok();
        }
        let servers = match &admin {
            Some(a) => match target::pool_counts(a).await {
                Ok((s, _)) => s,
                Err(_) => {
                    admin = None;
                    0
                }
            },
            None => 0,
        };
        if servers >= u64::from(MIN_POOL_SIZE) && probe(&env.ctx).await {
            return Some((stats.now() - end).max(0.0));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    None
}

async fn probe(ctx: &Ctx) -> bool {
    let limit = Duration::from_secs(1);
    let Ok(mut c) = Conn::connect(&ctx.addr, &ctx.user, &ctx.db, limit).await else {
        return false;
    };
    let ok = c.simple("select 1", limit).await.is_ok_and(|r| r.errors.is_empty() && r.rows == 1);
    c.terminate().await;
    ok
}

/// A superuser connection straight to Postgres.
pub async fn direct(pg: &PgServer) -> anyhow::Result<tokio_postgres::Client> {
    let url = format!("postgres://{}@127.0.0.1:{}/{APP_DB}?connect_timeout=10", pg.superuser(), pg.port());
    let (client, conn) = tokio_postgres::connect(&url, NoTls).await?;
    tokio::spawn(conn);
    Ok(client)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_schedule_scales_to_the_run() {
        let long = plan(Duration::from_secs(1800));
        assert_eq!((long.baseline.as_secs(), long.tail.as_secs(), long.faults.len()), (60, 180, 21));
        assert_eq!(long.warmup.as_secs(), 10);
        let short = plan(Duration::from_secs(180));
        assert_eq!((short.baseline.as_secs(), short.tail.as_secs(), short.faults.len()), (30, 18, 7));
        for p in [&long, &short] {
            let starts: Vec<Duration> = p.faults.iter().map(|f| f.0).collect();
            assert!(starts.windows(2).all(|w| w[0] < w[1]), "in order");
            assert_eq!(starts[0], p.baseline, "the first fault comes after the baseline");
            let faults: Vec<Fault> = p.faults.iter().take(7).map(|f| f.1).collect();
            assert_eq!(faults, ALL, "every fault in each round");
        }
    }
}
