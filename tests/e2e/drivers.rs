//! The driver matrix: every mainstream driver runs a conformance program
//! through weir in transaction mode against a real Postgres, 20 concurrent
//! connections over a pool of 3, with max_prepared_statements = 20 so the
//! per-server statement caches evict. Each program (tests/drivers/) checks
//! prepared queries reused across transactions, commit and rollback, an
//! error inside a transaction and recovery, a timeout or cancel through the
//! driver's own API, COPY where the driver has it, more distinct statements
//! than the cache holds, and NULL and binary parameters, and exits 0 only
//! when every result was as expected.
//!
//! A driver that is not installed fails its test, saying so: the matrix
//! never shrinks silently (scripts/install-deps.sh installs them all).

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use bytes::Bytes;
use futures_util::SinkExt;
use tokio::process::Command;
use tokio_postgres::NoTls;
use weir_e2e::{connect, harness, sqlstate, Harness, APP_DB, SCRAM_PASS, SCRAM_USER};

const CLIENTS: usize = 20;
const POOL_SIZE: u32 = 3;
/// How long one driver's program may take, build included.
const LIMIT: Duration = Duration::from_secs(180);

fn drivers_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("drivers")
}

fn scratch(name: &str) -> PathBuf {
    let d = Path::new(env!("CARGO_TARGET_TMPDIR")).join("drivers").join(name);
    std::fs::create_dir_all(&d).unwrap();
    d
}

/// A command with weir's address and credentials in its environment.
fn command(h: &Harness, program: &str) -> Command {
    let mut c = Command::new(program);
    let addr = h.addr();
    c.env("WEIR_URL", h.url(SCRAM_USER, SCRAM_PASS))
        .env("WEIR_HOST", addr.ip().to_string())
        .env("WEIR_PORT", addr.port().to_string())
        .env("WEIR_USER", SCRAM_USER)
        .env("WEIR_PASSWORD", SCRAM_PASS)
        .env("WEIR_DB", weir_e2e::APP_DB)
        .env("PGPASSWORD", SCRAM_PASS)
        .env("WEIR_CLIENTS", CLIENTS.to_string());
    c
}

/// Runs a program to completion within `LIMIT`; panics with its output
/// unless it exits 0. Returns its stdout.
async fn run(what: &str, mut cmd: Command) -> String {
    cmd.kill_on_drop(true).stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = cmd
        .spawn()
        .unwrap_or_else(|e| panic!("{what}: cannot start ({e}): the driver is missing; run scripts/install-deps.sh"));
    let out = tokio::time::timeout(LIMIT, child.wait_with_output())
        .await
        .unwrap_or_else(|_| panic!("{what}: did not finish within {LIMIT:?}"))
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{what} failed ({}):\n--- stdout\n{stdout}\n--- stderr\n{stderr}", out.status);
    println!("{what}: {}", stdout.lines().last().unwrap_or_default());
    stdout
}

