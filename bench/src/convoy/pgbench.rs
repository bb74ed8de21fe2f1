//! The convoy bench's pgbench runs: started in the background with their
//! output in a folder, waited for (killed past a grace), their summaries
//! read (TPS, transactions, failures, aborted clients) and their
//! per-transaction logs turned into p50, p99 and the share over 1 s.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use weir_testkit::{APP_DB, TRUST_PASS, TRUST_USER};

/// A pgbench still running this long after its `-T` is killed.
const PGBENCH_GRACE: Duration = Duration::from_secs(30);

/// What pgbench's summary and stderr said.
#[derive(Debug, Clone, Default)]
pub(crate) struct Summary {
    pub(crate) tps: f64,
    pub(crate) txns: u64,
    pub(crate) failed: u64,
    /// Clients that aborted.
    pub(crate) aborted: u64,
    /// The first error line on stderr, if any.
    pub(crate) error: Option<String>,
}

/// Latencies from pgbench's per-transaction log.
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct Latency {
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    /// Share of transactions over 1 s, 0..=1.
    pub(crate) over_1s: f64,
    pub(crate) count: usize,
}

pub(super) fn pgbench_cmd(port: u16) -> Command {
    let mut c = Command::new("pgbench");
    c.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", TRUST_USER])
        .env("PGPASSWORD", TRUST_PASS)
        .env_remove("PGHOST")
        .env_remove("PGPORT")
        .env_remove("PGDATABASE")
        .env_remove("PGUSER")
        .stdin(Stdio::null());
    c
}

/// A pgbench running in the background; killed if dropped unfinished.
pub(super) struct Pgbench {
    child: Option<Child>,
    dir: PathBuf,
    give_up: Instant,
}

impl Pgbench {
    /// `pgbench -n -M simple -c clients -T secs -f script`; its output and,
    /// with `log`, its per-transaction log (`-l`) go to a fresh `dir`.
    pub(super) fn spawn(
        port: u16,
        clients: u32,
        secs: u64,
        script: &Path,
        dir: &Path,
        log: bool,
    ) -> anyhow::Result<Pgbench> {
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir.join("log"))?;
        let mut cmd = pgbench_cmd(port);
        cmd.args(["-n", "-M", "simple", "-c", &clients.to_string(), "-j", &clients.clamp(1, 2).to_string()])
            .args(["-T", &secs.to_string(), "-f"])
            .arg(script);
        if log {
            cmd.arg("-l").arg(format!("--log-prefix={}", dir.join("log/tx").display()));
        }
        let child = cmd
            .arg(APP_DB)
            .stdout(std::fs::File::create(dir.join("stdout"))?)
            .stderr(std::fs::File::create(dir.join("stderr"))?)
            .spawn()
            .context("running pgbench")?;
        let give_up = Instant::now() + Duration::from_secs(secs) + PGBENCH_GRACE;
        Ok(Pgbench { child: Some(child), dir: dir.to_path_buf(), give_up })
    }

    /// Waits for it (killing it past its grace) and reads its summary.
    pub(super) fn finish(mut self) -> anyhow::Result<Summary> {
        let mut child = self.child.take().context("pgbench already finished")?;
        while child.try_wait()?.is_none() {
            if Instant::now() > self.give_up {
                let _ = child.kill();
                let _ = child.wait();
                bail!("pgbench ran {PGBENCH_GRACE:?} past its -T; killed ({})", self.dir.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let stdout = std::fs::read_to_string(self.dir.join("stdout")).unwrap_or_default();
        let stderr = std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default();
        Ok(parse_summary(&stdout, &stderr))
    }
}

impl Drop for Pgbench {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn parse_summary(stdout: &str, stderr: &str) -> Summary {
    let mut s = Summary::default();
    for line in stdout.lines() {
        if let Some(v) = line.strip_prefix("tps = ") {
            s.tps = first_number(v);
        } else if let Some(v) = line.strip_prefix("number of transactions actually processed: ") {
            s.txns = first_number(v) as u64;
        } else if let Some(v) = line.strip_prefix("number of failed transactions: ") {
            s.failed = first_number(v) as u64;
        }
    }
    s.aborted = stderr.lines().filter(|l| l.contains("aborted")).count() as u64;
    let bad = |l: &&str| l.contains("error") || l.contains("ERROR") || l.contains("FATAL") || l.contains("aborted");
    s.error = stderr.lines().find(bad).map(|l| l.trim().to_string());
    s
}

fn first_number(s: &str) -> f64 {
    s.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .find(|w| !w.is_empty())
        .and_then(|w| w.parse().ok())
        .unwrap_or(0.0)
}

/// p50, p99 and the share over 1 s from every log file in `dir` (lines
/// `client txn time_us script epoch epoch_us`; failed ones are left out).
pub(super) fn latencies(dir: &Path) -> anyhow::Result<Latency> {
    let mut us: Vec<u64> = vec![];
    for entry in std::fs::read_dir(dir)? {
        let text = std::fs::read_to_string(entry?.path())?;
        us.extend(text.lines().filter_map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok()));
    }
    Ok(latency_of(us))
}

fn latency_of(mut us: Vec<u64>) -> Latency {
    if us.is_empty() {
        return Latency::default();
    }
    us.sort_unstable();
    let at = |q: f64| us[((us.len() - 1) as f64 * q).round() as usize] as f64 / 1000.0;
    let over = us.iter().filter(|&&t| t > 1_000_000).count();
    Latency { p50_ms: at(0.5), p99_ms: at(0.99), over_1s: over as f64 / us.len() as f64, count: us.len() }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latencies_give_percentiles_and_the_share_over_a_second() {
        let l = latency_of(vec![1_500_000, 1_000, 2_000, 3_000]);
        assert_eq!(l.count, 4);
        assert!((l.p50_ms - 3.0).abs() < 1e-9, "{l:?}");
        assert!((l.p99_ms - 1500.0).abs() < 1e-9, "{l:?}");
        assert!((l.over_1s - 0.25).abs() < 1e-9, "{l:?}");
    }

    #[test]
    fn reads_a_summary_and_its_aborted_clients() {
        let s = parse_summary(
            "number of transactions actually processed: 120\nnumber of failed transactions: 0 (0.000%)\n\
             tps = 11.5 (without initial connection time)\n",
            "pgbench: error: client 3 aborted in command 1 (SQL) of script 0; ERROR: boom\n",
        );
        assert_eq!((s.txns, s.failed, s.aborted), (120, 0, 1));
        assert!((s.tps - 11.5).abs() < 1e-9);
        assert!(s.error.unwrap().contains("boom"));
    }
}
