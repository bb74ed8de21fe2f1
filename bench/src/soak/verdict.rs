//! The soak's verdict: the ledger checked against Postgres's own data (lost,
//! duplicated, rows of transactions the client saw fail, the counter), and
//! the done-means checks over the samples and the fault log.

use std::collections::{BTreeMap, HashMap};
use std::fmt::Write as _;

use super::faults::{Fault, Record};
use super::load::{ErrorEvent, Outcome};
use super::sample::Sample;

/// The ledger, client-side outcomes against the rows in Postgres.
#[derive(Debug, Default)]
pub struct Ledger {
    pub acked: u64,
    pub failed: u64,
    pub ambiguous: u64,
    pub ambiguous_committed: u64,
    pub vanished: u64,
    /// Acknowledged commits with no row.
    pub lost: u64,
    /// Ids with more than one row.
    pub duplicated: u64,
    /// Rows of transactions the client saw fail (definitely) or abandoned.
    pub phantom: u64,
    /// Rows whose id no client recorded.
    pub unrecorded: u64,
    pub rows: i64,
    pub counter: i64,
}

impl Ledger {
    /// Compares the client's records with `rows` (id -> row count).
    pub fn check(records: &[(i64, Outcome)], rows: &HashMap<i64, i64>, total: i64, counter: i64) -> Ledger {
        let mut l = Ledger { rows: total, counter, ..Ledger::default() };
        let mut recorded = HashMap::with_capacity(records.len());
        for &(id, outcome) in records {
            recorded.insert(id, outcome);
            let n = rows.get(&id).copied().unwrap_or(0);
            match outcome {
                Outcome::Acked => {
                    l.acked += 1;
                    l.lost += u64::from(n == 0);
                }
                Outcome::Failed => {
                    l.failed += 1;
                    l.phantom += u64::from(n > 0);
                }
                Outcome::Vanished => {
                    l.vanished += 1;
                    l.phantom += u64::from(n > 0);
                }
                Outcome::Ambiguous => {
                    l.ambiguous += 1;
                    l.ambiguous_committed += u64::from(n > 0);
                }
            }
        }
        for (id, &n) in rows {
            l.duplicated += u64::from(n > 1);
            l.unrecorded += u64::from(!recorded.contains_key(id));
        }
        l
    }

    pub fn ok(&self) -> bool {
        self.lost == 0 && self.duplicated == 0 && self.phantom == 0 && self.unrecorded == 0 && self.rows == self.counter
    }
}

/// One done-means check.
pub struct Check {
    pub name: &'static str,
    pub ok: bool,
    pub detail: String,
}

/// Whether `t` falls in a fault's window: from a second before its start
/// until its recovery limit (and 3 s for exchanges in flight) after its end.
pub fn explained(t: f64, faults: &[Record]) -> Option<Fault> {
    faults
        .iter()
        .find(|r| t >= r.start - 1.0 && t <= r.end + r.fault.recovery_limit().as_secs_f64() + 3.0)
        .map(|r| r.fault)
}

/// Errors outside every fault's window, by label (SQLSTATE).
pub fn unexplained(errors: &[ErrorEvent], faults: &[Record]) -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for e in errors.iter().filter(|e| explained(e.t, faults).is_none()) {
        *out.entry(format!("{} ({})", e.code, e.who)).or_default() += 1;
    }
    out
}

/// RSS at the baseline (the first sample at or after `baseline_t`) and at
/// the end of the load (the last sample at or before `end_t`).
pub fn rss_pair(samples: &[Sample], baseline_t: f64, end_t: f64) -> (Option<u64>, Option<u64>) {
    let base = samples.iter().find(|s| s.t >= baseline_t).and_then(|s| s.rss_kib);
    let last = samples.iter().rev().find(|s| s.t <= end_t).and_then(|s| s.rss_kib);
    (base, last)
}

