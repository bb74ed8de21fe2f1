//! A throwaway PostgreSQL server ([`PgServer`]): finds the binaries, runs
//! `initdb` into a unique temp dir, configures it for speed and for weir's
//! tests (trust/md5/scram users, an `app` database, connection logging),
//! starts it on a free 127.0.0.1 port, and stops and deletes it on drop.
//!
//! Works as a normal user and as root: as root the temp dir is chowned to
//! `postgres` and the server-side binaries run through `runuser -u postgres`
//! (or `su postgres` when `runuser` is missing).

use std::ffi::OsStr;
use std::fmt::Write as _;
use std::io::{Read, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::error::TestkitError;

mod host;
mod pair;
use host::{
    clear_pg_env, find_bin_dir, kill_postmaster, make_temp_dir, read_lossy, run, running_as_root, runuser_path,
    shell_quote, tail,
};
pub use pair::PgPair;

/// Role authenticated with SCRAM-SHA-256.
pub const SCRAM_USER: &str = "scram_user";
/// Password of [`SCRAM_USER`].
pub const SCRAM_PASS: &str = "scram_pass";
/// Role whose password is stored as MD5 and authenticated with `md5`.
pub const MD5_USER: &str = "md5_user";
/// Password of [`MD5_USER`].
pub const MD5_PASS: &str = "md5_pass";
/// Role authenticated with `trust` over TCP (it has a password anyway).
pub const TRUST_USER: &str = "trust_user";
/// Password of [`TRUST_USER`] (not checked by the server).
pub const TRUST_PASS: &str = "trust_pass";
/// Database created for tests; everyone may create objects in its `public` schema.
pub const APP_DB: &str = "app";

const SUPERUSER: &str = "postgres";
const HOST: &str = "127.0.0.1";
const START_ATTEMPTS: u32 = 5;
const INITDB_TIMEOUT: Duration = Duration::from_secs(120);
const PG_CTL_TIMEOUT: Duration = Duration::from_secs(60);
const PSQL_TIMEOUT: Duration = Duration::from_secs(60);

/// How to configure a [`PgServer`].
#[derive(Debug, Clone)]
pub struct PgOptions {
    /// Extra `postgresql.conf` lines, written verbatim as `key = value` after
    /// the testkit's own settings (so they override them). String values
    /// must carry their own single quotes, e.g. `("log_min_messages", "debug1")`
    /// is fine but `("search_path", "'app, public'")` needs the quotes.
    pub extra_conf: Vec<(String, String)>,
    /// `max_connections` (default 200).
    pub max_connections: u32,
    /// `log_connections` and `log_disconnections` (default true).
    pub log_connections: bool,
    /// Ready for replication clients (default false): `wal_level =
    /// logical`, and pg_hba.conf lines that let every role of the testkit
    /// connect for physical replication as it connects otherwise.
    pub replication: bool,
}

impl Default for PgOptions {
    fn default() -> Self {
        PgOptions { extra_conf: Vec::new(), max_connections: 200, log_connections: true, replication: false }
    }
}

/// Shutdown mode for [`PgServer::restart`] (`pg_ctl -m`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StopMode {
    /// Wait for all clients to disconnect.
    Smart,
    /// Terminate sessions, then shut down cleanly.
    Fast,
    /// Kill everything; the next start runs crash recovery.
    Immediate,
}

impl StopMode {
    fn as_arg(self) -> &'static str {
        match self {
            StopMode::Smart => "smart",
            StopMode::Fast => "fast",
            StopMode::Immediate => "immediate",
        }
    }
}

/// A running throwaway PostgreSQL. Dropping it stops the server
/// (`pg_ctl stop -m immediate`) and deletes its directory, unless the
/// environment variable `WEIR_KEEP_PG=1` is set, in which case the directory
/// is kept and its path printed to stderr.
#[derive(Debug)]
pub struct PgServer {
    root_dir: PathBuf,
    data_dir: PathBuf,
    bin_dir: PathBuf,
    /// The address it listens on (127.0.0.1, or another loopback address
    /// for a primary/standby pair).
    host: String,
    port: u16,
    as_root: bool,
    keep: bool,
}

