//! The pooler under soak, in a subprocess so its RSS and fds are its own:
//! weir (a binary given or built) or Debian's PgBouncer, both in transaction
//! mode with the same pool (size, minimum, wait timeout, dead-path keepalive
//! settings), trust auth, the bench user as admin. The config is rewritten
//! and SIGHUP sent to change the pool size; SHOW POOLS gives servers and waiters.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use tokio_postgres::{Client, NoTls, SimpleQueryMessage};
use weir_testkit::{APP_DB, TRUST_PASS, TRUST_USER};

use crate::suite::env::is_root;

pub const POOL_SIZE: u32 = 20;
pub const MIN_POOL_SIZE: u32 = 5;
pub const MAX_CLIENT_CONN: u32 = 5000;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Weir,
    PgBouncer,
}

impl Kind {
    pub fn label(self) -> &'static str {
        match self {
            Kind::Weir => "weir",
            Kind::PgBouncer => "pgbouncer",
        }
    }
}

/// A running pooler.
pub struct Target {
    pub kind: Kind,
    pub port: u16,
    pub pid: u32,
    child: Child,
    dir: PathBuf,
    upstream: u16,
    pub log: PathBuf,
}

impl Target {
    /// Starts `kind` (binary `bin`) in `dir`, pointing at 127.0.0.1:`upstream`.
    pub fn start(kind: Kind, bin: &Path, dir: &Path, upstream: u16) -> anyhow::Result<Target> {
        let port = weir_testkit::free_port();
        std::fs::write(dir.join("userlist.txt"), format!("\"{TRUST_USER}\" \"{TRUST_PASS}\"\n"))?;
        let log = dir.join(format!("{}.log", kind.label()));
        write_config(kind, dir, port, upstream, POOL_SIZE)?;
        let stderr = std::fs::File::create(&log)?;
        let child = match kind {
            Kind::Weir => Command::new(bin)
                .arg("--config")
                .arg(dir.join("weir.toml"))
                .env("WEIR_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(stderr)
                .spawn()
                .with_context(|| format!("starting {}", bin.display()))?,
            Kind::PgBouncer => {
                if is_root() {
                    Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir).status()?;
                }
                let mut cmd = if is_root() {
                    // runuser's PAM session resets the soft open-files limit; raise it back.
                    let mut c = Command::new("runuser");
                    c.args(["-u", "postgres", "--", "sh", "-c", "ulimit -Sn \"$(ulimit -Hn)\"; exec \"$0\" \"$@\""])
                        .arg(bin);
                    c
                } else {
                    Command::new(bin)
                };
                cmd.arg(dir.join("pgbouncer.ini"))
                    .current_dir(dir)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(stderr)
                    .spawn()
                    .with_context(|| format!("starting {}", bin.display()))?
            }
        };
        let mut t = Target { kind, port, pid: 0, child, dir: dir.to_path_buf(), upstream, log };
        crate::listening::wait_listening(&mut t.child, port, kind.label(), &t.log)?;
        t.pid = match kind {
            Kind::Weir => t.child.id(),
            Kind::PgBouncer => crate::pgbouncer::pid_in(dir)?,
        };
        eprintln!("== {} {} listening on {port} (pid {})", kind.label(), bin.display(), t.pid);
        Ok(t)
    }

    /// Rewrites the config with pool size `pool` and sends SIGHUP.
    pub fn reload_with_pool(&self, pool: u32) -> anyhow::Result<()> {
        write_config(self.kind, &self.dir, self.port, self.upstream, pool)?;
        let st = Command::new("kill").args(["-HUP", &self.pid.to_string()]).status()?;
        if !st.success() {
            bail!("kill -HUP {} failed", self.pid);
        }
        Ok(())
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// True while the process runs.
    pub fn alive(&mut self) -> bool {
        match self.kind {
            Kind::Weir => matches!(self.child.try_wait(), Ok(None)),
            Kind::PgBouncer => Path::new(&format!("/proc/{}", self.pid)).exists(),
        }
    }

    /// Lines of the pooler's log that report a panic.
    pub fn panics(&self) -> usize {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        text.lines().filter(|l| l.contains("panicked")).count()
    }

    /// Open file descriptors of the process.
    pub fn fds(&self) -> Option<usize> {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid)).ok().map(|d| d.count())
    }
}

