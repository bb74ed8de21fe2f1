//! The end-to-end harness: a throwaway PostgreSQL, optionally a fault relay,
//! and weir running in-process in front of them, plus client helpers.
//! Every test builds its own `Harness`; dropping it tears everything down.

pub mod console;
pub mod extended;
pub mod liveness;
pub mod migrated;
pub mod pair;
pub mod pgbouncer;
pub mod process;
pub mod raw;

use std::future::Future;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::{Client, NoTls};
use weir::{Config, Weir};
pub use weir_testkit::{
    PgOptions, PgServer, Relay, StopMode, APP_DB, MD5_PASS, MD5_USER, SCRAM_PASS, SCRAM_USER, TRUST_PASS, TRUST_USER,
};

/// How to set up weir for one test.
#[derive(Debug, Clone)]
pub struct Opts {
    pub pool_size: u32,
    pub pool_mode: &'static str,
    pub auth_type: &'static str,
    /// Extra TOML lines for the `[weir]` section.
    pub general: String,
    /// Extra TOML lines for `[databases.app]`.
    pub database: String,
    /// Put a fault relay between weir and Postgres.
    pub relay: bool,
    pub pg: PgOptions,
}

impl Default for Opts {
    fn default() -> Self {
        Opts {
            pool_size: 5,
            pool_mode: "transaction",
            auth_type: "md5",
            general: String::new(),
            database: String::new(),
            relay: false,
            pg: PgOptions::default(),
        }
    }
}

/// A running Postgres with weir in front.
pub struct Harness {
    pub weir: Option<Weir>,
    pub relay: Option<Relay>,
    pub pg: Arc<PgServer>,
    pub dir: PathBuf,
    pub opts: Opts,
}

impl Harness {
    pub async fn start(opts: Opts) -> Harness {
        let pg = pg_with(opts.pg.clone()).await;
        Harness::start_with(Arc::new(pg), opts).await
    }

    /// weir (and a relay, if asked) in front of an already running Postgres.
    pub async fn start_with(pg: Arc<PgServer>, opts: Opts) -> Harness {
        let pg_addr: SocketAddr = format!("127.0.0.1:{}", pg.port()).parse().unwrap();
        let relay = if opts.relay { Some(Relay::start(pg_addr).await.expect("start relay")) } else { None };
        let server_addr = relay.as_ref().map(|r| r.addr()).unwrap_or(pg_addr);
        let dir = pg.data_dir().parent().unwrap().join(format!("weir-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("userlist.txt"),
            format!(
                "\"{SCRAM_USER}\" \"{SCRAM_PASS}\"\n\"{MD5_USER}\" \"{MD5_PASS}\"\n\"{TRUST_USER}\" \"{TRUST_PASS}\"\n\"admin\" \"admin_pass\"\n"
            ),
        )
        .unwrap();
        let cfg = Config::from_toml(&config_text(&opts, server_addr), &dir).expect("valid test config");
        let weir = Weir::start(cfg).await.expect("start weir");
        Harness { weir: Some(weir), relay, pg, dir, opts }
    }

    pub fn weir(&self) -> &Weir {
        self.weir.as_ref().expect("weir is running")
    }

    pub fn addr(&self) -> SocketAddr {
        self.weir().local_addr()
    }

    /// A libpq-style connection string to weir.
    pub fn url(&self, user: &str, password: &str) -> String {
        format!("postgres://{user}:{password}@{}/{APP_DB}", self.addr())
    }

    /// Postgres's own address, for raw clients that compare weir with it.
    pub fn pg_addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.pg.port()))
    }

    /// A libpq-style connection string straight to Postgres.
    pub fn direct_url(&self, user: &str, password: &str) -> String {
        format!("postgres://{user}:{password}@127.0.0.1:{}/{APP_DB}", self.pg.port())
    }

    /// A tokio-postgres client through weir as scram_user.
    pub async fn client(&self) -> Client {
        connect(&self.url(SCRAM_USER, SCRAM_PASS)).await.expect("connect through weir")
    }

    /// A tokio-postgres client straight to Postgres as the superuser.
    pub async fn direct(&self) -> Client {
        direct_client(&self.pg).await
    }

    /// Waits until Postgres runs exactly `sql` (see `until_running`).
    pub async fn until_running(&self, sql: &str) {
        until_running(&self.direct().await, sql, 1).await
    }

    /// Runs SQL as the superuser through psql, straight to Postgres.
    pub fn psql(&self, sql: &str) -> String {
        self.pg.psql(APP_DB, sql).expect("psql")
    }

    /// The pool for app/scram_user, once a client has used it.
    pub fn pool(&self) -> Arc<weir::pool::Pool> {
        self.pool_for(SCRAM_USER)
    }

    pub fn pool_for(&self, user: &str) -> Arc<weir::pool::Pool> {
        self.weir().shared().pools.get(APP_DB, user).expect("pool exists")
    }

    /// Backend pids of weir's server connections (by application_name-free
    /// match on user, excluding this query's own backend).
    pub fn server_pids(&self, user: &str) -> Vec<i32> {
        let out = self.psql(&format!(
            "select pid from pg_stat_activity where usename = '{user}' and pid <> pg_backend_pid() order by pid"
        ));
        out.lines().filter(|l| !l.is_empty()).map(|l| l.trim().parse().unwrap()).collect()
    }
}

impl Drop for Harness {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A client connected (and served once) before the attack, and the pool's
/// close count at that point.
pub struct Before {
    pub keeper: Client,
    closed: u64,
    opened: u64,
}

impl Before {
    pub async fn take(h: &Harness) -> Before {
        let keeper = h.client().await;
        keeper.simple_query("select 1").await.expect("keeper's first query");
        let m = &h.pool().metrics;
        Before { keeper, closed: m.closed_total(), opened: m.opened() }
    }

