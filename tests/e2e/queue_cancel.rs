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
    // Windows in which the cancelled INSERT must not run (nothing to wait for).
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

/// Client 1's sleep in round `round`. Each round's text is its own, so that
/// Postgres showing it active proves that this round's query runs: a backend
/// sends a cancelled query's error before it marks itself idle, so the
/// previous round's text can still show as active when the next round is
/// sent.
fn round_sleep(round: usize) -> String {
    format!("select pg_sleep(30), {round} as round")
}

/// Waits until Postgres runs `sql`.
async fn until_running(direct: &tokio_postgres::Client, sql: &str) {
    weir_e2e::until_running(direct, sql, 1).await
}

/// PgBouncer's test_cancel_race pattern (pool size 1): 50 cancels for
/// client 1 fired at once at a running query, then 20 more, each at one of
/// client 1's queries seen running, while client 2 keeps reusing the same
/// server. Client 2 never sees 57014; each of client 1's queries does.
///
/// Client 1 is a raw connection that, as libpq does, waits for each cancel
/// connection to be closed before it sends its next query: Postgres 16 and
/// older signal the backend twice for one CancelRequest (the process, then
/// its process group), and only the close says that both have happened, so
/// a client that goes on sooner can have its own next query cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancels_for_one_client_never_hit_the_next() {
    let _alone = weir_e2e::serial().await;
    let h = Harness::start(trust_opts(1)).await;
    let direct = h.direct().await;
    let mut c1 = super::raw_login(&h, SCRAM_USER, &[]).await.unwrap();
    let c2 = h.client().await;

    // Burst: 50 cancels at once at a running sleep while client 2 waits for the server.
    c1.send_query(&round_sleep(0)).await.unwrap();
    until_running(&direct, &round_sleep(0)).await;
    let c2_task = tokio::spawn(async move {
        for _ in 0..20 {
            if let Err(e) = c2.simple_query("select pg_sleep(0.01)").await {
                panic!("client 2 failed (sqlstate {:?}): {e}", sqlstate(&e));
            }
        }
        c2
    });
    until_waiting(&h, 1).await;
    let (addr, key) = (h.addr(), c1.key());
    let burst: Vec<_> = (0..50).map(|_| tokio::spawn(raw::cancel(addr, key))).collect();
    for b in burst {
        b.await.unwrap().expect("cancel connection closed without an answer");
    }
    let reply = c1.reply().await.unwrap();
    assert_eq!(reply.code(), Some("57014"), "client 1 was cancelled: {reply:?}");

    // Interleaved: client 2 loops on short queries on the same server while
    // client 1 runs 20 sleeps, each cancelled once it is seen running on
    // Postgres; every cancel lands on client 1's query, none on client 2's.
    let c2 = c2_task.await.expect("client 2 never saw 57014 during the burst");
    let c2_loop = tokio::spawn(async move {
        for _ in 0..60 {
            if let Err(e) = c2.simple_query("select pg_sleep(0.005)").await {
                panic!("client 2 failed (sqlstate {:?}): {e}", sqlstate(&e));
            }
        }
    });
    for round in 1..=INTERLEAVED {
        let sql = round_sleep(round);
        c1.send_query(&sql).await.unwrap();
        until_running(&direct, &sql).await;
        raw::cancel(addr, key).await.expect("cancel connection closed without an answer");
        let reply = c1.reply().await.unwrap();
        assert_eq!(reply.code(), Some("57014"), "round {round}: client 1's sleep was not cancelled: {reply:?}");
        assert_eq!(reply.status, b'I', "round {round}");
    }
    c2_loop.await.expect("client 2 never saw 57014");
    assert_eq!(h.pool().metrics.closed_total(), 0, "no server was closed");
}

/// A cancel that Postgres takes only after weir's forward has given up (the
/// relay holds the cancel connection's dial for 9 s, past weir's 5 s) can
/// still signal the backend later, so weir never lends that server again:
/// client 1's sleep ends uncancelled, and client 2, queued behind it, runs
/// its own sleep on a new server connection while the late cancel arrives,
/// and finishes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_that_outlives_its_forward_never_hits_the_next_client() {
    let _alone = weir_e2e::serial().await;
    let h = Harness::start(Opts { relay: true, ..trust_opts(1) }).await;
    let direct = h.direct().await;
    let mut c1 = super::raw_login(&h, SCRAM_USER, &[]).await.unwrap();
    let mut c2 = super::raw_login(&h, SCRAM_USER, &[]).await.unwrap();
    c1.send_query("select pg_sleep(6)").await.unwrap();
    until_running(&direct, "select pg_sleep(6)").await;

    let relay = h.relay.as_ref().expect("a relay");
    relay.set_connect_delay(Duration::from_secs(9));
    let cancel = tokio::spawn(raw::cancel(h.addr(), c1.key()));
    let held = weir_e2e::eventually(Duration::from_secs(5), || relay.connecting_now() == 1).await;
    assert!(held, "the relay holds the cancel connection");
    relay.set_connect_delay(Duration::ZERO);
    c2.send_query("select pg_sleep(6), 2 as client").await.unwrap();
    until_waiting(&h, 1).await;

    cancel.await.unwrap().expect("weir closes the cancel connection when its forward gives up");
    let r1 = c1.reply().await.unwrap();
    assert_eq!(r1.error, None, "the held cancel had not reached client 1's sleep");
    let r2 = c2.reply().await.unwrap();
    assert_eq!(r2.error, None, "the late cancel hit client 2's sleep");
    assert_eq!(h.pool().metrics.closed_total(), 1, "the server the late cancel aims at was closed, not lent");
}
