//! The bench's surroundings: the open-files limit (raised by re-executing
//! through `sh -c 'ulimit -n …'`, no unsafe code), the weir and PgBouncer
//! binaries, and a temp directory the `postgres` user can read.

use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{bail, Context};

const REEXEC_MARK: &str = "WEIR_BENCH_FD_RAISED";

/// The workspace root (bench/..).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().map(Path::to_path_buf).unwrap_or_else(|| PathBuf::from("."))
}

/// The soft and hard `Max open files` of this process.
pub fn fd_limits() -> Option<(u64, u64)> {
    let text = std::fs::read_to_string("/proc/self/limits").ok()?;
    let line = text.lines().find(|l| l.starts_with("Max open files"))?;
    let mut nums = line["Max open files".len()..].split_whitespace();
    let soft = nums.next()?.parse().ok()?;
    let hard = nums.next()?.parse().ok()?;
    Some((soft, hard))
}

/// Makes sure the soft open-files limit is at least `want`. If it is not,
/// re-executes this process once through a shell that raises it (the hard
/// limit too, when root), so every child (pgbench, weir, PgBouncer) inherits it.
pub fn ensure_fd_limit(want: u64) -> anyhow::Result<()> {
    let Some((soft, _)) = fd_limits() else {
        return Ok(());
    };
    if soft >= want {
        return Ok(());
    }
    if std::env::var_os(REEXEC_MARK).is_some() {
        eprintln!("warning: open-files limit is {soft}, wanted {want}; large client counts may fail");
        return Ok(());
    }
    let exe = std::env::current_exe().context("finding the bench executable")?;
    let script = format!(
        "ulimit -Hn {want} 2>/dev/null; ulimit -Sn {want} 2>/dev/null || ulimit -Sn \"$(ulimit -Hn)\"; exec \"$0\" \"$@\""
    );
    let err = Command::new("sh")
        .arg("-c")
        .arg(script)
        .arg(exe)
        .args(std::env::args_os().skip(1))
        .env(REEXEC_MARK, "1")
        .exec();
    bail!("re-executing with a higher open-files limit: {err}")
}

/// The weir binary to benchmark: `given` (`--weir-bin`), or
/// target/release/weir after `cargo build --release -p weir --bin weir` (so
/// it is never stale).
pub fn weir_binary(given: Option<&Path>) -> anyhow::Result<PathBuf> {
    if let Some(p) = given {
        return Ok(p.to_path_buf());
    }
    let target_dir =
        std::env::var_os("CARGO_TARGET_DIR").map(PathBuf::from).unwrap_or_else(|| workspace_root().join("target"));
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    eprintln!("== cargo build --release -p weir --bin weir");
    let status = Command::new(cargo)
        .args(["build", "--release", "-p", "weir", "--bin", "weir"])
        .current_dir(workspace_root())
        .status()
        .context("running cargo build for the weir binary")?;
    if !status.success() {
        bail!("building the weir release binary failed ({status})");
    }
    let bin = target_dir.join("release/weir");
    if !bin.is_file() {
        bail!("{} not found after the build; pass --weir-bin PATH", bin.display());
    }
    Ok(bin)
}

/// Debian's pgbouncer (in /usr/sbin, which may not be on PATH), or None.
pub fn find_pgbouncer() -> Option<PathBuf> {
    let mut dirs: Vec<PathBuf> =
        std::env::var_os("PATH").map(|p| std::env::split_paths(&p).collect()).unwrap_or_default();
    dirs.extend(["/usr/sbin", "/usr/bin", "/usr/local/bin", "/usr/local/sbin"].map(PathBuf::from));
    dirs.into_iter().map(|d| d.join("pgbouncer")).find(|p| p.is_file())
}

/// True when we run as root (PgBouncer then runs as `postgres`).
pub fn is_root() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self").is_ok_and(|m| m.uid() == 0)
}

/// A temp directory for configs and logs, removed on drop. Owned by
/// `postgres` when we are root, so PgBouncer can write its pidfile.
pub struct WorkDir(PathBuf);

impl WorkDir {
    pub fn create() -> anyhow::Result<WorkDir> {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("weir-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755))?;
        Ok(WorkDir(dir))
    }

    pub fn path(&self) -> &Path {
        &self.0
    }

    /// Hands the directory (and what is in it) to `postgres` when root.
    pub fn give_to_postgres(&self) -> anyhow::Result<()> {
        if is_root() {
            let st = Command::new("chown").args(["-R", "postgres:postgres"]).arg(&self.0).status()?;
            if !st.success() {
                bail!("chown postgres {} failed", self.0.display());
            }
        }
        Ok(())
    }
}

impl Drop for WorkDir {
    fn drop(&mut self) {
        if std::env::var_os("WEIR_BENCH_KEEP").is_none() {
            let _ = std::fs::remove_dir_all(&self.0);
        }
    }
}

/// First line of a command's stdout, or "?".
pub fn first_line(cmd: &str, args: &[&str]) -> String {
    Command::new(cmd)
        .args(args)
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).lines().next().map(str::to_owned))
        .unwrap_or_else(|| "?".into())
}
