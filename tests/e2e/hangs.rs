//! No client ever hangs: waits that only a timeout, a cancel or the client's
//! own departure can end, each driven to its end against a real Postgres
//! (behind the fault relay where a server must fall silent). The bounds here
//! say "does not hang": generous, so a loaded machine only makes a test
//! slower. docs/architecture.md ("What bounds every wait") lists each wait
//! and what ends it.

use std::time::{Duration, Instant};

use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio_postgres::{Client, NoTls};
use weir_e2e::liveness::{describe, one, pid, running_like};
use weir_e2e::raw::Raw;
use weir_e2e::*;
use weir_metrics::CloseReason;

/// How long any one wait in these tests may take before it counts as a hang.
const HANG: Duration = Duration::from_secs(60);

/// A console connection as the harness's admin user.
async fn console(h: &Harness) -> Client {
    connect(&format!("postgres://admin:admin_pass@{}/weir", h.addr())).await.expect("console login")
}

/// `f`, or a panic naming `what` if it takes longer than `HANG`.
async fn within<T>(what: &str, f: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(HANG, f).await.unwrap_or_else(|_| panic!("{what}: still waiting after {HANG:?}"))
}

/// A client's settings are applied on the server it is lent before its
/// query runs; a server that falls silent then (a frozen path that still
/// ACKs) fails that client with 08006 instead of holding it forever, and
/// the server is closed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_sent_to_a_silent_server_end_in_an_error() {
    bounded(180, async {
        let h = Harness::start(Opts { pool_size: 1, relay: true, ..Default::default() }).await;
        let first = h.client().await;
        pid(&first).await.expect("the pool's one server, with the default application_name");
        let url = format!("{}?application_name=hangs_other", h.url(SCRAM_USER, SCRAM_PASS));
        let other = connect(&url).await.expect("a client whose settings differ");
        h.relay.as_ref().unwrap().freeze();
        let t0 = Instant::now();
        let e = within("a query whose settings go to a frozen server", other.simple_query("select 1"))
            .await
            .expect_err("the server never answers the settings");
        println!("settings on a frozen server: {} after {:?}", describe(&e), t0.elapsed());
        assert_eq!(sqlstate(&e).as_deref(), Some("08006"), "{}", describe(&e));
        assert!(
            eventually(WAIT_LIMIT, || h.pool().metrics.closed(CloseReason::Unresponsive) == 1).await,
            "the silent server is closed"
        );
        h.relay.as_ref().unwrap().thaw();
        let fresh = h.client().await;
        pid(&fresh).await.expect("a replacement serves after the thaw");
    })
    .await;
}

/// The query a client sends and never reads: far more than every buffer
/// between Postgres and the client holds.
const UNREAD: &str = "select repeat('x', 1048576) from generate_series(1, 400)";

/// A raw client that sent `UNREAD` and reads nothing, once Postgres is
/// blocked writing it (weir stopped reading: the client takes nothing).
async fn client_that_does_not_read(h: &Harness) -> Raw {
    let mut raw = Raw::login(h.addr(), MD5_USER, MD5_PASS, &[]).await.expect("raw login");
    raw.send_query(UNREAD).await.expect("send the query");
    let direct = h.direct().await;
    let sql = format!(
        "select count(*) from pg_stat_activity where query = '{}' and wait_event = 'ClientWrite'",
        UNREAD.replace('\'', "''")
    );
    wait_for("Postgres blocked writing to a client that does not read", || async {
        one(&direct, &sql).await.expect("pg_stat_activity") == "1"
    })
    .await;
    raw
}

/// KILL ends a client that stopped reading: weir's FATAL cannot reach it
/// (its socket is full), so weir gives up on the goodbye and closes the
/// connection instead of waiting on it forever. The client's place under
/// max_client_conn comes back, and its server goes back to the pool.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_closes_a_client_that_does_not_read() {
    bounded(180, async {
        let h = Harness::start(Opts { pool_size: 2, ..Default::default() }).await;
        let raw = client_that_does_not_read(&h).await;
        let admin = console(&h).await;
        let clients = || h.weir().shared().clients.load(std::sync::atomic::Ordering::SeqCst);
        assert_eq!(clients(), 2, "the raw client and the console");
        within("KILL", admin.simple_query("KILL app")).await.expect("KILL");
        assert!(eventually(HANG, || clients() == 1).await, "the killed client's connection is let go: {}", clients());
        assert!(eventually(WAIT_LIMIT, || h.pool_for(MD5_USER).snapshot().active == 0).await, "its server came back");
        drop(raw);
        admin.simple_query("RESUME app").await.expect("RESUME");
    })
    .await;
}

