//! Admission control against a real Postgres: a load the pool can
//! serve is never refused; a queue past `max_waiting_clients` is refused at
//! once; a waiter whose predicted wait exceeds its budget is shed at once; a
//! declared deadline shorter than the pool's transactions is refused before
//! its query reaches Postgres.
//!
//! "At once" is shown by order, not by a clock: the refusal arrives while
//! every server is still held, before anything could have freed one. "Never
//! ran" is shown on Postgres itself: each query under test inserts its id
//! into a `ledger` table.

use std::time::Duration;

use futures_util::future::join_all;
use tokio_postgres::{Client, NoTls};
use weir_e2e::raw::Raw;
use weir_e2e::{sqlstate, Harness, Opts, SCRAM_PASS, SCRAM_USER};
use weir_metrics::DropReason;

/// Every raw step gives up after this long, so no test can hang.
const STEP_LIMIT: Duration = Duration::from_secs(30);

fn opts(pool_size: u32, general: &str, database: &str) -> Opts {
    Opts { pool_size, auth_type: "trust", general: general.into(), database: database.into(), ..Opts::default() }
}

async fn create_ledger(h: &Harness) -> Client {
    let direct = h.direct().await;
    direct
        .batch_execute("create table if not exists ledger (id bigint primary key); grant all on ledger to public;")
        .await
        .expect("create ledger");
    direct
}

async fn ledger_ids(direct: &Client) -> Vec<i64> {
    direct.query("select id from ledger order by id", &[]).await.unwrap().iter().map(|r| r.get(0)).collect()
}

async fn raw_login(h: &Harness, extra: &[(&str, &str)]) -> Raw {
    Raw::login_within(STEP_LIMIT, h.addr(), SCRAM_USER, "", extra).await.expect("raw login")
}

/// `n` clients through weir, each holding a server in an open transaction.
async fn hold_servers(h: &Harness, n: usize) -> Vec<Client> {
    let holders = join_all((0..n).map(|_| h.client())).await;
    join_all(holders.iter().map(|c| c.batch_execute("begin; select pg_backend_pid()"))).await.into_iter().for_each(
        |r| {
            r.unwrap();
        },
    );
    assert_eq!(h.pool().snapshot().active, n as u32, "every holder has its server");
    holders
}

async fn commit_all(holders: &[Client]) {
    join_all(holders.iter().map(|c| c.batch_execute("commit"))).await.into_iter().for_each(|r| r.unwrap());
}

async fn until_waiting(h: &Harness, n: u32) {
    let pool = h.pool();
    let ok = weir_e2e::eventually(weir_e2e::WAIT_LIMIT, || pool.snapshot().waiting == n).await;
    assert!(ok, "expected {n} waiters, pool is {:?}", pool.snapshot());
}

/// Raw clients that each send an INSERT of their id and stay queued.
async fn queue_inserts(h: &Harness, ids: std::ops::Range<i64>) -> Vec<Raw> {
    let mut raws = join_all(ids.clone().map(|_| raw_login(h, &[]))).await;
    for (r, id) in raws.iter_mut().zip(ids) {
        r.send_query(&format!("insert into ledger(id) values ({id})")).await.unwrap();
    }
    raws
}

fn dropped(h: &Harness, reason: DropReason) -> u64 {
    h.pool().metrics.dropped_queries(reason)
}

/// Transactions of `secs` each, over `clients` clients, until the pool's
/// hold-time estimate has enough samples to be trusted.
async fn warm_estimate(h: &Harness, clients: usize, per_client: usize, secs: f64) {
    let cs = join_all((0..clients).map(|_| h.client())).await;
    join_all(cs.iter().map(|c| async move {
        for _ in 0..per_client {
            c.simple_query(&format!("select pg_sleep({secs})")).await.unwrap();
        }
    }))
    .await;
    assert!(h.pool().estimate.mean().is_some(), "the estimate is warm");
}

