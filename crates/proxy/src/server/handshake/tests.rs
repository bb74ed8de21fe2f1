//! The handshake against scripted servers: each authentication method,
//! protocol negotiation, and the refusals.

use super::*;
use crate::auth::{ScramSecret, ScramServer};
use crate::protocol::startup::{self, StartupPacket};
use crate::protocol::tags::startup as startup_code;
use bytes::BufMut;
use tokio::io::DuplexStream;

/// A scripted server: reads the startup packet, then runs `script`.
async fn run<F, Fut>(p: LoginParams<'_>, script: F) -> Result<LoginResult, LoginError>
where
    F: FnOnce(DuplexStream, BytesMut, Vec<(String, String)>) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let (mut c, mut s) = tokio::io::duplex(1 << 16);
    let server = async move {
        let mut buf = BytesMut::new();
        let packet = wire::read_startup_packet(&mut s, &mut buf).await.unwrap();
        let StartupPacket::Startup { params, .. } = startup::parse(&packet).unwrap() else { panic!("not a startup") };
        let params = params.into_iter().map(|(k, v)| (k.to_owned(), v.to_owned())).collect();
        script(s, buf, params).await;
    };
    let client = async move {
        let mut buf = BytesMut::new();
        login(&mut c, &mut buf, &p).await
    };
    tokio::join!(client, server).0
}

async fn write(s: &mut DuplexStream, build: impl FnOnce(&mut BytesMut)) {
    let mut out = BytesMut::new();
    build(&mut out);
    s.write_all(&out).await.unwrap();
}

fn ready(out: &mut BytesMut) {
    messages::authentication(out, tags::auth::OK, &[]);
    messages::parameter_status(out, "server_version", "17.0");
    messages::error_response(out, messages::Severity::Notice, sqlstate::INTERNAL_ERROR, "hello");
    messages::parameter_status(out, "client_encoding", "UTF8");
    messages::backend_key_data(out, 4242, -7);
    messages::ready_for_query(out, tags::status::IDLE);
}

fn params<'a>(password: Option<&'a str>, extra: &'a [(String, String)]) -> LoginParams<'a> {
    let credentials: &'static Credentials = match password {
        None => &Credentials::None,
        Some(p) => Box::leak(Box::new(Credentials::Password(p.to_owned()))),
    };
    LoginParams { user: "alice", credentials, database: "db", startup_params: extra, minor: 0 }
}

fn expect_ready(r: Result<LoginResult, LoginError>) {
    let r = r.unwrap();
    assert_eq!(r.backend_pid, 4242);
    assert_eq!(r.backend_key, (-7i32).to_be_bytes());
    let want = [("server_version", "17.0"), ("client_encoding", "UTF8")];
    assert_eq!(r.server_params, want.map(|(k, v)| (k.to_owned(), v.to_owned())));
}

async fn read_password(s: &mut DuplexStream, buf: &mut BytesMut) -> Vec<u8> {
    let f = wire::read_frame(s, buf, 1 << 16).await.unwrap();
    assert_eq!(f.tag, tags::frontend::PASSWORD);
    f.body().to_vec()
}

#[tokio::test]
async fn trust_collects_params_key_and_ready() {
    let extra = [("application_name".to_owned(), "app".to_owned())];
    let r = run(params(None, &extra), |mut s, _, startup| async move {
        let want = [("user", "alice"), ("database", "db"), ("application_name", "app")];
        assert_eq!(startup, want.map(|(k, v)| (k.to_owned(), v.to_owned())));
        write(&mut s, ready).await;
    })
    .await;
    expect_ready(r);
}

#[tokio::test]
async fn protocol_3_2_takes_what_the_server_offers_and_keeps_a_long_key() {
    let p = LoginParams { minor: 2, ..params(None, &[]) };
    // A server of 3.2: no negotiation, a 32-byte key.
    let r = run(p, |mut s, _, _| async move {
        write(&mut s, |o| {
            messages::authentication(o, tags::auth::OK, &[]);
            messages::backend_key(o, 7, &[9; 32]);
            messages::ready_for_query(o, tags::status::IDLE);
        })
        .await;
    })
    .await
    .unwrap();
    assert_eq!((r.minor, r.backend_pid, r.backend_key), (2, 7, vec![9; 32]));
    // A server of 3.0 offers 3.0 first (Postgres 15 lists no options: weir sends none).
    let r = run(p, |mut s, _, _| async move {
        write(&mut s, |o| {
            messages::negotiate_protocol_version(o, startup_code::PROTOCOL_3_0, &[]);
            ready(o);
        })
        .await;
    })
    .await;
    assert_eq!(r.as_ref().map(|r| r.minor).ok(), Some(0));
    expect_ready(r);
    // An offer newer than asked for, or of another major version, is refused.
    for offered in [(3 << 16) | 3, 4 << 16] {
        let r = run(p, move |mut s, _, _| async move {
            write(&mut s, |o| messages::negotiate_protocol_version(o, offered, &[])).await;
        })
        .await;
        assert!(matches!(r, Err(LoginError::Protocol(_))), "{offered}: {r:?}");
    }
}

