//! The per-workload tables: throughput and latency, proxy CPU per
//! transaction, and proxy CPU share and memory. One column per target
//! (weir and pg_doorman once per `--threads` entry), and the ratios weir ÷
//! PgBouncer and weir ÷ pg_doorman (at the same thread count).

use std::fmt::Write as _;

use super::results::Results;
use super::targets::{Id, Kind};
use super::workloads::Cell;

/// A ratio column: its header and the two targets (numerator, denominator).
struct RatioCol {
    header: String,
    a: Id,
    b: Id,
}

fn ratio_cols(r: &Results) -> Vec<RatioCol> {
    let weir: Vec<Id> = r.ids.iter().copied().filter(|i| i.kind == Kind::Weir).collect();
    let mut out = vec![];
    if let (Some(&w), Some(&b)) = (weir.first(), r.ids.iter().find(|i| i.kind == Kind::PgBouncer)) {
        out.push(RatioCol { header: format!("{} ÷ PgBouncer", w.label()), a: w, b });
    }
    for &w in &weir {
        if let Some(&d) = r.ids.iter().find(|i| i.kind == Kind::Doorman && i.threads == w.threads) {
            out.push(RatioCol { header: format!("{} ÷ {}", w.label(), d.label()), a: w, b: d });
        }
    }
    out
}

fn proxies(r: &Results) -> Vec<Id> {
    r.ids.iter().copied().filter(|i| i.kind != Kind::Direct).collect()
}

fn header(s: &mut String, cols: &[String]) {
    let _ = writeln!(s, "| workload | {} |", cols.join(" | "));
    let _ = writeln!(s, "|---|{}", "---:|".repeat(cols.len()));
}

fn tps(c: Option<&Cell>) -> String {
    match c {
        None => "—".into(),
        Some(c) if c.skipped.is_some() => "skipped".into(),
        Some(c) if c.failure.is_some() && c.tps == 0.0 => "fails".into(),
        Some(c) if c.failure.is_some() => format!("{:.0} (fails)", c.tps),
        Some(c) => format!("{:.0}", c.tps),
    }
}

fn lat(c: Option<&Cell>) -> String {
    match c {
        Some(c) if c.skipped.is_none() && c.tps > 0.0 => format!("{:.3} / {:.3}", c.avg_ms, c.p99_ms),
        _ => "—".into(),
    }
}

fn ratio(a: Option<f64>, b: Option<f64>) -> String {
    match (a, b) {
        (Some(a), Some(b)) if b > 0.0 && a > 0.0 => format!("{:.2}×", a / b),
        _ => "—".into(),
    }
}

fn ok_tps(c: Option<&Cell>) -> Option<f64> {
    c.filter(|c| c.failure.is_none() && c.skipped.is_none()).map(|c| c.tps)
}

pub fn throughput_table(s: &mut String, r: &Results) {
    s.push_str("## Throughput and latency (medians)\n\n");
    let ratios = ratio_cols(r);
    let mut cols: Vec<String> = r.ids.iter().map(|i| format!("{} TPS", i.label())).collect();
    cols.extend(ratios.iter().map(|c| c.header.clone()));
    cols.extend(r.ids.iter().map(|i| format!("{} avg / p99 ms", i.label())));
    header(s, &cols);
    for row in &r.rows {
        let mut cells: Vec<String> = r.ids.iter().map(|&i| tps(row.cell_of(i))).collect();
        cells.extend(ratios.iter().map(|c| ratio(ok_tps(row.cell_of(c.a)), ok_tps(row.cell_of(c.b)))));
        cells.extend(r.ids.iter().map(|&i| lat(row.cell_of(i))));
        let _ = writeln!(s, "| `{}` | {} |", row.workload.title, cells.join(" | "));
    }
    s.push('\n');
}

pub fn cost_table(s: &mut String, r: &Results) {
    let proxies = proxies(r);
    if proxies.is_empty() {
        return;
    }
    s.push_str("## Proxy cost (medians)\n\n");
    s.push_str(
        "CPU µs/txn is user + system time (user part in brackets; the system part is the kernel's socket work).\n\n",
    );
    let ratios = ratio_cols(r);
    let mut cols: Vec<String> = proxies.iter().map(|i| format!("{} CPU µs/txn", i.label())).collect();
    cols.extend(ratios.iter().map(|c| c.header.clone()));
    header(s, &cols);
    let us = |c: Option<&Cell>| match c {
        Some(Cell { cpu_us_per_txn: Some(v), user_us_per_txn: Some(u), .. }) => format!("{v:.1} ({u:.1})"),
        _ => "—".into(),
    };
    let cpu = |c: Option<&Cell>| c.and_then(|c| c.cpu_us_per_txn);
    for row in &r.rows {
        let mut cells: Vec<String> = proxies.iter().map(|&i| us(row.cell_of(i))).collect();
        cells.extend(ratios.iter().map(|c| ratio(cpu(row.cell_of(c.a)), cpu(row.cell_of(c.b)))));
        let _ = writeln!(s, "| `{}` | {} |", row.workload.title, cells.join(" | "));
    }
    s.push('\n');
    share_table(s, r, &proxies);
}

fn share_table(s: &mut String, r: &Results, proxies: &[Id]) {
    s.push_str("## Proxy CPU (share of a core) and peak RSS (medians)\n\n");
    let mut cols: Vec<String> = proxies.iter().map(|i| format!("{} CPU", i.label())).collect();
    cols.extend(proxies.iter().map(|i| format!("{} peak RSS MiB", i.label())));
    header(s, &cols);
    let share = |c: Option<&Cell>| {
        c.and_then(|c| c.cpu_share).map(|v| format!("{:.0}%", v * 100.0)).unwrap_or_else(|| "—".into())
    };
    let rss = |c: Option<&Cell>| {
        c.and_then(|c| c.peak_rss_kib).map(|v| format!("{:.1}", v as f64 / 1024.0)).unwrap_or_else(|| "—".into())
    };
    for row in &r.rows {
        let mut cells: Vec<String> = proxies.iter().map(|&i| share(row.cell_of(i))).collect();
        cells.extend(proxies.iter().map(|&i| rss(row.cell_of(i))));
        let _ = writeln!(s, "| `{}` | {} |", row.workload.title, cells.join(" | "));
    }
    s.push('\n');
}
