//! Session mode shows the client its real backend: BackendKeyData carries
//! the server's own pid (the secret stays weir's, so cancels still go through
//! weir's map), NOTIFY pids match it, SHOW CLIENTS lists it, and
//! pg_terminate_backend(pg_backend_pid()) ends the session with the
//! server's own FATAL, as it does straight to Postgres.

use std::time::Duration;

use futures_util::StreamExt;
use tokio_postgres::{AsyncMessage, NoTls, SimpleQueryMessage};
use weir_e2e::{sqlstate, Harness, Opts, TRUST_PASS, TRUST_USER};

use weir_e2e::raw::{self as queue_raw, Raw};

const LIMIT: Duration = Duration::from_secs(30);

async fn session_harness() -> Harness {
    Harness::start(Opts { pool_mode: "session", auth_type: "trust", pool_size: 2, ..Opts::default() }).await
}

async fn backend_pid(raw: &mut Raw) -> i32 {
    raw.query("select pg_backend_pid()").await.unwrap().scalar().unwrap().parse().unwrap()
}

/// The `client_key` column of SHOW CLIENTS, one per client (the console's own included).
async fn shown_client_keys(h: &Harness) -> Vec<String> {
    let admin = weir_e2e::connect(&format!("postgres://admin:admin_pass@{}/weir", h.addr())).await.unwrap();
    let rows = admin.simple_query("SHOW CLIENTS").await.unwrap();
    rows.iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get("client_key").map(str::to_owned),
            _ => None,
        })
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backend_key_data_carries_the_servers_pid_and_cancels_still_work() {
    let h = session_harness().await;
    let mut raw = Raw::login(h.addr(), TRUST_USER, "", &[]).await.unwrap();
    let pid = backend_pid(&mut raw).await;
    assert_eq!(raw.key().0, pid, "BackendKeyData's pid is the server's pg_backend_pid()");
    assert!(h.server_pids(TRUST_USER).contains(&pid));
    let keys = shown_client_keys(&h).await;
    assert!(keys.contains(&pid.to_string()), "SHOW CLIENTS lists the pid the client was given: {keys:?}");

    // A cancel with that key reaches weir, which forwards it with the server's key.
    raw.send_query("select pg_sleep(20)").await.unwrap();
    h.until_running("select pg_sleep(20)").await;
    queue_raw::cancel(h.addr(), raw.key()).await.unwrap();
    let reply = tokio::time::timeout(LIMIT, raw.reply()).await.unwrap().unwrap();
    assert_eq!(reply.code(), Some("57014"), "{reply:?}");
    // Straight to Postgres, weir's secret is not the backend's: nothing is cancelled.
    let pg_addr = format!("127.0.0.1:{}", h.pg.port()).parse().unwrap();
    let mut direct = Raw::login(pg_addr, TRUST_USER, "", &[]).await.unwrap();
    let direct_pid = backend_pid(&mut direct).await;
    direct.send_query("select pg_sleep(1)").await.unwrap();
    queue_raw::cancel(pg_addr, (direct_pid, raw.key().1)).await.unwrap();
    assert_eq!(direct.reply().await.unwrap().error, None, "a wrong secret cancels nothing");
    // The session lives on, on the same backend.
    assert_eq!(backend_pid(&mut raw).await, pid);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notify_pid_is_the_clients_backend_pid() {
    let h = session_harness().await;
    let (client, mut conn) = tokio_postgres::connect(&h.url(TRUST_USER, TRUST_PASS), NoTls).await.unwrap();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            let _ = tx.send(m);
        }
    });
    let pid: i32 = client.query_one("select pg_backend_pid()", &[]).await.unwrap().get(0);
    client.batch_execute("listen weir_chan; notify weir_chan, 'mine'").await.unwrap();
    let n = loop {
        match tokio::time::timeout(LIMIT, rx.recv()).await.unwrap().expect("a notification") {
            AsyncMessage::Notification(n) => break n,
            _ => continue,
        }
    };
    assert_eq!((n.channel(), n.payload()), ("weir_chan", "mine"));
    assert_eq!(n.process_id(), pid, "the notifying backend is the client's own");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_token_cancels_through_weir() {
    let h = session_harness().await;
    let client = weir_e2e::connect(&h.url(TRUST_USER, TRUST_PASS)).await.unwrap();
    let token = client.cancel_token();
    let direct = h.direct().await;
    let canceller = tokio::spawn(async move {
        weir_e2e::until_running(&direct, "select pg_sleep(20)", 1).await;
        token.cancel_query(NoTls).await
    });
    let err = tokio::time::timeout(LIMIT, client.simple_query("select pg_sleep(20)")).await.unwrap().unwrap_err();
    canceller.await.unwrap().unwrap();
    assert_eq!(sqlstate(&err).as_deref(), Some("57014"), "{err:?}");
    let one: i32 = client.query_one("select 1", &[]).await.unwrap().get(0);
    assert_eq!(one, 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminating_its_own_backend_ends_the_session_with_the_servers_fatal() {
    let h = session_harness().await;
    let client = weir_e2e::connect(&h.url(TRUST_USER, TRUST_PASS)).await.unwrap();
    let direct = weir_e2e::connect(&h.direct_url(TRUST_USER, TRUST_PASS)).await.unwrap();
    for c in [&client, &direct] {
        let err = c.simple_query("select pg_terminate_backend(pg_backend_pid())").await.unwrap_err();
        let db = err.as_db_error().expect("the server's own error");
        assert_eq!((db.code().code(), db.severity()), ("57P01", "FATAL"), "{err:?}");
        assert_eq!(db.message(), "terminating connection due to administrator command");
        assert!(weir_e2e::eventually(LIMIT, || c.is_closed()).await, "the connection closes");
    }
    // The pool lives on: a new client gets a new backend, with its real pid.
    let mut raw = Raw::login(h.addr(), TRUST_USER, "", &[]).await.unwrap();
    let pid = backend_pid(&mut raw).await;
    assert_eq!(raw.key().0, pid);
}

/// A session-mode login takes its server before greeting: it waits in the
/// queue within query_wait_timeout (not client_login_timeout), and one that
/// cannot get a server in time is refused with the wait's error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_waits_for_its_server_within_query_wait_timeout() {
    let general = "client_login_timeout = \"1s\"\nquery_wait_timeout = \"3s\"\n".to_string();
    let opts = Opts { pool_mode: "session", auth_type: "trust", pool_size: 1, general, ..Opts::default() };
    let h = Harness::start(opts).await;
    let url = h.url(TRUST_USER, TRUST_PASS);
    let a = weir_e2e::connect(&url).await.unwrap();
    let pid: i32 = a.query_one("select pg_backend_pid()", &[]).await.unwrap().get(0);
    let waiting = tokio::spawn({
        let url = url.clone();
        async move { weir_e2e::connect(&url).await }
    });
    let pool = h.pool_for(TRUST_USER);
    weir_e2e::wait_for("the second login to queue", || async { pool.snapshot().waiting == 1 }).await;
    // The scenario: queued for longer than client_login_timeout (1 s).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    drop(a);
    let b = tokio::time::timeout(LIMIT, waiting).await.unwrap().unwrap().expect("logged in once the server was free");
    let b_pid: i32 = b.query_one("select pg_backend_pid()", &[]).await.unwrap().get(0);
    assert_eq!(b_pid, pid, "pool_size 1: the same server, handed over");
    let err = tokio::time::timeout(LIMIT, weir_e2e::connect(&url)).await.unwrap().expect_err("no server in time");
    let db = err.as_db_error().expect("weir's error");
    assert_eq!(db.code().code(), "53300", "{err:?}");
    assert!(db.message().contains("query_wait_timeout"), "{err:?}");
}

/// Rounds of `a_finished_cancel_never_hits_the_next_query`.
const LATE_CANCEL_ROUNDS: usize = 40;

/// libpq's PQcancel (and pgx, pgjdbc) take the close of the cancel socket to
/// mean that Postgres has signalled the backend, and only then go on. weir
/// holds the client's cancel socket open until its forward has been answered,
/// so a cancel aimed at a query that ends on its own never lands on the
/// client's next one: each round cancels a short query just as it finishes,
/// waits for the close, then runs a sleep that must not be cancelled.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_finished_cancel_never_hits_the_next_query() {
    let h = session_harness().await;
    let mut raw = Raw::login(h.addr(), TRUST_USER, "", &[]).await.unwrap();
    let mut forwarded_cancelled = 0;
    for round in 0..LATE_CANCEL_ROUNDS {
        raw.send_query("select pg_sleep(0.001)").await.unwrap();
        queue_raw::cancel(h.addr(), raw.key()).await.unwrap();
        let first = tokio::time::timeout(LIMIT, raw.reply()).await.unwrap().unwrap();
        match first.code() {
            None => {}
            Some("57014") => forwarded_cancelled += 1,
            other => panic!("round {round}: the short query failed with {other:?}"),
        }
        let next = tokio::time::timeout(LIMIT, raw.query("select pg_sleep(0.02)")).await.unwrap().unwrap();
        assert_eq!(next.code(), None, "round {round}: the cancel for the query before hit this one: {next:?}");
    }
    eprintln!("{forwarded_cancelled} of {LATE_CANCEL_ROUNDS} short queries were cancelled in time");
}
