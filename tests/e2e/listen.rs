//! Listening and Unix sockets, against a real Postgres: weir's own Unix
//! socket (psql and tokio-postgres with `host=/dir`, its file mode, the
//! stale file it replaces and the file it removes at exit, `unix` in SHOW
//! CLIENTS, hba `local` lines and `peer`), a server reached through
//! Postgres's own Unix socket (queries, SHOW SERVERS, a cancel), and
//! `listen_addr` with two addresses.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use tokio_postgres::{NoTls, SimpleQueryMessage};
use weir::{Config, Weir};
use weir_e2e::process::psql_over_socket;
use weir_e2e::{bounded, connect, pg, sqlstate, PgServer, APP_DB, SCRAM_PASS, SCRAM_USER};

/// A throwaway Postgres and a folder for weir's files (config, userlist,
/// its socket), removed on drop.
struct Setup {
    pg: Arc<PgServer>,
    dir: PathBuf,
}

impl Setup {
    async fn new() -> Setup {
        let pg = pg().await;
        let dir = std::env::temp_dir().join(format!("weir-listen-{}", rand::random::<u32>()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("userlist.txt"),
            format!("\"{SCRAM_USER}\" \"{SCRAM_PASS}\"\n\"admin\" \"admin_pass\"\n"),
        )
        .unwrap();
        Setup { pg: Arc::new(pg), dir }
    }

    /// weir with `general` in [weir] and `database` in [databases.app]
    /// (host and port of the test Postgres over TCP unless `database` says).
    async fn weir(&self, general: &str, database: &str) -> Weir {
        let database = if database.is_empty() {
            format!("host = \"127.0.0.1\"\nport = {}\n", self.pg.port())
        } else {
            database.into()
        };
        let text = format!(
            "[weir]\nauth_type = \"md5\"\nauth_file = \"userlist.txt\"\nadmin_users = [\"admin\"]\n\
             server_login_retry = \"200ms\"\n{general}\n[databases.app]\n{database}"
        );
        let cfg = Config::from_toml(&text, &self.dir).unwrap_or_else(|e| panic!("{e}\n{text}"));
        Weir::start(cfg).await.expect("start weir")
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// A libpq keyword connection string to the socket folder `dir` on `port`.
fn unix_conninfo(dir: &Path, port: u16, user: &str, password: &str) -> String {
    format!("host={} port={port} user={user} password={password} dbname={APP_DB}", dir.display())
}

/// The cells of `column` in a simple-query result.
fn column(rows: &[SimpleQueryMessage], column: &str) -> Vec<String> {
    rows.iter()
        .filter_map(|m| match m {
            SimpleQueryMessage::Row(r) => r.get(column).map(str::to_owned),
            _ => None,
        })
        .collect()
}

async fn admin(addr: std::net::SocketAddr) -> tokio_postgres::Client {
    connect(&format!("postgres://admin:admin_pass@{addr}/weir")).await.expect("admin console")
}

/// psql (the real binary) and tokio-postgres reach weir through
/// `<unix_socket_dir>/.s.PGSQL.<port>`; the file has unix_socket_mode;
/// SHOW CLIENTS shows such a client as `unix` with weir's port; a stale
/// socket file is replaced at start and weir's own goes at shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clients_connect_over_weirs_unix_socket() {
    bounded(120, async {
        let s = Setup::new().await;
        let port = weir_testkit::free_port();
        let socket = s.dir.join(format!(".s.PGSQL.{port}"));
        // A socket file nobody answers on, as a crashed weir leaves behind.
        drop(std::os::unix::net::UnixListener::bind(&socket).unwrap());
        assert!(socket.exists());
        let general = format!(
            "listen_addr = \"127.0.0.1:{port}\"\nunix_socket_dir = \"{}\"\nunix_socket_mode = \"0660\"\n",
            s.dir.display()
        );
        let weir = s.weir(&general, "").await;
        assert_eq!(weir.unix_socket_path(), Some(socket.as_path()));
        let mode = std::fs::metadata(&socket).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o660, "unix_socket_mode applies: {mode:o}");

        let client = connect(&unix_conninfo(&s.dir, port, SCRAM_USER, SCRAM_PASS))
            .await
            .expect("tokio-postgres over the socket");
        let rows = client.simple_query("select current_user").await.unwrap();
        assert_eq!(column(&rows, "current_user"), [SCRAM_USER]);

        let psql = s.pg.bin_dir().join("psql");
        let out = psql_over_socket(&psql, &s.dir, port, SCRAM_USER, SCRAM_PASS, "select 'psql over ' || 'unix'");
        assert_eq!(out.await.unwrap(), "psql over unix");

        let console = admin(weir.local_addr()).await;
        let rows = console.simple_query("SHOW CLIENTS").await.unwrap();
        let (addrs, ports) = (column(&rows, "addr"), column(&rows, "port"));
        let unix: Vec<_> = addrs.iter().zip(&ports).filter(|(a, _)| *a == "unix").collect();
        assert_eq!(unix.len(), 1, "the tokio-postgres client is listed as unix: {addrs:?}");
        assert_eq!(unix[0].1, &port.to_string(), "with weir's port, as PgBouncer shows it");

        drop((client, console));
        weir.shutdown().await;
        assert!(!socket.exists(), "weir removes its socket file at exit");
    })
    .await;
}

/// With auth_type = "hba", `local` lines decide for socket clients (and
/// only for them); a `peer` line refuses with a clear error.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hba_local_lines_match_socket_clients() {
    bounded(120, async {
        let s = Setup::new().await;
        std::fs::write(
            s.dir.join("hba.conf"),
            format!("local app {SCRAM_USER} trust\nlocal all all peer\nhost all all 127.0.0.1/32 reject\n"),
        )
        .unwrap();
        let text = format!(
            "[weir]\nauth_type = \"hba\"\nauth_file = \"userlist.txt\"\nauth_hba_file = \"hba.conf\"\n\
             listen_addr = \"127.0.0.1:0\"\nunix_socket_dir = \"{}\"\n[databases.app]\nport = {}\n",
            s.dir.display(),
            s.pg.port()
        );
        let weir = Weir::start(Config::from_toml(&text, &s.dir).unwrap()).await.expect("start weir");
        let port = weir.local_addr().port();
        // trust on the local line: the wrong password does not matter.
        let client = connect(&unix_conninfo(&s.dir, port, SCRAM_USER, "not-the-password")).await.expect("local trust");
        client.simple_query("select 1").await.unwrap();
        let e =
            connect(&format!("postgres://{SCRAM_USER}:{SCRAM_PASS}@{}/{APP_DB}", weir.local_addr())).await.unwrap_err();
        assert_eq!(sqlstate(&e).as_deref(), Some("28000"), "TCP clients match only host lines: {e}");
        let e = connect(&unix_conninfo(&s.dir, port, "admin", "admin_pass")).await.unwrap_err();
        let msg = e.as_db_error().map(|d| d.message().to_owned()).unwrap_or_default();
        assert_eq!(msg, "peer authentication is not supported", "{e}");
        drop(client);
        weir.shutdown().await;
    })
    .await;
}

