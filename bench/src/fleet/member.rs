//! One pooler of the fleet, in a subprocess of its own so it can be killed
//! with SIGKILL: weir (the binary given or built, with its `/metrics`
//! listener) or Debian's PgBouncer (in the foreground, as `postgres` when we
//! are root). Both in transaction mode with the fleet's pool size, trust
//! auth, the bench user as admin, the pooler's defaults otherwise. It answers
//! how many connects Postgres refused it so far: weir's
//! `weir_server_connect_refused_total`, PgBouncer's log lines naming
//! "too many connections" or "too many clients".

use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use weir_testkit::{APP_DB, TRUST_PASS, TRUST_USER};

use crate::suite::env::is_root;

const MAX_CLIENT_CONN: u32 = 1000;

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

/// What a member's config says beyond the pooler kind.
#[derive(Debug, Clone, Copy)]
pub struct Setup {
    pub pool: u32,
    /// `Some(true)` writes `fleet_share = true` in the database section;
    /// `None` leaves the key out (weir as a single instance behaves).
    pub share: Option<bool>,
    pub pg_port: u16,
}

/// A running pooler of the fleet.
pub struct Member {
    pub kind: Kind,
    /// 1-based, as printed.
    pub index: usize,
    pub port: u16,
    metrics_port: u16,
    pid: u32,
    child: Child,
    log: PathBuf,
    killed: bool,
}

impl Member {
    /// Starts member `index` of `kind` in its own folder under `work`.
    pub fn start(kind: Kind, index: usize, bin: &Path, work: &Path, setup: Setup) -> anyhow::Result<Member> {
        let dir = work.join(format!("{}-{index}", kind.label()));
        std::fs::create_dir_all(&dir)?;
        let port = weir_testkit::free_port();
        let metrics_port = weir_testkit::free_port();
        std::fs::write(dir.join("userlist.txt"), format!("\"{TRUST_USER}\" \"{TRUST_PASS}\"\n"))?;
        let log = dir.join(format!("{}.log", kind.label()));
        write_config(kind, &dir, port, metrics_port, setup)?;
        let stderr = std::fs::File::create(&log)?;
        let mut cmd = match kind {
            Kind::Weir => {
                let mut c = Command::new(bin);
                c.arg("--config").arg(dir.join("weir.toml")).env("WEIR_LOG", "warn");
                c
            }
            Kind::PgBouncer => {
                if is_root() {
                    Command::new("chown").args(["-R", "postgres:postgres"]).arg(&dir).status()?;
                    let mut c = Command::new("runuser");
                    c.args(["-u", "postgres", "--"]).arg(bin);
                    c
                } else {
                    Command::new(bin)
                }
            }
        };
        if kind == Kind::PgBouncer {
            cmd.arg(dir.join("pgbouncer.ini")).current_dir(&dir);
        }
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(stderr)
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        let mut m = Member { kind, index, port, metrics_port, pid: 0, child, log, killed: false };
        crate::listening::wait_listening(&mut m.child, port, kind.label(), &m.log)?;
        m.pid = match kind {
            Kind::Weir => m.child.id(),
            Kind::PgBouncer => crate::pgbouncer::pid_in(&dir)?,
        };
        Ok(m)
    }

    pub fn name(&self) -> String {
        format!("{} {}", self.kind.label(), self.index)
    }

    pub fn addr(&self) -> String {
        format!("127.0.0.1:{}", self.port)
    }

    /// SIGKILL: the pod is gone, no goodbye to Postgres.
    pub fn kill9(&mut self) -> anyhow::Result<()> {
        let st = Command::new("kill").args(["-KILL", &self.pid.to_string()]).status()?;
        if !st.success() {
            bail!("kill -KILL {} failed", self.pid);
        }
        self.killed = true;
        Ok(())
    }

    /// Where this member's refused connects are counted.
    pub fn refusals(&self) -> Refusals {
        match self.kind {
            Kind::Weir => Refusals::Metrics(self.metrics_port),
            Kind::PgBouncer => Refusals::Log(self.log.clone()),
        }
    }

    fn alive(&mut self) -> bool {
        match self.kind {
            Kind::Weir => matches!(self.child.try_wait(), Ok(None)),
            Kind::PgBouncer => Path::new(&format!("/proc/{}", self.pid)).exists(),
        }
    }
}

