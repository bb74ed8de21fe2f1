//! "A client's timeout must never cost a server connection", proved
//! against a real Postgres with tokio-postgres, raw sockets and asyncpg:
//! queued queries whose client cancels or leaves are dropped, never run; a
//! client leaving mid-query costs no server connection; the wait budget
//! answers before the client's own deadline.
//!
//! Every query under test inserts its own id into a `ledger` table, so
//! "never ran" is checked on Postgres itself.
//!
//! The answers are timed in 100 ms windows, so every test here holds
//! `weir_e2e::serial` and they run one at a time, not two per process.

#[path = "queue_cancel.rs"]
mod queue_cancel;
#[path = "queue_driver.rs"]
mod queue_driver;
#[path = "queue_storm.rs"]
mod queue_storm;
#[path = "queue_vanish.rs"]
mod queue_vanish;
#[path = "queue_wait.rs"]
mod queue_wait;

use std::time::Duration;

use tokio_postgres::Client;
use weir_e2e::raw::{self, Raw};
use weir_e2e::{Harness, Opts};

/// Every raw step of the queue tests gives up after this long, so no test can hang.
const STEP_LIMIT: Duration = Duration::from_secs(30);

/// A raw client logged in (trust) through weir as `user`, with the queue tests' step limit.
pub async fn raw_login(h: &Harness, user: &str, extra: &[(&str, &str)]) -> raw::Result<Raw> {
    Raw::login_within(STEP_LIMIT, h.addr(), user, "", extra).await
}

/// Creates the ledger table every queued or running test query writes to.
pub async fn create_ledger(h: &Harness) -> Client {
    let direct = h.direct().await;
    direct
        .batch_execute(
            "create table if not exists ledger (id bigint primary key, ts timestamptz not null default clock_timestamp());
             grant all on ledger to public;",
        )
        .await
        .expect("create ledger");
    direct
}

/// Ids in the ledger, read straight from Postgres.
pub async fn ledger_ids(direct: &Client) -> Vec<i64> {
    direct.query("select id from ledger order by ts", &[]).await.unwrap().iter().map(|r| r.get(0)).collect()
}

/// A client through weir holding one server connection in an open transaction.
pub async fn hold_server(h: &Harness) -> (Client, i32) {
    let c = h.client().await;
    c.batch_execute("begin").await.unwrap();
    let pid: i32 = c.query_one("select pg_backend_pid()", &[]).await.unwrap().get(0);
    (c, pid)
}

/// Options with `trust` client auth (raw-socket clients log in without a
/// password exchange; weir still logs into Postgres with the auth_file).
pub fn trust_opts(pool_size: u32) -> Opts {
    Opts { pool_size, auth_type: "trust", ..Opts::default() }
}

/// Waits until the pool has `n` waiters (panics after 10 s).
pub async fn until_waiting(h: &Harness, n: u32) {
    let pool = h.pool();
    let ok = weir_e2e::eventually(weir_e2e::WAIT_LIMIT, || pool.snapshot().waiting == n).await;
    assert!(ok, "expected {n} waiters, pool is {:?}", pool.snapshot());
}

/// weir's backends as Postgres sees them: (pid, state, wait_event, query).
pub async fn backends(direct: &Client) -> Vec<(i32, String, String, String)> {
    direct
        .query(
            "select pid, coalesce(state, ''), coalesce(wait_event, ''), query from pg_stat_activity
             where usename = $1 order by pid",
            &[&weir_e2e::SCRAM_USER],
        )
        .await
        .unwrap()
        .iter()
        .map(|r| (r.get(0), r.get(1), r.get(2), r.get(3)))
        .collect()
}

/// Polls `backends` until `f` holds (or `limit` passes); returns the last view.
pub async fn backends_until(
    direct: &Client,
    limit: Duration,
    f: impl Fn(&[(i32, String, String, String)]) -> bool,
) -> (bool, Vec<(i32, String, String, String)>) {
    let end = tokio::time::Instant::now() + limit;
    loop {
        let b = backends(direct).await;
        if f(&b) {
            return (true, b);
        }
        if tokio::time::Instant::now() >= end {
            return (false, b);
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// Lines of Postgres's own log saying a backend started for `user`.
pub fn logins_of(h: &Harness, user: &str) -> usize {
    h.pg.count_log_lines(&format!("connection authorized: user={user}"))
}
