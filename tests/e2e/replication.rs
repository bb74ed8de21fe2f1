//! Replication connections through weir, with Postgres's own tools and a
//! real subscriber: pg_basebackup and pg_receivewal (physical), a logical
//! subscription whose connection string names weir, pg_recvlogical with
//! test_decoding; SQL and the client's startup parameters on a logical
//! walsender; each client's server its own and gone with it (and the
//! client gone with its server); the pool's size counting them (an idle
//! server gives up its place, a full pool makes them wait their budget);
//! hba's `replication` keyword; a login Postgres refuses; KILL; and their
//! own lines in SHOW and the pool's gauge.

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;

use tokio::io::{AsyncBufReadExt, BufReader};
use weir_e2e::process::{psql_at, rows, ADMIN_PASS, ADMIN_USER};
use weir_e2e::raw::{Outcome, Raw};
use weir_e2e::{
    bounded, wait_for, Harness, Opts, PgOptions, PgServer, APP_DB, MD5_PASS, MD5_USER, SCRAM_PASS, SCRAM_USER,
    WAIT_LIMIT,
};

/// A Postgres ready for replication.
async fn replicating_pg() -> Arc<PgServer> {
    Arc::new(weir_e2e::pg_with(PgOptions { replication: true, ..PgOptions::default() }).await)
}

/// weir in front of `pg`, with `[databases.replication]` for the physical
/// tools (they name that database), scram_user allowed to replicate.
async fn weir_for_replication(pg: Arc<PgServer>, opts: Opts) -> Harness {
    let port = pg.port();
    let database = format!("{}\n[databases.replication]\nhost = \"127.0.0.1\"\nport = {port}\n", opts.database);
    let h = Harness::start_with(pg, Opts { database, ..opts }).await;
    h.psql(&format!("ALTER ROLE {SCRAM_USER} REPLICATION"));
    h
}

/// A Postgres tool from the server's own bin dir, talking to weir.
fn tool(pg: &PgServer, name: &str) -> tokio::process::Command {
    let mut cmd = tokio::process::Command::new(pg.bin_dir().join(name));
    for var in ["PGHOST", "PGPORT", "PGUSER", "PGDATABASE", "PGSERVICE", "PGOPTIONS"] {
        cmd.env_remove(var);
    }
    cmd.env("PGPASSWORD", SCRAM_PASS).env("PGCONNECT_TIMEOUT", "10").kill_on_drop(true);
    cmd
}

fn conninfo(h: &Harness, extra: &str) -> String {
    format!("host=127.0.0.1 port={} user={SCRAM_USER} {extra}", h.addr().port())
}

