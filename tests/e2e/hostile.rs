//! Hostile input: each input is sent at a live weir in front of a
//! real Postgres, and must get a clear FATAL (checked by SQLSTATE) and a
//! closed socket, or a silent close when the client itself left first; then
//! a client that connected before the attack still queries, a new one logs
//! in, and the pool lost no server connection (closed_total unchanged).
//!
//! Client-side inputs are here; the auth exchange is in `hostile_auth` and a
//! malicious server in `hostile_server`. The flood and the 1 GiB query
//! measure weir's memory, so they are a module of their own
//! (`hostile_flood`), which scripts/run-tests.py runs in a process alone.

#[path = "hostile_auth.rs"]
mod hostile_auth;
#[path = "hostile_server.rs"]
mod hostile_server;

use std::time::{Duration, Instant};

use weir::protocol::tags::{frontend as fe, startup as code};
use weir_e2e::{bounded, Before, Harness, Opts, APP_DB, SCRAM_USER};

use weir_e2e::raw::{answer, header, startup, startup_body, tagged, untagged, Outcome, Raw};

fn assert_code(what: &str, got: &Outcome, want: &str) {
    assert_eq!(got.code(), want, "{what}: {got:?}");
}

fn user_params() -> [(&'static str, &'static str); 2] {
    [("user", SCRAM_USER), ("database", APP_DB)]
}

/// Startup packets: lengths negative, short, over 10,000 and huge; strings
/// without their NUL; invalid UTF-8; encryption requests with plaintext
/// pipelined behind them; malformed cancel requests; a database name far
/// longer than any real one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_startup_packets() {
    bounded(120, async {
        let h = Harness::start(Opts { auth_type: "trust", ..Default::default() }).await;
        let before = Before::take(&h).await;
        let v3 = code::PROTOCOL_3_0;
        let long_db = "d".repeat(9_000);
        let mut ssl_then_plain = weir::protocol::messages::encryption_request(code::SSL_REQUEST).to_vec();
        ssl_then_plain.extend(startup(&user_params()));
        let mut gss_then_plain = weir::protocol::messages::encryption_request(code::GSSENC_REQUEST).to_vec();
        gss_then_plain.extend(b"Q\0\0\0\x0dselect 1\0");
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("length -1", untagged(Some(-1), v3, b""), "08P01"),
            ("length i32::MIN", untagged(Some(i32::MIN), v3, b""), "08P01"),
            ("length 3", (3i32).to_be_bytes().to_vec(), "08P01"),
            ("length 10,001", untagged(Some(10_001), v3, b""), "08P01"),
            ("length i32::MAX", untagged(Some(i32::MAX), v3, b""), "08P01"),
            ("key without NUL", startup_body(b"user"), "08P01"),
            ("value without NUL", startup_body(b"user\0scram_user"), "08P01"),
            ("no final NUL", startup_body(b"user\0scram_user\0"), "08P01"),
            ("bytes after the final NUL", startup_body(b"user\0scram_user\0\0junk"), "08P01"),
            ("invalid UTF-8", startup_body(b"user\0\xff\xfe\0\0"), "08P01"),
            ("SSLRequest + plaintext startup", ssl_then_plain, "08P01"),
            ("GSSENCRequest + plaintext query", gss_then_plain, "08P01"),
            ("SSLRequest with a body", untagged(None, code::SSL_REQUEST, b"xx"), "08P01"),
            ("CancelRequest too short", untagged(None, code::CANCEL_REQUEST, b"1234"), "08P01"),
            ("no user", startup(&[("database", APP_DB)]), "28000"),
            (
                "parameter outside track_extra_parameters",
                startup(&[("user", SCRAM_USER), ("database", APP_DB), ("session_preload_libraries", "x")]),
                "08P01",
            ),
            ("9,000-byte database name", startup(&[("user", SCRAM_USER), ("database", &long_db)]), "3D000"),
        ];
        for (what, bytes, want) in &cases {
            assert_code(what, &answer(h.addr(), bytes).await, want);
        }
        // A well-formed CancelRequest for no one is closed without a word.
        let mut c = Raw::connect(h.addr()).await;
        c.send_anyway(&weir::protocol::messages::cancel_request(12345, 678)).await;
        assert_eq!(c.outcome().await, Outcome::Closed, "cancel for an unknown key");
        before.unharmed(&h).await;
    })
    .await
}

