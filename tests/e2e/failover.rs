//! A failover is a blip: weir in front of a primary and its streaming
//! standby (two real Postgres on one port at 127.0.0.2 and 127.0.0.3), the
//! standby listed first and `target_session_attrs = "read-write"`. The
//! standby is skipped; when the primary stops and the standby is promoted,
//! writers go on on the new primary and only what was in flight fails; the
//! old primary back as a standby takes no write; with every host down,
//! clients wait and go on once one is up; a transaction stuck on a primary
//! whose path went silent ends at the failover, not at a keepalive; a
//! server that answers 25006, or whose standby is promoted under it,
//! retires when released; and `migrate-config` carries PgBouncer's host
//! list. Bounds are generous:
//! they catch a hang, not a slow machine (`weir-bench failover` measures).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_e2e::pair::{server_addr, writer, PairHarness, Written};
use weir_e2e::{exclusive, sqlstate, wait_for, PgServer, WAIT_LIMIT};
use weir_metrics::HostRole;

const READ_WRITE: &str = "target_session_attrs = \"read-write\"";
const GENERAL: &str = "query_wait_timeout = \"40s\"\nserver_connect_timeout = \"2s\"";

/// Runs blocking server work (pg_ctl, psql) off the runtime.
async fn blocking<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> T {
    tokio::task::spawn_blocking(f).await.expect("blocking task")
}

async fn rows(server: &Arc<weir_testkit::PgPair>, first: bool) -> i64 {
    let pair = server.clone();
    blocking(move || PairHarness::ledger_rows(if first { &pair.first } else { &pair.second })).await
}

/// The rows of `acked` that are on `server` (one array parameter: the list
/// can be longer than a command line may be).
async fn on_server(pair: &Arc<weir_testkit::PgPair>, first: bool, acked: Vec<i64>) -> usize {
    let server: &PgServer = if first { &pair.first } else { &pair.second };
    let conninfo = format!(
        "host={} port={} user={} dbname={}",
        server.host(),
        server.port(),
        server.superuser(),
        weir_testkit::APP_DB
    );
    let (client, conn) =
        tokio_postgres::connect(&conninfo, tokio_postgres::NoTls).await.expect("connect to the server");
    tokio::spawn(conn);
    let row = client
        .query_one("select count(*) from ledger where id = any($1)", &[&acked])
        .await
        .expect("count acknowledged rows");
    usize::try_from(row.get::<_, i64>(0)).expect("a count")
}

/// Stops the primary (fast) and promotes the standby; returns when the
/// promote returned.
async fn fail_over(h: &PairHarness) -> Instant {
    let pair = h.pair.clone();
    blocking(move || pair.first.stop().expect("stop the primary")).await;
    let pair = h.pair.clone();
    blocking(move || pair.second.promote().expect("promote the standby")).await;
    Instant::now()
}

fn writers(h: &PairHarness, n: i32, stop: &Arc<AtomicBool>) -> Vec<tokio::task::JoinHandle<Written>> {
    (0..n).map(|i| writer(h.url(), i, stop.clone(), Duration::from_secs(60))).collect()
}

