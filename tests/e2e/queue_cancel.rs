//! Cancels of queued queries, the cancel race, and the FIFO that skips
//! waiters who left.

use std::time::{Duration, Instant};

use tokio_postgres::NoTls;
use weir_e2e::{sqlstate, Harness, Opts, SCRAM_USER};
use weir_metrics::{CancelOutcome, DropReason};

use super::{create_ledger, hold_server, ledger_ids, trust_opts, until_waiting};
use weir_e2e::raw;

/// Queued cancel (tokio-postgres): B's queued INSERT is cancelled; B gets
/// 57014 within 100 ms of the cancel call, the cancel socket closes, the row
/// never appears, and B's connection keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_cancel_answers_57014_and_the_query_never_runs() {
    let _alone = weir_e2e::serial().await;
    let h = Harness::start(Opts { pool_size: 1, ..Opts::default() }).await;
    let direct = create_ledger(&h).await;
    let (a, a_pid) = hold_server(&h).await;
    let b = h.client().await;
    let token = b.cancel_token();
    let queued = tokio::spawn(async move {
        let r = b.execute("insert into ledger(id) values (1)", &[]).await;
        (r, Instant::now(), b)
    });
    until_waiting(&h, 1).await;

    let asked = Instant::now();
    token.cancel_query(NoTls).await.expect("the cancel socket is answered and closed");
    let (r, answered, b) = tokio::time::timeout(Duration::from_secs(5), queued).await.expect("B is answered").unwrap();
    let err = r.expect_err("a cancelled query fails");
    assert_eq!(sqlstate(&err).as_deref(), Some("57014"), "{err}");
    let took = answered.duration_since(asked);
    assert!(took < Duration::from_millis(100), "57014 took {took:?}");

    a.batch_execute("commit").await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(ledger_ids(&direct).await.is_empty(), "the cancelled INSERT ran");
    let pid: i32 = b.query_one("select pg_backend_pid()", &[]).await.unwrap().get(0);
    assert_eq!(pid, a_pid, "B runs on the pool's one server afterwards");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(ledger_ids(&direct).await.is_empty(), "the cancelled INSERT ran late");

    let m = &h.pool().metrics;
    assert_eq!(m.dropped_queries(DropReason::Cancelled), 1);
    assert_eq!(m.opened(), 1, "no server was opened for the cancel");
    assert_eq!(h.weir().shared().cancels.metrics.cancels(CancelOutcome::AnsweredLocally), 1);
}

/// Queued cancel (raw socket, simple protocol, several queued clients): each
/// gets ErrorResponse 57014 then ReadyForQuery, the CancelRequest socket is
/// closed by weir without a byte, and no row appears.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn queued_cancel_over_raw_sockets_keeps_each_connection() {
    let _alone = weir_e2e::serial().await;
    let h = Harness::start(trust_opts(1)).await;
    let direct = create_ledger(&h).await;
    let (a, _) = hold_server(&h).await;
    let mut raws = Vec::new();
    for id in 0..5 {
        let mut r = super::raw_login(&h, SCRAM_USER, &[]).await.unwrap();
        r.send_query(&format!("insert into ledger(id) values ({id})")).await.unwrap();
        raws.push(r);
    }
    until_waiting(&h, 5).await;
    for r in raws.iter_mut() {
        let asked = Instant::now();
        raw::cancel(h.addr(), r.key()).await.expect("cancel socket closed without an answer");
        let reply = r.reply().await.unwrap();
        assert_eq!(reply.code(), Some("57014"), "{reply:?}");
        assert_eq!(reply.status, b'I');
        assert!(asked.elapsed() < Duration::from_millis(100), "took {:?}", asked.elapsed());
    }
    assert_eq!(h.pool().snapshot().waiting, 0);
    a.batch_execute("commit").await.unwrap();
    for r in raws.iter_mut() {
        let reply = r.query("select 7").await.unwrap();
        assert_eq!(reply.scalar(), Some("7"), "{reply:?}");
    }
    assert!(ledger_ids(&direct).await.is_empty());
    assert_eq!(h.pool().metrics.dropped_queries(DropReason::Cancelled), 5);
}

