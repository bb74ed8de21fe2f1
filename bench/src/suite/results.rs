//! What one suite run measured, row by row, with the header that says how
//! and where it ran. `report` and its helpers turn it into tables.

use std::fmt::Write as _;
use std::path::Path;
use std::time::Duration;

use weir_testkit::PgServer;

use super::env::{first_line, workspace_root};
use super::idle::IdleCell;
use super::opts::Opts;
use super::stream::StreamResult;
use super::targets::{Id, Kind, Target, POOL_SIZE};
use super::workloads::Row;

pub struct Results {
    pub header: String,
    pub ids: Vec<Id>,
    pub rows: Vec<Row>,
    pub stream: Option<StreamResult>,
    pub idle: Option<Vec<IdleCell>>,
    pub elapsed: Duration,
}

impl Results {
    /// `poolers`: the PgBouncer and pg_doorman binaries run, if any.
    pub fn new(opts: &Opts, pg: &PgServer, poolers: [Option<&Path>; 2], targets: &[Target]) -> Results {
        let pg_version = pg.psql("postgres", "show server_version").unwrap_or_else(|_| "?".into());
        let [pgbouncer, doorman] = poolers;
        let pgb = pgbouncer.map(|b| first_line(&b.display().to_string(), &["--version"]));
        let doorman = doorman.map(|b| first_line(&b.display().to_string(), &["--version"]));
        let rev = first_line("git", &["-C", &workspace_root().display().to_string(), "rev-parse", "--short", "HEAD"]);
        let cpu = std::fs::read_to_string("/proc/cpuinfo")
            .ok()
            .and_then(|t| {
                t.lines()
                    .find(|l| l.starts_with("model name"))
                    .map(|l| l.split(':').nth(1).unwrap_or("").trim().to_owned())
            })
            .unwrap_or_default();
        let cores = std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0);
        let mut h = String::new();
        let _ = writeln!(h, "- command: `{}`", opts.command);
        let _ = writeln!(
            h,
            "- machine: {cores} cores ({cpu}); Postgres {pg_version}; {}; {}; weir at git {rev} (release binary)",
            pgb.unwrap_or_else(|| if opts.want(Kind::PgBouncer) {
                "PgBouncer not installed: skipped".into()
            } else {
                "PgBouncer not run".into()
            }),
            doorman.unwrap_or_else(|| "pg_doorman not run (--doorman-bin)".into())
        );
        let _ = writeln!(
            h,
            "- setup: pool {POOL_SIZE}, transaction mode, md5 client auth for every target; pgbench scale {}, -j 2; \
             {} interleaved rounds per workload (A B C A B C …), medians; headline runs {} s, others {} s; \
             worker threads for weir and pg_doorman: {}{}",
            opts.scale,
            opts.rounds,
            opts.duration,
            opts.short_duration(),
            opts.threads.iter().map(u32::to_string).collect::<Vec<_>>().join(", "),
            if opts.busy_neighbour {
                "; rows marked \"busy neighbour\" ran beside a thread of the bench spinning on one core"
            } else {
                ""
            }
        );
        let _ = writeln!(
            h,
            "- latency from pgbench's per-transaction log (`-l`); proxy CPU = utime+stime from /proc/PID/stat around each run ÷ transactions; \
             peak RSS = VmHWM (reset per workload)"
        );
        Results {
            header: h,
            ids: targets.iter().map(Target::id).collect(),
            rows: vec![],
            stream: None,
            idle: None,
            elapsed: Duration::ZERO,
        }
    }
}
