//! Running weir as a process: /metrics moves under load and counts server
//! closes by reason, answers within 100 ms while the data path is saturated,
//! SIGHUP reloads without dropping clients (and a lower pool_size closes
//! the idle servers above it), SIGTERM drains, SIGINT stops,
//! JSON logs, and `weir migrate-config` output that `weir check-config` takes.
//!
//! The scrape is timed in a 100 ms window, so every test here holds
//! `weir_e2e::serial` and they run one at a time, not two per process.

use std::net::TcpStream;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weir_e2e::process::{metric, rows, weir_bin, WeirProcess};
use weir_e2e::{connect, eventually, pg, sqlstate, SCRAM_PASS, SCRAM_USER};

const POOL: &[(&str, &str)] = &[("database", "app"), ("user", SCRAM_USER)];

fn with<'a>(extra: &[(&'a str, &'a str)]) -> Vec<(&'a str, &'a str)> {
    POOL.iter().chain(extra).copied().collect()
}

/// True once `m` shows the 100 transactions (300 queries) of the load
/// below. The exporter may show them a moment after the clients have their
/// answers (a loaded machine makes that moment longer), so the test waits
/// for them before checking each.
fn load_counted(m: &str) -> bool {
    metric(m, "weir_transactions_total", POOL) >= 100.0
        && metric(m, "weir_queries_total", POOL) >= 300.0
        && metric(m, "weir_transaction_duration_seconds_count", POOL) >= 100.0
        && metric(m, "weir_client_wait_duration_seconds_count", POOL) >= 100.0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_move_under_load_and_count_server_closes_by_reason() {
    let _alone = weir_e2e::serial().await;
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "", "pool_size = 4").await;
    assert_eq!(w.http_get("/healthz").0, 200);
    assert_eq!(w.http_get("/readyz").0, 200, "no pool yet: idle and healthy");
    let before = w.metrics();
    assert_eq!(metric(&before, "weir_build_info", &[]), 1.0);

    let mut clients = Vec::new();
    for _ in 0..4 {
        clients.push(connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap());
    }
    let work = clients.iter().map(|c| async move {
        for i in 0..25 {
            c.batch_execute("begin").await.unwrap();
            c.query_one("select $1::int", &[&i]).await.unwrap();
            c.batch_execute("commit").await.unwrap();
        }
    });
    futures_util::future::join_all(work).await;

    eventually(weir_e2e::WAIT_LIMIT, || load_counted(&w.metrics())).await;
    let m = w.metrics();
    assert!(metric(&m, "weir_transactions_total", POOL) >= 100.0, "transactions");
    assert!(metric(&m, "weir_queries_total", POOL) >= 300.0, "queries: {}", metric(&m, "weir_queries_total", POOL));
    assert!(metric(&m, "weir_transaction_duration_seconds_count", POOL) >= 100.0);
    assert!(metric(&m, "weir_client_wait_duration_seconds_count", POOL) >= 100.0);
    assert!(metric(&m, "weir_client_connections_total", &[("result", "ok")]) >= 4.0);
    let opened = metric(&m, "weir_server_connections_opened_total", POOL);
    assert!((1.0..=4.0).contains(&opened), "opened {opened}");
    let opens_rate = || metric(&w.metrics(), "weir_server_connections_opened_per_second", &with(&[("window", "60s")]));
    assert!(eventually(weir_e2e::WAIT_LIMIT, || opens_rate() > 0.0).await, "opens per second");
    let idle_clients = || metric(&w.metrics(), "weir_pool_clients", &with(&[("state", "idle")]));
    assert!(eventually(weir_e2e::WAIT_LIMIT, || idle_clients() == 4.0).await, "clients gauge: {}", idle_clients());
    assert_eq!(w.http_get("/readyz").0, 200);

    // A client running a query is listed as active, linked to its server.
    let sleeper = tokio::spawn({
        let c = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
        async move { c.simple_query("select pg_sleep(30)").await.map(|_| ()) }
    });
    weir_e2e::until_running(&weir_e2e::direct_client(&pg).await, "select pg_sleep(30)", 1).await;
    let sleeping = rows(&w.admin("SHOW CLIENTS").await.unwrap())
        .into_iter()
        .find(|r| r["state"] == "active")
        .expect("active client");
    assert!(!sleeping["server_pid"].is_empty());
    sleeper.abort();

    // Postgres kills weir's backends: the closes are counted as server_closed.
    let closed_before =
        metric(&w.metrics(), "weir_server_connections_closed_total", &with(&[("reason", "server_closed")]));
    let killed: usize = pg
        .psql("app", "select count(*) from (select pg_terminate_backend(pid) from pg_stat_activity where usename = 'scram_user' and query <> 'select pg_sleep(30)') t")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(killed >= 1);
    let closed = || metric(&w.metrics(), "weir_server_connections_closed_total", &with(&[("reason", "server_closed")]));
    assert!(
        eventually(weir_e2e::WAIT_LIMIT, || closed() >= closed_before + killed as f64).await,
        "closed{{reason=server_closed}} went from {closed_before} to {} after killing {killed} backends",
        closed()
    );
    let closes_rate = || metric(&w.metrics(), "weir_server_connections_closed_per_second", &with(&[("window", "60s")]));
    assert!(eventually(weir_e2e::WAIT_LIMIT, || closes_rate() > 0.0).await, "closes per second");
    // The pool refills and the clients carry on.
    for c in &clients {
        c.simple_query("select 1").await.unwrap();
    }
}

