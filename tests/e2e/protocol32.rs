//! Protocol version negotiation and protocol 3.2 over raw sockets:
//! NegotiateProtocolVersion compared byte for byte with what Postgres sends
//! for 3.0, 3.1, 3.2 and 3.9999, with and without `_pq_.` options; a 3.2
//! client's long cancel key, minted by weir, cancelling a running query in
//! both pool modes whatever protocol the server speaks; session mode still
//! showing the server's own pid.

use std::net::SocketAddr;
use std::time::Duration;

use weir::protocol::messages;
use weir::protocol::tags::{backend as be, startup as code};
use weir_e2e::raw::{startup_v, Raw};
use weir_e2e::{bounded, Harness, Opts, APP_DB, SCRAM_USER, TRUST_USER};

const LIMIT: Duration = Duration::from_secs(10);

/// `_pq_.` options as libpq 19's grease sends an unknown one, plus another.
const OPTIONS: [(&str, &str); 2] = [("_pq_.test_protocol_negotiation", "on"), ("_pq_.weir_unknown", "1")];

/// What Postgres 18 sends before its first authentication request, for each
/// requested minor version, without and with `OPTIONS` (hex of the whole
/// NegotiateProtocolVersion message, or empty when it sends none). Recorded
/// from Postgres 18.6; checked against the running Postgres when it is 18.
fn postgres_18(minor: i32, with_options: bool) -> Vec<u8> {
    let newest = minor.min(2);
    if minor <= 2 && !with_options {
        return Vec::new();
    }
    let names: &[&str] = if with_options { &[OPTIONS[0].0, OPTIONS[1].0] } else { &[] };
    let mut out = bytes::BytesMut::new();
    messages::negotiate_protocol_version(&mut out, (3 << 16) | newest, names);
    out.to_vec()
}

/// The bytes a server sends before its first authentication request (or
/// error), for a startup of 3.`minor` as `user`.
async fn before_auth(addr: SocketAddr, user: &str, minor: i32, with_options: bool) -> Vec<u8> {
    let mut params = vec![("user", user), ("database", APP_DB)];
    if with_options {
        params.extend_from_slice(&OPTIONS);
    }
    let mut c = Raw::connect(addr).await.with_limit(LIMIT);
    c.send(&startup_v(3, minor, &params)).await.unwrap();
    let mut seen = Vec::new();
    loop {
        let (tag, body) = c.next().await.expect("an answer before EOF");
        if tag == be::AUTHENTICATION || tag == be::ERROR_RESPONSE {
            return seen;
        }
        seen.push(tag);
        seen.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        seen.extend_from_slice(&body);
    }
}

fn server_version_num(h: &Harness) -> u32 {
    h.psql("show server_version_num").trim().parse().expect("server_version_num")
}

/// weir answers each requested version as Postgres 18 does, byte for byte;
/// the running Postgres agrees wherever its own newest version does not
/// matter (all of it on Postgres 18; 3.0 on older ones, which otherwise
/// differ only in offering 3.0 as their newest, in the same encoding).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negotiation_matches_postgres_byte_for_byte() {
    bounded(90, async {
        let h = Harness::start(Opts { auth_type: "trust", ..Opts::default() }).await;
        let pg_addr: SocketAddr = format!("127.0.0.1:{}", h.pg.port()).parse().unwrap();
        let version = server_version_num(&h);
        for minor in [0, 1, 2, 9999] {
            for with_options in [false, true] {
                let case = format!("3.{minor}, options {with_options}, Postgres {version}");
                let expected = postgres_18(minor, with_options);
                let weir = before_auth(h.addr(), TRUST_USER, minor, with_options).await;
                let postgres = before_auth(pg_addr, TRUST_USER, minor, with_options).await;
                assert_eq!(weir, expected, "weir, {case}");
                if version >= 180_000 || minor == 0 {
                    assert_eq!(weir, postgres, "weir and Postgres, {case}");
                } else if !expected.is_empty() {
                    // Postgres before 18: the same message offering 3.0.
                    let mut older = expected.clone();
                    older[5..9].copy_from_slice(&code::PROTOCOL_3_0.to_be_bytes());
                    let older = if minor > 2 || with_options { older } else { Vec::new() };
                    assert_eq!(postgres, older, "Postgres, {case}");
                }
            }
        }
    })
    .await
}

/// NegotiateProtocolVersion comes before the authentication request, as
/// from Postgres, when the client must authenticate (here SCRAM).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn negotiation_comes_before_authentication() {
    bounded(60, async {
        let h = Harness::start(Opts { auth_type: "scram-sha-256", ..Opts::default() }).await;
        let mut params = vec![("user", SCRAM_USER), ("database", APP_DB)];
        params.extend_from_slice(&OPTIONS);
        let mut c = Raw::connect(h.addr()).await.with_limit(LIMIT);
        c.send(&startup_v(3, 9999, &params)).await.unwrap();
        let (tag, body) = c.next().await.unwrap();
        assert_eq!(tag, be::NEGOTIATE_PROTOCOL_VERSION);
        assert_eq!(&body[..8], &[0, 3, 0, 2, 0, 0, 0, 2], "3.2, two options");
        let (code, _) = c.auth_request().await;
        assert_eq!(code, weir::protocol::tags::auth::SASL, "then the SASL request");
    })
    .await
}