async fn finish(stop: &AtomicBool, writers: Vec<tokio::task::JoinHandle<Written>>) -> Vec<Written> {
    stop.store(true, Ordering::SeqCst);
    let mut out = Vec::new();
    for w in writers {
        out.push(w.await.expect("a writer"));
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_standby_listed_first_is_skipped() {
    exclusive(240, async {
        let h = PairHarness::start(GENERAL, READ_WRITE).await;
        let c = h.client().await;
        for _ in 0..3 {
            assert_eq!(server_addr(&c).await.unwrap(), h.pair.first.host(), "every query on the primary");
        }
        c.simple_query("insert into ledger(writer, n) values (0, 0)").await.expect("a write reaches the primary");
        h.until_role(&h.pair.second, HostRole::Standby).await;
        assert_eq!(h.role_of(&h.pair.first), Some(HostRole::Primary));
        let pool = h.weir.shared().pools.get(weir_testkit::APP_DB, weir_testkit::SCRAM_USER).unwrap();
        assert_eq!(
            pool.metrics.closed(weir_metrics::CloseReason::RoleMismatch),
            0,
            "the set knew the standby before a connect dialled it"
        );
        // The console and /metrics show each host's role.
        let console = h.console().await;
        let servers = console.simple_query("SHOW SERVERS").await.unwrap();
        let roles: Vec<(String, String)> = rows_of(&servers, &["addr", "host_role"]);
        assert!(
            !roles.is_empty() && roles.iter().all(|(a, r)| a == h.pair.first.host() && r == "primary"),
            "{roles:?}"
        );
        let dbs = console.simple_query("SHOW DATABASES").await.unwrap();
        let app: Vec<(String, String)> = rows_of(&dbs, &["target_session_attrs", "host_roles"]);
        let port = h.pair.first.port();
        let want = format!("127.0.0.3:{port} standby, 127.0.0.2:{port} primary");
        assert!(app.iter().any(|(t, r)| t == "read-write" && *r == want), "{app:?}");
        let text = weir_metrics::render_all();
        for line in [
            format!("weir_host_role{{database=\"app\",host=\"127.0.0.3:{port}\",role=\"standby\"}} 1"),
            format!("weir_host_role{{database=\"app\",host=\"127.0.0.2:{port}\",role=\"primary\"}} 1"),
        ] {
            assert!(text.lines().any(|l| l == line), "no {line} in\n{text}");
        }
    })
    .await;
}

/// Columns `names` of each row of a simple-query result.
fn rows_of(msgs: &[tokio_postgres::SimpleQueryMessage], names: &[&str; 2]) -> Vec<(String, String)> {
    msgs.iter()
        .filter_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => {
                Some((r.get(names[0]).unwrap_or_default().to_owned(), r.get(names[1]).unwrap_or_default().to_owned()))
            }
            _ => None,
        })
        .collect()
}

