//! The core, proved with real clients against a real Postgres: every auth
//! method (client side and server side), simple/extended/pipelined queries,
//! transactions and errors inside them, COPY both ways, a 100 MB result,
//! cancel, 200 clients on a pool of 5, session-mode reset, ParameterStatus
//! re-application, startup `options`, pgbench, and an idle server killed by
//! `pg_terminate_backend`. Raw-socket protocol cases live in core_protocol.rs.

use std::process::Output;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt, TryStreamExt};
use tokio_postgres::types::Type;
use tokio_postgres::{AsyncMessage, Client, NoTls, SimpleQueryMessage};
use weir_e2e::{
    bounded, connect, sqlstate, Harness, Opts, APP_DB, MD5_PASS, MD5_USER, SCRAM_PASS, SCRAM_USER, TRUST_PASS,
    TRUST_USER,
};

/// Runs a test body under a hard limit, so no test can hang the suite.
/// Runs a libpq tool (psql, pgbench) against weir as `user`, killed after `limit`.
async fn libpq_tool(h: &Harness, tool: &str, user: &str, pass: &str, args: &[&str], limit: Duration) -> Output {
    let addr = h.addr();
    let child = tokio::process::Command::new(tool)
        .args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string(), "-U", user])
        .args(args)
        .env("PGPASSWORD", pass)
        .env("PGCONNECT_TIMEOUT", "10")
        .env_remove("PGOPTIONS")
        .env_remove("PGSSLMODE")
        .kill_on_drop(true)
        .output();
    tokio::time::timeout(limit, child).await.unwrap_or_else(|_| panic!("{tool} timed out")).expect("run tool")
}

/// `psql -XAtq` through weir; returns (success, stdout, stderr).
async fn psql_via_weir(h: &Harness, user: &str, pass: &str, sql: &str) -> (bool, String, String) {
    let out = libpq_tool(
        h,
        "psql",
        user,
        pass,
        &["-d", APP_DB, "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql],
        Duration::from_secs(30),
    )
    .await;
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).trim().to_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn one_text(c: &Client, sql: &str) -> String {
    let rows = c.simple_query(sql).await.unwrap_or_else(|e| panic!("{sql}: {e}"));
    rows.into_iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("").to_owned()),
            _ => None,
        })
        .unwrap_or_else(|| panic!("{sql}: no row"))
}

/// The backend pid serving `c` now (simple protocol: no named statement, so
/// safe when several clients share one server in transaction mode).
async fn backend_pid(c: &Client) -> i32 {
    one_text(c, "select pg_backend_pid()").await.parse().unwrap()
}

// ---- authentication ---------------------------------------------------------

/// auth_type md5: every user logs in through weir, and weir logs in to
/// Postgres with md5, SCRAM and trust server auth (the testkit's pg_hba).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn md5_auth_with_every_server_auth_method() {
    bounded(60, async {
        let h = Harness::start(Opts { auth_type: "md5", ..Default::default() }).await;
        for (user, pass) in [(MD5_USER, MD5_PASS), (SCRAM_USER, SCRAM_PASS), (TRUST_USER, TRUST_PASS)] {
            let c = connect(&h.url(user, pass)).await.unwrap_or_else(|e| panic!("{user}: {e}"));
            assert_eq!(one_text(&c, "select current_user").await, user);
            let (ok, out, err) = psql_via_weir(&h, user, pass, "select current_user").await;
            assert!(ok, "psql as {user}: {err}");
            assert_eq!(out, user);
        }
        let server_auth = h.psql(
            "select string_agg(distinct usename, ',') from pg_stat_activity where backend_type = 'client backend'",
        );
        for user in [MD5_USER, SCRAM_USER, TRUST_USER] {
            assert!(server_auth.contains(user), "no server login for {user}: {server_auth}");
        }
    })
    .await
}

