//! The fleet bench's figures, from the samples and pgbench's seconds, and
//! the table that prints them: per instance TPS and servers held per phase,
//! errors, peak wait, refused connects per second after the first second,
//! time to share (the spare, after the move) and takeover (the loaded
//! survivors, after the kill); per fleet the phase-1 TPS spread and the
//! time until the survivors held what the whole fleet held before the kill.

use super::load::Outcome;
use super::sample::Sample;
use super::Opts;

/// One fleet's run, as measured.
pub struct Run {
    pub label: String,
    /// Member names; the last is the spare that receives the moved load.
    pub names: Vec<String>,
    pub samples: Vec<Sample>,
    /// Per member, in member order: loads 1..N, then the spare's.
    pub outcomes: Vec<Outcome>,
    pub phase_secs: f64,
    pub moved_at: f64,
    pub killed_at: f64,
    pub limit: u32,
    pub pool: u32,
}

/// Index of the member killed in phase 3 (instance 2).
const KILLED: usize = 1;
/// Index of the member whose load moves away in phase 2 (instance 1).
const MOVED_FROM: usize = 0;

impl Run {
    fn spare(&self) -> usize {
        self.names.len() - 1
    }

    /// [start, end) of phase `p` (0-based) on the bench's clock.
    fn phase(&self, p: usize) -> (f64, f64) {
        match p {
            0 => (0.0, self.moved_at),
            1 => (self.moved_at, self.killed_at),
            _ => (self.killed_at, 3.0 * self.phase_secs),
        }
    }

    /// True when member `i` had load in phase `p`.
    fn loaded(&self, i: usize, p: usize) -> bool {
        match p {
            0 => i != self.spare(),
            1 => i != MOVED_FROM,
            _ => i != MOVED_FROM && i != KILLED,
        }
    }

    /// The share the mechanism can give in phase `p`, at sample `s`: the
    /// limit less the slot kept free and the one server each unloaded
    /// instance may keep (its beacon), over the loaded instances.
    fn share_at(&self, p: usize, s: &Sample) -> u32 {
        let members = 0..self.names.len();
        let loaded = members.clone().filter(|&i| self.loaded(i, p)).count().max(1) as u32;
        let unloaded: u32 =
            members.filter(|&i| !self.loaded(i, p)).filter_map(|i| s.pools[i].map(|p| p.held.min(1))).sum();
        (self.limit.saturating_sub(1 + unloaded) / loaded).min(self.pool)
    }

    /// The share in phase `p`, at its last sample.
    fn share(&self, p: usize) -> u32 {
        let (start, end) = self.phase(p);
        let last = self.samples.iter().rev().find(|s| s.at >= start && s.at < end);
        last.map_or(0, |s| self.share_at(p, s))
    }

    /// Mean of pgbench's per-second TPS whose second lies in phase `p`.
    fn tps(&self, i: usize, p: usize) -> Option<f64> {
        let (start, end) = self.phase(p);
        let secs: Vec<f64> = self.outcomes[i]
            .seconds
            .iter()
            .filter(|s| s.at - 0.5 >= start && s.at - 0.5 < end)
            .map(|s| s.tps)
            .collect();
        mean(&secs)
    }

    /// Mean servers member `i` held in phase `p`.
    fn held(&self, i: usize, p: usize) -> Option<f64> {
        let (start, end) = self.phase(p);
        let held: Vec<f64> = self
            .samples
            .iter()
            .filter(|s| s.at >= start && s.at < end)
            .filter_map(|s| s.pools[i].map(|p| p.held as f64))
            .collect();
        mean(&held)
    }

    /// Milliseconds from `since` until `reached` holds for a sample.
    fn time_until(&self, since: f64, reached: impl Fn(&Sample) -> bool) -> Option<f64> {
        self.samples.iter().filter(|s| s.at >= since).find(|s| reached(s)).map(|s| (s.at - since) * 1000.0)
    }

    /// The spare's time to hold its phase-2 share after the move.
    fn to_share(&self) -> Option<f64> {
        let spare = self.spare();
        self.time_until(self.moved_at, |s| s.pools[spare].is_some_and(|p| p.held >= self.share_at(1, s)))
    }

    /// A loaded survivor's time to hold its phase-3 share after the kill.
    fn takeover(&self, i: usize) -> Option<f64> {
        self.time_until(self.killed_at, |s| s.pools[i].is_some_and(|p| p.held >= self.share_at(2, s)))
    }

    /// What the whole fleet held at the last full sample before the kill.
    fn held_before_kill(&self) -> u32 {
        self.samples
            .iter()
            .rev()
            .filter(|s| s.at < self.killed_at && s.pools.iter().all(Option::is_some))
            .map(|s| s.pools.iter().flatten().map(|p| p.held).sum())
            .next()
            .unwrap_or(0)
    }

