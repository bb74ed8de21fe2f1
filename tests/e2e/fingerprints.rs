//! One hot statement cannot take the pool: transactions that queue are
//! fingerprinted by their first statement; a freed server goes to the
//! statement holding the fewest servers, and one at its cap
//! (`max_fingerprint_share`) leaves a server idle for another; SHOW QUERIES
//! and the published `/metrics` series name them; a bare BEGIN that would
//! queue is answered as Postgres answers it and sent ahead of the next
//! statement.
//!
//! Raw clients (trust) send a query and read its answer later, so the order
//! in which the pool serves them is seen directly. Every wait is bounded.

use std::time::Duration;

use weir_e2e::console::{console, show};
use weir_e2e::raw::{self, Raw};
use weir_e2e::{Harness, Opts, TRUST_USER};

/// A step that should come at once, but may take this long on a loaded machine.
const PROMPT: Duration = Duration::from_secs(3);

async fn start(pool_size: u32, general: &str) -> Harness {
    Harness::start(Opts { pool_size, auth_type: "trust", general: general.into(), ..Opts::default() }).await
}

async fn client(h: &Harness) -> Raw {
    raw::login(h.addr(), TRUST_USER, &[]).await
}

/// A client holding a server in an open transaction.
async fn holder(h: &Harness) -> Raw {
    let mut c = client(h).await;
    assert_eq!(c.query("begin").await.unwrap().status, b'T');
    c.query_one("select pg_backend_pid()").await;
    c
}

/// Waits until the pool has `n` clients queued.
async fn until_waiting(h: &Harness, n: u32) {
    let pool = h.pool_for(TRUST_USER);
    let ok = weir_e2e::eventually(weir_e2e::WAIT_LIMIT, || pool.snapshot().waiting == n).await;
    assert!(ok, "expected {n} waiting, the pool is {:?}", pool.snapshot());
}

/// The answer to a query sent earlier, within `limit`.
async fn answer(c: &mut Raw, limit: Duration) -> raw::Reply {
    tokio::time::timeout(limit, c.reply()).await.expect("answered in time").expect("answer")
}

async fn commit(c: &mut Raw) {
    assert_eq!(c.query("commit").await.unwrap().status, b'I');
}

#[tokio::test]
async fn a_freed_server_goes_to_the_statement_holding_the_fewest() {
    let h = start(3, "max_fingerprint_share = 1.0").await;
    let mut holders = [holder(&h).await, holder(&h).await, holder(&h).await];
    let (mut a1, mut a2, mut b) = (client(&h).await, client(&h).await, client(&h).await);
    a1.send_query("select pg_sleep(4)").await.unwrap();
    until_waiting(&h, 1).await;
    commit(&mut holders[0]).await;
    until_waiting(&h, 0).await;
    // A second sleep queues before the other statement: FIFO would serve it first.
    a2.send_query("select pg_sleep(4)").await.unwrap();
    until_waiting(&h, 1).await;
    b.send_query("select 42").await.unwrap();
    until_waiting(&h, 2).await;
    commit(&mut holders[1]).await;
    let got = answer(&mut b, PROMPT).await;
    assert_eq!(got.scalar(), Some("42"), "the statement holding no server is served first");
    // The sleep that queued first is still waiting or only just started.
    commit(&mut holders[2]).await;
    assert!(answer(&mut a2, Duration::from_secs(20)).await.error.is_none(), "the other statement is served too");
    assert!(answer(&mut a1, Duration::from_secs(20)).await.error.is_none());
}

