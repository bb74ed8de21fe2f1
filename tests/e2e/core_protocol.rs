//! The client side of the protocol over raw sockets, where drivers are too
//! polite to go: bogus lengths, unsupported protocol versions, oversized
//! startup packets, SSLRequest and GSSENCRequest, bytes pipelined after an
//! encryption request, startup parameters weir cannot honour, and
//! client_login_timeout. Each bad input gets a FATAL ErrorResponse with the
//! right SQLSTATE, then the connection closes; nobody else is harmed.

use std::time::{Duration, Instant};

use bytes::BytesMut;
use tokio::io::AsyncReadExt;
use weir::protocol::messages;
use weir::protocol::tags::{backend as be, frontend as fe, startup as code};
use weir_e2e::raw::{startup, startup_v, tagged, Raw};
use weir_e2e::{bounded, Harness, Opts, APP_DB, SCRAM_USER};

const READ_LIMIT: Duration = Duration::from_secs(5);

/// weir with auth_type trust, so raw sockets can log in without a password exchange.
async fn trust_harness(general: &str) -> Harness {
    Harness::start(Opts { auth_type: "trust", general: general.into(), ..Default::default() }).await
}

/// A raw connection to weir, each read bounded by `READ_LIMIT`.
async fn connect(h: &Harness) -> Raw {
    Raw::connect(h.addr()).await.with_limit(READ_LIMIT)
}

/// Startup parameters, as the raw builders take them.
type Params<'a> = &'a [(&'a str, &'a str)];

fn user_params() -> [(&'static str, &'static str); 2] {
    [("user", SCRAM_USER), ("database", APP_DB)]
}

/// A startup packet whose length is shorter than its header is a protocol violation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bogus_startup_length_gets_08p01() {
    bounded(60, async {
        let h = trust_harness("").await;
        for bogus in [&[0u8, 0, 0, 5, 0][..], &[0xff, 0xff, 0xff, 0xf0, 0, 0, 0, 0][..]] {
            let mut c = connect(&h).await;
            c.send(bogus).await.unwrap();
            let f = c.expect_fatal().await;
            assert_eq!(f.code, "08P01", "{f:?}");
        }
        let mut ok = connect(&h).await;
        ok.send(&startup(&user_params())).await.unwrap();
        ok.expect_login_ok().await;
        assert_eq!(ok.query_one("select 'unharmed'").await, "unharmed");
    })
    .await
}

/// After login, a message with a negative length is a protocol violation.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negative_message_length_after_login_gets_08p01() {
    bounded(60, async {
        let h = trust_harness("").await;
        let mut c = connect(&h).await;
        c.send(&startup(&user_params())).await.unwrap();
        c.expect_login_ok().await;
        assert_eq!(c.query_one("select 1").await, "1");
        c.send(b"Q\xff\xff\xff\xfe").await.unwrap();
        let f = c.expect_fatal().await;
        assert_eq!(f.code, "08P01", "{f:?}");
        // The pool lost nothing: another client is served at once.
        let mut other = connect(&h).await;
        other.send(&startup(&user_params())).await.unwrap();
        other.expect_login_ok().await;
        assert_eq!(other.query_one("select 2").await, "2");
    })
    .await
}

/// A message over max_message_size is refused before weir buffers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_message_is_refused() {
    bounded(60, async {
        let h = trust_harness("max_message_size = 65536").await;
        let mut c = connect(&h).await;
        c.send(&startup(&user_params())).await.unwrap();
        c.expect_login_ok().await;
        let mut q = vec![b'Q'];
        q.extend_from_slice(&(1_000_000i32).to_be_bytes());
        c.send(&q).await.unwrap();
        let f = c.expect_fatal().await;
        assert_eq!(f.code, "08P01", "{f:?}");
        assert!(f.message_text().contains("65536"), "{f:?}");
    })
    .await
}