    /// The keeper still queries, a new client logs in and queries, and no
    /// server connection was closed (nor a new one needed beyond the pool).
    pub async fn unharmed(&self, h: &Harness) {
        let rows = self.keeper.simple_query("select 'keeper'").await.expect("the pre-attack client still queries");
        assert!(!rows.is_empty());
        let fresh = h.client().await;
        fresh.simple_query("select 'fresh'").await.expect("a new client is served");
        let m = &h.pool().metrics;
        assert_eq!(m.closed_total(), self.closed, "no server connection was closed by the attack");
        assert!(m.opened() <= self.opened + u64::from(h.opts.pool_size), "no churn of server connections");
        let s = h.pool().snapshot();
        assert_eq!((s.waiting, s.recovering), (0, 0), "{s:?}");
    }
}

/// A throwaway Postgres with the test kit's defaults (started off the async
/// runtime: initdb takes a while).
pub async fn pg() -> PgServer {
    pg_with(PgOptions::default()).await
}

/// A throwaway Postgres started with `opts`.
pub async fn pg_with(opts: PgOptions) -> PgServer {
    tokio::task::spawn_blocking(move || PgServer::start(opts)).await.unwrap().expect("start postgres")
}

/// Postgres and weir in front of it: a pool of `pool_size` servers in
/// `pool_mode`, clients logging in by `auth_type`, and `general`'s lines
/// added to `[weir]`.
pub async fn harness(pool_size: u32, pool_mode: &'static str, auth_type: &'static str, general: &str) -> Harness {
    Harness::start(Opts { pool_size, pool_mode, auth_type, general: general.into(), ..Opts::default() }).await
}

/// Connects with tokio-postgres and drives the connection in the background.
pub async fn connect(url: &str) -> Result<Client, tokio_postgres::Error> {
    let (client, conn) = tokio_postgres::connect(url, NoTls).await?;
    tokio::spawn(async move {
        let _ = conn.await;
    });
    Ok(client)
}

fn config_text(o: &Opts, server: SocketAddr) -> String {
    format!(
        r#"[weir]
listen_addr = "127.0.0.1:0"
auth_type = "{auth}"
auth_file = "userlist.txt"
pool_mode = "{mode}"
default_pool_size = {size}
server_login_retry = "200ms"
admin_users = ["admin"]
{general}
[databases.app]
host = "127.0.0.1"
port = {port}
{database}
"#,
        auth = o.auth_type,
        mode = o.pool_mode,
        size = o.pool_size,
        general = o.general,
        port = server.port(),
        database = o.database,
    )
}

/// Polls `f` every 20 ms until it returns true or `limit` passes.
pub async fn eventually(limit: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = tokio::time::Instant::now() + limit;
    loop {
        if f() {
            return true;
        }
        if tokio::time::Instant::now() >= end {
            return false;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// How long a test waits for a state it needs before failing: generous, so a
/// loaded machine only makes the test slower, never red.
pub const WAIT_LIMIT: Duration = Duration::from_secs(30);

/// Polls the async check `f` every 20 ms until it returns true; panics,
/// naming `what`, after `WAIT_LIMIT`.
pub async fn wait_for<F, Fut>(what: &str, mut f: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let end = tokio::time::Instant::now() + WAIT_LIMIT;
    while !f().await {
        assert!(tokio::time::Instant::now() < end, "waited {WAIT_LIMIT:?} for {what}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A tokio-postgres client straight to `pg`'s `app` as the superuser.
pub async fn direct_client(pg: &PgServer) -> Client {
    connect(&format!("postgres://postgres@127.0.0.1:{}/{APP_DB}", pg.port())).await.expect("connect to postgres")
}

/// How many backends Postgres shows running exactly `sql` (state active),
/// asked over `direct`, a connection straight to Postgres.
pub async fn running(direct: &Client, sql: &str) -> i64 {
    let q = "select count(*) from pg_stat_activity where query = $1 and state = 'active'";
    direct.query_one(q, &[&sql]).await.expect("pg_stat_activity").get(0)
}

/// Waits until at least `n` backends run exactly `sql`: the query has
/// reached Postgres and is executing (so a cancel or a kill now lands on it).
pub async fn until_running(direct: &Client, sql: &str, n: i64) {
    wait_for(&format!("{n} backend(s) running {sql:?}"), || async { running(direct, sql).await >= n }).await
}

/// The SQLSTATE of a tokio-postgres error, if the server (or weir) sent one.
pub fn sqlstate(e: &tokio_postgres::Error) -> Option<String> {
    e.as_db_error().map(|d| d.code().code().to_owned())
}

/// Tests that assert bounds that are the feature (liveness: refill within
/// 1 s, an error within the watchdog's bound; the queue's and core's timing
/// windows; hostile_flood's memory) run one at a time within their test
/// binary: on 2 cores a neighbour would eat their window.
pub async fn serial() -> tokio::sync::MutexGuard<'static, ()> {
    static LOCK: tokio::sync::Mutex<()> = tokio::sync::Mutex::const_new(());
    LOCK.lock().await
}

/// Runs a test body alone (see `serial`) and under a hard limit, so no
/// test can hang the suite.
pub async fn exclusive<T>(limit_secs: u64, f: impl Future<Output = T>) -> T {
    let _serial = serial().await;
    tokio::time::timeout(Duration::from_secs(limit_secs), f).await.expect("test exceeded its time limit")
}

/// Runs a test body under a hard limit, so no test can hang the suite.
pub async fn bounded<T>(limit_secs: u64, f: impl Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(limit_secs), f).await.expect("test exceeded its time limit")
}
