//! A malicious or broken server: tiny fake "Postgres" listeners that speak
//! just enough protocol (AuthenticationOk, ParameterStatus, BackendKeyData,
//! ReadyForQuery, one answer per Query) and then misbehave: an
//! ErrorResponse without SQLSTATE during login, an impossible length during
//! login or in an answer, an ErrorResponse without SQLSTATE in an answer,
//! and a message sent unprompted while the connection sits idle in the pool.
//! Each is a database of its own in weir's config; its clients get a clear
//! error, weir does not panic, and clients of the real database `app` are
//! unaffected.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{BufMut, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use weir::protocol::messages;
use weir::protocol::tags::{auth, backend as be, frontend as fe, status};
use weir::wire;
use weir_e2e::{bounded, Before, Harness, Opts, SCRAM_USER};
use weir_metrics::CloseReason;

use weir_e2e::raw::{header, startup, tagged, Outcome, Raw};

/// How a fake server misbehaves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Evil {
    /// FATAL ErrorResponse with no `C` field instead of authenticating.
    LoginErrorWithoutSqlstate,
    /// A ParameterStatus whose length is negative, during login.
    LoginImpossibleLength,
    /// Answers a Query with a RowDescription header claiming 2 GiB - 1.
    AnswerImpossibleLength,
    /// Answers a Query with an ErrorResponse lacking SQLSTATE, then ReadyForQuery.
    AnswerErrorWithoutSqlstate,
    /// Answers normally, then sends a DataRow nobody asked for.
    UnpromptedWhileIdle,
}

impl Evil {
    const ALL: [Evil; 5] = [
        Evil::LoginErrorWithoutSqlstate,
        Evil::LoginImpossibleLength,
        Evil::AnswerImpossibleLength,
        Evil::AnswerErrorWithoutSqlstate,
        Evil::UnpromptedWhileIdle,
    ];

    fn db(self) -> String {
        format!("evil{}", self as u8)
    }
}

/// Starts a fake server; it serves every connection until the test ends.
async fn fake_server(evil: Evil) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((s, _)) = listener.accept().await {
            tokio::spawn(serve_one(s, evil));
        }
    });
    addr
}

fn raw_error(out: &mut BytesMut, fields: &[u8]) {
    out.put_u8(be::ERROR_RESPONSE);
    out.put_i32(4 + fields.len() as i32);
    out.put_slice(fields);
}

async fn serve_one(mut s: TcpStream, evil: Evil) {
    let mut buf = BytesMut::new();
    if wire::read_startup_packet(&mut s, &mut buf).await.is_err() {
        return;
    }
    let mut out = BytesMut::new();
    match evil {
        Evil::LoginErrorWithoutSqlstate => raw_error(&mut out, b"SFATAL\0Mthe evil server refuses, without a code\0\0"),
        Evil::LoginImpossibleLength => {
            messages::authentication(&mut out, auth::OK, &[]);
            out.extend_from_slice(&header(be::PARAMETER_STATUS, -7));
        }
        _ => greet(&mut out),
    }
    let _ = s.write_all(&out).await;
    while let Ok(frame) = wire::read_frame(&mut s, &mut buf, 1 << 20).await {
        if frame.tag == fe::TERMINATE {
            return;
        }
        if frame.tag != fe::QUERY {
            continue;
        }
        let mut out = BytesMut::new();
        match evil {
            Evil::AnswerImpossibleLength => out.extend_from_slice(&header(be::ROW_DESCRIPTION, i32::MAX)),
            Evil::AnswerErrorWithoutSqlstate => {
                raw_error(&mut out, b"SERROR\0Mno code in this error\0\0");
                messages::ready_for_query(&mut out, status::IDLE);
            }
            _ => {
                out.extend_from_slice(&tagged(be::COMMAND_COMPLETE, b"SELECT 0\0"));
                messages::ready_for_query(&mut out, status::IDLE);
                if evil == Evil::UnpromptedWhileIdle {
                    out.extend_from_slice(&tagged(be::DATA_ROW, b"\0\x01\0\0\0\x05stray"));
                }
            }
        }
        if s.write_all(&out).await.is_err() {
            return;
        }
    }
}