#[tokio::test]
async fn a_statement_at_its_cap_leaves_a_server_for_another() {
    // pool_size 2 at share 0.5: one statement may hold 1 while others are active.
    let h = start(2, "max_fingerprint_share = 0.5").await;
    let mut holders = [holder(&h).await, holder(&h).await];
    let (mut a1, mut a2) = (client(&h).await, client(&h).await);
    let (mut b1, mut b2) = (client(&h).await, client(&h).await);
    a1.send_query("select pg_sleep(3)").await.unwrap();
    until_waiting(&h, 1).await;
    commit(&mut holders[0]).await;
    until_waiting(&h, 0).await;
    a2.send_query("select pg_sleep(3)").await.unwrap();
    b1.send_query("select 42").await.unwrap();
    until_waiting(&h, 2).await;
    commit(&mut holders[1]).await;
    assert_eq!(answer(&mut b1, PROMPT).await.scalar(), Some("42"));
    // The server b1 gave back stays idle for the other statement, not the
    // sleep at its cap; the next one of it takes it at once.
    b2.send_query("select 43").await.unwrap();
    assert_eq!(answer(&mut b2, PROMPT).await.scalar(), Some("43"), "served from the server kept idle");
    // The held-back statement is not starved: it runs once the other is quiet.
    assert!(answer(&mut a2, Duration::from_secs(20)).await.error.is_none());
    assert!(answer(&mut a1, Duration::from_secs(20)).await.error.is_none());
}

#[tokio::test]
async fn show_queries_names_the_statement_holding_the_servers() {
    let h = start(2, "max_fingerprint_share = 1.0").await;
    let mut holders = [holder(&h).await, holder(&h).await];
    let (mut a1, mut a2, mut b, mut e) = (client(&h).await, client(&h).await, client(&h).await, client(&h).await);
    a1.send_query("SELECT pg_sleep(2) -- a comment").await.unwrap();
    a2.send_query("select   PG_SLEEP( 2.5 )").await.unwrap();
    until_waiting(&h, 2).await;
    commit(&mut holders[0]).await;
    commit(&mut holders[1]).await;
    until_waiting(&h, 0).await;
    b.send_query("select 42").await.unwrap();
    until_waiting(&h, 1).await;
    let admin = console(&h).await;
    let rows = show(&admin, "show queries").await.unwrap();
    let top = &rows[0];
    assert_eq!(top["query"], "select pg_sleep ( ? )", "{rows:?}");
    assert_eq!((top["servers_held"].as_str(), top["calls"].as_str()), ("2", "2"), "{rows:?}");
    assert_eq!(top["fingerprint"].len(), 16);
    let waiting = rows.iter().find(|r| r["query"] == "select ?").expect("the waiting statement is listed");
    assert_eq!((waiting["waiting"].as_str(), waiting["servers_held"].as_str()), ("1", "0"));
    assert_eq!(answer(&mut b, Duration::from_secs(20)).await.scalar(), Some("42"));
    answer(&mut a1, Duration::from_secs(20)).await;
    answer(&mut a2, Duration::from_secs(20)).await;
    // Errors are counted by SQLSTATE for the transaction's statement.
    let mut hold = holder(&h).await;
    let mut hold2 = holder(&h).await;
    assert_eq!(e.query("begin").await.unwrap().status, b'T');
    e.send_query("select 1/0").await.unwrap();
    until_waiting(&h, 1).await;
    commit(&mut hold).await;
    assert_eq!(answer(&mut e, PROMPT).await.error.map(|(code, _)| code).as_deref(), Some("22012"));
    assert_eq!(e.query("select 1").await.unwrap().error.map(|(code, _)| code).as_deref(), Some("25P02"));
    assert_eq!(e.query("rollback").await.unwrap().status, b'I');
    commit(&mut hold2).await;
    let rows = show(&admin, "show queries").await.unwrap();
    let div = rows.iter().find(|r| r["query"] == "select ? / ?").expect("listed");
    assert_eq!((div["errors_25p02"].as_str(), div["errors_other"].as_str()), ("1", "1"), "{rows:?}");
}

