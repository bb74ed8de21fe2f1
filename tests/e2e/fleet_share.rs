//! Several weirs in front of one Postgres whose role limit is the budget,
//! with fleet_share: each instance's servers converge to its share of the
//! budget, the instances serve a like load alike, and a killed instance's
//! share goes to the others. An announcement a client released on its
//! server is taken again.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_e2e::process::{metric, rows, WeirProcess};
use weir_e2e::{connect, pg, PgServer, SCRAM_PASS, SCRAM_USER};

/// The role's CONNECTION LIMIT; the fleet keeps one slot of it free for an
/// instance that joins, so three instances share 11.
const LIMIT: u32 = 12;
const INSTANCES: usize = 3;
const CLIENTS: usize = 20;

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
    // The share while loaded (once the load stops, the demand and so the
    // shares change).
    let pools = rows(&f.weirs[0].admin("SHOW POOLS").await.unwrap());
    let row = pools.iter().find(|r| r["user"] == SCRAM_USER).expect("pool row").clone();
    f.stop.store(true, Ordering::Relaxed);
    eprintln!("queries per instance over 6 s: {counts:?}; servers at the end: {held:?}");
    assert_eq!(row["fleet_instances"], "3", "{row:?}");
    assert!(matches!(row["fleet_share"].as_str(), "3" | "4"), "{row:?}");
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

/// The weir announcements (advisory locks whose key's top byte is `W`)
/// held by backends of the scram role, read directly from Postgres.
async fn announcements(direct: &tokio_postgres::Client) -> i64 {
    let sql = format!(
        "select count(*) from pg_locks l join pg_stat_activity a on a.pid = l.pid \
         where l.locktype = 'advisory' and l.granted and l.classid::int8 >> 24 = 87 and a.usename = '{SCRAM_USER}'"
    );
    direct.query_one(&sql, &[]).await.unwrap().get(0)
}

/// The announcement is a session-level advisory lock on a server that
/// clients use too. A client on it may release it (here with
/// pg_advisory_unlock_all(), inside its transaction, when no round can run
/// on that server); the next round takes it again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_announcement_a_client_released_is_taken_again() {
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "", "pool_size = 1\nfleet_share = true").await;
    let direct = connect(&format!("postgres://postgres@127.0.0.1:{}/app", pg.port())).await.unwrap();
    let c = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    c.simple_query("select 1").await.unwrap();
    let taken = within(Duration::from_secs(10), || async { announcements(&direct).await == 1 }).await;
    assert!(taken.is_some(), "the pool's one server carries its announcement");

    let out = c
        .simple_query(
            "begin; select pg_catalog.pg_advisory_unlock_all(); \
             select count(*) from pg_catalog.pg_locks where locktype = 'advisory' and pid = pg_catalog.pg_backend_pid()",
        )
        .await
        .unwrap();
    let held: Vec<&str> = out
        .iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0),
            _ => None,
        })
        .collect();
    assert_eq!(held.last(), Some(&"0"), "the client released the announcement on its server: {held:?}");
    assert_eq!(announcements(&direct).await, 0, "no announcement while the client's transaction holds the server");
    c.simple_query("commit").await.unwrap();
    let again = within(Duration::from_secs(10), || async { announcements(&direct).await == 1 }).await;
    assert!(again.is_some(), "the next round takes the announcement again");
    c.simple_query("select 1").await.expect("the client is served as before");
}
