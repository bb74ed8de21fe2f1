//! Users whose password weir never sees in plain text: auth_file entries
//! holding a verifier (SCRAM pass-through: weir logs in to Postgres with the
//! ClientKey the client proved; md5 pass-through: the stored hash answers
//! Postgres's md5 challenge), and users that exist only in Postgres, looked
//! up with auth_query. Against a real Postgres whose pg_hba asks md5_user
//! for md5 and every other password user for scram-sha-256.

use std::sync::Arc;
use std::time::Duration;

use weir::auth::UserList;
use weir_e2e::*;

const LIMIT: Duration = Duration::from_secs(20);

/// Replaces weir's auth_file contents with `text`.
fn set_users(h: &Harness, text: &str) {
    h.weir().shared().users.store(Arc::new(UserList::parse(text).expect("valid userlist")));
}

/// What Postgres stores for `role` (a SCRAM verifier or an md5 hash).
fn stored_secret(h: &Harness, role: &str) -> String {
    h.psql(&format!("select rolpassword from pg_authid where rolname = '{role}'")).trim().to_owned()
}

async fn select_one(url: &str) -> Result<i32, tokio_postgres::Error> {
    let c = tokio::time::timeout(LIMIT, connect(url)).await.expect("connect in time")?;
    let row = tokio::time::timeout(LIMIT, c.query_one("select 1", &[])).await.expect("query in time")?;
    Ok(row.get(0))
}

#[tokio::test]
async fn scram_verifier_in_auth_file_passes_through_to_postgres() {
    let h = Harness::start(Opts { auth_type: "scram-sha-256", ..Opts::default() }).await;
    let verifier = stored_secret(&h, SCRAM_USER);
    assert!(verifier.starts_with("SCRAM-SHA-256$"), "{verifier}");
    set_users(&h, &format!("\"{SCRAM_USER}\" \"{verifier}\"\n"));

    assert_eq!(select_one(&h.url(SCRAM_USER, SCRAM_PASS)).await.expect("pass-through login"), 1);
    let pids = h.server_pids(SCRAM_USER);
    assert!(!pids.is_empty(), "weir logged in to Postgres as scram_user");

    let e = select_one(&h.url(SCRAM_USER, "wrong")).await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("28P01"), "{e}");
    // A second client reuses the pool (and its keys) and works.
    assert_eq!(select_one(&h.url(SCRAM_USER, SCRAM_PASS)).await.unwrap(), 1);
}

#[tokio::test]
async fn stale_scram_verifier_is_a_clear_auth_failure() {
    let h = Harness::start(Opts { auth_type: "scram-sha-256", ..Opts::default() }).await;
    let old = stored_secret(&h, SCRAM_USER);
    set_users(&h, &format!("\"{SCRAM_USER}\" \"{old}\"\n"));
    // The password changes in Postgres; the auth_file keeps the old verifier.
    h.psql(&format!("alter role {SCRAM_USER} password 'changed_pass'"));
    let e = select_one(&h.url(SCRAM_USER, SCRAM_PASS)).await.unwrap_err();
    let code = sqlstate(&e);
    assert!(matches!(code.as_deref(), Some("28P01") | Some("28000")), "{e}");
    let msg = e.as_db_error().map(|d| d.message().to_owned()).unwrap_or_default();
    assert!(msg.contains("verifier"), "says why: {msg}");
}

#[tokio::test]
async fn md5_hash_in_auth_file_passes_through_to_postgres() {
    let h = Harness::start(Opts { auth_type: "md5", ..Opts::default() }).await;
    let hash = stored_secret(&h, MD5_USER);
    assert!(hash.starts_with("md5"), "{hash}");
    set_users(&h, &format!("\"{MD5_USER}\" \"{hash}\"\n"));

    assert_eq!(select_one(&h.url(MD5_USER, MD5_PASS)).await.expect("md5 pass-through login"), 1);
    assert!(!h.server_pids(MD5_USER).is_empty());
    let e = select_one(&h.url(MD5_USER, "wrong")).await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("28P01"), "{e}");
}

/// A superuser weir runs auth_query as; in the auth_file with its password.
const AUTH_USER: &str = "weir_auth";
const AUTH_PASS: &str = "weir_auth_pass";