/// Logs in with protocol 3.2 (trust); returns the connection and
/// BackendKeyData's pid and key.
async fn login_3_2(addr: SocketAddr, user: &str) -> (Raw, (i32, Vec<u8>)) {
    let mut c = Raw::connect(addr).await.with_limit(LIMIT);
    c.send(&startup_v(3, 2, &[("user", user), ("database", APP_DB)])).await.unwrap();
    let mut key = None;
    loop {
        let (tag, body) = c.next().await.expect("login answer");
        match tag {
            be::NEGOTIATE_PROTOCOL_VERSION => panic!("3.2 needs no negotiation"),
            be::AUTHENTICATION => assert_eq!(&body[..4], &[0, 0, 0, 0], "trust: AuthenticationOk"),
            be::BACKEND_KEY_DATA => key = Some((i32::from_be_bytes(body[..4].try_into().unwrap()), body[4..].to_vec())),
            be::ERROR_RESPONSE => panic!("login refused: {:?}", messages::parse_error_fields(&body)),
            be::READY_FOR_QUERY => return (c, key.expect("BackendKeyData")),
            _ => {}
        }
    }
}

/// Sends a CancelRequest with `key` on a new socket and waits for the close.
async fn cancel(addr: SocketAddr, pid: i32, key: &[u8]) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::net::TcpStream::connect(addr).await.unwrap();
    s.write_all(&messages::cancel_request_with_key(pid, key)).await.unwrap();
    let mut sink = [0u8; 16];
    let n = tokio::time::timeout(LIMIT, s.read(&mut sink)).await.expect("closed in time").unwrap_or(0);
    assert_eq!(n, 0, "a CancelRequest gets no answer");
}

/// A 3.2 client gets a 32-byte key minted by weir; a CancelRequest with it
/// cancels the running query (weir forwards the server's own key), one with
/// its first 4 bytes does not. In session mode the pid is the server's.
async fn long_key_cancels(mode: &'static str) {
    let h = Harness::start(Opts { auth_type: "trust", pool_mode: mode, ..Opts::default() }).await;
    let (mut c, (pid, key)) = login_3_2(h.addr(), TRUST_USER).await;
    assert_eq!(key.len(), 32, "{mode}: a 3.2 key is 32 bytes");
    let backend: i32 = c.query_one("select pg_backend_pid()").await.parse().unwrap();
    if mode == "session" {
        assert_eq!(pid, backend, "session mode: BackendKeyData carries the server's pid");
    }
    c.send(&weir_e2e::raw::query("select pg_sleep(20)")).await.unwrap();
    let running = "select count(*) from pg_stat_activity where query = 'select pg_sleep(20)' and state = 'active'";
    h.until_running("select pg_sleep(20)").await;
    cancel(h.addr(), pid, &key[..4]).await;
    cancel(h.addr(), pid, &[key.as_slice(), &[0; 4]].concat()).await;
    // A window in which a wrongly keyed cancel must not land.
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert_eq!(h.psql(running).trim(), "1", "{mode}: a wrong key cancels nothing");
    cancel(h.addr(), pid, &key).await;
    let reply = c.reply().await.unwrap();
    assert_eq!(reply.code(), Some("57014"), "{mode}: {reply:?}");
    assert_eq!(c.query_one("select 'after'").await, "after");
    // A 3.0 client on the same weir still gets a 4-byte key.
    let mut old = Raw::connect(h.addr()).await.with_limit(LIMIT);
    old.send(&weir_e2e::raw::startup(&[("user", TRUST_USER), ("database", APP_DB)])).await.unwrap();
    let mut key_len = None;
    loop {
        let (tag, body) = old.next().await.unwrap();
        if tag == be::BACKEND_KEY_DATA {
            key_len = Some(body.len() - 4);
        }
        if tag == be::READY_FOR_QUERY {
            break;
        }
    }
    assert_eq!(key_len, Some(4), "{mode}: a 3.0 client's key");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_key_cancels_in_transaction_mode() {
    bounded(90, long_key_cancels("transaction")).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_key_cancels_in_session_mode() {
    bounded(90, long_key_cancels("session")).await
}

/// weir asks its servers for 3.2 and takes what they offer; a server that
/// does not negotiate at all (Debian's PgBouncer 1.18 answers "bad packet
/// header") is asked for 3.0 from then on, so a 3.2 client still works
/// behind weir in front of it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_that_does_not_negotiate_gets_3_0() {
    bounded(90, async {
        let h = Harness::start(Opts { auth_type: "trust", ..Opts::default() }).await;
        let bouncer = weir_e2e::pgbouncer::PgBouncer::start(h.pg.port(), TRUST_USER).expect("start pgbouncer");
        let dir = h.dir.join("behind-pgbouncer");
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("userlist.txt"), format!("\"{TRUST_USER}\" \"\"\n")).unwrap();
        let text = format!(
            "[weir]\nlisten_addr = \"127.0.0.1:0\"\nauth_type = \"trust\"\nauth_file = \"userlist.txt\"\n\
             [databases.app]\nhost = \"127.0.0.1\"\nport = {}\n",
            bouncer.port
        );
        let weir = weir::Weir::start(weir::Config::from_toml(&text, &dir).unwrap()).await.expect("start weir");
        for _ in 0..2 {
            let (mut c, (_, key)) = login_3_2(weir.local_addr(), TRUST_USER).await;
            assert_eq!(key.len(), 32, "the client's key is weir's, whatever the server's");
            assert_eq!(c.query_one("select 'through pgbouncer'").await, "through pgbouncer");
        }
        assert_eq!(
            bouncer.log().matches("closing because: bad packet header").count(),
            1,
            "3.2 asked for once: {}",
            bouncer.log()
        );
    })
    .await
}
