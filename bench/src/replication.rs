//! The `replication` benchmark: a logical replication stream of a given
//! size through weir, and weir's memory meanwhile. A throwaway Postgres
//! (wal_level = logical) gets a table of rows with 1 KiB payloads, written
//! before the stream starts (the slot keeps their WAL); `pg_recvlogical`
//! with test_decoding then reads them through weir (the release binary, a
//! process of its own, so its RSS is its alone) up to the LSN the writes
//! ended at, into /dev/null. weir's RSS is sampled every 100 ms; its peak
//! (VmHWM) and the bytes it passed to the client (its
//! `weir_client_bytes_sent_total`) are printed with the time and rate.
//! With `--direct`, the same rows are also streamed straight from Postgres
//! (a second slot), for the rate without weir. A table of figures, not a
//! pass/fail test.
//!
//! `weir-bench replication [--gib N] [--weir-bin PATH] [--direct]`

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};
use weir_testkit::{PgOptions, PgServer, APP_DB, TRUST_USER};

use crate::suite::procstat;

/// Rows are written in transactions of this many, each row with a payload
/// of `PAYLOAD` bytes.
const BATCH: u64 = 100_000;
const PAYLOAD: u64 = 1000;

/// Bytes of test_decoding output and CopyData framing per row (a little
/// below what a row takes, so the stream is at least the size asked for).
const PER_ROW: u64 = PAYLOAD + 70;

const USAGE: &str = "replication [--gib N] [--weir-bin PATH] [--direct]";

struct Opts {
    gib: f64,
    weir_bin: Option<PathBuf>,
    /// Also stream the same rows straight from Postgres (a slot of its own).
    direct: bool,
}

fn parse(args: &[String]) -> anyhow::Result<Opts> {
    let mut o = Opts { gib: 1.0, weir_bin: None, direct: false };
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--gib" => o.gib = it.next().context("--gib N")?.parse()?,
            "--weir-bin" => o.weir_bin = Some(PathBuf::from(it.next().context("--weir-bin PATH")?)),
            "--direct" => o.direct = true,
            "-h" | "--help" => {
                println!("usage: {USAGE}");
                std::process::exit(0);
            }
            other => bail!("unknown option {other} ({USAGE})"),
        }
    }
    Ok(o)
}

pub fn run(args: &[String]) -> anyhow::Result<()> {
    let opts = parse(args)?;
    let bin = match &opts.weir_bin {
        Some(p) => p.clone(),
        None => crate::soak::build_weir()?,
    };
    eprintln!("== a throwaway Postgres with wal_level = logical");
    let pg = PgServer::start(PgOptions { log_connections: false, replication: true, ..PgOptions::default() })
        .context("starting the throwaway Postgres")?;
    pg.psql(APP_DB, &format!("ALTER ROLE {TRUST_USER} REPLICATION"))?;
    pg.psql(APP_DB, "CREATE TABLE bulk(id bigint, payload text)")?;
    pg.psql(APP_DB, "SELECT pg_create_logical_replication_slot('weir_bench', 'test_decoding')")?;
    if opts.direct {
        pg.psql(APP_DB, "SELECT pg_create_logical_replication_slot('weir_bench_direct', 'test_decoding')")?;
    }
    let rows = ((opts.gib * (1u64 << 30) as f64) / PER_ROW as f64).ceil() as u64;
    eprintln!("== writing {rows} rows of {PAYLOAD} bytes");
    let mut written = 0;
    while written < rows {
        let n = BATCH.min(rows - written);
        pg.psql(
            APP_DB,
            &format!(
                "INSERT INTO bulk SELECT g, repeat(md5(g::text), {}) FROM generate_series({}, {}) g",
                PAYLOAD / 32,
                written + 1,
                written + n
            ),
        )?;
        written += n;
    }
    let end_lsn = pg.psql(APP_DB, "SELECT pg_current_wal_lsn()")?;

    let work = std::env::temp_dir().join(format!("weir-bench-replication-{}", std::process::id()));
    std::fs::create_dir_all(&work)?;
    let [port, metrics_port] = weir_testkit::free_ports();
    let weir = start_weir(&bin, &work, port, metrics_port, pg.port())?;
    let result = stream(&pg, &weir, port, metrics_port, &end_lsn);
    let _ = Command::new("kill").arg("-QUIT").arg(weir.id().to_string()).status();
    let _ = std::fs::remove_dir_all(&work);
    let r = result?;
    let direct = if opts.direct { Some(direct_secs(&pg, &end_lsn)?) } else { None };
    let gib = |b: u64| b as f64 / (1u64 << 30) as f64;
    println!();
    println!(
        "| stream | bytes to the client | seconds | MB/s | weir RSS before | weir RSS peak (VmHWM) | weir RSS after |"
    );
    println!("|---|---|---|---|---|---|---|");
    println!(
        "| {rows} rows, test_decoding, via weir | {:.2} GiB | {:.1} | {:.0} | {:.1} MiB | {:.1} MiB | {:.1} MiB |",
        gib(r.bytes),
        r.secs,
        r.bytes as f64 / r.secs / 1e6,
        r.rss_before as f64 / 1024.0,
        r.rss_peak as f64 / 1024.0,
        r.rss_after as f64 / 1024.0,
    );
    if let Some(secs) = direct {
        println!(
            "| the same, straight from Postgres | {:.2} GiB | {secs:.1} | {:.0} | | | |",
            gib(r.bytes),
            r.bytes as f64 / secs / 1e6
        );
    }
    Ok(())
}

