//! The wait budget: `query_wait_timeout`, a deadline the client declares at
//! startup, and the config rule that the budget sits below the deadline.

use std::time::{Duration, Instant};

use tokio_postgres::{Client, NoTls};
use weir_e2e::{sqlstate, Harness, Opts, SCRAM_PASS, SCRAM_USER};
use weir_metrics::DropReason;

use super::{create_ledger, hold_server, ledger_ids};

const NO_SERVER: &str = "no server connection became free within the wait budget";

/// Runs `sql` and returns (SQLSTATE, message, how long the answer took).
async fn timed_failure(c: &Client, sql: &str, simple: bool) -> (String, String, Duration) {
    let t = Instant::now();
    let err = if simple { c.simple_query(sql).await.err() } else { c.query(sql, &[]).await.err() };
    let took = t.elapsed();
    let err = err.unwrap_or_else(|| panic!("{sql} should have failed"));
    let db = err.as_db_error().unwrap_or_else(|| panic!("not a server error: {err}"));
    (db.code().code().to_owned(), db.message().to_owned(), took)
}

/// Wait timeout: with the pool held, waiters get 53300 between 200 and 300
/// ms, then run their next query on the same connection once the holder is
/// done; no server is opened, closed or otherwise touched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn waiters_get_the_budget_error_and_keep_their_connection() {
    let _alone = weir_e2e::serial().await;
    let general = "query_wait_timeout = \"200ms\"".to_string();
    let h = Harness::start(Opts { pool_size: 1, general, ..Opts::default() }).await;
    let direct = create_ledger(&h).await;
    let (a, a_pid) = hold_server(&h).await;
    let mut waiters = Vec::new();
    for _ in 0..4 {
        waiters.push(h.client().await);
    }
    let results = futures_util::future::join_all(waiters.iter().enumerate().map(|(i, c)| async move {
        timed_failure(c, &format!("insert into ledger(id) values ({i})"), i % 2 == 0).await
    }))
    .await;
    for (code, message, took) in &results {
        assert_eq!(code, "53300", "{message}");
        assert!(message.contains(NO_SERVER) && message.contains("200ms"), "{message}");
        assert!(*took >= Duration::from_millis(200) && *took < Duration::from_millis(300), "answered after {took:?}");
    }

    assert_eq!(h.pool().snapshot().waiting, 0, "the queue is empty after the timeouts");

    // A pipeline of two extended-protocol queries: each is skipped to its own
    // Sync and answered on its own.
    let c = &waiters[0];
    let (r1, r2) = tokio::join!(c.query("select 1", &[]), c.query("select 2", &[]));
    for r in [r1, r2] {
        assert_eq!(r.err().and_then(|e| sqlstate(&e)).as_deref(), Some("53300"));
    }

    a.batch_execute("commit").await.unwrap();
    for c in &waiters {
        let pid: i32 = c.query_one("select pg_backend_pid()", &[]).await.unwrap().get(0);
        assert_eq!(pid, a_pid, "the pool's one server");
    }
    assert!(ledger_ids(&direct).await.is_empty(), "timed-out INSERTs never run");
    let m = &h.pool().metrics;
    assert_eq!(m.opened(), 1, "no server opened");
    assert_eq!(m.closed_total(), 0, "no server closed");
    assert_eq!(h.server_pids(SCRAM_USER), vec![a_pid]);
    assert_eq!(m.dropped_queries(DropReason::WaitTimeout), 6);
}

