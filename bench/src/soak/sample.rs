//! The per-second sampler: the pooler's RSS, open fds and threads (/proc),
//! pool servers and waiting clients (SHOW POOLS), the load's TPS, p99 latency
//! and errors by SQLSTATE, and server connections opened and closed per
//! second (counted from Postgres's own log, so both poolers are counted the
//! same way). Each sample is a CSV row.

use std::collections::BTreeMap;
use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::Duration;

use weir_testkit::TRUST_USER;

use super::load::Stats;
use super::target;
use crate::suite::procstat;

pub const CSV_HEADER: &str =
    "t_s,rss_kib,fds,threads,servers,waiters,tps,p99_ms,errors,server_opens,server_closes,errors_by_sqlstate";

#[derive(Debug, Clone, Default)]
pub struct Sample {
    pub t: f64,
    pub rss_kib: Option<u64>,
    pub fds: Option<usize>,
    pub threads: Option<u64>,
    pub servers: Option<u64>,
    pub waiters: Option<u64>,
    pub tps: u64,
    pub p99_ms: Option<f64>,
    pub errors: u64,
    pub by_code: BTreeMap<String, u64>,
    pub opens: u64,
    pub closes: u64,
}

impl Sample {
    fn csv(&self) -> String {
        fn o<T: std::fmt::Display>(v: &Option<T>) -> String {
            v.as_ref().map(ToString::to_string).unwrap_or_default()
        }
        let codes: Vec<String> = self.by_code.iter().map(|(c, n)| format!("{c}:{n}")).collect();
        format!(
            "{:.1},{},{},{},{},{},{},{},{},{},{},{}",
            self.t,
            o(&self.rss_kib),
            o(&self.fds),
            o(&self.threads),
            o(&self.servers),
            o(&self.waiters),
            self.tps,
            self.p99_ms.map(|p| format!("{p:.2}")).unwrap_or_default(),
            self.errors,
            self.opens,
            self.closes,
            codes.join(";")
        )
    }
}

/// What the sampler reads.
pub struct Sources {
    pub pid: u32,
    pub addr: String,
    pub pg_log: PathBuf,
    pub stats: Arc<Stats>,
    pub csv: PathBuf,
}

/// Samples every second until `stop`; returns every sample.
pub async fn run(src: Sources, stop: Arc<AtomicBool>) -> anyhow::Result<Vec<Sample>> {
    let mut out = std::fs::File::create(&src.csv)?;
    writeln!(out, "{CSV_HEADER}")?;
    let mut log = LogCounter::new(src.pg_log.clone());
    let mut admin = None;
    let mut seen_errors = 0;
    let mut samples = Vec::new();
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    while !stop.load(Ordering::SeqCst) {
        tick.tick().await;
        let mut s = Sample { t: src.stats.now(), ..Sample::default() };
        s.rss_kib = procstat::rss_kib(src.pid);
        s.fds = std::fs::read_dir(format!("/proc/{}/fd", src.pid)).ok().map(|d| d.count());
        s.threads = threads(src.pid);
        if admin.is_none() {
            admin = target::admin(&src.addr).await.ok();
        }
        if let Some(a) = &admin {
            match target::pool_counts(a).await {
                Ok((sv, w)) => (s.servers, s.waiters) = (Some(sv), Some(w)),
                Err(_) => admin = None,
            }
        }
        (s.tps, s.p99_ms) = src.stats.take_second();
        {
            let errors = src.stats.errors.lock().expect("errors");
            for e in &errors[seen_errors..] {
                *s.by_code.entry(e.code.clone()).or_default() += 1;
            }
            s.errors = (errors.len() - seen_errors) as u64;
            seen_errors = errors.len();
        }
        (s.opens, s.closes) = log.take();
        writeln!(out, "{}", s.csv())?;
        samples.push(s);
    }
    out.flush()?;
    Ok(samples)
}

fn threads(pid: u32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    text.lines().find(|l| l.starts_with("Threads:"))?.split_whitespace().nth(1)?.parse().ok()
}

/// Counts the pooler's server logins and logouts in Postgres's log
/// (`log_connections`, `log_disconnections`) since the last call.
struct LogCounter {
    path: PathBuf,
    offset: u64,
    partial: String,
}

impl LogCounter {
    fn new(path: PathBuf) -> LogCounter {
        let offset = std::fs::metadata(&path).map(|m| m.len()).unwrap_or(0);
        LogCounter { path, offset, partial: String::new() }
    }

    fn take(&mut self) -> (u64, u64) {
        let Ok(mut f) = std::fs::File::open(&self.path) else { return (0, 0) };
        if f.seek(SeekFrom::Start(self.offset)).is_err() {
            return (0, 0);
        }
        let mut bytes = Vec::new();
        let Ok(n) = f.read_to_end(&mut bytes) else { return (0, 0) };
        self.offset += n as u64;
        let text = std::mem::take(&mut self.partial) + &String::from_utf8_lossy(&bytes);
        let (whole, rest) = text.rsplit_once('\n').unwrap_or(("", &text));
        self.partial = rest.to_string();
        let who = format!("user={TRUST_USER}");
        let opens = whole.lines().filter(|l| l.contains("connection authorized:") && l.contains(&who)).count();
        let closes = whole.lines().filter(|l| l.contains("disconnection:") && l.contains(&who)).count();
        (opens as u64, closes as u64)
    }
}
