//! The load on one member: `pgbench -P 1` running a script (pgbench's
//! select-only, or one `select pg_sleep(0.005)` per transaction, read from
//! standard input) for a number of seconds, its
//! per-second progress lines read as they come (TPS and latency per second,
//! placed on the bench's clock), its error lines and failed transactions
//! counted. A load can be killed with its pooler (the pod is gone).

use std::io::{BufRead, BufReader, Read, Write};
use std::process::{Child, Command, Stdio};
use std::thread::JoinHandle;
use std::time::Instant;

use anyhow::Context;
use weir_testkit::{APP_DB, TRUST_USER};

/// What each pgbench transaction runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Script {
    /// pgbench -S: one primary-key select on pgbench_accounts. On a small
    /// machine TPS is bound by CPU as much as by the servers held.
    Select,
    /// `select pg_sleep(0.005)`: each transaction holds its server 5 ms, so
    /// TPS follows the servers an instance holds.
    Sleep,
}

/// The `sleep` script's one statement.
const SLEEP_SQL: &str = "select pg_sleep(0.005);\n";

impl Script {
    pub fn parse(s: &str) -> anyhow::Result<Script> {
        match s {
            "select" => Ok(Script::Select),
            "sleep" => Ok(Script::Sleep),
            other => anyhow::bail!("--script is select or sleep, not {other}"),
        }
    }

    /// How the bench's header names the workload.
    pub fn label(self) -> &'static str {
        match self {
            Script::Select => "pgbench -S",
            Script::Sleep => "pgbench -f (select pg_sleep(0.005))",
        }
    }

    /// pgbench's arguments for the script (`-f -` reads it from stdin).
    fn args(self) -> &'static [&'static str] {
        match self {
            Script::Select => &["-S"],
            Script::Sleep => &["-f", "-"],
        }
    }
}

/// One second of pgbench's progress.
#[derive(Debug, Clone, Copy)]
pub struct Second {
    /// When pgbench reported the second (its end), in seconds on the bench's clock.
    pub at: f64,
    pub tps: f64,
    pub lat_ms: f64,
}

/// What one pgbench run produced.
#[derive(Debug, Default)]
pub struct Outcome {
    pub seconds: Vec<Second>,
    /// pgbench's error lines: a client aborted by an error, a connection
    /// that failed (at start pgbench then gives up altogether).
    pub errors: u64,
    /// pgbench's "number of failed transactions".
    pub failed: u64,
    pub first_error: Option<String>,
    /// True when the run was killed with its pooler.
    pub killed: bool,
}

/// A running pgbench.
pub struct Load {
    child: Child,
    stderr: JoinHandle<Outcome>,
    killed: bool,
}

impl Load {
    /// `pgbench <script> -c clients -T secs -P 1` against 127.0.0.1:`port`;
    /// its seconds are placed on the bench's clock, which started at `t0`.
    pub fn start(port: u16, script: Script, clients: u32, secs: u64, t0: Instant) -> anyhow::Result<Load> {
        let mut child = Command::new("pgbench")
            .args(["-h", "127.0.0.1", "-p", &port.to_string(), "-U", TRUST_USER, "-n", "-j", "1"])
            .args(script.args())
            .args(["-c", &clients.to_string(), "-T", &secs.to_string(), "-P", "1", APP_DB])
            .env_remove("PGHOST")
            .env_remove("PGPORT")
            .env_remove("PGDATABASE")
            .env_remove("PGUSER")
            .stdin(if script == Script::Sleep { Stdio::piped() } else { Stdio::null() })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .context("running pgbench")?;
        if let Some(mut stdin) = child.stdin.take() {
            // Dropped here: pgbench reads the script to its end before it starts.
            stdin.write_all(SLEEP_SQL.as_bytes()).context("writing pgbench's script")?;
        }
        let err = child.stderr.take().context("pgbench stderr")?;
        let stderr = std::thread::spawn(move || read_stderr(err, t0));
        Ok(Load { child, stderr, killed: false })
    }

    /// Ends the run at once (SIGKILL).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        self.killed = true;
    }

    /// Waits for the run to end and collects its figures.
    pub fn finish(mut self) -> anyhow::Result<Outcome> {
        let mut stdout = String::new();
        if let Some(mut out) = self.child.stdout.take() {
            let _ = out.read_to_string(&mut stdout);
        }
        self.child.wait()?;
        let mut o = self.stderr.join().map_err(|_| anyhow::anyhow!("pgbench reader panicked"))?;
        o.failed = failed_count(&stdout);
        o.killed = self.killed;
        Ok(o)
    }
}

/// Each progress line is placed where it arrived on the bench's clock
/// (pgbench prints it as its second ends).
fn read_stderr(err: impl Read, t0: Instant) -> Outcome {
    let mut o = Outcome::default();
    for line in BufReader::new(err).lines().map_while(Result::ok) {
        if let Some(s) = parse_progress(&line) {
            o.seconds.push(Second { at: t0.elapsed().as_secs_f64(), ..s });
        } else if line.contains("error:") {
            o.errors += 1;
            o.first_error.get_or_insert(line);
        }
    }
    o
}

/// `progress: 3.0 s, 4039.2 tps, lat 4.946 ms stddev 1.234, 0 failed`.
pub fn parse_progress(line: &str) -> Option<Second> {
    let rest = line.strip_prefix("progress: ")?;
    let mut parts = rest.split(", ");
    let at = parts.next()?.strip_suffix(" s")?.parse().ok()?;
    let tps = parts.next()?.strip_suffix(" tps")?.parse().ok()?;
    let lat_ms = parts.next()?.strip_prefix("lat ")?.split(' ').next()?.parse().ok()?;
    Some(Second { at, tps, lat_ms })
}

fn failed_count(stdout: &str) -> u64 {
    stdout
        .lines()
        .find_map(|l| l.strip_prefix("number of failed transactions: "))
        .and_then(|v| v.split(' ').next()?.parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_pgbench_progress_and_failures() {
        let s = parse_progress("progress: 3.0 s, 4039.2 tps, lat 4.946 ms stddev 1.234, 0 failed").unwrap();
        assert_eq!((s.at, s.tps, s.lat_ms), (3.0, 4039.2, 4.946));
        assert!(parse_progress("pgbench: error: client 3 aborted").is_none());
        assert_eq!(failed_count("number of failed transactions: 12 (0.1%)\n"), 12);
        assert_eq!(failed_count("tps = 1\n"), 0);
    }

    #[test]
    fn a_script_is_named_by_its_flag() {
        assert_eq!(Script::parse("select").unwrap(), Script::Select);
        assert_eq!(Script::parse("sleep").unwrap().args(), &["-f", "-"]);
        assert!(Script::parse("tpcb").is_err());
    }
}