impl Drop for Member {
    fn drop(&mut self) {
        if !self.killed && self.pid != 0 {
            let _ = Command::new("kill").args(["-INT", &self.pid.to_string()]).stderr(Stdio::null()).status();
            let end = Instant::now() + Duration::from_secs(5);
            while self.alive() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(20));
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Where a member's refused connects are counted.
#[derive(Debug, Clone)]
pub enum Refusals {
    /// weir's `/metrics` port.
    Metrics(u16),
    /// PgBouncer's log.
    Log(PathBuf),
}

impl Refusals {
    /// Server connects Postgres refused so far (None when unreadable, as
    /// once the member is killed).
    pub fn read(&self) -> Option<u64> {
        match self {
            Refusals::Metrics(port) => scrape_counter(*port, weir_metrics::names::SERVER_CONNECT_REFUSED_TOTAL),
            Refusals::Log(path) => {
                let text = std::fs::read_to_string(path).ok()?;
                let refused = |l: &&str| l.contains("too many connections") || l.contains("too many clients");
                Some(text.lines().filter(refused).count() as u64)
            }
        }
    }
}

fn write_config(kind: Kind, dir: &Path, port: u16, metrics_port: u16, s: Setup) -> anyhow::Result<()> {
    let (pool, up) = (s.pool, s.pg_port);
    match kind {
        Kind::Weir => {
            let share = s.share.map(|on| format!("fleet_share = {on}\n")).unwrap_or_default();
            std::fs::write(
                dir.join("weir.toml"),
                format!(
                    "[weir]\nlisten_addr = \"127.0.0.1:{port}\"\nauth_type = \"trust\"\n\
                     auth_file = \"userlist.txt\"\npool_mode = \"transaction\"\ndefault_pool_size = {pool}\n\
                     max_client_conn = {MAX_CLIENT_CONN}\nadmin_users = [\"{TRUST_USER}\"]\nlog_stats = false\n\
                     log_connections = false\nlog_disconnections = false\n\n\
                     [metrics]\nlisten_addr = \"127.0.0.1:{metrics_port}\"\n\n\
                     [databases.{APP_DB}]\nhost = \"127.0.0.1\"\nport = {up}\n{share}"
                ),
            )?
        }
        Kind::PgBouncer => {
            let ini = format!(
                "[databases]\n{APP_DB} = host=127.0.0.1 port={up} dbname={APP_DB}\n\n[pgbouncer]\n\
                 listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
                 auth_type = trust\nauth_file = {dir}/userlist.txt\npool_mode = transaction\n\
                 default_pool_size = {pool}\nmax_client_conn = {MAX_CLIENT_CONN}\n\
                 admin_users = {TRUST_USER}\nlog_connections = 0\nlog_disconnections = 0\n\
                 ignore_startup_parameters = extra_float_digits,options\n\
                 pidfile = {dir}/pgbouncer.pid\n",
                dir = dir.display()
            );
            std::fs::write(dir.join("pgbouncer.ini"), ini)?;
        }
    }
    Ok(())
}

/// The sum of a counter's samples (all label sets) on weir's `/metrics`.
fn scrape_counter(port: u16, name: &str) -> Option<u64> {
    let mut s = std::net::TcpStream::connect_timeout(&([127, 0, 0, 1], port).into(), Duration::from_secs(1)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").ok()?;
    let mut body = String::new();
    s.read_to_string(&mut body).ok()?;
    Some(counter_sum(&body, name))
}

/// Sums every sample of `name` in a Prometheus text exposition.
pub fn counter_sum(text: &str, name: &str) -> u64 {
    text.lines()
        .filter(|l| l.strip_prefix(name).is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' ')))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

#[cfg(test)]
mod tests {
    use super::counter_sum;

    #[test]
    fn sums_a_counter_over_its_labels_and_nothing_else() {
        let text = "# HELP weir_x_total x\n# TYPE weir_x_total counter\n\
                    weir_x_total{database=\"app\",reason=\"role\"} 3\n\
                    weir_x_total{database=\"app\",reason=\"clients\"} 4\n\
                    weir_x_total_other 100\nweir_y 7\n";
        assert_eq!(counter_sum(text, "weir_x_total"), 7);
        assert_eq!(counter_sum("weir_y 7\n", "weir_y"), 7);
        assert_eq!(counter_sum("", "weir_y"), 0);
    }
}
