//! A client that closes its connection while a query runs (psycopg's
//! `test_socket_closed`: PQfinish from another thread, Terminate then close,
//! while a wait function polls the socket) must see what it sees with
//! Postgres: "connection socket closed", never "connection pointer is NULL".
//! That needs weir not to close its end between the client's Terminate and
//! the client's own close. psycopg's scenario is a race on microseconds, so
//! it is a manual check (tests/drivers/python/psycopg_socket_closed.py
//! CONNINFO ROUNDS); this module tests its deterministic core. And the other
//! side of it: a client that leaves with nothing left running (asyncpg's
//! close, which waits for the server's close) sees weir close at once, as
//! Postgres does.

use std::time::Duration;

use weir::protocol::tags::{backend as be, frontend as fe};
use weir_e2e::extended::{describe_statement, parse};
use weir_e2e::raw::{query, startup, tagged, Raw};
use weir_e2e::{bounded, Harness, Opts, APP_DB, TRUST_PASS, TRUST_USER, WAIT_LIMIT};

/// The deterministic core of that: a Terminate while a query runs, the
/// socket left open. Postgres reads the Terminate only once the query is
/// done, so it does not close for the query's length; weir likewise leaves
/// the close to the client for a while, then cancels the query (the server
/// goes back). An early FIN from weir fails this. Each side runs its own
/// query text, long enough to outlast a loaded machine, so the two are told
/// apart. The Terminate goes once the query runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_mid_query_leaves_the_close_to_the_client() {
    bounded(120, async {
        for mode in ["transaction", "session"] {
            let h = Harness::start(Opts { auth_type: "trust", pool_mode: mode, ..Opts::default() }).await;
            let pg_addr: std::net::SocketAddr = format!("127.0.0.1:{}", h.pg.port()).parse().unwrap();
            for (who, addr) in [("postgres", pg_addr), ("weir", h.addr())] {
                let mut c =
                    Raw::login(addr, TRUST_USER, TRUST_PASS, &[]).await.unwrap().with_limit(Duration::from_millis(400));
                c.send(&query(&sleeper(who))).await.unwrap();
                h.until_running(&sleeper(who)).await;
                c.send(&tagged(weir::protocol::tags::frontend::TERMINATE, b"")).await.unwrap();
                assert!(!c.closed_by_weir().await, "{mode}: {who} closed within 400 ms of the Terminate");
            }
            let active = |who: &str| {
                let sql = format!(
                    "select count(*) from pg_stat_activity where query = '{}' and state = 'active'",
                    sleeper(who).replace('\'', "''")
                );
                h.psql(&sql).trim().to_string()
            };
            // weir's query was cancelled; Postgres's own session still sleeps.
            assert!(weir_e2e::eventually(WAIT_LIMIT, || active("weir") == "0").await, "{mode}: weir's query runs on");
            assert_eq!(active("postgres"), "1", "{mode}: the direct session's query");
        }
    })
    .await
}

/// The query each side runs: a sleep no test run outlasts, named for the side.
fn sleeper(who: &str) -> String {
    format!("select pg_sleep(60), '{who}'")
}

/// asyncpg's prepare then its close: Parse, Describe and Flush, all
/// answered, no Sync; then Terminate, and the socket left open for the
/// server to close. Postgres is idle there: it reads the Terminate at once
/// and closes. weir closes too, before its one server goes on to the next
/// client: that client, queued meanwhile, is answered only after the first
/// one's socket holds weir's close.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_after_an_answered_batch_closes_at_once() {
    bounded(120, async {
        for mode in ["transaction", "session"] {
            let h = Harness::start(Opts { auth_type: "trust", pool_mode: mode, pool_size: 1, ..Opts::default() }).await;
            // Postgres's own answer to the same sequence: it closes.
            let mut direct = answered_batch(h.pg_addr()).await;
            direct.send(&tagged(fe::TERMINATE, b"")).await.unwrap();
            assert!(direct.closed_by_weir().await, "{mode}: Postgres kept the connection open");

            let mut a = answered_batch(h.addr()).await;
            // The next client logs in and asks while `a` holds the one server.
            let mut b = Raw::connect(h.addr()).await;
            let mut ask = startup(&[("user", TRUST_USER), ("database", APP_DB)]);
            ask.extend(query("select 'next'"));
            b.send(&ask).await.unwrap();
            let pool = h.pool_for(TRUST_USER);
            let queued = weir_e2e::eventually(WAIT_LIMIT, || pool.snapshot().waiting == 1).await;
            assert!(queued, "{mode}: the next client is not queued: {:?}", pool.snapshot());

            a.send(&tagged(fe::TERMINATE, b"")).await.unwrap();
            b.expect_login_ok().await;
            assert_eq!(b.reply().await.unwrap().scalar(), Some("next"), "{mode}");
            let a = a.s.into_std().unwrap();
            let mut sink = [0u8; 64];
            let got = std::io::Read::read(&mut &a, &mut sink).map_err(|e| e.kind());
            assert_eq!(got, Ok(0), "{mode}: weir had not closed when its server served the next client");
        }
    })
    .await
}

/// A login at `addr`, then Parse, Describe and Flush, read up to the
/// RowDescription: the batch is answered and left open.
async fn answered_batch(addr: std::net::SocketAddr) -> Raw {
    let mut c = Raw::login(addr, TRUST_USER, TRUST_PASS, &[]).await.unwrap();
    let mut batch = parse("s1", "select 1");
    batch.extend(describe_statement("s1"));
    batch.extend(tagged(fe::FLUSH, b""));
    c.send(&batch).await.unwrap();
    let tags = [c.next().await.unwrap().0, c.next().await.unwrap().0, c.next().await.unwrap().0];
    assert_eq!(tags, [be::PARSE_COMPLETE, be::PARAMETER_DESCRIPTION, be::ROW_DESCRIPTION]);
    c
}