/// The exact size of `sql`'s answer as Postgres sends it (RowDescription to
/// ReadyForQuery), asked straight from Postgres.
async fn answer_len(h: &Harness, sql: &str) -> u64 {
    let s = tokio::net::TcpStream::connect(h.pg_addr()).await.expect("connect to Postgres");
    let mut raw = Raw::new(s);
    raw.start(MD5_USER, MD5_PASS, &[]).await.expect("login to Postgres");
    raw.send_query(sql).await.expect("send");
    let mut total = 0;
    loop {
        let (tag, body) = raw.read_msg().await.expect("the answer");
        total += 5 + body.len() as u64;
        if tag == weir::protocol::tags::backend::READY_FOR_QUERY {
            return total;
        }
    }
}

/// A server that dies while weir still has its answer for a client that
/// does not read: weir gives up handing the rest on after a bound, so the
/// dead server's place in the pool comes back (a client over a Unix socket,
/// whose buffers have a known size, so the whole answer reaches weir).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_dies_while_its_client_does_not_read_gives_its_place_back() {
    bounded(180, async {
        let dir = std::env::temp_dir().join(format!("weir-hangs-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        let general = format!("unix_socket_dir = \"{}\"", dir.display());
        let h = Harness::start(Opts { pool_size: 1, relay: true, general, ..Default::default() }).await;
        // More than a Unix socket's buffers hold (net.core.wmem_default), and
        // less than that plus what weir buffers before it stops reading.
        let wmem: u64 = std::fs::read_to_string("/proc/sys/net/core/wmem_default").unwrap().trim().parse().unwrap();
        let rows = (wmem + 64 * 1024).div_ceil(65547);
        let sql = format!("select repeat('x', 65536) from generate_series(1, {rows})");
        let expected = answer_len(&h, &sql).await;
        let path = h.weir().unix_socket_path().expect("a Unix socket").to_owned();
        let mut raw = Raw::new(tokio::net::UnixStream::connect(&path).await.expect("connect over the Unix socket"));
        raw.start(MD5_USER, MD5_PASS, &[]).await.expect("login");
        raw.send_query(&sql).await.expect("send the query");
        let pool = h.pool_for(MD5_USER);
        wait_for("weir has the whole answer from the server", || async {
            pool.metrics.server_bytes_received() == expected
        })
        .await;
        assert_eq!(pool.snapshot().active, 1, "the client holds the server while its answer waits");
        h.relay.as_ref().unwrap().reset_all();
        assert!(
            eventually(HANG, || pool.snapshot().active == 0).await,
            "the dead server's place comes back though its client does not read"
        );
        assert_eq!(pool.metrics.closed(CloseReason::ServerClosed), 1);
        let clients = || h.weir().shared().clients.load(std::sync::atomic::Ordering::SeqCst);
        assert!(eventually(HANG, || clients() == 0).await, "and the client is closed");
        drop(raw);
        let _ = std::fs::remove_dir_all(&dir);
    })
    .await;
}

/// auth_query whose server falls silent mid-lookup: the login ends at
/// client_login_timeout (default 10 s) with an error, not never.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_query_on_a_silent_server_ends_at_the_login_timeout() {
    bounded(180, async {
        let general = "auth_user = \"weir_auth\"\n".to_owned();
        let h = Harness::start(Opts { relay: true, general, ..Default::default() }).await;
        h.psql("create role weir_auth superuser login password 'weir_auth_pass'");
        let users = weir::auth::UserList::parse("\"weir_auth\" \"weir_auth_pass\"\n").expect("a userlist");
        h.weir().shared().users.store(std::sync::Arc::new(users));
        let first = connect(&h.url(MD5_USER, MD5_PASS)).await.expect("a login through auth_query");
        pid(&first).await.expect("served");
        h.relay.as_ref().unwrap().freeze();
        let t0 = Instant::now();
        let e = within("a login whose auth_query server is silent", connect(&h.url(SCRAM_USER, SCRAM_PASS)))
            .await
            .expect_err("the lookup never answers");
        println!("auth_query on a silent server: {} after {:?}", describe(&e), t0.elapsed());
        assert!(e.as_db_error().is_some(), "weir says why: {e}");
        h.relay.as_ref().unwrap().thaw();
    })
    .await;
}