impl PgServer {
    /// Creates, configures and starts a new server. Blocks until it accepts
    /// connections and the test roles and database exist.
    pub fn start(opts: PgOptions) -> Result<PgServer, TestkitError> {
        Self::start_on(HOST, None, opts)
    }

    /// An empty server (nothing in its folder yet) for `host`; its Drop
    /// cleans up whatever is made in it, on every error path.
    fn unstarted(host: &str) -> Result<PgServer, TestkitError> {
        let bin_dir = find_bin_dir()?;
        let as_root = running_as_root();
        let root_dir = make_temp_dir(as_root)?;
        Ok(PgServer {
            data_dir: root_dir.join("data"),
            root_dir,
            bin_dir,
            host: host.to_owned(),
            port: 0,
            as_root,
            keep: std::env::var("WEIR_KEEP_PG").is_ok_and(|v| v == "1"),
        })
    }

    /// `start` on `host` (a loopback address), on `port` or a free one.
    fn start_on(host: &str, port: Option<u16>, opts: PgOptions) -> Result<PgServer, TestkitError> {
        let mut srv = Self::unstarted(host)?;
        srv.initdb()?;
        srv.write_hba(opts.replication)?;
        let conf_path = srv.data_dir.join("postgresql.conf");
        let base_conf = std::fs::read_to_string(&conf_path)
            .map_err(|e| TestkitError::io(format!("reading {}", conf_path.display()), e))?;

        let mut attempt = 0;
        loop {
            attempt += 1;
            srv.port = match port {
                Some(p) => p,
                None => crate::try_free_port()
                    .map_err(|e| TestkitError::io("binding 127.0.0.1:0 to find a free port", e))?,
            };
            let conf = format!("{base_conf}\n{}", srv.conf_block(&opts));
            std::fs::write(&conf_path, conf)
                .map_err(|e| TestkitError::io(format!("writing {}", conf_path.display()), e))?;
            let log_before = std::fs::metadata(srv.log_file()).map(|m| m.len()).unwrap_or(0);
            match srv.pg_ctl_start() {
                Ok(()) => break,
                Err(err) => {
                    let log = read_lossy(&srv.log_file());
                    let new_log = log.get(log_before as usize..).unwrap_or(&log);
                    let port_taken = new_log.contains("Address already in use")
                        || new_log.contains("could not create any TCP/IP sockets");
                    if port_taken && port.is_none() && attempt < START_ATTEMPTS {
                        tracing::debug!(port = srv.port, attempt, "postgres port taken, retrying");
                        continue;
                    }
                    return Err(TestkitError::StartFailed {
                        attempts: attempt,
                        reason: err.to_string(),
                        log_tail: tail(&log, 40),
                    });
                }
            }
        }
        srv.create_fixtures()?;
        tracing::info!(port = srv.port, dir = %srv.root_dir.display(), "throwaway postgres started");
        Ok(srv)
    }

    /// The TCP port the server listens on (on [`Self::host`]).
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The address it listens on: `"127.0.0.1"`, or a pair's own loopback address.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The folder of the server's Unix socket (`unix_socket_directories`):
    /// it listens on `<socket_dir>/.s.PGSQL.<port>`, where `local` lines trust
    /// every role.
    pub fn socket_dir(&self) -> &Path {
        &self.root_dir
    }

    /// The folder of this server's binaries (psql, pg_ctl, ...).
    pub fn bin_dir(&self) -> &Path {
        &self.bin_dir
    }

    /// The cluster's data directory (`PGDATA`).
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// The server log (written by `pg_ctl -l`), outside the data directory.
    pub fn log_file(&self) -> PathBuf {
        self.root_dir.join("postgres.log")
    }

