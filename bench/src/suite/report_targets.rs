//! The targets against PgBouncer and pg_doorman, each checked as a ratio
//! from this run and stated with its figures: (target, figures, met). The
//! queued-load target asks for CPU per transaction and p99 latency both at
//! or below PgBouncer's at `-c 1000`, simple and extended, in the same run:
//! one row per mode and one for the four together. Against pg_doorman, weir
//! at each thread count against pg_doorman at the same count: TPS on every
//! row (1.05× on the extended `-S` rows) and CPU per transaction at or below.
//! A busy-neighbour row is checked like its quiet row.

use super::results::Results;
use super::targets::{Id, Kind};
use super::workloads::{Cell, Row};

type Check = (String, String, bool);

pub fn check(r: &Results) -> Vec<Check> {
    let mut out = vec![];
    for (id, want) in [
        ("S-c10-simple", 1.15),
        ("S-c10-extended", 1.15),
        ("S-c100-simple", 1.15),
        ("S-c100-extended", 1.15),
        ("S-c1000-simple", 1.0),
        ("S-c1000-extended", 1.0),
    ] {
        for (w, b, row) in pairs(r, id) {
            let ratio = w.tps / b.tps;
            out.push((
                format!("`{}` TPS ≥ {want:.2}× PgBouncer", row.workload.title),
                format!("{:.0} vs {:.0} = {ratio:.2}×", w.tps, b.tps),
                w.failure.is_none() && ratio >= want,
            ));
        }
    }
    let cpu_rows = ["S-c10-simple", "S-c10-extended", "S-c100-simple", "S-c100-extended", "S-c1000-simple", "tpcb-c10"];
    for id in cpu_rows {
        for (w, b, row) in pairs(r, id) {
            if let (Some(wc), Some(bc)) = (w.cpu_us_per_txn, b.cpu_us_per_txn) {
                let ratio = wc / bc;
                out.push((
                    format!("`{}` proxy CPU/txn ≤ 0.8× PgBouncer", row.workload.title),
                    format!("{wc:.1} µs vs {bc:.1} µs = {ratio:.2}×"),
                    ratio <= 0.8,
                ));
            }
        }
    }
    for (w, b, row) in pairs(r, "S-c10-simple") {
        if let (Some(wc), Some(bc)) = (w.cpu_us_per_txn, b.cpu_us_per_txn) {
            let (tps, cpu) = (w.tps / b.tps, wc / bc);
            out.push((
                format!("`{}` TPS ≥ 0.95× PgBouncer at ≤ 1.10× its CPU/txn", row.workload.title),
                format!("{tps:.2}× TPS, {cpu:.2}× CPU ({wc:.1} vs {bc:.1} µs)"),
                w.failure.is_none() && tps >= 0.95 && cpu <= 1.10,
            ));
        }
    }
    out.extend(c1000_targets(r));
    out.extend(doorman_targets(r));
    if let Some(row) = find(r, "S-c1-simple") {
        if let (Some(d), Some(w), Some(b)) =
            (ok(row.cell(Kind::Direct)), ok(row.cell(Kind::Weir)), ok(row.cell(Kind::PgBouncer)))
        {
            let (wa, ba) = ((w.avg_ms - d.avg_ms) * 1000.0, (b.avg_ms - d.avg_ms) * 1000.0);
            out.push((
                "added latency over direct at `-c 1` ≤ PgBouncer's".into(),
                format!("weir +{wa:.1} µs, PgBouncer +{ba:.1} µs (direct {:.1} µs)", d.avg_ms * 1000.0),
                wa <= ba,
            ));
        }
    }
    if let Some((w, b, _)) = pair(r, "S-C-c10") {
        out.push((
            "`-C -c 10` connection rate ≥ PgBouncer's".into(),
            format!("{:.0} vs {:.0} = {:.2}×", w.tps, b.tps, w.tps / b.tps),
            w.tps >= b.tps,
        ));
    }
    if let Some(cells) = &r.idle {
        let get = |k| cells.iter().find(|c| c.id.kind == k);
        if let (Some(w), Some(b)) = (get(Kind::Weir), get(Kind::PgBouncer)) {
            out.push((
                "memory per idle client ≤ PgBouncer's".into(),
                format!("{:.0} B vs {:.0} B", w.bytes_per_client(), b.bytes_per_client()),
                w.bytes_per_client() <= b.bytes_per_client(),
            ));
        }
    }
    out
}

