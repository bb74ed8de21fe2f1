//! Unnamed statements in transaction mode, against a real Postgres: one a
//! client parses again is served from weir's server-side statement, with
//! every reply as Postgres sends it directly (Describe, ParameterDescription,
//! errors, the unnamed statement's lifetime); one bound after a Sync works
//! on whichever server the next transaction gets; and a client whose
//! search_path differs never gets a statement planned under another one.

use std::net::SocketAddr;

use bytes::Bytes;
use weir_e2e::extended::{bind, close_statement, describe_statement, execute, parse, sync};
use weir_e2e::raw::{login, query, Raw};
use weir_e2e::{connect, harness, TRUST_PASS, TRUST_USER};

/// Every reply up to the next ReadyForQuery, as (tag, body).
async fn send(c: &mut Raw, msgs: &[Vec<u8>]) -> Vec<(char, Bytes)> {
    c.exchange(&msgs.concat()).await.into_iter().map(|(t, b)| (t as char, b)).collect()
}

/// The first DataRow's first column, as text.
fn value(replies: &[(char, Bytes)]) -> String {
    let (_, row) = replies.iter().find(|(t, _)| *t == 'D').expect("a row");
    let len = i32::from_be_bytes([row[2], row[3], row[4], row[5]]) as usize;
    String::from_utf8_lossy(&row[6..6 + len]).into_owned()
}

/// The steps both targets run, in order, each up to its ReadyForQuery.
fn script() -> Vec<Vec<Vec<u8>>> {
    let q = "select $1::int4 + 1 as n, 'x'::text as t";
    let round = vec![parse("", q), describe_statement(""), bind("", &["41"]), execute(), sync()];
    vec![
        round.clone(),
        round.clone(),
        round.clone(),
        // Bound again without a Parse, after a Sync.
        vec![bind("", &["1"]), execute(), sync()],
        // The wrong parameter count: an error naming the unnamed statement.
        vec![parse("", q), bind("", &[]), execute(), sync()],
        // A Parse that fails leaves no unnamed statement behind it.
        round.clone(),
        vec![parse("", "selec 1"), sync()],
        vec![bind("", &["1"]), execute(), sync()],
        // A simple query drops the unnamed statement, and so does Close.
        round.clone(),
        vec![query("select 1")],
        vec![bind("", &["1"]), execute(), sync()],
        round.clone(),
        vec![close_statement(""), bind("", &["1"]), execute(), sync()],
        // A Parse skipped after an error leaves the one before it.
        round.clone(),
        vec![bind("", &["x"]), execute(), parse("", "select 2"), sync()],
        vec![bind("", &["2"]), execute(), sync()],
        round,
    ]
}

async fn run(addr: SocketAddr) -> Vec<Vec<(char, Bytes)>> {
    let mut c = login(addr, TRUST_USER, &[]).await;
    let mut out = Vec::new();
    for step in script() {
        out.push(send(&mut c, &step).await);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hot_unnamed_statements_answer_as_postgres_does() {
    for after in [1, 2] {
        let h = harness(1, "transaction", "trust", &format!("prepare_unnamed_after = {after}\n")).await;
        let want = run(h.pg_addr()).await;
        let got = run(h.addr()).await;
        for (i, (w, g)) in want.iter().zip(&got).enumerate() {
            assert_eq!(w, g, "prepare_unnamed_after = {after}, step {i}: Postgres, then weir");
        }
        let m = &h.pool_for(TRUST_USER).metrics;
        assert!(m.unnamed_prepares() >= 1, "the hot statement was prepared on the server");
        assert!(m.unnamed_hits() >= 3, "and answered from there: {} hits", m.unnamed_hits());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unnamed_statement_bound_after_a_sync_works_on_another_server() {
    for (after, works) in [(2, true), (1, true), (0, false)] {
        let h = harness(2, "transaction", "trust", &format!("prepare_unnamed_after = {after}\n")).await;
        let mut a = login(h.addr(), TRUST_USER, &[]).await;
        let first = send(&mut a, &[parse("", "select pg_backend_pid()"), bind("", &[]), execute(), sync()]).await;
        // b holds the server a just used (the idle stack is LIFO), so a's
        // next transaction runs on the other one.
        let b = connect(&h.url(TRUST_USER, TRUST_PASS)).await.unwrap();
        b.batch_execute("begin; select 1").await.unwrap();
        let second = send(&mut a, &[bind("", &[]), execute(), sync()]).await;
        b.batch_execute("commit").await.unwrap();
        if works {
            assert_ne!(value(&first), value(&second), "prepare_unnamed_after = {after}: another server");
        } else {
            let tags: String = second.iter().map(|(t, _)| *t).collect();
            assert_eq!(tags, "EZ", "unnamed statements not followed: the other server has none");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_with_its_own_search_path_gets_its_own_tables() {
    let h = harness(1, "transaction", "trust", "prepare_unnamed_after = 1\n").await;
    h.psql(
        "create schema other; grant usage on schema other to public; \
         create table public.sp (v text); insert into public.sp values ('public'); \
         create table other.sp (v text); insert into other.sp values ('other'); \
         grant select on public.sp, other.sp to public;",
    );
    let round = [parse("", "select v from sp"), bind("", &[]), execute(), sync()];
    let mut plain = login(h.addr(), TRUST_USER, &[]).await;
    let mut own = login(h.addr(), TRUST_USER, &[("search_path", "other, public")]).await;
    let mut setter = login(h.addr(), TRUST_USER, &[]).await;
    for _ in 0..3 {
        assert_eq!(value(&send(&mut plain, &round).await), "public");
        assert_eq!(value(&send(&mut own, &round).await), "other", "a startup search_path is its own");
        assert_eq!(value(&send(&mut setter, &round).await), "public");
    }
    send(&mut setter, &[query("set search_path = other, public")]).await;
    for _ in 0..3 {
        assert_eq!(value(&send(&mut setter, &round).await), "other", "after SET search_path");
        assert_eq!(value(&send(&mut plain, &round).await), "public");
    }
    // The server-side statement of the plain clients saw the same settings.
    assert!(h.pool_for(TRUST_USER).metrics.unnamed_hits() >= 3);
}

/// A plan that depends on the parameter: through weir a hot unnamed
/// statement is a named one on the server, which Postgres may plan
/// generically after five executions (directly, an unnamed statement is
/// always planned for its parameters). The answers stay Postgres's.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_skewed_parameter_gets_the_rows_postgres_gives() {
    let h = harness(1, "transaction", "trust", "prepare_unnamed_after = 1\n").await;
    h.psql(
        "create table skew (k int, pad text); \
         insert into skew select case when i % 100 = 0 then i else 1 end, 'x' from generate_series(1, 20000) i; \
         create index on skew (k); analyze skew; grant select on skew to public;",
    );
    let q = "select count(*), min(k), max(k) from skew where k = $1";
    let steps: Vec<&str> = ["1", "200", "300", "400", "500", "600", "700", "1", "800", "1", "19900", "1"].into();
    let mut direct = login(h.pg_addr(), TRUST_USER, &[]).await;
    let mut through = login(h.addr(), TRUST_USER, &[]).await;
    for k in steps {
        let round = [parse("", q), bind("", &[k]), execute(), sync()];
        let want = send(&mut direct, &round).await;
        assert_eq!(send(&mut through, &round).await, want, "k = {k}");
    }
    assert!(h.pool_for(TRUST_USER).metrics.unnamed_hits() >= 10, "served from the server-side statement");
}
