//! `authenticate` over in-memory sockets, with postgres-protocol as the client.

use bytes::BytesMut;
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use postgres_protocol::message::frontend;
use tokio::io::{AsyncReadExt, AsyncWriteExt, DuplexStream};

use super::*;

/// Reads one `R` message; returns its code and payload.
async fn read_auth(client: &mut DuplexStream, buf: &mut BytesMut) -> (i32, Vec<u8>) {
    let frame = wire::read_frame(client, buf, 1 << 16).await.unwrap();
    assert_eq!(frame.tag, tags::backend::AUTHENTICATION);
    let body = frame.body();
    (i32::from_be_bytes(body[..4].try_into().unwrap()), body[4..].to_vec())
}

async fn send(client: &mut DuplexStream, build: impl FnOnce(&mut BytesMut)) {
    let mut out = BytesMut::new();
    build(&mut out);
    client.write_all(&out).await.unwrap();
}

/// Runs `authenticate` against a scripted client; returns both outcomes.
async fn run<F, Fut, T>(
    method: AuthType,
    user: &str,
    secret: Option<Secret>,
    client: F,
) -> (Result<Authenticated, AuthError>, T)
where
    F: FnOnce(DuplexStream) -> Fut,
    Fut: std::future::Future<Output = T>,
{
    let (c, mut s) = tokio::io::duplex(1 << 16);
    let server = async move {
        let mut buf = BytesMut::new();
        authenticate(&mut s, &mut buf, method, user, secret.as_ref(), TrustNames::Listed).await
    };
    tokio::join!(server, client(c))
}

async fn md5_client(mut c: DuplexStream, user: &'static str, password: &'static str) {
    let mut buf = BytesMut::new();
    let (code, salt) = read_auth(&mut c, &mut buf).await;
    assert_eq!(code, tags::auth::MD5_PASSWORD);
    let hash = md5_hash(user.as_bytes(), password.as_bytes(), salt.try_into().unwrap());
    send(&mut c, |b| frontend::password_message(hash.as_bytes(), b).unwrap()).await;
}

/// A SCRAM client; returns whether it verified the server's final message.
async fn scram_client(mut c: DuplexStream, password: &'static str) -> bool {
    let mut buf = BytesMut::new();
    let (code, mechs) = read_auth(&mut c, &mut buf).await;
    assert_eq!(code, tags::auth::SASL);
    assert_eq!(mechs, b"SCRAM-SHA-256\0\0");
    let mut scram = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
    send(&mut c, |b| frontend::sasl_initial_response("SCRAM-SHA-256", scram.message(), b).unwrap()).await;
    let (code, server_first) = read_auth(&mut c, &mut buf).await;
    assert_eq!(code, tags::auth::SASL_CONTINUE);
    scram.update(&server_first).unwrap();
    send(&mut c, |b| frontend::sasl_response(scram.message(), b).unwrap()).await;
    match wire::read_frame(&mut c, &mut buf, 1 << 16).await {
        Ok(f) if f.tag == tags::backend::AUTHENTICATION => {
            assert_eq!(f.body()[..4], tags::auth::SASL_FINAL.to_be_bytes());
            scram.finish(&f.body()[4..]).is_ok()
        }
        _ => false,
    }
}

fn assert_wrong_password(r: Result<Authenticated, AuthError>, user: &str) {
    let e = r.unwrap_err();
    assert!(matches!(e, AuthError::WrongPassword { .. }), "{e:?}");
    assert_eq!(e.sqlstate(), sqlstate::INVALID_PASSWORD);
    assert_eq!(e.client_message(), "password authentication failed", "PgBouncer's words, for {user}");
}

fn assert_sasl_failed(r: Result<Authenticated, AuthError>) {
    let e = r.unwrap_err();
    assert!(matches!(e, AuthError::SaslFailed { .. }), "{e:?}");
    assert_eq!(e.sqlstate(), sqlstate::INVALID_PASSWORD);
    assert_eq!(e.client_message(), "SASL authentication failed");
}