#[test]
fn a_server_that_does_not_negotiate_is_recognised() {
    let refused = |code: &str| LoginError::Server { code: code.into(), message: "bad packet header".into() };
    assert!(refused("08P01").refuses_version());
    assert!(refused("0A000").refuses_version());
    assert!(!refused("28P01").refuses_version());
    assert!(!LoginError::Eof.refuses_version());
}

#[tokio::test]
async fn md5_and_cleartext_send_the_right_password() {
    let r = run(params(Some("pw"), &[]), |mut s, mut buf, _| async move {
        write(&mut s, |o| messages::authentication(o, tags::auth::MD5_PASSWORD, &[1, 2, 3, 4])).await;
        let got = read_password(&mut s, &mut buf).await;
        let want = md5_hash(b"alice", b"pw", [1, 2, 3, 4]);
        assert_eq!(got, [want.as_bytes(), b"\0"].concat());
        write(&mut s, ready).await;
    })
    .await;
    expect_ready(r);
    let r = run(params(Some("pw"), &[]), |mut s, mut buf, _| async move {
        write(&mut s, |o| messages::authentication(o, tags::auth::CLEARTEXT_PASSWORD, &[])).await;
        assert_eq!(read_password(&mut s, &mut buf).await, b"pw\0");
        write(&mut s, ready).await;
    })
    .await;
    expect_ready(r);
}

#[tokio::test]
async fn scram_against_weirs_own_server() {
    let r = run(params(Some("pw"), &[]), |mut s, mut buf, _| async move {
        let mut server = ScramServer::new(ScramSecret::from_password("pw"));
        write(&mut s, |o| messages::authentication(o, tags::auth::SASL, b"SCRAM-SHA-256-PLUS\0SCRAM-SHA-256\0\0"))
            .await;
        let initial = read_password(&mut s, &mut buf).await;
        let client_first = &initial[b"SCRAM-SHA-256\0".len() + 4..];
        let first = server.handle_client_first(client_first).unwrap();
        write(&mut s, |o| messages::authentication(o, tags::auth::SASL_CONTINUE, first.as_bytes())).await;
        let ok = server.handle_client_final(&read_password(&mut s, &mut buf).await).unwrap();
        write(&mut s, |o| messages::authentication(o, tags::auth::SASL_FINAL, ok.server_final.as_bytes())).await;
        write(&mut s, ready).await;
    })
    .await;
    expect_ready(r);
}

/// A server that does not know the password: after the client-final it
/// sends a forged SASLFinal or skips straight to AuthenticationOk.
async fn impostor(mut s: DuplexStream, mut buf: BytesMut, forge_final: bool) {
    let mut server = ScramServer::new(ScramSecret::from_password("other"));
    write(&mut s, |o| messages::authentication(o, tags::auth::SASL, b"SCRAM-SHA-256\0\0")).await;
    let initial = read_password(&mut s, &mut buf).await;
    let first = server.handle_client_first(&initial[b"SCRAM-SHA-256\0".len() + 4..]).unwrap();
    write(&mut s, |o| messages::authentication(o, tags::auth::SASL_CONTINUE, first.as_bytes())).await;
    let _ = read_password(&mut s, &mut buf).await;
    if forge_final {
        let forged = b"v=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
        write(&mut s, |o| messages::authentication(o, tags::auth::SASL_FINAL, forged)).await;
    }
    write(&mut s, |o| messages::authentication(o, tags::auth::OK, &[])).await;
}

#[tokio::test]
async fn scram_rejects_forged_server_final_and_skipped_final() {
    for forge_final in [true, false] {
        let r = run(params(Some("pw"), &[]), |s, buf, _| impostor(s, buf, forge_final)).await;
        assert!(matches!(r, Err(LoginError::Protocol(_))), "{r:?}");
    }
}

