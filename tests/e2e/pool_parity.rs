//! The pool and its servers as PgBouncer's, against a real Postgres: a
//! console SET changes only its key, idle servers of a user's or a
//! database's other pools make room under max_user_connections and
//! max_db_connections (and no more than needed), the silence probe stays
//! within the pool's limit, server failures are retried or reported as
//! PgBouncer does, client_idle_timeout, server_fast_close, min_pool_size
//! capped by the pool size, and the reserve pool's log line.

use std::time::{Duration, Instant};

use tokio::task::JoinHandle;
use weir_e2e::liveness::{connect_within, describe};
use weir_e2e::process::WeirProcess;
use weir_e2e::raw::{Outcome, Raw};
use weir_e2e::{
    bounded, connect, pg, Harness, Opts, APP_DB, MD5_PASS, MD5_USER, SCRAM_PASS, SCRAM_USER, TRUST_PASS, TRUST_USER,
};

/// Servers lent by the pool of `db`/`user`, once it exists.
fn active(h: &Harness, db: &str, user: &str) -> u32 {
    h.weir().shared().pools.get(db, user).map_or(0, |p| p.snapshot().active)
}

fn admin_url(h: &Harness) -> String {
    format!("postgres://admin:admin_pass@{}/weir", h.addr())
}

/// `SET server_idle_timeout = 50` on the console changes that key alone:
/// before, it also put PgBouncer's default pool_mode (session) in force, and
/// logins of a busy transaction-mode pool waited for a free server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_set_changes_only_its_key() {
    bounded(60, async {
        let h = Harness::start(Opts { pool_size: 2, ..Opts::default() }).await;
        let admin = connect(&admin_url(&h)).await.expect("console");
        admin.simple_query("SET server_idle_timeout = 50").await.expect("SET");
        let url = h.url(SCRAM_USER, SCRAM_PASS);
        let busy: Vec<_> = (0..2)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move {
                    let c = connect(&url).await.expect("connect");
                    c.simple_query("select pg_sleep(8)").await.expect("sleep");
                })
            })
            .collect();
        assert!(
            weir_e2e::eventually(weir_e2e::WAIT_LIMIT, || active(&h, APP_DB, SCRAM_USER) == 2).await,
            "both servers busy"
        );
        // Each login is bounded well below the sleeps (8 s): one that waited
        // for a free server fails, a loaded machine's slow login does not.
        let started = Instant::now();
        for i in 0..3 {
            let c = connect_within(&url, Duration::from_secs(2)).await;
            assert!(c.is_ok(), "login {i} while every server is busy: {:?} after {:?}", c.err(), started.elapsed());
        }
        let settings = h.pool().settings();
        assert_eq!(settings.pool_mode, weir::config::PoolMode::Transaction, "pool_mode untouched by the SET");
        for b in busy {
            b.await.unwrap();
        }
    })
    .await;
}

/// A Postgres and weir with databases `app`, `app2` and `app3`, all three
/// Postgres's `app`.
async fn three_databases(general: &str, pool_size: u32) -> Harness {
    let pg = pg().await;
    let port = pg.port();
    let more: String = ["app2", "app3"]
        .iter()
        .map(|db| format!("[databases.{db}]\nhost = \"127.0.0.1\"\nport = {port}\ndbname = \"{APP_DB}\"\n"))
        .collect();
    let opts = Opts { pool_size, general: general.into(), database: more, ..Opts::default() };
    Harness::start_with(std::sync::Arc::new(pg), opts).await
}

/// `n` clients of `user` on `db`, each running pg_sleep(`secs`) at once;
/// each result says what failed, if anything.
fn sleepers(
    h: &Harness,
    db: &str,
    user: &str,
    password: &str,
    n: usize,
    secs: f64,
) -> Vec<JoinHandle<Result<(), String>>> {
    let url = format!("postgres://{user}:{password}@{}/{db}", h.addr());
    (0..n)
        .map(|_| {
            let url = url.clone();
            tokio::spawn(async move {
                let c = connect_within(&url, Duration::from_secs(10)).await?;
                c.simple_query(&format!("select pg_sleep({secs})")).await.map(|_| ()).map_err(|e| describe(&e))
            })
        })
        .collect()
}