/// auth_type scram-sha-256: tokio-postgres and libpq negotiate SCRAM.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_auth() {
    bounded(60, async {
        let h = Harness::start(Opts { auth_type: "scram-sha-256", ..Default::default() }).await;
        for (user, pass) in [(SCRAM_USER, SCRAM_PASS), (MD5_USER, MD5_PASS)] {
            let c = connect(&h.url(user, pass)).await.unwrap_or_else(|e| panic!("{user}: {e}"));
            assert_eq!(one_text(&c, "select current_user").await, user);
        }
        let (ok, out, err) = psql_via_weir(&h, SCRAM_USER, SCRAM_PASS, "select 7").await;
        assert!(ok && out == "7", "psql over SCRAM: {out} {err}");
        let e = connect(&h.url(SCRAM_USER, "wrong")).await.expect_err("wrong password refused");
        assert_eq!(sqlstate(&e).as_deref(), Some("28P01"), "{e}");
        let e = connect(&h.url("nobody", "x")).await.expect_err("unknown user refused");
        assert_eq!(sqlstate(&e).as_deref(), Some("28P01"), "{e}");
    })
    .await
}

/// auth_type trust: no password is asked, any is accepted; weir still logs
/// in to Postgres with the auth_file password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trust_auth() {
    bounded(60, async {
        let h = Harness::start(Opts { auth_type: "trust", ..Default::default() }).await;
        let c = connect(&h.url(SCRAM_USER, "not-checked")).await.expect("trust accepts any password");
        assert_eq!(one_text(&c, "select current_user").await, SCRAM_USER);
        let (ok, out, err) = psql_via_weir(&h, MD5_USER, "", "select current_user").await;
        assert!(ok, "{err}");
        assert_eq!(out, MD5_USER);
    })
    .await
}

/// Wrong password and unknown user both get 28P01 (md5).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wrong_password_and_unknown_user_get_28p01() {
    bounded(60, async {
        let h = Harness::start(Opts::default()).await;
        for (user, pass) in [(MD5_USER, "wrong"), (SCRAM_USER, "wrong"), ("nobody", "x")] {
            let e = connect(&h.url(user, pass)).await.err().unwrap_or_else(|| panic!("{user}/{pass} was let in"));
            assert_eq!(sqlstate(&e).as_deref(), Some("28P01"), "{user}: {e}");
        }
        let (ok, _, err) = psql_via_weir(&h, MD5_USER, "wrong", "select 1").await;
        assert!(!ok && err.contains("password authentication failed"), "{err}");
        // Failed logins cost nothing: a good login still works.
        assert_eq!(one_text(&h.client().await, "select 1").await, "1");
    })
    .await
}

/// auth_file secrets stored as an md5 hash or a SCRAM verifier (PgBouncer's
/// formats) authenticate clients; with md5 configured, a SCRAM verifier makes
/// weir use SCRAM (as Postgres does). trust_user's server login needs no password.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hashed_auth_file_secrets() {
    bounded(60, async {
        let h = Harness::start(Opts::default()).await;
        let md5 = h.psql(&format!("select 'md5' || md5('{TRUST_PASS}{TRUST_USER}')"));
        let scram = h.psql(&format!("select rolpassword from pg_authid where rolname = '{TRUST_USER}'"));
        assert!(scram.starts_with("SCRAM-SHA-256$"), "{scram}");
        for (auth, secret) in [("md5", &md5), ("md5", &scram), ("scram-sha-256", &scram)] {
            std::fs::write(h.dir.join("hashed.txt"), format!("\"{TRUST_USER}\" \"{secret}\"\n")).unwrap();
            let toml = format!(
                "[weir]\nlisten_addr = \"{}\"\nauth_type = \"{auth}\"\nauth_file = \"hashed.txt\"\n\
                 [databases.app]\nport = {}\n",
                h.addr(),
                h.pg.port()
            );
            h.weir().reload(weir::Config::from_toml(&toml, &h.dir).unwrap()).unwrap();
            let c = connect(&h.url(TRUST_USER, TRUST_PASS)).await.unwrap_or_else(|e| panic!("{auth} {secret}: {e}"));
            assert_eq!(one_text(&c, "select current_user").await, TRUST_USER);
            let e = connect(&h.url(TRUST_USER, "wrong")).await.expect_err("wrong password refused");
            assert_eq!(sqlstate(&e).as_deref(), Some("28P01"), "{auth}: {e}");
        }
    })
    .await
}