/// weir (pool of 2), a client holding a server in an open transaction (a
/// PAUSE waits for it), and a console client.
async fn holder_and_console() -> (Harness, Client, Client) {
    let h = Harness::start(Opts { pool_size: 2, ..Default::default() }).await;
    let holder = h.client().await;
    holder.simple_query("begin").await.unwrap();
    pid(&holder).await.expect("a server held in a transaction");
    let admin = console(&h).await;
    (h, holder, admin)
}

/// A CancelRequest for the console while PAUSE waits (psql's ^C) ends the
/// wait with 57014 and undoes the pause, as in PgBouncer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_pause_returns_and_resumes() {
    bounded(180, async {
        let (h, holder, admin) = holder_and_console().await;
        let cancel = admin.cancel_token();
        let pause = tokio::spawn(async move { (admin.simple_query("PAUSE").await.map(|_| ()), admin) });
        assert!(eventually(WAIT_LIMIT, || h.pool().snapshot().paused).await, "PAUSE took effect");
        cancel.cancel_query(NoTls).await.expect("the cancel is taken");
        let (paused, admin) = within("a cancelled PAUSE", pause).await.unwrap();
        let e = paused.expect_err("a cancelled PAUSE is an error");
        assert_eq!(sqlstate(&e).as_deref(), Some("57014"), "{}", describe(&e));
        assert!(!h.pool().snapshot().paused, "the cancelled PAUSE is undone");
        holder.simple_query("commit").await.expect("the holder's transaction goes on");
        let fresh = h.client().await;
        pid(&fresh).await.expect("new queries run");
        admin.simple_query("SHOW POOLS").await.expect("the console session goes on");
    })
    .await;
}

/// RESUME (from another console, or SIGUSR2) while PAUSE waits ends that
/// PAUSE with 57014: it stops closing the servers that come back, and the
/// resumed pool keeps its connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resume_ends_a_waiting_pause() {
    bounded(180, async {
        let (h, holder, admin) = holder_and_console().await;
        let pause = tokio::spawn(async move { admin.simple_query("PAUSE").await.map(|_| ()) });
        assert!(eventually(WAIT_LIMIT, || h.pool().snapshot().paused).await, "PAUSE took effect");
        console(&h).await.simple_query("RESUME").await.expect("RESUME");
        let e = within("a PAUSE that RESUME overtook", pause).await.unwrap().expect_err("PAUSE did not complete");
        assert_eq!(sqlstate(&e).as_deref(), Some("57014"), "{}", describe(&e));
        holder.simple_query("commit").await.unwrap();
        // The pool is in use again: the old PAUSE must not close what comes back.
        let other = h.client().await;
        let closed = h.pool().metrics.closed_total();
        for _ in 0..20 {
            pid(&holder).await.unwrap();
            pid(&other).await.unwrap();
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(h.pool().metrics.closed_total(), closed, "no server closed after RESUME");
    })
    .await;
}

/// WAIT_CLOSE waits for servers a session-mode client keeps; a cancel ends
/// the wait with 57014.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_wait_close_returns() {
    bounded(180, async {
        let h = Harness::start(Opts { pool_size: 2, pool_mode: "session", ..Default::default() }).await;
        let holder = h.client().await;
        pid(&holder).await.expect("a session-mode client keeps its server");
        let admin = console(&h).await;
        admin.simple_query("RECONNECT").await.expect("RECONNECT");
        let cancel = admin.cancel_token();
        let wait = tokio::spawn(async move { (admin.simple_query("WAIT_CLOSE").await.map(|_| ()), admin) });
        // WAIT_CLOSE has nothing to show while it waits: give it time to start.
        tokio::time::sleep(Duration::from_millis(300)).await;
        assert!(!wait.is_finished(), "WAIT_CLOSE waits for the session's server");
        cancel.cancel_query(NoTls).await.expect("the cancel is taken");
        let (waited, admin) = within("a cancelled WAIT_CLOSE", wait).await.unwrap();
        let e = waited.expect_err("a cancelled WAIT_CLOSE is an error");
        assert_eq!(sqlstate(&e).as_deref(), Some("57014"), "{}", describe(&e));
        admin.simple_query("SHOW POOLS").await.expect("the console session goes on");
        pid(&holder).await.expect("the session client is left alone");
    })
    .await;
}