/// Server connections weir holds for `users` on `app`, by its own count.
fn held(h: &Harness, users: &[&str]) -> usize {
    let pools = users.iter().filter_map(|u| h.weir().shared().pools.get(APP_DB, u));
    pools.map(|p| p.snapshot()).map(|s| (s.idle + s.active + s.connecting + s.recovering) as usize).sum()
}

/// Backends of `users` on Postgres's `app`.
fn backends(h: &Harness, users: &[&str]) -> usize {
    let list: Vec<String> = users.iter().map(|u| format!("'{u}'")).collect();
    let sql =
        format!("select count(*) from pg_stat_activity where datname = '{APP_DB}' and usename in ({})", list.join(","));
    h.psql(&sql).parse().expect("a count")
}

/// PgBouncer's test_max_user_connections: a user capped at 3 runs 3 queries
/// on each of three databases at once. The first database's idle servers
/// are evicted for the others, and all 9 finish (before, the other
/// databases' clients waited for their whole budget).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_user_connections_takes_idle_servers_of_the_users_other_pools() {
    bounded(60, async {
        let h = three_databases("max_user_connections = 3\nquery_wait_timeout = \"8s\"", 5).await;
        let mut all = Vec::new();
        for db in [APP_DB, "app2", "app3"] {
            all.extend(sleepers(&h, db, SCRAM_USER, SCRAM_PASS, 3, 0.5));
        }
        for (i, r) in futures_util::future::join_all(all).await.into_iter().enumerate() {
            assert_eq!(r.unwrap(), Ok(()), "query {i}");
        }
        assert!(backends(&h, &[SCRAM_USER]) <= 3, "never above max_user_connections");
        let evicted: u64 = [APP_DB, "app2", "app3"]
            .iter()
            .filter_map(|db| h.weir().shared().pools.get(db, SCRAM_USER))
            .map(|p| p.metrics.closed(weir_metrics::CloseReason::Evicted))
            .sum();
        assert!(evicted >= 2, "the other databases got their servers by eviction: {evicted}");
    })
    .await;
}

/// PgBouncer's test_max_db_connections: three users, two clients each, on
/// a database capped at 4. Servers move between the users' pools by
/// eviction, and when all is done the database holds exactly 4 (weir used
/// to evict one too many now and then, and end with 3).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn max_db_connections_evicts_no_more_than_it_needs() {
    bounded(90, async {
        let h = three_databases("max_db_connections = 4\nquery_wait_timeout = \"8s\"", 5).await;
        let users = [(SCRAM_USER, SCRAM_PASS), (MD5_USER, MD5_PASS), (TRUST_USER, TRUST_PASS)];
        for round in 0..3 {
            let mut all = Vec::new();
            for (user, password) in users {
                all.extend(sleepers(&h, APP_DB, user, password, 2, 0.3));
            }
            for (i, r) in futures_util::future::join_all(all).await.into_iter().enumerate() {
                assert_eq!(r.unwrap(), Ok(()), "round {round}, query {i}");
            }
            // Evicted backends leave before their place is reused: wait
            // until Postgres has as many as weir holds.
            let names: Vec<&str> = users.iter().map(|(u, _)| *u).collect();
            let settled = || async { backends(&h, &names) == held(&h, &names) };
            weir_e2e::wait_for("the evicted backends to exit", settled).await;
            assert_eq!(backends(&h, &names), 4, "round {round}: the database ends at its cap, not below");
        }
    })
    .await;
}