// ---- queries, transactions, COPY ------------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn simple_extended_and_pipelined_queries() {
    bounded(60, async {
        let h = Harness::start(Opts::default()).await;
        let c = h.client().await;
        let msgs = c.simple_query("select 1; select 'two'; select null::text").await.unwrap();
        let rows: Vec<_> = msgs
            .iter()
            .filter_map(|m| match m {
                SimpleQueryMessage::Row(r) => Some(r.get(0).map(str::to_owned)),
                _ => None,
            })
            .collect();
        assert_eq!(rows, vec![Some("1".into()), Some("two".into()), None]);

        let row = c.query_one("select $1::int + $2::int, $3::text", &[&40i32, &2i32, &"hi"]).await.unwrap();
        assert_eq!((row.get::<_, i32>(0), row.get::<_, &str>(1)), (42, "hi"));
        let stmt = c.prepare("select $1::bigint * 2").await.unwrap();
        for i in 0..20i64 {
            assert_eq!(c.query_one(&stmt, &[&i]).await.unwrap().get::<_, i64>(0), i * 2);
        }

        // tokio-postgres pipelines futures that are polled together: all
        // Parse/Bind/Execute/Sync go out before the first answer is read.
        let futs = (0..50i32).map(|i| {
            let c = &c;
            let stmt = &stmt;
            async move { c.query_one(stmt, &[&(i as i64)]).await.map(|r| r.get::<_, i64>(0)) }
        });
        let got: Vec<i64> = futures_util::future::try_join_all(futs).await.unwrap();
        assert_eq!(got, (0..50i64).map(|i| i * 2).collect::<Vec<_>>());

        // Errors in the extended protocol leave the connection usable.
        let e = c.query("select 1/0", &[]).await.unwrap_err();
        assert_eq!(sqlstate(&e).as_deref(), Some("22012"));
        let e = c.prepare("selec nonsense").await.unwrap_err();
        assert_eq!(sqlstate(&e).as_deref(), Some("42601"));
        assert_eq!(c.query_one("select 5", &[]).await.unwrap().get::<_, i32>(0), 5);
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transactions_commit_rollback_and_errors() {
    bounded(60, async {
        let h = Harness::start(Opts::default()).await;
        let mut c = h.client().await;
        c.batch_execute("create table t_tx (id int primary key, v text)").await.unwrap();

        let tx = c.transaction().await.unwrap();
        tx.execute("insert into t_tx values (1, 'kept')", &[]).await.unwrap();
        tx.commit().await.unwrap();

        let tx = c.transaction().await.unwrap();
        tx.execute("insert into t_tx values (2, 'dropped')", &[]).await.unwrap();
        tx.rollback().await.unwrap();

        // An error inside a transaction: the rest fails with 25P02 until ROLLBACK.
        c.batch_execute("begin").await.unwrap();
        c.execute("insert into t_tx values (3, 'x')", &[]).await.unwrap();
        let e = c.execute("insert into t_tx values (1, 'duplicate')", &[]).await.unwrap_err();
        assert_eq!(sqlstate(&e).as_deref(), Some("23505"), "{e}");
        let e = c.execute("select 1", &[]).await.unwrap_err();
        assert_eq!(sqlstate(&e).as_deref(), Some("25P02"), "{e}");
        c.batch_execute("rollback").await.unwrap();

        // Simple-protocol transaction with an error in the middle of a batch.
        let e = c.batch_execute("begin; insert into t_tx values (4, 'y'); select 1/0; commit").await.unwrap_err();
        assert_eq!(sqlstate(&e).as_deref(), Some("22012"));
        c.batch_execute("rollback").await.unwrap();

        let rows = c.query("select id, v from t_tx order by id", &[]).await.unwrap();
        let got: Vec<(i32, String)> = rows.iter().map(|r| (r.get(0), r.get(1))).collect();
        assert_eq!(got, vec![(1, "kept".to_owned())]);
        assert_eq!(h.psql("select count(*) from t_tx"), "1", "Postgres agrees");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_in_and_out() {
    bounded(60, async {
        let h = Harness::start(Opts::default()).await;
        let c = h.client().await;
        c.batch_execute("create table t_copy (id int, v text)").await.unwrap();

        let sink = c.copy_in("copy t_copy from stdin").await.unwrap();
        futures_util::pin_mut!(sink);
        let mut chunk = String::new();
        for i in 0..20_000 {
            chunk.push_str(&format!("{i}\trow {i}\n"));
            if chunk.len() > 32 * 1024 {
                sink.send(Bytes::from(std::mem::take(&mut chunk))).await.unwrap();
            }
        }
        sink.send(Bytes::from(chunk)).await.unwrap();
        assert_eq!(sink.finish().await.unwrap(), 20_000);

        let stream = c.copy_out("copy (select * from t_copy order by id) to stdout").await.unwrap();
        let parts: Vec<Bytes> = stream.try_collect().await.unwrap();
        let text: Vec<u8> = parts.concat();
        let text = String::from_utf8(text).unwrap();
        assert_eq!(text.lines().count(), 20_000);
        assert_eq!(text.lines().nth(12_345), Some("12345\trow 12345"));

        // A COPY IN the server rejects halfway leaves the connection usable.
        let sink = c.copy_in("copy t_copy (id) from stdin").await.unwrap();
        futures_util::pin_mut!(sink);
        sink.send(Bytes::from_static(b"1\nnot-a-number\n")).await.unwrap();
        let e = sink.finish().await.unwrap_err();
        assert_eq!(sqlstate(&e).as_deref(), Some("22P02"), "{e}");
        assert_eq!(one_text(&c, "select count(*) from t_copy").await, "20000");

        // psql's \copy goes through weir too.
        let (ok, out, err) = psql_via_weir(
            &h,
            SCRAM_USER,
            SCRAM_PASS,
            "\\copy (select id from t_copy where id < 3 order by id) to stdout",
        )
        .await;
        assert!(ok, "{err}");
        assert_eq!(out, "0\n1\n2");
    })
    .await
}

/// ~100 MB of rows streamed through weir arrive whole and in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hundred_megabyte_result() {
    bounded(90, async {
        let h = Harness::start(Opts::default()).await;
        let c = h.client().await;
        let sql = "select i, repeat('x', 1000) from generate_series(1, 100000) i";
        let rows = c.query_raw(sql, std::iter::empty::<i32>()).await.unwrap();
        futures_util::pin_mut!(rows);
        let (mut count, mut bytes, mut last) = (0u64, 0u64, 0i32);
        while let Some(row) = rows.next().await {
            let row = row.unwrap();
            let i: i32 = row.get(0);
            assert_eq!(i, last + 1, "rows in order");
            last = i;
            bytes += row.get::<_, &str>(1).len() as u64;
            count += 1;
        }
        assert_eq!(count, 100_000);
        assert_eq!(bytes, 100_000_000);
        assert_eq!(one_text(&c, "select 'still usable'").await, "still usable");
    })
    .await
}

/// A running pg_sleep is cancelled through weir's own BackendKeyData.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_running_pg_sleep() {
    bounded(60, async {
        let h = Harness::start(Opts::default()).await;
        let c = h.client().await;
        let token = c.cancel_token();
        let started = Instant::now();
        let sleeping = c.simple_query("select pg_sleep(30)");
        let cancel = async {
            // Wait until the sleep really runs on the server.
            h.until_running("select pg_sleep(30)").await;
            token.cancel_query(NoTls).await.expect("send cancel");
            Instant::now()
        };
        let (result, cancelled_at) = tokio::join!(sleeping, cancel);
        let e = result.expect_err("the sleep was cancelled");
        assert_eq!(sqlstate(&e).as_deref(), Some("57014"), "{e}");
        // Far below the sleep's 30 s, with room for a loaded machine.
        assert!(cancelled_at.elapsed() < Duration::from_secs(10), "cancel took {:?}", cancelled_at.elapsed());
        assert!(started.elapsed() < Duration::from_secs(25));
        assert_eq!(one_text(&c, "select 'after cancel'").await, "after cancel");
        // A cancel with a key nobody has is ignored, harmlessly.
        let bogus = weir::protocol::messages::cancel_request(12345, 67890);
        let mut s = weir_e2e::raw::Raw::connect(h.addr()).await.with_limit(Duration::from_secs(2));
        s.send(&bogus).await.unwrap();
        assert_eq!(s.next().await, None, "nothing is answered to a cancel request, and the socket closes promptly");
        assert_eq!(one_text(&c, "select 'untouched'").await, "untouched");
    })
    .await
}

/// Connects and forwards the connection's notices and notifications to a channel.
async fn connect_watching(url: &str) -> (Client, tokio::sync::mpsc::UnboundedReceiver<AsyncMessage>) {
    let (client, mut conn) = tokio_postgres::connect(url, NoTls).await.unwrap();
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    tokio::spawn(async move {
        let mut messages = futures_util::stream::poll_fn(move |cx| conn.poll_message(cx));
        while let Some(Ok(m)) = messages.next().await {
            let _ = tx.send(m);
        }
    });
    (client, rx)
}

/// NOTICEs (transaction mode) and NOTIFY (session mode, LISTEN held on the
/// client's server) reach the client while it holds a server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn notices_and_notifications_reach_the_client() {
    bounded(60, async {
        let h = Harness::start(Opts::default()).await;
        let (c, mut rx) = connect_watching(&h.url(SCRAM_USER, SCRAM_PASS)).await;
        c.batch_execute("do $$ begin raise notice 'hello from plpgsql'; end $$").await.unwrap();
        match tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.unwrap() {
            Some(AsyncMessage::Notice(n)) => assert_eq!(n.message(), "hello from plpgsql"),
            other => panic!("expected a notice, got {other:?}"),
        }

        let h = Harness::start(Opts { pool_mode: "session", ..Default::default() }).await;
        let (listener, mut rx) = connect_watching(&h.url(SCRAM_USER, SCRAM_PASS)).await;
        listener.batch_execute("listen weir_channel").await.unwrap();
        let sender = h.client().await;
        sender.batch_execute("notify weir_channel, 'payload 1'").await.unwrap();
        // Delivered while the listener is idle: weir forwards what its server sends.
        let got = tokio::time::timeout(Duration::from_secs(5), rx.recv()).await.expect("notification in time");
        match got {
            Some(AsyncMessage::Notification(n)) => {
                assert_eq!((n.channel(), n.payload()), ("weir_channel", "payload 1"));
            }
            other => panic!("expected a notification, got {other:?}"),
        }
    })
    .await
}

/// Transaction mode: a server is held through status T and E (open and
/// failed transactions) and released at ReadyForQuery I.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn transaction_mode_holds_the_server_through_open_and_failed_transactions() {
    bounded(60, async {
        let h = Harness::start(Opts { pool_size: 1, ..Default::default() }).await;
        let a = h.client().await;
        let b = h.client().await;
        a.batch_execute("begin").await.unwrap();
        let pid = backend_pid(&a).await;
        let waiting = tokio::spawn(async move {
            let pid = backend_pid(&b).await;
            (pid, Instant::now())
        });
        let pool = h.pool();
        weir_e2e::wait_for("b to queue for the one server", || async { pool.snapshot().waiting == 1 }).await;
        assert!(!waiting.is_finished(), "b got the server while a's transaction was open");
        let e = a.batch_execute("select 1/0").await.unwrap_err();
        assert_eq!(sqlstate(&e).as_deref(), Some("22012"));
        // A window in which b must not be handed the server.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!waiting.is_finished(), "b got the server while a's transaction was failed");
        let e = a.batch_execute("select 1").await.unwrap_err();
        assert_eq!(sqlstate(&e).as_deref(), Some("25P02"), "a is still in its failed transaction");
        let released = Instant::now();
        a.batch_execute("rollback").await.unwrap();
        let (b_pid, b_at) = waiting.await.unwrap();
        assert_eq!(b_pid, pid, "b got the one server");
        assert!(b_at >= released, "b ran only after a's rollback");
    })
    .await
}

// ---- pooling -------------------------------------------------------------------------

/// Samples how many backends `user` has, through a direct connection.
async fn backends_of(direct: &Client, user: &str) -> i64 {
    direct
        .query_one(
            "select count(*) from pg_stat_activity where usename = $1 and backend_type = 'client backend'",
            &[&user],
        )
        .await
        .unwrap()
        .get(0)
}

/// A tokio-postgres error with the server's SQLSTATE and message, if any.
fn describe(e: tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(db) => format!("{} {}", db.code().code(), db.message()),
        None => e.to_string(),
    }
}