/// One row of /proc/net/tcp: the local and remote ports and the timer field.
fn tcp_rows() -> Vec<(u16, u16, u8, u64)> {
    let text = std::fs::read_to_string("/proc/net/tcp").expect("/proc/net/tcp");
    let port = |addr: &str| u16::from_str_radix(addr.rsplit(':').next().unwrap(), 16).unwrap();
    text.lines()
        .skip(1)
        .filter_map(|line| {
            let f: Vec<&str> = line.split_whitespace().collect();
            let (timer, when) = f.get(5)?.split_once(':')?;
            Some((port(f[1]), port(f[2]), u8::from_str_radix(timer, 16).ok()?, u64::from_str_radix(when, 16).ok()?))
        })
        .collect()
}

/// weir's end of a client's TCP connection runs the keepalive timer with
/// tcp_keepidle's value (5 s), so a client whose path dies while it holds a
/// server (idle in a transaction, mid-batch, mid-COPY) or its place under
/// max_client_conn is found in seconds, not never: nothing else reads an
/// idle client.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_connections_have_keepalive() {
    bounded(120, async {
        let h = Harness::start(Opts::default()).await;
        let mut raw = Raw::login(h.addr(), MD5_USER, MD5_PASS, &[]).await.expect("raw login");
        raw.query_one("begin; select 1").await;
        let client_port = raw.s.local_addr().unwrap().port();
        let weir_port = h.addr().port();
        let weirs_end =
            || tcp_rows().into_iter().find(|(local, remote, ..)| (*local, *remote) == (weir_port, client_port));
        // Timer 1 (retransmit or loss probe) runs until the client's ACK of
        // weir's last answer; the keepalive timer then takes over.
        wait_for("weir's last answer acknowledged", || async {
            weirs_end().expect("weir's end of the client connection in /proc/net/tcp").2 != 1
        })
        .await;
        let (_, _, timer, when) = weirs_end().unwrap();
        // Timer 2 is the keepalive timer; `when` is in clock ticks (100 a second).
        assert_eq!(timer, 2, "weir's end of a client connection runs the keepalive timer");
        assert!(when <= 5 * 100, "first probe within tcp_keepidle (5 s): {when} ticks");
    })
    .await;
}

/// A COPY FROM STDIN through the relay that `cut` breaks after its first
/// row; then rows until the client gets an error, which it returns.
async fn copy_in_until_error(h: &Harness, cut: impl FnOnce(&Relay)) -> tokio_postgres::Error {
    h.psql("create table hangs_copy_in (t text); grant all on hangs_copy_in to public");
    let c = h.client().await;
    let sink = c.copy_in("copy hangs_copy_in from stdin").await.expect("COPY starts");
    futures_util::pin_mut!(sink);
    sink.send(Bytes::from_static(b"before the cut\n")).await.expect("a row");
    cut(h.relay.as_ref().unwrap());
    let chunk = Bytes::from("x".repeat(1023) + "\n").repeat(64);
    let t0 = Instant::now();
    let e = within("COPY rows over a broken path", async {
        loop {
            if let Err(e) = sink.send(Bytes::from(chunk.clone())).await {
                return e;
            }
        }
    })
    .await;
    println!("COPY IN over a broken path: {} after {:?}", describe(&e), t0.elapsed());
    e
}

/// COPY FROM STDIN into a server whose path freezes: weir's writes stop
/// going through, the silence probe (on by default) finds the path dead, and
/// the client gets an error instead of blocking on its COPY forever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_in_to_a_frozen_server_ends_in_an_error() {
    bounded(180, async {
        let h = Harness::start(Opts { pool_size: 2, relay: true, ..Default::default() }).await;
        copy_in_until_error(&h, Relay::freeze).await;
        assert!(
            eventually(WAIT_LIMIT, || h.pool().metrics.closed(CloseReason::Unresponsive) == 1).await,
            "the server whose path froze is closed"
        );
        h.relay.as_ref().unwrap().thaw();
    })
    .await;
}

