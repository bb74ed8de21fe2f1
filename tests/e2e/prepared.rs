//! Named prepared statements in transaction mode, against a real Postgres:
//! statements follow their client from server to server, errors keep their
//! meaning (a failing Parse is the client's error, an unknown name gets
//! Postgres's own 26000), DEALLOCATE, DEALLOCATE ALL and DISCARD ALL are
//! followed, `max_prepared_statements = 0` turns it off, SHOW STATS counts
//! parses and binds, and session features pin the client to its server,
//! which is reset before anyone else gets it.

use bytes::Bytes;
use weir_e2e::extended::{bind, close_statement, describe_statement, execute, parse, sync};
use weir_e2e::raw::{error_fields, login, query, Raw};
use weir_e2e::{connect, eventually, harness, sqlstate, SCRAM_PASS, SCRAM_USER};

/// The SQLSTATE of an ErrorResponse body.
fn code(body: &[u8]) -> String {
    error_fields(body).0
}

/// Sends messages and returns every reply up to the next ReadyForQuery.
async fn send(c: &mut Raw, msgs: &[Vec<u8>]) -> Vec<(u8, Bytes)> {
    c.exchange(&msgs.concat()).await
}

fn tags(replies: &[(u8, Bytes)]) -> String {
    replies.iter().map(|(t, _)| *t as char).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_follow_their_client_to_another_server() {
    for (max, works) in [("200", true), ("0", false)] {
        let h = harness(2, "transaction", "trust", &format!("max_prepared_statements = {max}\n")).await;
        let a = h.client().await;
        let b = connect(&h.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
        let pid = a.prepare("select pg_backend_pid()").await.unwrap();
        let first: i32 = a.query_one(&pid, &[]).await.unwrap().get(0);
        // b holds the server a just used (the idle stack is LIFO), so a's
        // next transaction runs on the other one.
        b.batch_execute("begin; select 1").await.unwrap();
        let second = a.query_one(&pid, &[]).await;
        b.batch_execute("commit").await.unwrap();
        if works {
            let second: i32 = second.unwrap().get(0);
            assert_ne!(first, second, "the second query ran on another server");
            let m = &h.pool().metrics;
            assert_eq!(m.client_parses(), 1);
            assert_eq!(m.server_parses(), 2, "prepared again, transparently, on the second server");
            // SHOW SERVERS lists each server's cache (PgBouncer's column),
            // published when a lease ends: just after its client has the
            // answer, so wait for both servers to be back.
            let back = eventually(weir_e2e::WAIT_LIMIT, || h.pool().snapshot().active == 0).await;
            assert!(back, "both servers return to the pool: {:?}", h.pool().snapshot());
            let admin = connect(&format!("postgres://admin:admin_pass@{}/weir", h.addr())).await.unwrap();
            let mut counts = vec![];
            for m in admin.simple_query("SHOW SERVERS").await.unwrap() {
                if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                    counts.push(r.get("prepared_statements").unwrap().to_owned());
                }
            }
            assert_eq!(counts, ["1", "1"], "one statement on each server");
        } else {
            let e = second.unwrap_err();
            assert_eq!(sqlstate(&e).as_deref(), Some("26000"), "without tracking the statement is unknown there: {e}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_keep_their_meaning() {
    let h = harness(2, "transaction", "trust", "").await;
    let mut c = login(h.addr(), SCRAM_USER, &[]).await;
    let r = send(&mut c, &[bind("never_prepared", &[]), execute(), sync()]).await;
    assert_eq!(tags(&r), "EZ");
    assert_eq!(code(&r[0].1), "26000", "Postgres's own answer");
    let r = send(&mut c, &[parse("bad", "select * from no_such_table"), sync()]).await;
    assert_eq!(tags(&r), "EZ");
    assert_eq!(code(&r[0].1), "42P01", "the failing Parse is the client's error");
    let r = send(&mut c, &[bind("bad", &[]), execute(), sync()]).await;
    assert_eq!(code(&r[0].1), "26000", "a failed Parse defined nothing");
    let r =
        send(&mut c, &[parse("ok", "select 1"), bind("ok", &[]), execute(), parse("later", "select 2"), sync()]).await;
    assert_eq!(tags(&r), "12DC1Z");
    // A batch failing midway: the ParseComplete weir owes before the failure
    // comes (ok2 is already on the server), nothing after it until ReadyForQuery.
    let r =
        send(&mut c, &[parse("ok2", "select 1"), parse("bad2", "select 1/0"), bind("bad2", &[]), execute(), sync()])
            .await;
    assert_eq!(tags(&r), "11EZ", "planning at Bind folds 1/0: {r:?}");
    assert_eq!(code(&r[2].1), "22012");
    let r = send(&mut c, &[describe_statement("ok2"), sync()]).await;
    assert_eq!(tags(&r), "tTZ", "Describe replies are the server's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deallocate_and_close_are_followed() {
    let h = harness(2, "transaction", "trust", "").await;
    let mut c = login(h.addr(), SCRAM_USER, &[]).await;
    assert_eq!(tags(&send(&mut c, &[parse("s1", "select 1"), sync()]).await), "1Z");
    let r = send(&mut c, &[query("DEALLOCATE s1")]).await;
    assert_eq!(tags(&r), "CZ");
    assert_eq!(&r[0].1[..], b"DEALLOCATE\0");
    assert_eq!(code(&send(&mut c, &[bind("s1", &[]), execute(), sync()]).await[0].1), "26000");
    assert_eq!(tags(&send(&mut c, &[parse("s1", "select 1"), sync()]).await), "1Z");
    assert_eq!(tags(&send(&mut c, &[close_statement("s1"), sync()]).await), "3Z");
    assert_eq!(code(&send(&mut c, &[bind("s1", &[]), execute(), sync()]).await[0].1), "26000");
    assert_eq!(tags(&send(&mut c, &[parse("s2", "select 2"), sync()]).await), "1Z");
    assert_eq!(tags(&send(&mut c, &[query("DEALLOCATE ALL")]).await), "CZ");
    assert_eq!(code(&send(&mut c, &[bind("s2", &[]), execute(), sync()]).await[0].1), "26000");
    // The server's statements were dropped too; preparing again still works.
    let r = send(&mut c, &[parse("s3", "select 2"), bind("s3", &[]), execute(), sync()]).await;
    assert_eq!(tags(&r), "12DCZ", "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_pins_the_client_and_its_server_is_reset_after() {
    let h = harness(2, "transaction", "trust", "").await;
    let a = h.client().await;
    a.batch_execute("LISTEN jobs").await.unwrap();
    let pids: Vec<i32> = {
        let mut v = vec![];
        for _ in 0..5 {
            v.push(a.query_one("select pg_backend_pid()", &[]).await.unwrap().get(0));
        }
        v
    };
    assert!(pids.windows(2).all(|w| w[0] == w[1]), "pinned to one server: {pids:?}");
    assert_eq!(h.pool().metrics.pinned(), 1);
    drop(a);
    let pool = h.pool();
    assert!(eventually(weir_e2e::WAIT_LIMIT, || pool.snapshot().active == 0).await);
    // Whoever gets that server now does not inherit the LISTEN.
    for _ in 0..4 {
        let c = h.client().await;
        let n: i64 = c.query_one("select count(*) from pg_listening_channels()", &[]).await.unwrap().get(0);
        assert_eq!(n, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_set_gets_no_notice_from_weir() {
    let h = harness(2, "transaction", "trust", "").await;
    let mut c = login(h.addr(), SCRAM_USER, &[]).await;
    // Postgres 18 reports search_path (ParameterStatus), which weir passes on.
    let reported = h.psql("show server_version_num").trim().parse::<u32>().unwrap() >= 180_000;
    let set = if reported { "CSZ" } else { "CZ" };
    assert_eq!(tags(&send(&mut c, &[query("SET search_path = public")]).await), set, "followed (settings.rs)");
    assert_eq!(tags(&send(&mut c, &[query("SET LOCAL search_path = public")]).await), "NCZ", "Postgres's own warning");
    assert_eq!(tags(&send(&mut c, &[query("SET application_name = 'x'")]).await), "CSZ", "reported: weir carries it");
}

/// DISCARD ALL and DEALLOCATE ALL (simple or extended protocol) drop the
/// client's statements, as on Postgres: a Bind of one then gets Postgres's
/// 26000 and the client keeps its connection. Another client holding the
/// same statement (one server-side statement for both) keeps using it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn discard_all_and_deallocate_all_forget_the_clients_statements() {
    let h = harness(2, "transaction", "trust", "").await;
    let mut a = login(h.addr(), SCRAM_USER, &[]).await;
    let mut b = login(h.addr(), SCRAM_USER, &[]).await;
    for drop_all in [
        vec![query("DISCARD ALL")],
        vec![query("deallocate all")],
        vec![parse("", "DEALLOCATE ALL"), bind("", &[]), execute(), sync()],
    ] {
        let r = send(&mut a, &[parse("s1", "select 1"), bind("s1", &[]), execute(), sync()]).await;
        assert_eq!(tags(&r), "12DCZ", "{r:?}");
        let r = send(&mut b, &[parse("s1", "select 1"), bind("s1", &[]), execute(), sync()]).await;
        assert_eq!(tags(&r), "12DCZ", "{r:?}");
        let r = send(&mut a, &drop_all).await;
        assert!(tags(&r).ends_with("CZ"), "{r:?}");
        let r = send(&mut a, &[bind("s1", &[]), execute(), sync()]).await;
        assert_eq!(tags(&r), "EZ", "{r:?}");
        assert_eq!(code(&r[0].1), "26000", "Postgres's own answer after {drop_all:?}");
        // The client stays, and its statement namespace is empty.
        assert_eq!(tags(&send(&mut a, &[query("select 1")]).await), "TDCZ");
        let r = send(&mut b, &[bind("s1", &[]), execute(), sync()]).await;
        assert_eq!(tags(&r), "2DCZ", "the other client's statement still works: {r:?}");
        // Both drop theirs for the next round.
        assert_eq!(tags(&send(&mut b, &[close_statement("s1"), sync()]).await), "3Z");
    }
}

/// SHOW STATS counts as PgBouncer does: a client's Parse of a named
/// statement, each Parse weir sends a server, each Bind of a named
/// statement; unnamed ones are not counted, and with
/// max_prepared_statements = 0 nothing is. The counts are in before the
/// client has its answer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn binds_and_parses_are_counted_in_show_stats() {
    for (max, counted) in [("200", (1, 2, 4)), ("0", (0, 0, 0))] {
        let h = harness(2, "transaction", "trust", &format!("max_prepared_statements = {max}\n")).await;
        let mut a = login(h.addr(), SCRAM_USER, &[]).await;
        let r = send(&mut a, &[parse("s1", "select 1"), bind("s1", &[]), execute(), sync()]).await;
        assert_eq!(tags(&r), "12DCZ", "{r:?}");
        let r = send(&mut a, &[bind("s1", &[]), execute(), bind("s1", &[]), execute(), sync()]).await;
        assert_eq!(tags(&r), "2DC2DCZ", "{r:?}");
        let r = send(&mut a, &[parse("", "select 2"), bind("", &[]), execute(), sync()]).await;
        assert_eq!(tags(&r), "12DCZ", "{r:?}");
        if max != "0" {
            // Another client holds a's server in a transaction: a's next
            // Bind goes to the other server, where weir prepares s1 first.
            let b = connect(&h.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
            b.batch_execute("begin; select 1").await.unwrap();
            let r = send(&mut a, &[bind("s1", &[]), execute(), sync()]).await;
            assert_eq!(tags(&r), "2DCZ", "{r:?}");
            b.batch_execute("commit").await.unwrap();
        }
        let m = &h.pool().metrics;
        assert_eq!((m.client_parses(), m.server_parses(), m.binds()), counted);
        let admin = connect(&format!("postgres://admin:admin_pass@{}/weir", h.addr())).await.unwrap();
        let mut row = None;
        for m in admin.simple_query("SHOW STATS").await.unwrap() {
            if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                if r.get("database") == Some("app") {
                    let n = |c: &str| r.get(c).unwrap().parse::<u64>().unwrap();
                    row = Some((n("total_client_parse_count"), n("total_server_parse_count"), n("total_bind_count")));
                }
            }
        }
        assert_eq!(row, Some(counted), "SHOW STATS's app row (max_prepared_statements = {max})");
    }
}
