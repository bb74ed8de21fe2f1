//! A client that closes its connection while a query runs (psycopg's
//! `test_socket_closed`: PQfinish from another thread, Terminate then close,
//! while a wait function polls the socket) must see what it sees with
//! Postgres: "connection socket closed", never "connection pointer is NULL".
//! That needs weir not to close its end between the client's Terminate and
//! the client's own close. psycopg's scenario is a race on microseconds, so
//! it is a manual check (tests/drivers/python/psycopg_socket_closed.py
//! CONNINFO ROUNDS); this module tests its deterministic core.

use std::time::Duration;

use weir_e2e::raw::{query, tagged, Raw};
use weir_e2e::{bounded, Harness, Opts, TRUST_PASS, TRUST_USER, WAIT_LIMIT};

/// The deterministic core of that: a Terminate while a query runs, the
/// socket left open. Postgres reads the Terminate only once the query is
/// done, so it does not close for the query's length; weir cancels the query
/// at once (the server goes back) but likewise leaves the close to the client
/// for a while. An early FIN from weir fails this. Each side runs its own
/// query text, long enough to outlast a loaded machine, so the two are told
/// apart. The Terminate goes once the query runs: a cancel that reaches a
/// backend before it starts the query is lost (as with Postgres alone), and
/// on a loaded machine weir's could.
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