fn temp_dir(tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("weir-repl-{tag}-{}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Backends of `user` that are walsenders, as Postgres counts them.
fn walsenders(h: &Harness) -> usize {
    let n = h.psql(&format!(
        "select count(*) from pg_stat_activity where backend_type = 'walsender' and usename = '{SCRAM_USER}'"
    ));
    n.parse().unwrap()
}

async fn no_walsender_left(h: &Harness) {
    wait_for("every walsender gone", || async { walsenders(h) == 0 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_basebackup_and_pg_receivewal_through_weir() {
    bounded(300, async {
        let pg = replicating_pg().await;
        let h = weir_for_replication(pg.clone(), Opts::default()).await;
        let backup = temp_dir("basebackup");
        let out = tool(&pg, "pg_basebackup")
            .arg("-d")
            .arg(conninfo(&h, ""))
            .args(["--checkpoint=fast", "-X", "stream", "--no-sync", "-D"])
            .arg(backup.join("data"))
            .output()
            .await
            .unwrap();
        assert!(out.status.success(), "pg_basebackup: {}", String::from_utf8_lossy(&out.stderr));
        assert!(backup.join("data/PG_VERSION").is_file(), "a whole data directory");
        assert!(backup.join("data/pg_wal").read_dir().unwrap().count() > 0, "with its WAL, streamed beside it");
        no_walsender_left(&h).await;

        h.psql("select pg_create_physical_replication_slot('weir_receivewal')");
        let wal = temp_dir("receivewal");
        let mut receiver = tool(&pg, "pg_receivewal")
            .arg("-d")
            .arg(conninfo(&h, ""))
            .args(["--slot=weir_receivewal", "--no-loop", "-D"])
            .arg(&wal)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for("pg_receivewal's first segment", || async { wal.read_dir().unwrap().count() > 0 }).await;
        h.psql("select pg_switch_wal()");
        wait_for("a walsender streaming", || async { walsenders(&h) == 1 }).await;
        let pid = receiver.id().expect("running") as i32;
        assert!(kill(pid, "INT"));
        let status = tokio::time::timeout(WAIT_LIMIT, receiver.wait()).await.expect("pg_receivewal exits").unwrap();
        assert!(status.success(), "pg_receivewal stops cleanly on SIGINT: {status:?}");
        no_walsender_left(&h).await;
        let _ = std::fs::remove_dir_all(&backup);
        let _ = std::fs::remove_dir_all(&wal);
    })
    .await;
}

/// `kill -SIG pid` (no libc in the tests).
fn kill(pid: i32, sig: &str) -> bool {
    std::process::Command::new("kill").arg(format!("-{sig}")).arg(pid.to_string()).status().unwrap().success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_through_weir_replicates_rows_between_two_postgres() {
    bounded(300, async {
        let publisher = replicating_pg().await;
        let subscriber = replicating_pg().await;
        let h = weir_for_replication(publisher.clone(), Opts::default()).await;
        h.psql("create table items(id int primary key, note text)");
        h.psql(&format!("grant select on items to {SCRAM_USER}; insert into items values (1, 'before')"));
        h.psql("create publication weir_pub for table items");
        subscriber.psql(APP_DB, "create table items(id int primary key, note text)").unwrap();
        let conn = format!("{} dbname={APP_DB} password={SCRAM_PASS}", conninfo(&h, ""));
        subscriber
            .psql(APP_DB, &format!("create subscription weir_sub connection '{conn}' publication weir_pub"))
            .unwrap();
        let count = || subscriber.psql(APP_DB, "select count(*) from items").unwrap();
        wait_for("the initial copy", || async { count() == "1" }).await;
        h.psql("insert into items select g, 'streamed' from generate_series(2, 500) g");
        wait_for("500 rows streamed", || async { count() == "500" }).await;
        h.psql("update items set note = 'changed' where id = 7; delete from items where id = 8");
        let row = || subscriber.psql(APP_DB, "select note from items where id = 7").unwrap();
        wait_for("the update and the delete", || async { row() == "changed" && count() == "499" }).await;
        // The table's sync worker is done: one walsender left, the apply
        // worker's, on its own server.
        wait_for("one place", || async { h.pool_for(SCRAM_USER).snapshot().replication == 1 }).await;
        subscriber.psql(APP_DB, "drop subscription weir_sub").unwrap();
        no_walsender_left(&h).await;
        wait_for("its place given back", || async { h.pool_for(SCRAM_USER).snapshot().replication == 0 }).await;
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pg_recvlogical_with_test_decoding() {
    bounded(240, async {
        let pg = replicating_pg().await;
        let h = weir_for_replication(pg.clone(), Opts::default()).await;
        h.psql("create table decoded(a int)");
        h.psql("select pg_create_logical_replication_slot('weir_decoding', 'test_decoding')");
        let mut recv = tool(&pg, "pg_recvlogical")
            .arg("-d")
            .arg(conninfo(&h, &format!("dbname={APP_DB}")))
            .args(["--slot=weir_decoding", "--start", "--no-loop", "-f", "-"])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        wait_for("pg_recvlogical streaming", || async { walsenders(&h) == 1 }).await;
        h.psql("insert into decoded values (1)");
        let mut lines = BufReader::new(recv.stdout.take().unwrap()).lines();
        let mut got = Vec::new();
        for _ in 0..3 {
            let line = tokio::time::timeout(WAIT_LIMIT, lines.next_line()).await.expect("a decoded line");
            got.push(line.unwrap().expect("pg_recvlogical still running"));
        }
        assert!(got[0].starts_with("BEGIN "), "{got:?}");
        assert_eq!(got[1], "table public.decoded: INSERT: a[integer]:1");
        assert!(got[2].starts_with("COMMIT "), "{got:?}");
        recv.kill().await.unwrap();
        no_walsender_left(&h).await;
    })
    .await;
}

/// `psql -c sql` through weir with a conninfo of our own.
async fn psql_conninfo(h: &Harness, conninfo: &str, sql: &str) -> Result<String, String> {
    psql_at(h.addr().port(), SCRAM_USER, SCRAM_PASS, conninfo, sql).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sql_and_startup_parameters_on_walsenders() {
    bounded(240, async {
        let pg = replicating_pg().await;
        let h = weir_for_replication(pg, Opts::default()).await;
        let logical =
            format!("dbname={APP_DB} replication=database application_name=abc options='-c enable_seqscan=off'");
        assert!(psql_conninfo(&h, &logical, "SHOW enable_seqscan").await.unwrap().contains("off"), "options, whole");
        assert!(psql_conninfo(&h, &logical, "SHOW application_name").await.unwrap().contains("abc"));
        let system = psql_conninfo(&h, &logical, "IDENTIFY_SYSTEM").await.unwrap();
        assert!(system.contains("systemid") && system.contains(APP_DB), "{system}");
        assert!(psql_conninfo(&h, &logical, "select 40 + 2").await.unwrap().contains("42"));

        let physical = format!("dbname={APP_DB} replication=yes application_name=phys");
        let e = psql_conninfo(&h, &physical, "select 1").await.unwrap_err();
        assert!(e.contains("cannot execute SQL commands in WAL sender for physical replication"), "{e}");
        assert!(psql_conninfo(&h, &physical, "SHOW application_name").await.unwrap().contains("phys"));
        assert!(psql_conninfo(&h, &physical, "IDENTIFY_SYSTEM").await.unwrap().contains("xlogpos"));
        // An ordinary client of the same pool is served as ever; no
        // replication client left a server behind.
        h.client().await.simple_query("select 1").await.expect("an ordinary client of the same pool");
        no_walsender_left(&h).await;
        let s = h.pool_for(SCRAM_USER).snapshot();
        assert_eq!((s.replication, s.active), (0, 0), "{s:?}");
    })
    .await;
}

/// A raw replication client of `app` as scram_user, and its backend's pid.
async fn raw_walsender(h: &Harness, kind: &str) -> (Raw, i32) {
    let mut raw = Raw::login(h.addr(), SCRAM_USER, SCRAM_PASS, &[("replication", kind)]).await.unwrap();
    let pid: i32 = if kind == "database" {
        raw.query_one("select pg_backend_pid()").await.parse().unwrap()
    } else {
        let q = format!(
            "select pid from pg_stat_activity where backend_type = 'walsender' and usename = '{SCRAM_USER}' \
             order by backend_start desc limit 1"
        );
        wait_for("the physical walsender", || async { !h.psql(&q).is_empty() }).await;
        h.psql(&q).parse().unwrap()
    };
    (raw, pid)
}

fn alive(h: &Harness, pid: i32) -> bool {
    h.psql(&format!("select count(*) from pg_stat_activity where pid = {pid}")) == "1"
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_client_and_its_server_end_together() {
    bounded(240, async {
        let pg = replicating_pg().await;
        let h = weir_for_replication(pg, Opts { relay: true, ..Opts::default() }).await;
        // The client leaves with a reset: its server goes at once.
        let (raw, pid) = raw_walsender(&h, "database").await;
        assert!(alive(&h, pid));
        raw.reset();
        wait_for("the walsender of the client that left", || async { !alive(&h, pid) }).await;

        // Postgres ends the walsender: its FATAL reaches the client, then
        // the close, at once.
        let (mut raw, pid) = raw_walsender(&h, "true").await;
        h.psql(&format!("select pg_terminate_backend({pid})"));
        match raw.outcome().await {
            Outcome::Fatal(code, _) => assert_eq!(code, "57P01", "Postgres's own words"),
            Outcome::Closed => panic!("the server's FATAL was lost"),
        }

        // The path to Postgres breaks with nothing said: weir says it.
        let (mut raw, _) = raw_walsender(&h, "database").await;
        h.relay.as_ref().unwrap().reset_all();
        assert_eq!(raw.outcome().await.code(), "08006");
        wait_for("every place given back", || async { h.pool_for(SCRAM_USER).snapshot().replication == 0 }).await;
        let closed = h.pool_for(SCRAM_USER).metrics.closed(weir_metrics::CloseReason::ReplicationEnded);
        assert_eq!(closed, 1, "the first one's server closed with its client");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_clients_count_under_pool_size() {
    bounded(240, async {
        let pg = replicating_pg().await;
        let general = "query_wait_timeout = \"3s\"".to_owned();
        let h = weir_for_replication(pg, Opts { pool_size: 2, general, ..Opts::default() }).await;
        // Two idle servers fill the pool.
        let (a, b) = (h.client().await, h.client().await);
        let (ra, rb) = tokio::join!(a.simple_query("select pg_sleep(0.2)"), b.simple_query("select pg_sleep(0.2)"));
        ra.unwrap();
        rb.unwrap();
        let pool = h.pool_for(SCRAM_USER);
        assert_eq!(pool.snapshot().idle, 2);
        // Each replication client takes an idle server's place.
        let (first, _) = raw_walsender(&h, "database").await;
        let (second, _) = raw_walsender(&h, "database").await;
        let s = pool.snapshot();
        assert_eq!((s.idle, s.replication), (0, 2), "{s:?}");
        assert_eq!(pool.metrics.closed(weir_metrics::CloseReason::Evicted), 2);
        // A third waits for a place: it gets the first's when that leaves.
        let third = tokio::spawn({
            let addr = h.addr();
            async move { Raw::login(addr, SCRAM_USER, SCRAM_PASS, &[("replication", "database")]).await }
        });
        wait_for("the third waiting", || async { pool.snapshot().waiting == 1 }).await;
        first.terminate().await;
        let mut third = third.await.unwrap().expect("the third logs in once a place is free");
        assert_eq!(third.query_one("select 'in'").await, "in");
        // A fourth finds no place within its budget: 53300.
        let fourth = Raw::login(h.addr(), SCRAM_USER, SCRAM_PASS, &[("replication", "database")]).await;
        let e = fourth.err().expect("no place within query_wait_timeout");
        assert!(e.contains("53300"), "{e}");
        // An ordinary client waits its budget the same way: the places are taken.
        let e = h.client().await.simple_query("select 1").await.unwrap_err();
        assert_eq!(weir_e2e::sqlstate(&e).as_deref(), Some("53300"));
        drop((second, third));
        wait_for("the places given back", || async { pool.snapshot().replication == 0 }).await;
        h.client().await.simple_query("select 1").await.expect("the pool serves again");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hba_replication_lines_and_a_login_postgres_refuses() {
    bounded(240, async {
        let pg = replicating_pg().await;
        let dir = temp_dir("hba");
        let hba = dir.join("hba.conf");
        std::fs::write(
            &hba,
            "host replication scram_user 127.0.0.1/32 md5\n\
             host app all 127.0.0.1/32 md5\n\
             host weir admin 127.0.0.1/32 md5\n",
        )
        .unwrap();
        let general = format!("auth_hba_file = \"{}\"", hba.display());
        let h = weir_for_replication(pg, Opts { auth_type: "hba", general, ..Opts::default() }).await;
        // Physical: only the `replication` lines.
        let (mut ok, _) = raw_walsender(&h, "true").await;
        assert!(ok.query("IDENTIFY_SYSTEM").await.unwrap().error.is_none());
        let e = Raw::login(h.addr(), MD5_USER, MD5_PASS, &[("replication", "true")]).await.err().unwrap();
        assert!(e.contains("no pg_hba.conf entry for replication connection"), "{e}");
        // Logical: by its database. md5_user may log in to weir, but
        // Postgres refuses it a walsender: PgBouncer's "login failed",
        // Postgres's reason in DETAIL, and ordinary clients unharmed.
        let logical = format!("dbname={APP_DB} replication=database");
        let e = psql_at(h.addr().port(), MD5_USER, MD5_PASS, &logical, "select 1").await.unwrap_err();
        assert!(e.contains("FATAL:  login failed"), "{e}");
        assert!(e.contains("DETAIL:") && e.to_lowercase().replace(' ', "").contains("walsender"), "{e}");
        let ordinary = psql_at(h.addr().port(), MD5_USER, MD5_PASS, APP_DB, "select 'fine'").await.unwrap();
        assert!(ordinary.contains("fine"));
        ok.terminate().await;
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn show_and_the_gauge_count_them_apart_and_kill_ends_them() {
    bounded(240, async {
        let pg = replicating_pg().await;
        let h = weir_for_replication(pg, Opts::default()).await;
        let (mut raw, pid) = raw_walsender(&h, "database").await;
        let admin = |sql: &'static str| psql_at(h.addr().port(), ADMIN_USER, ADMIN_PASS, "weir", sql);
        let clients = rows(&admin("SHOW CLIENTS").await.unwrap());
        let mine: Vec<_> = clients.iter().filter(|r| r["replication"] == "logical").collect();
        assert_eq!(mine.len(), 1, "{clients:?}");
        let servers = rows(&admin("SHOW SERVERS").await.unwrap());
        let server = servers.iter().find(|r| r["remote_pid"] == pid.to_string()).expect("its server listed");
        assert_eq!((server["replication"].as_str(), server["state"].as_str()), ("logical", "active"));
        let pools = rows(&admin("SHOW POOLS").await.unwrap());
        let row = pools.iter().find(|r| r["database"] == APP_DB && r["user"] == SCRAM_USER).unwrap();
        assert_eq!((row["sv_replication"].as_str(), row["sv_active"].as_str()), ("1", "1"), "{row:?}");
        let pool = h.pool_for(SCRAM_USER);
        wait_for("the replication gauge", || async {
            pool.metrics.servers(weir_metrics::ServerState::Replication) == 1
        })
        .await;
        assert_eq!(pool.metrics.servers(weir_metrics::ServerState::Active), 0, "not lent: apart");
        admin("KILL app").await.unwrap();
        match raw.outcome().await {
            Outcome::Fatal(code, message) => assert_eq!((code.as_str(), message.contains("KILL")), ("57P01", true)),
            Outcome::Closed => panic!("no FATAL after KILL"),
        }
        wait_for("its walsender gone", || async { !alive(&h, pid) }).await;
        admin("RESUME app").await.unwrap();
        wait_for("the gauge back to 0", || async { pool.metrics.servers(weir_metrics::ServerState::Replication) == 0 })
            .await;
    })
    .await;
}
