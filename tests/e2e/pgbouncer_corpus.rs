//! The pgbouncer.ini corpus (`pgbouncer_corpus/*.ini`): files in the shapes
//! PgBouncer's docs, its example file and common Helm charts and operators
//! use. Each one must migrate (`weir migrate-config`), pass `weir
//! check-config`, and then serve a client through weir against the test
//! Postgres. Each file names the client to try in a comment:
//! `; corpus-client: user=U password=P dbname=D [expect_user=F]` (F: the
//! forced user the session must run as; default U). One Postgres for all
//! files; weir is started per file. `; corpus-setup: SQL` lines run on it
//! first (roles and databases a file's client needs), and
//! `; corpus-userlist: "user" "secret"` lines join the auth_file.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use weir_e2e::migrated::MigratedWeir;
use weir_e2e::*;

fn corpus() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("e2e/pgbouncer_corpus");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .expect("the corpus folder")
        .map(|e| e.expect("a corpus entry").path())
        .filter(|p| p.extension().is_some_and(|e| e == "ini"))
        .collect();
    files.sort();
    files
}

/// The `corpus-client` comment of an ini file.
fn client_of(ini: &Path) -> HashMap<String, String> {
    let text = std::fs::read_to_string(ini).unwrap();
    let line = text.lines().find_map(|l| l.split_once("corpus-client:")).map(|(_, rest)| rest.to_owned());
    let line = line.unwrap_or_else(|| panic!("{} has no corpus-client comment", ini.display()));
    line.split_whitespace().filter_map(|kv| kv.split_once('=')).map(|(k, v)| (k.into(), v.into())).collect()
}

#[tokio::test]
async fn every_corpus_file_migrates_checks_and_serves() {
    bounded(300, async {
        let files = corpus();
        assert!(files.len() >= 10, "the corpus holds at least 10 files, not {}", files.len());
        let pg = pg().await;
        for ini in &files {
            let text = std::fs::read_to_string(ini).unwrap();
            for sql in weir_e2e::migrated::comments(&text, "corpus-setup:") {
                pg.psql("postgres", sql).unwrap_or_else(|e| panic!("{}: {sql}: {e}", ini.display()));
            }
        }
        for ini in &files {
            let c = client_of(ini);
            let started = std::time::Instant::now();
            let weir = MigratedWeir::start(&pg, ini, |t| t).await;
            let url = weir.url(&c["user"], &c["password"], &c["dbname"]);
            let client =
                connect(&url).await.unwrap_or_else(|e| panic!("{}: connect: {e}\n{}", ini.display(), weir.logs()));
            let row = client
                .query_one("select current_user::text, 1 + 1", &[])
                .await
                .unwrap_or_else(|e| panic!("{}: query: {e}", ini.display()));
            let want = c.get("expect_user").unwrap_or(&c["user"]);
            assert_eq!(row.get::<_, String>(0), *want, "{}: the session's user", ini.display());
            assert_eq!(row.get::<_, i32>(1), 2, "{}", ini.display());
            eprintln!("{}: served in {:?}", ini.display(), started.elapsed());
        }
    })
    .await;
}

/// What migrate-config says about the corpus: PgBouncer keys weir has are
/// carried without a warning (the fallback, forced users, [users], auth_user).
#[test]
fn corpus_keys_weir_has_migrate_without_warnings() {
    // PgBouncer's own test.ini uses per-user and per-database keys weir does
    // not have (reserve_pool_size per user, max_user_client_connections);
    // its warnings name those.
    for ini in corpus().into_iter().filter(|p| !p.ends_with("13-pgbouncer-test-ini.ini")) {
        let (_, warnings) = weir_e2e::migrated::migrate(&ini);
        for key in ["* ", "user=", "password=", "auth_user", "[users]", "pool_size", "connect_query", "timezone"] {
            assert!(
                !warnings.lines().any(|w| w.contains(key) && !w.contains("query_timeout")),
                "{}: a warning about {key}:\n{warnings}",
                ini.display()
            );
        }
    }
}