/// /readyz: ready when idle and healthy, not ready while no server can be
/// reached, ready again once one has been opened.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_follows_whether_servers_can_be_reached() {
    let _alone = weir_e2e::serial().await;
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "query_wait_timeout = \"1s\"", "").await;
    assert_eq!(w.http_get("/readyz").0, 200);
    pg.stop().unwrap();
    assert!(connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.is_err(), "no server, no login within the budget");
    assert!(eventually(weir_e2e::WAIT_LIMIT, || w.http_get("/readyz").0 == 503).await, "not ready while connects fail");
    assert_eq!(w.http_get("/healthz").0, 200, "alive all the same");
    pg.start_again().unwrap();
    let c = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.expect("connects once Postgres is back");
    c.simple_query("select 1").await.unwrap();
    assert_eq!(w.http_get("/readyz").0, 200);
}

/// /readyz after a server has been reached once: a Postgres outage does not
/// make weir unready (every replica shares that Postgres, and a fleet-wide
/// unready pod set would turn a database blip into a total outage with no
/// error messages); clients get a prompt error instead, and /metrics shows
/// the failing connects. See README, "Readiness".
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_stays_ready_through_a_postgres_outage_after_start() {
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "query_wait_timeout = \"1s\"", "").await;
    let c = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    c.simple_query("select 1").await.unwrap();
    pg.stop().unwrap();
    let err = c.simple_query("select 1").await.expect_err("no server, an error at query_wait_timeout");
    assert!(err.code().is_some(), "an ErrorResponse with a SQLSTATE: {err}");
    let failures = || metric(&w.metrics(), "weir_server_connect_failures_total", &with(&[]));
    assert!(eventually(weir_e2e::WAIT_LIMIT, || failures() > 0.0).await, "failing connects are counted");
    for _ in 0..5 {
        assert_eq!(w.http_get("/readyz").0, 200, "still ready while Postgres is down");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    pg.start_again().unwrap();
    let c = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.expect("connects once Postgres is back");
    c.simple_query("select 1").await.unwrap();
}