/// Checks what a failover may cost writers: no hang, no write on a
/// read-only server, an error only where a transaction was in flight (at
/// most one or two per writer: the insert and its connection), and every
/// acknowledged row on the new primary.
async fn check_writers(h: &PairHarness, written: &[Written], first_is_primary: bool) {
    let mut acked = Vec::new();
    for (i, w) in written.iter().enumerate() {
        println!("writer {i}: {} acked, errors {:?}, longest {:?}", w.acked.len(), w.errors, w.longest);
        assert!(!w.errors.iter().any(|e| e == "hang"), "writer {i} hung: {:?}", w.errors);
        assert!(!w.errors.iter().any(|e| e == "25006"), "writer {i} wrote to a read-only server: {:?}", w.errors);
        assert!(w.errors.len() <= 2, "writer {i}: errors beyond its transaction in flight: {:?}", w.errors);
        acked.extend(w.acked.iter().map(|(id, _)| *id));
    }
    let n = acked.len();
    assert!(n > 0);
    assert_eq!(on_server(&h.pair, first_is_primary, acked).await, n, "every acknowledged row is on the primary");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stop_and_promote_moves_the_writers_to_the_new_primary() {
    exclusive(300, async {
        let h = PairHarness::start(GENERAL, READ_WRITE).await;
        let stop = Arc::new(AtomicBool::new(false));
        let ws = writers(&h, 4, &stop);
        wait_for("rows on the primary", || async { rows(&h.pair, true).await >= 40 }).await;
        let promoted = fail_over(&h).await;
        wait_for("rows on the new primary", || async { rows(&h.pair, false).await >= 40 + 40 }).await;
        let written = finish(&stop, ws).await;
        check_writers(&h, &written, false).await;
        let first_after = written.iter().flat_map(|w| w.acked.iter()).map(|(_, t)| *t).filter(|t| *t > promoted).min();
        let first_after = first_after.expect("a write after the promote").duration_since(promoted);
        println!("first acknowledged write {first_after:?} after the promote returned");
        assert!(first_after < WAIT_LIMIT, "writes resumed after the promote: {first_after:?}");
        assert_eq!(h.role_of(&h.pair.second), Some(HostRole::Primary));
        assert_eq!(h.role_of(&h.pair.first), Some(HostRole::Unreachable));
        let m = h.hosts().metrics().clone();
        assert_eq!(m.failovers(), 1);
        assert_eq!(m.failover_durations().count, 1, "timed from the first failed connect");
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_old_primary_back_as_a_standby_takes_no_write() {
    exclusive(300, async {
        let h = PairHarness::start(GENERAL, READ_WRITE).await;
        let stop = Arc::new(AtomicBool::new(false));
        let ws = writers(&h, 3, &stop);
        wait_for("rows on the primary", || async { rows(&h.pair, true).await >= 30 }).await;
        fail_over(&h).await;
        wait_for("rows on the new primary", || async { rows(&h.pair, false).await >= 60 }).await;
        let before = finish(&stop, ws).await;
        check_writers(&h, &before, false).await;
        // The old primary comes back at its address, following the new one.
        let pair = h.pair.clone();
        blocking(move || pair.first.rewind_to_follow(&pair.second).expect("pg_rewind and start as a standby")).await;
        let stop = Arc::new(AtomicBool::new(false));
        let ws = writers(&h, 3, &stop);
        h.until_role(&h.pair.first, HostRole::Standby).await;
        // Every server opened from now on: RECONNECT closes the others.
        h.console().await.simple_query("RECONNECT app").await.expect("RECONNECT");
        let base = rows(&h.pair, false).await;
        wait_for("rows after the old primary came back", || async { rows(&h.pair, false).await >= base + 30 }).await;
        let after = finish(&stop, ws).await;
        for (i, w) in after.iter().enumerate() {
            assert!(w.errors.is_empty(), "writer {i} met an error with both hosts up: {:?}", w.errors);
        }
        check_writers(&h, &after, false).await;
        for _ in 0..4 {
            let c = h.client().await;
            assert_eq!(server_addr(&c).await.unwrap(), h.pair.second.host(), "only the new primary serves");
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_host_down_then_one_up_clients_wait_then_go_on() {
    exclusive(300, async {
        let h = PairHarness::start(GENERAL, READ_WRITE).await;
        let clients = vec![h.client().await, h.client().await, h.client().await];
        for c in &clients {
            c.simple_query("select 1").await.expect("served before the outage");
        }
        let pair = h.pair.clone();
        blocking(move || {
            pair.second.stop().expect("stop the standby");
            pair.first.stop().expect("stop the primary");
        })
        .await;
        let t0 = Instant::now();
        let waiting: Vec<_> = clients
            .into_iter()
            .enumerate()
            .map(|(i, c)| {
                tokio::spawn(async move {
                    let sql = format!("insert into ledger(writer, n) values ({i}, 1) returning id");
                    c.simple_query(&sql)
                        .await
                        .map(|_| Instant::now())
                        .map_err(|e| format!("{}: {e}", sqlstate(&e).unwrap_or_default()))
                })
            })
            .collect();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(waiting.iter().all(|w| !w.is_finished()), "clients wait while no host is up");
        wait_for("no host matches", || async { h.hosts().metrics().matching() == 0 }).await;
        // Postgres takes connections before pg_ctl's wait for it returns, so
        // the host counts as up from the moment it is started.
        let up = Instant::now();
        let pair = h.pair.clone();
        blocking(move || pair.first.start_again().expect("start the primary again")).await;
        for w in waiting {
            let done = w.await.unwrap().expect("served once a host is up, within the budget");
            assert!(done >= up && done.duration_since(t0) < Duration::from_secs(40), "{:?}", done.duration_since(t0));
        }
    })
    .await;
}

/// A primary whose path goes silent (a relay in front of it, frozen: TCP
/// stays up, so no keepalive ever fires) while a client's transaction
/// waits on it; the standby is promoted. The set finds the new primary and
/// cuts the servers still lent to the old one: the client gets its error at
/// the failover, long before server_check_silence (set to 2 minutes).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_transaction_on_a_silent_primary_ends_at_the_failover() {
    exclusive(300, async {
        let opts = weir_testkit::PgOptions { log_connections: false, ..Default::default() };
        let pair = Arc::new(blocking(move || weir_testkit::PgPair::start(opts)).await.expect("a pair"));
        let relay = weir_testkit::Relay::start(format!("{}:{}", pair.first.host(), pair.first.port()).parse().unwrap())
            .await
            .unwrap();
        let general = format!("{GENERAL}\nserver_check_silence = \"2m\"");
        let database = format!("{READ_WRITE}\nport = \"{},{}\"", pair.second.port(), relay.addr().port());
        let hosts = format!("{},127.0.0.1", pair.second.host());
        let h = PairHarness::start_with(pair, &hosts, &general, &database).await;
        let c = h.client().await;
        c.simple_query("begin; insert into ledger(writer, n) values (0, 1)").await.expect("a transaction begins");
        relay.freeze();
        let in_flight = tokio::spawn(async move {
            let r = c.simple_query("insert into ledger(writer, n) values (0, 2)").await;
            (Instant::now(), r.map(|_| ()).map_err(|e| sqlstate(&e).unwrap_or_else(|| e.to_string())))
        });
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert!(!in_flight.is_finished(), "the insert waits on the silent path");
        let promoted = fail_over(&h).await;
        let (ended, result) = tokio::time::timeout(Duration::from_secs(60), in_flight)
            .await
            .expect("the transaction ends at the failover, not at server_check_silence")
            .unwrap();
        println!("the in-flight insert ended {:?} after the promote: {result:?}", ended.duration_since(promoted));
        assert!(result.is_err(), "its server was cut");
        let c = h.client().await;
        assert_eq!(server_addr(&c).await.unwrap(), h.pair.second.host(), "new work goes to the new primary");
        drop(relay);
    })
    .await;
}

#[test]
fn migrate_config_carries_a_host_list() {
    use std::process::Command;
    let dir = std::env::temp_dir().join(format!("weir-migrate-hosts-{}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("userlist.txt"), "\"app\" \"secret\"\n").unwrap();
    std::fs::write(
        dir.join("pgbouncer.ini"),
        "[databases]\napp = host=127.0.0.3,127.0.0.2 port=6543 dbname=app load_balance_hosts=round-robin\n\n\
         [pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = 6432\nauth_type = md5\nauth_file = userlist.txt\n\
         pool_mode = transaction\nunix_socket_dir =\n",
    )
    .unwrap();
    let bin = weir_e2e::process::weir_bin();
    let out = Command::new(&bin).arg("migrate-config").arg(dir.join("pgbouncer.ini")).output().unwrap();
    assert!(out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let toml = String::from_utf8(out.stdout).unwrap();
    assert!(toml.contains("host = \"127.0.0.3,127.0.0.2\"") && toml.contains("port = 6543"), "{toml}");
    assert!(toml.contains("load_balance_hosts = \"round-robin\""), "{toml}");
    assert!(toml.contains("host lists: weir skips a host it cannot reach"), "the difference is named: {toml}");
    assert!(!stderr.contains("one host"), "{stderr}");
    assert!(stderr.contains("target_session_attrs = \"read-write\""), "the advice for writers: {stderr}");
    std::fs::write(dir.join("weir.toml"), &toml).unwrap();
    let check = Command::new(&bin).arg("check-config").arg(dir.join("weir.toml")).output().unwrap();
    let said = format!("{}{}", String::from_utf8_lossy(&check.stdout), String::from_utf8_lossy(&check.stderr));
    assert!(check.status.success(), "{said}");
    assert!(said.contains("databases.app: hosts 127.0.0.3:6543, 127.0.0.2:6543"), "{said}");
    assert!(said.contains("25006"), "check-config warns about writes on a standby: {said}");
    let cfg = weir::Config::from_toml(&toml, &dir).expect("the migrated config loads");
    let s = cfg.pool_settings("app").unwrap();
    assert_eq!(s.hosts.len(), 2);
    assert_eq!(s.load_balance_hosts, weir::config::LoadBalanceHosts::RoundRobin);
    let _ = std::fs::remove_dir_all(&dir);
}

/// A primary that starts refusing writes (default_transaction_read_only
/// turned on and reloaded): the write that meets it gets 25006, its server
/// retires when released, and the host's role is asked again; writes then
/// wait (no host matches) and go on once the primary accepts them again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_that_answers_25006_is_retired_and_asked_again() {
    exclusive(300, async {
        let opts = weir_testkit::PgOptions { log_connections: false, ..Default::default() };
        let pair = Arc::new(blocking(move || weir_testkit::PgPair::start(opts)).await.expect("a pair"));
        let hosts = format!("{},{}", pair.second.host(), pair.first.host());
        let database = format!("port = {}\n{READ_WRITE}", pair.first.port());
        let h = PairHarness::start_with(pair, &hosts, GENERAL, &database).await;
        let c = h.client().await;
        c.simple_query("insert into ledger(writer, n) values (0, 1)").await.expect("a write");
        let pair = h.pair.clone();
        blocking(move || {
            pair.first.psql("postgres", "alter system set default_transaction_read_only = on").expect("read-only");
            pair.first.psql("postgres", "select pg_reload_conf()").expect("reload")
        })
        .await;
        let pool = h.weir.shared().pools.get(weir_testkit::APP_DB, weir_testkit::SCRAM_USER).unwrap();
        let refused = async {
            loop {
                match c.simple_query("insert into ledger(writer, n) values (0, 2)").await {
                    Err(e) if sqlstate(&e).as_deref() == Some("25006") => return,
                    // The reload reaches the backend at its next command.
                    _ => tokio::time::sleep(Duration::from_millis(50)).await,
                }
            }
        };
        tokio::time::timeout(WAIT_LIMIT, refused).await.expect("the write meets the read-only primary");
        wait_for("its server retired", || async { pool.metrics.closed(weir_metrics::CloseReason::RoleChanged) >= 1 })
            .await;
        h.until_role(&h.pair.first, HostRole::ReadOnly).await;
        // A client that never saw the server report read-only (one that did
        // carries default_transaction_read_only = on as its own setting).
        let fresh = h.client().await;
        let waiting =
            tokio::spawn(async move { fresh.simple_query("insert into ledger(writer, n) values (0, 3)").await });
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert!(!waiting.is_finished(), "no host accepts writes: the write waits");
        let pair = h.pair.clone();
        blocking(move || {
            pair.first.psql("postgres", "alter system reset default_transaction_read_only").expect("writable again");
            pair.first.psql("postgres", "select pg_reload_conf()").expect("reload")
        })
        .await;
        let done = tokio::time::timeout(WAIT_LIMIT, waiting).await.expect("no hang").unwrap();
        done.expect("the write goes on once the primary accepts writes");
        assert_eq!(h.role_of(&h.pair.first), Some(HostRole::Primary));
    })
    .await;
}

/// A pooled server on a standby that is promoted under it reports the new
/// in_hot_standby at its next query: it retires when released, and the
/// next query runs on a new server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_whose_standby_is_promoted_retires_at_release() {
    exclusive(300, async {
        let opts = weir_testkit::PgOptions { log_connections: false, ..Default::default() };
        let pair = Arc::new(blocking(move || weir_testkit::PgPair::start(opts)).await.expect("a pair"));
        let (host, port) = (pair.second.host().to_owned(), pair.second.port());
        let h = PairHarness::start_with(pair, &host, GENERAL, &format!("port = {port}")).await;
        let c = h.client().await;
        let before = one(&c, "select pg_backend_pid()").await;
        assert_eq!(one(&c, "select pg_is_in_recovery()").await, "t");
        let pair = h.pair.clone();
        blocking(move || pair.second.promote().expect("promote")).await;
        assert_eq!(one(&c, "select pg_is_in_recovery()").await, "f", "the same server, now a primary");
        let pool = h.weir.shared().pools.get(weir_testkit::APP_DB, weir_testkit::SCRAM_USER).unwrap();
        wait_for("its server retired", || async { pool.metrics.closed(weir_metrics::CloseReason::RoleChanged) >= 1 })
            .await;
        assert_ne!(one(&c, "select pg_backend_pid()").await, before, "a new server");
        h.until_role(&h.pair.second, HostRole::Primary).await;
    })
    .await;
}

/// The first column of the first row.
async fn one(c: &tokio_postgres::Client, sql: &str) -> String {
    let rows = c.simple_query(sql).await.expect(sql);
    rows.into_iter()
        .find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap_or_default()
}
