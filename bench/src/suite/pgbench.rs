//! Running pgbench against a target and reading its figures: TPS and
//! transaction count from its summary, average and p99 latency from its
//! per-transaction log (`-l`).

use std::path::Path;
use std::process::{Command, Stdio};

use anyhow::{bail, Context};
use weir_testkit::{PgServer, APP_DB, MD5_PASS, MD5_USER};

use super::targets::Target;

/// pgbench's query protocol.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Protocol {
    Simple,
    Extended,
    Prepared,
}

impl Protocol {
    pub fn as_str(self) -> &'static str {
        match self {
            Protocol::Simple => "simple",
            Protocol::Extended => "extended",
            Protocol::Prepared => "prepared",
        }
    }
}

/// One pgbench invocation.
#[derive(Debug, Clone)]
pub struct Spec {
    pub select_only: bool,
    pub clients: u32,
    pub protocol: Protocol,
    pub connect_each: bool,
    pub secs: u64,
}

/// What one run measured.
#[derive(Debug, Clone, Default)]
pub struct Outcome {
    pub tps: f64,
    pub txns: u64,
    pub avg_ms: f64,
    pub p99_ms: f64,
    /// Set when pgbench failed or reported failed transactions.
    pub failure: Option<String>,
}

/// `pgbench -i` as md5_user straight to Postgres.
pub fn init(pg: &PgServer, scale: u32) -> anyhow::Result<()> {
    eprintln!("== pgbench -i -s {scale}");
    let out = base(pg.port())
        .args(["-i", "-q", "-s", &scale.to_string(), APP_DB])
        .stdout(Stdio::null())
        .output()
        .context("running pgbench -i (is pgbench installed?)")?;
    if !out.status.success() {
        bail!("pgbench -i failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}

/// Opens the proxy's server connections before anything is measured.
pub fn warm_up(t: &Target) -> anyhow::Result<()> {
    let spec = Spec { select_only: true, clients: 20, protocol: Protocol::Simple, connect_each: false, secs: 1 };
    let dir = std::env::temp_dir().join(format!("weir-bench-warm-{}", std::process::id()));
    let o = run(t, &spec, &dir)?;
    if let Some(f) = o.failure {
        bail!("warm-up against {} failed: {f}\n{}", t.label(), t.log_tail());
    }
    Ok(())
}

/// Runs pgbench once; per-transaction logs go to a fresh `log_dir`.
pub fn run(t: &Target, spec: &Spec, log_dir: &Path) -> anyhow::Result<Outcome> {
    let _ = std::fs::remove_dir_all(log_dir);
    std::fs::create_dir_all(log_dir)?;
    let threads = spec.clients.clamp(1, 2);
    let mut cmd = base(t.port);
    cmd.args(["-n", "-c", &spec.clients.to_string(), "-j", &threads.to_string()])
        .args(["-T", &spec.secs.to_string(), "-M", spec.protocol.as_str(), "-l"])
        .arg(format!("--log-prefix={}", log_dir.join("tx").display()));
    if spec.select_only {
        cmd.arg("-S");
    }
    if spec.connect_each {
        cmd.arg("-C");
    }
    let out = cmd.arg(APP_DB).output().context("running pgbench")?;
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let mut o = parse_summary(&stdout);
    let (avg, p99) = latencies(log_dir)?;
    o.avg_ms = avg.unwrap_or(o.avg_ms);
    o.p99_ms = p99.unwrap_or(0.0);
    let _ = std::fs::remove_dir_all(log_dir);
    let failed = failed_count(&stdout);
    if !out.status.success() || failed > 0 || o.txns == 0 {
        let why = stderr.lines().find(|l| l.contains("error") || l.contains("ERROR") || l.contains("FATAL"));
        o.failure = Some(format!(
            "pgbench exit {}, {failed} failed txns: {}",
            out.status.code().unwrap_or(-1),
            why.unwrap_or_else(|| stderr.lines().last().unwrap_or("")).trim()
        ));
    }
    Ok(o)
}

fn base(port: u16) -> Command {
    let mut c = Command::new("pgbench");
    c.args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", MD5_USER])
        .env("PGPASSWORD", MD5_PASS)
        .env_remove("PGHOST")
        .env_remove("PGPORT")
        .env_remove("PGDATABASE")
        .env_remove("PGUSER")
        .stdin(Stdio::null());
    c
}

fn parse_summary(stdout: &str) -> Outcome {
    let mut o = Outcome::default();
    for line in stdout.lines() {
        if let Some(v) = line.strip_prefix("tps = ") {
            o.tps = first_number(v);
        } else if let Some(v) = line.strip_prefix("number of transactions actually processed: ") {
            o.txns = first_number(v) as u64;
        } else if let Some(v) = line.strip_prefix("latency average = ") {
            o.avg_ms = first_number(v);
        }
    }
    o
}

fn failed_count(stdout: &str) -> u64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("number of failed transactions: "))
        .map(|v| first_number(v) as u64)
        .unwrap_or(0)
}

fn first_number(s: &str) -> f64 {
    s.split(|c: char| !(c.is_ascii_digit() || c == '.'))
        .find(|w| !w.is_empty())
        .and_then(|w| w.parse().ok())
        .unwrap_or(0.0)
}

/// Average and p99 latency (ms) from pgbench's per-transaction log lines
/// `client_id txn_no time_us script_no epoch epoch_us` (failed ones say
/// "failed"/"skipped" in the time column and are left out).
fn latencies(dir: &Path) -> anyhow::Result<(Option<f64>, Option<f64>)> {
    let mut us: Vec<u64> = Vec::new();
    for entry in std::fs::read_dir(dir)? {
        let text = std::fs::read_to_string(entry?.path())?;
        us.extend(text.lines().filter_map(|l| l.split_whitespace().nth(2)?.parse::<u64>().ok()));
    }
    if us.is_empty() {
        return Ok((None, None));
    }
    us.sort_unstable();
    let avg = us.iter().sum::<u64>() as f64 / us.len() as f64 / 1000.0;
    let p99 = us[(us.len() * 99 / 100).min(us.len() - 1)] as f64 / 1000.0;
    Ok((Some(avg), Some(p99)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pgbench_15_summary() {
        let out = "transaction type: <builtin: select only>\nnumber of clients: 10\n\
                   number of transactions actually processed: 301234\n\
                   number of failed transactions: 0 (0.000%)\nlatency average = 0.263 ms\n\
                   initial connection time = 12.345 ms\ntps = 37654.321 (without initial connection time)\n";
        let o = parse_summary(out);
        assert_eq!(o.txns, 301234);
        assert!((o.tps - 37654.321).abs() < 1e-6);
        assert!((o.avg_ms - 0.263).abs() < 1e-9);
        assert_eq!(failed_count(out), 0);
        assert_eq!(failed_count("number of failed transactions: 12 (0.1%)"), 12);
    }
}
