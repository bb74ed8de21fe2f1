//! A client that closes its connection while a query runs (psycopg's
//! `test_socket_closed`: PQfinish from another thread, Terminate then close,
//! while a wait function polls the socket) sees what it sees with Postgres:
//! "connection socket closed", in both pool modes. weir must not close its
//! end between the client's Terminate and the client's own close.

use std::process::Command;
use std::time::Duration;

use weir_e2e::raw::{query, tagged, Raw};
use weir_e2e::{bounded, Harness, Opts, APP_DB, TRUST_PASS, TRUST_USER};

/// Runs the psycopg scenario against `port`, each wait function `rounds` times.
async fn socket_closed(port: u16, rounds: u32) -> Result<String, String> {
    let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("drivers/python/psycopg_socket_closed.py");
    let conninfo = format!("host=127.0.0.1 port={port} dbname={APP_DB} user={TRUST_USER}");
    let mut cmd = Command::new("python3");
    cmd.arg(script).arg(conninfo).arg(rounds.to_string());
    let out = tokio::time::timeout(Duration::from_secs(100), tokio::task::spawn_blocking(move || cmd.output()))
        .await
        .expect("the psycopg script finished in time")
        .unwrap()
        .expect("run python3");
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if out.status.success() {
        Ok(text)
    } else {
        Err(text)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_closing_mid_query_sees_its_socket_closed_as_with_postgres() {
    bounded(240, async {
        for mode in ["transaction", "session"] {
            let h = Harness::start(Opts { auth_type: "trust", pool_mode: mode, ..Opts::default() }).await;
            if mode == "transaction" {
                let direct = socket_closed(h.pg.port(), 1).await;
                assert!(direct.is_ok(), "the scenario against Postgres itself: {direct:?}");
            }
            let through = socket_closed(h.addr().port(), 3).await;
            assert!(through.is_ok(), "{mode}: {through:?}");
            // The server the query ran on came back, cancelled.
            let running =
                "select count(*) from pg_stat_activity where query = 'select pg_sleep(2)' and state = 'active'";
            assert!(weir_e2e::eventually(Duration::from_secs(5), || h.psql(running).trim() == "0").await, "{mode}");
        }
    })
    .await
}

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
