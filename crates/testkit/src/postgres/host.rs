//! The host side of a throwaway server: finding Postgres's binaries,
//! running as root (through `runuser`/`su`), the temp dir, and running a
//! command with a timeout and none of the caller's PG* environment.

use super::*;

/// Last resort when `pg_ctl stop` failed: SIGKILL the pid in `postmaster.pid`.
pub(super) fn kill_postmaster(data_dir: &Path) {
    let pid_file = read_lossy(&data_dir.join("postmaster.pid"));
    if let Some(pid) = pid_file.lines().next().and_then(|l| l.trim().parse::<u32>().ok()) {
        let _ = Command::new("kill")
            .args(["-KILL", &pid.to_string()])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
    }
}

/// `WEIR_PG_BIN`, else the highest `/usr/lib/postgresql/<ver>/bin` containing `initdb`.
pub(super) fn find_bin_dir() -> Result<PathBuf, TestkitError> {
    if let Some(dir) = std::env::var_os("WEIR_PG_BIN") {
        let dir = PathBuf::from(dir);
        if dir.join("initdb").is_file() && dir.join("pg_ctl").is_file() {
            return Ok(dir);
        }
        return Err(TestkitError::NoPostgres(format!("WEIR_PG_BIN={} has no initdb/pg_ctl", dir.display())));
    }
    let root = Path::new("/usr/lib/postgresql");
    let mut best: Option<(Vec<u32>, PathBuf)> = None;
    if let Ok(entries) = std::fs::read_dir(root) {
        for entry in entries.flatten() {
            let name = entry.file_name().to_string_lossy().into_owned();
            let Some(version) = name.split('.').map(|p| p.parse::<u32>().ok()).collect::<Option<Vec<u32>>>() else {
                continue;
            };
            let bin = entry.path().join("bin");
            if bin.join("initdb").is_file()
                && bin.join("pg_ctl").is_file()
                && best.as_ref().is_none_or(|(v, _)| version > *v)
            {
                best = Some((version, bin));
            }
        }
    }
    best.map(|(_, bin)| bin).ok_or_else(|| {
        TestkitError::NoPostgres(
            "no /usr/lib/postgresql/<version>/bin with initdb and pg_ctl; install postgresql \
             (e.g. apt-get install postgresql-15) or set WEIR_PG_BIN"
                .into(),
        )
    })
}

pub(super) fn running_as_root() -> bool {
    static ROOT: OnceLock<bool> = OnceLock::new();
    *ROOT.get_or_init(|| {
        if let Ok(out) = Command::new("id").arg("-u").stdin(Stdio::null()).output() {
            if out.status.success() {
                return String::from_utf8_lossy(&out.stdout).trim() == "0";
            }
        }
        // Fallback: the owner of our own /proc entry is our uid.
        use std::os::unix::fs::MetadataExt;
        std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
    })
}

pub(super) fn runuser_path() -> Option<&'static Path> {
    static RUNUSER: OnceLock<Option<PathBuf>> = OnceLock::new();
    RUNUSER
        .get_or_init(|| {
            ["/usr/sbin/runuser", "/sbin/runuser", "/usr/bin/runuser", "/bin/runuser"]
                .iter()
                .map(PathBuf::from)
                .find(|p| p.is_file())
        })
        .as_deref()
}

/// Creates `<tmp>/weir-pg-<pid>-<counter>-<nanos>` (mode 0700), owned by
/// postgres when we are root.
pub(super) fn make_temp_dir(as_root: bool) -> Result<PathBuf, TestkitError> {
    use std::os::unix::fs::{DirBuilderExt, PermissionsExt};
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let mut parent = std::env::temp_dir();
    if as_root {
        // postgres must be able to traverse the parent; fall back to /tmp if it can't.
        let traversable = std::fs::metadata(&parent).is_ok_and(|m| m.permissions().mode() & 0o001 != 0);
        if !traversable {
            parent = PathBuf::from("/tmp");
        }
    }
    let nanos = SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.subsec_nanos()).unwrap_or(0);
    let n = COUNTER.fetch_add(1, Ordering::Relaxed);
    let dir = parent.join(format!("weir-pg-{}-{n}-{nanos}", std::process::id()));
    std::fs::DirBuilder::new()
        .mode(0o700)
        .create(&dir)
        .map_err(|e| TestkitError::io(format!("creating {}", dir.display()), e))?;
    if as_root {
        let mut cmd = Command::new("chown");
        cmd.args(["-R", "postgres:postgres"]).arg(&dir);
        if let Err(e) = run(cmd, Duration::from_secs(30)) {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
    }
    Ok(dir)
}

/// Environment variables that would silently change what psql/pg_ctl do.
pub(super) fn clear_pg_env(cmd: &mut Command) {
    for var in [
        "PGHOST",
        "PGHOSTADDR",
        "PGPORT",
        "PGUSER",
        "PGDATABASE",
        "PGPASSWORD",
        "PGPASSFILE",
        "PGSERVICE",
        "PGSERVICEFILE",
        "PGOPTIONS",
        "PGSSLMODE",
        "PGDATA",
        "PGTZ",
    ] {
        cmd.env_remove(var);
    }
}

pub(super) fn shell_quote(s: &OsStr) -> String {
    format!("'{}'", s.to_string_lossy().replace('\'', r"'\''"))
}

pub(super) fn read_lossy(path: &Path) -> String {
    std::fs::read(path).map(|b| String::from_utf8_lossy(&b).into_owned()).unwrap_or_default()
}

pub(super) fn tail(s: &str, n: usize) -> String {
    let lines: Vec<&str> = s.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

fn describe(cmd: &Command) -> String {
    let mut s = cmd.get_program().to_string_lossy().into_owned();
    for a in cmd.get_args() {
        s.push(' ');
        s.push_str(&a.to_string_lossy());
    }
    s
}

/// Runs `cmd` to completion with a deadline, capturing output. Returns
/// stdout on success; failures carry stderr.
pub(super) fn run(mut cmd: Command, timeout: Duration) -> Result<String, TestkitError> {
    let command = describe(&cmd);
    tracing::debug!(%command, "running");
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| TestkitError::io(format!("spawning `{command}`"), e))?;
    let reader = |pipe: Option<Box<dyn Read + Send>>| {
        std::thread::spawn(move || {
            let mut buf = Vec::new();
            if let Some(mut p) = pipe {
                let _ = p.read_to_end(&mut buf);
            }
            String::from_utf8_lossy(&buf).into_owned()
        })
    };
    let out_t = reader(child.stdout.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let err_t = reader(child.stderr.take().map(|p| Box::new(p) as Box<dyn Read + Send>));
    let deadline = Instant::now() + timeout;
    let status = loop {
        match child.try_wait() {
            Ok(Some(status)) => break status,
            Ok(None) if Instant::now() >= deadline => {
                let _ = child.kill();
                let _ = child.wait();
                // Grandchildren may still hold the pipes; don't wait for the readers.
                return Err(TestkitError::Timeout { command, timeout, stderr: String::new() });
            }
            Ok(None) => std::thread::sleep(Duration::from_millis(5)),
            Err(e) => return Err(TestkitError::io(format!("waiting for `{command}`"), e)),
        }
    };
    let stdout = out_t.join().unwrap_or_default();
    let stderr = err_t.join().unwrap_or_default();
    if status.success() {
        Ok(stdout)
    } else {
        Err(TestkitError::Command { command, status: status.to_string(), stdout, stderr })
    }
}
