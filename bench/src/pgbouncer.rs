//! The PgBouncer the benchmarks compare weir with: the test kit's launcher
//! (`weir_testkit::pgbouncer`), which the e2e tests share; a pooler either
//! benchmark runs (`Running`), and the work folder PgBouncer can write in.

use std::path::PathBuf;

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
