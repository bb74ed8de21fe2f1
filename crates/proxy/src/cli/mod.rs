//! Command-line entry points: `weir --config PATH`, `weir check-config PATH`,
//! `weir migrate-config INI`, `weir demo`. Signals: SIGHUP reloads, SIGTERM
//! drains, SIGINT stops.

mod demo;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use weir::config::{Config, LogFormat};
use weir::Weir;

const USAGE: &str = "usage:
  weir --config PATH            run the proxy
  weir check-config PATH        validate a config file and explain each error
  weir migrate-config INI       print a weir.toml equivalent to a pgbouncer.ini
  weir demo                     throwaway Postgres with weir in front, until Ctrl-C
  weir --version";

pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["--config" | "-c", path] | ["run", "--config" | "-c", path] => run_file(Path::new(path)),
        ["check-config", path] => check_config(Path::new(path)),
        ["migrate-config", path] => migrate_config(Path::new(path)),
        ["demo"] => demo::run(),
        ["--version" | "-V"] => {
            println!("weir {}", env!("CARGO_PKG_VERSION"));
            Ok(())
        }
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("weir: {e:#}");
            ExitCode::FAILURE
        }
    }
}

fn check_config(path: &Path) -> anyhow::Result<()> {
    let cfg = Config::load(path)?;
    weir::app::load_users(&cfg)?;
    println!("{}: ok ({} database(s))", path.display(), cfg.databases.len());
    Ok(())
}

fn run_file(path: &Path) -> anyhow::Result<()> {
    let cfg = Config::load(path)?;
    init_logging(cfg.weir.log_format);
    runtime()?.block_on(serve(cfg, Some(path.to_path_buf())))
}

pub(crate) fn init_logging(format: LogFormat) {
    let filter = tracing_subscriber::EnvFilter::try_from_env("WEIR_LOG").unwrap_or_else(|_| "info".into());
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr).with_ansi(ansi);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

/// One thread by default: a sidecar proxy's work is syscalls and wakeups, and
/// on a small box shared with Postgres a single event loop spends 15-35% less
/// CPU per transaction than two workers handing tasks to each other (see
/// bench/README.md). `WEIR_WORKER_THREADS=N` (N ≥ 1) picks a multi-thread runtime.
pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    let workers = std::env::var("WEIR_WORKER_THREADS").ok().and_then(|v| v.parse::<usize>().ok()).filter(|n| *n > 0);
    let mut builder = match workers {
        Some(n) => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n);
            b
        }
        None => tokio::runtime::Builder::new_current_thread(),
    };
    builder.enable_all().build().context("cannot start the tokio runtime")
}

/// How the signal loop ended.
enum Stop {
    /// SIGTERM or the admin command SHUTDOWN.
    Drain(&'static str),
    /// SIGINT.
    Now,
}

/// Runs until SIGTERM or SHUTDOWN (drain) or SIGINT (stop); SIGHUP reloads
/// `path`. A second SIGTERM or a SIGINT during the drain stops at once.
pub(crate) async fn serve(cfg: Config, path: Option<PathBuf>) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let mut hup = signal(SignalKind::hangup())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    let weir = Weir::start(cfg).await?;
    if let Some(p) = path {
        weir.set_config_path(p);
    }
    let shared = weir.shared().clone();
    let stop = loop {
        tokio::select! {
            _ = hup.recv() => reload(&shared),
            _ = term.recv() => break Stop::Drain("SIGTERM"),
            _ = int.recv() => break Stop::Now,
            _ = shared.shutdown.cancelled() => break Stop::Drain("SHUTDOWN"),
        }
    };
    match stop {
        Stop::Now => {
            tracing::info!("SIGINT: stopping");
            shared.stop_now();
        }
        Stop::Drain(why) => {
            tracing::info!("{why}: draining");
            tokio::select! {
                _ = weir.shutdown() => {}
                _ = term.recv() => {
                    tracing::warn!("second SIGTERM during the drain: stopping now");
                    shared.stop_now();
                }
                _ = int.recv() => {
                    tracing::warn!("SIGINT during the drain: stopping now");
                    shared.stop_now();
                }
            }
        }
    }
    tracing::info!("weir stopped");
    Ok(())
}

/// SIGHUP: re-reads the config file and auth_file; a file that does not
/// validate changes nothing.
fn reload(shared: &weir::app::Shared) {
    match shared.reload_from_disk() {
        Ok(notes) => {
            notes.iter().for_each(|n| tracing::warn!("{n}"));
            tracing::info!("config reloaded (SIGHUP)");
        }
        Err(e) => tracing::error!(error = %e, "config reload (SIGHUP) failed; keeping the old config"),
    }
}

/// `weir migrate-config pgbouncer.ini`: the weir.toml on stdout, a warning
/// on stderr for each setting that could not be carried over.
fn migrate_config(path: &Path) -> anyhow::Result<()> {
    let text = std::fs::read_to_string(path).with_context(|| format!("cannot read {}", path.display()))?;
    let m = weir::config::migrate::from_pgbouncer_ini(&text);
    print!("{}", m.toml);
    for w in &m.warnings {
        eprintln!("weir migrate-config: warning: {}: {w}", path.display());
    }
    if !m.warnings.is_empty() {
        eprintln!(
            "weir migrate-config: {} setting(s) not carried over; check with `weir check-config`",
            m.warnings.len()
        );
    }
    Ok(())
}
