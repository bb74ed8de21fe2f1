//! The fleet seen every 100 ms: each member's SHOW POOLS (servers it holds,
//! clients waiting, maxwait), the role's backends in Postgres's own
//! `pg_stat_activity`, and once a second each member's refused connects.
//! Runs on a thread of its own with a current-thread runtime until told to
//! stop; a member that no longer answers is recorded as `None`.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};
use weir_testkit::{APP_DB, TRUST_PASS, TRUST_USER};

use super::member::Refusals;

pub const TICK: Duration = Duration::from_millis(100);
/// Ticks between two reads of the refused counters.
const REFUSED_EVERY: u32 = 10;
const QUERY_LIMIT: Duration = Duration::from_secs(1);

/// One member in one sample.
#[derive(Debug, Clone, Copy, Default)]
pub struct Pool {
    /// sv_active + sv_idle + sv_used + sv_tested: logged-in servers.
    pub held: u32,
    pub waiting: u32,
    pub maxwait_us: u64,
}

/// The fleet at one moment.
#[derive(Debug, Clone)]
pub struct Sample {
    /// Seconds on the bench's clock.
    pub at: f64,
    pub pools: Vec<Option<Pool>>,
    /// Backends of the bench's role in pg_stat_activity.
    pub pg_backends: Option<i64>,
    /// Refused connects so far, per member (only on every tenth sample).
    pub refused: Option<Vec<Option<u64>>>,
}

/// What the sampler watches.
pub struct Watch {
    pub addrs: Vec<String>,
    pub refusals: Vec<Refusals>,
    pub pg_port: u16,
}

/// A running sampler.
pub struct Sampler {
    stop: Arc<AtomicBool>,
    handle: JoinHandle<anyhow::Result<Vec<Sample>>>,
}

impl Sampler {
    pub fn start(watch: Watch, t0: Instant) -> Sampler {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let handle = std::thread::spawn(move || {
            let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
            rt.block_on(sample(watch, t0, flag))
        });
        Sampler { stop, handle }
    }

    pub fn finish(self) -> anyhow::Result<Vec<Sample>> {
        self.stop.store(true, Ordering::SeqCst);
        self.handle.join().map_err(|_| anyhow::anyhow!("sampler panicked"))?
    }
}

async fn sample(watch: Watch, t0: Instant, stop: Arc<AtomicBool>) -> anyhow::Result<Vec<Sample>> {
    let pg = connect(&format!("postgres://postgres@127.0.0.1:{}/{APP_DB}", watch.pg_port)).await?;
    let mut admins: Vec<Option<Client>> = watch.addrs.iter().map(|_| None).collect();
    let mut out = Vec::new();
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut n = 0u32;
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        let at = t0.elapsed().as_secs_f64();
        let mut pools = Vec::with_capacity(admins.len());
        for (admin, addr) in admins.iter_mut().zip(&watch.addrs) {
            pools.push(pool_of(admin, addr).await);
        }
        let sql = format!("select count(*) from pg_stat_activity where usename = '{TRUST_USER}'");
        let pg_backends = match tokio::time::timeout(QUERY_LIMIT, pg.query_one(&sql, &[])).await {
            Ok(Ok(row)) => Some(row.get(0)),
            _ => None,
        };
        let refused = n.is_multiple_of(REFUSED_EVERY).then(|| watch.refusals.iter().map(Refusals::read).collect());
        out.push(Sample { at, pools, pg_backends, refused });
        n += 1;
    }
    Ok(out)
}

/// SHOW POOLS of one member, connecting its admin console when needed.
async fn pool_of(admin: &mut Option<Client>, addr: &str) -> Option<Pool> {
    if admin.is_none() {
        let url = format!("postgres://{TRUST_USER}:{TRUST_PASS}@{addr}/pgbouncer?connect_timeout=1");
        *admin = tokio::time::timeout(QUERY_LIMIT, connect(&url)).await.ok().and_then(Result::ok);
    }
    let client = admin.as_ref()?;
    let rows = match tokio::time::timeout(QUERY_LIMIT, client.simple_query("SHOW POOLS")).await {
        Ok(Ok(rows)) => rows,
        _ => {
            *admin = None;
            return None;
        }
    };
    let mut pool = Pool::default();
    for m in rows {
        let SimpleQueryMessage::Row(r) = m else { continue };
        if r.get("database") != Some(APP_DB) {
            continue;
        }
        let num = |c: &str| r.get(c).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        pool.held += (num("sv_active") + num("sv_idle") + num("sv_used") + num("sv_tested")) as u32;
        pool.waiting += num("cl_waiting") as u32;
        pool.maxwait_us = pool.maxwait_us.max(num("maxwait") * 1_000_000 + num("maxwait_us"));
    }
    Some(pool)
}

async fn connect(url: &str) -> anyhow::Result<Client> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.with_context(|| format!("connecting {url}"))?;
    tokio::spawn(conn);
    Ok(client)
}