/// Protocol 2.0 and 4.0 get a clear FATAL; 3.x with x > 2 gets
/// NegotiateProtocolVersion offering 3.2 and a 3.2 session.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn protocol_versions() {
    bounded(60, async {
        let h = trust_harness("").await;
        for major in [2, 4] {
            let mut c = connect(&h).await;
            c.send(&startup_v(major, 0, &user_params())).await.unwrap();
            let f = c.expect_fatal().await;
            assert_eq!(f.code, "0A000", "{f:?}");
            assert!(f.message_text().contains(&format!("protocol {major}.0")), "{f:?}");
        }
        let mut c = connect(&h).await;
        let mut params = user_params().to_vec();
        params.push(("_pq_.some_option", "on"));
        c.send(&startup_v(3, 7, &params)).await.unwrap();
        let (tag, body) = c.next().await.unwrap();
        assert_eq!(tag, be::NEGOTIATE_PROTOCOL_VERSION);
        assert_eq!(&body[..8], &[0, 3, 0, 2, 0, 0, 0, 1], "3.2 (196610), one unknown option");
        assert_eq!(&body[8..], b"_pq_.some_option\0");
        c.expect_login_ok().await;
        assert_eq!(c.query_one("select 'v3.2'").await, "v3.2");
    })
    .await
}

/// A startup packet over Postgres's 10000-byte limit is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn oversized_startup_packet_is_refused() {
    bounded(60, async {
        let h = trust_harness("").await;
        let long = "x".repeat(12_000);
        let mut c = connect(&h).await;
        c.send(&startup(&[("user", SCRAM_USER), ("application_name", &long)])).await.unwrap();
        let f = c.expect_fatal().await;
        assert_eq!(f.code, "08P01", "{f:?}");
        assert!(f.message_text().contains("10000"), "{f:?}");
    })
    .await
}

/// client_login_timeout: a client that connects and says nothing is told
/// and closed, within about a second.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn silent_client_is_closed_by_client_login_timeout() {
    bounded(120, async {
        let h = trust_harness("client_login_timeout = \"300ms\"").await;
        let started = Instant::now();
        let mut silent = connect(&h).await;
        let f = silent.expect_fatal().await;
        let took = started.elapsed();
        assert_eq!(f.code, "08P01", "{f:?}");
        assert!(f.message_text().contains("client_login_timeout"), "{f:?}");
        // Without the timeout the client would wait forever: the upper bound
        // leaves a loaded machine room.
        assert!(took >= Duration::from_millis(250) && took < Duration::from_secs(5), "closed after {took:?}");

        // Halfway through a login counts too: startup sent, password never.
        let opts = Opts { general: "client_login_timeout = \"300ms\"".into(), ..Default::default() };
        let h = Harness::start_with(h.pg.clone(), opts).await;
        let started = Instant::now();
        let mut half = connect(&h).await;
        half.send(&startup(&user_params())).await.unwrap();
        let (tag, _) = half.next().await.unwrap();
        assert_eq!(tag, be::AUTHENTICATION, "asked for a password");
        half.expect_fatal().await;
        assert!(started.elapsed() < Duration::from_secs(5), "closed after {:?}", started.elapsed());
    })
    .await
}

/// SSLRequest and GSSENCRequest are answered 'N'; the login then proceeds
/// in plaintext on the same socket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn encryption_requests_are_refused_then_plaintext_login() {
    bounded(60, async {
        let h = trust_harness("").await;
        let mut c = connect(&h).await;
        for request in [code::GSSENC_REQUEST, code::SSL_REQUEST] {
            c.send(&messages::encryption_request(request)).await.unwrap();
            let mut answer = [0u8; 1];
            tokio::time::timeout(READ_LIMIT, c.s.read_exact(&mut answer)).await.unwrap().unwrap();
            assert_eq!(answer[0], b'N');
        }
        c.send(&startup(&user_params())).await.unwrap();
        let (tags, reported) = c.expect_login_ok().await;
        assert_eq!(tags.first(), Some(&be::AUTHENTICATION));
        assert!(tags.contains(&be::BACKEND_KEY_DATA), "{tags:?}");
        // The server's parameters, as Postgres itself would report them.
        for name in [
            "server_version",
            "server_encoding",
            "client_encoding",
            "DateStyle",
            "TimeZone",
            "integer_datetimes",
            "standard_conforming_strings",
        ] {
            assert!(reported.iter().any(|(k, _)| k == name), "{name} not reported: {reported:?}");
        }
        assert_eq!(c.query_one("select 'plain'").await, "plain");
    })
    .await
}

/// Bytes sent right after an SSLRequest, before its answer, would be
/// taken as plaintext by a careless server (CVE-2021-23222's class): refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bytes_pipelined_after_ssl_request_are_refused() {
    bounded(60, async {
        let h = trust_harness("").await;
        let mut both = messages::encryption_request(code::SSL_REQUEST).to_vec();
        both.extend_from_slice(&startup(&user_params()));
        let mut c = connect(&h).await;
        c.send(&both).await.unwrap();
        let f = c.expect_fatal().await;
        assert_eq!(f.code, "08P01", "{f:?}");
    })
    .await
}