/// PgBouncer's test_reserve_pool_size: a connect beyond pool_size, once a
/// client has waited reserve_pool_timeout, logs PgBouncer's warning, once
/// per server taken from the reserve.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_reserve_pool_logs_each_server_it_gives() {
    bounded(60, async {
        let pg = pg().await;
        let general = "pool_mode = \"transaction\"\ndefault_pool_size = 1\nreserve_pool_size = 1\nreserve_pool_timeout = \"300ms\"";
        let w = WeirProcess::start(&pg, general, "").await;
        let url = w.url(SCRAM_USER, SCRAM_PASS);
        let all: Vec<_> = (0..3)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move {
                    let c = connect(&url).await.map_err(|e| describe(&e))?;
                    c.simple_query("select pg_sleep(1)").await.map(|_| ()).map_err(|e| describe(&e))
                })
            })
            .collect();
        for r in futures_util::future::join_all(all).await {
            assert_eq!(r.unwrap(), Ok(()));
        }
        let logs = w.logs();
        let taken = logs.lines().filter(|l| l.contains("taking connection from reserve_pool")).count();
        assert_eq!(taken, 1, "one server from a reserve of 1:\n{logs}");
    })
    .await;
}

/// The silence probe counts against the pool's limit: a pool of 2 whose two
/// servers run long queries opens no third session for its probes (before,
/// each probe logged in beyond the pool), and the probes (a path check
/// then) still leave the working queries alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_silence_probe_opens_no_session_beyond_a_full_pool() {
    bounded(60, async {
        let general = "server_check_silence = \"400ms\"";
        let h = Harness::start(Opts { pool_size: 2, general: general.into(), ..Opts::default() }).await;
        let sessions = || h.pg.count_log_lines(&format!("connection authorized: user={SCRAM_USER}"));
        let before = sessions();
        // The pool is full before the long queries start: otherwise, on a
        // loaded machine, a probe may run while the second server is not open
        // yet (room in the pool), and that server is then a third login.
        let warm = futures_util::future::join_all((0..2).map(|_| h.client())).await;
        for c in &warm {
            c.batch_execute("begin; select 1").await.expect("each warm client holds a server");
        }
        for c in &warm {
            c.batch_execute("commit").await.unwrap();
        }
        drop(warm);
        assert_eq!(sessions() - before, 2, "the pool's two servers");
        let busy = sleepers(&h, APP_DB, SCRAM_USER, SCRAM_PASS, 2, 2.0);
        for r in futures_util::future::join_all(busy).await {
            assert_eq!(r.unwrap(), Ok(()), "a working query is never killed by the probe");
        }
        assert_eq!(sessions() - before, 2, "the pool's two servers, and no probe session");
        assert_eq!(h.pool().metrics.closed_total(), 0);
    })
    .await;
}

/// A connect error is retried while the client waits: Postgres unreachable
/// for a second (connections reset), a client logging in to a pool that
/// never connected is served once it is back (before, it got "cannot
/// connect to the server" at once).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_waits_out_a_second_of_connect_errors() {
    bounded(60, async {
        let h = Harness::start(Opts { relay: true, general: "query_wait_timeout = \"5s\"".into(), ..Opts::default() })
            .await;
        let relay = h.relay.as_ref().unwrap();
        relay.refuse(true);
        let url = h.url(SCRAM_USER, SCRAM_PASS);
        let t0 = Instant::now();
        let login = tokio::spawn(async move {
            let c = connect_within(&url, Duration::from_secs(8)).await?;
            c.simple_query("select 1").await.map(|_| ()).map_err(|e| describe(&e))
        });
        weir_e2e::wait_for("a refused connect", || async { relay.connections_refused() > 0 }).await;
        // The scenario: Postgres stays unreachable for a second.
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!login.is_finished(), "the login waits while connects fail");
        relay.refuse(false);
        assert_eq!(login.await.unwrap(), Ok(()), "served once Postgres is reachable again");
        let took = t0.elapsed();
        assert!(took >= Duration::from_secs(1) && took < Duration::from_secs(4), "{took:?}");
        assert!(h.pool().metrics.connect_failures_total() >= 1, "connects were tried and retried");
    })
    .await;
}