/// One of many clients: queries and transactions as applications send them.
/// Even clients use named prepared statements (tokio-postgres `query`, which
/// needs weir's prepared-statement support in transaction mode); odd ones use
/// `query_typed`, one unnamed Parse/Bind/Execute/Sync round trip.
async fn busy_client(url: String, n: usize) -> Result<(), String> {
    let mut c = connect(&url).await.map_err(|e| format!("connect: {}", describe(e)))?;
    let n = n as i32;
    for i in 0..4i32 {
        let row = if n % 2 == 0 {
            c.query_one("select $1::int + 1", &[&i]).await
        } else {
            c.query_typed_one("select $1::int + 1", &[(&i, Type::INT4)]).await
        };
        let v: i32 = row.map_err(describe)?.get(0);
        if v != i + 1 {
            return Err(format!("wrong answer {v}"));
        }
        let tx = c.transaction().await.map_err(describe)?;
        tx.query_typed("insert into t_busy values ($1, $2)", &[(&n, Type::INT4), (&i, Type::INT4)])
            .await
            .map_err(describe)?;
        tx.simple_query("select pg_sleep(0.005)").await.map_err(describe)?;
        tx.commit().await.map_err(describe)?;
        c.simple_query("select 1").await.map_err(describe)?;
    }
    Ok(())
}

