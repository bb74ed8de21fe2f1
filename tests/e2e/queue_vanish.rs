//! Clients that leave mid-query (outside or inside a transaction, mid-
//! message, by RST or Terminate) and clients that leave before their login
//! completes. Neither costs a server connection.

use std::time::{Duration, Instant};

use weir::protocol::tags::auth;
use weir_e2e::{Harness, Opts, APP_DB, MD5_PASS, MD5_USER, SCRAM_USER};
use weir_metrics::{CloseReason, DropReason};

use super::{backends_until, create_ledger, ledger_ids, logins_of, trust_opts};
use weir_e2e::raw::{self, Raw};

/// How soon after its client left an abandoned statement (a 30 s sleep) is
/// cancelled and its server idle again: prompt, with room for a loaded machine.
const CLEANUP: Duration = Duration::from_secs(10);

/// How the client goes.
#[derive(Debug, Clone, Copy)]
enum Leave {
    Reset,
    Terminate,
}

/// What the client is doing when it goes.
#[derive(Debug, Clone, Copy)]
enum Doing {
    /// `select pg_sleep(30)` is running.
    Sleeping,
    /// Half of a short Query message was sent (weir holds it back).
    HalfShortMessage,
    /// Half of a 200 KiB Query message was sent (weir already streamed its head).
    HalfLongMessage,
    /// Parse, Bind, Execute of a `pg_sleep(30)` INSERT with no Sync yet:
    /// running, in an open extended-protocol batch.
    ExecuteWithoutSync,
    /// Parse, Bind, Execute of a quick INSERT and a Flush, its
    /// CommandComplete read, no Sync: done but not committed. Postgres rolls
    /// it back when the client goes, so weir's closing Sync must not commit it.
    ExecutedWithoutSync,
    /// A result of about 1 GB is on its way and the client reads none of it:
    /// its socket and weir's buffers fill, and the backend waits to send more.
    StreamingUnread,
}

/// One client leaves while `doing`; the backend must end idle (cancelled,
/// rolled back, reset in session mode), serve the next client with the same
/// pid, and never close.
async fn vanish(in_tx: bool, doing: Doing, leave: Leave) {
    vanish_in("transaction", in_tx, doing, leave).await
}

async fn vanish_in(pool_mode: &'static str, in_tx: bool, doing: Doing, leave: Leave) {
    let h = Harness::start(Opts { pool_mode, ..trust_opts(1) }).await;
    let direct = create_ledger(&h).await;
    let mut raw = super::raw_login(&h, SCRAM_USER, &[]).await.unwrap();
    let pid: i32 = raw.query("select pg_backend_pid()").await.unwrap().scalar().unwrap().parse().unwrap();
    if pool_mode == "session" {
        assert_eq!(raw.query("set statement_timeout = '4321s'").await.unwrap().error, None);
    }
    if in_tx {
        assert_eq!(raw.query("begin").await.unwrap().status, b'T');
        assert_eq!(raw.query("insert into ledger(id) values (1)").await.unwrap().error, None);
    }
    start(&mut raw, &direct, pid, doing).await;
    tokio::time::sleep(Duration::from_millis(100)).await;
    let left = Instant::now();
    match leave {
        Leave::Reset => raw.reset(),
        Leave::Terminate => raw.terminate().await,
    }
    let (idle, seen) = backends_until(&direct, CLEANUP, |b| b.len() == 1 && b[0].0 == pid && b[0].1 == "idle").await;
    assert!(idle, "backend {pid} not idle after the client left: {seen:?}");
    assert!(left.elapsed() < CLEANUP, "cleanup took {:?}", left.elapsed());

    server_kept(&h, &direct, pid, doing).await;
}