    /// The superuser name, always `"postgres"` (trusted over TCP from 127.0.0.1).
    pub fn superuser(&self) -> &str {
        SUPERUSER
    }

    /// `pg_ctl stop -m fast`, waiting for the shutdown to finish.
    pub fn stop(&self) -> Result<(), TestkitError> {
        self.pg_ctl(&["stop", "-m", "fast"])
    }

    /// Starts the server again after [`Self::stop`], on the same port.
    pub fn start_again(&self) -> Result<(), TestkitError> {
        self.pg_ctl_start()
    }

    /// `pg_ctl restart -m <mode>`, waiting until the server accepts connections again.
    pub fn restart(&self, mode: StopMode) -> Result<(), TestkitError> {
        let log = self.log_file();
        self.pg_ctl(&[
            OsStr::new("restart"),
            OsStr::new("-m"),
            OsStr::new(mode.as_arg()),
            OsStr::new("-l"),
            log.as_os_str(),
        ])
    }

    /// Runs `sql` with `psql -XAtq -v ON_ERROR_STOP=1 -c` as the superuser
    /// over TCP against database `db`, returning trimmed stdout. Several
    /// statements in one string run as one implicit transaction.
    pub fn psql(&self, db: &str, sql: &str) -> Result<String, TestkitError> {
        let psql = {
            let p = self.bin_dir.join("psql");
            if p.is_file() {
                p
            } else {
                PathBuf::from("psql")
            }
        };
        let port = self.port.to_string();
        let mut cmd = Command::new(&psql);
        cmd.args(["-h", &self.host, "-p", &port, "-U", SUPERUSER, "-d", db])
            .args(["-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-c", sql])
            .env("PGCONNECT_TIMEOUT", "10");
        clear_pg_env(&mut cmd);
        let out = run(cmd, PSQL_TIMEOUT)?;
        Ok(out.trim().to_string())
    }

    /// Number of lines of the server log containing `needle`, e.g.
    /// `"connection authorized"` or `"disconnection:"`. 0 if the log is unreadable.
    pub fn count_log_lines(&self, needle: &str) -> usize {
        read_lossy(&self.log_file()).lines().filter(|l| l.contains(needle)).count()
    }

    // ---- internals -------------------------------------------------------

    fn initdb(&self) -> Result<(), TestkitError> {
        let cmd = self.server_cmd(
            "initdb",
            &[
                OsStr::new("-D"),
                self.data_dir.as_os_str(),
                OsStr::new("-U"),
                OsStr::new(SUPERUSER),
                OsStr::new("--auth=trust"),
                OsStr::new("--encoding=UTF8"),
                OsStr::new("--locale=C"),
                OsStr::new("--no-sync"),
                OsStr::new("--no-instructions"),
            ],
        );
        run(cmd, INITDB_TIMEOUT).map(drop)
    }

    fn write_hba(&self, replication: bool) -> Result<(), TestkitError> {
        let mut hba = String::from(
            "\
# written by weir-testkit
local all all trust
host all postgres 127.0.0.1/32 trust
host replication postgres 127.0.0.0/8 trust
host all trust_user 127.0.0.1/32 trust
host all md5_user 127.0.0.1/32 md5
host all all 127.0.0.1/32 scram-sha-256
",
        );
        if replication {
            hba.push_str(
                "\
local replication all trust
host replication postgres 127.0.0.1/32 trust
host replication trust_user 127.0.0.1/32 trust
host replication md5_user 127.0.0.1/32 md5
host replication all 127.0.0.1/32 scram-sha-256
",
            );
        }
        let path = self.data_dir.join("pg_hba.conf");
        // Truncating an existing file keeps its owner (postgres when run as root).
        std::fs::write(&path, hba).map_err(|e| TestkitError::io(format!("writing {}", path.display()), e))
    }

