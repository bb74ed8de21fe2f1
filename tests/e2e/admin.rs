//! The admin console through psql and tokio-postgres, against the built weir
//! binary: every SHOW renders, stats users may only look, PAUSE holds new
//! queries until RESUME, KILL disconnects and closes, RELOAD keeps a bad file
//! out, a server waiting for its cancel is counted in sv_being_canceled.

use std::time::{Duration, Instant};

use tokio_postgres::SimpleQueryMessage;
use weir_e2e::process::{metric, rows, WeirProcess, ADMIN_PASS, ADMIN_USER, STATS_PASS, STATS_USER};
use weir_e2e::raw::{self, Raw};
use weir_e2e::{
    connect, eventually, pg, sqlstate, Harness, Opts, PgServer, APP_DB, SCRAM_PASS, SCRAM_USER, TRUST_PASS, TRUST_USER,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_show_renders_in_psql() {
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "", "").await;
    let c = connect(&format!("{}?application_name=e2e_app", w.url(SCRAM_USER, SCRAM_PASS))).await.unwrap();
    c.batch_execute("begin; select 1; commit").await.unwrap();
    c.simple_query("select 2").await.unwrap();

    let pools = w.pool_row(SCRAM_USER).await;
    assert_eq!(pools["pool_mode"], "transaction");
    assert_eq!(pools["cl_idle"], "1", "{pools:?}");
    assert_eq!(pools["cl_waiting"], "0");
    // Without fleet_share the fleet's columns read 0.
    assert_eq!((pools["fleet_share"].as_str(), pools["fleet_instances"].as_str()), ("0", "0"), "{pools:?}");
    assert!(pools["sv_idle"].parse::<u32>().unwrap() + pools["sv_used"].parse::<u32>().unwrap() >= 1, "{pools:?}");
    for col in [
        "cl_active",
        "sv_active",
        "sv_tested",
        "sv_login",
        "maxwait",
        "maxwait_us",
        "opens_per_sec",
        "closes_per_sec",
        "dropped",
    ] {
        assert!(pools.contains_key(col), "SHOW POOLS lacks {col}");
    }

    let stats = rows(&w.admin("SHOW STATS").await.unwrap());
    let app = stats.iter().find(|r| r["database"] == "app").expect("stats row");
    assert!(app["total_xact_count"].parse::<u64>().unwrap() >= 2, "{app:?}");
    assert!(app["total_query_count"].parse::<u64>().unwrap() >= 2, "{app:?}");
    assert!(app["total_server_opened"].parse::<u64>().unwrap() >= 1, "{app:?}");

    let clients = rows(&w.admin("SHOW CLIENTS").await.unwrap());
    let me = clients.iter().find(|r| r["application_name"] == "e2e_app").expect("the client is listed");
    assert_eq!((me["user"].as_str(), me["database"].as_str(), me["state"].as_str()), (SCRAM_USER, "app", "idle"));
    assert!(clients.iter().any(|r| r["database"] == "weir" && r["user"] == ADMIN_USER), "the console client itself");

    let servers = rows(&w.admin("SHOW SERVERS").await.unwrap());
    let pids = pg.psql("app", "select pid from pg_stat_activity where usename = 'scram_user'").unwrap();
    assert!(!servers.is_empty());
    for s in &servers {
        assert!(pids.contains(&s["remote_pid"]), "{s:?} not in {pids}");
        assert!(matches!(s["state"].as_str(), "idle" | "used"), "{s:?}");
    }

    let dbs = rows(&w.admin("SHOW DATABASES").await.unwrap());
    let app_db = dbs.iter().find(|r| r["name"] == "app").expect("database row");
    assert_eq!((app_db["port"].clone(), app_db["paused"].as_str()), (pg.port().to_string(), "0"));

    let config = rows(&w.admin("show config;").await.unwrap());
    let size = config.iter().find(|r| r["key"] == "default_pool_size").expect("config row");
    assert_eq!((size["value"].as_str(), size["default"].as_str(), size["changeable"].as_str()), ("20", "20", "yes"));

    let lists = rows(&w.admin("SHOW LISTS").await.unwrap());
    let item = |name: &str| lists.iter().find(|r| r["list"] == name).map(|r| r["items"].clone()).unwrap();
    assert_eq!((item("databases"), item("pools"), item("used_clients")), ("1".into(), "1".into(), "1".into()));

    assert!(w.admin("SHOW VERSION").await.unwrap().contains("weir "));
    assert!(w.admin("SHOW HELP").await.unwrap().contains("PAUSE [db]"));
    // PgBouncer's name for the console works too, and aligned output renders.
    let aligned = w.psql(ADMIN_USER, ADMIN_PASS, "pgbouncer", "SHOW POOLS").await.unwrap();
    assert!(aligned.contains("cl_active|cl_waiting"), "{aligned}");
    // weir's own columns come after PgBouncer's; the fleet's are the last.
    let header = aligned.lines().find(|l| l.starts_with("database|")).expect("a header line");
    assert!(header.ends_with("|connect_refused|fleet_share|fleet_instances"), "{header}");
    let err = w.admin("SHOW PUDDLES").await.unwrap_err();
    assert!(err.contains("unknown SHOW") && err.contains("POOLS"), "{err}");
    drop(c);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_errors_carry_sqlstates_and_stats_users_may_only_show() {
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "", "").await;
    let stats = connect(&w.url_for(STATS_USER, STATS_PASS, "weir")).await.unwrap();
    let shown = stats.simple_query("SHOW POOLS").await.unwrap();
    assert!(!shown.is_empty(), "a stats user may SHOW");
    for cmd in ["PAUSE", "RESUME", "RELOAD", "KILL app", "SHUTDOWN"] {
        let e = stats.simple_query(cmd).await.unwrap_err();
        assert_eq!(sqlstate(&e).as_deref(), Some("42501"), "{cmd}: {e}");
    }
    let err = w.psql(STATS_USER, STATS_PASS, "weir", "PAUSE").await.unwrap_err();
    assert!(err.contains("permission denied") && err.contains("admin_users"), "{err}");

    let admin = connect(&w.url_for(ADMIN_USER, ADMIN_PASS, "weir")).await.unwrap();
    let e = admin.simple_query("SELECT 1").await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("42601"));
    assert!(e.as_db_error().unwrap().message().contains("SHOW {POOLS|"), "{e}");
    let e = admin.simple_query("PAUSE nosuchdb").await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("3D000"));
    assert!(admin.simple_query("show version").await.is_ok(), "the session goes on after errors");

    let e = connect(&w.url_for(SCRAM_USER, SCRAM_PASS, "weir")).await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("42501"), "a pooled user is not a console user: {e}");
    let e = connect(&w.url_for(ADMIN_USER, "wrong", "weir")).await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("28P01"), "console users authenticate: {e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pause_holds_new_queries_and_resume_releases_them() {
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "", "").await;
    let busy = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    let idle = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    idle.simple_query("select 1").await.unwrap();

    // PAUSE waits for the running query to finish, then returns.
    let running = tokio::spawn(async move {
        busy.simple_query(SLEEP).await.unwrap();
        (Instant::now(), busy)
    });
    until_sleep_runs(&pg).await;
    w.admin("PAUSE app").await.unwrap();
    let paused_at = Instant::now();
    let (finished_at, _busy) = running.await.unwrap();
    assert!(finished_at <= paused_at, "PAUSE returned before the running query finished");
    let row = w.pool_row(SCRAM_USER).await;
    assert_eq!(
        (row["paused"].as_str(), row["sv_active"].as_str(), row["sv_idle"].as_str()),
        ("1", "0", "0"),
        "{row:?}"
    );
    assert!(
        metric(&w.metrics(), "weir_server_connections_closed_total", &[("reason", "admin")]) >= 1.0,
        "PAUSE closes the released servers"
    );

    // A new query waits while paused...
    let held = tokio::spawn(async move { idle.simple_query("select 42").await.map(|_| Instant::now()) });
    let waiting = async {
        loop {
            if w.pool_row(SCRAM_USER).await["cl_waiting"] == "1" {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), waiting).await.expect("the new query is queued while paused");
    // A window in which the paused pool must not run it.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!held.is_finished(), "a query ran while the pool was paused");
    // ...and RESUME releases it.
    let resumed_at = Instant::now();
    w.admin("RESUME app").await.unwrap();
    let ran_at =
        tokio::time::timeout(Duration::from_secs(10), held).await.expect("released after RESUME").unwrap().unwrap();
    assert!(ran_at >= resumed_at);
    assert_eq!(w.pool_row(SCRAM_USER).await["paused"], "0");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_disconnects_the_database_and_keeps_it_paused_until_resume() {
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "", "").await;
    let victim = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    victim.simple_query("select 1").await.unwrap();
    let before = metric(&w.metrics(), "weir_server_connections_closed_total", &[("reason", "admin")]);

    let out = w.admin("KILL app").await.unwrap();
    assert!(out.contains("KILL"), "{out}");
    assert!(victim.simple_query("select 1").await.is_err(), "the killed client is disconnected");
    let row = w.pool_row(SCRAM_USER).await;
    assert_eq!(
        (row["sv_idle"].as_str(), row["sv_active"].as_str(), row["paused"].as_str()),
        ("0", "0", "1"),
        "{row:?}"
    );
    assert!(metric(&w.metrics(), "weir_server_connections_closed_total", &[("reason", "admin")]) > before);
    let left = pg.psql("app", "select count(*) from pg_stat_activity where usename = 'scram_user'").unwrap();
    assert_eq!(left.trim(), "0", "KILL closed the servers");

    // A new client may log in, but its query waits until RESUME.
    let next = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    let q = tokio::spawn(async move { next.simple_query("select 7").await.is_ok() });
    let queued = || async { w.pool_row(SCRAM_USER).await["cl_waiting"] == "1" };
    weir_e2e::wait_for("the query to queue in the paused pool", queued).await;
    assert!(!q.is_finished(), "the database stays paused after KILL");
    w.admin("RESUME app").await.unwrap();
    assert!(tokio::time::timeout(Duration::from_secs(10), q).await.unwrap().unwrap());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reload_applies_a_valid_file_and_keeps_a_bad_one_out() {
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "", "pool_size = 3").await;
    let c = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    c.simple_query("select 1").await.unwrap();
    assert_eq!(w.pool_row(SCRAM_USER).await["pool_size"], "3");

    w.write_config("default_pool_size = 0", "");
    let admin = connect(&w.url_for(ADMIN_USER, ADMIN_PASS, "weir")).await.unwrap();
    let e = admin.simple_query("RELOAD").await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("F0000"));
    assert!(e.as_db_error().unwrap().message().contains("default_pool_size"), "says why: {e}");
    assert_eq!(w.pool_row(SCRAM_USER).await["pool_size"], "3", "the old config stays");

    w.write_config("", "pool_size = 6");
    admin.simple_query("RELOAD").await.unwrap();
    assert_eq!(w.pool_row(SCRAM_USER).await["pool_size"], "6");
    c.simple_query("select 2").await.expect("the client survives reloads");
}

