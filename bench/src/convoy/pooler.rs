//! The convoy bench's poolers, each a subprocess stopped by its own pid
//! when dropped: weir (its config with the bench user as admin and the
//! `--weir-extra` lines) and PgBouncer (in the foreground, as `postgres`
//! when we are root). Trust auth, pool_size 20, transaction mode.

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::Context;
use weir_testkit::{APP_DB, TRUST_PASS, TRUST_USER};

use super::{Opts, Pooler, PGBOUNCER_BIN, POOL_SIZE};
use crate::suite::env::is_root;

const MAX_CLIENT_CONN: u32 = 1000;

/// A pooler in a subprocess, stopped by its own pid when dropped.
pub(super) struct Running {
    pub(super) port: u16,
    pid: u32,
    child: Child,
}

impl Running {
    pub(super) fn start(pooler: Pooler, opts: &Opts, dir: &Path, pg_port: u16) -> anyhow::Result<Running> {
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("userlist.txt"), format!("\"{TRUST_USER}\" \"{TRUST_PASS}\"\n"))?;
        let port = weir_testkit::free_port();
        let log = dir.join(format!("{}.log", pooler.label()));
        let mut cmd = match pooler {
            Pooler::Weir => weir_cmd(opts, dir, port, pg_port)?,
            Pooler::PgBouncer => pgbouncer_cmd(dir, port, pg_port)?,
        };
        let child = cmd
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .spawn()
            .with_context(|| format!("starting {}", pooler.label()))?;
        let mut r = Running { port, pid: 0, child };
        crate::listening::wait_listening(&mut r.child, port, pooler.label(), &log)?;
        r.pid = match pooler {
            Pooler::Weir => r.child.id(),
            Pooler::PgBouncer => crate::pgbouncer::pid_in(dir)?,
        };
        Ok(r)
    }

    fn alive(&self) -> bool {
        Path::new(&format!("/proc/{}", self.pid)).exists()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if self.pid != 0 {
            let signal = |s: &str| Command::new("kill").args([s, &self.pid.to_string()]).stderr(Stdio::null()).status();
            let _ = signal("-INT");
            let end = Instant::now() + Duration::from_secs(5);
            while self.alive() && Instant::now() < end {
                std::thread::sleep(Duration::from_millis(20));
            }
            if self.alive() {
                let _ = signal("-KILL");
            }
        }
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn weir_cmd(opts: &Opts, dir: &Path, port: u16, pg_port: u16) -> anyhow::Result<Command> {
    std::fs::write(dir.join("weir.toml"), weir_toml(&opts.weir_extra, port, pg_port))?;
    let mut c = Command::new(&opts.weir_bin);
    c.arg("--config").arg(dir.join("weir.toml")).env("WEIR_LOG", "warn");
    Ok(c)
}

/// weir's config: trust auth, the bench user as admin, pool 20 in
/// transaction mode, and the `--weir-extra` lines (`pool.KEY` in the
/// database section, the rest in `[weir]`), each replacing the bench's own
/// line for its key.
pub(crate) fn weir_toml(extra: &[(String, String)], port: u16, pg_port: u16) -> String {
    let general = [
        ("listen_addr", format!("\"127.0.0.1:{port}\"")),
        ("auth_type", "\"trust\"".into()),
        ("auth_file", "\"userlist.txt\"".into()),
        ("pool_mode", "\"transaction\"".into()),
        ("default_pool_size", POOL_SIZE.to_string()),
        ("max_client_conn", MAX_CLIENT_CONN.to_string()),
        ("admin_users", format!("[\"{TRUST_USER}\"]")),
        ("log_stats", "false".into()),
        ("log_connections", "false".into()),
        ("log_disconnections", "false".into()),
    ];
    let pool = [("host", "\"127.0.0.1\"".to_string()), ("port", pg_port.to_string())];
    let mine = |pool: bool| {
        extra.iter().filter_map(move |(k, v)| match k.strip_prefix("pool.") {
            Some(k) => pool.then_some((k, v)),
            None => (!pool).then_some((k.as_str(), v)),
        })
    };
    format!("[weir]\n{}\n[databases.{APP_DB}]\n{}", section(&general, mine(false)), section(&pool, mine(true)))
}

/// `key = value` lines: `base`, a key in `extra` taking its value from there.
fn section<'a>(base: &[(&str, String)], extra: impl Iterator<Item = (&'a str, &'a String)>) -> String {
    let mut lines: Vec<(String, String)> = base.iter().map(|(k, v)| (k.to_string(), v.clone())).collect();
    for (k, v) in extra {
        match lines.iter_mut().find(|(key, _)| key == k) {
            Some(line) => line.1 = v.clone(),
            None => lines.push((k.to_string(), v.clone())),
        }
    }
    lines.iter().map(|(k, v)| format!("{k} = {v}\n")).collect()
}

/// PgBouncer in the foreground, as `postgres` when we are root.
fn pgbouncer_cmd(dir: &Path, port: u16, pg_port: u16) -> anyhow::Result<Command> {
    let ini = format!(
        "[databases]\n{APP_DB} = host=127.0.0.1 port={pg_port} dbname={APP_DB}\n\n[pgbouncer]\n\
         listen_addr = 127.0.0.1\nlisten_port = {port}\nunix_socket_dir =\n\
         auth_type = trust\nauth_file = {dir}/userlist.txt\npool_mode = transaction\n\
         default_pool_size = {POOL_SIZE}\nmax_client_conn = {MAX_CLIENT_CONN}\n\
         admin_users = {TRUST_USER}\nlog_connections = 0\nlog_disconnections = 0\n\
         ignore_startup_parameters = extra_float_digits,options\npidfile = {dir}/pgbouncer.pid\n",
        dir = dir.display()
    );
    std::fs::write(dir.join("pgbouncer.ini"), ini)?;
    let mut c = if is_root() {
        Command::new("chown").args(["-R", "postgres:postgres"]).arg(dir).status()?;
        let mut c = Command::new("runuser");
        c.args(["-u", "postgres", "--", PGBOUNCER_BIN]);
        c
    } else {
        Command::new(PGBOUNCER_BIN)
    };
    c.arg(dir.join("pgbouncer.ini")).current_dir(dir);
    Ok(c)
}

#[cfg(test)]
mod tests {
    use super::super::parse_extra;
    use super::*;

    #[test]
    fn extra_keys_go_in_weir_or_the_pool_section() {
        let extra = [parse_extra("max_fingerprint_share = 1.0").unwrap(), parse_extra("pool.pool_size=5").unwrap()];
        let toml = weir_toml(&extra, 1, 2);
        let (general, pool) = toml.split_once("[databases.").unwrap();
        assert!(general.contains("max_fingerprint_share = 1.0\n"), "{toml}");
        assert!(pool.contains("pool_size = 5\n") && !general.contains("pool_size = 5"), "{toml}");
        assert!(parse_extra("novalue").is_err());
        let replaced = weir_toml(&[parse_extra("log_stats=true").unwrap()], 1, 2);
        assert_eq!(replaced.matches("log_stats").count(), 1, "{replaced}");
        assert!(replaced.contains("log_stats = true\n"), "{replaced}");
    }
}