/// A closed loop of 8 clients over a pool of 2: a queue forms at every
/// turn, but what it holds is always served well within the budget. Not one
/// query is shed or refused, and every INSERT is in the ledger.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_steady_load_the_pool_serves_in_time_sheds_nothing() {
    let h = Harness::start(opts(2, "query_wait_timeout = \"5s\"\nclient_deadline = \"10s\"", "")).await;
    let direct = create_ledger(&h).await;
    const CLIENTS: i64 = 8;
    const EACH: i64 = 40;
    let clients = join_all((0..CLIENTS).map(|_| h.client())).await;
    join_all(clients.iter().enumerate().map(|(i, c)| async move {
        for n in 0..EACH {
            let id = i as i64 * EACH + n;
            c.batch_execute(&format!("insert into ledger(id) values ({id})")).await.expect("served");
        }
    }))
    .await;
    assert!(h.pool().estimate.mean().is_some(), "the estimate was warm for most of the run");
    assert_eq!(ledger_ids(&direct).await, (0..CLIENTS * EACH).collect::<Vec<_>>());
    for reason in [DropReason::Shed, DropReason::Deadline, DropReason::QueueFull, DropReason::WaitTimeout] {
        assert_eq!(dropped(&h, reason), 0, "{reason:?}");
    }
}

/// max_waiting_clients = 2 on a held pool of 1: two INSERTs queue, the third
/// is answered 53300 while the server is still held, keeps its connection,
/// and never runs; the two queued ones run once the server is free.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queue_past_its_bound_is_refused_at_once() {
    let h = Harness::start(opts(1, "query_wait_timeout = \"20s\"", "max_waiting_clients = 2")).await;
    let direct = create_ledger(&h).await;
    let holders = hold_servers(&h, 1).await;
    let mut queued = queue_inserts(&h, 1..3).await;
    until_waiting(&h, 2).await;

    let mut third = raw_login(&h, &[]).await;
    let reply = third.query("insert into ledger(id) values (3)").await.unwrap();
    let (code, message) = reply.error.clone().expect("refused");
    assert_eq!(code, "53300", "{message}");
    assert!(message.contains("queue for a server is full") && message.contains("max_waiting_clients"), "{message}");
    assert_eq!(h.pool().snapshot().active, 1, "refused while the server was still held");
    assert_eq!(h.pool().snapshot().waiting, 2, "the queue is as it was");

    commit_all(&holders).await;
    for r in &mut queued {
        let reply = r.reply().await.unwrap();
        assert_eq!(reply.error, None, "a queued INSERT within the bound runs");
    }
    assert_eq!(third.query_one("select 42").await, "42", "the refused client kept its connection");
    assert_eq!(ledger_ids(&direct).await, vec![1, 2], "the refused INSERT never ran");
    assert_eq!(dropped(&h, DropReason::QueueFull), 1);
}

/// Pool of 4, transactions of 400 ms, a budget of 2 s: each waiter ahead
/// adds about 100 ms, so with every server held a queue of about 20 fills
/// the budget, and shedding starts at about 20. Raw clients
/// queue until one is shed: it is answered 53300 while every server is
/// still held, its INSERT never runs, and the front of the queue is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_waiter_that_cannot_be_served_in_time_is_shed_at_once() {
    let h = Harness::start(opts(4, "query_wait_timeout = \"2s\"", "")).await;
    let direct = create_ledger(&h).await;
    warm_estimate(&h, 4, 9, 0.4).await;
    let mut idle = join_all((0..40).map(|_| raw_login(&h, &[]))).await;
    let holders = hold_servers(&h, 4).await;

    let mut queued = Vec::new();
    let (id, message) = loop {
        let id = queued.len() as i64 + 1;
        let mut r = idle.pop().unwrap_or_else(|| panic!("nothing was shed: {:?}", h.pool().snapshot()));
        r.send_query(&format!("insert into ledger(id) values ({id})")).await.unwrap();
        // Either queued (the pool counts it) or answered at once.
        let waiting_now = id as u32 - 1 - dropped(&h, DropReason::Shed) as u32;
        let seen = weir_e2e::eventually(STEP_LIMIT, || {
            h.pool().snapshot().waiting > waiting_now || dropped(&h, DropReason::Shed) > 0
        })
        .await;
        assert!(seen, "the INSERT was neither queued nor shed");
        if dropped(&h, DropReason::Shed) > 0 {
            let reply = r.reply().await.unwrap();
            break (id, reply.error.expect("shed").1);
        }
        queued.push(r);
    };
    assert!(message.contains("query shed") && message.contains("predicted wait"), "{message}");
    assert_eq!(h.pool().snapshot().active, 4, "shed while every server was still held");
    assert!(queued.len() >= 15, "a queue the pool could serve in time was not shed: {}", queued.len());

    commit_all(&holders).await;
    let mut served = Vec::new();
    for (i, r) in queued.iter_mut().enumerate() {
        match r.reply().await.unwrap().error {
            None => served.push(i as i64 + 1),
            // The holders' long transactions raise the estimate as they end,
            // so the last waiters may be shed then (the re-check), and on a
            // machine too busy to queue them within 2 s some time out.
            Some((_, m)) => {
                assert!(m.contains("within the wait budget") || m.contains("query shed"), "a waiter got: {m}")
            }
        }
    }
    assert!(served.starts_with(&[1, 2, 3, 4]), "the front of the queue is served: {served:?}");
    let ledger = ledger_ids(&direct).await;
    assert!(!ledger.contains(&id), "the INSERT shed at once never ran");
    assert_eq!(ledger, served, "the served INSERTs ran, no refused one did");
}