/// Seconds pg_recvlogical takes for the same rows straight from Postgres.
fn direct_secs(pg: &PgServer, end_lsn: &str) -> anyhow::Result<f64> {
    eprintln!("== pg_recvlogical straight from Postgres up to {end_lsn}");
    let started = Instant::now();
    let status = Command::new(pg.bin_dir().join("pg_recvlogical"))
        .arg("-d")
        .arg(format!("host=127.0.0.1 port={} dbname={APP_DB} user={TRUST_USER}", pg.port()))
        .args(["--slot=weir_bench_direct", "--start", "--no-loop", "-f", "/dev/null", "-E", end_lsn])
        .status()
        .context("running pg_recvlogical")?;
    if !status.success() {
        bail!("pg_recvlogical (direct) failed: {status}");
    }
    Ok(started.elapsed().as_secs_f64())
}

/// What one stream measured (RSS in KiB).
struct Streamed {
    bytes: u64,
    secs: f64,
    rss_before: u64,
    rss_peak: u64,
    rss_after: u64,
}

fn start_weir(
    bin: &Path,
    work: &Path,
    port: u16,
    metrics_port: u16,
    pg_port: u16,
) -> anyhow::Result<std::process::Child> {
    std::fs::write(work.join("userlist.txt"), format!("\"{TRUST_USER}\" \"\"\n"))?;
    let config = work.join("weir.toml");
    std::fs::write(
        &config,
        format!(
            "[weir]\nlisten_addr = \"127.0.0.1:{port}\"\nauth_type = \"trust\"\nauth_file = \"userlist.txt\"\n\
             [metrics]\nlisten_addr = \"127.0.0.1:{metrics_port}\"\n\
             [databases.{APP_DB}]\nhost = \"127.0.0.1\"\nport = {pg_port}\n"
        ),
    )?;
    let child = Command::new(bin)
        .arg("--config")
        .arg(&config)
        .env("WEIR_LOG", "warn")
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .with_context(|| format!("starting {}", bin.display()))?;
    let end = Instant::now() + Duration::from_secs(30);
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        if Instant::now() > end {
            bail!("weir did not start listening on {port}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(child)
}

/// pg_recvlogical through weir up to `end_lsn`, with weir's RSS sampled.
fn stream(
    pg: &PgServer,
    weir: &std::process::Child,
    port: u16,
    metrics_port: u16,
    end_lsn: &str,
) -> anyhow::Result<Streamed> {
    let pid = weir.id();
    let rss_before = procstat::rss_kib(pid).unwrap_or(0);
    procstat::reset_peak(pid);
    eprintln!("== pg_recvlogical through weir up to {end_lsn}");
    let started = Instant::now();
    let mut recv = Command::new(pg.bin_dir().join("pg_recvlogical"))
        .arg("-d")
        .arg(format!("host=127.0.0.1 port={port} dbname={APP_DB} user={TRUST_USER}"))
        .args(["--slot=weir_bench", "--start", "--no-loop", "-f", "/dev/null", "-E", end_lsn])
        .spawn()
        .context("running pg_recvlogical")?;
    let mut peak = rss_before;
    let status = loop {
        if let Some(status) = recv.try_wait()? {
            break status;
        }
        peak = peak.max(procstat::rss_kib(pid).unwrap_or(0));
        std::thread::sleep(Duration::from_millis(100));
    };
    let secs = started.elapsed().as_secs_f64();
    if !status.success() {
        bail!("pg_recvlogical failed: {status}");
    }
    let rss_peak = procstat::peak_rss_kib(pid).unwrap_or(0).max(peak);
    let rss_after = procstat::rss_kib(pid).unwrap_or(0);
    let bytes = sent_bytes(metrics_port)?;
    Ok(Streamed { bytes, secs, rss_before, rss_peak, rss_after })
}

/// weir_client_bytes_sent_total of the app pools, from /metrics.
fn sent_bytes(metrics_port: u16) -> anyhow::Result<u64> {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(("127.0.0.1", metrics_port))?;
    s.write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")?;
    let mut text = String::new();
    s.read_to_string(&mut text)?;
    let total = text
        .lines()
        .filter(|l| l.starts_with("weir_client_bytes_sent_total{"))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>();
    Ok(total as u64)
}