/// 200 clients on a pool of 5 (transaction mode): no errors, and Postgres
/// never sees more than 5 backends for the pool's user.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_hundred_clients_on_a_pool_of_five() {
    bounded(110, async {
        let h = Harness::start(Opts { pool_size: 5, ..Default::default() }).await;
        h.psql(&format!("create table t_busy (client int, i int); grant all on t_busy to {SCRAM_USER}"));
        let direct = h.direct().await;
        let done = Arc::new(AtomicBool::new(false));
        let sampler = {
            let done = done.clone();
            async move {
                let (mut samples, mut max) = (0, 0);
                while !done.load(Ordering::Acquire) {
                    max = max.max(backends_of(&direct, SCRAM_USER).await);
                    samples += 1;
                    tokio::time::sleep(Duration::from_millis(25)).await;
                }
                (samples, max)
            }
        };
        let sampler = tokio::spawn(sampler);
        let url = h.url(SCRAM_USER, SCRAM_PASS);
        let errors = Arc::new(AtomicUsize::new(0));
        let tasks: Vec<_> = (0..200)
            .map(|n| {
                let (url, errors) = (url.clone(), errors.clone());
                tokio::spawn(async move {
                    if let Err(e) = busy_client(url, n).await {
                        eprintln!("client {n}: {e}");
                        errors.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        for t in tasks {
            t.await.unwrap();
        }
        done.store(true, Ordering::Release);
        let (samples, max) = sampler.await.unwrap();
        assert_eq!(errors.load(Ordering::Relaxed), 0, "client errors");
        assert_eq!(h.psql("select count(*) from t_busy"), "800");
        assert!(samples >= 3, "only {samples} samples of pg_stat_activity");
        assert!((1..=5).contains(&max), "saw {max} backends for the pool of 5");
        let p = h.pool().snapshot();
        assert!(p.idle + p.active <= 5, "{p:?}");
    })
    .await
}

/// Session mode: a client's temp table does not leak to the next client of
/// the same server (server_reset_query ran).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_mode_resets_the_server_between_clients() {
    bounded(60, async {
        let h = Harness::start(Opts { pool_mode: "session", pool_size: 1, ..Default::default() }).await;
        let a = h.client().await;
        let pid_a = backend_pid(&a).await;
        a.batch_execute("create temp table t_private (x int); insert into t_private values (1); set work_mem = '7MB'")
            .await
            .unwrap();
        // Session mode holds the server across transactions.
        assert_eq!(one_text(&a, "select count(*) from t_private").await, "1");
        drop(a);

        let b = h.client().await;
        assert_eq!(backend_pid(&b).await, pid_a, "pool_size 1: the same server");
        assert_eq!(one_text(&b, "select coalesce(to_regclass('t_private')::text, 'none')").await, "none");
        assert_ne!(one_text(&b, "show work_mem").await, "7MB");
    })
    .await
}

/// Values a client set (application_name, TimeZone) follow the client, not
/// the server: with one server shared by two clients, each sees its own.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn parameter_status_is_reapplied_per_client() {
    bounded(60, async {
        let h = Harness::start(Opts { pool_size: 1, ..Default::default() }).await;
        let default_tz = one_text(&h.direct().await, "show timezone").await;
        let a = connect(&format!("{}?application_name=app_a", h.url(SCRAM_USER, SCRAM_PASS))).await.unwrap();
        let b = connect(&format!("{}?application_name=app_b", h.url(SCRAM_USER, SCRAM_PASS))).await.unwrap();
        assert_eq!(one_text(&a, "show application_name").await, "app_a");
        a.batch_execute("set application_name = 'a'; set timezone = 'Asia/Tokyo'; set datestyle = 'SQL, DMY'")
            .await
            .unwrap();
        let pid = backend_pid(&a).await;
        for _ in 0..2 {
            assert_eq!(backend_pid(&b).await, pid, "one server for both");
            assert_eq!(one_text(&b, "show application_name").await, "app_b");
            assert_eq!(one_text(&b, "show timezone").await, default_tz);
            assert_eq!(one_text(&b, "show datestyle").await, "ISO, MDY");
            assert_eq!(one_text(&a, "show application_name").await, "a");
            assert_eq!(one_text(&a, "show timezone").await, "Asia/Tokyo");
            assert_eq!(one_text(&a, "select '2020-01-02'::date::text").await, "02/01/2020");
        }
        // Postgres's own view agrees: a ran last on the server, which keeps
        // a's value until another client is given it.
        let seen = h.psql(&format!("select application_name from pg_stat_activity where pid = {pid}"));
        assert_eq!(seen, "a");
    })
    .await
}

/// `options=-c search_path=...` is honoured for its client only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_options_are_honoured_per_client() {
    bounded(60, async {
        let h = Harness::start(Opts { pool_size: 1, ..Default::default() }).await;
        h.psql(&format!(
            "create schema custom; create table custom.only_here (v text); insert into custom.only_here values ('found'); \
             grant usage on schema custom to {SCRAM_USER}; grant select on custom.only_here to {SCRAM_USER}"
        ));
        let url = format!("{}?options=-c%20search_path%3Dcustom", h.url(SCRAM_USER, SCRAM_PASS));
        let with = connect(&url).await.unwrap();
        let without = h.client().await;
        for _ in 0..2 {
            assert_eq!(one_text(&with, "select v from only_here").await, "found");
            assert_eq!(one_text(&with, "show search_path").await, "custom");
            let e = without.simple_query("select v from only_here").await.unwrap_err();
            assert_eq!(sqlstate(&e).as_deref(), Some("42P01"), "{e}");
            assert_eq!(one_text(&without, "show search_path").await, "\"$user\", public");
        }
        // psql's PGOPTIONS takes the same path.
        let out = tokio::process::Command::new("psql")
            .args(["-h", &h.addr().ip().to_string(), "-p", &h.addr().port().to_string(), "-U", SCRAM_USER, "-d", APP_DB])
            .args(["-XAtq", "-c", "select v from only_here"])
            .env("PGPASSWORD", SCRAM_PASS)
            .env("PGOPTIONS", "-c search_path=custom")
            .kill_on_drop(true)
            .output();
        let out = tokio::time::timeout(Duration::from_secs(30), out).await.unwrap().unwrap();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "found", "{}", String::from_utf8_lossy(&out.stderr));
    })
    .await
}