/// Gets the client into `doing` (a running query has been seen active on `pid`).
async fn start(raw: &mut Raw, direct: &tokio_postgres::Client, pid: i32, doing: Doing) {
    let sleeper = "insert into ledger(id) select 2 from pg_sleep(30)";
    match doing {
        Doing::ExecutedWithoutSync => {
            let mut batch = execute_without_sync("insert into ledger(id) values (5)");
            batch.extend_from_slice(&raw::tagged(weir::protocol::tags::frontend::FLUSH, b""));
            raw.send(&batch).await.unwrap();
            loop {
                let (tag, body) = raw.read_msg().await.unwrap();
                assert_ne!(tag, weir::protocol::tags::backend::ERROR_RESPONSE, "{:?}", raw::error_fields(&body));
                if tag == weir::protocol::tags::backend::COMMAND_COMPLETE {
                    break;
                }
            }
        }
        Doing::Sleeping | Doing::ExecuteWithoutSync => {
            if matches!(doing, Doing::Sleeping) {
                raw.send_query(sleeper).await.unwrap();
            } else {
                raw.send(&execute_without_sync(sleeper)).await.unwrap();
            }
            let (running, seen) =
                backends_until(direct, weir_e2e::WAIT_LIMIT, |b| b.iter().any(|r| r.0 == pid && r.1 == "active")).await;
            assert!(running, "the query never started: {seen:?}");
        }
        Doing::StreamingUnread => {
            raw.send_query("select repeat('x', 1000) from generate_series(1, 1000000)").await.unwrap();
            let (running, seen) =
                backends_until(direct, weir_e2e::WAIT_LIMIT, |b| b.iter().any(|r| r.0 == pid && r.1 == "active")).await;
            assert!(running, "the query never started: {seen:?}");
        }
        Doing::HalfShortMessage => {
            let msg = query_bytes("insert into ledger(id) values (3)");
            raw.send(&msg[..msg.len() / 2]).await.unwrap();
        }
        Doing::HalfLongMessage => {
            let filler = "x".repeat(200 * 1024);
            let msg = query_bytes(&format!("insert into ledger(id) select 4 where length('{filler}') > 0"));
            raw.send(&msg[..msg.len() / 2]).await.unwrap();
        }
    }
}

/// The next client gets the same backend, clean, and nothing was closed or kept.
async fn server_kept(h: &Harness, direct: &tokio_postgres::Client, pid: i32, doing: Doing) {
    let next = h.client().await;
    let next_pid: i32 = next.query_one("select pg_backend_pid()", &[]).await.unwrap().get(0);
    assert_eq!(next_pid, pid, "the same server serves the next client");
    let timeout: String = next.query_one("show statement_timeout", &[]).await.unwrap().get(0);
    assert_eq!(timeout, "0", "the departed client's session state is gone");
    assert!(ledger_ids(direct).await.is_empty(), "nothing of the departed client's work was kept");
    let m = &h.pool().metrics;
    assert_eq!(m.closed_total(), 0, "a server was closed");
    assert_eq!(m.opened(), 1);
    if matches!(doing, Doing::Sleeping | Doing::ExecuteWithoutSync | Doing::StreamingUnread) {
        assert_eq!(m.dropped_queries(DropReason::ClientGone), 1);
    }
}

/// Parse, Bind and Execute of `sql` (unnamed statement and portal), no Sync.
fn execute_without_sync(sql: &str) -> Vec<u8> {
    use bytes::BufMut;
    use weir::protocol::tags::frontend as fe;
    fn msg(out: &mut bytes::BytesMut, tag: u8, body: &[u8]) {
        out.put_u8(tag);
        out.put_i32(body.len() as i32 + 4);
        out.put_slice(body);
    }
    let mut out = bytes::BytesMut::new();
    let mut parse = vec![0u8];
    parse.extend_from_slice(sql.as_bytes());
    parse.extend_from_slice(&[0, 0, 0]);
    msg(&mut out, fe::PARSE, &parse);
    msg(&mut out, fe::BIND, &[0, 0, 0, 0, 0, 0, 0, 0]);
    msg(&mut out, fe::EXECUTE, &[0, 0, 0, 0, 0]);
    out.to_vec()
}