/// COPY FROM STDIN on a connection whose path dies while new ones still get
/// through (a NAT that lost its mappings): the probe logs in and finds the
/// backend waiting to read bytes that never reach it, and the client gets
/// an error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_in_whose_path_dies_while_new_ones_work_ends_in_an_error() {
    bounded(180, async {
        let h = Harness::start(Opts { pool_size: 2, relay: true, ..Default::default() }).await;
        copy_in_until_error(&h, Relay::freeze_existing).await;
        assert!(
            eventually(WAIT_LIMIT, || h.pool().metrics.closed(CloseReason::Unresponsive) == 1).await,
            "the probe found the backend cut off from its bytes"
        );
        h.relay.as_ref().unwrap().thaw();
    })
    .await;
}

/// A client that pipelines more than every buffer holds behind a query that
/// runs longer than a TCP_USER_TIMEOUT would allow: the backend reads
/// nothing meanwhile, and weir leaves it alone (the probe finds it working),
/// as Postgres alone would, and the answers come.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pipeline_behind_a_long_query_is_not_cut_off() {
    bounded(180, async {
        use tokio::io::AsyncWriteExt;
        let h = Harness::start(Opts { pool_size: 1, ..Default::default() }).await;
        let mut raw = Raw::login(h.addr(), MD5_USER, MD5_PASS, &[]).await.expect("login");
        raw.send_query("select pg_sleep(12)").await.expect("send the long query");
        let mut one = bytes::BytesMut::new();
        weir::protocol::messages::query(&mut one, "select 1");
        // 40 x 1.4 MB of queries: far more than the buffers on the way hold.
        let chunk = one.repeat(100_000);
        let (mut rd, mut wr) = tokio::io::split(raw.s);
        let writer = tokio::spawn(async move {
            for _ in 0..40 {
                if wr.write_all(&chunk).await.is_err() {
                    return;
                }
            }
        });
        // The long query's answer, then those of the first 100,000 queries
        // behind it: one ReadyForQuery each.
        let mut buf = bytes::BytesMut::with_capacity(1 << 16);
        let mut ready = 0;
        while ready < 100_001 {
            let frame = within("the pipeline's answers", weir::wire::read_frame(&mut rd, &mut buf, 1 << 20))
                .await
                .expect("an answer, not a closed connection");
            assert_ne!(frame.tag, weir::protocol::tags::backend::ERROR_RESPONSE, "no error");
            if frame.tag == weir::protocol::tags::backend::READY_FOR_QUERY {
                ready += 1;
            }
        }
        writer.abort();
        assert_eq!(h.pool_for(MD5_USER).metrics.closed_total(), 0, "the server was never cut off");
    })
    .await;
}

/// COPY TO STDOUT from a server whose path freezes mid-stream: the silence
/// probe (on by default) finds the path dead and the client gets 08006.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn copy_out_from_a_frozen_server_ends_in_an_error() {
    bounded(180, async {
        let h = Harness::start(Opts { pool_size: 2, relay: true, ..Default::default() }).await;
        let c = h.client().await;
        let direct = h.direct().await;
        let sql = "copy (select i, pg_sleep(0.001) from generate_series(1, 10000000) i) to stdout";
        let stream = c.copy_out(sql).await.expect("COPY starts");
        futures_util::pin_mut!(stream);
        stream.next().await.expect("a first row").expect("a first row");
        running_like(&direct, "generate_series(1, 10000000)").await;
        h.relay.as_ref().unwrap().freeze();
        let t0 = Instant::now();
        let e = within("COPY rows from a frozen server", async {
            loop {
                match stream.next().await {
                    Some(Ok(_)) => {}
                    Some(Err(e)) => return e,
                    None => panic!("the COPY ended while the path was frozen"),
                }
            }
        })
        .await;
        println!("COPY OUT from a frozen server: {} after {:?}", describe(&e), t0.elapsed());
        assert_eq!(sqlstate(&e).as_deref(), Some("08006"), "{}", describe(&e));
        h.relay.as_ref().unwrap().thaw();
    })
    .await;
}