/// Backend pids of scram_user's connections, as Postgres lists them.
fn backend_pids(pg: &PgServer) -> Vec<String> {
    let out = pg.psql("app", "select pid from pg_stat_activity where usename = 'scram_user' order by pid").unwrap();
    out.lines().map(|l| l.trim().to_owned()).filter(|l| !l.is_empty()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reconnect_closes_servers_once_released_and_wait_close_waits_for_them() {
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "", "pool_size = 2").await;
    let idle = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    let busy = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    idle.simple_query("select 1").await.unwrap();
    let before = backend_pids(&pg);
    assert!(!before.is_empty());

    // One server is in use through RECONNECT; the idle ones close at once.
    let running = tokio::spawn(async move { busy.simple_query(SLEEP).await.map(|_| busy) });
    until_sleep_runs(&pg).await;
    let out = w.admin("RECONNECT app").await.unwrap();
    assert!(out.contains("RECONNECT"), "{out}");
    let servers = rows(&w.admin("SHOW SERVERS").await.unwrap());
    assert!(servers.iter().any(|s| s["close_needed"] == "1"), "the busy server is marked: {servers:?}");
    // WAIT_CLOSE returns once the busy one was released and closed.
    w.admin("WAIT_CLOSE app").await.unwrap();
    assert!(running.is_finished() || running.await.is_ok());
    let after = backend_pids(&pg);
    assert!(before.iter().all(|p| !after.contains(p)), "every old server closed: {before:?} -> {after:?}");
    idle.simple_query("select 2").await.expect("clients go on, on new servers");
    assert!(!backend_pids(&pg).iter().any(|p| before.contains(p)));
    let e = w.admin("RECONNECT nosuchdb").await.unwrap_err();
    assert!(e.contains("no such database"), "{e}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn disable_refuses_new_clients_and_enable_accepts_them_again() {
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "", "").await;
    let logged_in = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    w.admin("DISABLE app").await.unwrap();
    let dbs = rows(&w.admin("SHOW DATABASES").await.unwrap());
    assert_eq!(dbs.iter().find(|r| r["name"] == "app").unwrap()["disabled"], "1");
    let e = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("55000"), "{e}");
    assert_eq!(e.as_db_error().unwrap().message(), "database \"app\" is disabled");
    logged_in.simple_query("select 1").await.expect("clients already in stay");

    w.admin("ENABLE app").await.unwrap();
    let c = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.expect("accepted again after ENABLE");
    c.simple_query("select 1").await.unwrap();
    let e = w.admin("DISABLE").await.unwrap_err();
    assert!(e.contains("usage: DISABLE db"), "{e}");
}