/// FIFO, skipping the dead: W1 queues and leaves, W2 and W3 stay. When the
/// holder commits, the server goes to W2 promptly, then to W3; W1's query
/// never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_oldest_waiter_still_there_gets_the_server() {
    let _alone = weir_e2e::serial().await;
    let h = Harness::start(trust_opts(1)).await;
    let direct = create_ledger(&h).await;
    let (a, _) = hold_server(&h).await;
    let mut w1 = super::raw_login(&h, SCRAM_USER, &[]).await.unwrap();
    w1.send_query("insert into ledger(id) values (71)").await.unwrap();
    until_waiting(&h, 1).await;
    let mut w2 = super::raw_login(&h, SCRAM_USER, &[]).await.unwrap();
    w2.send_query("insert into ledger(id) values (72)").await.unwrap();
    until_waiting(&h, 2).await;
    let mut w3 = super::raw_login(&h, SCRAM_USER, &[]).await.unwrap();
    w3.send_query("insert into ledger(id) values (73)").await.unwrap();
    until_waiting(&h, 3).await;
    w1.reset();
    until_waiting(&h, 2).await;

    let released = Instant::now();
    a.batch_execute("commit").await.unwrap();
    let r2 = w2.reply().await.unwrap();
    assert_eq!(r2.error, None);
    assert!(released.elapsed() < Duration::from_millis(500), "W2 waited {:?}", released.elapsed());
    let r3 = w3.reply().await.unwrap();
    assert_eq!(r3.error, None);
    assert_eq!(ledger_ids(&direct).await, vec![72, 73], "W2 first, W3 next, W1 never");
    assert_eq!(h.pool().metrics.dropped_queries(DropReason::ClientGone), 1);
}

/// Cancels in the interleaved half of `cancels_for_one_client_never_hit_the_next`.
const INTERLEAVED: usize = 20;

/// PgBouncer's test_cancel_race pattern (pool size 1): 50 cancels for
/// client 1 fired at once at a running query, then 20 more, each at one of
/// client 1's queries seen running, while client 2 keeps reusing the same
/// server. Client 2 never sees 57014; each of client 1's queries does.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_for_one_client_never_hit_the_next() {
    let _alone = weir_e2e::serial().await;
    let h = Harness::start(Opts { pool_size: 1, ..Opts::default() }).await;
    let c1 = h.client().await;
    let c2 = h.client().await;
    let token = c1.cancel_token();

    // Burst: 50 cancels at once at a running pg_sleep while client 2 waits for the server.
    let running = tokio::spawn(async move {
        let r = c1.simple_query("select pg_sleep(5)").await;
        (r, c1)
    });
    let started = weir_e2e::eventually(Duration::from_secs(5), || h.pool().snapshot().active == 1).await;
    assert!(started, "client 1's sleep never took the server: {:?}", h.pool().snapshot());
    let c2_task = tokio::spawn(async move {
        for _ in 0..20 {
            if let Err(e) = c2.simple_query("select pg_sleep(0.01)").await {
                panic!("client 2 failed (sqlstate {:?}): {e}", sqlstate(&e));
            }
        }
        c2
    });
    until_waiting(&h, 1).await;
    let burst: Vec<_> = (0..50)
        .map(|_| {
            let t = token.clone();
            tokio::spawn(async move { t.cancel_query(NoTls).await })
        })
        .collect();
    for b in burst {
        b.await.unwrap().expect("cancel request accepted");
    }
    let (r, c1) = running.await.unwrap();
    assert_eq!(r.map(|_| ()).err().and_then(|e| sqlstate(&e)).as_deref(), Some("57014"), "client 1 was cancelled");

    // Interleaved: client 2 loops on short queries on the same server while
    // client 1 runs 20 sleeps, each cancelled once it is seen running on
    // Postgres; every cancel lands on client 1's query, none on client 2's.
    let c2 = c2_task.await.expect("client 2 never saw 57014 during the burst");
    let direct = h.direct().await;
    let c2_loop = tokio::spawn(async move {
        for _ in 0..60 {
            if let Err(e) = c2.simple_query("select pg_sleep(0.005)").await {
                panic!("client 2 failed (sqlstate {:?}): {e}", sqlstate(&e));
            }
        }
    });
    let mut seen = 0;
    for _ in 0..INTERLEAVED {
        let sleeping = c1.simple_query("select pg_sleep(30)");
        let cancel = async {
            let running =
                "select count(*) from pg_stat_activity where query = 'select pg_sleep(30)' and state = 'active'";
            let end = Instant::now() + Duration::from_secs(10);
            while direct.query_one(running, &[]).await.unwrap().get::<_, i64>(0) != 1 {
                assert!(Instant::now() < end, "client 1's sleep never ran");
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
            token.cancel_query(NoTls).await.expect("cancel request accepted");
        };
        let (r, ()) = tokio::join!(sleeping, cancel);
        match r {
            Err(e) if sqlstate(&e).as_deref() == Some("57014") => seen += 1,
            other => panic!("client 1's sleep was not cancelled: {other:?}"),
        }
    }
    c2_loop.await.expect("client 2 never saw 57014");
    assert_eq!(seen, INTERLEAVED, "each cancel stopped client 1's running query");
    assert_eq!(h.pool().metrics.closed_total(), 0, "no server was closed");
}
