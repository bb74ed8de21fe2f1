//! The things pgbench talks to: Postgres directly, weir (the release binary
//! in a subprocess), PgBouncer (as `postgres` when we are root) and
//! pg_doorman (a binary given with `--doorman-bin`, in `doorman`). Every
//! proxy gets the same setup: pool 20, transaction mode, md5 client auth from
//! a userlist, md5 server login, connection logging off; weir and pg_doorman
//! run with the same number of worker threads.

mod doorman;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use weir_testkit::{MD5_PASS, MD5_USER};

use super::env::{is_root, WorkDir};
use super::procstat;

pub const POOL_SIZE: u32 = 20;
const MAX_CLIENT_CONN: u32 = 30_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Direct,
    Weir,
    PgBouncer,
    Doorman,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Direct => "direct",
            Kind::Weir => "weir",
            Kind::PgBouncer => "PgBouncer",
            Kind::Doorman => "pg_doorman",
        }
    }
}

/// A target as the tables name it: its kind and its worker threads (1 for
/// direct and PgBouncer, which has one).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Id {
    pub kind: Kind,
    pub threads: u32,
}

impl Id {
    pub fn label(self) -> String {
        if self.threads > 1 {
            format!("{} ({} thr)", self.kind.label(), self.threads)
        } else {
            self.kind.label().to_owned()
        }
    }
}

/// A running target.
pub struct Target {
    pub kind: Kind,
    pub threads: u32,
    pub port: u16,
    /// The proxy process (None for direct).
    child: Option<Child>,
    /// The pid to measure (PgBouncer's own, not runuser's).
    pub pid: Option<u32>,
    log: Option<PathBuf>,
}

impl Target {
    pub fn direct(port: u16) -> Target {
        Target { kind: Kind::Direct, threads: 1, port, child: None, pid: None, log: None }
    }

    pub fn start_weir(bin: &Path, work: &WorkDir, pg_port: u16, threads: u32) -> anyhow::Result<Target> {
        let port = weir_testkit::free_port();
        let dir = work.path().join(format!("weir-{threads}"));
        std::fs::create_dir_all(&dir)?;
        write_userlist(&dir)?;
        let toml = format!(
            "[weir]\nlisten_addr = \"127.0.0.1:{port}\"\nauth_type = \"md5\"\nauth_file = \"userlist.txt\"\n\
             pool_mode = \"transaction\"\ndefault_pool_size = {POOL_SIZE}\nmax_client_conn = {MAX_CLIENT_CONN}\n\
             log_connections = false\nlog_disconnections = false\nworker_threads = {threads}\n\n\
             [databases.app]\nhost = \"127.0.0.1\"\nport = {pg_port}\n"
        );
        std::fs::write(dir.join("weir.toml"), toml)?;
        let log = dir.join("weir.log");
        let child = Command::new(bin)
            .arg("--config")
            .arg(dir.join("weir.toml"))
            .env("WEIR_LOG", "warn")
            .env_remove("WEIR_WORKER_THREADS")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let pid = child.id();
        let mut t = Target { kind: Kind::Weir, threads, port, child: Some(child), pid: Some(pid), log: Some(log) };
        t.wait_listening()?;
        eprintln!("== weir {} ({threads} threads) listening on {port} (pid {pid})", bin.display());
        Ok(t)
    }

    pub fn start_pgbouncer(bin: &Path, work: &WorkDir, pg_port: u16) -> anyhow::Result<Target> {
        let port = weir_testkit::free_port();
        let dir = work.path().join("pgbouncer");
        std::fs::create_dir_all(&dir)?;
        write_userlist(&dir)?;
        let pidfile = dir.join("pgbouncer.pid");
        let ini = format!(
            "[databases]\napp = host=127.0.0.1 port={pg_port} dbname=app\n\n[pgbouncer]\n\
             listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
             auth_type = md5\nauth_file = {userlist}\npool_mode = transaction\n\
             default_pool_size = {POOL_SIZE}\nmax_client_conn = {MAX_CLIENT_CONN}\n\
             log_connections = 0\nlog_disconnections = 0\nlog_pooler_errors = 1\n\
             ignore_startup_parameters = extra_float_digits\npidfile = {pidfile}\n",
            userlist = dir.join("userlist.txt").display(),
            pidfile = pidfile.display(),
        );
        std::fs::write(dir.join("pgbouncer.ini"), ini)?;
        work.give_to_postgres()?;
        let log = dir.join("pgbouncer.log");
        let mut cmd = if is_root() {
            // runuser's PAM session resets the soft open-files limit; raise it back.
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--", "sh", "-c", "ulimit -Sn \"$(ulimit -Hn)\"; exec \"$0\" \"$@\""]).arg(bin);
            c
        } else {
            Command::new(bin)
        };
        let child = cmd
            .arg(dir.join("pgbouncer.ini"))
            .current_dir(&dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut t = Target { kind: Kind::PgBouncer, threads: 1, port, child: Some(child), pid: None, log: Some(log) };
        t.wait_listening()?;
        let pid = std::fs::read_to_string(&pidfile)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .with_context(|| format!("reading {}", pidfile.display()))?;
        t.pid = Some(pid);
        eprintln!("== PgBouncer {} listening on {port} (pid {pid})", bin.display());
        Ok(t)
    }

    /// Waits until the target's port accepts (see `listening::wait_listening`).
    fn wait_listening(&mut self) -> anyhow::Result<()> {
        let (Some(child), Some(log)) = (&mut self.child, &self.log) else {
            bail!("{} has no process to wait for", self.kind.label())
        };
        crate::listening::wait_listening(child, self.port, self.kind.label(), log)
    }

    pub fn log_tail(&self) -> String {
        let text = self.log.as_ref().and_then(|p| std::fs::read_to_string(p).ok()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }

    pub fn id(&self) -> Id {
        Id { kind: self.kind, threads: self.threads }
    }

    pub fn label(&self) -> String {
        self.id().label()
    }

    pub fn cpu_secs(&self) -> Option<f64> {
        self.pid.and_then(procstat::cpu_secs)
    }

    /// (user, system) CPU seconds so far.
    pub fn cpu_split(&self) -> Option<(f64, f64)> {
        self.pid.and_then(procstat::cpu_split)
    }

    pub fn rss_kib(&self) -> Option<u64> {
        self.pid.and_then(procstat::rss_kib)
    }

    pub fn peak_rss_kib(&self) -> Option<u64> {
        self.pid.and_then(procstat::peak_rss_kib)
    }

    pub fn reset_peak(&self) {
        if let Some(pid) = self.pid {
            procstat::reset_peak(pid);
        }
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let Some(child) = &mut self.child else { return };
        if let Some(pid) = self.pid {
            let _ = Command::new("kill").args(["-INT", &pid.to_string()]).stderr(Stdio::null()).status();
        }
        let end = Instant::now() + Duration::from_secs(5);
        while matches!(child.try_wait(), Ok(None)) && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = child.kill();
        let _ = child.wait();
    }
}

fn write_userlist(dir: &Path) -> anyhow::Result<()> {
    std::fs::write(dir.join("userlist.txt"), format!("\"{MD5_USER}\" \"{MD5_PASS}\"\n"))?;
    Ok(())
}
