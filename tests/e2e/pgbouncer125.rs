//! PgBouncer 1.25's settings and console commands, against a real Postgres:
//! client limits per database and user, per-user timeouts, transaction_timeout,
//! query_wait_notify, KILL_CLIENT and KILL without a name, SHUTDOWN
//! WAIT_FOR_CLIENTS and WAIT_FOR_SERVERS, a database's own auth_dbname, the
//! cached login error a SET of server TLS forgets, and the metrics endpoint
//! a config without `[metrics]` serves.

use std::sync::Arc;
use std::time::Duration;

use weir_e2e::console::{connect_keeping_notices, console, row_where, show};
use weir_e2e::process::{http_get, WeirProcess, ADMIN_PASS, ADMIN_USER};
use weir_e2e::*;

/// The error a login or query got: (SQLSTATE, message).
fn refusal(e: &tokio_postgres::Error) -> (String, String) {
    let db = e.as_db_error().unwrap_or_else(|| panic!("an error from weir expected: {e:?}"));
    (db.code().code().to_owned(), db.message().to_owned())
}

async fn wait_closed(c: &tokio_postgres::Client, what: &str) {
    wait_for(what, || async { c.is_closed() }).await;
}

#[tokio::test]
async fn client_limits_per_database_and_per_user() {
    let database = format!("max_db_client_connections = 2\n[users.{MD5_USER}]\nmax_user_client_connections = 1\n");
    let h = Harness::start(Opts { database, ..Opts::default() }).await;
    let admin = console(&h).await;
    let a = h.client().await;
    let b = h.client().await;
    let e = connect(&h.url(SCRAM_USER, SCRAM_PASS)).await.expect_err("a third client of app is refused");
    let (code, message) = refusal(&e);
    assert_eq!(code, "53300");
    assert!(message.contains("client connections exceeded (max_db_client_connections)"), "{message}");
    let dbs = show(&admin, "SHOW DATABASES").await.unwrap();
    let app = row_where(&dbs, "name", APP_DB);
    assert_eq!((app["max_client_connections"].as_str(), app["current_client_connections"].as_str()), ("2", "2"));
    let console_row = row_where(&dbs, "name", "pgbouncer");
    assert_eq!(console_row["current_client_connections"], "1", "the console's own client");

    drop(b);
    wait_for("the closed client to leave the count", || async {
        let dbs = show(&admin, "SHOW DATABASES").await.unwrap();
        row_where(&dbs, "name", APP_DB)["current_client_connections"] == "1"
    })
    .await;
    let b = h.client().await;
    drop((a, b));
    wait_for("app's clients to leave the count", || async {
        let dbs = show(&admin, "SHOW DATABASES").await.unwrap();
        row_where(&dbs, "name", APP_DB)["current_client_connections"] == "0"
    })
    .await;

    let held = connect(&h.url(MD5_USER, MD5_PASS)).await.expect("md5_user's one client");
    let e = connect(&h.url(MD5_USER, MD5_PASS)).await.expect_err("a second md5_user client is refused");
    let (code, message) = refusal(&e);
    assert_eq!(code, "53300");
    assert!(message.contains("max_user_client_connections"), "{message}");
    let users = show(&admin, "SHOW USERS").await.unwrap();
    let md5 = row_where(&users, "name", MD5_USER);
    assert_eq!((md5["max_user_client_connections"].as_str(), md5["current_client_connections"].as_str()), ("1", "1"));
    held.simple_query("select 1").await.expect("the admitted client works");
}

#[tokio::test]
async fn per_user_timeouts_override_the_global_ones() {
    let general = "idle_transaction_timeout = \"60s\"\n".to_owned();
    let database = format!(
        "[users.{SCRAM_USER}]\nidle_transaction_timeout = \"1s\"\n[users.{MD5_USER}]\nquery_timeout = \"1s\"\n"
    );
    let h = Harness::start(Opts { general, database, ..Opts::default() }).await;
    let scram = h.client().await;
    let md5 = connect(&h.url(MD5_USER, MD5_PASS)).await.unwrap();
    md5.batch_execute("begin; select 1").await.unwrap();
    scram.batch_execute("begin; select 1").await.unwrap();
    wait_closed(&scram, "scram_user's idle transaction to be ended by its own idle_transaction_timeout").await;
    md5.batch_execute("select 2; commit").await.expect("md5_user has the global 60s");

    let e = md5.simple_query("select pg_sleep(60)").await.expect_err("md5_user's query_timeout cancels it");
    assert_eq!(refusal(&e).0, "57014");
    let other = h.client().await;
    other.simple_query("select pg_sleep(1.5)").await.expect("scram_user has no query_timeout");
}

