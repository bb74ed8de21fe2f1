//! weir's signals as a process, with PgBouncer 1.23's meanings: SIGUSR1
//! holds new queries (PAUSE) until SIGUSR2 (RESUME); SIGINT is the safe
//! shutdown, letting a running transaction commit before weir exits with
//! status 0; SIGQUIT stops at once.

use std::time::Duration;

use weir_e2e::process::WeirProcess;
use weir_e2e::{connect, eventually, pg, SCRAM_PASS, SCRAM_USER};

/// Waits until weir's log has `line`.
async fn logged(w: &WeirProcess, line: &str) -> bool {
    eventually(Duration::from_secs(10), || w.logs().contains(line)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigusr1_holds_a_query_until_sigusr2() {
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "query_wait_timeout = \"60s\"", "").await;
    let client = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    client.simple_query("select 1").await.unwrap();

    w.signal("USR1");
    assert!(logged(&w, "SIGUSR1: paused").await, "PAUSE completed; log:\n{}", w.logs());
    let query = tokio::spawn(async move { client.simple_query("select 42").await.map(|m| m.len()) });
    let queued = || async { w.pool_row(SCRAM_USER).await["cl_waiting"] == "1" };
    weir_e2e::wait_for("the query to queue while paused", queued).await;
    // A window in which the paused weir must not run it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!query.is_finished(), "the query ran while weir was paused");

    w.signal("USR2");
    let done = tokio::time::timeout(Duration::from_secs(10), query).await.expect("SIGUSR2 released the query");
    assert!(done.unwrap().is_ok(), "the held query succeeded after RESUME");
    assert!(logged(&w, "SIGUSR2: resumed").await, "{}", w.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_lets_a_running_transaction_commit_then_exits_0() {
    let pg = pg().await;
    let mut w = WeirProcess::start(&pg, "shutdown_timeout = \"20s\"", "").await;
    pg.psql("app", "create table sigint_check (x int); grant all on sigint_check to scram_user").unwrap();
    let busy = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    busy.batch_execute("begin").await.unwrap();
    busy.simple_query("insert into sigint_check values (1)").await.unwrap();
    // Long enough to still run when SIGINT arrives on a loaded machine.
    let txn = tokio::spawn(async move {
        busy.simple_query("select pg_sleep(4)").await?;
        busy.batch_execute("commit").await
    });
    let sleeping = "select count(*) from pg_stat_activity where query = 'select pg_sleep(4)'";
    assert!(eventually(weir_e2e::WAIT_LIMIT, || pg.psql("app", sleeping).unwrap().trim() == "1").await);

    w.signal("INT");
    assert!(logged(&w, "SIGINT: draining").await, "{}", w.logs());
    tokio::time::timeout(Duration::from_secs(10), txn)
        .await
        .expect("the transaction ended within 10s")
        .unwrap()
        .expect("the running transaction committed through the safe shutdown");
    assert_eq!(pg.psql("app", "select count(*) from sigint_check").unwrap().trim(), "1", "its COMMIT is in Postgres");
    let status = w.wait_exit(Duration::from_secs(10)).await.expect("weir exits after the safe shutdown");
    assert_eq!(status.code(), Some(0), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigquit_stops_at_once_even_with_a_transaction_open() {
    let pg = pg().await;
    let mut w = WeirProcess::start(&pg, "shutdown_timeout = \"60s\"", "").await;
    let busy = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    busy.batch_execute("begin").await.unwrap();
    busy.simple_query("select 1").await.unwrap();

    w.signal("QUIT");
    // A drain would wait up to shutdown_timeout (60 s) for the open transaction.
    let status = w.wait_exit(Duration::from_secs(5)).await.expect("SIGQUIT stops without waiting for the transaction");
    assert!(status.code().is_some(), "weir exited by itself, not killed by the signal: {status:?}");
    assert!(w.logs().contains("SIGQUIT: stopping now"), "{}", w.logs());
    assert!(busy.simple_query("select 1").await.is_err(), "the client's connection is gone");
}
