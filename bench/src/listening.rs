//! Waiting for a pooler the bench started to listen: its port polled until
//! a TCP connect succeeds, a process that exits first reported with the
//! tail of its log, a pooler that never listens reported after a limit.

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

use anyhow::bail;

/// How long a pooler may take to listen.
pub const START_LIMIT: Duration = Duration::from_secs(15);
const POLL: Duration = Duration::from_millis(50);
/// The pause after the port answers: PgBouncer writes its pidfile right after binding.
const SETTLE: Duration = Duration::from_millis(100);
/// Lines of the log shown when the pooler exits at start.
const TAIL_LINES: usize = 5;

/// Waits until 127.0.0.1:`port` accepts, while `child` (named `label`,
/// writing `log`) runs.
pub fn wait_listening(child: &mut Child, port: u16, label: &str, log: &Path) -> anyhow::Result<()> {
    let end = Instant::now() + START_LIMIT;
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if let Some(status) = child.try_wait()? {
            bail!("{label} exited at start ({status}); {}:\n{}", log.display(), log_tail(log, TAIL_LINES));
        }
        if Instant::now() > end {
            bail!("{label} is not listening on {port} after {START_LIMIT:?}; see {}", log.display());
        }
        std::thread::sleep(POLL);
    }
    std::thread::sleep(SETTLE);
    Ok(())
}

/// The last `n` lines of the file at `path` (empty when unreadable).
fn log_tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::process::Command;

    #[test]
    fn a_process_that_exits_before_listening_is_reported_with_its_log() {
        let dir = std::env::temp_dir().join(format!("weir-bench-listening-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let log = dir.join("x.log");
        std::fs::write(&log, "one\ntwo\nthe last words\n").unwrap();
        let mut child = Command::new("true").spawn().unwrap();
        let port = weir_testkit::free_port();
        let err = wait_listening(&mut child, port, "pooler", &log).unwrap_err().to_string();
        let _ = std::fs::remove_dir_all(&dir);
        assert!(err.starts_with("pooler exited at start"), "{err}");
        assert!(err.ends_with("one\ntwo\nthe last words"), "{err}");
    }

    #[test]
    fn a_listening_port_ends_the_wait() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        let mut child = Command::new("sleep").arg("5").spawn().unwrap();
        let waited = wait_listening(&mut child, port, "pooler", Path::new("/nonexistent"));
        let _ = child.kill();
        let _ = child.wait();
        waited.unwrap();
    }
}