#[tokio::test]
async fn trust_exchanges_nothing_and_admits_only_listed_names() {
    let (r, n) = run(AuthType::Trust, "u", Some(Secret::Plain(String::new())), |mut c| async move {
        let mut rest = Vec::new();
        c.read_to_end(&mut rest).await.unwrap();
        rest.len()
    })
    .await;
    assert_eq!(r.unwrap(), Authenticated::default());
    assert_eq!(n, 0);
    let (r, ()) = run(AuthType::Trust, "nosuchuser", None, |_| async {}).await;
    let e = r.unwrap_err();
    assert_eq!(e.client_message(), "\"trust\" authentication failed");
    assert_eq!(e.sqlstate(), sqlstate::INVALID_AUTHORIZATION_SPECIFICATION);
    let (c, mut s) = tokio::io::duplex(64);
    drop(c);
    let any_name = authenticate(&mut s, &mut BytesMut::new(), AuthType::Trust, "x", None, TrustNames::Any).await;
    assert!(any_name.is_ok(), "no auth_file: any name");
    let (r, ()) = run(AuthType::Any, "nosuchuser", None, |_| async {}).await;
    assert!(r.is_ok(), "any: any name");
}

async fn cleartext_client(mut c: DuplexStream, password: &'static str) {
    let mut buf = BytesMut::new();
    let (code, _) = read_auth(&mut c, &mut buf).await;
    assert_eq!(code, tags::auth::CLEARTEXT_PASSWORD);
    send(&mut c, |b| frontend::password_message(password.as_bytes(), b).unwrap()).await;
}

#[tokio::test]
async fn plain_checks_the_cleartext_password_against_every_secret_form() {
    let scram = Secret::Scram(ScramSecret::from_password("pw"));
    let md5 = Secret::Md5(md5::md5_hex_password("pw", "alice"));
    for secret in [Secret::Plain("pw".into()), md5, scram] {
        let (r, ()) = run(AuthType::Plain, "alice", Some(secret.clone()), |c| cleartext_client(c, "pw")).await;
        assert!(r.is_ok(), "{secret:?}: {r:?}");
        let (r, ()) = run(AuthType::Plain, "alice", Some(secret.clone()), |c| cleartext_client(c, "nope")).await;
        assert_wrong_password(r, "alice");
    }
    let (r, ()) = run(AuthType::Plain, "ghost", None, |c| cleartext_client(c, "pw")).await;
    assert_wrong_password(r, "ghost");
    let (r, ()) = run(AuthType::Plain, "alice", Some(Secret::Plain("pw".into())), |c| cleartext_client(c, "")).await;
    assert!(matches!(r, Err(AuthError::EmptyPassword)), "{r:?}");
}

#[tokio::test]
async fn md5_accepts_plain_and_md5_secrets() {
    let (r, ()) = run(AuthType::Md5, "alice", Some(Secret::Plain("pw".into())), |c| md5_client(c, "alice", "pw")).await;
    assert_eq!(r.unwrap().scram_client_key, None);
    let stored = Secret::Md5(md5::md5_hex_password("pw", "alice"));
    let (r, ()) = run(AuthType::Md5, "alice", Some(stored), |c| md5_client(c, "alice", "pw")).await;
    assert!(r.is_ok());
}

#[tokio::test]
async fn md5_wrong_password_and_unknown_user_fail_alike() {
    let (r, ()) =
        run(AuthType::Md5, "alice", Some(Secret::Plain("pw".into())), |c| md5_client(c, "alice", "nope")).await;
    assert_wrong_password(r, "alice");
    let (r, ()) = run(AuthType::Md5, "ghost", None, |c| md5_client(c, "ghost", "pw")).await;
    assert_wrong_password(r, "ghost");
}

#[tokio::test]
async fn md5_method_with_scram_secret_uses_scram() {
    let secret = Secret::Scram(ScramSecret::from_password("pw"));
    let (r, verified) = run(AuthType::Md5, "alice", Some(secret), |c| scram_client(c, "pw")).await;
    assert!(r.unwrap().scram_client_key.is_some());
    assert!(verified);
}

#[tokio::test]
async fn scram_accepts_plain_and_verifier_secrets() {
    let (r, verified) =
        run(AuthType::ScramSha256, "alice", Some(Secret::Plain("pw".into())), |c| scram_client(c, "pw")).await;
    assert!(r.unwrap().scram_client_key.is_some());
    assert!(verified);
    let verifier = Secret::parse(&postgres_protocol::password::scram_sha_256(b"pw")).unwrap();
    let Secret::Scram(v) = &verifier else { panic!("not a SCRAM verifier") };
    let stored_key = v.stored_key;
    let (r, verified) = run(AuthType::ScramSha256, "alice", Some(verifier), |c| scram_client(c, "pw")).await;
    let key = r.unwrap().scram_client_key.unwrap();
    assert_eq!(<[u8; 32]>::from(<sha2::Sha256 as sha2::Digest>::digest(key)), stored_key);
    assert!(verified);
}