/// AuthenticationOk, the parameters weir expects, BackendKeyData, ReadyForQuery.
fn greet(out: &mut BytesMut) {
    messages::authentication(out, auth::OK, &[]);
    for (k, v) in [
        ("server_version", "15.0 (evil)"),
        ("server_encoding", "UTF8"),
        ("client_encoding", "UTF8"),
        ("DateStyle", "ISO, MDY"),
        ("TimeZone", "UTC"),
        ("integer_datetimes", "on"),
        ("standard_conforming_strings", "on"),
    ] {
        messages::parameter_status(out, k, v);
    }
    messages::backend_key_data(out, 4242, 4343);
    messages::ready_for_query(out, status::IDLE);
}

/// A raw client of database `db`: logs in (trust), or returns what weir said.
async fn client_of(h: &Harness, db: &str) -> Result<Raw, Outcome> {
    let mut c = Raw::connect(h.addr()).await;
    c.send_anyway(&startup(&[("user", SCRAM_USER), ("database", db)])).await;
    loop {
        match c.next_or_reset().await {
            Some((be::READY_FOR_QUERY, _)) => return Ok(c),
            Some((be::ERROR_RESPONSE, body)) => {
                let f = messages::parse_error_fields(&body).unwrap();
                assert!(c.next_or_reset().await.is_none(), "closed after the login error");
                return Err(Outcome::Fatal(f.code.clone(), f.message_text()));
            }
            Some(_) => {}
            None => return Err(Outcome::Closed),
        }
    }
}

