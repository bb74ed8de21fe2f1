//! The console against PgBouncer's: Debian's PgBouncer and weir run on the
//! same Postgres, every SHOW runs on both, and weir's columns must start
//! with PgBouncer's (same names, order and type OIDs). Then the figures
//! PgBouncer's tools read are real: bytes, query time, a client's wait,
//! and averages over the last stats_period.

use std::collections::HashMap;
use std::time::Duration;

use weir_e2e::pgbouncer::{describe, Described, PgBouncer};
use weir_e2e::process::{rows, WeirProcess, ADMIN_PASS, ADMIN_USER};
use weir_e2e::{connect, PgOptions, PgServer, SCRAM_PASS, SCRAM_USER};

/// Every SHOW of PgBouncer (1.23's list).
const SHOWS: &[&str] = &[
    "STATS",
    "STATS_TOTALS",
    "STATS_AVERAGES",
    "TOTALS",
    "POOLS",
    "CLIENTS",
    "SERVERS",
    "DATABASES",
    "USERS",
    "CONFIG",
    "LISTS",
    "MEM",
    "SOCKETS",
    "ACTIVE_SOCKETS",
    "DNS_HOSTS",
    "DNS_ZONES",
    "FDS",
    "STATE",
    "VERSION",
    "HELP",
];

async fn pg() -> PgServer {
    tokio::task::spawn_blocking(|| PgServer::start(PgOptions::default())).await.unwrap().expect("start postgres")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_show_starts_with_pgbouncers_columns_and_types() {
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "", "").await;
    let c = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    c.simple_query("select 1").await.unwrap();
    let bouncer = PgBouncer::start(pg.port(), ADMIN_USER).expect("Debian's pgbouncer (scripts/install-deps.sh)");

    let (port, weir_port) = (bouncer.port, w.port);
    let theirs: HashMap<_, _> =
        tokio::task::spawn_blocking(move || describe(port, ADMIN_USER, "", SHOWS)).await.unwrap().into_iter().collect();
    let ours: HashMap<_, _> = tokio::task::spawn_blocking(move || describe(weir_port, ADMIN_USER, ADMIN_PASS, SHOWS))
        .await
        .unwrap()
        .into_iter()
        .collect();
    let mut compared = Vec::new();
    for show in SHOWS {
        let Some(Described::Columns(ours)) = ours.get(*show) else {
            panic!("weir's SHOW {show} gave no result set: {:?}", ours.get(*show));
        };
        match theirs.get(*show).expect("pgbouncer answered") {
            Described::Columns(theirs) => {
                let head: Vec<_> = ours.iter().take(theirs.len()).cloned().collect();
                assert_eq!(&head, theirs, "SHOW {show}: weir's columns must start with PgBouncer's");
                compared.push(*show);
            }
            // PgBouncer's SHOW HELP is notices only: no columns to match.
            Described::NoRows => assert_eq!(*show, "HELP"),
            // A command this PgBouncer lacks (1.18 has no SHOW STATE).
            Described::Error(e) => assert!(e.contains("invalid command"), "SHOW {show} on pgbouncer: {e}"),
        }
    }
    assert!(compared.len() >= 18, "compared only {compared:?}");
}

/// The `app` row of a SHOW.
async fn app_row(w: &WeirProcess, show: &str) -> HashMap<String, String> {
    let out = w.admin(show).await.unwrap();
    rows(&out).into_iter().find(|r| r["database"] == "app").unwrap_or_else(|| panic!("{show}: no app row: {out}"))
}

fn num(row: &HashMap<String, String>, col: &str) -> u64 {
    row[col].parse().unwrap_or_else(|_| panic!("{col} in {row:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_query_time_and_waits_are_counted() {
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "stats_period = \"1s\"", "pool_size = 1").await;
    let c = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    let sql = "select repeat('x', 1000), pg_sleep(0.05)";
    c.simple_query(sql).await.unwrap();
    let stats = app_row(&w, "SHOW STATS").await;
    assert!(num(&stats, "total_received") >= sql.len() as u64, "{stats:?}");
    assert!(num(&stats, "total_sent") >= 1000, "{stats:?}");
    assert!(num(&stats, "total_query_time") >= 50_000, "pg_sleep(0.05) is 50 ms of query time: {stats:?}");
    let totals = app_row(&w, "SHOW STATS_TOTALS").await;
    assert_eq!(totals["bytes_received"], stats["total_received"], "{totals:?}");

    // The averages cover the last completed stats_period (1 s here).
    let mut seen = false;
    for _ in 0..40 {
        c.simple_query("select 1").await.unwrap();
        let avg = app_row(&w, "SHOW STATS_AVERAGES").await;
        if num(&avg, "query_count") > 0 && num(&avg, "bytes_received") > 0 {
            seen = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(seen, "averages over the last period appear once one completes");
    // After a quiet period, they fall back to zero: not weir's lifetime.
    let mut quiet = false;
    for _ in 0..60 {
        tokio::time::sleep(Duration::from_millis(100)).await;
        if num(&app_row(&w, "SHOW STATS_AVERAGES").await, "query_count") == 0 {
            quiet = true;
            break;
        }
    }
    assert!(quiet, "a period without queries averages zero");
    assert!(num(&app_row(&w, "SHOW STATS").await, "total_query_count") >= 2, "totals stay");

    // A client queued behind the only server shows its wait.
    let busy = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    let holder = tokio::spawn(async move { c.simple_query("select pg_sleep(2)").await.map(|_| c) });
    tokio::time::sleep(Duration::from_millis(300)).await;
    let queued = tokio::spawn(async move { busy.simple_query("select 2").await.map(|_| busy) });
    let mut waited = None;
    for _ in 0..40 {
        tokio::time::sleep(Duration::from_millis(50)).await;
        let clients = rows(&w.admin("SHOW CLIENTS").await.unwrap());
        if let Some(r) = clients.iter().find(|r| r["state"] == "waiting" && r["database"] == "app") {
            let us = num(r, "wait") * 1_000_000 + num(r, "wait_us");
            if us > 0 {
                waited = Some(r.clone());
                break;
            }
        }
    }
    let waited = waited.expect("a waiting client with its wait so far");
    assert_eq!(waited["close_needed"], "0");
    assert!(!waited["request_time"].is_empty(), "{waited:?}");
    holder.await.unwrap().unwrap();
    queued.await.unwrap().unwrap();
    let stats = app_row(&w, "SHOW STATS").await;
    assert!(num(&stats, "total_wait_time") > 0, "{stats:?}");
}