impl Drop for Target {
    fn drop(&mut self) {
        let _ = Command::new("kill").args(["-INT", &self.pid.to_string()]).stderr(Stdio::null()).status();
        let end = Instant::now() + Duration::from_secs(5);
        while self.alive() && Instant::now() < end {
            std::thread::sleep(Duration::from_millis(20));
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Writes the pooler's config into `dir` with `pool` as the pool size.
fn write_config(kind: Kind, dir: &Path, port: u16, up: u16, pool: u32) -> anyhow::Result<()> {
    match kind {
        Kind::Weir => std::fs::write(
            dir.join("weir.toml"),
            format!(
                "[weir]\nlisten_addr = \"127.0.0.1:{port}\"\nauth_type = \"trust\"\nauth_file = \"userlist.txt\"\n\
                 pool_mode = \"transaction\"\ndefault_pool_size = {pool}\nmin_pool_size = {MIN_POOL_SIZE}\n\
                 max_client_conn = {MAX_CLIENT_CONN}\nquery_wait_timeout = \"5s\"\n\
                 admin_users = [\"{TRUST_USER}\"]\nlog_stats = false\n\n\
                 [databases.{APP_DB}]\nhost = \"127.0.0.1\"\nport = {up}\n"
            ),
        )?,
        Kind::PgBouncer => {
            let ini = format!(
                "[databases]\n{APP_DB} = host=127.0.0.1 port={up} dbname={APP_DB}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {dir}/userlist.txt\npool_mode = transaction\n\
                 default_pool_size = {pool}\nmin_pool_size = {MIN_POOL_SIZE}\n\
                 max_client_conn = {MAX_CLIENT_CONN}\nquery_wait_timeout = 5\nserver_login_retry = 1\n\
                 admin_users = {TRUST_USER}\nlog_connections = 0\nlog_disconnections = 0\n\
                 tcp_keepalive = 1\ntcp_keepidle = 5\ntcp_keepintvl = 1\ntcp_keepcnt = 3\n\
                 tcp_user_timeout = 8000\nignore_startup_parameters = extra_float_digits,options\n\
                 pidfile = {dir}/pgbouncer.pid\n",
                dir = dir.display()
            );
            std::fs::write(dir.join("pgbouncer.ini"), ini)?;
        }
    }
    Ok(())
}

/// The admin console (database `pgbouncer`, which weir also answers to).
pub async fn admin(addr: &str) -> anyhow::Result<Client> {
    let url = format!("postgres://{TRUST_USER}:{TRUST_PASS}@{addr}/pgbouncer?connect_timeout=5");
    let (client, conn) = tokio::time::timeout(Duration::from_secs(5), tokio_postgres::connect(&url, NoTls))
        .await
        .context("admin console connect timed out")??;
    tokio::spawn(conn);
    Ok(client)
}

/// (servers, waiting clients) of the app pool from SHOW POOLS: servers are
/// sv_active + sv_idle + sv_used + sv_tested (logged in).
pub async fn pool_counts(admin: &Client) -> anyhow::Result<(u64, u64)> {
    let rows = tokio::time::timeout(Duration::from_secs(2), admin.simple_query("SHOW POOLS"))
        .await
        .context("SHOW POOLS timed out")??;
    let (mut servers, mut waiting) = (0, 0);
    for m in rows {
        if let SimpleQueryMessage::Row(r) = m {
            if r.get("database") != Some(APP_DB) {
                continue;
            }
            let num = |c: &str| r.get(c).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
            servers += num("sv_active") + num("sv_idle") + num("sv_used") + num("sv_tested");
            waiting += num("cl_waiting");
        }
    }
    Ok((servers, waiting))
}
