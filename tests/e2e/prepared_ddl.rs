//! Shared prepared statements against DDL, and the client's statement
//! namespace, compared with direct Postgres: a statement prepared in a
//! rolled-back savepoint is never handed to another client; a type dropped
//! and recreated, or a table whose result type changed, gives another
//! client at most the error Postgres itself would give, and a retry after
//! Close + Parse works; 42P05 and 25P02 come as a backend sends them.

use bytes::Bytes;
use weir_e2e::extended::{bind, close_statement, execute, parse, sync};
use weir_e2e::raw::{error_fields, query, Raw};
use weir_e2e::{bounded, harness, Harness, SCRAM_USER};

/// What a backend answered, as a driver compares it: message tags, with
/// each error's SQLSTATE in brackets, and the last ReadyForQuery's status.
fn summary(replies: &[(u8, Bytes)]) -> String {
    let mut s = String::new();
    for (tag, body) in replies {
        s.push(*tag as char);
        if *tag == b'E' {
            s.push_str(&format!("[{}]", error_fields(body).0));
        }
        if *tag == b'Z' {
            s.push(body[0] as char);
        }
    }
    s
}

async fn run(c: &mut Raw, msgs: &[Vec<u8>]) -> String {
    summary(&c.exchange(&msgs.concat()).await)
}

/// A raw client through weir (trust).
async fn via_weir(h: &Harness) -> Raw {
    Raw::login(h.addr(), SCRAM_USER, "", &[]).await.expect("raw login through weir")
}

/// A raw client straight to Postgres (the superuser is trusted).
async fn direct(h: &Harness) -> Raw {
    Raw::login(h.pg_addr(), "postgres", "", &[]).await.expect("raw login to postgres")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_statement_of_a_rolled_back_savepoint_is_never_shared() {
    bounded(120, async {
        for mode in ["transaction", "session"] {
            let h = harness(1, mode, "trust", "").await;
            let mut a = via_weir(&h).await;
            for sql in ["begin", "savepoint p", "create type mood as enum ('happy')"] {
                assert_eq!(a.query(sql).await.unwrap().error, None, "{mode}: {sql}");
            }
            assert_eq!(run(&mut a, &[parse("s", "select $1::mood::text"), sync()]).await, "1ZT", "{mode}");
            assert_eq!(a.query("rollback to savepoint p").await.unwrap().error, None);
            assert_eq!(a.query("commit").await.unwrap().error, None);
            a.terminate().await;
            // Another client, the same (only) server connection.
            let b_msgs = [parse("s", "select $1::mood::text"), bind("s", &["happy"]), execute(), sync()];
            let mut b = via_weir(&h).await;
            let through = run(&mut b, &b_msgs).await;
            let straight = run(&mut direct(&h).await, &b_msgs).await;
            assert_eq!(straight, "E[42704]ZI", "Postgres: the type does not exist");
            assert_eq!(through, straight, "{mode}: the error Postgres gives, never a stale statement's");
            // Once the type exists, the same text works.
            h.psql("create type mood as enum ('happy')");
            let r = run(&mut b, &[parse("s", "select $1::mood::text"), bind("s", &["happy"]), execute(), sync()]).await;
            assert_eq!(r, "12DCZI", "{mode}");
        }
    })
    .await;
}

/// One client prepares against a type, another drops and recreates it
/// (through weir, or behind weir's back), a third prepares the same text.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_type_dropped_and_recreated_under_a_shared_statement() {
    bounded(120, async {
        for behind_weirs_back in [false, true] {
            let h = harness(1, "transaction", "trust", "").await;
            h.psql(&format!("create type color as enum ('red'); alter type color owner to {SCRAM_USER}"));
            let text = "select $1::color::text";
            let mut first = via_weir(&h).await;
            let r = run(&mut first, &[parse("c", text), bind("c", &["red"]), execute(), sync()]).await;
            assert_eq!(r, "12DCZI");
            let recreate = "drop type color; create type color as enum ('red', 'green')";
            if behind_weirs_back {
                h.psql(recreate);
            } else {
                assert_eq!(via_weir(&h).await.query(recreate).await.unwrap().error, None);
            }
            let mut third = via_weir(&h).await;
            let msgs = [parse("c", text), bind("c", &["green"]), execute(), sync()];
            let r = run(&mut third, &msgs).await;
            if behind_weirs_back {
                // weir cannot see DDL it does not carry: the stale statement's
                // error comes once, and is gone after the driver's retry.
                assert_eq!(r, "1E[XX000]ZI", "cache lookup failed, once");
                assert_eq!(run(&mut third, &[close_statement("c"), sync()]).await, "3ZI");
                assert_eq!(run(&mut third, &msgs).await, "12DCZI", "the retry works");
            } else {
                assert_eq!(r, "12DCZI", "prepared afresh after the DDL");
            }
            // The first client's own statement predates the type: Postgres
            // would fail it too; after Close + Parse it works.
            assert_eq!(run(&mut first, &[close_statement("c"), sync()]).await, "3ZI");
            let r = run(&mut first, &[parse("c", text), bind("c", &["green"]), execute(), sync()]).await;
            assert_eq!(r, "12DCZI", "behind weir's back: {behind_weirs_back}");
        }
    })
    .await;
}

