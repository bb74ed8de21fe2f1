//! Named prepared statements in transaction mode, against a real Postgres:
//! statements follow their client from server to server, errors keep their
//! meaning (a failing Parse is the client's error, an unknown name gets
//! Postgres's own 26000), DEALLOCATE is followed, `max_prepared_statements =
//! 0` turns it off, and session features pin the client to its server, which
//! is reset before anyone else gets it.

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weir_e2e::{connect, eventually, sqlstate, Harness, Opts, SCRAM_PASS, SCRAM_USER};

async fn harness(pool_size: u32, general: &str) -> Harness {
    Harness::start(Opts { pool_size, auth_type: "trust", general: general.into(), ..Opts::default() }).await
}

/// A client speaking raw protocol messages to weir.
struct Raw {
    s: TcpStream,
    buf: BytesMut,
}

fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    m.extend_from_slice(body);
    m
}

fn parse(name: &str, q: &str) -> Vec<u8> {
    msg(b'P', &[name.as_bytes(), b"\0", q.as_bytes(), b"\0\0\0"].concat())
}

fn bind(stmt: &str) -> Vec<u8> {
    msg(b'B', &[b"\0", stmt.as_bytes(), b"\0\0\0\0\0\0\0"].concat())
}

fn execute() -> Vec<u8> {
    msg(b'E', b"\0\0\0\0\0")
}

fn sync() -> Vec<u8> {
    msg(b'S', b"")
}

fn query(sql: &str) -> Vec<u8> {
    msg(b'Q', &[sql.as_bytes(), b"\0"].concat())
}

/// The SQLSTATE of an ErrorResponse body.
fn code(body: &[u8]) -> String {
    body.split(|&b| b == 0).find(|f| f.first() == Some(&b'C')).map(|f| String::from_utf8_lossy(&f[1..]).into()).unwrap()
}

impl Raw {
    async fn connect(h: &Harness) -> Raw {
        let mut s = TcpStream::connect(h.addr()).await.unwrap();
        let mut p = BytesMut::new();
        p.put_i32(0);
        p.put_i32(196_608);
        for (k, v) in [("user", SCRAM_USER), ("database", weir_e2e::APP_DB)] {
            p.put_slice(k.as_bytes());
            p.put_u8(0);
            p.put_slice(v.as_bytes());
            p.put_u8(0);
        }
        p.put_u8(0);
        let len = p.len() as i32;
        p[..4].copy_from_slice(&len.to_be_bytes());
        s.write_all(&p).await.unwrap();
        let mut raw = Raw { s, buf: BytesMut::new() };
        raw.until_ready().await;
        raw
    }

    /// Sends messages and returns every reply up to the next ReadyForQuery.
    async fn send(&mut self, msgs: &[Vec<u8>]) -> Vec<(u8, Vec<u8>)> {
        self.s.write_all(&msgs.concat()).await.unwrap();
        self.until_ready().await
    }

    async fn until_ready(&mut self) -> Vec<(u8, Vec<u8>)> {
        let mut out = vec![];
        loop {
            while self.buf.len() >= 5 {
                let len = i32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
                if self.buf.len() < len + 1 {
                    break;
                }
                let m = self.buf.split_to(len + 1);
                out.push((m[0], m[5..].to_vec()));
                if m[0] == b'Z' {
                    return out;
                }
            }
            let n =
                tokio::time::timeout(Duration::from_secs(10), self.s.read_buf(&mut self.buf)).await.unwrap().unwrap();
            assert!(n > 0, "weir closed the connection; got {out:?}");
        }
    }
}

