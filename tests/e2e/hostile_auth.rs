//! Raw input during authentication, SCRAM spoken by hand: garbage and
//! lying lengths in SASLInitialResponse, a wrong nonce, a proof that is not
//! base64 or not 32 bytes, a channel binding that does not match, a Query
//! where a password message belongs, an over-long password message, and the
//! md5 exchange's equivalents. Each is refused (08P01 for a malformed
//! exchange, 28P01 for a wrong proof, 28000 for an unknown mechanism) and no
//! server work is done for it.

use weir::protocol::tags::{auth, frontend as fe};
use weir_e2e::{bounded, Before, Harness, Opts, APP_DB, MD5_USER, SCRAM_USER};

use weir_e2e::raw::{header, startup, tagged, Outcome, Raw};

const MECHANISM: &[u8] = b"SCRAM-SHA-256\0";
/// 32 zero bytes in base64: a proof of the right shape that proves nothing.
const ZERO_PROOF: &str = "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA=";
const CLIENT_NONCE: &str = "hostile-client-nonce";

/// A SASLInitialResponse whose inner length is `len` (the true one when None).
fn sasl_initial(mechanism: &[u8], len: Option<i32>, data: &[u8]) -> Vec<u8> {
    let mut body = mechanism.to_vec();
    body.extend_from_slice(&len.unwrap_or(data.len() as i32).to_be_bytes());
    body.extend_from_slice(data);
    tagged(fe::PASSWORD, &body)
}

/// Connects as `user` and reads the first authentication request.
async fn asked(h: &Harness, user: &str) -> (Raw, i32) {
    let mut c = Raw::connect(h.addr()).await;
    c.send_anyway(&startup(&[("user", user), ("database", APP_DB)])).await;
    let (code, _) = c.auth_request().await;
    (c, code)
}

/// A SCRAM exchange up to the server-first-message; returns the combined nonce.
async fn at_client_final(h: &Harness) -> (Raw, String) {
    let (mut c, code) = asked(h, SCRAM_USER).await;
    assert_eq!(code, auth::SASL);
    c.send_anyway(&sasl_initial(MECHANISM, None, format!("n,,n=,r={CLIENT_NONCE}").as_bytes())).await;
    let (code, server_first) = c.auth_request().await;
    assert_eq!(code, auth::SASL_CONTINUE);
    let text = String::from_utf8(server_first.to_vec()).unwrap();
    let nonce = text.split(',').find_map(|a| a.strip_prefix("r=")).expect("server nonce").to_owned();
    assert!(nonce.starts_with(CLIENT_NONCE), "{text}");
    (c, nonce)
}

fn assert_fatal(what: &str, got: Outcome, want: &str) {
    assert_eq!(got.code(), want, "{what}: {got:?}");
}

/// Builds a client-final message from the server's nonce.
type MsgFromNonce = Box<dyn Fn(&str) -> Vec<u8>>;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scram_exchange_abuse() {
    bounded(120, async {
        let h = Harness::start(Opts { auth_type: "scram-sha-256", ..Default::default() }).await;
        let before = Before::take(&h).await;
        let servers_before = h.server_pids(SCRAM_USER);

        let first_cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("garbage client-first", sasl_initial(MECHANISM, None, b"garbage"), "08P01"),
            ("empty client-first", sasl_initial(MECHANISM, None, b""), "08P01"),
            ("inner length -1", sasl_initial(MECHANISM, Some(-1), b"n,,n=,r=abc"), "08P01"),
            ("inner length i32::MAX", sasl_initial(MECHANISM, Some(i32::MAX), b"n,,n=,r=abc"), "08P01"),
            ("inner length i32::MIN", sasl_initial(MECHANISM, Some(i32::MIN), b"n,,n=,r=abc"), "08P01"),
            ("inner length cut off", tagged(fe::PASSWORD, b"SCRAM-SHA-256\0\0\0"), "08P01"),
            ("mechanism without NUL", tagged(fe::PASSWORD, b"SCRAM-SHA-256"), "08P01"),
            ("nonce with a space", sasl_initial(MECHANISM, None, b"n,,n=,r=a b"), "08P01"),
            ("nonce not UTF-8", sasl_initial(MECHANISM, None, b"n,,n=,r=\xff\xfe"), "08P01"),
            ("channel binding asked for", sasl_initial(MECHANISM, None, b"p=tls-server-end-point,,n=,r=abc"), "08P01"),
            ("unknown mechanism", sasl_initial(b"SCRAM-SHA-1\0", None, b"n,,n=,r=abc"), "28000"),
            ("a Query instead of SASLInitialResponse", tagged(fe::QUERY, b"select 1\0"), "08P01"),
            ("password message over 10,000 bytes", header(fe::PASSWORD, 1 << 20), "08P01"),
            ("password message length -1", header(fe::PASSWORD, -1), "08P01"),
        ];
        for (what, bytes, want) in &first_cases {
            let (mut c, _) = asked(&h, SCRAM_USER).await;
            c.send_anyway(bytes).await;
            assert_fatal(what, c.outcome().await, want);
        }

        let final_cases: Vec<(&str, MsgFromNonce, &str)> = vec![
            ("wrong nonce", Box::new(|_: &str| final_msg("biws", "not-the-nonce", ZERO_PROOF)), "08P01"),
            ("nonce of the client alone", Box::new(|_: &str| final_msg("biws", CLIENT_NONCE, ZERO_PROOF)), "08P01"),
            ("proof not base64", Box::new(|n: &str| final_msg("biws", n, "@@@not*base64@@@")), "08P01"),
            ("proof of 3 bytes", Box::new(|n: &str| final_msg("biws", n, "AAAA")), "08P01"),
            ("channel binding mismatch", Box::new(|n: &str| final_msg("eSws", n, ZERO_PROOF)), "08P01"),
            ("no proof", Box::new(|n: &str| tagged(fe::PASSWORD, format!("c=biws,r={n}").as_bytes())), "08P01"),
            ("binary garbage", Box::new(|_: &str| tagged(fe::PASSWORD, &[0xff; 64])), "08P01"),
            ("wrong proof", Box::new(|n: &str| final_msg("biws", n, ZERO_PROOF)), "28P01"),
            ("a Query instead of client-final", Box::new(|_: &str| tagged(fe::QUERY, b"select 1\0")), "08P01"),
        ];
        for (what, build, want) in &final_cases {
            let (mut c, nonce) = at_client_final(&h).await;
            c.send_anyway(&build(&nonce)).await;
            assert_fatal(what, c.outcome().await, want);
        }

        // Leaving in the middle (Terminate or EOF) is closed without a word.
        let (mut c, _) = at_client_final(&h).await;
        c.send_anyway(&tagged(fe::TERMINATE, b"")).await;
        assert_eq!(c.outcome().await, Outcome::Closed, "Terminate mid-exchange");
        let (c, _) = asked(&h, SCRAM_USER).await;
        assert_eq!(c.eof_then_outcome().await, Outcome::Closed, "EOF mid-exchange");
        // An unknown user goes through the same exchange and fails the same way.
        let (mut c, code) = asked(&h, "no_such_user").await;
        assert_eq!(code, auth::SASL, "unknown users are asked like known ones");
        c.send_anyway(&sasl_initial(MECHANISM, None, b"n,,n=,r=abc")).await;
        let (code, _) = c.auth_request().await;
        assert_eq!(code, auth::SASL_CONTINUE);
        c.send_anyway(&final_msg("biws", "abc", ZERO_PROOF)).await;
        assert_fatal("unknown user, bad nonce", c.outcome().await, "08P01");

        assert_eq!(h.server_pids(SCRAM_USER), servers_before, "no server connection was opened for the failures");
        assert!(h.weir().shared().pools.get(APP_DB, "no_such_user").is_none(), "no pool for an unauthenticated user");
        before.unharmed(&h).await;
    })
    .await
}

