//! Users whose auth_file entry holds no plaintext password: SCRAM
//! pass-through (a `SCRAM-SHA-256$...` verifier: weir logs in to Postgres
//! with the ClientKey the client proved) and md5 pass-through (an `md5...`
//! hash answers Postgres's md5 challenge). Against a real Postgres whose
//! pg_hba asks scram_user for scram-sha-256 and md5_user for md5.

mod support;

use std::sync::Arc;
use std::time::Duration;

use support::*;
use weir::auth::UserList;

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