/// The queued-load target: at `-c 1000`, weir's CPU per transaction and its p99 at or
/// below PgBouncer's, per mode, and for both modes in this one run.
fn c1000_targets(r: &Results) -> Vec<Check> {
    let mut out = vec![];
    let mut all = Some(true);
    for id in ["S-c1000-simple", "S-c1000-extended"] {
        let Some((w, b, row)) = pair(r, id) else {
            all = None;
            continue;
        };
        let (Some(wc), Some(bc)) = (w.cpu_us_per_txn, b.cpu_us_per_txn) else {
            all = None;
            continue;
        };
        let met = w.failure.is_none() && wc <= bc && w.p99_ms <= b.p99_ms;
        all = all.map(|a| a && met);
        out.push((
            format!("`{}` proxy CPU/txn and p99 ≤ PgBouncer's", row.workload.title),
            format!("{wc:.1} vs {bc:.1} µs ({:.2}×); p99 {:.1} vs {:.1} ms", wc / bc, w.p99_ms, b.p99_ms),
            met,
        ));
    }
    if let Some(met) = all {
        out.push(("`-c 1000` simple and extended, both of the above in this run".into(), String::new(), met));
    }
    out
}

fn find<'a>(r: &'a Results, id: &str) -> Option<&'a Row> {
    r.rows.iter().find(|row| row.workload.id == id)
}

fn ok(c: Option<&Cell>) -> Option<&Cell> {
    c.filter(|c| c.skipped.is_none() && c.tps > 0.0)
}

/// weir against PgBouncer on the row `id` and on its busy-neighbour row.
fn pairs<'a>(r: &'a Results, id: &str) -> Vec<(&'a Cell, &'a Cell, &'a Row)> {
    let busy = format!("{id}+busy");
    [pair(r, id), pair(r, &busy)].into_iter().flatten().collect()
}

/// weir at each thread count against pg_doorman at the same count, on every row.
fn doorman_targets(r: &Results) -> Vec<Check> {
    let mut out = vec![];
    let weirs = r.ids.iter().filter(|i| i.kind == Kind::Weir);
    for &w_id in weirs {
        let d_id = Id { kind: Kind::Doorman, threads: w_id.threads };
        if !r.ids.contains(&d_id) {
            continue;
        }
        for row in &r.rows {
            let (Some(w), Some(d)) = (ok(row.cell_of(w_id)), ok(row.cell_of(d_id))) else { continue };
            let base = row.workload.id.trim_end_matches("+busy");
            let want = if matches!(base, "S-c10-extended" | "S-c100-extended") { 1.05 } else { 1.0 };
            let ratio = w.tps / d.tps;
            out.push((
                format!("`{}` {} TPS ≥ {want:.2}× {}", row.workload.title, w_id.label(), d_id.label()),
                format!("{:.0} vs {:.0} = {ratio:.2}×", w.tps, d.tps),
                w.failure.is_none() && ratio >= want,
            ));
            if let (Some(wc), Some(dc)) = (w.cpu_us_per_txn, d.cpu_us_per_txn) {
                out.push((
                    format!("`{}` {} CPU/txn ≤ {}'s", row.workload.title, w_id.label(), d_id.label()),
                    format!("{wc:.1} µs vs {dc:.1} µs = {:.2}×", wc / dc),
                    wc <= dc,
                ));
            }
        }
    }
    out
}

fn pair<'a>(r: &'a Results, id: &str) -> Option<(&'a Cell, &'a Cell, &'a Row)> {
    let row = find(r, id)?;
    let w = ok(row.cell(Kind::Weir))?;
    let b = ok(row.cell(Kind::PgBouncer))?;
    Some((w, b, row))
}