/// CVE-2025-12819's class: startup parameters of a client that fails to
/// authenticate never reach Postgres (weir applies them with SET only after
/// authentication, on a server it already holds). Nothing opens, nothing runs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn startup_parameters_of_unauthenticated_clients_never_reach_postgres() {
    bounded(120, async {
        let h = Harness::start(Opts { auth_type: "scram-sha-256", ..Default::default() }).await;
        let before = Before::take(&h).await;
        let servers = h.server_pids(SCRAM_USER);
        let opened = h.pool().metrics.opened();
        let options =
            "options=-c%20search_path%3Devil_schema%20-c%20statement_timeout%3D1&application_name=hostile_app";
        for (user, password) in [(SCRAM_USER, "wrong"), ("no_such_user", "x")] {
            let url = format!("postgres://{user}:{password}@{}/{APP_DB}?{options}", h.addr());
            let e = weir_e2e::connect(&url).await.expect_err("wrong password");
            assert_eq!(weir_e2e::sqlstate(&e).as_deref(), Some("28P01"), "{user}: {e}");
        }
        let seen = h.psql("select count(*) from pg_stat_activity where application_name = 'hostile_app'");
        assert_eq!(seen.trim(), "0", "the parameters reached no backend");
        assert_eq!(h.server_pids(SCRAM_USER), servers, "no server connection opened or touched");
        assert_eq!(h.pool().metrics.opened(), opened);
        assert!(h.weir().shared().pools.get(APP_DB, "no_such_user").is_none(), "no pool for a failed login");
        let path = before.keeper.simple_query("show search_path").await.unwrap();
        let value = path.iter().find_map(|m| match m {
            tokio_postgres::SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        });
        assert_eq!(value.as_deref(), Some("\"$user\", public"), "the pool's servers kept their settings");
        before.unharmed(&h).await;
    })
    .await
}

fn final_msg(binding: &str, nonce: &str, proof: &str) -> Vec<u8> {
    tagged(fe::PASSWORD, format!("c={binding},r={nonce},p={proof}").as_bytes())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn md5_exchange_abuse() {
    bounded(120, async {
        let h = Harness::start(Opts { auth_type: "md5", ..Default::default() }).await;
        let before = Before::take(&h).await;
        let cases: Vec<(&str, Vec<u8>, &str)> = vec![
            ("a Query instead of the password", tagged(fe::QUERY, b"select 1\0"), "08P01"),
            ("password without NUL", tagged(fe::PASSWORD, b"md5abc"), "08P01"),
            ("bytes after the NUL", tagged(fe::PASSWORD, b"md5abc\0junk"), "08P01"),
            ("wrong hash", tagged(fe::PASSWORD, b"md500000000000000000000000000000000\0"), "28P01"),
            ("empty password", tagged(fe::PASSWORD, b"\0"), "28P01"),
            ("a Sync instead of the password", tagged(fe::SYNC, b""), "08P01"),
            ("password header claiming 2 GiB", header(fe::PASSWORD, i32::MAX), "08P01"),
        ];
        for (what, bytes, want) in &cases {
            let (mut c, code) = asked(&h, MD5_USER).await;
            assert_eq!(code, auth::MD5_PASSWORD, "{what}");
            c.send_anyway(bytes).await;
            assert_fatal(what, c.outcome().await, want);
        }
        before.unharmed(&h).await;
    })
    .await
}
