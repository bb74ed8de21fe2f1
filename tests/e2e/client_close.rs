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
use weir_e2e::{bounded, Harness, Opts, TRUST_PASS, TRUST_USER};

/// The deterministic core of that: a Query then a Terminate, the socket
/// left open. Postgres reads the Terminate only once the query is done, so
/// it does not close for the query's length; weir cancels the query at once
/// (the server goes back) but likewise leaves the close to the client for a
/// while. An early FIN from weir fails this.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminate_mid_query_leaves_the_close_to_the_client() {
    bounded(120, async {
        for mode in ["transaction", "session"] {
            let h = Harness::start(Opts { auth_type: "trust", pool_mode: mode, ..Opts::default() }).await;
            let pg_addr: std::net::SocketAddr = format!("127.0.0.1:{}", h.pg.port()).parse().unwrap();
            for (who, addr) in [("postgres", pg_addr), ("weir", h.addr())] {
                let mut c =
                    Raw::login(addr, TRUST_USER, TRUST_PASS, &[]).await.unwrap().with_limit(Duration::from_millis(400));
                let mut both = query("select pg_sleep(2)");
                both.extend_from_slice(&tagged(weir::protocol::tags::frontend::TERMINATE, b""));
                c.send(&both).await.unwrap();
                assert!(!c.closed_by_weir().await, "{mode}: {who} closed within 400 ms of the Terminate");
            }
            let running =
                "select count(*) from pg_stat_activity where query = 'select pg_sleep(2)' and state = 'active'";
            // Postgres's own session still sleeps; weir's was cancelled.
            assert!(weir_e2e::eventually(Duration::from_secs(1), || h.psql(running).trim() == "1").await, "{mode}");
        }
    })
    .await
}
