//! Statement-path edges in transaction mode, each run against Postgres
//! directly and through weir, reply for reply:
//!
//! * named statements of clients whose search_path differs are planned
//!   under their own search_path (never shared with a client that resolves
//!   names elsewhere), whether it came at startup or from SET;
//! * an unnamed Parse queued behind a Sync or simple query that leaves the
//!   transaction failed gets Postgres's 25P02, not a ParseComplete of weir's;
//! * after an unnamed Parse that failed, a Bind of the unnamed statement
//!   gets Postgres's 26000, not whatever unnamed statement the server holds;
//! * a named Parse of a statement the server holds, in a failed transaction
//!   or behind a query that fails it, gets Postgres's 25P02, and leaves the
//!   server's unnamed statement alone;
//! * `SET LOCAL search_path` plans the client's statements in that path
//!   until the transaction ends;
//! * a Describe, in a failed transaction, of a statement weir must prepare
//!   first describes one that returns no rows, as Postgres does there.

use std::net::SocketAddr;

use bytes::Bytes;
use weir::protocol::tags::backend as be;
use weir_e2e::extended::{bind, describe_statement, execute, parse, sync};
use weir_e2e::raw::{login, query};
use weir_e2e::{harness, Harness, TRUST_USER};

/// One client's messages, written at once, and how many ReadyForQuery
/// messages answer them.
struct Step {
    client: usize,
    msgs: Vec<Vec<u8>>,
    readies: usize,
}

fn step(client: usize, msgs: Vec<Vec<u8>>, readies: usize) -> Step {
    Step { client, msgs, readies }
}

/// Runs `steps` with one connection per entry of `startup` (its startup
/// parameters): every reply of each step but ParameterStatus, as (tag, body).
async fn run(addr: SocketAddr, startup: &[&[(&str, &str)]], steps: &[Step]) -> Vec<Vec<(char, Bytes)>> {
    let mut clients = Vec::new();
    for extra in startup {
        clients.push(login(addr, TRUST_USER, extra).await);
    }
    let mut out = Vec::new();
    for s in steps {
        let c = &mut clients[s.client];
        c.send(&s.msgs.concat()).await.unwrap();
        let mut got = Vec::new();
        for _ in 0..s.readies {
            got.extend(c.until_ready().await.into_iter().filter(|(t, _)| *t != be::PARAMETER_STATUS));
        }
        out.push(got.into_iter().map(|(t, b)| (t as char, b)).collect());
    }
    out
}