    fn conf_block(&self, opts: &PgOptions) -> String {
        let onoff = |b: bool| if b { "on" } else { "off" };
        let sock_dir = self.root_dir.display().to_string().replace('\'', "''");
        let mut s = String::from("# ---- weir-testkit ----\n");
        let _ = write!(
            s,
            "listen_addresses = '{host}'\n\
             port = {port}\n\
             unix_socket_directories = '{sock_dir}'\n\
             max_connections = {maxc}\n\
             fsync = off\n\
             synchronous_commit = off\n\
             full_page_writes = off\n\
             shared_buffers = 128MB\n\
             log_connections = {logc}\n\
             log_disconnections = {logc}\n\
             logging_collector = off\n\
             log_line_prefix = '%m [%p] %u@%d '\n\
             password_encryption = 'scram-sha-256'\n\
             track_counts = on\n",
            host = self.host,
            port = self.port,
            maxc = opts.max_connections,
            logc = onoff(opts.log_connections),
        );
        if opts.replication {
            s.push_str("wal_level = logical\nmax_wal_senders = 20\nmax_replication_slots = 20\n");
        }
        for (k, v) in &opts.extra_conf {
            let _ = writeln!(s, "{k} = {v}");
        }
        s
    }

    fn pg_ctl_start(&self) -> Result<(), TestkitError> {
        let log = self.log_file();
        self.pg_ctl(&[OsStr::new("start"), OsStr::new("-l"), log.as_os_str()])
    }

    /// `pg_ctl -D <data> -w -t 30 <args...>`, as the postgres user when root.
    fn pg_ctl<S: AsRef<OsStr>>(&self, args: &[S]) -> Result<(), TestkitError> {
        let mut full: Vec<&OsStr> =
            vec![OsStr::new("-D"), self.data_dir.as_os_str(), OsStr::new("-w"), OsStr::new("-t"), OsStr::new("30")];
        full.extend(args.iter().map(AsRef::as_ref));
        run(self.server_cmd("pg_ctl", &full), PG_CTL_TIMEOUT).map(drop)
    }

    fn create_fixtures(&self) -> Result<(), TestkitError> {
        self.psql(
            "postgres",
            &format!(
                "CREATE ROLE {SCRAM_USER} LOGIN PASSWORD '{SCRAM_PASS}'; \
                 SET password_encryption = 'md5'; \
                 CREATE ROLE {MD5_USER} LOGIN PASSWORD '{MD5_PASS}'; \
                 RESET password_encryption; \
                 CREATE ROLE {TRUST_USER} LOGIN PASSWORD '{TRUST_PASS}';"
            ),
        )?;
        // CREATE DATABASE cannot run inside the implicit multi-statement transaction.
        self.psql("postgres", &format!("CREATE DATABASE {APP_DB} OWNER {SUPERUSER}"))?;
        self.psql(APP_DB, &format!("GRANT ALL ON DATABASE {APP_DB} TO PUBLIC; GRANT ALL ON SCHEMA public TO PUBLIC;"))?;
        Ok(())
    }

    /// A command for a server-side binary (initdb, pg_ctl): run directly, or
    /// as the postgres user when we are root. Runs with the temp dir as cwd
    /// so postgres never needs access to the caller's cwd.
    fn server_cmd(&self, bin: &str, args: &[&OsStr]) -> Command {
        let program = self.bin_dir.join(bin);
        let mut cmd = if !self.as_root {
            let mut c = Command::new(&program);
            c.args(args);
            c
        } else if let Some(runuser) = runuser_path() {
            let mut c = Command::new(runuser);
            c.args(["-u", SUPERUSER, "--"]).arg(&program).args(args);
            c
        } else {
            let mut line = shell_quote(program.as_os_str());
            for a in args {
                line.push(' ');
                line.push_str(&shell_quote(a));
            }
            let mut c = Command::new("su");
            c.args([SUPERUSER, "-s", "/bin/sh", "-c"]).arg(line);
            c
        };
        cmd.current_dir(&self.root_dir);
        clear_pg_env(&mut cmd);
        cmd
    }

