//! A PgBouncer that a benchmark starts for comparison: Debian's `pgbouncer`,
//! given an ini written here, daemonised (as `postgres` when we are root,
//! since PgBouncer refuses to run as root), and stopped by its own pid when
//! dropped. Shared by the benchmarks that compare weir with PgBouncer.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// A running PgBouncer.
pub struct PgBouncer {
    pidfile: PathBuf,
    log: PathBuf,
    /// `127.0.0.1:<port>` it listens on.
    pub addr: String,
}

/// True when Debian's `pgbouncer` can be run.
pub fn installed() -> bool {
    Command::new("pgbouncer").arg("--version").output().is_ok_and(|o| o.status.success())
}

impl PgBouncer {
    /// Starts PgBouncer in `dir` (which must be writable by `postgres`) with
    /// `databases` as its `[databases]` section and `settings` as extra
    /// `[pgbouncer]` lines; returns once it accepts connections.
    pub fn start(dir: &Path, databases: &str, settings: &str) -> anyhow::Result<PgBouncer> {
        let port = weir_testkit::free_port();
        let ini = dir.join("pgbouncer.ini");
        let bouncer = PgBouncer {
            pidfile: dir.join("pgbouncer.pid"),
            log: dir.join("pgbouncer.log"),
            addr: format!("127.0.0.1:{port}"),
        };
        std::fs::write(
            &ini,
            format!(
                "[databases]\n{databases}\n[pgbouncer]\nlisten_addr = 127.0.0.1\nlisten_port = {port}\n\
                 unix_socket_dir =\nlogfile = {log}\npidfile = {pid}\n{settings}\n",
                log = bouncer.log.display(),
                pid = bouncer.pidfile.display(),
            ),
        )?;
        let mut cmd = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", "pgbouncer", "-d"]);
            c
        } else {
            let mut c = Command::new("pgbouncer");
            c.arg("-d");
            c
        };
        let status = cmd.arg(&ini).status().context("starting pgbouncer")?;
        if !status.success() {
            bail!("pgbouncer did not start ({status}); see {}", bouncer.log.display());
        }
        let ready = Instant::now() + Duration::from_secs(10);
        while std::net::TcpStream::connect(&bouncer.addr).is_err() {
            if Instant::now() > ready {
                bail!("pgbouncer is not listening on {}", bouncer.addr);
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

    /// The last FATAL line of its log, if any.
    pub fn last_fatal(&self) -> Option<String> {
        let log = std::fs::read_to_string(&self.log).ok()?;
        log.lines().rfind(|l| l.contains("FATAL")).map(|l| l.trim().to_string())
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
