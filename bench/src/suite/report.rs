//! The report: Markdown tables (printed and written to results.md), a JSON
//! copy (results.json) and the chart (bench/plot.py, when matplotlib is
//! importable). Ratios are weir ÷ PgBouncer; targets are checked and stated
//! with their figures, never hidden.

use std::fmt::Write as _;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use anyhow::Context;
use weir_testkit::PgServer;

use super::env::{first_line, workspace_root};
use super::idle::IdleCell;
use super::opts::Opts;
use super::stream::StreamResult;
use super::targets::{Kind, Target, POOL_SIZE};
use super::workloads::{Cell, Row};

pub struct Results {
    pub header: String,
    pub kinds: Vec<Kind>,
    pub rows: Vec<Row>,
    pub stream: Option<StreamResult>,
    pub idle: Option<Vec<IdleCell>>,
    pub elapsed: Duration,
}

impl Results {
    pub fn new(opts: &Opts, pg: &PgServer, pgbouncer: Option<&Path>, targets: &[Target]) -> Results {
        let pg_version = pg.psql("postgres", "show server_version").unwrap_or_else(|_| "?".into());
        let pgb = pgbouncer.map(|b| first_line(&b.display().to_string(), &["--version"]));
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
            "- machine: {cores} cores ({cpu}); Postgres {pg_version}; {}; weir at git {rev} (release binary)",
            pgb.unwrap_or_else(|| if opts.want(Kind::PgBouncer) {
                "PgBouncer not installed: skipped".into()
            } else {
                "PgBouncer not run".into()
            })
        );
        let _ = writeln!(
            h,
            "- setup: pool {POOL_SIZE}, transaction mode, md5 client auth for all three targets; pgbench scale {}, -j 2; \
             {} interleaved rounds per workload (A B C A B C …), medians; headline runs {} s, others {} s",
            opts.scale,
            opts.rounds,
            opts.duration,
            opts.short_duration()
        );
        let _ = writeln!(
            h,
            "- latency from pgbench's per-transaction log (`-l`); proxy CPU = utime+stime from /proc/PID/stat around each run ÷ transactions; \
             peak RSS = VmHWM (reset per workload)"
        );
        Results {
            header: h,
            kinds: targets.iter().map(|t| t.kind).collect(),
            rows: vec![],
            stream: None,
            idle: None,
            elapsed: Duration::ZERO,
        }
    }
}

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
    let mut s = String::from("# weir vs PgBouncer vs direct Postgres\n\n");
    s.push_str(&r.header);
    let _ = writeln!(s, "- total bench time: {:.0} s\n", r.elapsed.as_secs_f64());
    throughput_table(&mut s, r);
    cost_table(&mut s, r);
    stream_table(&mut s, r);
    idle_table(&mut s, r);
    targets_table(&mut s, r);
    failures(&mut s, r);
    s
}

fn has(r: &Results, k: Kind) -> bool {
    r.kinds.contains(&k)
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
        Some(c) if c.skipped.is_none() && c.tps > 0.0 => {
            format!("{:.3} / {:.3}", c.avg_ms, c.p99_ms)
        }
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

fn throughput_table(s: &mut String, r: &Results) {
    s.push_str("## Throughput and latency (medians)\n\n");
    s.push_str("| workload | direct TPS | weir TPS | PgBouncer TPS | weir ÷ PgBouncer | direct avg / p99 ms | weir avg / p99 ms | PgBouncer avg / p99 ms |\n");
    s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|\n");
    for row in &r.rows {
        let (d, w, b) = (row.cell(Kind::Direct), row.cell(Kind::Weir), row.cell(Kind::PgBouncer));
        let _ = writeln!(
            s,
            "| `{}` | {} | {} | {} | {} | {} | {} | {} |",
            row.workload.title,
            tps(d),
            tps(w),
            tps(b),
            ratio(ok_tps(w), ok_tps(b)),
            lat(d),
            lat(w),
            lat(b)
        );
    }
    s.push('\n');
}

fn cost_table(s: &mut String, r: &Results) {
    if !has(r, Kind::Weir) && !has(r, Kind::PgBouncer) {
        return;
    }
    s.push_str("## Proxy cost (medians)\n\n");
    s.push_str(
        "CPU µs/txn is user + system time (user part in brackets; the system part is the kernel's socket work).\n\n",
    );
    s.push_str("| workload | weir CPU µs/txn | PgBouncer CPU µs/txn | weir ÷ PgBouncer | weir CPU (share of a core) | PgBouncer CPU (share of a core) | weir peak RSS MiB | PgBouncer peak RSS MiB |\n");
    s.push_str("|---|---:|---:|---:|---:|---:|---:|---:|\n");
    let us = |c: Option<&Cell>| match c {
        Some(Cell { cpu_us_per_txn: Some(v), user_us_per_txn: Some(u), .. }) => format!("{v:.1} ({u:.1})"),
        _ => "—".into(),
    };
    let share = |c: Option<&Cell>| {
        c.and_then(|c| c.cpu_share).map(|v| format!("{:.0}%", v * 100.0)).unwrap_or_else(|| "—".into())
    };
    let rss = |c: Option<&Cell>| {
        c.and_then(|c| c.peak_rss_kib).map(|v| format!("{:.1}", v as f64 / 1024.0)).unwrap_or_else(|| "—".into())
    };
    for row in &r.rows {
        let (w, b) = (row.cell(Kind::Weir), row.cell(Kind::PgBouncer));
        let _ = writeln!(
            s,
            "| `{}` | {} | {} | {} | {} | {} | {} | {} |",
            row.workload.title,
            us(w),
            us(b),
            ratio(w.and_then(|c| c.cpu_us_per_txn), b.and_then(|c| c.cpu_us_per_txn)),
            share(w),
            share(b),
            rss(w),
            rss(b)
        );
    }
    s.push('\n');
}

fn stream_table(s: &mut String, r: &Results) {
    let Some(st) = &r.stream else { return };
    let _ = writeln!(s, "## Large-result stream ({} MB via COPY … TO STDOUT, psql into /dev/null)\n", st.megabytes);
    s.push_str("| target | MB/s | proxy CPU s per GB |\n|---|---:|---:|\n");
    for c in &st.cells {
        let cpu = c.cpu_s_per_gb.map(|v| format!("{v:.2}")).unwrap_or_else(|| "—".into());
        let _ = writeln!(s, "| {} | {:.0} | {cpu} |", c.kind.label(), c.mb_per_s);
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
            c.kind.label(),
            c.rss_before_kib as f64 / 1024.0,
            c.rss_after_kib as f64 / 1024.0,
            c.bytes_per_client(),
            c.login_secs
        );
    }
    s.push('\n');
}

fn targets_table(s: &mut String, r: &Results) {
    if !has(r, Kind::Weir) || !has(r, Kind::PgBouncer) {
        s.push_str("_Targets vs PgBouncer not checked: PgBouncer was not part of this run._\n\n");
        return;
    }
    s.push_str("## Targets against PgBouncer (ratios from this run)\n\n| target | figure | met |\n|---|---|---|\n");
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
            if let (Kind::Direct, Some(why)) = (k, c.skipped) {
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
