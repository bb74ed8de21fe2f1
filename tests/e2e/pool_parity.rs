//! The pool and its servers as PgBouncer's, against a real Postgres: a
//! console SET changes only its key, idle servers of a user's or a
//! database's other pools make room under max_user_connections and
//! max_db_connections (and no more than needed), the silence probe stays
//! within the pool's limit, server failures are retried or reported as
//! PgBouncer does, client_idle_timeout, server_fast_close, min_pool_size
//! capped by the pool size, and the reserve pool's log line.

use std::time::{Duration, Instant};

use weir_e2e::liveness::connect_within;
use weir_e2e::{bounded, connect, Harness, Opts, APP_DB, SCRAM_PASS, SCRAM_USER};

/// Servers lent by the pool of `db`/`user`, once it exists.
fn active(h: &Harness, db: &str, user: &str) -> u32 {
    h.weir().shared().pools.get(db, user).map_or(0, |p| p.snapshot().active)
}

fn admin_url(h: &Harness) -> String {
    format!("postgres://admin:admin_pass@{}/weir", h.addr())
}

/// `SET server_idle_timeout = 50` on the console changes that key alone:
/// before, it also put PgBouncer's default pool_mode (session) in force, and
/// logins of a busy transaction-mode pool waited for a free server.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_console_set_changes_only_its_key() {
    bounded(60, async {
        let h = Harness::start(Opts { pool_size: 2, ..Opts::default() }).await;
        let admin = connect(&admin_url(&h)).await.expect("console");
        admin.simple_query("SET server_idle_timeout = 50").await.expect("SET");
        let url = h.url(SCRAM_USER, SCRAM_PASS);
        let busy: Vec<_> = (0..2)
            .map(|_| {
                let url = url.clone();
                tokio::spawn(async move {
                    let c = connect(&url).await.expect("connect");
                    c.simple_query("select pg_sleep(3)").await.expect("sleep");
                })
            })
            .collect();
        assert!(
            weir_e2e::eventually(Duration::from_secs(2), || active(&h, APP_DB, SCRAM_USER) == 2).await,
            "both servers busy"
        );
        let started = Instant::now();
        for i in 0..3 {
            let c = connect_within(&url, Duration::from_secs(1)).await;
            assert!(c.is_ok(), "login {i} while every server is busy: {:?} after {:?}", c.err(), started.elapsed());
        }
        let settings = h.pool().settings();
        assert_eq!(settings.pool_mode, weir::config::PoolMode::Transaction, "pool_mode untouched by the SET");
        for b in busy {
            b.await.unwrap();
        }
    })
    .await;
}