/// A startup setting outside track_extra_parameters is refused at login with
/// 08P01 before any server is involved; one on the list that Postgres does
/// not know, or whose value it refuses, is refused as Postgres would.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_settings_are_checked_at_login() {
    bounded(60, async {
        let general = "track_extra_parameters = [\"search_path\", \"work_mem\", \"no_such_setting\"]".to_owned();
        let h = Harness::start(Opts { general, ..Default::default() }).await;
        let url = format!("{}?options=-c%20enable_seqscan%3Doff", h.url(SCRAM_USER, SCRAM_PASS));
        let e = connect(&url).await.expect_err("setting outside the allow-list refused");
        assert_eq!(sqlstate(&e).as_deref(), Some("08P01"), "{e}");
        let why = describe(e);
        assert!(why.contains("unsupported startup parameter") && why.contains("enable_seqscan"), "{why}");
        let url = format!("{}?options=-c%20no_such_setting%3D1", h.url(SCRAM_USER, SCRAM_PASS));
        let e = connect(&url).await.expect_err("unknown setting refused");
        assert_eq!(sqlstate(&e).as_deref(), Some("42704"), "{e}");
        assert!(describe(e).contains("no_such_setting"));
        let url = format!("{}?options=-c%20work_mem%3Dlots", h.url(SCRAM_USER, SCRAM_PASS));
        let e = connect(&url).await.expect_err("invalid value refused");
        assert_eq!(sqlstate(&e).as_deref(), Some("22023"), "{e}");
        let url = format!("{}?options=-c%20work_mem%3D7MB", h.url(SCRAM_USER, SCRAM_PASS));
        assert_eq!(one_text(&connect(&url).await.unwrap(), "show work_mem").await, "7MB");
        let url = format!("{}?options=-d%205", h.url(SCRAM_USER, SCRAM_PASS));
        let e = connect(&url).await.expect_err("non -c options refused");
        assert!(describe(e).contains("options"));
        assert_eq!(one_text(&h.client().await, "show work_mem").await, "4MB", "other clients keep the default");
    })
    .await
}

