//! The convoy bench's output: the table (printed, and in results.md), the
//! SHOW QUERIES lines for weir, the notes (pgbench errors, a skipped
//! pooler), and results.json.

use std::fmt::Write as _;
use std::path::Path;

use anyhow::Context;

use super::{Opts, Row, Summary, Watch};

const HEADER: [&str; 9] =
    ["pooler", "variant", "TPS alone", "TPS beside", "ratio", "p50 ms", "p99 ms", "over 1 s", "convoy TPS"];

fn cells(r: &Row) -> [String; 9] {
    let (alone, (beside, lat)) = (&r.alone.0, &r.beside);
    let ratio = if alone.tps > 0.0 { format!("{:.3}", beside.tps / alone.tps) } else { "-".into() };
    [
        r.pooler.label().into(),
        r.variant.label().into(),
        format!("{:.0}", alone.tps),
        format!("{:.0}", beside.tps),
        ratio,
        format!("{:.1}", lat.p50_ms),
        format!("{:.1}", lat.p99_ms),
        format!("{:.2} %", lat.over_1s * 100.0),
        format!("{:.1}", r.convoy.tps),
    ]
}

/// The SHOW QUERIES lines of a weir row.
fn watch_lines(r: &Row) -> Vec<String> {
    let Some(w) = &r.watch else { return vec![] };
    let name = format!("{} {}", r.pooler.label(), r.variant.label());
    if let Some(why) = &w.unavailable {
        let why = why.split(';').next().unwrap_or(why);
        return vec![format!("{name}: SHOW QUERIES: not available ({why})")];
    }
    let q = |s: &Option<String>| s.as_deref().map(|s| format!("`{s}`")).unwrap_or_else(|| "(no row)".into());
    let named = match w.named_after {
        Some(s) => format!("{s:.2} s after the {}'s start", r.variant.label()),
        None => format!("not within {} s", super::POLL_FOR.as_secs()),
    };
    vec![
        format!("{name}: SHOW QUERIES first row at ~3 s: {}; at the end: {}", q(&w.at_3s), q(&w.at_end)),
        format!("{name}: named after ({:?} in the first row): {named}", r.variant.needle()),
    ]
}

/// pgbench errors and failed transactions, one line per run that had any.
fn error_lines(r: &Row) -> Vec<String> {
    let name = format!("{} {}", r.pooler.label(), r.variant.label());
    let runs = [("unrelated alone", &r.alone.0), ("unrelated beside", &r.beside.0), (r.variant.label(), &r.convoy)];
    runs.iter()
        .filter(|(_, s)| s.failed > 0 || s.aborted > 0 || s.txns == 0)
        .map(|(what, s)| {
            let why = s.error.as_deref().unwrap_or("no error line");
            format!("{name}, {what}: {} txns, {} failed, {} clients aborted: {why}", s.txns, s.failed, s.aborted)
        })
        .collect()
}

fn notes(rows: &[Row], notes: &[String]) -> Vec<String> {
    let mut out: Vec<String> = rows.iter().flat_map(watch_lines).collect();
    out.extend(rows.iter().flat_map(error_lines));
    out.extend(notes.iter().cloned());
    out
}

fn legend(opts: &Opts) -> String {
    format!(
        "pool_size 20, transaction mode; unrelated route: 10 clients, `SELECT abalance FROM pgbench_accounts \
         WHERE aid = :aid`, {d} s alone, then {d} s beside the variant (started 1 s earlier). \
         p50, p99 and over 1 s: the unrelated route beside the variant (pgbench -l); convoy TPS: the variant's pgbench.",
        d = opts.duration
    )
}