/// ALTER TABLE changes the result type between two clients' executions of
/// the same statement.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn alter_table_changes_the_result_type_between_two_clients() {
    bounded(120, async {
        for behind_weirs_back in [false, true] {
            let h = harness(1, "transaction", "trust", "").await;
            h.psql(&format!(
                "create table items (id int, label int); insert into items values (1, 2); \
                 alter table items owner to {SCRAM_USER}"
            ));
            let text = "select label from items";
            let msgs = [parse("q", text), bind("q", &[]), execute(), sync()];
            let mut first = via_weir(&h).await;
            assert_eq!(run(&mut first, &msgs).await, "12DCZI");
            let alter = "alter table items alter column label type text";
            if behind_weirs_back {
                h.psql(alter);
            } else {
                assert_eq!(via_weir(&h).await.query(alter).await.unwrap().error, None);
            }
            let mut second = via_weir(&h).await;
            let r = run(&mut second, &msgs).await;
            if behind_weirs_back {
                // A client whose statement predates the ALTER gets this from
                // Postgres; this one gets it once, then never again.
                assert_eq!(r, "1E[0A000]ZI");
                assert_eq!(run(&mut second, &[close_statement("q"), sync()]).await, "3ZI");
                assert_eq!(run(&mut second, &msgs).await, "12DCZI", "the retry after Close + Parse works");
            } else {
                assert_eq!(r, "12DCZI", "behind weir's back: {behind_weirs_back}");
            }
            // And a client that comes later is served at once.
            assert_eq!(run(&mut via_weir(&h).await, &msgs).await, "12DCZI");
            let rows = via_weir(&h).await.query("select pg_typeof(label)::text from items").await.unwrap();
            assert_eq!(rows.scalar(), Some("text"));
        }
    })
    .await;
}

