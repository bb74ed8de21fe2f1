//! `worker_threads = 2` in `[weir]`: the built binary runs a multi-thread
//! runtime, serves queries from clients spread over both workers, and keeps
//! one pool, one server limit and one set of counters across them.

use std::collections::HashMap;

use weir_e2e::process::{rows, WeirProcess};
use weir_e2e::{connect, pg, SCRAM_PASS, SCRAM_USER};

const CLIENTS: usize = 12;
const TXNS_EACH: u64 = 40;
const POOL_SIZE: u32 = 4;

/// Names of the weir process's threads (`/proc/PID/task/*/comm`).
fn thread_names(pid: u32) -> Vec<String> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .expect("the weir process's task list")
        .filter_map(|e| std::fs::read_to_string(e.ok()?.path().join("comm")).ok())
        .map(|s| s.trim().to_owned())
        .collect()
}

async fn pool_row(w: &WeirProcess) -> HashMap<String, String> {
    let out = w.admin("SHOW POOLS").await.unwrap();
    rows(&out).into_iter().find(|r| r["database"] == "app" && r["user"] == SCRAM_USER).expect("pool row")
}

fn num(row: &HashMap<String, String>, col: &str) -> u64 {
    row[col].parse().unwrap_or_else(|_| panic!("{col} in {row:?}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_worker_threads_serve_queries_with_one_pool_and_one_set_of_stats() {
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "worker_threads = 2", &format!("pool_size = {POOL_SIZE}")).await;
    // A new thread carries the process's name until tokio names it: look
    // again until the names come (or the wait limit ends).
    let end = std::time::Instant::now() + weir_e2e::WAIT_LIMIT;
    let workers = loop {
        let n = thread_names(w.pid()).iter().filter(|n| n.starts_with("tokio-r")).count();
        if n >= 2 || std::time::Instant::now() >= end {
            break n;
        }
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    };
    assert!(workers >= 2, "a multi-thread runtime with 2 workers, threads: {:?}", thread_names(w.pid()));

    let mut clients = Vec::new();
    for _ in 0..CLIENTS {
        clients.push(connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap());
    }
    let load = futures_util::future::join_all(clients.iter().map(|c| async move {
        for i in 0..TXNS_EACH as i64 {
            c.batch_execute("begin").await.unwrap();
            let row = c.query_one("select $1::int8 + 1", &[&i]).await.unwrap();
            assert_eq!(row.get::<_, i64>(0), i + 1);
            c.batch_execute("commit").await.unwrap();
        }
    }));
    // SHOW POOLS while the load runs: every client counted once, whichever
    // worker runs it, and never more servers than the pool allows.
    let watch = async {
        let mut seen = Vec::new();
        for _ in 0..5 {
            let p = pool_row(&w).await;
            seen.push((num(&p, "cl_active") + num(&p, "cl_waiting") + num(&p, "cl_idle"), servers(&p)));
        }
        seen
    };
    let (_, seen) = tokio::join!(load, watch);
    for (clients_seen, servers_seen) in &seen {
        assert_eq!(*clients_seen, CLIENTS as u64, "SHOW POOLS under load: {seen:?}");
        assert!(*servers_seen <= u64::from(POOL_SIZE), "SHOW POOLS under load: {seen:?}");
    }
    let backends =
        pg.psql("app", &format!("select count(*) from pg_stat_activity where usename = '{SCRAM_USER}'")).unwrap();
    assert!(backends.trim().parse::<u32>().unwrap() <= POOL_SIZE, "backends: {backends}");

    let stats = rows(&w.admin("SHOW STATS").await.unwrap());
    let app = stats.iter().find(|r| r["database"] == "app").expect("stats row");
    let xacts: u64 = app["total_xact_count"].parse().unwrap();
    assert!(xacts >= CLIENTS as u64 * TXNS_EACH, "total_xact_count {xacts}: {app:?}");
}

fn servers(p: &HashMap<String, String>) -> u64 {
    ["sv_active", "sv_idle", "sv_used", "sv_tested", "sv_login"].iter().map(|c| num(p, c)).sum()
}
