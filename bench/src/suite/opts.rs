//! The suite's command-line flags.

use std::path::PathBuf;

use anyhow::{bail, Context};

use super::targets::Kind;

pub const USAGE: &str = "usage: weir-bench suite [options]
  --quick              ~5 s smoke run: -S -c 10 for 2 s against direct and weir (for CI)
  --duration S         seconds per run of the headline workloads (default 8; others get half)
  --rounds N           interleaved rounds per workload, medians reported (default 3)
  --scale N            pgbench scale factor (default 10)
  --idle N             idle clients for the memory scenario (default 10000; 0 skips)
  --stream-mb N        size of the large-result stream in MB (default 1000; 0 skips)
  --targets LIST       comma-separated subset of direct,weir,pgbouncer,pg_doorman (default all)
  --only LIST          comma-separated substrings: run only workloads whose id matches
  --weir-bin PATH      use this weir binary (default: build target/release/weir first)
  --doorman-bin PATH   also run pg_doorman (this binary) with the same pool, auth and threads
  --threads LIST       worker threads for weir and pg_doorman, one target each (default 1; e.g. 1,2)
  --busy-neighbour     run every workload twice: as is, and beside a thread spinning on one core
  --out DIR            where results go (default bench/results)";

/// What to run.
#[derive(Debug, Clone)]
pub struct Opts {
    pub quick: bool,
    pub duration: u64,
    pub rounds: usize,
    pub scale: u32,
    pub idle: usize,
    pub stream_mb: u64,
    pub targets: Vec<Kind>,
    pub only: Vec<String>,
    pub weir_bin: Option<PathBuf>,
    pub doorman_bin: Option<PathBuf>,
    /// Worker threads for weir and pg_doorman: one target per entry.
    pub threads: Vec<u32>,
    /// Each workload also runs beside a thread spinning on one core.
    pub busy_neighbour: bool,
    pub out: PathBuf,
    /// The command line, for the report.
    pub command: String,
}

impl Opts {
    pub fn parse(args: &[String]) -> anyhow::Result<Opts> {
        let mut o = Opts {
            quick: false,
            duration: 8,
            rounds: 3,
            scale: 10,
            idle: 10_000,
            stream_mb: 1000,
            targets: vec![Kind::Direct, Kind::Weir, Kind::PgBouncer, Kind::Doorman],
            only: vec![],
            weir_bin: None,
            doorman_bin: None,
            threads: vec![1],
            busy_neighbour: false,
            out: super::env::workspace_root().join("bench/results"),
            command: std::iter::once("cargo run --release -p weir-bench -- suite".to_string())
                .chain(args.iter().cloned())
                .collect::<Vec<_>>()
                .join(" "),
        };
        let mut named_targets = false;
        let mut it = args.iter();
        while let Some(a) = it.next() {
            let mut value = || it.next().with_context(|| format!("{a} needs a value\n{USAGE}"));
            match a.as_str() {
                "--quick" => o.quick = true,
                "--duration" => o.duration = value()?.parse().context("--duration")?,
                "--rounds" => o.rounds = value()?.parse().context("--rounds")?,
                "--scale" => o.scale = value()?.parse().context("--scale")?,
                "--idle" => o.idle = value()?.parse().context("--idle")?,
                "--stream-mb" => o.stream_mb = value()?.parse().context("--stream-mb")?,
                "--targets" => {
                    o.targets = parse_targets(value()?)?;
                    named_targets = true;
                }
                "--only" => o.only = value()?.split(',').map(str::to_owned).collect(),
                "--weir-bin" => o.weir_bin = Some(PathBuf::from(value()?)),
                "--doorman-bin" => o.doorman_bin = Some(PathBuf::from(value()?)),
                "--threads" => o.threads = parse_threads(value()?)?,
                "--busy-neighbour" | "--busy-neighbor" => o.busy_neighbour = true,
                "--out" => o.out = PathBuf::from(value()?),
                "-h" | "--help" => {
                    println!("{USAGE}");
                    std::process::exit(0);
                }
                other => bail!("unknown option {other}\n{USAGE}"),
            }
        }
        if o.quick {
            o.duration = 2;
            o.rounds = 1;
            o.scale = 1;
            o.idle = 0;
            o.stream_mb = 0;
            o.targets.retain(|k| !matches!(k, Kind::PgBouncer | Kind::Doorman));
        }
        if named_targets && o.want(Kind::Doorman) && o.doorman_bin.is_none() {
            bail!("--targets names pg_doorman: give its binary with --doorman-bin PATH");
        }
        if o.rounds == 0 || o.duration == 0 {
            bail!("--rounds and --duration must be at least 1");
        }
        Ok(o)
    }

    pub fn want(&self, kind: Kind) -> bool {
        self.targets.contains(&kind)
    }

    /// Whether a workload id passes `--only`.
    pub fn selected(&self, id: &str) -> bool {
        self.only.is_empty() || self.only.iter().any(|s| id.contains(s.as_str()))
    }

    /// Open files this process and the proxies it starts need.
    pub fn fd_limit_wanted(&self) -> u64 {
        self.idle as u64 + 2_000
    }

    /// Seconds for a secondary (non-headline) workload.
    pub fn short_duration(&self) -> u64 {
        (self.duration / 2).max(2)
    }
}

fn parse_targets(list: &str) -> anyhow::Result<Vec<Kind>> {
    list.split(',')
        .map(|s| match s.trim() {
            "direct" => Ok(Kind::Direct),
            "weir" => Ok(Kind::Weir),
            "pgbouncer" => Ok(Kind::PgBouncer),
            "pg_doorman" | "doorman" => Ok(Kind::Doorman),
            other => bail!("unknown target {other:?} (direct, weir, pgbouncer, pg_doorman)"),
        })
        .collect()
}

fn parse_threads(list: &str) -> anyhow::Result<Vec<u32>> {
    let mut out = vec![];
    for s in list.split(',') {
        let n: u32 = s.trim().parse().with_context(|| format!("--threads: {s:?} is not a number"))?;
        if n == 0 {
            bail!("--threads: each entry must be at least 1");
        }
        if !out.contains(&n) {
            out.push(n);
        }
    }
    Ok(out)
}