/// The same statement-namespace sequence straight to Postgres and through
/// weir, in both modes: the same replies, error codes and statuses.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statement_errors_are_the_ones_a_backend_gives() {
    bounded(120, async {
        let steps: Vec<Vec<Vec<u8>>> = vec![
            vec![parse("s1", "select 1"), sync()],
            // 42P05: a held name, whatever the text.
            vec![parse("s1", "select 2"), bind("s1", &[]), execute(), sync()],
            vec![parse("s1", "select 1"), sync()],
            // The text is checked before the name.
            vec![parse("s1", "select * from no_such_table"), sync()],
            // The unnamed statement is re-parsed freely.
            vec![parse("", "select 1"), parse("", "select 2"), bind("", &[]), execute(), sync()],
            vec![close_statement("s1"), parse("s1", "select 3"), bind("s1", &[]), execute(), sync()],
            // Two Parses of one new name in a batch.
            vec![parse("s2", "select 1"), parse("s2", "select 1"), sync()],
            vec![bind("s2", &[]), execute(), sync()],
            // 25P02 in a failed transaction, for a text already on the server,
            // a new text, and a held name; COMMIT/ROLLBACK still parse.
            vec![query("begin")],
            vec![query("select 1/0")],
            vec![parse("s3", "select 1"), sync()],
            vec![parse("s4", "select 42"), sync()],
            vec![parse("s1", "select 1"), sync()],
            vec![parse("s5", "rollback"), bind("s5", &[]), execute(), sync()],
            vec![bind("s3", &[]), execute(), sync()],
            vec![query("deallocate s3")],
            vec![query("deallocate s5")],
            vec![parse("s5", "select 5"), bind("s5", &[]), execute(), sync()],
        ];
        for mode in ["transaction", "session"] {
            let h = harness(1, mode, "trust", "").await;
            let mut straight = direct(&h).await;
            let mut through = via_weir(&h).await;
            for (i, msgs) in steps.iter().enumerate() {
                let want = run(&mut straight, msgs).await;
                let got = run(&mut through, msgs).await;
                assert_eq!(got, want, "{mode}, step {i}");
            }
        }
    })
    .await;
}

/// The driver case: tokio-postgres clients around an ALTER TABLE run by
/// another client through weir; a statement prepared after it works, and
/// one prepared before works again once prepared afresh.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_driver_prepares_across_an_alter_table() {
    bounded(120, async {
        let h = harness(1, "transaction", "trust", "").await;
        h.psql(&format!(
            "create table items (id int, label int); insert into items values (1, 2); \
             alter table items owner to {SCRAM_USER}"
        ));
        let first = h.client().await;
        let before = first.prepare("select label from items").await.unwrap();
        let n: i32 = first.query_one(&before, &[]).await.unwrap().get(0);
        assert_eq!(n, 2);
        h.client().await.batch_execute("alter table items alter column label type text").await.unwrap();
        let second = h.client().await;
        let after = second.prepare("select label from items").await.unwrap();
        let s: String = second.query_one(&after, &[]).await.unwrap().get(0);
        assert_eq!(s, "2", "prepared after the ALTER: the new result type");
        drop(before);
        let again = first.prepare("select label from items").await.unwrap();
        let s: String = first.query_one(&again, &[]).await.unwrap().get(0);
        assert_eq!(s, "2", "prepared afresh by the first client");
    })
    .await;
}

/// A client holds a statement (its result column an int) when the column
/// becomes text. Straight to Postgres, its next execution gets 0A000
/// ("cached plan must not change result type"); through weir, where the
/// ALTER starts a new statement generation, it gets the same, never rows of
/// a type it was not told (asyncpg's test_prepare_statement_invalid read
/// such rows as "insufficient data in buffer"). Pool of one, so the held
/// statement's server is the one it runs on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_held_statement_whose_result_type_changed_gets_0a000() {
    bounded(120, async {
        let h = harness(1, "transaction", "trust", "").await;
        let text = "select label from held";
        let mut seen = Vec::new();
        for through_weir in [false, true] {
            h.psql(&format!(
                "drop table if exists held; create table held (id int, label int); insert into held values (1, 2); \
                 alter table held owner to {SCRAM_USER}"
            ));
            let mut c = if through_weir { via_weir(&h).await } else { direct(&h).await };
            assert_eq!(run(&mut c, &[parse("q", text), bind("q", &[]), execute(), sync()]).await, "12DCZI");
            let alter = c.query("alter table held alter column label type text").await.unwrap();
            assert_eq!(alter.error, None);
            seen.push(run(&mut c, &[bind("q", &[]), execute(), sync()]).await);
        }
        assert_eq!(seen[0], "E[0A000]ZI", "straight to Postgres");
        assert_eq!(seen[1], seen[0], "through weir, as straight to Postgres");
    })
    .await;
}