fn tags(replies: &[(u8, Vec<u8>)]) -> String {
    replies.iter().map(|(t, _)| *t as char).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn statements_follow_their_client_to_another_server() {
    for (max, works) in [("200", true), ("0", false)] {
        let h = harness(2, &format!("max_prepared_statements = {max}\n")).await;
        let a = h.client().await;
        let b = connect(&h.url(SCRAM_USER, SCRAM_PASS)).await.unwrap();
        let pid = a.prepare("select pg_backend_pid()").await.unwrap();
        let first: i32 = a.query_one(&pid, &[]).await.unwrap().get(0);
        // b holds the server a just used (the idle stack is LIFO), so a's
        // next transaction runs on the other one.
        b.batch_execute("begin; select 1").await.unwrap();
        let second = a.query_one(&pid, &[]).await;
        b.batch_execute("commit").await.unwrap();
        if works {
            let second: i32 = second.unwrap().get(0);
            assert_ne!(first, second, "the second query ran on another server");
            let m = &h.pool().metrics;
            assert_eq!(m.client_parses(), 1);
            assert_eq!(m.server_parses(), 2, "prepared again, transparently, on the second server");
            // SHOW SERVERS lists each server's cache (PgBouncer's column).
            let admin = connect(&format!("postgres://admin:admin_pass@{}/weir", h.addr())).await.unwrap();
            let mut counts = vec![];
            for m in admin.simple_query("SHOW SERVERS").await.unwrap() {
                if let tokio_postgres::SimpleQueryMessage::Row(r) = m {
                    counts.push(r.get("prepared_statements").unwrap().to_owned());
                }
            }
            assert_eq!(counts, ["1", "1"], "one statement on each server");
        } else {
            let e = second.unwrap_err();
            assert_eq!(sqlstate(&e).as_deref(), Some("26000"), "without tracking the statement is unknown there: {e}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn errors_keep_their_meaning() {
    let h = harness(2, "").await;
    let mut c = Raw::connect(&h).await;
    let r = c.send(&[bind("never_prepared"), execute(), sync()]).await;
    assert_eq!(tags(&r), "EZ");
    assert_eq!(code(&r[0].1), "26000", "Postgres's own answer");
    let r = c.send(&[parse("bad", "select * from no_such_table"), sync()]).await;
    assert_eq!(tags(&r), "EZ");
    assert_eq!(code(&r[0].1), "42P01", "the failing Parse is the client's error");
    let r = c.send(&[bind("bad"), execute(), sync()]).await;
    assert_eq!(code(&r[0].1), "26000", "a failed Parse defined nothing");
    let r = c.send(&[parse("ok", "select 1"), bind("ok"), execute(), parse("later", "select 2"), sync()]).await;
    assert_eq!(tags(&r), "12DC1Z");
    // A batch failing midway: the ParseComplete weir owes before the failure
    // comes (ok2 is already on the server), nothing after it until ReadyForQuery.
    let r = c.send(&[parse("ok2", "select 1"), parse("bad2", "select 1/0"), bind("bad2"), execute(), sync()]).await;
    assert_eq!(tags(&r), "11EZ", "planning at Bind folds 1/0: {r:?}");
    assert_eq!(code(&r[2].1), "22012");
    let r = c.send(&[msg(b'D', b"Sok2\0"), sync()]).await;
    assert_eq!(tags(&r), "tTZ", "Describe replies are the server's");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deallocate_and_close_are_followed() {
    let h = harness(2, "").await;
    let mut c = Raw::connect(&h).await;
    assert_eq!(tags(&c.send(&[parse("s1", "select 1"), sync()]).await), "1Z");
    let r = c.send(&[query("DEALLOCATE s1")]).await;
    assert_eq!(tags(&r), "CZ");
    assert_eq!(r[0].1, b"DEALLOCATE\0");
    assert_eq!(code(&c.send(&[bind("s1"), execute(), sync()]).await[0].1), "26000");
    assert_eq!(tags(&c.send(&[parse("s1", "select 1"), sync()]).await), "1Z");
    assert_eq!(tags(&c.send(&[msg(b'C', b"Ss1\0"), sync()]).await), "3Z");
    assert_eq!(code(&c.send(&[bind("s1"), execute(), sync()]).await[0].1), "26000");
    assert_eq!(tags(&c.send(&[parse("s2", "select 2"), sync()]).await), "1Z");
    assert_eq!(tags(&c.send(&[query("DEALLOCATE ALL")]).await), "CZ");
    assert_eq!(code(&c.send(&[bind("s2"), execute(), sync()]).await[0].1), "26000");
    // The server's statements were dropped too; preparing again still works.
    let r = c.send(&[parse("s3", "select 2"), bind("s3"), execute(), sync()]).await;
    assert_eq!(tags(&r), "12DCZ", "{r:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_pins_the_client_and_its_server_is_reset_after() {
    let h = harness(2, "").await;
    let a = h.client().await;
    a.batch_execute("LISTEN jobs").await.unwrap();
    let pids: Vec<i32> = {
        let mut v = vec![];
        for _ in 0..5 {
            v.push(a.query_one("select pg_backend_pid()", &[]).await.unwrap().get(0));
        }
        v
    };
    assert!(pids.windows(2).all(|w| w[0] == w[1]), "pinned to one server: {pids:?}");
    assert_eq!(h.pool().metrics.pinned(), 1);
    drop(a);
    let pool = h.pool();
    assert!(eventually(Duration::from_secs(5), || pool.snapshot().active == 0).await);
    // Whoever gets that server now does not inherit the LISTEN.
    for _ in 0..4 {
        let c = h.client().await;
        let n: i64 = c.query_one("select count(*) from pg_listening_channels()", &[]).await.unwrap().get(0);
        assert_eq!(n, 0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn session_set_gets_a_warning() {
    let h = harness(2, "").await;
    let mut c = Raw::connect(&h).await;
    let r = c.send(&[query("SET search_path = public")]).await;
    assert_eq!(tags(&r), "NCZ");
    assert_eq!(code(&r[0].1), "01000");
    assert_eq!(tags(&c.send(&[query("SET LOCAL search_path = public")]).await), "NCZ", "Postgres's own warning");
    assert_eq!(tags(&c.send(&[query("SET application_name = 'x'")]).await), "CSZ", "reported: weir carries it");
}