/// A declared deadline (`options=-c weir.client_deadline=500ms`) shrinks the
/// budget to 0.8 × 500 ms even though query_wait_timeout is 10 s; the plain
/// startup parameter works the same; `weir.*` never reaches Postgres.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_declared_deadline_sets_the_budget_and_stays_in_weir() {
    let _alone = weir_e2e::serial().await;
    let general = "query_wait_timeout = \"10s\"".to_string();
    let h = Harness::start(Opts { pool_size: 1, general, auth_type: "trust", ..Opts::default() }).await;
    let (a, _) = hold_server(&h).await;

    let mut cfg: tokio_postgres::Config = h.url(SCRAM_USER, SCRAM_PASS).parse().unwrap();
    cfg.options("-c weir.client_deadline=500ms");
    let (c, conn) = cfg.connect(NoTls).await.expect("weir accepts the declared deadline");
    tokio::spawn(conn);
    let (code, message, took) = timed_failure(&c, "select 1", false).await;
    assert_eq!(code, "53300", "{message}");
    assert!(message.contains("400ms"), "{message}");
    assert!(took >= Duration::from_millis(400) && took < Duration::from_millis(500), "answered after {took:?}");

    let mut raw = super::raw_login(&h, SCRAM_USER, &[("weir.client_deadline", "250ms")]).await.unwrap();
    let t = Instant::now();
    let reply = raw.query("select 1").await.unwrap();
    assert_eq!(reply.code(), Some("53300"), "{reply:?}");
    let took = t.elapsed();
    assert!(took >= Duration::from_millis(200) && took < Duration::from_millis(300), "answered after {took:?}");

    a.batch_execute("commit").await.unwrap();
    let seen: Option<String> =
        c.query_one("select current_setting('weir.client_deadline', true)", &[]).await.unwrap().get(0);
    assert_eq!(seen.filter(|s| !s.is_empty()), None, "weir.client_deadline reached Postgres");
    let reply = raw.query("select current_setting('weir.client_deadline', true)").await.unwrap();
    assert_eq!(reply.scalar().filter(|s| !s.is_empty()), None, "{reply:?}");
}

/// Config: query_wait_timeout >= client_deadline is refused, globally and per
/// database, with an error that says why the order matters.
#[test]
fn a_budget_at_or_above_the_client_deadline_is_refused() {
    let base = "[weir]\nauth_type = \"trust\"\nlisten_addr = \"127.0.0.1:0\"\n";
    let cases = [
        format!("{base}query_wait_timeout = \"1s\"\nclient_deadline = \"1s\"\n[databases.app]\n"),
        format!("{base}client_deadline = \"800ms\"\n[databases.app]\nquery_wait_timeout = \"2s\"\n"),
        format!("{base}query_wait_timeout = \"5s\"\n[databases.app]\nclient_deadline = \"3s\"\n"),
    ];
    for text in &cases {
        let err = weir::Config::from_toml(text, std::path::Path::new(".")).unwrap_err().to_string();
        assert!(err.contains("query_wait_timeout") && err.contains("must be below client_deadline"), "{err}");
        assert!(err.contains("abandoned by the client"), "the error explains why: {err}");
    }
    let ok = format!("{base}query_wait_timeout = \"800ms\"\nclient_deadline = \"1s\"\n[databases.app]\n");
    weir::Config::from_toml(&ok, std::path::Path::new(".")).expect("a budget below the deadline is fine");
}

/// Reload (RELOAD / SIGHUP re-read the file) refuses a budget at or above the
/// client deadline and keeps the running budget; a valid one applies.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_refuses_a_budget_above_the_deadline_and_keeps_the_old_one() {
    let _alone = weir_e2e::serial().await;
    let general = "query_wait_timeout = \"200ms\"".to_string();
    let h = Harness::start(Opts { pool_size: 1, general, ..Opts::default() }).await;
    let file = h.dir.join("weir.toml");
    let write = |wait: &str, deadline: &str| {
        let text = format!(
            "[weir]\nlisten_addr = \"127.0.0.1:0\"\nauth_type = \"md5\"\nauth_file = \"userlist.txt\"\n\
             default_pool_size = 1\nquery_wait_timeout = \"{wait}\"\nclient_deadline = \"{deadline}\"\n\
             [databases.app]\nhost = \"127.0.0.1\"\nport = {}\n",
            h.pg.port()
        );
        std::fs::write(&file, text).unwrap();
    };
    h.weir().set_config_path(file.clone());
    let (_a, _) = hold_server(&h).await;
    let c = h.client().await;

    write("2s", "1s");
    let err = h.weir().shared().reload_from_disk().expect_err("reload must refuse").to_string();
    assert!(err.contains("must be below client_deadline") && err.contains("abandoned by the client"), "{err}");
    let (code, message, took) = timed_failure(&c, "select 1", true).await;
    assert_eq!(code, "53300");
    assert!(message.contains("200ms"), "the running budget is kept: {message}");
    assert!(took < Duration::from_millis(300), "{took:?}");

    write("300ms", "1s");
    h.weir().shared().reload_from_disk().expect("a budget below the deadline reloads");
    let (code, message, took) = timed_failure(&c, "select 1", true).await;
    assert_eq!(code, "53300");
    assert!(message.contains("300ms"), "the new budget applies: {message}");
    assert!(took >= Duration::from_millis(300) && took < Duration::from_millis(400), "{took:?}");
}