#[tokio::test]
async fn scram_failures_say_sasl_authentication_failed() {
    let cases = [
        ("alice", Some(Secret::Plain("pw".into()))),
        ("alice", Some(Secret::Md5(md5::md5_hex_password("pw", "alice")))),
        ("alice", Some(Secret::Plain(String::new()))),
        ("ghost", None),
    ];
    for (user, secret) in cases {
        let (r, verified) = run(AuthType::ScramSha256, user, secret, |c| scram_client(c, "wrong")).await;
        assert_sasl_failed(r);
        assert!(!verified);
    }
}

#[tokio::test]
async fn non_password_message_is_a_protocol_violation() {
    let (r, ()) = run(AuthType::Md5, "alice", Some(Secret::Plain("pw".into())), |mut c| async move {
        send(&mut c, |b| frontend::query("select 1", b).unwrap()).await;
    })
    .await;
    let e = r.unwrap_err();
    assert!(matches!(e, AuthError::Protocol(_)), "{e:?}");
    assert_eq!(e.sqlstate(), sqlstate::PROTOCOL_VIOLATION);
}

#[tokio::test]
async fn oversized_and_eof_are_errors() {
    let (r, ()) = run(AuthType::Md5, "alice", None, |mut c| async move {
        let big = "x".repeat(MAX_AUTH_MESSAGE_LEN + 1);
        send(&mut c, |b| frontend::password_message(big.as_bytes(), b).unwrap()).await;
    })
    .await;
    assert!(matches!(r, Err(AuthError::Protocol(_))), "{r:?}");
    let (r, ()) = run(AuthType::ScramSha256, "alice", None, |c| async move { drop(c) }).await;
    assert!(matches!(r, Err(AuthError::Eof | AuthError::Io(_))), "{r:?}");
}

#[tokio::test]
async fn sasl_initial_response_is_checked() {
    let plain = || Some(Secret::Plain("pw".into()));
    let (r, ()) = run(AuthType::ScramSha256, "alice", plain(), |mut c| async move {
        send(&mut c, |b| frontend::sasl_initial_response("SCRAM-SHA-256-PLUS", b"p=x,,n=,r=abc", b).unwrap()).await;
    })
    .await;
    let e = r.unwrap_err();
    assert!(matches!(e, AuthError::UnsupportedMechanism), "{e:?}");
    assert_eq!(e.sqlstate(), sqlstate::INVALID_AUTHORIZATION_SPECIFICATION);

    // Declared length 100, but only 3 bytes follow.
    let (r, ()) = run(AuthType::ScramSha256, "alice", plain(), |mut c| async move {
        let mut body = b"SCRAM-SHA-256\0".to_vec();
        body.extend_from_slice(&100i32.to_be_bytes());
        body.extend_from_slice(b"abc");
        let mut msg = vec![tags::frontend::PASSWORD];
        msg.extend_from_slice(&(body.len() as i32 + 4).to_be_bytes());
        msg.extend_from_slice(&body);
        c.write_all(&msg).await.unwrap();
    })
    .await;
    assert!(matches!(r, Err(AuthError::Protocol(_))), "{r:?}");

    let (r, ()) = run(AuthType::ScramSha256, "alice", plain(), |mut c| async move {
        send(&mut c, |b| {
            frontend::sasl_initial_response("SCRAM-SHA-256", b"p=tls-server-end-point,,n=,r=abc", b).unwrap()
        })
        .await;
    })
    .await;
    let e = r.unwrap_err();
    assert!(e.client_message().contains("SCRAM-SHA-256-PLUS"), "{e:?}");
}

#[test]
fn parse_sasl_initial_response_never_panics() {
    for body in [
        &b""[..],
        b"SCRAM-SHA-256",
        b"SCRAM-SHA-256\0",
        b"SCRAM-SHA-256\0\xff\xff\xff\xff",
        b"SCRAM-SHA-256\0\0\0\0\x02a",
    ] {
        assert!(parse_sasl_initial_response(body).is_err());
    }
    assert_eq!(parse_sasl_initial_response(b"M\0\0\0\0\x01a").unwrap(), ("M", &b"a"[..]));
}
