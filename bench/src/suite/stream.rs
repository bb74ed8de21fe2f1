//! The large-result stream: `COPY (SELECT repeat('x', 999) FROM
//! generate_series(1, N)) TO STDOUT` through psql into /dev/null, N rows of
//! exactly 1,000 bytes, timed per target (interleaved rounds, medians).

use std::process::{Command, Stdio};
use std::time::Instant;

use anyhow::{bail, Context};
use weir_testkit::{APP_DB, MD5_PASS, MD5_USER};

use super::opts::Opts;
use super::targets::{Id, Target};
use super::workloads::median;

const ROW_BYTES: u64 = 1000;

/// Medians for one target.
#[derive(Debug, Clone)]
pub struct StreamCell {
    pub id: Id,
    pub mb_per_s: f64,
    /// Proxy CPU seconds spent per GB passed (None for direct).
    pub cpu_s_per_gb: Option<f64>,
}

#[derive(Debug, Clone)]
pub struct StreamResult {
    pub megabytes: u64,
    pub cells: Vec<StreamCell>,
}

pub fn run(targets: &[Target], opts: &Opts) -> anyhow::Result<StreamResult> {
    let rows = opts.stream_mb * 1_000_000 / ROW_BYTES;
    let sql = format!("COPY (SELECT repeat('x', {}) FROM generate_series(1, {rows})) TO STDOUT", ROW_BYTES - 1);
    let megabytes = rows * ROW_BYTES / 1_000_000;
    eprintln!("== large-result stream: {megabytes} MB via COPY TO STDOUT × {} rounds", opts.rounds);
    let mut rates: Vec<Vec<f64>> = targets.iter().map(|_| vec![]).collect();
    let mut cpus: Vec<Vec<f64>> = targets.iter().map(|_| vec![]).collect();
    for round in 0..opts.rounds {
        for (i, t) in targets.iter().enumerate() {
            let cpu0 = t.cpu_secs();
            let started = Instant::now();
            copy_out(t.port, &sql)?;
            let secs = started.elapsed().as_secs_f64();
            let rate = megabytes as f64 / secs;
            if let (Some(a), Some(b)) = (cpu0, t.cpu_secs()) {
                cpus[i].push((b - a) / (megabytes as f64 / 1000.0));
            }
            eprintln!("   round {} {:>15}: {rate:.0} MB/s", round + 1, t.label());
            rates[i].push(rate);
        }
    }
    let cells = targets
        .iter()
        .zip(rates.into_iter().zip(cpus))
        .map(|(t, (r, c))| StreamCell {
            id: t.id(),
            mb_per_s: median(r),
            cpu_s_per_gb: (!c.is_empty()).then(|| median(c)),
        })
        .collect();
    Ok(StreamResult { megabytes, cells })
}

fn copy_out(port: u16, sql: &str) -> anyhow::Result<()> {
    let out = Command::new("psql")
        .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", MD5_USER, "-d", APP_DB, "-X", "-q", "-c", sql])
        .env("PGPASSWORD", MD5_PASS)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .output()
        .context("running psql")?;
    if !out.status.success() {
        bail!("psql COPY failed: {}", String::from_utf8_lossy(&out.stderr));
    }
    Ok(())
}