// ---- errors weir answers with a SQLSTATE ----------------------------------------------

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unknown_database_gets_3d000() {
    bounded(60, async {
        let h = Harness::start(Opts::default()).await;
        let e = connect(&format!("postgres://{SCRAM_USER}:{SCRAM_PASS}@{}/nope", h.addr())).await.expect_err("refused");
        assert_eq!(sqlstate(&e).as_deref(), Some("3D000"), "{e}");
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn too_many_clients_gets_53300() {
    bounded(60, async {
        let h = Harness::start(Opts { general: "max_client_conn = 2".into(), ..Default::default() }).await;
        let a = h.client().await;
        let b = h.client().await;
        let e = connect(&h.url(SCRAM_USER, SCRAM_PASS)).await.expect_err("third client refused");
        assert_eq!(sqlstate(&e).as_deref(), Some("53300"), "{e}");
        assert_eq!(one_text(&a, "select 1").await, "1");
        drop(b);
        let end = Instant::now() + weir_e2e::WAIT_LIMIT;
        let third = loop {
            match connect(&h.url(SCRAM_USER, SCRAM_PASS)).await {
                Ok(c) => break c,
                Err(e) => assert!(Instant::now() < end, "no place freed up: {e}"),
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        };
        assert_eq!(one_text(&third, "select 3").await, "3");
    })
    .await
}

// ---- pgbench ---------------------------------------------------------------------------

fn pgbench_field(out: &str, prefix: &str) -> String {
    out.lines()
        .find_map(|l| l.trim().strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no {prefix:?} in pgbench output:\n{out}"))
        .trim()
        .to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_extended_protocol_through_weir() {
    bounded(110, async {
        let h = Harness::start(Opts { pool_size: 10, ..Default::default() }).await;
        let init = libpq_tool(
            &h,
            "pgbench",
            SCRAM_USER,
            SCRAM_PASS,
            &["-i", "-s", "1", "-q", APP_DB],
            Duration::from_secs(60),
        )
        .await;
        assert!(init.status.success(), "pgbench -i: {}", String::from_utf8_lossy(&init.stderr));
        assert_eq!(h.psql("select count(*) from pgbench_accounts"), "100000");

        let args = ["-n", "-S", "-M", "extended", "-c", "50", "-j", "2", "-t", "100", APP_DB];
        let run = libpq_tool(&h, "pgbench", SCRAM_USER, SCRAM_PASS, &args, Duration::from_secs(90)).await;
        let out = String::from_utf8_lossy(&run.stdout);
        assert!(run.status.success(), "pgbench: {out}\n{}", String::from_utf8_lossy(&run.stderr));
        assert_eq!(pgbench_field(&out, "number of transactions actually processed:"), "5000/5000");
        assert!(pgbench_field(&out, "number of failed transactions:").starts_with("0 "), "{out}");
        let p = h.pool().snapshot();
        assert!(p.idle + p.active <= 10, "{p:?}");
    })
    .await
}

// ---- server health -----------------------------------------------------------------------

/// An idle server connection that Postgres terminates is dropped before any
/// client is given it: the next query just works, on a new backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminated_idle_server_is_never_lent() {
    bounded(60, async {
        let h = Harness::start(Opts { pool_size: 1, ..Default::default() }).await;
        let c = h.client().await;
        let old = backend_pid(&c).await;
        for round in 0..3 {
            let pid = backend_pid(&c).await;
            // Waits (up to 5 s) until the backend has exited.
            assert_eq!(h.psql(&format!("select pg_terminate_backend({pid}, 5000)")), "t");
            let now = backend_pid(&c).await;
            assert_ne!(now, pid, "round {round}: got the terminated server");
        }
        assert_ne!(backend_pid(&c).await, old);
        assert_eq!(one_text(&c, "select 'alive'").await, "alive");
        assert!(h.pool().snapshot().idle + h.pool().snapshot().active <= 1);
    })
    .await
}