#[tokio::test]
async fn error_response_without_sqlstate() {
    let r = run(params(Some("pw"), &[]), |mut s, _, _| async move {
        write(&mut s, |o| {
            o.put_u8(tags::backend::ERROR_RESPONSE);
            o.put_i32(4 + b"SFATAL\0Mboom\0\0".len() as i32);
            o.put_slice(b"SFATAL\0Mboom\0\0");
        })
        .await;
    })
    .await;
    let e = r.unwrap_err();
    assert!(matches!(&e, LoginError::Server { code, message } if code.is_empty() && message == "boom"), "{e:?}");
    assert_eq!(e.sqlstate(), sqlstate::CONNECTION_FAILURE);
    assert_eq!(e.server_code(), None);
    assert!(!e.is_auth_failure());
}

#[tokio::test]
async fn auth_failures_are_recognised() {
    let r = run(params(Some("pw"), &[]), |mut s, mut buf, _| async move {
        write(&mut s, |o| messages::authentication(o, tags::auth::CLEARTEXT_PASSWORD, &[])).await;
        let _ = read_password(&mut s, &mut buf).await;
        write(&mut s, |o| messages::error_response(o, messages::Severity::Fatal, sqlstate::INVALID_PASSWORD, "no"))
            .await;
    })
    .await;
    let e = r.unwrap_err();
    assert!(e.is_auth_failure());
    assert_eq!(e.sqlstate(), sqlstate::INVALID_PASSWORD);
    assert_eq!(e.server_code(), Some("28P01"));
    assert_eq!(e.client_message(), "no");

    let r = run(params(None, &[]), |mut s, _, _| async move {
        write(&mut s, |o| messages::authentication(o, tags::auth::MD5_PASSWORD, &[0; 4])).await;
    })
    .await;
    let e = r.unwrap_err();
    assert!(matches!(e, LoginError::NoPassword) && e.is_auth_failure(), "{e:?}");
}

#[tokio::test]
async fn md5_pass_through_and_credentials_that_cannot_serve_a_method() {
    let stored = crate::auth::md5::md5_hex_password("pw", "alice");
    let md5 = Credentials::Md5(stored);
    let p = LoginParams { user: "alice", credentials: &md5, database: "db", startup_params: &[], minor: 0 };
    let r = run(p, |mut s, mut buf, _| async move {
        write(&mut s, |o| messages::authentication(o, tags::auth::MD5_PASSWORD, &[1, 2, 3, 4])).await;
        let got = read_password(&mut s, &mut buf).await;
        let want = md5_hash(b"alice", b"pw", [1, 2, 3, 4]);
        assert_eq!(got, [want.as_bytes(), b"\0"].concat(), "same answer as with the password");
        write(&mut s, ready).await;
    })
    .await;
    expect_ready(r);
    // An md5 hash cannot do SCRAM or cleartext; it says so.
    for code in [tags::auth::CLEARTEXT_PASSWORD, tags::auth::SASL] {
        let p = LoginParams { user: "alice", credentials: &md5, database: "db", startup_params: &[], minor: 0 };
        let r = run(p, |mut s, _, _| async move {
            write(&mut s, |o| messages::authentication(o, code, b"SCRAM-SHA-256\0\0")).await;
        })
        .await;
        let e = r.unwrap_err();
        assert!(matches!(e, LoginError::WrongCredentials { held: "md5 hash", .. }) && e.is_auth_failure(), "{e:?}");
    }
}

/// AuthenticationGSS, which weir does not support.
const AUTH_GSS: i32 = 7;

#[tokio::test]
async fn unexpected_messages_and_eof_are_errors() {
    let r = run(params(Some("pw"), &[]), |mut s, _, _| async move {
        write(&mut s, |o| messages::authentication(o, AUTH_GSS, &[])).await;
    })
    .await;
    assert!(matches!(r, Err(LoginError::Protocol(_))), "{r:?}");
    let r = run(params(Some("pw"), &[]), |mut s, _, _| async move {
        write(&mut s, |o| messages::authentication(o, tags::auth::OK, &[])).await;
        write(&mut s, |o| messages::query(o, "x")).await;
    })
    .await;
    assert!(matches!(r, Err(LoginError::Protocol(_))), "{r:?}");
    let r = run(params(Some("pw"), &[]), |s, _, _| async move { drop(s) }).await;
    let e = r.unwrap_err();
    assert!(matches!(e, LoginError::Eof | LoginError::Io(_)), "{e:?}");
    assert_eq!(e.sqlstate(), sqlstate::CONNECTION_FAILURE);
}
