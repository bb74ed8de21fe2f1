//! Session settings in transaction mode, against a real Postgres: a client's
//! session-level SET, RESET, RESET ALL and set_config(..., false) follow it
//! from server to server (read back from the server when its transaction
//! is over, so a rolled-back SET, SET LOCAL and a savepoint's rollback keep
//! Postgres's meaning), never reach another client, and weir writes no
//! notice of its own into any client's stream.

use bytes::{Buf, Bytes};
use weir::protocol::tags::backend as be;
use weir_e2e::raw::{login, query, Raw};
use weir_e2e::{harness, SCRAM_USER};

/// Runs one simple query: no error, and no NoticeResponse reaches the
/// client. Returns the first column of the first row, if any.
async fn run(c: &mut Raw, sql: &str) -> Option<String> {
    let replies = c.exchange(&query(sql)).await;
    let tags: String = replies.iter().map(|(t, _)| *t as char).collect();
    assert!(!tags.contains(be::NOTICE_RESPONSE as char), "{sql}: a notice reached the client ({tags})");
    assert!(!tags.contains(be::ERROR_RESPONSE as char), "{sql}: {replies:?}");
    replies.into_iter().find(|(t, _)| *t == be::DATA_ROW).and_then(|(_, body)| first_column(body))
}

fn first_column(mut body: Bytes) -> Option<String> {
    if body.get_i16() < 1 {
        return None;
    }
    let len = usize::try_from(body.get_i32()).ok()?;
    Some(String::from_utf8(body[..len].to_vec()).expect("text"))
}

/// A setting and the backend that answered, as "value pid".
async fn show_on(c: &mut Raw, name: &str) -> (String, String) {
    let sql = format!("select current_setting('{name}') || ' ' || pg_backend_pid()");
    let got = run(c, &sql).await.expect("a row");
    let (v, pid) = got.rsplit_once(' ').expect("value pid");
    (v.to_owned(), pid.to_owned())
}

