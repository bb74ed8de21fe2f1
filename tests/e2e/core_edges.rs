//! Edges of the forwarded byte stream with real clients: messages far larger
//! than weir's whole-message threshold (queries, parameters, COPY rows, rows),
//! portals fetched a few rows at a time (PortalSuspended), empty queries,
//! parameter changes that a rollback undoes, and replies to what a client
//! wrote past its Sync, which the server sends right behind a ReadyForQuery.

use bytes::Bytes;
use futures_util::SinkExt;
use tokio_postgres::types::Type;
use tokio_postgres::{Client, SimpleQueryMessage};
use weir_e2e::{bounded, sqlstate, Harness, Opts};

async fn one_text(c: &Client, sql: &str) -> String {
    let rows = c.simple_query(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.into_iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("").to_owned()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{sql}: no row"))
}

/// Messages of several megabytes stream through in pieces, both ways, and
/// the connection stays in step afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn multi_megabyte_messages_both_ways() {
    bounded(60, async {
        let h = Harness::start(Opts::default()).await;
        let c = h.client().await;
        let big = "y".repeat(3 << 20);
        // A 3 MB simple query.
        let n = one_text(&c, &format!("select length('{big}')")).await;
        assert_eq!(n, (3 << 20).to_string());
        // A 3 MB bind parameter (extended protocol, unnamed statement).
        let row = c.query_typed_one("select length($1), md5($1)", &[(&big, Type::TEXT)]).await.unwrap();
        assert_eq!(row.get::<_, i32>(0), 3 << 20);
        let md5_direct = h.psql(&format!("select md5(repeat('y', {}))", 3 << 20));
        assert_eq!(row.get::<_, &str>(1), md5_direct);
        // A 3 MB row back.
        let back = c.query_typed_one("select repeat('z', $1)", &[(&(3i32 << 20), Type::INT4)]).await.unwrap();
        assert!(back.get::<_, &str>(0).len() == 3 << 20 && back.get::<_, &str>(0).bytes().all(|b| b == b'z'));
        // A 3 MB COPY row.
        c.batch_execute("create table t_wide (v text)").await.unwrap();
        let sink = c.copy_in("copy t_wide from stdin").await.unwrap();
        futures_util::pin_mut!(sink);
        sink.send(Bytes::from(format!("{big}\n"))).await.unwrap();
        assert_eq!(sink.finish().await.unwrap(), 1);
        assert_eq!(one_text(&c, "select length(v) from t_wide").await, (3 << 20).to_string());
        assert_eq!(one_text(&c, "select 'in step'").await, "in step");
    })
    .await
}

/// A portal read a few rows at a time (Execute with a row limit answers
/// PortalSuspended) inside a transaction, on a pool where others wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn portal_fetched_in_pieces() {
    bounded(60, async {
        let h = Harness::start(Opts { pool_size: 1, ..Default::default() }).await;
        let mut c = h.client().await;
        let other = h.client().await;
        let tx = c.transaction().await.unwrap();
        let stmt = tx.prepare("select i from generate_series(1, 95) i").await.unwrap();
        let portal = tx.bind(&stmt, &[]).await.unwrap();
        let mut seen = Vec::new();
        loop {
            let rows = tx.query_portal(&portal, 10).await.unwrap();
            if rows.is_empty() {
                break;
            }
            seen.extend(rows.iter().map(|r| r.get::<_, i32>(0)));
        }
        assert_eq!(seen, (1..=95).collect::<Vec<_>>());
        tx.commit().await.unwrap();
        assert_eq!(one_text(&other, "select 'next'").await, "next");
    })
    .await
}

/// Empty queries get EmptyQueryResponse and ReadyForQuery, simple and extended.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn empty_queries() {
    bounded(60, async {
        let h = Harness::start(Opts::default()).await;
        let c = h.client().await;
        for sql in ["", ";", "  ;  ; "] {
            let msgs = c.simple_query(sql).await.unwrap();
            assert!(msgs.iter().all(|m| !matches!(m, SimpleQueryMessage::Row(_))), "{sql:?}");
        }
        assert!(c.query_typed("", &[]).await.unwrap().is_empty());
        assert_eq!(one_text(&c, "select 'after empties'").await, "after empties");
    })
    .await
}

/// A SET that a rollback undoes is undone for weir too: the next client of
/// the same server and the same client later both see the right values.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolled_back_set_is_forgotten() {
    bounded(60, async {
        let h = Harness::start(Opts { pool_size: 1, ..Default::default() }).await;
        let url = format!("{}?application_name=steady", h.url(weir_e2e::SCRAM_USER, weir_e2e::SCRAM_PASS));
        let a = weir_e2e::connect(&url).await.unwrap();
        let b = h.client().await;
        a.batch_execute("begin; set application_name = 'fleeting'; set local timezone = 'Pacific/Auckland'")
            .await
            .unwrap();
        assert_eq!(one_text(&a, "show application_name").await, "fleeting");
        a.batch_execute("rollback").await.unwrap();
        assert_eq!(one_text(&a, "show application_name").await, "steady");
        assert_eq!(one_text(&b, "show application_name").await, "");
        assert_eq!(one_text(&a, "show application_name").await, "steady");
        assert_ne!(one_text(&a, "show timezone").await, "Pacific/Auckland");
        // A SET inside a transaction that commits sticks, through the commit.
        a.batch_execute("begin; set application_name = 'kept'; commit").await.unwrap();
        assert_eq!(one_text(&b, "show application_name").await, "");
        assert_eq!(one_text(&a, "show application_name").await, "kept");
        let e = a.batch_execute("set timezone = 'Not/AZone'").await.unwrap_err();
        assert_eq!(sqlstate(&e).as_deref(), Some("22023"));
        assert_eq!(one_text(&a, "show application_name").await, "kept");
    })
    .await
}

/// A client writes past its Sync and flushes: the replies to what follows
/// the Sync come right behind the ReadyForQuery, often in the same read.
/// They reach the client with nothing more from it, in both pool modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_behind_a_ready_for_query_reach_the_client_at_once() {
    use weir::protocol::tags::{backend as be, frontend as fe};
    use weir_e2e::extended::{bind, parse, sync};
    use weir_e2e::raw::{tagged, Raw};
    bounded(120, async {
        for mode in ["session", "transaction"] {
            let h = Harness::start(Opts { pool_mode: mode, auth_type: "trust", ..Opts::default() }).await;
            let mut c = Raw::login(h.addr(), weir_e2e::TRUST_USER, "", &[]).await.expect("login");
            let flush = tagged(fe::FLUSH, &[]);
            for round in 0..30 {
                let batch = [bind("missing", &[]), sync(), parse("", "select * from missing"), flush.clone()];
                c.send(&batch.concat()).await.unwrap();
                let mut tags = String::new();
                for _ in 0..3 {
                    let (tag, _) =
                        c.read_msg().await.unwrap_or_else(|e| panic!("{mode}, round {round}: {e}; got {tags}"));
                    tags.push(tag as char);
                }
                assert_eq!(tags, "EZE", "{mode}, round {round}");
                c.send(&sync()).await.unwrap();
                assert_eq!(c.read_msg().await.unwrap().0, be::READY_FOR_QUERY);
            }
        }
    })
    .await;
}