#[tokio::test]
async fn a_bare_begin_that_would_queue_is_answered_as_postgres_answers_it() {
    let h = start(1, "").await;
    h.psql("create table if not exists begun (id int); grant all on begun to public;");
    let mut hold = holder(&h).await;
    let mut c = client(&h).await;
    // BEGIN and COMMIT with nothing between: answered with no server.
    let begin = c.exchange(b"Q\0\0\0\x0aBEGIN\0").await;
    assert_eq!(begin, vec![(b'C', "BEGIN\0".into()), (b'Z', "T".into())]);
    let done = c.exchange(b"Q\0\0\0\x0bCOMMIT\0").await;
    assert_eq!(done, vec![(b'C', "COMMIT\0".into()), (b'Z', "I".into())]);
    // A held BEGIN goes to the server ahead of the statement after it.
    assert_eq!(c.query("begin").await.unwrap().status, b'T');
    c.send_query("insert into begun values (1)").await.unwrap();
    until_waiting(&h, 1).await;
    commit(&mut hold).await;
    assert_eq!(answer(&mut c, PROMPT).await.status, b'T', "still in the transaction");
    assert_eq!(h.psql("select count(*) from begun").trim(), "0", "not committed yet");
    commit(&mut c).await;
    assert_eq!(h.psql("select count(*) from begun").trim(), "1");
    // SET LOCAL first: it is the transaction's, and gone after it.
    let mut hold = holder(&h).await;
    assert_eq!(c.query("begin").await.unwrap().status, b'T');
    c.send_query("set local statement_timeout = '7s'").await.unwrap();
    until_waiting(&h, 1).await;
    commit(&mut hold).await;
    assert_eq!(answer(&mut c, PROMPT).await.status, b'T');
    assert_eq!(c.query_one("show statement_timeout").await, "7s");
    commit(&mut c).await;
    assert_eq!(c.query_one("show statement_timeout").await, "0");
    // A BEGIN Postgres refuses is not held back: its error is Postgres's.
    let refused = c.query("begin isolation level bogus").await.unwrap();
    assert_eq!(refused.error.map(|(code, _)| code).as_deref(), Some("42601"));
    assert_eq!(refused.status, b'I');
}

#[tokio::test]
async fn a_statement_refused_after_a_held_begin_fails_the_transaction() {
    let h = start(1, "query_wait_timeout = \"300ms\"").await;
    let mut hold = holder(&h).await;
    let mut c = client(&h).await;
    assert_eq!(c.query("begin").await.unwrap().status, b'T');
    let timed_out = c.query("select 1").await.unwrap();
    assert!(timed_out.error.is_some(), "no server in time");
    assert_eq!(timed_out.status, b'E', "the client's transaction has failed, as on Postgres");
    let ignored = c.query("select 2").await.unwrap();
    assert_eq!((ignored.error.map(|(code, _)| code).as_deref(), ignored.status), (Some("25P02"), b'E'));
    let rolled = c.exchange(b"Q\0\0\0\x0dROLLBACK\0").await;
    assert_eq!(rolled, vec![(b'C', "ROLLBACK\0".into()), (b'Z', "I".into())]);
    commit(&mut hold).await;
    assert_eq!(c.query_one("select 3").await, "3");
}

#[tokio::test]
async fn a_fingerprint_leaving_the_top_k_leaves_the_published_series() {
    let h = start(1, "top_queries = 1").await;
    let pool = || h.pool_for(TRUST_USER);
    let queued = |sql: &'static str| {
        let h = &h;
        async move {
            let mut hold = holder(h).await;
            let mut c = client(h).await;
            c.send_query(sql).await.unwrap();
            until_waiting(h, 1).await;
            commit(&mut hold).await;
            assert!(answer(&mut c, Duration::from_secs(20)).await.error.is_none());
        }
    };
    let fp = |sql: &str| weir::protocol::fingerprint::fingerprint(sql.as_bytes()).fingerprint.hex();
    let series = || pool().metrics.fingerprint_series();
    queued("select pg_sleep(0.2)").await;
    let sleep_fp = fp("select pg_sleep(0.2)");
    let ok = weir_e2e::eventually(weir_e2e::WAIT_LIMIT, || series().first().is_some_and(|s| s.fingerprint == sleep_fp))
        .await;
    assert!(ok, "the sleep is the top statement: {:?}", series());
    // A statement with more server time takes the only place; the sleep's
    // series goes, summed into `other`.
    for _ in 0..2 {
        queued("select pg_sleep(0.5), 'longer'").await;
    }
    let longer_fp = fp("select pg_sleep(0.5), 'longer'");
    let ok = weir_e2e::eventually(weir_e2e::WAIT_LIMIT, || {
        let now = series();
        now.first().is_some_and(|s| s.fingerprint == longer_fp)
            && !now.iter().any(|s| s.fingerprint == sleep_fp)
            && now.last().is_some_and(|s| s.fingerprint == weir_metrics::OTHER && s.calls >= 1)
    })
    .await;
    assert!(ok, "{:?}", series());
}

