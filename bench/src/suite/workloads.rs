//! The pgbench workloads and the interleaved runner: for each workload,
//! round after round, every target in turn (direct, weir, PgBouncer,
//! pg_doorman, direct, weir, …), so machine drift hits all alike; medians per
//! target. With `--busy-neighbour` each workload runs again beside a thread
//! spinning on one core (its own row, id suffix `+busy`).

use super::env::WorkDir;
use super::neighbour::Neighbour;
use super::opts::Opts;
use super::pgbench::{self, Outcome, Protocol, Spec};
use super::targets::{Id, Kind, Target};

/// One row of the table.
#[derive(Debug, Clone)]
pub struct Workload {
    pub id: String,
    pub title: String,
    pub spec: Spec,
    /// Direct Postgres is not run (the reason goes in the table).
    pub skip_direct: Option<&'static str>,
    /// Runs beside a thread spinning on one core.
    pub busy: bool,
}

/// Medians over the rounds for one target.
#[derive(Debug, Clone, Default)]
pub struct Cell {
    pub tps: f64,
    pub avg_ms: f64,
    pub p99_ms: f64,
    /// Proxy CPU per transaction in µs (None for direct).
    pub cpu_us_per_txn: Option<f64>,
    /// The user-space part of it (the rest is the kernel's, mostly socket work).
    pub user_us_per_txn: Option<f64>,
    /// Proxy CPU as a share of one core while the workload ran.
    pub cpu_share: Option<f64>,
    pub peak_rss_kib: Option<u64>,
    pub failure: Option<String>,
    pub skipped: Option<&'static str>,
}

/// A workload's results, one cell per target.
#[derive(Debug, Clone)]
pub struct Row {
    pub workload: Workload,
    pub cells: Vec<(Id, Cell)>,
}

impl Row {
    /// The cell of the first target of this kind (the first `--threads` entry).
    pub fn cell(&self, kind: Kind) -> Option<&Cell> {
        self.cells.iter().find(|(id, _)| id.kind == kind).map(|(_, c)| c)
    }

    pub fn cell_of(&self, id: Id) -> Option<&Cell> {
        self.cells.iter().find(|(i, _)| *i == id).map(|(_, c)| c)
    }
}

/// The workloads, in run order: id, title, select-only, clients, protocol,
/// a new connection per transaction, and whether it is a headline run (the
/// full `--duration`; the others get half).
const TABLE: &[(&str, &str, bool, u32, Protocol, bool, bool)] = &[
    ("S-c10-simple", "-S -c 10, simple", true, 10, Protocol::Simple, false, true),
    ("S-c10-extended", "-S -c 10, extended", true, 10, Protocol::Extended, false, true),
    ("S-c10-prepared", "-S -c 10, prepared", true, 10, Protocol::Prepared, false, false),
    ("S-c100-simple", "-S -c 100, simple", true, 100, Protocol::Simple, false, true),
    ("S-c100-extended", "-S -c 100, extended", true, 100, Protocol::Extended, false, true),
    ("S-c1000-simple", "-S -c 1000, simple", true, 1000, Protocol::Simple, false, false),
    ("S-c1000-extended", "-S -c 1000, extended", true, 1000, Protocol::Extended, false, false),
    ("tpcb-c10", "TPC-B -c 10, simple", false, 10, Protocol::Simple, false, false),
    ("tpcb-c10-extended", "TPC-B -c 10, extended", false, 10, Protocol::Extended, false, false),
    ("S-C-c10", "-S -C -c 10 (connect per txn)", true, 10, Protocol::Simple, true, false),
    ("S-c1-simple", "-S -c 1, simple (latency)", true, 1, Protocol::Simple, false, false),
];

pub fn list(opts: &Opts) -> Vec<Workload> {
    // --quick: the first row only.
    let rows = if opts.quick { &TABLE[..1] } else { TABLE };
    rows.iter()
        .map(|&(id, title, select_only, clients, protocol, connect_each, headline)| Workload {
            id: id.into(),
            title: title.into(),
            spec: Spec {
                select_only,
                clients,
                protocol,
                connect_each,
                secs: if headline { opts.duration } else { opts.short_duration() },
            },
            // Measured: 1,000 md5 backends take most of a 4 s run to start on
            // 2 cores (0 to 3,400 tps seen, 0 in some rounds); not a useful baseline.
            skip_direct: (clients >= 1000)
                .then_some("1,000 direct backends spend the run connecting (0-3,400 tps seen on 2 cores)"),
            busy: false,
        })
        .filter(|w| opts.quick || opts.selected(&w.id))
        .flat_map(|w| {
            let busy = opts.busy_neighbour.then(|| Workload {
                id: format!("{}+busy", w.id),
                title: format!("{}, busy neighbour", w.title),
                busy: true,
                ..w.clone()
            });
            std::iter::once(w).chain(busy)
        })
        .collect()
}

