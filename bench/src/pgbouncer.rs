//! The PgBouncer the benchmarks compare weir with: the test kit's launcher
//! (`weir_testkit::pgbouncer`), which the e2e tests share; a pooler either
//! benchmark runs (`Running`), the work folder PgBouncer can write in, and
//! the pid a PgBouncer started as a child process wrote there.

use std::path::{Path, PathBuf};

use anyhow::Context;

pub use weir_testkit::pgbouncer::{installed, PgBouncer};

/// A running pooler; PgBouncer is stopped (by its own pid) when dropped.
pub enum Running {
    Weir(weir::Weir),
    PgBouncer(PgBouncer),
}

impl Running {
    pub async fn stop(self) {
        match self {
            Running::Weir(w) => w.shutdown().await,
            Running::PgBouncer(b) => drop(b),
        }
    }
}

/// A fresh folder `weir-<name>-<pid>` in the temp dir, writable by all:
/// PgBouncer runs as postgres when we are root and writes its log there.
pub fn work_dir(name: &str) -> anyhow::Result<PathBuf> {
    use std::os::unix::fs::PermissionsExt;
    let dir = std::env::temp_dir().join(format!("weir-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir)?;
    std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777))?;
    Ok(dir)
}

/// The pid PgBouncer wrote to `dir/pgbouncer.pid` (its own, not the
/// launcher's when it runs as postgres).
pub fn pid_in(dir: &Path) -> anyhow::Result<u32> {
    std::fs::read_to_string(dir.join("pgbouncer.pid"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .context("reading pgbouncer.pid")
}