/// Startup parameters weir cannot honour are refused, never dropped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_parameters_weir_cannot_honour_are_refused() {
    bounded(60, async {
        let h = trust_harness("").await;
        let cases: [(Params, &str, &str); 3] = [
            (&[("database", APP_DB)], "28000", "user"),
            (&[("user", SCRAM_USER), ("bad;name", "1")], "08P01", "bad;name"),
            // Outside track_extra_parameters: weir refuses it before any server
            // sees it (core.rs covers one on the list that Postgres refuses).
            (&[("user", SCRAM_USER), ("database", APP_DB), ("no_such_setting", "1")], "08P01", "no_such_setting"),
        ];
        for (params, want_code, mention) in cases {
            let mut c = connect(&h).await;
            c.send(&startup(params)).await.unwrap();
            let f = c.expect_fatal().await;
            assert_eq!(f.code, want_code, "{params:?}: {f:?}");
            assert!(f.message_text().contains(mention), "{params:?}: {f:?}");
        }
        // A bad TimeZone value is Postgres's to judge, and it says so.
        let mut c = connect(&h).await;
        c.send(&startup(&[("user", SCRAM_USER), ("database", APP_DB), ("TimeZone", "Nowhere/Land")])).await.unwrap();
        let f = c.expect_fatal().await;
        assert_eq!(f.code, "22023", "{f:?}");
        // Accepted ones are applied and reported back in Postgres's spelling.
        let mut c = connect(&h).await;
        let params = [("user", SCRAM_USER), ("database", APP_DB), ("DateStyle", "iso"), ("statement_timeout", "1234")];
        c.send(&startup(&params)).await.unwrap();
        let (_, reported) = c.expect_login_ok().await;
        assert!(reported.contains(&("DateStyle".into(), "ISO, MDY".into())), "{reported:?}");
        assert_eq!(c.query_one("show datestyle").await, "ISO, MDY");
        assert_eq!(c.query_one("show statement_timeout").await, "1234ms");
    })
    .await
}

/// Extended protocol with Flush: answers come before Sync, and the server
/// stays with the client (in transaction mode) until the Sync's ReadyForQuery.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flush_gets_answers_before_sync() {
    bounded(60, async {
        let h = Harness::start(Opts { auth_type: "trust", pool_size: 1, ..Default::default() }).await;
        let mut c = connect(&h).await;
        c.send(&startup(&user_params())).await.unwrap();
        c.expect_login_ok().await;
        let mut batch = tagged(fe::PARSE, b"\0select pg_backend_pid()\0\0\0");
        batch.extend(tagged(fe::DESCRIBE, b"S\0"));
        batch.extend(tagged(fe::FLUSH, b""));
        c.send(&batch).await.unwrap();
        let mut tags = Vec::new();
        for _ in 0..3 {
            tags.push(c.next().await.unwrap().0);
        }
        assert_eq!(tags, [be::PARSE_COMPLETE, be::PARAMETER_DESCRIPTION, be::ROW_DESCRIPTION]);

        // Another client in the meantime must wait: the batch is still open.
        let mut other = connect(&h).await;
        other.send(&startup(&user_params())).await.unwrap();
        other.expect_login_ok().await;
        let mut q = BytesMut::new();
        messages::query(&mut q, "select 'second'");
        other.send(&q).await.unwrap();
        let mut probe = [0u8; 1];
        let early = tokio::time::timeout(Duration::from_millis(300), other.s.peek(&mut probe)).await;
        assert!(early.is_err(), "the other client was served mid-batch");

        let mut rest = tagged(fe::BIND, b"\0\0\0\0\0\0\0\0");
        rest.extend(tagged(fe::EXECUTE, b"\0\0\0\0\0"));
        rest.extend(tagged(fe::SYNC, b""));
        c.send(&rest).await.unwrap();
        let mut tags = Vec::new();
        loop {
            let (tag, _) = c.next().await.unwrap();
            tags.push(tag);
            if tag == be::READY_FOR_QUERY {
                break;
            }
        }
        assert_eq!(tags, [be::BIND_COMPLETE, be::DATA_ROW, be::COMMAND_COMPLETE, be::READY_FOR_QUERY]);
        // Then the waiting client is served: exactly its one row.
        let reply = other.reply().await.unwrap();
        assert_eq!((reply.rows, reply.error), (vec![vec![Some("second".to_owned())]], None));
    })
    .await
}
