//! pg_doorman as a target: a binary the caller built (`--doorman-bin`), with
//! the same pool size, pool mode, md5 client auth and worker threads as weir.
//! Its client password is the md5 hash Postgres stores for the bench user;
//! its server login reuses the client's proof (its default passthrough).
//! Everything else is its defaults, its statement cache included.

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::Context;
use weir_testkit::{APP_DB, MD5_USER};

use super::{Kind, Target, MAX_CLIENT_CONN, POOL_SIZE};
use crate::suite::env::WorkDir;

impl Target {
    /// Starts pg_doorman in front of Postgres at `pg_port`; `md5_hash` is
    /// `pg_shadow.passwd` of the bench user (`md5…`).
    pub fn start_doorman(
        bin: &Path,
        work: &WorkDir,
        pg_port: u16,
        md5_hash: &str,
        threads: u32,
    ) -> anyhow::Result<Target> {
        let port = weir_testkit::free_port();
        let dir = work.path().join(format!("doorman-{threads}"));
        std::fs::create_dir_all(&dir)?;
        // PgBouncer's query_wait_timeout (120 s), as weir's is 2 min; a
        // slow moment never turns into an error for one target only.
        let toml = format!(
            "[general]\nhost = \"127.0.0.1\"\nport = {port}\nworker_threads = {threads}\n\
             max_connections = {MAX_CLIENT_CONN}\nquery_wait_timeout = 120000\n\
             log_client_connections = false\nlog_client_disconnections = false\n\
             admin_username = \"admin\"\nadmin_password = \"admin\"\n\n\
             [pools.{APP_DB}]\nserver_host = \"127.0.0.1\"\nserver_port = {pg_port}\npool_mode = \"transaction\"\n\n\
             [pools.{APP_DB}.users.0]\nusername = \"{MD5_USER}\"\npassword = \"{md5_hash}\"\npool_size = {POOL_SIZE}\n"
        );
        let config = dir.join("pg_doorman.toml");
        std::fs::write(&config, toml)?;
        let log = dir.join("pg_doorman.log");
        let out = std::fs::File::create(&log)?;
        let child = Command::new(bin)
            .arg(&config)
            .args(["--log-level", "warn", "--no-color"])
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id();
        let mut t = Target { kind: Kind::Doorman, threads, port, child: Some(child), pid: Some(pid), log: Some(log) };
        t.wait_listening()?;
        eprintln!("== pg_doorman {} ({threads} threads) listening on {port} (pid {pid})", bin.display());
        Ok(t)
    }
}
