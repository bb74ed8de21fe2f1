//! Helpers shared by the liveness tests (liveness.rs, liveness_watchdog.rs).

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;

use crate::{Harness, Opts, MD5_PASS, MD5_USER};
use tokio::task::JoinHandle;
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};

pub use crate::{exclusive, serial};

/// `n` clients logged in through weir at `url`, one after the other.
pub async fn clients(url: &str, n: usize) -> Vec<Client> {
    let mut v = Vec::with_capacity(n);
    for _ in 0..n {
        v.push(crate::connect(url).await.expect("login through weir"));
    }
    v
}

/// Runs `sql` on each client at once, each in its own task.
pub fn run_each<C>(
    clients: impl IntoIterator<Item = C>,
    sql: &'static str,
) -> Vec<JoinHandle<Result<(), tokio_postgres::Error>>>
where
    C: std::ops::Deref<Target = Client> + Send + 'static,
{
    clients.into_iter().map(|c| tokio::spawn(async move { c.simple_query(sql).await.map(|_| ()) })).collect()
}

/// The first column of the first row, as text.
pub async fn one(c: &Client, sql: &str) -> Result<String, tokio_postgres::Error> {
    let rows = c.simple_query(sql).await?;
    Ok(rows
        .into_iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => Some(r.get(0).unwrap_or("").to_owned()),
            _ => None,
        })
        .unwrap_or_default())
}

pub async fn pid(c: &Client) -> Result<i32, tokio_postgres::Error> {
    Ok(one(c, "select pg_backend_pid()").await?.parse().expect("a pid"))
}

/// Backend pids of `user`'s connections, straight from Postgres.
pub async fn backend_pids(direct: &Client, user: &str) -> HashSet<i32> {
    let sql = format!("select pid from pg_stat_activity where usename = '{user}' and pid <> pg_backend_pid()");
    let rows = direct.simple_query(&sql).await.expect("pg_stat_activity");
    rows.into_iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).and_then(|p| p.parse().ok()),
            _ => None,
        })
        .collect()
}

/// Waits until Postgres runs a statement containing `needle` (state
/// active, on a backend other than `direct`'s own); returns that backend's pid.
pub async fn running_like(direct: &Client, needle: &str) -> i32 {
    let sql = format!(
        "select coalesce(min(pid), 0) from pg_stat_activity \
         where state = 'active' and query like '%{needle}%' and pid <> pg_backend_pid()"
    );
    let end = tokio::time::Instant::now() + crate::WAIT_LIMIT;
    loop {
        let pid: i32 = one(direct, &sql).await.expect("pg_stat_activity").parse().expect("a pid");
        if pid != 0 {
            return pid;
        }
        assert!(tokio::time::Instant::now() < end, "waited {:?} for a backend running {needle:?}", crate::WAIT_LIMIT);
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// Terminates every backend of `user` and waits until each has exited.
pub async fn terminate_all(direct: &Client, user: &str) -> usize {
    let sql = format!(
        "select count(*) filter (where pg_terminate_backend(pid, 5000)) from pg_stat_activity \
         where usename = '{user}' and pid <> pg_backend_pid()"
    );
    one(direct, &sql).await.expect("terminate").parse().unwrap()
}

/// A client whose connection task's outcome can be awaited (to see an error
/// Postgres or weir sends while the client is idle).
pub async fn watched_client(url: &str) -> (Client, JoinHandle<Result<(), tokio_postgres::Error>>) {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await.expect("connect through weir");
    (client, tokio::spawn(conn))
}

/// weir in front of a Postgres, plus a second database entry `direct` that
/// bypasses the relay (same Postgres database `app`), for "other pools are
/// unaffected" checks.
pub async fn harness_with_direct_db(mut opts: Opts) -> Harness {
    let pg = super::pg_with(opts.pg.clone()).await;
    opts.database
        .push_str(&format!("\n[databases.direct]\nhost = \"127.0.0.1\"\nport = {}\ndbname = \"app\"\n", pg.port()));
    Harness::start_with(Arc::new(pg), opts).await
}

/// md5_user through weir to the `direct` database entry.
pub fn direct_db_url(h: &Harness) -> String {
    format!("postgres://{MD5_USER}:{MD5_PASS}@{}/direct", h.addr())
}

/// An error as the client sees it: SQLSTATE and message when the server (or weir) sent one.
pub fn describe(e: &tokio_postgres::Error) -> String {
    match e.as_db_error() {
        Some(d) => format!("{}: {}", d.code().code(), d.message()),
        None => e.to_string(),
    }
}

/// A connect, bounded.
pub async fn connect_within(url: &str, limit: Duration) -> Result<Client, String> {
    match tokio::time::timeout(limit, crate::connect(url)).await {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(describe(&e)),
        Err(_) => Err("connect timed out".into()),
    }
}