/// Runs one workload over all targets, interleaved, and takes medians.
pub fn run(w: &Workload, targets: &[Target], opts: &Opts, work: &WorkDir) -> anyhow::Result<Row> {
    eprintln!("== {} ({} s × {} rounds)", w.title, w.spec.secs, opts.rounds);
    let neighbour = w.busy.then(Neighbour::start);
    let mut samples: Vec<Vec<Sample>> = targets.iter().map(|_| Vec::new()).collect();
    for t in targets {
        t.reset_peak();
    }
    for round in 0..opts.rounds {
        for (i, t) in targets.iter().enumerate() {
            if t.kind == Kind::Direct && w.skip_direct.is_some() {
                continue;
            }
            let s = measure(t, &w.spec, work)?;
            eprintln!("   round {} {:>15}: {}", round + 1, t.label(), s.brief());
            samples[i].push(s);
        }
    }
    if let Some(turns) = neighbour.map(Neighbour::stop) {
        eprintln!("   (the busy neighbour spun {turns} loop turns)");
    }
    let cells = targets
        .iter()
        .zip(samples)
        .map(|(t, s)| {
            let mut cell = summarize(&s);
            cell.peak_rss_kib = t.peak_rss_kib();
            if t.kind == Kind::Direct {
                cell.skipped = w.skip_direct;
            }
            (t.id(), cell)
        })
        .collect();
    Ok(Row { workload: w.clone(), cells })
}

/// One run with the proxy's CPU time around it.
struct Sample {
    outcome: Outcome,
    cpu_secs: Option<f64>,
    user_secs: Option<f64>,
    wall_secs: f64,
}

impl Sample {
    fn brief(&self) -> String {
        let o = &self.outcome;
        let cpu = match self.cpu_secs {
            Some(c) if o.txns > 0 => format!(", proxy {:.1} µs/txn", c * 1e6 / o.txns as f64),
            _ => String::new(),
        };
        let fail = o.failure.as_deref().map(|f| format!("  FAILS: {f}")).unwrap_or_default();
        format!("{:>9.0} tps, avg {:.3} ms, p99 {:.3} ms{cpu}{fail}", o.tps, o.avg_ms, o.p99_ms)
    }
}

fn measure(t: &Target, spec: &Spec, work: &WorkDir) -> anyhow::Result<Sample> {
    let before = t.cpu_split();
    let started = std::time::Instant::now();
    let outcome = pgbench::run(t, spec, &work.path().join("pgbench-log"))?;
    let wall_secs = started.elapsed().as_secs_f64();
    let (cpu_secs, user_secs) = match (before, t.cpu_split()) {
        (Some((u0, s0)), Some((u1, s1))) => (Some(u1 + s1 - u0 - s0), Some(u1 - u0)),
        _ => (None, None),
    };
    Ok(Sample { outcome, cpu_secs, user_secs, wall_secs })
}

fn summarize(samples: &[Sample]) -> Cell {
    if samples.is_empty() {
        return Cell::default();
    }
    let failure = samples.iter().find_map(|s| s.outcome.failure.clone());
    let ok: Vec<&Sample> = samples.iter().filter(|s| s.outcome.failure.is_none()).collect();
    let use_set: Vec<&Sample> = if ok.is_empty() { samples.iter().collect() } else { ok };
    let per_txn: Vec<f64> = use_set
        .iter()
        .filter(|s| s.outcome.txns > 0)
        .filter_map(|s| s.cpu_secs.map(|c| c * 1e6 / s.outcome.txns as f64))
        .collect();
    let user: Vec<f64> = use_set
        .iter()
        .filter(|s| s.outcome.txns > 0)
        .filter_map(|s| s.user_secs.map(|c| c * 1e6 / s.outcome.txns as f64))
        .collect();
    let share: Vec<f64> = use_set.iter().filter_map(|s| s.cpu_secs.map(|c| c / s.wall_secs)).collect();
    Cell {
        tps: median(use_set.iter().map(|s| s.outcome.tps).collect()),
        avg_ms: median(use_set.iter().map(|s| s.outcome.avg_ms).collect()),
        p99_ms: median(use_set.iter().map(|s| s.outcome.p99_ms).collect()),
        cpu_us_per_txn: (!per_txn.is_empty()).then(|| median(per_txn)),
        user_us_per_txn: (!user.is_empty()).then(|| median(user)),
        cpu_share: (!share.is_empty()).then(|| median(share)),
        peak_rss_kib: None,
        failure,
        skipped: None,
    }
}

pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return 0.0;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}