/// Sends a Query; returns the tags of the answer up to ReadyForQuery (or
/// up to the end) and the first error's (code, message).
async fn query(c: &mut Raw, sql: &str) -> (Vec<u8>, Option<(String, String)>) {
    let mut q = BytesMut::new();
    messages::query(&mut q, sql);
    c.send_anyway(&q).await;
    let (mut tags, mut error) = (Vec::new(), None);
    while let Some((tag, body)) = c.next_or_reset().await {
        tags.push(tag);
        if tag == be::ERROR_RESPONSE && error.is_none() {
            let f = messages::parse_error_fields(&body).unwrap();
            error = Some((f.code.clone(), f.message_text()));
        }
        if tag == be::READY_FOR_QUERY {
            break;
        }
    }
    (tags, error)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn malicious_servers_harm_only_their_own_clients() {
    bounded(120, async {
        let mut databases = String::new();
        for evil in Evil::ALL {
            let addr = fake_server(evil).await;
            databases += &format!("\n[databases.{}]\nhost = \"127.0.0.1\"\nport = {}\n", evil.db(), addr.port());
        }
        let opts = Opts {
            auth_type: "trust",
            general: "query_wait_timeout = \"3s\"".into(),
            database: databases,
            ..Default::default()
        };
        let h = Harness::start(opts).await;
        let before = Before::take(&h).await;

        // Login-time misbehaviour: the client is refused with a clear error.
        let e = client_of(&h, &Evil::LoginErrorWithoutSqlstate.db()).await.err().expect("refused");
        assert_eq!(e.code(), "08006", "{e:?}");
        assert!(format!("{e:?}").contains("refuses, without a code"), "the server's text is passed on: {e:?}");
        let e = client_of(&h, &Evil::LoginImpossibleLength.db()).await.err().expect("refused");
        assert_eq!(e.code(), "08P01", "{e:?}");

        // An impossible length in an answer: FATAL, and that server is closed.
        let db = Evil::AnswerImpossibleLength.db();
        let mut c = client_of(&h, &db).await.expect("login");
        let (_, err) = query(&mut c, "select 1").await;
        let (code, message) = err.expect("an error");
        assert_eq!(code, "08P01", "{message}");
        assert!(message.contains("server"), "says the server is at fault: {message}");
        assert!(c.closed_by_weir().await);
        let pool = h.weir().shared().pools.get(&db, SCRAM_USER).unwrap();
        let closed =
            weir_e2e::eventually(weir_e2e::WAIT_LIMIT, || pool.metrics.closed(CloseReason::ProtocolError) == 1);
        assert!(closed.await, "the lying server's connection is closed as a protocol error");

        // An ErrorResponse without SQLSTATE in an answer passes through as
        // the server sent it; the session goes on.
        let mut c = client_of(&h, &Evil::AnswerErrorWithoutSqlstate.db()).await.expect("login");
        for _ in 0..2 {
            let (tags, err) = query(&mut c, "select 1").await;
            assert_eq!(err, Some((String::new(), "no code in this error".into())), "{tags:?}");
            assert_eq!(tags.last(), Some(&be::READY_FOR_QUERY));
        }

        // A message sent while idle never reaches a client: that connection is closed.
        let db = Evil::UnpromptedWhileIdle.db();
        let mut c = client_of(&h, &db).await.expect("login");
        let pool = h.weir().shared().pools.get(&db, SCRAM_USER).unwrap();
        for _ in 0..3 {
            let (tags, err) = query(&mut c, "select 1").await;
            assert_eq!((tags, err), (vec![be::COMMAND_COMPLETE, be::READY_FOR_QUERY], None));
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let mut probe = [0u8; 1];
        let stray = tokio::time::timeout(Duration::from_millis(700), c.s.peek(&mut probe)).await;
        assert!(stray.is_err(), "nothing unprompted reached the client");
        let closed = weir_e2e::eventually(weir_e2e::WAIT_LIMIT, || pool.metrics.closed(CloseReason::ServerClosed) >= 2);
        assert!(closed.await, "each stray-talking connection was closed");

        before.unharmed(&h).await;
    })
    .await
}

/// A "server" that accepts TLS with `S` and, in the same write, injects a
/// plaintext AuthenticationOk … ReadyForQuery (CVE-2021-23222's class: bytes
/// buffered before the handshake). Then it waits for weir to hang up.
async fn injecting_server() -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut s, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut request = [0u8; 8];
                if tokio::io::AsyncReadExt::read_exact(&mut s, &mut request).await.is_err() {
                    return;
                }
                let mut out = BytesMut::from(&b"S"[..]);
                greet(&mut out);
                let _ = s.write_all(&out).await;
                let mut sink = [0u8; 1024];
                while matches!(tokio::io::AsyncReadExt::read(&mut s, &mut sink).await, Ok(n) if n > 0) {}
            });
        }
    });
    addr
}

/// weir asks for TLS (server_tls_sslmode = prefer); the injected plaintext
/// after `S` goes to rustls as TLS records and fails the handshake: the
/// connection is never used, its clients get 08001 naming TLS, and the real
/// database (whose Postgres answers `N`) keeps working.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn plaintext_injected_after_the_servers_tls_yes_is_refused() {
    bounded(60, async {
        let addr = injecting_server().await;
        let opts = Opts {
            auth_type: "trust",
            general: "server_tls_sslmode = \"prefer\"\nquery_wait_timeout = \"3s\"".into(),
            database: format!("\n[databases.injected]\nhost = \"127.0.0.1\"\nport = {}\n", addr.port()),
            ..Default::default()
        };
        let h = Harness::start(opts).await;
        let before = Before::take(&h).await;
        let e = client_of(&h, "injected").await.err().expect("no login over an injected plaintext stream");
        let Outcome::Fatal(code, message) = &e else { panic!("expected an error: {e:?}") };
        assert_eq!(code, "08001", "{message}");
        assert!(message.contains("TLS"), "says TLS failed: {message}");
        let pool = h.weir().shared().pools.get("injected", SCRAM_USER).unwrap();
        assert_eq!(pool.metrics.opened(), 0, "no connection to the injecting server was ever opened");
        before.unharmed(&h).await;
    })
    .await
}