async fn show(c: &mut Raw, name: &str) -> String {
    run(c, &format!("show {name}")).await.expect("a row")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_set_follows_its_client_across_servers_and_never_reaches_another() {
    let h = harness(2, "transaction", "trust", "").await;
    let mut a = login(h.addr(), SCRAM_USER, &[]).await;
    let mut b = login(h.addr(), SCRAM_USER, &[]).await;
    assert_eq!(run(&mut a, "SET statement_timeout = '150ms'").await, None);
    let mut pids = std::collections::BTreeSet::new();
    for i in 0..6 {
        // b takes the server a just used (the idle stack is LIFO) and holds
        // it, so a's next query runs on the other one.
        let holding = i % 2 == 0;
        if holding {
            run(&mut b, "begin").await;
        }
        let (timeout, pid) = show_on(&mut a, "statement_timeout").await;
        assert_eq!(timeout, "150ms", "a's query {i}");
        pids.insert(pid);
        let (theirs, _) = show_on(&mut b, "statement_timeout").await;
        assert_eq!(theirs, "0", "b, round {i}");
        if holding {
            run(&mut b, "commit").await;
        }
    }
    assert_eq!(pids.len(), 2, "a ran on both servers");
    assert_eq!(h.pool().metrics.pinned(), 0, "followed, not pinned");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_sharing_one_server_each_keep_their_own() {
    let h = harness(1, "transaction", "trust", "").await;
    let mut a = login(h.addr(), SCRAM_USER, &[]).await;
    let mut b = login(h.addr(), SCRAM_USER, &[]).await;
    run(&mut a, "SET statement_timeout = '150ms'").await;
    run(&mut b, "SET lock_timeout = '2s'").await;
    // Reported by Postgres (ParameterStatus), not among weir's six.
    run(&mut a, "SET default_transaction_read_only = on").await;
    for _ in 0..6 {
        assert_eq!(show(&mut b, "default_transaction_read_only").await, "off");
        assert_eq!(show(&mut a, "default_transaction_read_only").await, "on");
        assert_eq!(show(&mut a, "statement_timeout").await, "150ms");
        assert_eq!(show(&mut a, "lock_timeout").await, "0");
        assert_eq!(show(&mut b, "statement_timeout").await, "0");
        assert_eq!(show(&mut b, "lock_timeout").await, "2s");
    }
    let mut c = login(h.addr(), SCRAM_USER, &[]).await;
    assert_eq!(show(&mut c, "statement_timeout").await, "0", "a newcomer inherits nothing");
    assert_eq!(show(&mut c, "lock_timeout").await, "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_and_reset_all_restore_the_defaults() {
    let h = harness(1, "transaction", "trust", "").await;
    let mut a = login(h.addr(), SCRAM_USER, &[]).await;
    let mut b = login(h.addr(), SCRAM_USER, &[]).await;
    run(&mut a, "SET statement_timeout = '150ms'").await;
    run(&mut a, "SET search_path = pg_catalog, public").await;
    run(&mut b, "select 1").await;
    run(&mut a, "RESET statement_timeout").await;
    run(&mut b, "select 1").await;
    assert_eq!(show(&mut a, "statement_timeout").await, "0");
    assert_eq!(show(&mut a, "search_path").await, "pg_catalog, public", "a list, kept as a list");
    run(&mut a, "RESET ALL").await;
    run(&mut b, "select 1").await;
    assert_eq!(show(&mut a, "search_path").await, "\"$user\", public");
    assert_eq!(show(&mut b, "search_path").await, "\"$user\", public");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_decide_what_is_kept() {
    let h = harness(1, "transaction", "trust", "").await;
    let mut a = login(h.addr(), SCRAM_USER, &[]).await;
    let mut b = login(h.addr(), SCRAM_USER, &[]).await;
    // Rolled back: not kept.
    for sql in ["begin", "SET statement_timeout = '150ms'", "rollback"] {
        run(&mut a, sql).await;
    }
    run(&mut b, "select 1").await;
    assert_eq!(show(&mut a, "statement_timeout").await, "0", "a rolled-back SET is not carried");
    // SET LOCAL: never kept.
    for sql in ["begin", "SET LOCAL statement_timeout = '150ms'"] {
        run(&mut a, sql).await;
    }
    assert_eq!(show(&mut a, "statement_timeout").await, "150ms", "in force inside its transaction");
    run(&mut a, "commit").await;
    run(&mut b, "select 1").await;
    assert_eq!(show(&mut a, "statement_timeout").await, "0", "SET LOCAL is not carried");
    // A savepoint's rollback undoes only what followed it.
    let block = [
        "begin",
        "SET lock_timeout = '2s'",
        "savepoint s",
        "SET work_mem = '1MB'",
        "rollback to savepoint s",
        "commit",
    ];
    for sql in block {
        run(&mut a, sql).await;
    }
    run(&mut b, "select 1").await;
    assert_eq!(show(&mut a, "lock_timeout").await, "2s", "committed");
    assert_eq!(show(&mut a, "work_mem").await, "4MB", "rolled back to the savepoint");
    // Committed, in one simple query: kept.
    // A reported parameter: its ParameterStatus reports the rollback too.
    for sql in ["begin", "SET application_name = 'rolled_back'", "rollback"] {
        run(&mut a, sql).await;
    }
    run(&mut b, "select 1").await;
    assert_eq!(show(&mut a, "application_name").await, "");
    run(&mut a, "begin; SET statement_timeout = '150ms'; commit").await;
    run(&mut b, "select 1").await;
    assert_eq!(show(&mut a, "statement_timeout").await, "150ms");
    assert_eq!(show(&mut b, "statement_timeout").await, "0");
    assert_eq!(show(&mut b, "lock_timeout").await, "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_config_at_session_level_is_followed() {
    let h = harness(1, "transaction", "trust", "").await;
    let mut a = login(h.addr(), SCRAM_USER, &[]).await;
    let mut b = login(h.addr(), SCRAM_USER, &[]).await;
    run(&mut a, "select set_config('statement_timeout', '150ms', false)").await;
    run(&mut b, "select 1").await;
    run(&mut a, "begin; select set_config('lock_timeout', '2s', true); commit").await;
    run(&mut b, "select 1").await;
    assert_eq!(show(&mut a, "statement_timeout").await, "150ms");
    assert_eq!(show(&mut a, "lock_timeout").await, "0", "is_local = true ends with the transaction");
    assert_eq!(show(&mut b, "statement_timeout").await, "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extended_protocol_set_is_followed() {
    let h = harness(2, "transaction", "trust", "").await;
    let a = h.client().await;
    let b = h.client().await;
    // tokio-postgres prepares a named statement, then binds and executes it.
    a.query("SET statement_timeout = '150ms'", &[]).await.unwrap();
    for i in 0..6 {
        if i % 2 == 0 {
            b.batch_execute("begin").await.unwrap();
        }
        let mine: String = a.query_one("show statement_timeout", &[]).await.unwrap().get(0);
        assert_eq!(mine, "150ms", "a's query {i}");
        let theirs: String = b.query_one("show statement_timeout", &[]).await.unwrap().get(0);
        assert_eq!(theirs, "0", "b, round {i}");
        if i % 2 == 0 {
            b.batch_execute("commit").await.unwrap();
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_custom_parameter_pins_its_client_and_stays_with_it() {
    let h = harness(1, "transaction", "trust", "").await;
    let mut a = login(h.addr(), SCRAM_USER, &[]).await;
    run(&mut a, "SET myapp.tenant = '7'").await;
    assert_eq!(run(&mut a, "select current_setting('myapp.tenant', true)").await.as_deref(), Some("7"));
    assert_eq!(h.pool().metrics.pinned(), 1, "weir cannot read custom settings back: it pins");
    drop(a);
    let pool = h.pool();
    assert!(weir_e2e::eventually(weir_e2e::WAIT_LIMIT, || pool.snapshot().active == 0).await);
    let mut b = login(h.addr(), SCRAM_USER, &[]).await;
    let theirs = run(&mut b, "select coalesce(current_setting('myapp.tenant', true), '')").await;
    assert_eq!(theirs.as_deref(), Some(""), "reset before another client got the server");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reset_returns_to_the_startup_settings() {
    let h = harness(1, "transaction", "trust", "").await;
    // statement_timeout is on track_extra_parameters' default list.
    let mut a = Raw::login(h.addr(), SCRAM_USER, "", &[("statement_timeout", "5s")]).await.expect("login");
    let mut b = login(h.addr(), SCRAM_USER, &[]).await;
    assert_eq!(show(&mut a, "statement_timeout").await, "5s");
    run(&mut a, "SET statement_timeout = '150ms'").await;
    run(&mut b, "select 1").await;
    assert_eq!(show(&mut a, "statement_timeout").await, "150ms");
    assert_eq!(show(&mut b, "statement_timeout").await, "0");
    run(&mut a, "RESET ALL").await;
    run(&mut b, "select 1").await;
    assert_eq!(show(&mut a, "statement_timeout").await, "5s", "RESET ALL returns to the startup value, as in Postgres");
    run(&mut a, "SET statement_timeout = '150ms'").await;
    run(&mut a, "RESET statement_timeout").await;
    run(&mut b, "select 1").await;
    assert_eq!(show(&mut a, "statement_timeout").await, "5s");
    assert_eq!(show(&mut b, "statement_timeout").await, "0");
}
