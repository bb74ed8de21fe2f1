//! weir as a drop-in for PgBouncer: started from a migrated pgbouncer.ini
//! that has a fallback database (`*`), a forced-user database line, a
//! `[users]` entry, an auth_user that is not in the auth_file (it logs in
//! without a password, which the test Postgres trusts for `postgres`), and
//! no `unix_socket_dir`, so PgBouncer's default socket folder `/tmp` is kept
//! and psql connects over the socket there.

use std::path::Path;

use weir_e2e::migrated::MigratedWeir;
use weir_e2e::process::{psql_at, psql_over_socket, rows};
use weir_e2e::*;

const INI: &str = "\
[databases]
forced = host=db.internal dbname=app user=trust_user
* = host=db.internal

[pgbouncer]
listen_addr = 127.0.0.1
listen_port = 6432
auth_type = md5
auth_file = /etc/pgbouncer/userlist.txt
; not in the auth_file: logs in with no password, where Postgres trusts it
auth_user = postgres
auth_query = SELECT usename, passwd FROM pg_shadow WHERE usename=$1
auth_dbname = app
admin_users = admin, admin_pg
autodb_idle_timeout = 1
pool_mode = transaction

[users]
md5_user = pool_mode=session pool_size=3
";

async fn one(url: &str, sql: &str) -> String {
    let c = connect(url).await.unwrap_or_else(|e| panic!("connect {url}: {e}"));
    c.query_one(sql, &[]).await.unwrap_or_else(|e| panic!("{sql}: {e}")).get(0)
}

#[tokio::test]
async fn migrated_pgbouncer_ini_serves_fallback_forced_user_users_and_auth_query() {
    bounded(300, async {
        let pg = pg().await;
        pg.psql(
            APP_DB,
            "create role only_pg login password 'only_pg_pass'; create role admin_pg login password 'admin_pg_pass'",
        )
        .expect("roles only Postgres knows");
        let dir = pg.data_dir().parent().unwrap().join("dropin.ini");
        std::fs::write(&dir, INI).unwrap();
        let weir = MigratedWeir::start(&pg, &dir, |t| t).await;

        // An unlisted database reaches Postgres under its own name.
        // The client stays while the metrics are read (autodb_idle_timeout is 1 s).
        let fallback = connect(&weir.url(SCRAM_USER, SCRAM_PASS, "postgres")).await.expect("fallback login");
        let db: String = fallback.query_one("select current_database()::text", &[]).await.unwrap().get(0);
        assert_eq!(db, "postgres");
        assert!(weir.metrics().contains("database=\"postgres\""), "the fallback pool has series");
        drop(fallback);

        // The forced-user database runs as its user, whoever the client is.
        let user = one(&weir.url(MD5_USER, MD5_PASS, "forced"), "select current_user::text").await;
        assert_eq!(user, TRUST_USER);

        // psql, the real binary, over the Unix socket in PgBouncer's default folder.
        let psql = pg.bin_dir().join("psql");
        let out = psql_over_socket(&psql, Path::new("/tmp"), weir.port, SCRAM_USER, SCRAM_PASS, "select current_user");
        assert_eq!(out.await.unwrap(), SCRAM_USER);

        // A user only Postgres knows logs in through auth_query.
        let user = one(&weir.url("only_pg", "only_pg_pass", APP_DB), "select current_user::text").await;
        assert_eq!(user, "only_pg");
        let wrong = match connect(&weir.url("only_pg", "wrong", APP_DB)).await {
            Ok(_) => panic!("a wrong password is refused"),
            Err(e) => e,
        };
        assert_eq!(sqlstate(&wrong).as_deref(), Some("28P01"), "{wrong}");

        // The [users] entry: md5_user's pools are session pools of 3. The
        // client stays while SHOW POOLS runs: an idle fallback pool goes
        // after autodb_idle_timeout (1 s), and psql can take longer.
        let md5 = connect(&weir.url(MD5_USER, MD5_PASS, APP_DB)).await.expect("md5_user logs in");
        md5.simple_query("select 1").await.expect("md5_user's query");
        let pools = psql_at(weir.port, "admin", "admin_pass", "pgbouncer", "SHOW POOLS").await.expect("SHOW POOLS");
        let pools = rows(&pools);
        let md5_pool =
            pools.iter().find(|r| r["database"] == APP_DB && r["user"] == MD5_USER).expect("md5_user's pool");
        assert_eq!(md5_pool["pool_mode"], "session", "{md5_pool:?}");
        let forced_pool = pools.iter().find(|r| r["database"] == "forced");
        assert_eq!(forced_pool.map(|r| r["user"].as_str()), Some(TRUST_USER), "the forced user's pool: {pools:?}");
        drop(md5);

        // An admin user only Postgres knows logs in to the console through auth_query.
        let version = psql_at(weir.port, "admin_pg", "admin_pg_pass", "pgbouncer", "SHOW VERSION").await;
        assert!(version.is_ok(), "{version:?}");

        // Unused for autodb_idle_timeout, the fallback pool goes, with its series.
        let gone = eventually(weir_e2e::WAIT_LIMIT, || !weir.metrics().contains("database=\"postgres\"")).await;
        assert!(gone, "the idle fallback pool's series are still exported:\n{}", weir.metrics());
        let logged =
            eventually(weir_e2e::WAIT_LIMIT, || weir.logs().contains("removed an idle fallback-database pool")).await;
        assert!(logged, "{}", weir.logs());
    })
    .await;
}
