//! Logins as PgBouncer decides, words and logs them, on PgBouncer's own
//! test.ini (`pgbouncer_corpus/13-pgbouncer-test-ini.ini`, migrated as a
//! user would): weir starts although two forced users (p6y, p6z) have only
//! a SCRAM verifier, and fails only those logins ("wrong password type");
//! `trust` admits only the auth_file's names; an unknown database and a
//! disabled one get PgBouncer's texts; user `pgbouncer` on the Unix socket,
//! from weir's own OS user, gets the console without admin_users; each
//! refused login is logged as `closing because: <reason>`. Also: `any`,
//! `plain`, the SASL text, auth_query's order and the auto-database line.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use weir_e2e::migrated::MigratedWeir;
use weir_e2e::process::{weir_bin, WeirProcess};
use weir_e2e::*;

fn test_ini() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/pgbouncer_corpus/13-pgbouncer-test-ini.ini")
}

/// A Postgres with what test.ini's p0 needs: role `bouncer`, database `p0`.
async fn pg_for_test_ini() -> PgServer {
    let pg = pg().await;
    pg.psql("postgres", "create role bouncer login password 'zzzz'").unwrap();
    pg.psql("postgres", "create database p0").unwrap();
    pg
}

/// The error of a login that must fail: (SQLSTATE, message).
async fn refused(url: &str) -> (String, String) {
    let e = connect(url).await.err().unwrap_or_else(|| panic!("{url}: the login succeeded"));
    let db = e.as_db_error().unwrap_or_else(|| panic!("{url}: no server error: {e}"));
    (db.code().code().to_owned(), db.message().to_owned())
}