/// A database whose host is Postgres's socket folder: queries run over the
/// socket (pg_stat_activity has no client address), SHOW SERVERS says
/// `unix`, and a cancel reaches the server the same way.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn server_over_postgres_unix_socket_with_cancel() {
    bounded(120, async {
        let s = Setup::new().await;
        let database = format!("host = \"{}\"\nport = {}\n", s.pg.socket_dir().display(), s.pg.port());
        let weir = s.weir("listen_addr = \"127.0.0.1:0\"\n", &database).await;
        let url = format!("postgres://{SCRAM_USER}:{SCRAM_PASS}@{}/{APP_DB}", weir.local_addr());
        let client = connect(&url).await.expect("through weir to the socket");
        let rows = client
            .simple_query(
                "select (client_addr is null)::text as local from pg_stat_activity where pid = pg_backend_pid()",
            )
            .await
            .unwrap();
        assert_eq!(column(&rows, "local"), ["true"], "the server session came over the Unix socket");

        let console = admin(weir.local_addr()).await;
        let rows = console.simple_query("SHOW SERVERS").await.unwrap();
        assert!(column(&rows, "addr").iter().all(|a| a == "unix"), "{:?}", column(&rows, "addr"));
        assert!(column(&rows, "port").contains(&s.pg.port().to_string()));

        let token = client.cancel_token();
        let sleeper = tokio::spawn(async move { client.simple_query("select pg_sleep(60)").await });
        // Cancel once the sleep runs on the server.
        let direct = connect(&format!("postgres://postgres@127.0.0.1:{}/{APP_DB}", s.pg.port())).await.unwrap();
        weir_e2e::until_running(&direct, "select pg_sleep(60)", 1).await;
        token.cancel_query(NoTls).await.expect("cancel through weir");
        let e = sleeper.await.unwrap().expect_err("the sleep was cancelled");
        assert_eq!(sqlstate(&e).as_deref(), Some("57014"), "{e}");
        drop(console);
        weir.shutdown().await;
    })
    .await;
}