fn query_bytes(sql: &str) -> Vec<u8> {
    let mut b = bytes::BytesMut::new();
    weir::protocol::messages::query(&mut b, sql);
    b.to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_mid_query_outside_a_transaction() {
    let _alone = weir_e2e::serial().await;
    vanish(false, Doing::Sleeping, Leave::Reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_mid_query_inside_a_transaction() {
    let _alone = weir_e2e::serial().await;
    vanish(true, Doing::Sleeping, Leave::Reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_mid_query_inside_a_transaction() {
    let _alone = weir_e2e::serial().await;
    vanish(true, Doing::Sleeping, Leave::Terminate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_after_an_unsynced_insert_keeps_nothing() {
    let _alone = weir_e2e::serial().await;
    vanish(false, Doing::ExecutedWithoutSync, Leave::Terminate).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_after_an_unsynced_insert_keeps_nothing() {
    let _alone = weir_e2e::serial().await;
    vanish(false, Doing::ExecutedWithoutSync, Leave::Reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_after_execute_without_sync_in_a_transaction() {
    let _alone = weir_e2e::serial().await;
    vanish(true, Doing::ExecuteWithoutSync, Leave::Reset).await;
}

/// A client that stops reading a large result and then resets: weir's
/// writes to it fail mid-stream, and the rest of the reply is cancelled and
/// drained, with the bytes weir had already scanned counted once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_while_a_large_result_streams_unread() {
    let _alone = weir_e2e::serial().await;
    vanish(false, Doing::StreamingUnread, Leave::Reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_reset_mid_query_in_a_transaction() {
    let _alone = weir_e2e::serial().await;
    vanish_in("session", true, Doing::Sleeping, Leave::Reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_halfway_through_a_short_message_in_a_transaction() {
    let _alone = weir_e2e::serial().await;
    vanish(true, Doing::HalfShortMessage, Leave::Reset).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_halfway_through_a_long_message_in_a_transaction() {
    let _alone = weir_e2e::serial().await;
    vanish(true, Doing::HalfLongMessage, Leave::Reset).await;
}

/// A driver whose connection task dies mid-query inside a transaction: the
/// socket closes with a plain FIN, no Terminate and no cancel (the shape of
/// node-postgres `query_timeout`, where nobody cancels the running query).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_connection_closed_mid_query_costs_nothing() {
    let _alone = weir_e2e::serial().await;
    let h = Harness::start(Opts { pool_size: 1, ..Opts::default() }).await;
    let direct = create_ledger(&h).await;
    let (c, conn) =
        tokio_postgres::connect(&h.url(SCRAM_USER, weir_e2e::SCRAM_PASS), tokio_postgres::NoTls).await.unwrap();
    let driver = tokio::spawn(conn);
    let pid: i32 = c.query_one("select pg_backend_pid()", &[]).await.unwrap().get(0);
    c.batch_execute("begin; insert into ledger(id) values (1)").await.unwrap();
    let running = tokio::spawn(async move { c.simple_query("select pg_sleep(30)").await.map(|_| ()) });
    let (started, seen) =
        backends_until(&direct, weir_e2e::WAIT_LIMIT, |b| b.iter().any(|r| r.0 == pid && r.1 == "active")).await;
    assert!(started, "{seen:?}");
    driver.abort();
    assert!(running.await.unwrap().is_err(), "the query cannot finish without its connection");
    let left = Instant::now();
    let (idle, seen) = backends_until(&direct, CLEANUP, |b| b.iter().all(|r| r.1 == "idle")).await;
    assert!(idle, "{seen:?}");
    assert!(left.elapsed() < CLEANUP, "cleanup took {:?}", left.elapsed());
    let next = h.client().await;
    let next_pid: i32 = next.query_one("select pg_backend_pid()", &[]).await.unwrap().get(0);
    assert_eq!(next_pid, pid);
    assert!(ledger_ids(&direct).await.is_empty());
    assert_eq!(h.pool().metrics.closed_total(), 0);
    assert_eq!(h.pool().metrics.dropped_queries(DropReason::ClientGone), 1);
}

/// Clients gone before their login completes (startup sent, then gone while
/// weir waits for the password; or half a startup packet) make weir do no
/// server-side work: no pool, no backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_gone_during_login_costs_no_server_work() {
    let _alone = weir_e2e::serial().await;
    let h = Harness::start(Opts::default()).await;
    let startup = raw::startup(&[("user", MD5_USER), ("database", APP_DB)]);
    for i in 0..20 {
        let mut c = Raw::connect(h.addr()).await;
        if i % 2 == 0 {
            c.send(&startup).await.unwrap();
            assert_eq!(c.auth_request().await.0, auth::MD5_PASSWORD);
        } else {
            c.send(&startup[..startup.len() / 2]).await.unwrap();
        }
        c.reset();
    }
    // A window in which no pool or backend may appear for them.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(
        h.weir().shared().pools.get(APP_DB, MD5_USER).is_none(),
        "a pool was made for a client that never logged in"
    );
    assert_eq!(logins_of(&h, MD5_USER), 0, "Postgres saw a backend start");

    // The same path with a login that completes does reach Postgres, once.
    let c = weir_e2e::connect(&h.url(MD5_USER, MD5_PASS)).await.unwrap();
    c.simple_query("select 1").await.unwrap();
    assert_eq!(logins_of(&h, MD5_USER), 1);
}

/// Recovery is bounded by server_reset_timeout: when the server's answers
/// stop (the path to it freezes) after its client left mid-query, weir gives
/// up after the timeout, closes that one server with reason reset_failed, and
/// the next client gets a fresh one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn recovery_that_cannot_finish_closes_the_server_with_its_reason() {
    let _alone = weir_e2e::serial().await;
    let general = "server_reset_timeout = \"500ms\"".to_string();
    let h = Harness::start(Opts { relay: true, general, ..trust_opts(1) }).await;
    let direct = create_ledger(&h).await;
    let mut raw = super::raw_login(&h, SCRAM_USER, &[]).await.unwrap();
    let pid = raw.query("select pg_backend_pid()").await.unwrap().scalar().unwrap().to_owned();
    assert_eq!(raw.query("begin").await.unwrap().status, b'T');
    raw.send_query("insert into ledger(id) select 5 from pg_sleep(30)").await.unwrap();
    let pid: i32 = pid.parse().unwrap();
    let (running, seen) =
        backends_until(&direct, weir_e2e::WAIT_LIMIT, |b| b.iter().any(|r| r.0 == pid && r.1 == "active")).await;
    assert!(running, "{seen:?}");
    h.relay.as_ref().unwrap().freeze_existing();
    let left = Instant::now();
    raw.reset();

    let m = h.pool().metrics.clone();
    let closed = weir_e2e::eventually(Duration::from_secs(3), || m.closed(CloseReason::ResetFailed) == 1).await;
    assert!(closed, "closed: {}", m.closed_total());
    let took = left.elapsed();
    assert!(took >= Duration::from_millis(450) && took < Duration::from_millis(1500), "closed after {took:?}");
    assert_eq!(m.closed_total(), 1, "only that server, only for that reason");
    let next = h.client().await;
    let next_pid: i32 = next.query_one("select pg_backend_pid()", &[]).await.unwrap().get(0);
    assert_ne!(next_pid, pid, "a fresh server replaced the one that could not be recovered");
    assert!(ledger_ids(&direct).await.is_empty());
}

/// A client that sends a query and goes at once: weir's cancel can reach the
/// backend before the query's bytes do, and Postgres ignores a cancel while
/// it waits for a query. Here the relay holds the server connection's bytes
/// until that cancel has come and gone; the query then starts and must still
/// be cancelled, the server kept.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_that_overtakes_its_query_is_sent_again() {
    let _alone = weir_e2e::serial().await;
    let h = Harness::start(Opts { relay: true, ..trust_opts(1) }).await;
    let direct = create_ledger(&h).await;
    let mut raw = super::raw_login(&h, SCRAM_USER, &[]).await.unwrap();
    let pid: i32 = raw.query("select pg_backend_pid()").await.unwrap().scalar().unwrap().parse().unwrap();
    let relay = h.relay.as_ref().unwrap();
    let before = relay.connections_accepted();
    relay.freeze_existing();
    raw.send_query("insert into ledger(id) select 6 from pg_sleep(30)").await.unwrap();
    // weir took a server for it (so it has read the query) before the reset.
    assert!(weir_e2e::eventually(weir_e2e::WAIT_LIMIT, || h.pool().snapshot().active == 1).await);
    raw.reset();
    // weir's first cancel passes the relay (a new connection) and is done.
    let cancelled = weir_e2e::eventually(weir_e2e::WAIT_LIMIT, || {
        relay.connections_accepted() > before && relay.connections_open() == 1
    });
    assert!(cancelled.await, "weir's cancel never came: {relay:?}");
    relay.thaw();
    // Idle again after the query came (idle before it, too).
    let (idle, seen) = backends_until(&direct, weir_e2e::WAIT_LIMIT, |b| {
        b.len() == 1 && b[0].0 == pid && b[0].1 == "idle" && b[0].3 != "select pg_backend_pid()"
    })
    .await;
    assert!(idle, "backend {pid} not idle after its query: {seen:?}");
    assert_eq!(h.pool().metrics.closed_total(), 0, "the server was kept");
    server_kept(&h, &direct, pid, Doing::Sleeping).await;
}
