//! Several weirs in front of one Postgres whose role limit is the budget,
//! with fleet_share: each instance's servers converge to its share of the
//! budget, the instances serve a like load alike, and a killed instance's
//! share goes to the others.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_e2e::process::{metric, rows, WeirProcess};
use weir_e2e::{connect, PgOptions, PgServer, SCRAM_PASS, SCRAM_USER};

/// The role's CONNECTION LIMIT; the fleet keeps one slot of it free for an
/// instance that joins, so three instances share 11.
const LIMIT: u32 = 12;
const INSTANCES: usize = 3;
const CLIENTS: usize = 20;

async fn pg() -> PgServer {
    tokio::task::spawn_blocking(|| PgServer::start(PgOptions::default())).await.unwrap().expect("start postgres")
}

/// Servers an instance holds now (opened less closed, from SHOW POOLS).
async fn servers(w: &WeirProcess) -> Option<u32> {
    let out = w.admin("SHOW POOLS").await.ok()?;
    let pools = rows(&out);
    let row = pools.iter().find(|r| r["user"] == SCRAM_USER)?;
    let n = |k: &str| row[k].parse::<i64>().ok();
    u32::try_from(n("sv_opened")? - n("sv_closed")?).ok()
}

/// `CLIENTS` clients on `w` running short queries until `stop`; each
/// completed query counted in `done`, each failed one in `failed`.
async fn load(w: &WeirProcess, stop: Arc<AtomicBool>, done: Arc<AtomicU64>, failed: Arc<AtomicU64>) {
    let url = w.url(SCRAM_USER, SCRAM_PASS);
    for _ in 0..CLIENTS {
        let client = connect(&url).await.expect("login through weir");
        let (stop, done, failed) = (stop.clone(), done.clone(), failed.clone());
        tokio::spawn(async move {
            while !stop.load(Ordering::Relaxed) {
                if client.simple_query("select pg_sleep(0.01)").await.is_err() {
                    // Its weir was killed (or the query failed): counted, and
                    // the client stops.
                    failed.fetch_add(1, Ordering::Relaxed);
                    return;
                }
                done.fetch_add(1, Ordering::Relaxed);
            }
        });
    }
}

struct Fleet {
    _pg: PgServer,
    weirs: Vec<WeirProcess>,
    stop: Arc<AtomicBool>,
    done: Vec<Arc<AtomicU64>>,
    failed: Vec<Arc<AtomicU64>>,
}

/// Three weirs with pools of 10 and fleet_share, under the same load.
async fn fleet() -> Fleet {
    let pg = pg().await;
    pg.psql("app", &format!("alter role {SCRAM_USER} connection limit {LIMIT}")).unwrap();
    let mut weirs = Vec::new();
    for _ in 0..INSTANCES {
        weirs.push(WeirProcess::start(&pg, "query_wait_timeout = \"20s\"", "pool_size = 10\nfleet_share = true").await);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let done: Vec<_> = (0..INSTANCES).map(|_| Arc::new(AtomicU64::new(0))).collect();
    let failed: Vec<_> = (0..INSTANCES).map(|_| Arc::new(AtomicU64::new(0))).collect();
    for (i, w) in weirs.iter().enumerate() {
        load(w, stop.clone(), done[i].clone(), failed[i].clone()).await;
    }
    Fleet { _pg: pg, weirs, stop, done, failed }
}

/// Polls `f` until it holds or `limit` passes; how long it took.
async fn within<F, Fut>(limit: Duration, mut f: F) -> Option<Duration>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    while start.elapsed() < limit {
        if f().await {
            return Some(start.elapsed());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    None
}

/// Each instance ends with its share (3 or 4 of the 11), nothing fails, and
/// the queries each completed are within 20% of the mean: the first to burst
/// does not keep the budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_weirs_share_a_role_limit_fairly() {
    weir_e2e::exclusive(120, fairness()).await;
}

async fn fairness() {
    let f = fleet().await;
    // The shares settle; then the counted window.
    let settled = within(Duration::from_secs(20), || async {
        let mut counts = Vec::new();
        for w in &f.weirs {
            counts.push(servers(w).await.unwrap_or(0));
        }
        counts.iter().all(|n| (3..=4).contains(n))
    })
    .await;
    assert!(settled.is_some(), "the servers never settled at the shares");
    let before: Vec<u64> = f.done.iter().map(|d| d.load(Ordering::Relaxed)).collect();
    tokio::time::sleep(Duration::from_secs(6)).await;
    let counts: Vec<u64> = f.done.iter().zip(&before).map(|(d, b)| d.load(Ordering::Relaxed) - b).collect();
    let mut held = Vec::new();
    for w in &f.weirs {
        held.push(servers(w).await.unwrap());
    }
    f.stop.store(true, Ordering::Relaxed);
    eprintln!("queries per instance over 6 s: {counts:?}; servers at the end: {held:?}");
    for (i, failed) in f.failed.iter().enumerate() {
        assert_eq!(failed.load(Ordering::Relaxed), 0, "instance {i} had failed queries");
    }
    for n in &held {
        assert!((3..=4).contains(n), "each instance holds its share of 11: {held:?}");
    }
    let mean = counts.iter().sum::<u64>() as f64 / counts.len() as f64;
    for c in &counts {
        assert!((*c as f64 - mean).abs() <= 0.2 * mean, "within 20% of the mean {mean}: {counts:?}");
    }
    let text = f.weirs[0].metrics();
    assert_eq!(metric(&text, "weir_fleet_instances", &[]), 3.0, "{text}");
    assert!((3.0..=4.0).contains(&metric(&text, "weir_fleet_share", &[])), "{text}");
}

/// A killed instance's connections close and its announcement goes with
/// them: the other two take up its share, back to the fleet's budget.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_weirs_share_goes_to_the_others() {
    weir_e2e::exclusive(120, killed()).await;
}

async fn killed() {
    let mut f = fleet().await;
    let settled = within(Duration::from_secs(20), || async {
        let mut sum = 0;
        for w in &f.weirs[..2] {
            sum += servers(w).await.unwrap_or(0);
        }
        sum <= 8
    })
    .await;
    assert!(settled.is_some(), "the first two never came down to their shares");
    let mut gone = f.weirs.pop().unwrap();
    gone.signal("KILL");
    gone.wait_exit(Duration::from_secs(5)).await.expect("the weir ended");
    let took = within(Duration::from_secs(10), || async {
        let mut sum = 0;
        for w in &f.weirs {
            sum += servers(w).await.unwrap_or(0);
        }
        sum == LIMIT - 1
    })
    .await;
    f.stop.store(true, Ordering::Relaxed);
    let took = took.expect("the two left take up the freed share");
    eprintln!("the freed share was taken up in {took:?}");
    for (i, failed) in f.failed[..2].iter().enumerate() {
        assert_eq!(failed.load(Ordering::Relaxed), 0, "instance {i} had failed queries");
    }
}