/// listen_addr with two addresses: weir answers on both, on one port
/// (127.0.0.1 and ::1 where IPv6 loopback works, else 127.0.0.1 and 127.0.0.2).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn listen_addr_list_listens_on_every_address() {
    bounded(120, async {
        let s = Setup::new().await;
        let second = if std::net::TcpListener::bind("[::1]:0").is_ok() { "[::1]:0" } else { "127.0.0.2:0" };
        let weir = s.weir(&format!("listen_addr = \"127.0.0.1:0,{second}\"\n"), "").await;
        let addrs = weir.local_addrs().to_vec();
        assert_eq!(addrs.len(), 2, "{addrs:?}");
        assert_eq!(addrs[0].port(), addrs[1].port(), "one port for every address: {addrs:?}");
        for addr in addrs {
            let host = match addr {
                std::net::SocketAddr::V6(a) => format!("[{}]", a.ip()),
                std::net::SocketAddr::V4(a) => a.ip().to_string(),
            };
            let url = format!("postgres://{SCRAM_USER}:{SCRAM_PASS}@{host}:{}/{APP_DB}", addr.port());
            let client = connect(&url).await.unwrap_or_else(|e| panic!("{addr}: {e}"));
            let rows = client.simple_query("select 'answered' as a").await.unwrap();
            assert_eq!(column(&rows, "a"), ["answered"], "{addr}");
        }
        weir.shutdown().await;
    })
    .await;
}

/// A second weir with the first one's metrics port does not start, and its
/// error names the key to change; the first keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_taken_metrics_port_names_the_key_to_change() {
    bounded(120, async {
        let s = Setup::new().await;
        let [metrics_port] = weir_testkit::free_ports();
        let with_metrics =
            format!("listen_addr = \"127.0.0.1:0\"\n[metrics]\nlisten_addr = \"127.0.0.1:{metrics_port}\"\n");
        let first = s.weir(&with_metrics, "").await;
        let text = format!(
            "[weir]\nauth_type = \"md5\"\nauth_file = \"userlist.txt\"\n{with_metrics}\n\
             [databases.app]\nhost = \"127.0.0.1\"\nport = {}\n",
            s.pg.port()
        );
        let cfg = Config::from_toml(&text, &s.dir).unwrap_or_else(|e| panic!("{e}\n{text}"));
        let e = Weir::start(cfg).await.expect_err("the metrics port is taken: the second weir must not start");
        let msg = e.to_string();
        assert!(msg.contains(&format!("127.0.0.1:{metrics_port}")), "{msg}");
        assert!(msg.contains("set [metrics] listen_addr"), "the error names the key: {msg}");
        let url = format!("postgres://{SCRAM_USER}:{SCRAM_PASS}@{}/{APP_DB}", first.local_addr());
        let rows = connect(&url).await.unwrap().simple_query("select 'still here' as a").await.unwrap();
        assert_eq!(column(&rows, "a"), ["still here"]);
        first.shutdown().await;
    })
    .await;
}

/// The weir binary removes its socket file when it ends, SIGQUIT (the
/// immediate stop) included.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_binary_removes_its_socket_on_sigquit() {
    bounded(240, async {
        let s = Setup::new().await;
        let general = format!("unix_socket_dir = \"{}\"", s.dir.display());
        let mut w = weir_e2e::process::WeirProcess::start(&s.pg, &general, "").await;
        let socket = s.dir.join(format!(".s.PGSQL.{}", w.port));
        assert!(socket.exists(), "weir listens on {}; log:\n{}", socket.display(), w.logs());
        let client = connect(&unix_conninfo(&s.dir, w.port, SCRAM_USER, SCRAM_PASS)).await.expect("over the socket");
        client.simple_query("select 1").await.unwrap();
        w.signal("QUIT");
        assert!(w.wait_exit(std::time::Duration::from_secs(30)).await.is_some(), "weir ended; log:\n{}", w.logs());
        assert!(!socket.exists(), "the socket file is gone; log:\n{}", w.logs());
    })
    .await;
}
