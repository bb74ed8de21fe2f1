//! The disconnect storm: 300 queued clients leave at once (RST, Terminate,
//! pgx's cancel-then-Terminate) while a pool of 20 is busy. Not one queued
//! query runs, not one server is lost or replaced.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures_util::future::join_all;
use tokio_postgres::Client;
use weir_e2e::{Harness, SCRAM_USER};
use weir_metrics::DropReason;

use super::{backends_until, create_ledger, ledger_ids, logins_of, trust_opts, until_waiting};
use weir_e2e::raw::Raw;

const POOL: u32 = 20;
const QUEUED: usize = 300;
/// What the holders run while the storm happens (cancelled afterwards).
const HOLD: &str = "select pg_sleep(120)";

/// (sessions, sessions_abandoned) of database `app` from pg_stat_database,
/// read over a connection to another database so the reading adds nothing.
fn session_counters(h: &Harness) -> (i64, i64) {
    let out = h
        .pg
        .psql("postgres", "select sessions || ' ' || sessions_abandoned from pg_stat_database where datname = 'app'")
        .unwrap();
    let mut it = out.split_whitespace().map(|v| v.parse::<i64>().unwrap());
    (it.next().unwrap(), it.next().unwrap())
}

async fn open_pool(h: &Harness) -> Vec<Client> {
    let holders = join_all((0..POOL).map(|_| h.client())).await;
    // All at once, long enough that every one needs its own server.
    join_all(holders.iter().map(|c| c.simple_query("select pg_sleep(0.5)"))).await.into_iter().for_each(|r| {
        r.unwrap();
    });
    assert_eq!(h.pool().metrics.opened(), POOL as u64);
    // Let every backend flush its session statistics before the baseline.
    tokio::time::sleep(Duration::from_millis(1500)).await;
    join_all(holders.iter().map(|c| c.simple_query("select 1"))).await;
    holders
}

async fn queue_clients(h: &Harness) -> Vec<Raw> {
    let mut raws = Vec::with_capacity(QUEUED);
    for chunk in (0..QUEUED).collect::<Vec<_>>().chunks(50) {
        let logins = join_all(chunk.iter().map(|_| super::raw_login(h, SCRAM_USER, &[]))).await;
        for (i, r) in chunk.iter().zip(logins) {
            let mut r = r.expect("queued client logs in");
            r.send_query(&format!("insert into ledger(id) values ({})", 1000 + i)).await.unwrap();
            raws.push(r);
        }
    }
    raws
}

/// Half leave with RST, half with Terminate; every third of those does what
/// pgx does (CancelRequest on a new socket, then Terminate).
async fn leave_all(h: &Harness, raws: Vec<Raw>) {
    let addr = h.addr();
    join_all(raws.into_iter().enumerate().map(|(i, r)| async move {
        if i % 2 == 0 {
            r.reset();
        } else if i % 3 == 0 {
            r.leave_like_pgx(addr).await.expect("pgx-style cancel");
        } else {
            r.terminate().await;
        }
    }))
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_storm_of_departing_queued_clients_costs_nothing() {
    let _alone = weir_e2e::serial().await;
    let h = Harness::start(trust_opts(POOL)).await;
    let direct = create_ledger(&h).await;
    let holders = open_pool(&h).await;
    let pids: BTreeSet<i32> = h.server_pids(SCRAM_USER).into_iter().collect();
    assert_eq!(pids.len(), POOL as usize, "{pids:?}");
    let logins_before = logins_of(&h, SCRAM_USER);
    let sessions_before = session_counters(&h);

    // The holders sleep until the storm is over and checked, then are
    // cancelled: a short sleep could end while 300 clients log in on a
    // loaded machine, and the queued INSERTs would rightly run.
    let sleeping = tokio::spawn(async move {
        join_all(holders.iter().map(|c| c.simple_query(HOLD))).await.into_iter().for_each(|r| {
            let e = r.expect_err("the holders' sleeps are cancelled");
            assert_eq!(weir_e2e::sqlstate(&e).as_deref(), Some("57014"), "{e}");
        });
        (Instant::now(), holders)
    });
    let busy = weir_e2e::eventually(weir_e2e::WAIT_LIMIT, || h.pool().snapshot().active == POOL).await;
    assert!(busy, "the holders never took every server: {:?}", h.pool().snapshot());
    let raws = queue_clients(&h).await;
    until_waiting(&h, QUEUED as u32).await;

    let leaving = Instant::now();
    leave_all(&h, raws).await;
    // Seen while every server is still busy: the sleeps end only below.
    let emptied = weir_e2e::eventually(weir_e2e::WAIT_LIMIT, || h.pool().snapshot().waiting == 0).await;
    assert!(emptied, "the queue still holds departed clients: {:?}", h.pool().snapshot());
    eprintln!("300 departures seen by weir within {:?}", leaving.elapsed());
    assert!(!sleeping.is_finished(), "the storm must happen while the pool is busy");

    let cancel = format!("select count(pg_cancel_backend(pid)) from pg_stat_activity where query = '{HOLD}'");
    direct.simple_query(&cancel).await.unwrap();
    let (woke, _holders) = sleeping.await.unwrap();
    let (settled, seen) =
        backends_until(&direct, weir_e2e::WAIT_LIMIT, |b| b.len() == POOL as usize && b.iter().all(|r| r.1 == "idle"))
            .await;
    assert!(settled, "servers not all idle after the sleeps ended: {seen:?}");
    eprintln!("all {POOL} backends idle {:?} after the sleeps ended", woke.elapsed());
    let after: BTreeSet<i32> = seen.iter().map(|r| r.0).collect();
    assert_eq!(after, pids, "the same backends, none replaced");
    assert!(!seen.iter().any(|r| r.1.starts_with("idle in transaction") || r.1 == "active"), "{seen:?}");

    nothing_ran_or_changed(&h, &direct, logins_before, sessions_before).await;
}

/// After the storm: no queued INSERT ran (then or late), Postgres saw no new
/// backend or session, no server was opened or closed, every departed query
/// was counted as dropped.
async fn nothing_ran_or_changed(
    h: &Harness,
    direct: &tokio_postgres::Client,
    logins_before: usize,
    sessions_before: (i64, i64),
) {
    assert!(ledger_ids(direct).await.is_empty(), "a departed client's queued INSERT ran");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(ledger_ids(direct).await.is_empty(), "a departed client's queued INSERT ran late");
    assert_eq!(logins_of(h, SCRAM_USER), logins_before, "Postgres saw new backends");
    assert_eq!(session_counters(h), sessions_before, "pg_stat_database counted new or abandoned sessions");
    let m = &h.pool().metrics;
    assert_eq!(m.closed_total(), 0, "a server was closed");
    assert_eq!(m.opened(), POOL as u64, "a server was opened");
    let dropped = m.dropped_queries(DropReason::ClientGone) + m.dropped_queries(DropReason::Cancelled);
    assert_eq!(dropped, QUEUED as u64, "every departed query is counted as dropped");
    assert_eq!(h.pool().snapshot().recovering, 0);
}