#[tokio::test]
async fn transaction_timeout_ends_a_transaction_and_keeps_its_server() {
    let general = "transaction_timeout = \"1s\"\n".to_owned();
    let h = Harness::start(Opts { general, pool_size: 1, ..Opts::default() }).await;
    let c = h.client().await;
    c.batch_execute("begin").await.unwrap();
    let e = c.simple_query("select pg_sleep(60)").await.expect_err("the transaction outlives transaction_timeout");
    let (code, message) = refusal(&e);
    assert_eq!(code, "08P01");
    assert!(message.contains("transaction timeout"), "{message}");
    wait_closed(&c, "the client to be closed").await;
    // The one server was rolled back and kept: the next client gets it.
    let next = h.client().await;
    next.simple_query("select 1").await.expect("the pool's server serves the next client");
    assert_eq!(h.pool().snapshot().recovering, 0);
}

#[tokio::test]
async fn query_wait_notify_tells_a_queued_client() {
    let general = "query_wait_notify = \"1s\"\n".to_owned();
    let h = Harness::start(Opts { general, pool_size: 1, ..Opts::default() }).await;
    let holder = h.client().await;
    holder.batch_execute("begin; select 1").await.unwrap();
    let (queued, notices) = connect_keeping_notices(&h.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    let waiting = tokio::spawn(async move { queued.simple_query("select 1").await.map(|_| ()) });
    wait_for("the queued client's NOTICE", || async { !notices.lock().unwrap().is_empty() }).await;
    assert_eq!(
        notices.lock().unwrap().as_slice(),
        ["No server connection available in postgres backend, client being queued"]
    );
    holder.batch_execute("commit").await.unwrap();
    waiting.await.unwrap().expect("the queued query runs once the server is free");
}

#[tokio::test]
async fn kill_client_by_id_and_kill_without_a_name() {
    let h = Harness::start(Opts::default()).await;
    let admin = console(&h).await;
    let victim = connect(&format!("{}?application_name=victim", h.url(SCRAM_USER, SCRAM_PASS))).await.unwrap();
    let bystander = h.client().await;
    victim.simple_query("select 1").await.unwrap();
    let clients = show(&admin, "SHOW CLIENTS").await.unwrap();
    let id = row_where(&clients, "application_name", "victim")["id"].clone();
    let servers = show(&admin, "SHOW SERVERS").await.unwrap();
    assert!(servers.iter().all(|s| s["id"].parse::<u64>().is_ok()), "servers have ids too: {servers:?}");
    assert!(servers.iter().all(|s| s["id"] != id), "one sequence for clients and servers");

    show(&admin, &format!("KILL_CLIENT {id}")).await.expect("KILL_CLIENT");
    wait_closed(&victim, "the killed client to be closed").await;
    bystander.simple_query("select 1").await.expect("the other client stays");
    for (arg, words) in [("999999999", "client not found"), ("abc", "invalid client pointer supplied")] {
        let e = show(&admin, &format!("KILL_CLIENT {arg}")).await.expect_err("refused");
        assert_eq!(refusal(&e), ("08P01".to_owned(), words.to_owned()));
    }

    show(&admin, "KILL").await.expect("KILL without a name");
    wait_closed(&bystander, "every pooled client to be closed").await;
    show(&admin, "SHOW VERSION").await.expect("the console itself stays");
    show(&admin, "RESUME").await.expect("RESUME after KILL");
    h.client().await.simple_query("select 1").await.expect("new clients after RESUME");
}

/// A console client over TCP of a weir process, opened before a SHUTDOWN
/// closes TCP.
async fn process_console(w: &WeirProcess) -> tokio_postgres::Client {
    connect(&w.url_for(ADMIN_USER, ADMIN_PASS, "weir")).await.expect("console login")
}

#[tokio::test]
async fn shutdown_wait_for_clients_stops_when_the_last_client_leaves() {
    let pg = Arc::new(pg().await);
    let mut w = WeirProcess::start(&pg, "", "").await;
    let admin = process_console(&w).await;
    let c = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    show(&admin, "SHUTDOWN WAIT_FOR_CLIENTS").await.expect("SHUTDOWN WAIT_FOR_CLIENTS");
    wait_for("TCP to stop accepting", || async { connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.is_err() }).await;
    c.simple_query("select 1").await.expect("a client keeps working");
    let e = show(&admin, "RESUME").await.expect_err("no RESUME during a shutdown");
    assert_eq!(refusal(&e), ("08P01".to_owned(), "pooler is shutting down".to_owned()));
    assert!(w.wait_exit(Duration::from_millis(300)).await.is_none(), "weir waits for its clients");
    drop((c, admin));
    assert!(w.wait_exit(WAIT_LIMIT).await.is_some(), "weir stops once no client is left:\n{}", w.logs());
}

#[tokio::test]
async fn shutdown_wait_for_servers_lets_a_transaction_finish_and_ends_new_ones() {
    let pg = Arc::new(pg().await);
    let mut w = WeirProcess::start(&pg, "", "").await;
    let admin = process_console(&w).await;
    let in_tx = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    let idle = connect(&w.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
    in_tx.batch_execute("begin; select 1").await.unwrap();
    show(&admin, "SHUTDOWN WAIT_FOR_SERVERS").await.expect("SHUTDOWN WAIT_FOR_SERVERS");
    in_tx.simple_query("select 2").await.expect("the open transaction goes on");
    let e = idle.simple_query("select 1").await.expect_err("no new transaction");
    assert_eq!(refusal(&e), ("57P01".to_owned(), "server shutting down".to_owned()));
    in_tx.batch_execute("commit").await.expect("the transaction ends");
    assert!(w.wait_exit(WAIT_LIMIT).await.is_some(), "weir stops once no server is in use:\n{}", w.logs());
}

/// A superuser auth_query runs as, in the auth_file.
const AUTH_USER: &str = "weir_auth";
const AUTH_PASS: &str = "weir_auth_pass";

#[tokio::test]
async fn a_database_own_auth_dbname_is_where_auth_query_runs() {
    let pg = Arc::new(pg().await);
    let database = format!(
        "auth_user = \"{AUTH_USER}\"\nauth_dbname = \"authdb\"\n[databases.authdb]\nhost = \"127.0.0.1\"\nport = {}\ndbname = \"{APP_DB}\"\n",
        pg.port()
    );
    let h = Harness::start_with(pg, Opts { database, ..Opts::default() }).await;
    h.psql(&format!("create role {AUTH_USER} superuser login password '{AUTH_PASS}'"));
    h.psql("create role only_in_pg login password 'pg_pass'");
    let users = format!("\"{AUTH_USER}\" \"{AUTH_PASS}\"\n");
    h.weir().shared().users.store(Arc::new(weir::auth::UserList::parse(&users).unwrap()));
    let c = connect(&h.url("only_in_pg", "pg_pass")).await.expect("a user auth_query finds");
    c.simple_query("select 1").await.unwrap();
    assert!(h.weir().shared().pools.get("authdb", AUTH_USER).is_some(), "auth_query ran in authdb");
    assert!(h.weir().shared().pools.get(APP_DB, AUTH_USER).is_none(), "not in the client's database");
}

#[tokio::test]
async fn a_set_of_server_tls_forgets_the_cached_login_error() {
    let h = Harness::start(Opts::default()).await;
    let admin = console(&h).await;
    show(&admin, "SET server_login_retry = '10m'").await.expect("SET server_login_retry");
    // Postgres refuses the pool's login: the error is cached for 10 minutes.
    h.psql(&format!("alter role {SCRAM_USER} nologin"));
    assert!(connect(&h.url(SCRAM_USER, SCRAM_PASS)).await.is_err(), "Postgres refuses the login");
    h.psql(&format!("alter role {SCRAM_USER} login"));
    let e = connect(&h.url(SCRAM_USER, SCRAM_PASS)).await.expect_err("the cached error, at once");
    assert!(refusal(&e).1.contains("cached error"), "{e:?}");
    // A change of how servers are reached (Postgres here has no TLS: prefer
    // logs in without it) forgets the cached error, as PgBouncer does.
    show(&admin, "SET server_tls_sslmode = prefer").await.expect("SET server_tls_sslmode");
    let c = connect(&h.url(SCRAM_USER, SCRAM_PASS)).await.expect("a login with the new setting at once");
    c.simple_query("select 1").await.unwrap();
}

#[tokio::test]
async fn metrics_are_served_without_a_metrics_section_and_can_be_turned_off() {
    let h = Harness::start(Opts::default()).await;
    let addr = h.weir().metrics_addr().expect("an endpoint by default");
    assert_eq!(addr.ip().to_string(), "127.0.0.1");
    for path in ["/metrics", "/readyz", "/healthz"] {
        let (status, _, _) = http_get(addr.port(), path);
        assert_eq!(status, 200, "{path}");
    }
    let off = Harness::start(Opts { database: "\n[metrics]\nenabled = false\n".into(), ..Opts::default() }).await;
    assert_eq!(off.weir().metrics_addr(), None);
}