/// A login Postgres refuses fails the waiting clients at once with
/// Postgres's own SQLSTATE and message (before, they waited out their
/// budget): md5_user's password changes in Postgres, its pool's server goes,
/// and the next query gets 28P01 at once. A database Postgres does not have
/// is refused the same way, and a client in the server_login_retry window
/// gets PgBouncer's cached error, also at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_login_postgres_refuses_fails_the_waiting_clients_at_once() {
    bounded(60, async {
        let pg = pg().await;
        let port = pg.port();
        let nodb = format!("[databases.nodb]\nhost = \"127.0.0.1\"\nport = {port}\ndbname = \"no_such_db\"\n");
        let opts = Opts { general: "query_wait_timeout = \"10s\"".into(), database: nodb, ..Opts::default() };
        let h = Harness::start_with(std::sync::Arc::new(pg), opts).await;
        let c = connect(&h.url(MD5_USER, MD5_PASS)).await.expect("md5_user logs in");
        c.simple_query("select 1").await.expect("served");
        h.psql(&format!("alter role {MD5_USER} password 'changed'"));
        h.psql(&format!("select pg_terminate_backend(pid, 5000) from pg_stat_activity where usename = '{MD5_USER}'"));
        let pool = h.pool_for(MD5_USER);
        let gone = || async {
            let s = pool.snapshot();
            s.idle + s.active + s.recovering == 0
        };
        weir_e2e::wait_for("weir to drop md5_user's terminated server", gone).await;
        let t0 = Instant::now();
        let e = c.simple_query("select 1").await.expect_err("Postgres refuses the new server's login");
        let took = t0.elapsed();
        let db = e.as_db_error().expect("an ErrorResponse");
        assert_eq!(db.code().code(), "28P01", "{e}");
        assert_eq!(db.message(), format!("password authentication failed for user \"{MD5_USER}\""), "Postgres's text");
        // At once: well before query_wait_timeout (10 s), with room for a loaded machine.
        assert!(took < Duration::from_secs(5), "at once, not at query_wait_timeout: {took:?}");

        let want = "database \"no_such_db\" does not exist";
        for i in 0..4 {
            let t0 = Instant::now();
            let url = format!("postgres://{SCRAM_USER}:{SCRAM_PASS}@{}/nodb", h.addr());
            let e = connect(&url).await.expect_err("no such database");
            let took = t0.elapsed();
            let db = e.as_db_error().expect("an ErrorResponse");
            let cached = format!("server login has been failing, cached error: {want} (server_login_retry)");
            match db.code().code() {
                "3D000" => assert_eq!(db.message(), want, "{i}"),
                "08P01" => assert_eq!(db.message(), cached, "{i}"),
                other => panic!("{i}: {other}: {}", db.message()),
            }
            assert!(took < Duration::from_secs(5), "{i}: at once: {took:?}");
        }
    })
    .await;
}

/// PgBouncer's test_client_idle_timeout: a client whose latest request
/// began client_idle_timeout ago, holding no server, is disconnected with
/// "client_idle_timeout", and the log says so; one that keeps querying stays.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_idle_timeout_disconnects_idle_clients() {
    bounded(60, async {
        let pg = pg().await;
        let w = WeirProcess::start(&pg, "pool_mode = \"transaction\"\nclient_idle_timeout = \"1s\"", "").await;
        let idle = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.expect("login");
        idle.simple_query("select 1").await.expect("served");
        let busy = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.expect("login");
        for _ in 0..8 {
            busy.simple_query("select 1").await.expect("a client that keeps querying stays");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let e = idle.simple_query("select 1").await.expect_err("idle past client_idle_timeout");
        assert!(describe(&e).contains("client_idle_timeout") || e.is_closed(), "{e}");
        // What PgBouncer sends: FATAL 08P01 "client_idle_timeout".
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], w.port));
        let mut raw = Raw::login(addr, SCRAM_USER, SCRAM_PASS, &[]).await.expect("raw login");
        assert_eq!(raw.query("select 1").await.unwrap().scalar(), Some("1"));
        assert_eq!(raw.outcome().await, Outcome::Fatal("08P01".into(), "client_idle_timeout".into()));
        let logs = w.logs();
        assert!(logs.contains("client_idle_timeout"), "{logs}");
    })
    .await;
}

