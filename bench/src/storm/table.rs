//! The storm's printed table: one column per pooler, then the notes (weir's
//! close and drop reasons, PgBouncer's exit, error samples).

use super::{Outcome, Report, Shape};

/// p50/p99/max latency in ms of the queries that ended with `o`.
fn percentiles(r: &Report, o: Outcome) -> String {
    let mut ms: Vec<f64> = r.sent.iter().filter(|s| s.outcome == o).map(|s| s.latency.as_secs_f64() * 1e3).collect();
    if ms.is_empty() {
        return "-".into();
    }
    ms.sort_by(f64::total_cmp);
    let at = |q: f64| ms[((ms.len() - 1) as f64 * q).round() as usize];
    format!("{:.0}/{:.0}/{:.0}", at(0.5), at(0.99), at(1.0))
}

/// The share of queries that ended with `o`, in percent.
fn share(r: &Report, o: Outcome) -> String {
    let n = r.sent.iter().filter(|s| s.outcome == o).count();
    format!("{:.2}", 100.0 * n as f64 / r.sent.len().max(1) as f64)
}

/// The share of ok queries among those sent in `phase` (0: before the
/// burst, 1: in it, 2: after it), in percent.
fn success(shape: &Shape, r: &Report, phase: u8) -> String {
    let sent: Vec<_> = r.sent.iter().filter(|s| shape.phase(s.at) == phase).collect();
    if sent.is_empty() {
        return "-".into();
    }
    let ok = sent.iter().filter(|s| s.outcome == Outcome::Ok).count();
    format!("{:.1}", 100.0 * ok as f64 / sent.len() as f64)
}

/// One pooler's column: (row label, value).
fn cells(shape: &Shape, r: &Report) -> Vec<(&'static str, String)> {
    let count = |o: Outcome| r.sent.iter().filter(|s| s.outcome == o).count().to_string();
    vec![
        ("queries sent", r.sent.len().to_string()),
        ("  ok", count(Outcome::Ok)),
        ("  pooler refusal (53300, wait timeout)", count(Outcome::WaitTimeout)),
        ("  client deadline expired (cancel+close)", count(Outcome::DeadlineExpired)),
        ("  other errors", count(Outcome::Other)),
        ("ok, sent before the burst (%)", success(shape, r, 0)),
        ("ok, sent in the burst (%)", success(shape, r, 1)),
        ("ok, sent after the burst (%)", success(shape, r, 2)),
        ("ok latency p50/p99/max (ms)", percentiles(r, Outcome::Ok)),
        ("refusal (53300) answer p50/p99/max (ms)", percentiles(r, Outcome::WaitTimeout)),
        ("client deadline misses (% of queries)", share(r, Outcome::DeadlineExpired)),
        ("client reconnects", r.reconnects.to_string()),
        ("server connections opened (PG log)", r.opened.to_string()),
        ("server connections closed (PG log)", r.closed.to_string()),
        ("queries started after client deadline", r.late.started_after.to_string()),
        ("queries committed after client deadline", r.late.committed_after.to_string()),
        ("  latest commit past its deadline (ms)", format!("{:.1}", r.late.worst_past.as_secs_f64() * 1e3)),
        ("rows written for clients that gave up", r.late.for_gone_clients.to_string()),
    ]
}

pub(super) fn print_table(shape: &Shape, reports: &[Report], note: Option<&str>) {
    println!(
        "storm: pool {}, {} clients, deadline {} ms, query {} ms, {} q/s with a {}x burst for {} s \
         ({} s + {} s + {} s); weir query_wait_timeout {} ms",
        shape.pool,
        shape.clients,
        shape.deadline.as_millis(),
        shape.query.as_millis(),
        shape.base_rate,
        shape.burst_factor,
        shape.burst.as_secs(),
        shape.before.as_secs(),
        shape.burst.as_secs(),
        shape.after.as_secs(),
        shape.wait_timeout.as_millis(),
    );
    let columns: Vec<_> = reports.iter().map(|r| cells(shape, r)).collect();
    print!("{:<42}", "");
    for r in reports {
        print!("{:>12}", r.name);
    }
    println!();
    for (i, (label, _)) in columns.first().into_iter().flatten().enumerate() {
        print!("{label:<42}");
        for c in &columns {
            print!("{:>12}", c[i].1);
        }
        println!();
    }
    for r in reports {
        print_notes(r);
    }
    if let Some(n) = note {
        println!("{n}");
    }
}

fn print_notes(r: &Report) {
    if let Some(c) = &r.weir_closes {
        println!("{} server closes by reason: {c}", r.name);
    }
    if let Some(d) = &r.weir_drops {
        println!("{} queries dropped by reason: {d}", r.name);
    }
    if r.connect_failures > 0 {
        println!("{}: {} client connect attempts failed", r.name, r.connect_failures);
    }
    if let Some(n) = &r.note {
        println!("{}: {n}", r.name);
    }
    for e in &r.other_errors {
        println!("{} error sample: {e}", r.name);
    }
}