/// weir with auth_query on (cache TTL `ttl`), and an auth_file holding only
/// the auth_user: every other user is looked up in Postgres.
async fn with_auth_query(auth_type: &'static str, ttl: &str) -> Harness {
    let general = format!("auth_user = \"{AUTH_USER}\"\nauth_query_cache_ttl = \"{ttl}\"\n");
    let h = Harness::start(Opts { auth_type, general, ..Opts::default() }).await;
    h.psql(&format!("create role {AUTH_USER} superuser login password '{AUTH_PASS}'"));
    set_users(&h, &format!("\"{AUTH_USER}\" \"{AUTH_PASS}\"\n"));
    h
}

fn assert_auth_failure(e: &tokio_postgres::Error) {
    let code = sqlstate(e);
    assert!(matches!(code.as_deref(), Some("28P01") | Some("28000")), "auth failure expected: {e:?}");
}

#[tokio::test]
async fn scram_user_only_in_postgres_logs_in_through_auth_query() {
    let h = with_auth_query("scram-sha-256", "30s").await;
    h.psql("create role aq_user login password 'aq_pass'");
    assert_eq!(select_one(&h.url("aq_user", "aq_pass")).await.expect("auth_query login"), 1);
    assert!(!h.server_pids("aq_user").is_empty(), "logged in to Postgres by SCRAM pass-through");
    let e = select_one(&h.url("aq_user", "wrong")).await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("28P01"), "{e}");
    let e = select_one(&h.url("no_such_user", "aq_pass")).await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("28P01"), "unknown users fail like a wrong password: {e}");
    // A role without a password: no verifier, refused alike.
    h.psql("create role aq_nopass login");
    let e = select_one(&h.url("aq_nopass", "")).await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("28P01"), "{e}");
}

#[tokio::test]
async fn md5_user_only_in_postgres_logs_in_through_auth_query() {
    let h = with_auth_query("md5", "30s").await;
    // md5_user's pg_hba method is md5 and Postgres stores an md5 hash.
    assert_eq!(select_one(&h.url(MD5_USER, MD5_PASS)).await.expect("md5 via auth_query"), 1);
    assert!(!h.server_pids(MD5_USER).is_empty(), "logged in to Postgres with the md5 hash");
    let e = select_one(&h.url(MD5_USER, "wrong")).await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("28P01"), "{e}");
    // With auth_type md5, a SCRAM verifier makes weir ask for SCRAM.
    assert_eq!(select_one(&h.url(SCRAM_USER, SCRAM_PASS)).await.expect("scram via auth_query"), 1);
}

#[tokio::test]
async fn expired_user_is_an_auth_failure() {
    let h = with_auth_query("scram-sha-256", "30s").await;
    h.psql("create role aq_expired login password 'exp_pass' valid until '2000-01-01'");
    let e = select_one(&h.url("aq_expired", "exp_pass")).await.unwrap_err();
    assert_auth_failure(&e);
    let msg = e.as_db_error().map(|d| d.message().to_owned()).unwrap_or_default();
    assert!(msg.contains("expired"), "says why Postgres refused: {msg}");
}

#[tokio::test]
async fn cached_verifier_is_reused_until_its_ttl() {
    // A TTL long enough that a loaded machine's logins and psql calls stay
    // within it.
    let h = with_auth_query("scram-sha-256", "6s").await;
    h.psql("create role aq_cache login password 'old_pass'");
    assert_eq!(select_one(&h.url("aq_cache", "old_pass")).await.unwrap(), 1);
    h.psql("alter role aq_cache password 'new_pass'");
    // Within the TTL weir still holds the old verifier (and an idle server
    // connection logged in before the change).
    assert_eq!(select_one(&h.url("aq_cache", "old_pass")).await.expect("cached verifier"), 1);
    let e = select_one(&h.url("aq_cache", "new_pass")).await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("28P01"), "{e}");
    tokio::time::sleep(Duration::from_millis(6500)).await;
    assert_eq!(select_one(&h.url("aq_cache", "new_pass")).await.expect("new verifier after the TTL"), 1);
    let e = select_one(&h.url("aq_cache", "old_pass")).await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("28P01"), "{e}");
}