/// Truncated startup packets and slow-loris clients: a client that sends
/// part of a packet and leaves is closed quietly (it is gone); one that
/// stays, or sends a byte a second, is cut off by client_login_timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn truncated_and_slow_logins_are_bounded() {
    bounded(120, async {
        let general = "client_login_timeout = \"1s\"".to_owned();
        let h = Harness::start(Opts { auth_type: "trust", general, ..Default::default() }).await;
        let before = Before::take(&h).await;
        let full = startup(&user_params());

        let mut half = Raw::connect(h.addr()).await;
        half.send_anyway(&full[..full.len() / 2]).await;
        assert_eq!(half.eof_then_outcome().await, Outcome::Closed, "truncated startup, then EOF");
        let mut len_only = Raw::connect(h.addr()).await;
        len_only.send_anyway(&full[..2]).await;
        assert_eq!(len_only.eof_then_outcome().await, Outcome::Closed, "half a length, then EOF");

        // Stays silent halfway: the login timeout answers.
        let started = Instant::now();
        let mut stuck = Raw::connect(h.addr()).await;
        stuck.send_anyway(&full[..full.len() - 1]).await;
        let got = stuck.outcome().await;
        assert_code("truncated startup, then silence", &got, "08P01");
        assert!(got_message(&got).contains("client_login_timeout"), "{got:?}");
        // It would wait forever without the timeout; the bound leaves a loaded machine room.
        assert!(started.elapsed() < Duration::from_secs(10), "cut off after {:?}", started.elapsed());

        // Slow-loris: one byte per second, many at once; each is cut off
        // at client_login_timeout, not when it finishes.
        let started = Instant::now();
        let loris: Vec<_> = (0..20)
            .map(|_| {
                let (addr, full) = (h.addr(), full.clone());
                tokio::spawn(async move {
                    let mut c = Raw::connect(addr).await;
                    for b in &full {
                        if c.s.try_write(std::slice::from_ref(b)).is_err() {
                            break;
                        }
                        tokio::select! {
                            _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                            _ = c.s.readable() => break,
                        }
                    }
                    c.outcome().await
                })
            })
            .collect();
        for l in loris {
            let got = l.await.unwrap();
            assert_code("slow-loris", &got, "08P01");
        }
        // Far below a whole login at a byte a second (over 30 s).
        assert!(started.elapsed() < Duration::from_secs(10), "slow-loris clients lasted {:?}", started.elapsed());
        before.unharmed(&h).await;
    })
    .await
}

fn got_message(o: &Outcome) -> &str {
    match o {
        Outcome::Fatal(_, m) => m,
        Outcome::Closed => "",
    }
}

/// After login: negative lengths, a Query header over max_message_size,
/// unknown message types, a password message out of place, and messages cut
/// short by EOF (short ones are never forwarded; a long one streamed in part
/// is completed harmlessly by recovery). No server connection is lost.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malformed_messages_after_login() {
    bounded(120, async {
        let general = format!("max_message_size = {}", 1 << 20);
        let h = Harness::start(Opts { auth_type: "trust", general, ..Default::default() }).await;
        let before = Before::take(&h).await;
        let mut unknown = tagged(fe::QUERY, b"select 1\0");
        unknown.extend(tagged(b'z', b"what is this"));
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("Query length -2", header(fe::QUERY, -2), "08P01"),
            ("Query length 3", header(fe::QUERY, 3), "08P01"),
            ("Query header claiming 2 MiB over a 1 MiB limit", header(fe::QUERY, 2 << 20), "08P01"),
            ("Sync length i32::MAX", header(fe::SYNC, i32::MAX), "08P01"),
            ("unknown type 'z'", tagged(b'z', b""), "08P01"),
            ("unknown type 0x00", tagged(0, b"\0\0"), "08P01"),
            ("a query, then unknown type 'z'", unknown, "08P01"),
            ("password message after login", tagged(fe::PASSWORD, b"secret\0"), "08P01"),
        ];
        for (what, bytes, want) in &cases {
            let mut c = logged_in(&h).await;
            c.send_anyway(bytes).await;
            assert_code(what, &c.outcome().await, want);
        }
        // Cut short, then EOF: the client is gone; nothing runs.
        h.psql("create table never_run (v text); grant insert on never_run to public");
        let short = tagged(fe::QUERY, b"insert into never_run values ('short')\0");
        let mut big = tagged(fe::QUERY, format!("insert into never_run values ('{}')", "x".repeat(300_000)).as_bytes());
        big.truncate(100_000);
        for (what, bytes) in
            [("header only", &short[..5]), ("half a query", &short[..12]), ("100 KB of a 300 KB query", &big[..])]
        {
            let mut c = logged_in(&h).await;
            c.send_anyway(bytes).await;
            assert_eq!(c.eof_then_outcome().await, Outcome::Closed, "{what}");
        }
        let pool = h.pool();
        assert!(
            weir_e2e::eventually(weir_e2e::WAIT_LIMIT, || pool.snapshot().recovering == 0).await,
            "recovery of the half-sent query ends"
        );
        assert_eq!(h.psql("select count(*) from never_run"), "0", "a query cut short ran");
        before.unharmed(&h).await;
    })
    .await
}

/// A raw client logged in (trust) as scram_user.
async fn logged_in(h: &Harness) -> Raw {
    let mut c = Raw::connect(h.addr()).await;
    c.send_anyway(&startup(&user_params())).await;
    loop {
        let (tag, _) = c.next_or_reset().await.expect("login answer");
        if tag == weir::protocol::tags::backend::READY_FOR_QUERY {
            return c;
        }
        assert_ne!(tag, weir::protocol::tags::backend::ERROR_RESPONSE, "login failed");
    }
}