    fn cleanup(&mut self) {
        if self.data_dir.join("postmaster.pid").exists() {
            let stopped = self
                .pg_ctl(&["stop", "-m", "immediate"])
                .map_err(|e| tracing::warn!("stopping throwaway postgres: {e}"))
                .is_ok();
            if !stopped {
                kill_postmaster(&self.data_dir);
            }
        }
        if self.keep {
            let _ = writeln!(
                std::io::stderr(),
                "WEIR_KEEP_PG=1: keeping throwaway postgres dir {} (log: {})",
                self.root_dir.display(),
                self.log_file().display()
            );
        } else if let Err(e) = std::fs::remove_dir_all(&self.root_dir) {
            tracing::warn!("removing {}: {e}", self.root_dir.display());
        }
    }
}

impl Drop for PgServer {
    fn drop(&mut self) {
        // Never panic in Drop (we may already be unwinding from a test failure).
        let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| self.cleanup()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn start_query_restart() {
        let pg = PgServer::start(PgOptions::default()).expect("start postgres");
        assert_eq!(pg.psql(APP_DB, "select 1").unwrap(), "1");
        assert!(pg.count_log_lines("connection authorized") >= 1);
        assert_eq!(pg.host(), "127.0.0.1");
        assert_eq!(pg.superuser(), "postgres");

        // Fixtures.
        let roles = pg
            .psql(
                "postgres",
                "select rolname || ':' || left(rolpassword, 3) from pg_authid \
                 where rolname in ('scram_user','md5_user','trust_user') order by 1",
            )
            .unwrap();
        assert_eq!(roles, "md5_user:md5\nscram_user:SCR\ntrust_user:SCR", "{roles}");
        pg.psql(APP_DB, "create table t(x int); insert into t values (1)").unwrap();
        // pg_stat_database.sessions counts finished sessions (flushed at backend exit).
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let sessions: u64 = pg
                .psql("postgres", "select sessions from pg_stat_database where datname = 'app'")
                .unwrap()
                .parse()
                .unwrap();
            if sessions >= 1 {
                break;
            }
            assert!(Instant::now() < deadline, "pg_stat_database.sessions stayed 0");
            std::thread::sleep(Duration::from_millis(50));
        }
        let err = pg.psql(APP_DB, "select nonsense_column").unwrap_err().to_string();
        assert!(err.contains("nonsense_column"), "{err}");

        pg.restart(StopMode::Fast).expect("restart fast");
        assert_eq!(pg.psql(APP_DB, "select count(*) from t").unwrap(), "1");

        pg.stop().unwrap();
        assert!(pg.psql(APP_DB, "select 1").is_err());
        pg.start_again().unwrap();
        assert_eq!(pg.psql(APP_DB, "select 1").unwrap(), "1");
        assert!(pg.count_log_lines("disconnection:") >= 1);

        let dir = pg.data_dir().parent().unwrap().to_path_buf();
        drop(pg);
        if std::env::var("WEIR_KEEP_PG").is_err() {
            assert!(!dir.exists(), "temp dir should be removed on drop");
        }
    }

    #[test]
    fn options_are_applied() {
        let pg = PgServer::start(PgOptions {
            extra_conf: vec![("statement_timeout".into(), "'12s'".into())],
            max_connections: 37,
            log_connections: false,
            replication: true,
        })
        .expect("start postgres");
        assert_eq!(pg.psql("postgres", "show max_connections").unwrap(), "37");
        assert_eq!(pg.psql("postgres", "show statement_timeout").unwrap(), "12s");
        assert_eq!(pg.psql("postgres", "show wal_level").unwrap(), "logical");
        assert_eq!(pg.count_log_lines("connection authorized"), 0);
    }
}
