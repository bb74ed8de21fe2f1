//! The watchdog against a real Postgres behind the fault relay: a frozen path
//! with a query in flight (whole relay frozen, and only the existing
//! connections frozen), a frozen idle connection caught by server_check, a
//! slow query that the silence probe must leave alone, query_timeout (cancel
//! and keep the connection; on a frozen path, close it), and
//! idle_transaction_timeout.

use std::time::{Duration, Instant};

use tokio_postgres::Client;
use weir_e2e::liveness::{
    clients, connect_within, describe, direct_db_url, exclusive, harness_with_direct_db, one, pid, run_each,
    running_like, watched_client,
};
use weir_e2e::{eventually, sqlstate, Harness, Opts, MD5_PASS, MD5_USER, SCRAM_PASS, SCRAM_USER};
use weir_metrics::CloseReason;

fn relayed(pool_size: u32, general: &str) -> Opts {
    Opts { pool_size, relay: true, general: general.into(), ..Default::default() }
}

/// Waits until Postgres shows `needle` running for some backend, asked over
/// `direct`, opened before the query starts: a login to Postgres on a loaded
/// machine can outlast the short windows these tests have.
async fn running(direct: &Client, needle: &str) {
    running_like(direct, needle).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_path_with_a_query_in_flight_fails_only_that_client() {
    exclusive(60, async {
        let general = "server_check_silence = \"1s\"\nserver_connect_timeout = \"1s\"";
        let h = harness_with_direct_db(relayed(3, general)).await;
        let relay = h.relay.as_ref().unwrap();
        let c = h.client().await;
        let other = weir_e2e::connect(&direct_db_url(&h)).await.expect("other pool");
        pid(&other).await.unwrap();
        let direct = h.direct().await;
        let t0 = Instant::now();
        let q = tokio::spawn(async move { c.simple_query("select pg_sleep(3)").await.map(|_| ()) });
        running(&direct, "pg_sleep(3)").await;
        relay.freeze();
        let e = q.await.unwrap().expect_err("a frozen path ends in an error");
        let took = t0.elapsed();
        println!("frozen path: error after {took:?}: {}", describe(&e));
        assert_eq!(sqlstate(&e).as_deref(), Some("08006"), "{e}");
        // Bound: silence (1 s) + probe connect (1 s), plus slack for a loaded
        // machine; without the watchdog the query would hang.
        assert!(took >= Duration::from_secs(1) && took < Duration::from_secs(4), "{took:?}");
        for _ in 0..3 {
            pid(&other).await.expect("another pool is unaffected");
        }
        assert_eq!(h.pool().metrics.closed(CloseReason::Unresponsive), 1);
        relay.thaw();
        let fresh = h.client().await;
        pid(&fresh).await.expect("a replacement serves after the thaw");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_dead_path_under_many_queries_costs_a_few_probes() {
    exclusive(60, async {
        let general = "server_check_silence = \"1s\"\nserver_connect_timeout = \"1s\"";
        let h = Harness::start(relayed(10, general)).await;
        let relay = h.relay.as_ref().unwrap();
        let clients = clients(&h.url(SCRAM_USER, SCRAM_PASS), 10).await;
        let queries = run_each(clients.into_iter().map(Box::new), "select pg_sleep(5)");
        assert!(eventually(weir_e2e::WAIT_LIMIT, || h.pool().snapshot().active == 10).await);
        running(&h.direct().await, "pg_sleep(5)").await;
        let before = relay.connections_accepted();
        // Timed from the freeze: reaching it (ten queries running) is not the bound.
        let t0 = Instant::now();
        relay.freeze();
        for q in queries {
            let e = q.await.unwrap().expect_err("every query on the dead path fails");
            assert_eq!(sqlstate(&e).as_deref(), Some("08006"), "{}", describe(&e));
        }
        let took = t0.elapsed();
        let probes = relay.connections_accepted() - before;
        println!("10 queries on a dead path: all failed after {took:?}, with {probes} probe connections");
        assert!(took < Duration::from_millis(3500), "{took:?}");
        assert!(probes <= 4, "probes are bounded and a dead address is remembered: {probes}");
        assert_eq!(h.pool().metrics.closed(CloseReason::Unresponsive), 10);
        relay.thaw();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn lost_answer_on_a_frozen_connection_is_detected_by_the_probe() {
    exclusive(60, async {
        let h = Harness::start(relayed(3, "server_check_silence = \"1s\"")).await;
        let relay = h.relay.as_ref().unwrap();
        let c = h.client().await;
        let direct = h.direct().await;
        let t0 = Instant::now();
        let q = tokio::spawn(async move { c.simple_query("select pg_sleep(0.5)").await.map(|_| ()) });
        running(&direct, "pg_sleep(0.5)").await;
        // Old connections die silently; new ones get through (a NAT that lost its mappings).
        relay.freeze_existing();
        let other =
            connect_within(&h.url(MD5_USER, MD5_PASS), Duration::from_secs(5)).await.expect("another pool logs in");
        pid(&other).await.expect("another pool is unaffected");
        let e = q.await.unwrap().expect_err("the answer never came");
        let took = t0.elapsed();
        println!("lost answer: error after {took:?}: {}", describe(&e));
        assert_eq!(sqlstate(&e).as_deref(), Some("08006"), "{e}");
        // Sleep (0.5 s) + silence (1 s) + probe, with slack for a loaded
        // machine; without the probe the client would wait forever.
        assert!(took < Duration::from_secs(4), "{took:?}");
        let fresh = h.client().await;
        pid(&fresh).await.expect("a replacement opens over the new path");
        assert_eq!(h.pool().metrics.closed(CloseReason::Unresponsive), 1);
        relay.thaw();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_query_survives_the_silence_probe() {
    exclusive(60, async {
        let h = Harness::start(relayed(2, "server_check_silence = \"300ms\"")).await;
        let c = h.client().await;
        c.simple_query("select pg_sleep(1.5)").await.expect("a working query is never killed by the probe");
        pid(&c).await.unwrap();
        assert_eq!(h.pool().metrics.closed_total(), 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn frozen_idle_connection_is_replaced_after_server_check() {
    exclusive(60, async {
        let general = "server_check_delay = \"200ms\"\nserver_check_timeout = \"500ms\"";
        let h = Harness::start(relayed(2, general)).await;
        let relay = h.relay.as_ref().unwrap();
        let c = h.client().await;
        let old = pid(&c).await.unwrap();
        // The scenario: idle past server_check_delay, so the next use checks it.
        tokio::time::sleep(Duration::from_millis(300)).await;
        relay.freeze_existing();
        let t0 = Instant::now();
        let new = tokio::time::timeout(Duration::from_secs(5), pid(&c)).await.expect("no hang").expect("served");
        let took = t0.elapsed();
        println!("frozen idle connection: served by a fresh one after {took:?}");
        assert_ne!(new, old, "served by a fresh connection");
        // Far below the 5 s that would mean a hang, with room for a loaded machine.
        assert!(took < Duration::from_secs(3), "within server_check_timeout + connect time: {took:?}");
        assert_eq!(h.pool().metrics.closed(CloseReason::CheckFailed), 1);
        relay.thaw();
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_timeout_cancels_the_query_and_keeps_the_connection() {
    exclusive(60, async {
        let h =
            Harness::start(Opts { pool_size: 1, general: "query_timeout = \"500ms\"".into(), ..Default::default() })
                .await;
        let c = h.client().await;
        let before = pid(&c).await.unwrap();
        let t0 = Instant::now();
        let e = c.simple_query("select pg_sleep(5)").await.expect_err("cancelled");
        let took = t0.elapsed();
        println!("query_timeout: {took:?}: {}", describe(&e));
        assert_eq!(sqlstate(&e).as_deref(), Some("57014"), "{e}");
        // At query_timeout, not at the sleep's end (5 s); slack for a loaded machine.
        assert!(took >= Duration::from_millis(500) && took < Duration::from_secs(3), "{took:?}");
        assert_eq!(pid(&c).await.expect("the client keeps its connection"), before, "and the server is kept");
        // A transaction's statements each get their own clock.
        for sql in ["begin", "select pg_sleep(0.3)", "select pg_sleep(0.3)", "commit"] {
            c.simple_query(sql).await.expect("each statement under the limit");
        }
        assert_eq!(h.pool().metrics.closed_total(), 0);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_timeout_on_a_frozen_path_closes_the_server() {
    exclusive(60, async {
        let general = "query_timeout = \"500ms\"\nserver_check_timeout = \"500ms\"\nserver_check_silence = \"0s\"";
        let h = Harness::start(relayed(2, general)).await;
        let relay = h.relay.as_ref().unwrap();
        let c = h.client().await;
        pid(&c).await.unwrap();
        let direct = h.direct().await;
        let t0 = Instant::now();
        let q = tokio::spawn(async move { c.simple_query("select pg_sleep(2)").await.map(|_| ()) });
        running(&direct, "pg_sleep(2)").await;
        relay.freeze();
        let e = q.await.unwrap().expect_err("frozen");
        let took = t0.elapsed();
        println!("query_timeout on a frozen path: {took:?}: {}", describe(&e));
        assert_eq!(sqlstate(&e).as_deref(), Some("08006"), "{e}");
        assert!(describe(&e).contains("query_timeout"), "{}", describe(&e));
        // Without query_timeout the frozen query would hang; the upper bound
        // leaves a loaded machine room.
        assert!(
            took >= Duration::from_millis(1000) && took < Duration::from_secs(3),
            "query_timeout + grace: {took:?}"
        );
        assert!(eventually(weir_e2e::WAIT_LIMIT, || h.pool().metrics.closed(CloseReason::QueryTimeout) == 1).await);
        relay.thaw();
        let fresh = h.client().await;
        pid(&fresh).await.expect("a replacement serves");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn idle_transaction_timeout_disconnects_the_client_and_keeps_the_server() {
    exclusive(60, async {
        let h = Harness::start(Opts {
            pool_size: 1,
            general: "idle_transaction_timeout = \"500ms\"".into(),
            ..Default::default()
        })
        .await;
        let url = h.url(SCRAM_USER, SCRAM_PASS);
        // A busy transaction is not idle: each statement restarts the clock.
        let busy = h.client().await;
        busy.simple_query("begin").await.unwrap();
        for _ in 0..4 {
            tokio::time::sleep(Duration::from_millis(300)).await;
            one(&busy, "select 1").await.expect("an active transaction is left alone");
        }
        busy.simple_query("commit").await.unwrap();
        drop(busy);

        let (idle, conn) = watched_client(&url).await;
        idle.simple_query("begin").await.unwrap();
        let server = pid(&idle).await.unwrap();
        let t0 = Instant::now();
        let end = tokio::time::timeout(Duration::from_secs(5), conn).await.expect("disconnected in time").unwrap();
        let took = t0.elapsed();
        let e = end.expect_err("closed with an error");
        println!("idle in transaction: {took:?}: {}", describe(&e));
        assert_eq!(sqlstate(&e).as_deref(), Some("08P01"), "{e}");
        // At idle_transaction_timeout, with slack for a loaded machine (the wait is bounded at 5 s).
        assert!(took >= Duration::from_millis(450) && took < Duration::from_secs(3), "{took:?}");
        let next = weir_e2e::connect(&url).await.unwrap();
        assert_eq!(pid(&next).await.unwrap(), server, "the server was rolled back and kept");
        assert_eq!(
            one(&next, "select count(*) from pg_stat_activity where state like 'idle in transaction%'").await.unwrap(),
            "0"
        );
        assert_eq!(h.pool().metrics.closed_total(), 0);
    })
    .await;
}