/// A setting's value in SHOW CONFIG.
async fn setting(w: &WeirProcess, key: &str) -> String {
    let config = rows(&w.admin("SHOW CONFIG").await.unwrap());
    config.iter().find(|r| r["key"] == key).expect("config row")["value"].clone()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn set_changes_a_reloadable_setting_and_refuses_the_rest_and_suspend() {
    let pg = pg().await;
    let w = WeirProcess::start(&pg, "", "").await;
    let c = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    c.simple_query("select 1").await.unwrap();
    assert_eq!(w.pool_row(SCRAM_USER).await["pool_size"], "20");

    w.admin("SET default_pool_size = 7").await.unwrap();
    assert_eq!(w.pool_row(SCRAM_USER).await["pool_size"], "7", "the pool took the new size");
    w.admin("SET query_timeout = 5").await.unwrap();
    assert_eq!(setting(&w, "query_timeout").await, "5s", "PgBouncer's seconds");
    w.admin("SET stats_period = '2s'").await.unwrap();
    assert_eq!(setting(&w, "stats_period").await, "2s");

    let admin = connect(&w.url_for(ADMIN_USER, ADMIN_PASS, "weir")).await.unwrap();
    let e = admin.simple_query("SET listen_addr = '127.0.0.1:1'").await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("55P02"), "{e}");
    assert!(e.as_db_error().unwrap().message().contains("needs a restart"), "{e}");
    let e = admin.simple_query("SET default_pool_size = 0").await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("22023"), "{e}");
    assert!(e.as_db_error().unwrap().message().contains("default_pool_size"), "{e}");
    let e = admin.simple_query("SET frobnicate = 1").await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("22023"), "{e}");
    assert_eq!(w.pool_row(SCRAM_USER).await["pool_size"], "7", "a refused SET changes nothing");

    let e = admin.simple_query("SUSPEND").await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("0A000"), "{e}");
    assert!(e.as_db_error().unwrap().message().contains("no online restart"), "{e}");
    let help = w.admin("SHOW HELP").await.unwrap();
    for cmd in
        ["SET key = value", "RECONNECT [db]", "DISABLE db", "ENABLE db", "WAIT_CLOSE [db]", "SHOW STATS_AVERAGES"]
    {
        assert!(help.contains(cmd), "SHOW HELP lists {cmd}");
    }
    c.simple_query("select 2").await.expect("clients go on");
}