/// Transactions of 50 ms; a client declaring a 20 ms deadline is refused
/// before its INSERT reaches Postgres, and keeps its connection; a client
/// declaring 5 s runs the same INSERT.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_deadline_too_short_for_the_pool_never_reaches_postgres() {
    let h = Harness::start(opts(2, "query_wait_timeout = \"5s\"", "")).await;
    let direct = create_ledger(&h).await;
    warm_estimate(&h, 2, 20, 0.05).await;

    let mut cfg: tokio_postgres::Config = h.url(SCRAM_USER, SCRAM_PASS).parse().unwrap();
    cfg.options("-c weir.client_deadline=20ms");
    let (short, conn) = cfg.connect(NoTls).await.expect("login");
    tokio::spawn(conn);
    let err = short.batch_execute("insert into ledger(id) values (1)").await.expect_err("refused");
    assert_eq!(sqlstate(&err).as_deref(), Some("53300"), "{err}");
    let message = err.as_db_error().map(|e| e.message().to_owned()).unwrap_or_default();
    assert!(message.contains("query not started") && message.contains("client deadline"), "{message}");

    let mut long = raw_login(&h, &[("weir.client_deadline", "5s")]).await;
    let reply = long.query("insert into ledger(id) values (2)").await.unwrap();
    assert_eq!(reply.error, None, "a deadline the pool can meet runs");

    assert_eq!(ledger_ids(&direct).await, vec![2], "the refused INSERT never reached Postgres");
    assert_eq!(dropped(&h, DropReason::Deadline), 1);
    let err = short.simple_query("select 1").await.expect_err("still refused: the deadline is still too short");
    assert_eq!(sqlstate(&err).as_deref(), Some("53300"), "and the connection is still there: {err}");
}

/// Transactions of 50 ms on a held pool of 1; a client declaring a 200 ms
/// deadline queues an INSERT. Its wait budget is 160 ms (80 % of the
/// deadline), but it can start no later than its deadline less what the
/// pool's transactions take (about 50 ms plus deviations and margin), so it
/// is refused (reason `deadline`) then: before its budget and its own
/// deadline end, while the server is still held, not when the server frees
/// up. It never runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_queued_query_is_refused_when_it_can_no_longer_start_in_time() {
    let h = Harness::start(opts(1, "query_wait_timeout = \"5s\"", "")).await;
    let direct = create_ledger(&h).await;
    warm_estimate(&h, 1, 40, 0.05).await;
    let holders = hold_servers(&h, 1).await;

    let mut waiter = raw_login(&h, &[("weir.client_deadline", "200ms")]).await;
    let sent = std::time::Instant::now();
    waiter.send_query("insert into ledger(id) values (1)").await.unwrap();
    let reply = waiter.reply().await.unwrap();
    let waited = sent.elapsed();
    let (code, message) = reply.error.expect("refused");
    assert_eq!(code, "53300", "{message}");
    assert!(message.contains("query not started") && message.contains("client deadline"), "{message}");
    assert!(waited < Duration::from_millis(200), "answered before the client's own deadline: {waited:?}");
    assert_eq!(h.pool().snapshot().active, 1, "refused while the server was still held");
    assert_eq!(dropped(&h, DropReason::Deadline), 1);
    assert_eq!(dropped(&h, DropReason::WaitTimeout), 0);

    commit_all(&holders).await;
    assert_eq!(ledger_ids(&direct).await, Vec::<i64>::new(), "the refused INSERT never ran");
    let reply = waiter.query("select 1").await.unwrap();
    assert_eq!(reply.error, None, "the client keeps its connection");
}