#[tokio::test]
async fn user_names_are_bound_as_parameters_never_interpolated() {
    let h = with_auth_query("scram-sha-256", "30s").await;
    h.psql("create role aq_user login password 'aq_pass'");
    // Interpolated into the query, these names would find aq_user's verifier
    // (or any role's), and aq_pass would pass weir's check.
    for injected in ["aq_user' --", "x' or usename = 'aq_user", "%"] {
        let mut c = tokio_postgres::Config::new();
        c.host("127.0.0.1").port(h.addr().port()).user(injected).password("aq_pass").dbname(APP_DB);
        let e = tokio::time::timeout(LIMIT, c.connect(tokio_postgres::NoTls)).await.expect("in time");
        let Err(e) = e else { panic!("{injected}: logged in") };
        assert_eq!(sqlstate(&e).as_deref(), Some("28P01"), "{injected}: {e}");
        let msg = e.as_db_error().map(|d| d.message().to_owned()).unwrap_or_default();
        // weir's own SCRAM check, in PgBouncer's words (Postgres would name the user).
        assert_eq!(msg, "SASL authentication failed", "refused by weir's own check");
    }
}

/// An auth_user not in the auth_file logs in with no password (PgBouncer's
/// rule); where Postgres asks it for one, the client's refusal says so.
/// (tests/e2e/dropin.rs has the trusted case.)
#[tokio::test]
async fn auth_user_missing_from_auth_file_logs_in_without_a_password() {
    let h = with_auth_query("scram-sha-256", "30s").await;
    set_users(&h, "\"someone_else\" \"pw\"\n");
    h.psql("create role aq_orphan login password 'pw'");
    let e = select_one(&h.url("aq_orphan", "pw")).await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("28000"), "{e}");
    let msg = e.as_db_error().map(|d| d.message().to_owned()).unwrap_or_default();
    assert!(msg.contains("auth_user") && msg.contains(AUTH_USER), "{msg}");
    assert!(msg.contains("asked for a password but none is configured"), "{msg}");
}

/// Postgres refuses the auth_user's own login (here: the database is
/// missing): the client gets Postgres's SQLSTATE and words, not a password
/// prompt, and learns whose login it was.
#[tokio::test]
async fn auth_user_login_refused_by_postgres_reaches_the_client_as_postgres_said() {
    let general = format!("auth_user = \"{AUTH_USER}\"\n");
    let database = "dbname = \"no_such_pg_db\"\n".to_owned();
    let h = Harness::start(Opts { auth_type: "md5", general, database, ..Opts::default() }).await;
    h.psql(&format!("create role {AUTH_USER} superuser login password '{AUTH_PASS}'"));
    set_users(&h, &format!("\"{AUTH_USER}\" \"{AUTH_PASS}\"\n"));
    let e = select_one(&h.url("aq_unknown", "pw")).await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("3D000"), "{e}");
    let msg = e.as_db_error().map(|d| d.message().to_owned()).unwrap_or_default();
    assert!(msg.contains("database \"no_such_pg_db\" does not exist"), "{msg}");
    assert!(msg.contains(AUTH_USER), "names the auth_user: {msg}");
}

/// CVE-2025-12819's class: a client's startup `search_path` must never reach
/// the auth_query connection. Here a schema shadows pg_shadow with a row
/// holding the attacker's password hash for a real role; were the client's
/// search_path applied before authentication, that password would pass.
#[tokio::test]
async fn startup_search_path_never_reaches_auth_query() {
    let h = with_auth_query("md5", "30s").await;
    h.psql("create role aq_victim login password 'real_pass'");
    let fake = h.psql("select 'md5' || md5('attacker' || 'aq_victim')").trim().to_owned();
    h.psql(&format!(
        "create schema evil; create view evil.pg_shadow as select 'aq_victim'::name as usename, '{fake}'::text as passwd; \
         grant usage on schema evil to public; grant select on evil.pg_shadow to public"
    ));
    let shadowed =
        h.psql("set search_path = evil, pg_catalog; select passwd from pg_shadow where usename = 'aq_victim'");
    assert_eq!(
        shadowed.lines().last().map(str::trim),
        Some(fake.as_str()),
        "the shadowing view works when search_path is applied"
    );

    let evil = format!("{}?options=-c%20search_path%3Devil%2Cpg_catalog", h.url("aq_victim", "attacker"));
    let e = select_one(&evil).await.unwrap_err();
    assert_eq!(sqlstate(&e).as_deref(), Some("28P01"), "{e}");
    let honest = format!("{}?options=-c%20search_path%3Devil%2Cpg_catalog", h.url("aq_victim", "real_pass"));
    assert_eq!(select_one(&honest).await.expect("the real password with the same search_path"), 1);
}