/// The query a test keeps running while it works the console: long enough
/// that a loaded machine still finds it running after a few psql calls.
const SLEEP: &str = "select pg_sleep(5)";

/// Waits until Postgres runs `SLEEP`.
async fn until_sleep_runs(pg: &PgServer) {
    weir_e2e::until_running(&weir_e2e::direct_client(pg).await, SLEEP, 1).await
}

/// A client that leaves while its query runs: weir cancels the query and
/// holds the server in recovery until Postgres takes the cancel. SHOW POOLS
/// counts it in sv_being_canceled meanwhile (the relay delays the cancel's
/// connection), and the server is idle again afterwards.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_waiting_for_its_cancel_is_being_canceled() {
    let opts = Opts { pool_size: 1, auth_type: "trust", relay: true, ..Opts::default() };
    let h = Harness::start(opts).await;
    let console = connect(&format!("postgres://admin:admin_pass@{}/pgbouncer", h.addr())).await.unwrap();
    let pools_row = || async {
        let rows = console.simple_query("SHOW POOLS").await.unwrap();
        let row = rows.iter().find_map(|m| match m {
            SimpleQueryMessage::Row(r) if r.get("database") == Some(APP_DB) => Some(r),
            _ => None,
        });
        let row = row.expect("app pool row");
        let get = |c: &str| row.get(c).unwrap().to_owned();
        (get("sv_being_canceled"), get("sv_active"), get("sv_idle"))
    };

    let mut client = Raw::login(h.addr(), TRUST_USER, TRUST_PASS, &[]).await.unwrap();
    client.send(&raw::query("select pg_sleep(30)")).await.unwrap();
    let sql = "select count(*) from pg_stat_activity where query = 'select pg_sleep(30)' and state = 'active'";
    let sleeping = || h.pg.psql(APP_DB, sql).is_ok_and(|o| o.trim() == "1");
    assert!(eventually(weir_e2e::WAIT_LIMIT, sleeping).await, "the pg_sleep(30) is running");

    h.relay.as_ref().unwrap().set_connect_delay(Duration::from_millis(1500));
    client.reset();
    // The state lasts the cancel's delayed connect (1.5 s): poll until then.
    let mut seen = None;
    let end = Instant::now() + weir_e2e::WAIT_LIMIT;
    while Instant::now() < end {
        let row = pools_row().await;
        if row.0 == "1" {
            seen = Some(row);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (_, active, _) = seen.expect("SHOW POOLS counted the server in sv_being_canceled while its cancel was delayed");
    assert_eq!(active, "0", "the client's server is no longer active");

    h.relay.as_ref().unwrap().set_connect_delay(Duration::ZERO);
    let back = || async {
        let row = pools_row().await;
        row.0 == "0" && row.2 == "1"
    };
    weir_e2e::wait_for("the canceled server to go back to the pool", back).await;
    assert!(eventually(weir_e2e::WAIT_LIMIT, || !sleeping()).await, "the query was canceled");
}