/// The RSS check: the end within 10 % of the baseline.
pub fn rss_check(base: Option<u64>, last: Option<u64>, baseline_t: f64) -> Check {
    match (base, last) {
        (Some(b), Some(l)) => {
            let change = (l as f64 - b as f64) / b as f64 * 100.0;
            Check {
                name: "RSS after the last fault within 10 % of the baseline",
                ok: change.abs() <= 10.0,
                detail: format!(
                    "{:.1} MiB at t={baseline_t:.0} s, {:.1} MiB at the end ({change:+.1} %)",
                    b as f64 / 1024.0,
                    l as f64 / 1024.0
                ),
            }
        }
        _ => Check { name: "RSS after the last fault within 10 % of the baseline", ok: false, detail: "no RSS".into() },
    }
}

/// Recovery of every fault within its limit.
pub fn recovery_check(faults: &[Record]) -> Check {
    let late: Vec<String> = faults
        .iter()
        .filter(|r| r.recovered_after.is_none_or(|s| s > r.fault.recovery_limit().as_secs_f64()))
        .map(|r| format!("{} at {:.0} s", r.fault.name(), r.start))
        .collect();
    Check {
        name: "every fault recovered (pool minimum + an answer) within 2 s, 20 s for the silent drop",
        ok: late.is_empty(),
        detail: if late.is_empty() { format!("{} faults", faults.len()) } else { format!("late: {}", late.join(", ")) },
    }
}

/// The fault table, with the pooler's RSS just before each fault.
pub fn fault_table(faults: &[Record], errors: &[ErrorEvent], samples: &[Sample]) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "{:>8} {:>8} {:<16} {:>10} {:>7} {:>8} {:>7}  detail",
        "start s", "end s", "fault", "recovered", "limit", "RSS MiB", "errors"
    );
    for r in faults {
        let rss = samples
            .iter()
            .rev()
            .find(|x| x.t <= r.start)
            .and_then(|x| x.rss_kib)
            .map_or("?".to_string(), |k| format!("{:.1}", k as f64 / 1024.0));
        let mut codes = BTreeMap::<&str, u64>::new();
        for e in errors.iter().filter(|e| explained(e.t, std::slice::from_ref(r)).is_some()) {
            *codes.entry(e.code.as_str()).or_default() += 1;
        }
        let window_errors: u64 = codes.values().sum();
        let codes: Vec<String> = codes.iter().map(|(c, n)| format!("{c} x{n}")).collect();
        let rec = r.recovered_after.map(|x| format!("{x:.2} s")).unwrap_or_else(|| "never".into());
        let _ = writeln!(
            s,
            "{:>8.1} {:>8.1} {:<16} {:>10} {:>5} s {:>8} {:>7}  {}{}",
            r.start,
            r.end,
            r.fault.name(),
            rec,
            r.fault.recovery_limit().as_secs(),
            rss,
            window_errors,
            r.detail,
            if codes.is_empty() { String::new() } else { format!(" [{}]", codes.join(", ")) }
        );
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ledger_counts_each_kind() {
        let records = vec![
            (1, Outcome::Acked),
            (2, Outcome::Acked),
            (3, Outcome::Failed),
            (4, Outcome::Ambiguous),
            (5, Outcome::Vanished),
            (6, Outcome::Acked),
        ];
        let rows: HashMap<i64, i64> = [(1, 1), (3, 1), (4, 1), (6, 2), (7, 1)].into_iter().collect();
        let l = Ledger::check(&records, &rows, 6, 6);
        assert_eq!((l.acked, l.lost, l.duplicated, l.phantom), (3, 1, 1, 1));
        assert_eq!((l.ambiguous, l.ambiguous_committed, l.unrecorded), (1, 1, 1));
        assert!(!l.ok());
        let clean: HashMap<i64, i64> = [(1, 1), (2, 1), (6, 1)].into_iter().collect();
        assert!(Ledger::check(&records, &clean, 3, 3).ok());
        assert!(!Ledger::check(&records, &clean, 3, 4).ok());
    }

    #[test]
    fn errors_outside_windows_are_unexplained() {
        let faults = vec![Record {
            fault: Fault::Terminate,
            start: 10.0,
            end: 10.5,
            recovered_after: Some(0.3),
            detail: String::new(),
        }];
        let e = |t: f64| ErrorEvent { t, code: "57P01".into(), who: "simple" };
        let out = unexplained(&[e(9.5), e(15.0), e(16.0)], &faults);
        assert_eq!(out.get("57P01 (simple)"), Some(&1));
    }
}
