//! Debian's PgBouncer, started for a side-by-side comparison with weir (the
//! benchmarks and the e2e tests): an ini written into a folder, daemonised
//! (as `postgres` when we are root, since PgBouncer refuses to run as root),
//! ready once it accepts connections, and stopped by its own pid when
//! dropped.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use crate::TestkitError;

/// How long PgBouncer may take to accept connections after it daemonised.
const READY_WITHIN: Duration = Duration::from_secs(10);

/// A running PgBouncer.
#[derive(Debug)]
pub struct PgBouncer {
    pidfile: PathBuf,
    logfile: PathBuf,
    /// The port it listens on, on 127.0.0.1.
    pub port: u16,
    /// `127.0.0.1:<port>`.
    pub addr: String,
}

/// True when Debian's `pgbouncer` can be run.
pub fn installed() -> bool {
    Command::new("pgbouncer").arg("--version").output().is_ok_and(|o| o.status.success())
}

impl PgBouncer {
    /// Starts PgBouncer in `dir` (which must be writable by `postgres`) on a
    /// free port, with `databases` as its `[databases]` section and
    /// `settings` as extra `[pgbouncer]` lines; returns once it accepts
    /// connections. Its log and pid file are kept in `dir`.
    pub fn start(dir: &Path, databases: &str, settings: &str) -> Result<PgBouncer, TestkitError> {
        let port = crate::free_port();
        let ini = dir.join("pgbouncer.ini");
        let bouncer = PgBouncer {
            pidfile: dir.join("pgbouncer.pid"),
            logfile: dir.join("pgbouncer.log"),
            port,
            addr: format!("127.0.0.1:{port}"),
        };
        let text = format!(
            "[databases]\n{databases}\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
             unix_socket_dir =\nlogfile = {log}\npidfile = {pid}\n{settings}\n",
            log = bouncer.logfile.display(),
            pid = bouncer.pidfile.display(),
        );
        std::fs::write(&ini, text)
            .map_err(|source| TestkitError::Io { context: format!("writing {}", ini.display()), source })?;
        let mut cmd = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", "pgbouncer", "-d"]);
            c
        } else {
            let mut c = Command::new("pgbouncer");
            c.arg("-d");
            c
        };
        let status = cmd
            .arg(&ini)
            .status()
            .map_err(|source| TestkitError::Io { context: "starting pgbouncer".into(), source })?;
        if !status.success() {
            return Err(TestkitError::PgBouncer(format!("did not start ({status}): {}", bouncer.log())));
        }
        let ready = Instant::now() + READY_WITHIN;
        while std::net::TcpStream::connect(&bouncer.addr).is_err() {
            if Instant::now() > ready {
                return Err(TestkitError::PgBouncer(format!("not listening on {}: {}", bouncer.addr, bouncer.log())));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(bouncer)
    }

    fn pid(&self) -> Option<String> {
        std::fs::read_to_string(&self.pidfile).ok().map(|p| p.trim().to_string())
    }

    /// True while the PgBouncer we started still runs.
    pub fn alive(&self) -> bool {
        self.pid().is_some_and(|pid| Command::new("kill").args(["-0", &pid]).status().is_ok_and(|s| s.success()))
    }

    /// Its log so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.logfile).unwrap_or_default()
    }

    /// The last FATAL line of its log, if any.
    pub fn last_fatal(&self) -> Option<String> {
        self.log().lines().rfind(|l| l.contains("FATAL")).map(|l| l.trim().to_string())
    }
}

impl Drop for PgBouncer {
    fn drop(&mut self) {
        if let Some(pid) = self.pid().filter(|_| self.alive()) {
            let _ = Command::new("kill").args(["-TERM", &pid]).status();
        }
    }
}

fn is_root() -> bool {
    Command::new("id").arg("-u").output().is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "0")
}