/// PgBouncer's test_fast_close: with server_fast_close (set on the console),
/// RECONNECT ends a session-mode client between transactions at once, with
/// "database configuration changed", rather than when it leaves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_fast_close_ends_session_clients_at_reconnect() {
    bounded(60, async {
        let pg = pg().await;
        let w = WeirProcess::start(&pg, "pool_mode = \"session\"", "").await;
        let c = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.expect("login");
        c.simple_query("select 1").await.expect("served");
        let addr = std::net::SocketAddr::from(([127, 0, 0, 1], w.port));
        let mut raw = Raw::login(addr, SCRAM_USER, SCRAM_PASS, &[]).await.expect("raw login");
        assert_eq!(raw.query("select 1").await.unwrap().scalar(), Some("1"));
        w.admin("SET server_fast_close = 1").await.expect("SET");
        w.admin("RECONNECT").await.expect("RECONNECT");
        // What PgBouncer sends: FATAL 08P01 "database configuration changed".
        assert_eq!(raw.outcome().await, Outcome::Fatal("08P01".into(), "database configuration changed".into()));
        assert!(weir_e2e::eventually(weir_e2e::WAIT_LIMIT, || c.is_closed()).await, "the idle client is ended too");
        let e = c.simple_query("select 1").await.expect_err("closed by RECONNECT");
        assert!(describe(&e).contains("database configuration changed") || e.is_closed(), "{e}");
        let logs = w.logs();
        assert!(logs.contains("database configuration changed"), "{logs}");
    })
    .await;
}

/// min_pool_size above pool_size is accepted and capped by the pool size,
/// as PgBouncer does (before, the config was refused).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn min_pool_size_above_pool_size_is_capped() {
    bounded(60, async {
        let opts = Opts { pool_size: 3, database: "min_pool_size = 10".into(), ..Opts::default() };
        let h = Harness::start(opts).await;
        let c = connect(&h.url(SCRAM_USER, SCRAM_PASS)).await.expect("login");
        c.simple_query("select 1").await.expect("served");
        assert!(
            weir_e2e::eventually(weir_e2e::WAIT_LIMIT, || backends(&h, &[SCRAM_USER]) == 3).await,
            "warmed to the pool size"
        );
        // A window in which no fourth server may open.
        tokio::time::sleep(Duration::from_millis(1200)).await;
        assert_eq!(backends(&h, &[SCRAM_USER]), 3, "and never beyond it");
        assert_eq!(h.pool().settings().min_pool_size, 3);
    })
    .await;
}

/// Connect timeouts, as PgBouncer: each connect ends at
/// server_connect_timeout and is retried, and the waiting client is ended
/// by query_timeout when it is shorter than query_wait_timeout (PgBouncer's
/// janitor applies both to a waiting client), the error naming it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_wait_through_connect_timeouts_ends_at_query_timeout() {
    bounded(60, async {
        let general = "server_connect_timeout = \"300ms\"\nquery_wait_timeout = \"10s\"\nquery_timeout = \"1s\"";
        let h = Harness::start(Opts { relay: true, general: general.into(), ..Opts::default() }).await;
        h.relay.as_ref().unwrap().freeze();
        let t0 = Instant::now();
        let err = connect_within(&h.url(SCRAM_USER, SCRAM_PASS), Duration::from_secs(8)).await.expect_err("no server");
        let took = t0.elapsed();
        // Ended by query_timeout (1 s), far before query_wait_timeout (10 s).
        assert!(took >= Duration::from_millis(950) && took < Duration::from_secs(5), "{took:?}: {err}");
        assert!(err.contains("(query_timeout)") && err.contains("timed out"), "{err}");
        h.relay.as_ref().unwrap().thaw();
    })
    .await;
}