/// What every run must leave behind: named statements went through weir's
/// cache, and weir never held more server connections than its pool.
fn assert_prepared_through_weir(h: &Harness) {
    let m = &h.pool_for(SCRAM_USER).metrics;
    assert!(m.client_parses() > 0, "the driver named no statement");
    assert!(m.server_parses() > 0, "weir prepared nothing on servers");
    assert!(h.server_pids(SCRAM_USER).len() <= POOL_SIZE as usize);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tokio_postgres() {
    // One driver at a time: the machine has two cores, and a JVM, a Go build
    // and 20 clients each are plenty for it.
    let _one = weir_e2e::serial().await;
    let h = harness(POOL_SIZE, "transaction", "md5", "max_prepared_statements = 20\n").await;
    let setup = h.client().await;
    setup
        .batch_execute("drop table if exists drv_tokio; create table drv_tokio (id int primary key, note text)")
        .await
        .unwrap();
    let url = h.url(SCRAM_USER, SCRAM_PASS);
    let direct_url = format!("postgres://postgres@127.0.0.1:{}/{APP_DB}", h.pg.port());
    let tasks: Vec<_> = (0..CLIENTS as i32)
        .map(|id| tokio::spawn(tokio_postgres_client([url.clone(), direct_url.clone()], id)))
        .collect();
    for (id, t) in tasks.into_iter().enumerate() {
        t.await.unwrap().unwrap_or_else(|e| panic!("client {id}: {e}"));
    }
    let total: i64 = setup.query_one("select count(*) from drv_tokio", &[]).await.unwrap().get(0);
    assert_eq!(total, CLIENTS as i64 * 11);
    assert_prepared_through_weir(&h);
}

/// One client through weir at `url`; `direct_url` is Postgres itself, to see
/// when a query runs.
async fn tokio_postgres_client([url, direct_url]: [String; 2], id: i32) -> Result<(), String> {
    let e = |e: tokio_postgres::Error| e.to_string();
    let mut c = connect(&url).await.map_err(e)?;
    let twice = c.prepare("select $1::int * 2").await.map_err(e)?;
    for k in 0..30i32 {
        let got: i32 = c.query_one(&twice, &[&k]).await.map_err(e)?.get(0);
        check(got == 2 * k, format!("reuse: {k}*2 gave {got}"))?;
    }
    for j in 0..40 {
        let s = c.prepare(&format!("select $1::int + {j}")).await.map_err(e)?;
        let got: i32 = c.query_one(&s, &[&id]).await.map_err(e)?.get(0);
        check(got == id + j, format!("distinct {j} gave {got}"))?;
    }
    for (row, commit) in [(id * 1000 + 1, true), (id * 1000 + 2, false)] {
        let tx = c.transaction().await.map_err(e)?;
        tx.execute("insert into drv_tokio (id, note) values ($1, $2)", &[&row, &"tx"]).await.map_err(e)?;
        if commit { tx.commit().await } else { tx.rollback().await }.map_err(e)?;
    }
    let n: i64 = c
        .query_one("select count(*) from drv_tokio where id = any($1)", &[&vec![id * 1000 + 1, id * 1000 + 2]])
        .await
        .map_err(e)?
        .get(0);
    check(n == 1, format!("commit/rollback left {n} rows"))?;
    {
        let tx = c.transaction().await.map_err(e)?;
        let err = tx.execute("select 1 / $1::int", &[&0i32]).await.unwrap_err();
        check(sqlstate(&err).as_deref() == Some("22012"), format!("division by zero gave {err}"))?;
        let err = tx.execute("select 1", &[]).await.unwrap_err();
        check(sqlstate(&err).as_deref() == Some("25P02"), format!("aborted transaction gave {err}"))?;
        tx.rollback().await.map_err(e)?;
    }
    let blob: Vec<u8> = vec![0, 1, 2, 0xff, 0, 0x7f];
    let row = c
        .query_one("select $1::bytea, $2::text, $3::int4", &[&blob, &None::<String>, &None::<i32>])
        .await
        .map_err(e)?;
    let (b, t, i): (Vec<u8>, Option<String>, Option<i32>) = (row.get(0), row.get(1), row.get(2));
    check(b == blob && t.is_none() && i.is_none(), format!("nulls/binary: {b:?} {t:?} {i:?}"))?;
    let sink = c.copy_in("copy drv_tokio (id, note) from stdin").await.map_err(e)?;
    futures_util::pin_mut!(sink);
    for r in 0..10 {
        sink.send(Bytes::from(format!("{}\t\\N\n", id * 1000 + 100 + r))).await.map_err(e)?;
    }
    let copied = sink.finish().await.map_err(e)?;
    check(copied == 10, format!("copy wrote {copied} rows"))?;
    if id % 5 == 0 {
        // The cancel goes once this client's sleep runs on the server (the
        // statement names the client, so not another's): a cancel that
        // lands while nothing runs cancels nothing, here as with Postgres.
        let sql = format!("select pg_sleep(5), {id} as client");
        let sleep = c.prepare(&sql).await.map_err(e)?;
        let token = c.cancel_token();
        let direct = connect(&direct_url).await.map_err(e)?;
        let cancel = tokio::spawn(async move {
            weir_e2e::until_running(&direct, &sql, 1).await;
            token.cancel_query(NoTls).await
        });
        let err = c.execute(&sleep, &[]).await.unwrap_err();
        check(sqlstate(&err).as_deref() == Some("57014"), format!("cancelled sleep gave {err:?}"))?;
        cancel.await.unwrap().map_err(e)?;
        let got: i32 = c.query_one(&twice, &[&21]).await.map_err(e)?.get(0);
        check(got == 42, format!("after cancel: {got}"))?;
    }
    Ok(())
}

fn check(ok: bool, what: String) -> Result<(), String> {
    if ok {
        Ok(())
    } else {
        Err(what)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psycopg3() {
    let _one = weir_e2e::serial().await;
    let h = harness(POOL_SIZE, "transaction", "md5", "max_prepared_statements = 20\n").await;
    let mut cmd = command(&h, "python3");
    cmd.arg(drivers_dir().join("python/psycopg_conformance.py"));
    run("psycopg 3", cmd).await;
    assert_prepared_through_weir(&h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn asyncpg() {
    let _one = weir_e2e::serial().await;
    let h = harness(POOL_SIZE, "transaction", "md5", "max_prepared_statements = 20\n").await;
    let mut cmd = command(&h, "python3");
    cmd.arg(drivers_dir().join("python/asyncpg_conformance.py"));
    run("asyncpg", cmd).await;
    assert_prepared_through_weir(&h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_postgres() {
    let _one = weir_e2e::serial().await;
    let h = harness(POOL_SIZE, "transaction", "md5", "max_prepared_statements = 20\n").await;
    let dir = drivers_dir().join("node");
    assert!(
        dir.join("node_modules/pg").is_dir(),
        "node-postgres is not installed in tests/drivers/node: run scripts/install-deps.sh"
    );
    let mut cmd = command(&h, "node");
    cmd.arg(dir.join("conformance.js")).current_dir(&dir);
    run("node-postgres", cmd).await;
    assert_prepared_through_weir(&h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgjdbc() {
    let _one = weir_e2e::serial().await;
    let jar = Path::new("/usr/share/java/postgresql.jar");
    assert!(jar.exists(), "pgjdbc is not installed ({}): run scripts/install-deps.sh", jar.display());
    let out = scratch("java");
    let mut javac = Command::new("javac");
    javac.args(["-d", out.to_str().unwrap(), "-cp", jar.to_str().unwrap()]);
    javac.arg(drivers_dir().join("java/Conformance.java"));
    run("javac", javac).await;
    let h = harness(POOL_SIZE, "transaction", "md5", "max_prepared_statements = 20\n").await;
    let mut cmd = command(&h, "java");
    cmd.args(["-cp", &format!("{}:{}", out.display(), jar.display()), "Conformance"]);
    run("pgjdbc", cmd).await;
    assert_prepared_through_weir(&h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgx_v4() {
    let _one = weir_e2e::serial().await;
    let gopath = Path::new("/usr/share/gocode/src/github.com/jackc/pgx/v4");
    assert!(gopath.is_dir(), "pgx v4 is not installed ({}): run scripts/install-deps.sh", gopath.display());
    let out = scratch("go");
    let bin = out.join("pgx-conformance");
    let mut build = Command::new("go");
    build
        .args(["build", "-o", bin.to_str().unwrap(), "."])
        .current_dir(drivers_dir().join("go/pgx"))
        .env("GO111MODULE", "off")
        .env("GOPATH", "/usr/share/gocode")
        .env("GOFLAGS", "")
        .env("GOCACHE", out.join("cache"));
    run("go build (pgx v4)", build).await;
    let h = harness(POOL_SIZE, "transaction", "md5", "max_prepared_statements = 20\n").await;
    let out = run("pgx v4", command(&h, bin.to_str().unwrap())).await;
    assert!(out.contains("pgx v4: 20 clients passed"), "the pgx program did not report its checks:\n{out}");
    assert_prepared_through_weir(&h);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn psql() {
    let _one = weir_e2e::serial().await;
    let h = harness(POOL_SIZE, "transaction", "md5", "max_prepared_statements = 20\n").await;
    h.client()
        .await
        .batch_execute(
            "drop table if exists drv_psql; drop sequence if exists drv_psql_seq;
             create sequence drv_psql_seq start 100000;
             create table drv_psql (id int primary key default nextval('drv_psql_seq'), note text)",
        )
        .await
        .unwrap();
    let script = drivers_dir().join("psql/conformance.sql");
    let runs: Vec<_> = (0..CLIENTS)
        .map(|id| {
            let mut cmd = command(&h, "psql");
            cmd.arg(h.url(SCRAM_USER, SCRAM_PASS))
                .args(["-X", "-q", "-v", "ON_ERROR_STOP=1", "-v", &format!("id={id}"), "-f"])
                .arg(&script);
            tokio::spawn(run_owned(format!("psql client {id}"), cmd))
        })
        .collect();
    for r in runs {
        r.await.unwrap();
    }
    let rows = h.psql("select count(*) from drv_psql");
    assert_eq!(rows.trim(), (CLIENTS * 11).to_string());
    // psql prepares with SQL PREPARE: each session was pinned to its server.
    assert!(h.pool_for(SCRAM_USER).metrics.pinned() >= CLIENTS as u64);
    assert!(h.server_pids(SCRAM_USER).len() <= POOL_SIZE as usize);
}

async fn run_owned(what: String, cmd: Command) -> String {
    run(&what, cmd).await
}

async fn pgbench(mode: &str) {
    let _one = weir_e2e::serial().await;
    let h = harness(POOL_SIZE, "transaction", "md5", "max_prepared_statements = 20\n").await;
    let addr = h.addr();
    let base = |h: &Harness| {
        let mut c = command(h, "pgbench");
        c.args(["-h", &addr.ip().to_string(), "-p", &addr.port().to_string(), "-U", SCRAM_USER]);
        c
    };
    let mut init = base(&h);
    init.args(["-i", "-s", "1", "-q", weir_e2e::APP_DB]);
    run("pgbench -i", init).await;
    let mut bench = base(&h);
    // One thread per client: pgbench prepares with a blocking PQprepare, so a
    // thread serving several clients would stall them all while one of them
    // waits for a server held by another in mid-transaction (with any pooler).
    let n = CLIENTS.to_string();
    bench.args(["-M", mode, "-c", &n, "-j", &n, "-T", "5", "-n", weir_e2e::APP_DB]);
    let out = run(&format!("pgbench -M {mode}"), bench).await;
    assert_eq!(pgbench_count(&out, "number of failed transactions"), 0, "pgbench -M {mode} reported failures:\n{out}");
    assert!(pgbench_count(&out, "number of transactions actually processed") > 0, "no transaction completed:\n{out}");
    if mode == "prepared" {
        assert_prepared_through_weir(&h);
    } else {
        // Unnamed statements are never tracked.
        assert_eq!(h.pool_for(SCRAM_USER).metrics.client_parses(), 0);
    }
}

/// The count on pgbench's `label: N` line (`-T` prints "number of
/// transactions actually processed: 1234" and "number of failed
/// transactions: 0 (0.000%)"); a missing line fails the test.
fn pgbench_count(out: &str, label: &str) -> u64 {
    let line = out
        .lines()
        .find_map(|l| l.strip_prefix(label)?.strip_prefix(": "))
        .unwrap_or_else(|| panic!("pgbench printed no \"{label}\" line:\n{out}"));
    let n = line.split(|c: char| !c.is_ascii_digit()).next().unwrap_or_default();
    n.parse().unwrap_or_else(|_| panic!("\"{label}: {line}\" has no count:\n{out}"))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_simple() {
    pgbench("simple").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_extended() {
    pgbench("extended").await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pgbench_prepared() {
    pgbench("prepared").await;
}