/// `psql -h dir -p port -U user -d db -c sql` over the Unix socket, no password.
async fn psql_socket(dir: &str, port: u16, user: &str, db: &str, sql: &str) -> Result<String, String> {
    let out = tokio::process::Command::new("psql")
        .args(["-h", dir, "-p", &port.to_string(), "-U", user, "-d", db, "-XAtq", "-w", "-c", sql])
        .env_remove("PGHOST")
        .env_remove("PGPASSWORD")
        .kill_on_drop(true)
        .output();
    let out = tokio::time::timeout(Duration::from_secs(30), out).await.map_err(|_| "psql: no answer")?.unwrap();
    match out.status.success() {
        true => Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned()),
        false => Err(String::from_utf8_lossy(&out.stderr).into_owned()),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn weir_starts_on_pgbouncer_test_ini_and_fails_only_the_scram_only_logins() {
    bounded(120, async {
        let pg = pg_for_test_ini().await;
        let w = MigratedWeir::start(&pg, &test_ini(), |t| t).await;
        let check = Command::new(weir_bin()).arg("check-config").arg(w.dir.join("weir.toml")).output().unwrap();
        let said = String::from_utf8_lossy(&check.stderr);
        assert!(check.status.success(), "a warning, not a refusal: {said}");
        for db in ["p6y", "p6z"] {
            let warned = said.lines().any(|l| {
                l.contains("warning: ")
                    && l.contains(&format!("databases.{db}.user"))
                    && l.contains("wrong password type")
            });
            assert!(warned, "check-config names {db}:\n{said}");
        }
        assert!(w.logs().contains("databases.p6y.user: \"scramuser1\" has only a SCRAM verifier"), "{}", w.logs());

        let ok = connect(&w.url("bouncer", "zzzz", "p0")).await.expect("p0 serves");
        assert_eq!(ok.query_one("select current_user::text", &[]).await.unwrap().get::<_, String>(0), "bouncer");
        for db in ["p6y", "p6z"] {
            let (code, msg) = refused(&w.url("bouncer", "zzzz", db)).await;
            assert!(msg.contains("server login failed: wrong password type"), "{db}: {msg}");
            assert_eq!(code, "08P01", "{db}: PgBouncer's code");
        }
        ok.simple_query("select 1").await.expect("other databases unharmed");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn trust_texts_console_by_peer_uid_and_closing_lines() {
    bounded(120, async {
        let pg = pg_for_test_ini().await;
        let w = MigratedWeir::start(&pg, &test_ini(), |t| t).await;
        // trust: the auth_file decides who may connect.
        let (code, msg) = refused(&w.url("nosuchuser", "x", "p0")).await;
        assert_eq!((code.as_str(), msg.as_str()), ("28000", "\"trust\" authentication failed"));
        // A name the auth_file has, for a database weir does not serve.
        let (_, msg) = refused(&w.url("bouncer", "zzzz", "nosuchdb")).await;
        assert_eq!(msg, "no such database: nosuchdb");

        // The console for `pgbouncer` over the Unix socket: test.ini has no admin_users.
        let port = w.port;
        let version = psql_socket("/tmp", port, "pgbouncer", "pgbouncer", "SHOW VERSION").await;
        assert!(version.is_ok(), "same-uid pgbouncer on the socket gets the console: {version:?}");
        psql_socket("/tmp", port, "pgbouncer", "pgbouncer", "DISABLE p0").await.expect("DISABLE as pgbouncer");
        let (_, msg) = refused(&w.url("bouncer", "zzzz", "p0")).await;
        assert_eq!(msg, "database \"p0\" is disabled");
        psql_socket("/tmp", port, "pgbouncer", "pgbouncer", "ENABLE p0").await.expect("ENABLE");
        connect(&w.url("bouncer", "zzzz", "p0")).await.expect("enabled again");
        let tcp = refused(&w.url("pgbouncer", "fake", "pgbouncer")).await;
        assert_eq!(tcp.1, "\"trust\" authentication failed", "over TCP pgbouncer is an ordinary name");

        // Each refusal's log line, PgBouncer's (migrate-config keeps its log_disconnections).
        for reason in [
            "closing because: \"trust\" authentication failed (age=",
            "closing because: no such database: nosuchdb (age=",
            "closing because: database \"p0\" is disabled (age=",
        ] {
            let logged = eventually(weir_e2e::WAIT_LIMIT, || w.logs().contains(reason)).await;
            assert!(logged, "{reason}\n{}", w.logs());
        }
        assert!(w.logs().contains("pgbouncer access from unix socket"), "{}", w.logs());
    })
    .await;
}

/// `any` admits any name as the forced user, and refuses a database
/// without one as PgBouncer does; `plain` runs the cleartext exchange; a
/// SCRAM failure says "SASL authentication failed"; a wrong password for a
/// database weir does not serve fails on the password before auth_query or
/// the database is looked at (PgBouncer's order).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn any_plain_sasl_and_auth_query_order() {
    bounded(120, async {
        let pg = std::sync::Arc::new(pg().await);
        let url = |h: &Harness, user: &str, password: &str, db: &str| {
            format!("postgres://{user}:{password}@{}/{db}", h.addr())
        };
        let open = format!("user = \"{TRUST_USER}\"\n[databases.open]\nhost = \"127.0.0.1\"\nport = {}", pg.port());
        let h = Harness::start_with(pg.clone(), Opts { auth_type: "any", database: open, ..Opts::default() }).await;
        let c = connect(&url(&h, "nosuchuser", "whatever", APP_DB)).await.expect("any: any name");
        assert_eq!(c.query_one("select current_user::text", &[]).await.unwrap().get::<_, String>(0), TRUST_USER);
        let (code, msg) = refused(&url(&h, "nosuchuser", "x", "open")).await;
        assert_eq!((code.as_str(), msg.as_str()), ("08P01", "bouncer config error"), "no forced user");

        let h = Harness::start_with(pg.clone(), Opts { auth_type: "plain", ..Opts::default() }).await;
        let c = connect(&h.url(SCRAM_USER, SCRAM_PASS)).await.expect("plain: the right password");
        c.simple_query("select 1").await.unwrap();
        let (code, msg) = refused(&h.url(SCRAM_USER, "wrong")).await;
        assert_eq!((code.as_str(), msg.as_str()), ("28P01", "password authentication failed"));

        let general = "auth_user = \"postgres\"".to_owned();
        let h = Harness::start_with(pg.clone(), Opts { auth_type: "scram-sha-256", general, ..Opts::default() }).await;
        let (code, msg) = refused(&h.url(SCRAM_USER, "wrong")).await;
        assert_eq!((code.as_str(), msg.as_str()), ("28P01", "SASL authentication failed"));
        let (code, msg) = refused(&url(&h, "nosuchuser", "wrong", "nosuchdb")).await;
        assert_eq!((code.as_str(), msg.as_str()), ("28P01", "SASL authentication failed"), "no auth_query first");
    })
    .await;
}

/// A database the fallback serves is registered with PgBouncer's log
/// line, once per database.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registered_new_auto_database_is_logged() {
    bounded(120, async {
        let pg = pg().await;
        let fallback = format!("[databases.\"*\"]\nhost = \"127.0.0.1\"\nport = {}", pg.port());
        let w = WeirProcess::start(&pg, "", &fallback).await;
        let c = connect(&w.url_for(SCRAM_USER, SCRAM_PASS, "postgres")).await.expect("served by the fallback");
        c.simple_query("select 1").await.unwrap();
        let line = "registered new auto-database: postgres";
        assert!(eventually(weir_e2e::WAIT_LIMIT, || w.logs().contains(line)).await, "{}", w.logs());
        let again = connect(&w.url_for(MD5_USER, MD5_PASS, "postgres")).await.expect("a second pool");
        again.simple_query("select 1").await.unwrap();
        assert_eq!(w.logs().matches(line).count(), 1, "once per database: {}", w.logs());
        assert!(!w.logs().contains("registered new auto-database: app"), "a configured database is not one");
    })
    .await;
}