/// The log at the default level has PgBouncer's server lines: the open, and
/// the close with its reason, after Postgres terminates an idle backend.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_open_and_close_are_logged_with_the_reason() {
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "stats_period = \"1s\"", "").await;
    let c = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    let row = c.query_one("select pg_backend_pid()", &[]).await.unwrap();
    let pid: i32 = row.get(0);
    let opened = format!("app/{SCRAM_USER}@");
    assert!(w.logs().lines().any(|l| l.contains(&opened) && l.contains("new connection to server")), "{}", w.logs());
    pg.psql("app", &format!("select pg_terminate_backend({pid}, 5000)")).unwrap();
    let closed =
        |l: &&str| l.contains(&opened) && l.contains("closing because: server_closed") && l.contains(&pid.to_string());
    assert!(
        eventually(weir_e2e::WAIT_LIMIT, || w.logs().lines().any(|l| closed(&l))).await,
        "close line with its reason and pid; log:\n{}",
        w.logs()
    );
    c.simple_query("select 1").await.expect("the client carries on on a fresh server");
    // And PgBouncer's log_stats line, per pool, every stats_period.
    let stats = format!("stats: app/{SCRAM_USER} ");
    assert!(
        eventually(weir_e2e::WAIT_LIMIT, || w.logs().lines().any(|l| l.contains(&stats) && l.contains("xacts/s")))
            .await,
        "a stats line; log:\n{}",
        w.logs()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_requests_are_counted() {
    let _alone = weir_e2e::serial().await;
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "", "").await;
    let c = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    let token = c.cancel_token();
    let q = tokio::spawn(async move { c.simple_query("select pg_sleep(30)").await.map(|_| ()) });
    weir_e2e::until_running(&weir_e2e::direct_client(&pg).await, "select pg_sleep(30)", 1).await;
    token.cancel_query(tokio_postgres::NoTls).await.unwrap();
    let e = tokio::time::timeout(Duration::from_secs(10), q).await.unwrap().unwrap().unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("57014"));
    assert!(
        eventually(weir_e2e::WAIT_LIMIT, || metric(
            &w.metrics(),
            "weir_cancel_requests_total",
            &[("outcome", "forwarded")]
        ) == 1.0)
        .await
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_answer_within_100ms_while_500_clients_saturate_a_pool_of_2() {
    let _alone = weir_e2e::serial().await;
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "query_wait_timeout = \"60s\"\nmax_client_conn = 600", "pool_size = 2").await;
    let stop = Arc::new(AtomicBool::new(false));
    let done = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for _ in 0..500 {
        let (url, stop, done) = (w.url(SCRAM_USER, SCRAM_PASS), stop.clone(), done.clone());
        tasks.push(tokio::spawn(async move {
            let c = connect(&url).await.expect("connect");
            while !stop.load(Ordering::Relaxed) {
                if c.simple_query("select pg_sleep(0.01)").await.is_ok() {
                    done.fetch_add(1, Ordering::Relaxed);
                }
            }
        }));
    }
    let saturated = || metric(&w.metrics(), "weir_pool_clients", &with(&[("state", "waiting")])) >= 400.0;
    assert!(eventually(Duration::from_secs(60), saturated).await, "500 clients did not queue on the pool of 2");
    let mut times = Vec::new();
    for _ in 0..20 {
        let (status, body, took) = w.http_get("/metrics");
        assert_eq!(status, 200);
        assert!(metric(&body, "weir_pool_clients", &with(&[("state", "waiting")])) >= 1.0);
        times.push(took);
        assert_eq!(w.http_get("/readyz").0, 200);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stop.store(true, Ordering::Relaxed);
    let slowest = *times.iter().max().unwrap();
    eprintln!(
        "/metrics under saturation: slowest {slowest:?}, all {times:?}; {} queries ran",
        done.load(Ordering::Relaxed)
    );
    assert!(slowest < Duration::from_millis(100), "a scrape took {slowest:?} while the pool was saturated: {times:?}");
    assert!(done.load(Ordering::Relaxed) > 0, "the pool was working, not stuck");
    for t in tasks {
        t.abort();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_applies_a_new_pool_size_without_dropping_clients() {
    let _alone = weir_e2e::serial().await;
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "", "pool_size = 2").await;
    let c = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    c.simple_query("select 1").await.unwrap();
    let pool_size = || async { rows(&w.admin("SHOW POOLS").await.unwrap())[0]["pool_size"].clone() };
    assert_eq!(pool_size().await, "2");

    w.write_config("", "pool_size = 7");
    w.signal("HUP");
    let applied = async {
        while pool_size().await != "7" {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), applied).await.expect("SIGHUP applied pool_size = 7");
    let row: i32 = c.query_one("select 40 + 2", &[]).await.expect("the client survived the reload").get(0);
    assert_eq!(row, 42);

    // A file that does not validate is not applied, and the log says why.
    w.write_config("default_pool_size = 0", "");
    w.signal("HUP");
    assert!(eventually(Duration::from_secs(10), || w.logs().contains("config reload (SIGHUP) failed")).await);
    assert!(w.logs().contains("default_pool_size: must be at least 1"), "{}", w.logs());
    assert_eq!(pool_size().await, "7");
    c.simple_query("select 1").await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sighup_lowering_pool_size_closes_the_idle_servers_above_it() {
    let _alone = weir_e2e::serial().await;
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "", "pool_size = 6").await;
    let url = w.url(SCRAM_USER, SCRAM_PASS);
    let mut clients = Vec::new();
    for _ in 0..6 {
        clients.push(connect(&url).await.unwrap());
    }
    // Six clients at once, each holding a server for a moment: six servers.
    let sleeps = clients.iter().map(|c| c.simple_query("select pg_sleep(0.5)"));
    for r in futures_util::future::join_all(sleeps).await {
        r.unwrap();
    }
    let backends = || {
        let n = pg.psql("app", "select count(*) from pg_stat_activity where usename = 'scram_user'").unwrap();
        n.trim().parse::<u32>().unwrap()
    };
    assert_eq!(backends(), 6, "six servers before the reload");

    w.write_config("", "pool_size = 2");
    w.signal("HUP");
    assert!(
        eventually(Duration::from_secs(10), || backends() == 2).await,
        "idle servers above the new pool_size were not closed: {} backends",
        backends()
    );
    let shrunk = metric(&w.metrics(), "weir_server_connections_closed_total", &with(&[("reason", "pool_shrink")]));
    assert_eq!(shrunk, 4.0, "four closes counted as pool_shrink");
    for c in &clients {
        c.simple_query("select 1").await.expect("every client survived the shrink");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_lets_a_running_transaction_finish_then_exits() {
    let _alone = weir_e2e::serial().await;
    let pg = pg().await;
    let mut w = WeirProcess::start(&pg, "shutdown_timeout = \"20s\"", "").await;
    pg.psql("app", "create table drain_check (x int); grant all on drain_check to scram_user").unwrap();
    let busy = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    let idle = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    idle.simple_query("select 1").await.unwrap();
    busy.batch_execute("begin").await.unwrap();
    // The transaction runs through the whole drain check: a loaded machine
    // makes the checks below slow, and a shorter sleep could end first.
    let txn = tokio::spawn(async move {
        busy.simple_query("select pg_sleep(4)").await?;
        busy.simple_query("insert into drain_check values (1)").await?;
        busy.batch_execute("commit").await
    });
    assert!(
        eventually(weir_e2e::WAIT_LIMIT, || pg
            .psql("app", "select count(*) from pg_stat_activity where query = 'select pg_sleep(4)'")
            .unwrap()
            .trim()
            == "1")
        .await
    );

    w.signal("TERM");
    // Not ready, not accepting; the idle client is told and let go.
    assert!(eventually(weir_e2e::WAIT_LIMIT, || w.http_get("/readyz").0 == 503).await, "/readyz turns 503");
    assert!(
        eventually(weir_e2e::WAIT_LIMIT, || TcpStream::connect(("127.0.0.1", w.port)).is_err()).await,
        "listener closed"
    );
    let e = idle.simple_query("select 1").await.unwrap_err();
    assert!(e.is_closed() || sqlstate(&e).as_deref() == Some("57P01"), "{e}");

    tokio::time::timeout(Duration::from_secs(10), txn)
        .await
        .unwrap()
        .unwrap()
        .expect("the running transaction finished");
    assert_eq!(pg.psql("app", "select count(*) from drain_check").unwrap().trim(), "1", "its COMMIT went through");
    let status = w.wait_exit(Duration::from_secs(10)).await.expect("weir exits after the drain");
    assert!(status.success(), "{status:?}");
    let logs = w.logs();
    assert!(logs.contains("SIGTERM: draining") && logs.contains("drained"), "{logs}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigint_stops_and_shutdown_command_drains() {
    let _alone = weir_e2e::serial().await;
    let pg = pg().await;
    let mut w = WeirProcess::start(&pg, "", "").await;
    let c = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    c.simple_query("select 1").await.unwrap();
    w.signal("INT");
    assert!(w.wait_exit(Duration::from_secs(5)).await.expect("SIGINT stops promptly").success());

    let mut w = WeirProcess::start(&pg, "", "").await;
    let out = w.admin("SHUTDOWN").await.unwrap();
    assert!(out.contains("SHUTDOWN"), "{out}");
    assert!(w.wait_exit(Duration::from_secs(10)).await.expect("SHUTDOWN drains and exits").success());
    assert!(w.logs().contains("SHUTDOWN: draining"), "{}", w.logs());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_logs_with_connection_logging() {
    let _alone = weir_e2e::serial().await;
    let pg = pg().await;
    let w =
        WeirProcess::start(&pg, "log_format = \"json\"\nlog_connections = true\nlog_disconnections = true", "").await;
    let c = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    c.simple_query("select 1").await.unwrap();
    drop(c);
    let closed = "closing because: client close request (age=";
    assert!(eventually(weir_e2e::WAIT_LIMIT, || w.logs().contains(closed)).await, "{}", w.logs());
    let logs = w.logs();
    let login = logs.lines().find(|l| l.contains("client logged in")).expect("login logged");
    assert!(
        login.starts_with('{') && login.contains("\"user\":\"scram_user\"") && login.contains("\"db\":\"app\""),
        "{login}"
    );
}

/// An event of the session phase (here the pin of a LISTEN) prints inside
/// its client's span, as events of the login do, in both log formats: the
/// session names its span without entering it at each poll (`span.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_events_print_in_the_client_span() {
    let _alone = weir_e2e::serial().await;
    let pg = pg().await;
    for (format, want) in [
        ("text", ["client{peer=127.0.0.1:", "user=\"scram_user\"", "db=\"app\""]),
        ("json", ["\"name\":\"client\"", "\"user\":\"scram_user\"", "\"db\":\"app\""]),
    ] {
        let w = WeirProcess::start(&pg, &format!("log_format = \"{format}\"\nlog_disconnections = true"), "").await;
        let c = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
        c.batch_execute("listen weir_span_check").await.unwrap();
        drop(c);
        // (The readiness probe's connection, which never logged in, also
        // leaves a "closing because", without user and db.)
        let ours = |l: &str| l.contains("closing because: client close request") && l.contains("scram_user");
        assert!(eventually(weir_e2e::WAIT_LIMIT, || w.logs().lines().any(ours)).await, "{}", w.logs());
        let logs = w.logs();
        let pinned = logs.lines().find(|l| l.contains("client pinned")).expect("the pin is logged");
        assert!(want.iter().all(|w| pinned.contains(w)), "{format}: {pinned}");
        let gone = logs.lines().find(|l| ours(l)).unwrap();
        assert!(want.iter().all(|w| gone.contains(w)), "{format}: {gone}");
    }
}

#[test]
fn migrate_config_output_passes_check_config() {
    let dir = std::env::temp_dir().join(format!("weir-migrate-{}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("userlist.txt"), "\"app_user\" \"secret\"\n").unwrap();
    std::fs::write(
        dir.join("pgbouncer.ini"),
        "[databases]\napp = host=127.0.0.1 port=5432 dbname=app pool_size=10\n\n[pgbouncer]\nlisten_addr = 127.0.0.1\n\
         listen_port = 6432\nauth_type = md5\nauth_file = userlist.txt\npool_mode = transaction\nquery_wait_timeout = 5\n\
         server_tls_sslmode = require\nunix_socket_dir = /tmp\nadmin_users = admin\n",
    )
    .unwrap();
    let out = Command::new(weir_bin()).arg("migrate-config").arg(dir.join("pgbouncer.ini")).output().unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!stderr.contains("unix_socket_dir"), "carried over: {stderr}");
    let toml = String::from_utf8(out.stdout).unwrap();
    assert!(toml.contains("unix_socket_dir = \"/tmp\""), "{toml}");
    assert!(toml.contains("query_wait_timeout = \"5s\"") && toml.contains("[databases.app]"), "{toml}");
    assert!(toml.contains("server_tls_sslmode = \"require\""), "{toml}");
    std::fs::write(dir.join("weir.toml"), &toml).unwrap();
    let check = Command::new(weir_bin()).arg("check-config").arg(dir.join("weir.toml")).output().unwrap();
    assert!(
        check.status.success(),
        "{}{}",
        String::from_utf8_lossy(&check.stdout),
        String::from_utf8_lossy(&check.stderr)
    );
    let _ = std::fs::remove_dir_all(&dir);
}
