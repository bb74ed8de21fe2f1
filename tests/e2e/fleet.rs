//! weir in front of a Postgres whose connection budget is the limit: a
//! connect refused with 53300 (too many connections) is backpressure. The
//! pool backs off with jitter, its clients wait within their budget and are
//! served from the servers it holds; refusals are counted by the limit
//! Postgres named on /metrics and in SHOW POOLS.

use std::time::{Duration, Instant};

use futures_util::future::join_all;
use weir_e2e::process::{metric, rows, WeirProcess};
use weir_e2e::{connect, pg, SCRAM_PASS, SCRAM_USER};

/// The role may hold 2 connections; weir's pool wants 6 for 8 busy clients.
/// Every query succeeds on the 2 servers weir gets, the refused connects
/// back off (no storm: a burst, then at most a few a second), and they are
/// counted as role_limit refusals, not as connect failures.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_role_limit_is_backpressure_not_failure() {
    let pg = pg().await;
    pg.psql("app", &format!("alter role {SCRAM_USER} connection limit 2")).unwrap();
    let w = WeirProcess::start(&pg, "query_wait_timeout = \"10s\"", "pool_size = 6").await;
    let url = w.url(SCRAM_USER, SCRAM_PASS);
    let clients = join_all((0..8).map(|_| connect(&url))).await;
    let clients: Vec<_> = clients.into_iter().map(|c| c.expect("login through weir")).collect();
    let started = Instant::now();
    let results = join_all(clients.iter().map(|c| async move {
        for _ in 0..15 {
            c.simple_query("select pg_sleep(0.02)").await?;
        }
        Ok::<_, tokio_postgres::Error>(())
    }))
    .await;
    let took = started.elapsed();
    for r in results {
        r.expect("every query is served within its budget");
    }
    let pids = pg.psql("app", &format!("select pid from pg_stat_activity where usename = '{SCRAM_USER}'")).unwrap();
    assert!(pids.lines().filter(|l| !l.trim().is_empty()).count() <= 2, "{pids}");

    let text = w.metrics();
    let refused = metric(&text, "weir_server_connect_refused_total", &[("reason", "role_limit")]);
    let burst = 6.0;
    assert!(refused >= 1.0, "the refusals are counted by reason:\n{text}");
    assert!(refused <= burst + 5.0 * took.as_secs_f64(), "{refused} refusals in {took:?}: a retry storm");
    assert_eq!(metric(&text, "weir_server_connect_failures_total", &[]), 0.0, "53300 is not a connect failure");
    let pools = rows(&w.admin("SHOW POOLS").await.unwrap());
    let row = pools.iter().find(|r| r["user"] == SCRAM_USER).expect("pool row");
    assert_eq!(row["connect_refused"].parse::<f64>().unwrap(), refused, "{row:?}");
    assert!(w.logs().contains("too many connections"), "the refusal is logged");
}

/// A pool that has never connected, refused because the role's limit is
/// held elsewhere: the login waits (within query_wait_timeout) instead of
/// failing at once, and is served when a connection of the role goes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_first_login_refused_for_the_limit_waits_for_room() {
    let pg = pg().await;
    pg.psql("app", &format!("alter role {SCRAM_USER} connection limit 1")).unwrap();
    let w = WeirProcess::start(&pg, "query_wait_timeout = \"10s\"", "").await;
    let direct = format!("postgres://{SCRAM_USER}:{SCRAM_PASS}@127.0.0.1:{}/app", pg.port());
    let holder = connect(&direct).await.expect("the role's one connection");
    let url = w.url(SCRAM_USER, SCRAM_PASS);
    let login = tokio::spawn(async move {
        let c = connect(&url).await?;
        c.simple_query("select 1").await?;
        Ok::<_, tokio_postgres::Error>(Instant::now())
    });
    let refused = || metric(&w.metrics(), "weir_server_connect_refused_total", &[("reason", "role_limit")]) >= 1.0;
    assert!(weir_e2e::eventually(weir_e2e::WAIT_LIMIT, refused).await, "a connect refused for the role's limit");
    assert!(!login.is_finished(), "the login waits while the role is at its limit");
    drop(holder);
    let released = Instant::now();
    let served = tokio::time::timeout(weir_e2e::WAIT_LIMIT, login).await.expect("served in time").unwrap();
    let served = served.expect("the waiting login is served once there is room");
    // Short: well within query_wait_timeout (10 s), with room for a loaded machine.
    assert!(served.duration_since(released) < Duration::from_secs(5), "back-off stays short");
    let text = w.metrics();
    assert!(metric(&text, "weir_server_connect_refused_total", &[("reason", "role_limit")]) >= 1.0, "{text}");
}