    /// Time until the survivors together held what the fleet held before.
    fn fleet_takeover(&self, target: u32) -> Option<f64> {
        self.time_until(self.killed_at, |s| {
            let held: u32 =
                s.pools.iter().enumerate().filter(|(i, _)| *i != KILLED).filter_map(|(_, p)| p.map(|p| p.held)).sum();
            held >= target
        })
    }

    /// Refused connects per second after the first second, while the member ran.
    fn refused_per_sec(&self, i: usize) -> Option<f64> {
        let readings: Vec<(f64, u64)> =
            self.samples.iter().filter(|s| s.at >= 1.0).filter_map(|s| Some((s.at, s.refused.as_ref()?[i]?))).collect();
        let (first, last) = (readings.first()?, readings.last()?);
        (last.0 > first.0).then(|| (last.1 - first.1) as f64 / (last.0 - first.0))
    }

    /// Peak maxwait of member `i` over the run, in ms.
    fn peak_wait_ms(&self, i: usize) -> Option<f64> {
        self.samples.iter().filter_map(|s| s.pools[i]).map(|p| p.maxwait_us as f64 / 1000.0).reduce(f64::max)
    }

    /// Mean of pgbench's per-second latency for member `i`'s load, in ms.
    fn lat_ms(&self, i: usize) -> Option<f64> {
        mean(&self.outcomes.get(i)?.seconds.iter().map(|s| s.lat_ms).collect::<Vec<_>>())
    }

    /// Peak of the role's backends in Postgres over the run.
    fn peak_backends(&self) -> Option<i64> {
        self.samples.iter().filter_map(|s| s.pg_backends).max()
    }

    /// Phase-1 TPS of the loaded instances: (mean, lowest, highest).
    fn spread(&self) -> Option<(f64, f64, f64)> {
        let tps: Vec<f64> =
            (0..self.names.len()).filter(|&i| self.loaded(i, 0)).filter_map(|i| self.tps(i, 0)).collect();
        let m = mean(&tps)?;
        Some((m, tps.iter().copied().fold(f64::MAX, f64::min), tps.iter().copied().fold(0.0, f64::max)))
    }

    /// The outcome of member `i`'s load (the spare's is the last).
    fn outcome(&self, i: usize) -> Option<&Outcome> {
        self.outcomes.get(i)
    }
}

fn mean(xs: &[f64]) -> Option<f64> {
    (!xs.is_empty()).then(|| xs.iter().sum::<f64>() / xs.len() as f64)
}

fn opt(x: Option<f64>, decimals: usize) -> String {
    x.map(|v| format!("{v:.decimals$}")).unwrap_or_else(|| "-".into())
}

pub fn print_header(o: &Opts) {
    println!(
        "\nfleet: {} loaded instances + 1 spare, pool {} each, role CONNECTION LIMIT {}, \
         {} -c {} -j 1 per loaded instance, {} s per phase",
        o.instances,
        o.pool,
        o.limit,
        o.script.label(),
        o.clients,
        o.duration
    );
    println!(
        "phase 1: load on 1..{n}; phase 2: the load moves from instance 1 to the spare ({s}); \
         phase 3: instance 2 and its load killed (SIGKILL)",
        n = o.instances,
        s = o.instances + 1
    );
    println!(
        "held = servers in SHOW POOLS (sv_active+sv_idle+sv_used+sv_tested), every 100 ms; \
         share = (limit - 1 - one server per unloaded instance that holds any) / loaded instances"
    );
    println!(
        "errors = pgbench error lines + failed transactions; lat ms = pgbench's mean latency; \
         maxwait = peak SHOW POOLS maxwait (ms)"
    );
    println!(
        "refused/s = connects Postgres refused per second after the first second (weir: \
         weir_server_connect_refused_total; PgBouncer: its log)"
    );
    println!(
        "to share = the spare, from the move until it held its share; takeover = a loaded survivor, \
         from the kill until it held its new share"
    );
}