/// Runs `steps` directly and through weir; every step must get the same replies.
async fn same_as_postgres(h: &Harness, startup: &[&[(&str, &str)]], steps: &[Step], what: &str) {
    let want = run(h.pg_addr(), startup, steps).await;
    let got = run(h.addr(), startup, steps).await;
    for (i, (w, g)) in want.iter().zip(&got).enumerate() {
        let tags = |r: &[(char, Bytes)]| r.iter().map(|m| m.0).collect::<String>();
        assert_eq!(w, g, "{what}, step {i}: Postgres sent {}, weir {}", tags(w), tags(g));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn named_statements_resolve_names_under_their_clients_search_path() {
    let h = harness(1, "transaction", "trust", "prepare_unnamed_after = 1\n").await;
    // Same table name, other column types: a statement planned under
    // another search_path shows in its ParameterDescription and rows.
    h.psql(
        "create schema sa; create schema sb; grant usage on schema sa, sb to public; \
         create table public.t (k bigint, v text); insert into public.t values (1, 'public'); \
         create table sa.t (k int, v int); insert into sa.t values (1, 10); \
         create table sb.t (k text, v text); insert into sb.t values ('1', 'sb'); \
         grant select on public.t, sa.t, sb.t to public;",
    );
    let q = "select v from t where k = $1";
    let round = |c: usize, name: &str| {
        step(c, vec![parse(name, q), describe_statement(name), bind(name, &["1"]), execute(), sync()], 1)
    };
    let steps = vec![
        round(0, "s1"),
        round(1, "s1"),
        round(2, "s1"),
        round(0, "s2"),
        step(2, vec![query("set search_path = sb")], 1),
        round(2, "s2"),
        round(1, "s2"),
        round(0, "s3"),
        round(2, "s3"),
        step(2, vec![query("reset search_path")], 1),
        round(2, "s4"),
        round(1, "s4"),
    ];
    let startup: [&[(&str, &str)]; 3] = [&[], &[("search_path", "sa")], &[]];
    same_as_postgres(&h, &startup, &steps, "named statements, one server").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unnamed_parse_behind_a_failed_transaction_gets_its_25p02() {
    let h = harness(1, "transaction", "trust", "prepare_unnamed_after = 1\n").await;
    h.psql("create table fails (a int); insert into fails values (1); grant select on fails to public;");
    let q = "select a from fails";
    let round = || vec![parse("", q), bind("", &[]), execute(), sync()];
    let steps = vec![
        // Prepared on the server from its first Parse.
        step(0, round(), 1),
        step(0, vec![query("begin")], 1),
        // The server already holds the statement: the Parse still waits
        // for the outcome of the query queued before it.
        step(0, [vec![query("select 1/0")], round()].concat(), 2),
        step(0, vec![query("rollback")], 1),
        step(0, vec![query("begin")], 1),
        // The same behind a Sync that ends a failing pipeline.
        step(0, [vec![parse("", "select 1/0"), bind("", &[]), execute(), sync()], round()].concat(), 2),
        step(0, vec![query("rollback")], 1),
        step(0, round(), 1),
    ];
    same_as_postgres(&h, &[&[]], &steps, "unnamed Parse in a failed transaction").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_hot_parse_leaves_no_unnamed_statement() {
    let h = harness(1, "transaction", "trust", "prepare_unnamed_after = 2\n").await;
    h.psql("create table gone (a int); insert into gone values (1); grant select on gone to public;");
    let q = "select a from gone";
    let run_it = || vec![bind("", &[]), execute(), sync()];
    // Extended-protocol BEGIN and ROLLBACK: a simple query would drop the
    // server's unnamed statement.
    let named = |name: &str, sql: &str| vec![parse(name, sql), bind(name, &[]), execute(), sync()];
    let steps = vec![
        // Parsed once: the server's own unnamed statement.
        step(0, [vec![parse("", q)], run_it()].concat(), 1),
        step(0, named("b", "begin"), 1),
        // Parsed again, now hot, in a transaction the pipeline before it
        // fails: the Parse fails, and Postgres drops the unnamed statement.
        step(0, [named("f", "select 1/0"), vec![parse("", q)], run_it()].concat(), 2),
        step(0, named("r", "rollback"), 1),
        step(0, run_it(), 1),
        step(0, vec![describe_statement("")], 0),
        step(0, vec![sync()], 1),
        // And it works again once parsed.
        step(0, [vec![parse("", q)], run_it()].concat(), 1),
        step(0, run_it(), 1),
    ];
    same_as_postgres(&h, &[&[]], &steps, "Bind after a failed unnamed Parse").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_named_parse_in_a_failed_transaction_gets_its_25p02() {
    let h = harness(1, "transaction", "trust", "").await;
    let steps = vec![
        step(0, vec![parse("s1", "select 1"), sync()], 1),
        step(0, vec![query("begin")], 1),
        // Behind a query that fails the transaction, the server holding it.
        step(0, vec![query("select 1/0"), parse("s2", "select 1"), sync()], 2),
        // In the failed transaction: the unnamed statement stays, and a
        // Describe of it (no rows) is answered there.
        step(0, vec![parse("", ""), sync()], 1),
        step(0, vec![parse("s3", "select 1"), sync()], 1),
        step(0, vec![describe_statement(""), sync()], 1),
        step(0, vec![query("rollback")], 1),
        step(0, vec![bind("s2", &[]), execute(), sync()], 1),
    ];
    same_as_postgres(&h, &[&[]], &steps, "named Parse in a failed transaction").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_local_search_path_plans_statements_in_that_path() {
    let h = harness(1, "transaction", "trust", "").await;
    h.psql(
        "create schema sl; grant usage on schema sl to public; \
         create table public.tl (v int); insert into public.tl values (1); \
         create table sl.tl (v text); insert into sl.tl values ('sl'); \
         grant select on public.tl, sl.tl to public;",
    );
    let q = "select v from tl";
    let steps = vec![
        // Prepared on the one server under the default search_path.
        step(0, vec![parse("a", q), bind("a", &[]), execute(), sync()], 1),
        step(1, vec![query("begin")], 1),
        step(1, vec![query("set local search_path = sl, public")], 1),
        step(1, vec![parse("b", q), describe_statement("b"), bind("b", &[]), execute(), sync()], 1),
        step(1, vec![query("commit")], 1),
        step(1, vec![parse("c", q), bind("c", &[]), execute(), sync()], 1),
    ];
    same_as_postgres(&h, &[&[], &[]], &steps, "SET LOCAL search_path").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_describe_in_a_failed_transaction_of_a_statement_weir_prepares_first() {
    let h = harness(1, "transaction", "trust", "").await;
    h.psql("create table dt (a int); grant all on dt to public;");
    let steps = vec![
        step(0, vec![query("begin")], 1),
        // Prepared in a transaction that rolls back: weir closes it and
        // prepares it again before its next use.
        step(0, vec![parse("ins", "insert into dt values ($1::int)"), sync()], 1),
        step(0, vec![query("rollback")], 1),
        step(0, vec![query("begin")], 1),
        step(0, vec![bind("missing", &[]), sync()], 1),
        step(0, vec![describe_statement("ins"), sync()], 1),
        step(0, vec![query("rollback")], 1),
        step(0, vec![describe_statement("ins"), bind("ins", &["7"]), execute(), sync()], 1),
    ];
    same_as_postgres(&h, &[&[]], &steps, "Describe in a failed transaction").await;
}
