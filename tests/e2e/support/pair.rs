//! weir in front of a primary and its streaming standby (`PgPair`: one port,
//! 127.0.0.2 and 127.0.0.3), for the failover tests: the config lists the
//! standby first, and helpers for writers, roles and the server each client
//! reached.

use std::sync::Arc;
use std::time::Duration;

use tokio_postgres::{Client, SimpleQueryMessage};
use weir::{Config, Weir};
use weir_testkit::{PgOptions, PgPair, PgServer, APP_DB, SCRAM_PASS, SCRAM_USER};

/// A pair with weir in front: `host = "<second>,<first>"` (the standby first).
pub struct PairHarness {
    pub weir: Weir,
    pub pair: Arc<PgPair>,
    pub dir: std::path::PathBuf,
}

impl PairHarness {
    /// Starts the pair (blocking work off the runtime) and weir with extra
    /// `[weir]` lines and extra `[databases.app]` lines.
    pub async fn start(general: &str, database: &str) -> PairHarness {
        let opts = PgOptions { log_connections: false, ..PgOptions::default() };
        let pair = tokio::task::spawn_blocking(move || PgPair::start(opts)).await.unwrap().expect("start the pair");
        let pair = Arc::new(pair);
        let hosts = format!("{},{}", pair.second.host(), pair.first.host());
        let database = format!("port = {}\n{database}", pair.first.port());
        Self::start_with(pair, &hosts, general, &database).await
    }

    /// weir in front of a running `pair` with `host = hosts` (the
    /// `[databases.app]` lines in `database` give the port).
    pub async fn start_with(pair: Arc<PgPair>, hosts: &str, general: &str, database: &str) -> PairHarness {
        let sql = "create table ledger(id bigserial primary key, writer int, n int); \
                   grant all on table ledger, ledger_id_seq to public";
        let first = pair.clone();
        tokio::task::spawn_blocking(move || first.first.psql(APP_DB, sql)).await.unwrap().expect("the ledger");
        let dir = pair.first.data_dir().parent().unwrap().join(format!("weir-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("userlist.txt"),
            format!("\"{SCRAM_USER}\" \"{SCRAM_PASS}\"\n\"admin\" \"admin_pass\"\n"),
        )
        .unwrap();
        let text = config_text(hosts, general, database);
        let weir = Weir::start(Config::from_toml(&text, &dir).expect("valid test config")).await.expect("start weir");
        PairHarness { weir, pair, dir }
    }

    /// A libpq-style connection string to weir as scram_user.
    pub fn url(&self) -> String {
        format!("postgres://{SCRAM_USER}:{SCRAM_PASS}@{}/{APP_DB}", self.weir.local_addr())
    }

    pub async fn client(&self) -> Client {
        crate::connect(&self.url()).await.expect("connect through weir")
    }

    /// The admin console.
    pub async fn console(&self) -> Client {
        let url = format!("postgres://admin:admin_pass@{}/weir", self.weir.local_addr());
        crate::connect(&url).await.expect("connect to the console")
    }

    /// The pool's host set, once a client has used the pool.
    pub fn hosts(&self) -> Arc<weir::pool::HostSet> {
        self.weir.shared().pools.hosts(APP_DB).expect("the database's hosts")
    }

    /// The role the set knows `server` (one of the pair) in.
    pub fn role_of(&self, server: &PgServer) -> Option<weir_metrics::HostRole> {
        let key = format!("{}:{}", server.host(), server.port());
        self.hosts().view().into_iter().find(|v| v.host.to_string() == key).map(|v| v.role)
    }

    /// Waits until the set knows `server` in `role`.
    pub async fn until_role(&self, server: &PgServer, role: weir_metrics::HostRole) {
        crate::wait_for(&format!("{}:{} known as {}", server.host(), server.port(), role.as_label()), || async {
            self.role_of(server) == Some(role)
        })
        .await
    }

    /// Rows of the ledger on `server` (straight to it, as the superuser).
    pub fn ledger_rows(server: &PgServer) -> i64 {
        server.psql(APP_DB, "select count(*) from ledger").expect("count the ledger").parse().expect("a count")
    }
}

impl Drop for PairHarness {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn config_text(hosts: &str, general: &str, database: &str) -> String {
    format!(
        "[weir]\nlisten_addr = \"127.0.0.1:0\"\nauth_type = \"scram-sha-256\"\nauth_file = \"userlist.txt\"\n\
         pool_mode = \"transaction\"\ndefault_pool_size = 4\nserver_login_retry = \"200ms\"\n\
         admin_users = [\"admin\"]\n{general}\n\
         [databases.app]\nhost = \"{hosts}\"\n{database}\n"
    )
}

/// The address of the server the client's query ran on.
pub async fn server_addr(c: &Client) -> Result<String, tokio_postgres::Error> {
    let rows = c.simple_query("select host(inet_server_addr())").await?;
    Ok(rows
        .into_iter()
        .find_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(0).map(str::to_owned),
            _ => None,
        })
        .unwrap_or_default())
}

/// One writer's record: rows it saw acknowledged (and when), and each
/// error's SQLSTATE.
#[derive(Debug, Default, Clone)]
pub struct Written {
    pub acked: Vec<(i64, std::time::Instant)>,
    pub errors: Vec<String>,
    /// The longest one insert took.
    pub longest: Duration,
}

/// A writer on one connection inserting ledger rows until `stop`; each
/// insert bounded by `limit` (a hang counts as an error "hang").
pub fn writer(
    url: String,
    id: i32,
    stop: Arc<std::sync::atomic::AtomicBool>,
    limit: Duration,
) -> tokio::task::JoinHandle<Written> {
    tokio::spawn(async move {
        let mut w = Written::default();
        let mut client: Option<Client> = None;
        let mut n = 0;
        while !stop.load(std::sync::atomic::Ordering::SeqCst) {
            let c = match &client {
                Some(c) if !c.is_closed() => c,
                _ => match tokio::time::timeout(limit, crate::connect(&url)).await {
                    Ok(Ok(c)) => client.insert(c),
                    Ok(Err(e)) => {
                        w.errors.push(crate::sqlstate(&e).unwrap_or_else(|| "connect".into()));
                        tokio::time::sleep(Duration::from_millis(20)).await;
                        continue;
                    }
                    Err(_) => {
                        w.errors.push("hang".into());
                        continue;
                    }
                },
            };
            n += 1;
            let sql = format!("insert into ledger(writer, n) values ({id}, {n}) returning id");
            let t0 = std::time::Instant::now();
            let r = tokio::time::timeout(limit, c.simple_query(&sql)).await;
            w.longest = w.longest.max(t0.elapsed());
            match r {
                Ok(Ok(rows)) => {
                    let at = std::time::Instant::now();
                    w.acked.extend(rows.into_iter().filter_map(|m| match m {
                        SimpleQueryMessage::Row(r) => r.get(0).and_then(|v| v.parse().ok()).map(|id| (id, at)),
                        _ => None,
                    }))
                }
                Ok(Err(e)) => {
                    w.errors.push(crate::sqlstate(&e).unwrap_or_else(|| "closed".into()));
                    // A new connection after an error, as an application does.
                    client = None;
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(_) => {
                    w.errors.push("hang".into());
                    client = None;
                }
            }
        }
        w
    })
}