pub fn print_run(r: &Run) {
    println!("\n{} (share {} in phases 1-2, {} in phase 3)", r.label, r.share(0), r.share(2));
    println!(
        "{:<12}{:>8}{:>8}{:>8}{:>7}{:>7}{:>7}{:>8}{:>8}{:>9}{:>11}{:>10}{:>10}",
        "instance",
        "TPS p1",
        "TPS p2",
        "TPS p3",
        "held1",
        "held2",
        "held3",
        "errors",
        "lat ms",
        "maxwait",
        "refused/s",
        "to share",
        "takeover"
    );
    for (i, name) in r.names.iter().enumerate() {
        let tps = |p| if r.loaded(i, p) && !(p == 2 && i == KILLED) { opt(r.tps(i, p), 0) } else { "-".into() };
        let errors = match r.outcome(i) {
            Some(o) if i == KILLED => format!("{}+kill", o.errors + o.failed),
            Some(o) => (o.errors + o.failed).to_string(),
            None => "-".into(),
        };
        let to_share = if i == r.spare() { ms(r.to_share()) } else { String::new() };
        let takeover = if r.loaded(i, 2) { ms(r.takeover(i)) } else { String::new() };
        println!(
            "{:<12}{:>8}{:>8}{:>8}{:>7}{:>7}{:>7}{:>8}{:>8}{:>9}{:>11}{:>10}{:>10}",
            name,
            tps(0),
            tps(1),
            tps(2),
            opt(r.held(i, 0), 1),
            opt(r.held(i, 1), 1),
            if i == KILLED { "-".into() } else { opt(r.held(i, 2), 1) },
            errors,
            opt(r.lat_ms(i), 1),
            opt(r.peak_wait_ms(i), 0),
            opt(r.refused_per_sec(i), 1),
            to_share,
            takeover
        );
    }
    if let Some((m, lo, hi)) = r.spread() {
        println!(
            "phase 1 TPS: mean {m:.0}, lowest {:+.0} %, highest {:+.0} % of the mean",
            (lo / m - 1.0) * 100.0,
            (hi / m - 1.0) * 100.0
        );
    }
    if let Some(peak) = r.peak_backends() {
        println!("the role's backends in pg_stat_activity: at most {peak} (limit {})", r.limit);
    }
    let target = r.held_before_kill().min(r.limit);
    println!(
        "after the kill: the survivors held the {target} servers the fleet held before within {}",
        ms(r.fleet_takeover(target))
    );
    for (i, o) in r.outcomes.iter().enumerate().filter(|(i, _)| *i != KILLED) {
        if let Some(e) = &o.first_error {
            println!("{}: {e}", r.names[i]);
        }
    }
}

fn ms(x: Option<f64>) -> String {
    x.map(|v| format!("{v:.0} ms")).unwrap_or_else(|| "never".into())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::fleet::load::Second;
    use crate::fleet::sample::Pool;

    /// Three loaded members and a spare, limit 12, 1 s phases; `held(at)`
    /// gives each member's servers at a sample time.
    fn run(held: impl Fn(f64) -> [u32; 4]) -> Run {
        let samples = (0..30)
            .map(|t| {
                let at = t as f64 / 10.0;
                let pools = held(at).iter().map(|&h| Some(Pool { held: h, waiting: 0, maxwait_us: 0 })).collect();
                let refused = (t as u32).is_multiple_of(10).then(|| vec![Some(t as u64), Some(0), Some(0), Some(0)]);
                Sample { at, pools, pg_backends: Some(12), refused }
            })
            .collect();
        let secs = |tps: f64| Outcome {
            seconds: vec![Second { at: 1.0, tps, lat_ms: 1.0 }, Second { at: 2.0, tps: 0.0, lat_ms: 1.0 }],
            ..Outcome::default()
        };
        Run {
            label: "t".into(),
            names: (1..=4).map(|i| format!("m {i}")).collect(),
            samples,
            outcomes: vec![secs(90.0), secs(100.0), secs(110.0), secs(0.0)],
            phase_secs: 1.0,
            moved_at: 1.0,
            killed_at: 2.0,
            limit: 12,
            pool: 10,
        }
    }

    #[test]
    fn shares_times_and_rates_come_from_the_samples() {
        let r = run(|at| match at {
            a if a < 1.0 => [4, 4, 4, 0],
            a if a < 1.3 => [4, 4, 4, 0],
            a if a < 2.0 => [0, 4, 4, 4],
            a if a < 2.5 => [0, 0, 4, 4],
            _ => [0, 0, 6, 6],
        });
        assert_eq!((r.share(0), r.share(1), r.share(2)), (3, 3, 5));
        assert!((r.to_share().unwrap() - 300.0).abs() < 1.0);
        assert!((r.takeover(3).unwrap() - 500.0).abs() < 1.0);
        assert_eq!(r.held_before_kill(), 12);
        assert!((r.fleet_takeover(12).unwrap() - 500.0).abs() < 1.0);
        // Member 1's counter rose from 10 at 1.0 s to 20 at 2.0 s.
        assert!((r.refused_per_sec(0).unwrap() - 10.0).abs() < 1e-9);
        assert_eq!(r.refused_per_sec(1), Some(0.0));
        let (m, lo, hi) = r.spread().unwrap();
        assert_eq!((m, lo, hi), (100.0, 90.0, 110.0));
        assert_eq!(r.held(2, 0), Some(4.0));
    }

    #[test]
    fn a_spare_that_never_holds_its_share_says_so() {
        let r = run(|_| [10, 1, 1, 0]);
        assert_eq!(r.to_share(), None);
        assert_eq!(r.takeover(2), None);
    }
}
