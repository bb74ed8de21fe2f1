//! The report: Markdown tables (printed and written to results.md), a JSON
//! copy (results.json) and the chart (bench/plot.py, when matplotlib is
//! importable). Ratios are weir ÷ PgBouncer; targets are checked and stated
//! with their figures, never hidden.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;

use anyhow::Context;

use super::env::workspace_root;
use super::opts::Opts;
use super::report_rows;
use super::results::Results;
use super::targets::Kind;

pub fn write(r: &Results, opts: &Opts) -> anyhow::Result<()> {
    let md = markdown(r);
    println!("\n{md}");
    std::fs::create_dir_all(&opts.out).with_context(|| format!("creating {}", opts.out.display()))?;
    let stem = if opts.quick { "quick" } else { "results" };
    let md_path = opts.out.join(format!("{stem}.md"));
    std::fs::write(&md_path, &md)?;
    let json_path = opts.out.join(format!("{stem}.json"));
    std::fs::write(&json_path, json(r))?;
    eprintln!("wrote {} and {}", md_path.display(), json_path.display());
    plot(&json_path, &opts.out.join(format!("{stem}.png")));
    Ok(())
}

fn plot(json: &Path, png: &Path) {
    let script = workspace_root().join("bench/plot.py");
    let importable =
        Command::new("python3").args(["-c", "import matplotlib"]).output().is_ok_and(|o| o.status.success());
    if !importable {
        eprintln!("matplotlib not importable: no chart (pip install matplotlib); the Markdown table is written");
        return;
    }
    match Command::new("python3").arg(&script).arg(json).arg(png).status() {
        Ok(s) if s.success() => eprintln!("wrote {}", png.display()),
        other => eprintln!("plot.py failed ({other:?}); the Markdown table is written"),
    }
}

fn markdown(r: &Results) -> String {
    let mut s = String::from("# weir vs PgBouncer vs pg_doorman vs direct Postgres\n\n");
    s.push_str(&r.header);
    let _ = writeln!(s, "- total bench time: {:.0} s\n", r.elapsed.as_secs_f64());
    report_rows::throughput_table(&mut s, r);
    report_rows::cost_table(&mut s, r);
    stream_table(&mut s, r);
    idle_table(&mut s, r);
    targets_table(&mut s, r);
    failures(&mut s, r);
    s
}

fn has(r: &Results, k: Kind) -> bool {
    r.ids.iter().any(|i| i.kind == k)
}

fn stream_table(s: &mut String, r: &Results) {
    let Some(st) = &r.stream else { return };
    let _ = writeln!(s, "## Large-result stream ({} MB via COPY … TO STDOUT, psql into /dev/null)\n", st.megabytes);
    s.push_str("| target | MB/s | proxy CPU s per GB |\n|---|---:|---:|\n");
    for c in &st.cells {
        let cpu = c.cpu_s_per_gb.map(|v| format!("{v:.2}")).unwrap_or_else(|| "—".into());
        let _ = writeln!(s, "| {} | {:.0} | {cpu} |", c.id.label(), c.mb_per_s);
    }
    s.push('\n');
}

fn idle_table(s: &mut String, r: &Results) {
    let Some(cells) = &r.idle else { return };
    let n = cells.first().map(|c| c.clients).unwrap_or(0);
    let _ = writeln!(s, "## {n} idle clients (logged in with md5, then silent)\n");
    s.push_str("| proxy | RSS before MiB | RSS with idle clients MiB | bytes per idle client | logins took s |\n|---|---:|---:|---:|---:|\n");
    for c in cells {
        let _ = writeln!(
            s,
            "| {} | {:.1} | {:.1} | {:.0} | {:.1} |",
            c.id.label(),
            c.rss_before_kib as f64 / 1024.0,
            c.rss_after_kib as f64 / 1024.0,
            c.bytes_per_client(),
            c.login_secs
        );
    }
    s.push('\n');
}

fn targets_table(s: &mut String, r: &Results) {
    if !has(r, Kind::Weir) || !(has(r, Kind::PgBouncer) || has(r, Kind::Doorman)) {
        s.push_str("_Targets not checked: neither PgBouncer nor pg_doorman was part of this run._\n\n");
        return;
    }
    s.push_str(
        "## Targets against PgBouncer and pg_doorman (ratios from this run)\n\n| target | figure | met |\n|---|---|---|\n",
    );
    for (name, fig, met) in super::report_targets::check(r) {
        let _ = writeln!(s, "| {name} | {fig} | {} |", if met { "yes" } else { "**no**" });
    }
    s.push('\n');
}

fn failures(s: &mut String, r: &Results) {
    let mut any = false;
    for row in &r.rows {
        for (k, c) in &row.cells {
            if let Some(f) = &c.failure {
                if !any {
                    s.push_str("## Failures\n\n");
                    any = true;
                }
                let _ = writeln!(s, "- `{}` via {}: {f}", row.workload.title, k.label());
            }
            if let (Kind::Direct, Some(why)) = (k.kind, c.skipped) {
                let _ = writeln!(s, "- `{}` direct skipped: {why}", row.workload.title);
            }
        }
    }
    if any {
        s.push('\n');
    }
}

fn json(r: &Results) -> String {
    let mut s = String::from("{\"rows\": [");
    for (i, row) in r.rows.iter().enumerate() {
        if i > 0 {
            s.push(',');
        }
        let _ =
            write!(s, "\n  {{\"id\": \"{}\", \"title\": \"{}\", \"cells\": {{", row.workload.id, row.workload.title);
        for (j, (k, c)) in row.cells.iter().enumerate() {
            let num = |v: Option<f64>| v.map(|v| format!("{v:.3}")).unwrap_or_else(|| "null".into());
            let _ = write!(
                s,
                "{}\"{}\": {{\"tps\": {:.1}, \"avg_ms\": {:.4}, \"p99_ms\": {:.4}, \"cpu_us_per_txn\": {}, \"failed\": {}, \"skipped\": {}}}",
                if j > 0 { ", " } else { "" },
                k.label(),
                c.tps,
                c.avg_ms,
                c.p99_ms,
                num(c.cpu_us_per_txn),
                c.failure.is_some(),
                c.skipped.is_some()
            );
        }
        s.push_str("}}");
    }
    s.push_str("\n]}\n");
    s
}