pub(super) fn print(opts: &Opts, rows: &[Row], extra: &[String]) {
    let table: Vec<[String; 9]> = rows.iter().map(cells).collect();
    let width = |i: usize| table.iter().map(|c| c[i].len()).chain([HEADER[i].len()]).max().unwrap_or(0);
    let widths: Vec<usize> = (0..HEADER.len()).map(width).collect();
    let line = |c: &[String]| {
        let parts: Vec<String> = c.iter().zip(&widths).enumerate().map(|(i, (s, w))| pad(s, *w, i < 2)).collect();
        parts.join("  ")
    };
    println!("\nconvoy: {}\n", legend(opts));
    println!("{}", line(&HEADER.map(String::from)));
    for c in &table {
        println!("{}", line(c));
    }
    println!();
    for n in notes(rows, extra) {
        println!("{n}");
    }
}

fn pad(s: &str, w: usize, left: bool) -> String {
    if left {
        format!("{s:<w$}")
    } else {
        format!("{s:>w$}")
    }
}

/// results.md and results.json in `out`.
pub(super) fn write(out: &Path, opts: &Opts, rows: &[Row], extra: &[String]) -> anyhow::Result<()> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    std::fs::write(out.join("results.md"), markdown(opts, rows, extra))?;
    std::fs::write(out.join("results.json"), json(opts, rows))?;
    eprintln!("wrote {} and results.json", out.join("results.md").display());
    Ok(())
}

fn markdown(opts: &Opts, rows: &[Row], extra: &[String]) -> String {
    let mut s = format!("# weir-bench convoy\n\n{}\n\n", legend(opts));
    let _ = writeln!(s, "| {} |\n|{}", HEADER.join(" | "), "---|".repeat(HEADER.len()));
    for r in rows {
        let _ = writeln!(s, "| {} |", cells(r).join(" | "));
    }
    s.push('\n');
    for n in notes(rows, extra) {
        let _ = writeln!(s, "- {n}");
    }
    s
}

fn json(opts: &Opts, rows: &[Row]) -> String {
    let extra: Vec<String> = opts.weir_extra.iter().map(|(k, v)| json_str(&format!("{k} = {v}"))).collect();
    let mut s = format!("{{\"duration_s\": {}, \"weir_extra\": [{}], \"rows\": [", opts.duration, extra.join(", "));
    for (i, r) in rows.iter().enumerate() {
        let _ = write!(
            s,
            "{}\n  {{\"pooler\": \"{}\", \"variant\": \"{}\", \"alone\": {}, \"beside\": {}, \"convoy\": {}, \"show_queries\": {}}}",
            if i > 0 { "," } else { "" },
            r.pooler.label(),
            r.variant.label(),
            run_json(&r.alone.0, Some(r.alone.1)),
            run_json(&r.beside.0, Some(r.beside.1)),
            run_json(&r.convoy, None),
            r.watch.as_ref().map(watch_json).unwrap_or_else(|| "null".into()),
        );
    }
    s.push_str("\n]}\n");
    s
}

fn run_json(s: &Summary, lat: Option<super::Latency>) -> String {
    let mut out = format!(
        "{{\"tps\": {:.2}, \"txns\": {}, \"failed\": {}, \"aborted_clients\": {}",
        s.tps, s.txns, s.failed, s.aborted
    );
    if let Some(l) = lat {
        let _ = write!(
            out,
            ", \"logged\": {}, \"p50_ms\": {:.3}, \"p99_ms\": {:.3}, \"over_1s\": {:.5}",
            l.count, l.p50_ms, l.p99_ms, l.over_1s
        );
    }
    out.push('}');
    out
}

fn watch_json(w: &Watch) -> String {
    let opt = |v: &Option<String>| v.as_deref().map(json_str).unwrap_or_else(|| "null".into());
    format!(
        "{{\"available\": {}, \"first_row_at_3s\": {}, \"first_row_at_end\": {}, \"named_after_s\": {}}}",
        w.unavailable.is_none(),
        opt(&w.at_3s),
        opt(&w.at_end),
        w.named_after.map(|s| format!("{s:.3}")).unwrap_or_else(|| "null".into()),
    )
}

fn json_str(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}