#[tokio::test]
async fn literals_of_every_kind_make_one_statement() {
    let pairs: &[(&str, &str)] = &[
        ("select 1 + 2.5e3, 42", "SELECT 7 + .5 , 1E-3"),
        ("select 'a''b' as s", "select 'zz' AS s"),
        ("select E'a\\'b' as e", "select e'c' as e"),
        ("select $$x$$ as d", "select $t$y;$t$ as d"),
        ("select -5 as n", "select -17 as n"),
        ("select true and false as b", "select FALSE and true as b"),
        ("select count(*) from pg_class where oid in (1, 2, 3)", "select count(*) from pg_class where oid in (4)"),
        ("select 1 /* a comment */ as c", "select\n  2   -- another\n as c"),
    ];
    let h = start(1, "").await;
    let mut hold = holder(&h).await;
    let mut clients = Vec::new();
    for (i, sql) in pairs.iter().flat_map(|(a, b)| [a, b]).enumerate() {
        let mut c = client(&h).await;
        c.send_query(sql).await.unwrap();
        until_waiting(&h, i as u32 + 1).await;
        clients.push(c);
    }
    commit(&mut hold).await;
    for c in &mut clients {
        let reply = answer(c, Duration::from_secs(30)).await;
        assert!(reply.error.is_none(), "{reply:?}");
    }
    let rows = show(&console(&h).await, "show queries").await.unwrap();
    for (a, b) in pairs {
        let text = weir::protocol::fingerprint::normalized(a.as_bytes(), 200);
        assert_eq!(text, weir::protocol::fingerprint::normalized(b.as_bytes(), 200), "{a} and {b}");
        let row = rows.iter().find(|r| r["query"] == text).unwrap_or_else(|| panic!("{text} in {rows:?}"));
        assert_eq!(row["calls"], "2", "{a} and {b} are one statement: {rows:?}");
    }
    let texts: Vec<&str> = rows.iter().map(|r| r["query"].as_str()).collect();
    assert!(texts.contains(&"select ? + ? , ?"), "{texts:?}");
    assert!(texts.contains(&"select ? as s"), "{texts:?}");
}

#[tokio::test]
async fn a_bind_of_the_unnamed_statement_never_parsed_gets_postgres_own_error() {
    use weir_e2e::extended::{bind, execute, sync};
    let h = start(2, "").await;
    let batch = [bind("", &[]), execute(), sync()].concat();
    let mut through = client(&h).await;
    let got = through.exchange(&batch).await;
    let error = got.iter().find(|(tag, _)| *tag == b'E').expect("an ErrorResponse");
    let text = String::from_utf8_lossy(&error.1);
    assert!(text.contains("C26000"), "{text}");
    assert!(text.contains("unnamed prepared statement does not exist"), "names the unnamed statement: {text}");
    assert_eq!(got.last().map(|(tag, body)| (*tag, body.to_vec())), Some((b'Z', b"I".to_vec())));
    // The session goes on.
    assert_eq!(through.query_one("select 5").await, "5");
}
