//! `weir demo`: a throwaway Postgres with weir in front, ready for psql and
//! with /metrics and the admin console live, removed again on Ctrl-C.

use std::net::{SocketAddr, TcpListener};

use anyhow::Context;
use weir::config::Config;
use weir_testkit::{PgOptions, PgServer, SCRAM_PASS, SCRAM_USER};

/// The admin console user the demo adds to its userlist.
const DEMO_ADMIN: &str = "admin";
const DEMO_ADMIN_PASS: &str = "admin";

/// The preferred port, or any free one if it is taken.
fn port_or_free(preferred: u16) -> u16 {
    match TcpListener::bind(("127.0.0.1", preferred)) {
        Ok(_) => preferred,
        Err(_) => weir_testkit::free_port(),
    }
}

pub fn run() -> anyhow::Result<()> {
    super::init_logging(weir::config::LogFormat::Text);
    eprintln!("starting a throwaway PostgreSQL...");
    let pg = PgServer::start(PgOptions::default()).context("cannot start PostgreSQL")?;
    let dir = pg.data_dir().parent().context("temp dir")?.to_path_buf();
    let userlist = dir.join("weir-userlist.txt");
    let users = format!("\"{SCRAM_USER}\" \"{SCRAM_PASS}\"\n\"{DEMO_ADMIN}\" \"{DEMO_ADMIN_PASS}\"\n");
    std::fs::write(&userlist, users)?;
    let listen: SocketAddr = ([127, 0, 0, 1], port_or_free(6432)).into();
    let metrics: SocketAddr = ([127, 0, 0, 1], port_or_free(9930)).into();
    let toml = format!(
        r#"[weir]
listen_addr = "{listen}"
auth_type = "scram-sha-256"
auth_file = "{userlist}"
pool_mode = "transaction"
default_pool_size = 20
query_wait_timeout = "5s"
admin_users = ["{DEMO_ADMIN}"]
[metrics]
listen_addr = "{metrics}"
[databases.app]
host = "127.0.0.1"
port = {port}
"#,
        userlist = userlist.display(),
        port = pg.port()
    );
    let cfg = Config::from_toml(&toml, &dir)?;
    println!("weir demo is running. Connect with:\n");
    println!("  psql \"postgres://{SCRAM_USER}:{SCRAM_PASS}@{listen}/app\"");
    println!("  pgbench -i -s 1 \"postgres://{SCRAM_USER}:{SCRAM_PASS}@{listen}/app\"");
    println!("  curl http://{metrics}/metrics");
    println!(
        "  psql \"postgres://{DEMO_ADMIN}:{DEMO_ADMIN_PASS}@{listen}/weir\" -c 'SHOW POOLS'   # the admin console"
    );
    println!("\nPostgres itself listens on 127.0.0.1:{}. Ctrl-C stops everything.", pg.port());
    let result = super::runtime(cfg.weir.worker_threads)?.block_on(super::signals::serve(cfg, None));
    drop(pg);
    result
}
