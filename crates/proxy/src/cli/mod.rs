//! Command-line entry points: `weir --config PATH`, `weir check-config PATH`,
//! `weir demo`. Signals: SIGHUP reloads, SIGTERM drains, SIGINT stops.

mod demo;

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use weir::config::{Config, LogFormat};
use weir::Weir;

const USAGE: &str = "usage:
  weir --config PATH            run the proxy
  weir check-config PATH        validate a config file and explain each error
  weir demo                     throwaway Postgres with weir in front, until Ctrl-C
  weir --version";

pub fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.iter().map(String::as_str).collect::<Vec<_>>().as_slice() {
        ["--config" | "-c", path] | ["run", "--config" | "-c", path] => run_file(Path::new(path)),
        ["check-config", path] => check_config(Path::new(path)),
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
    let builder = tracing_subscriber::fmt().with_env_filter(filter).with_writer(std::io::stderr);
    let _ = match format {
        LogFormat::Json => builder.json().try_init(),
        LogFormat::Text => builder.try_init(),
    };
}

pub(crate) fn runtime() -> anyhow::Result<tokio::runtime::Runtime> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().context("cannot start the tokio runtime")
}

/// Runs until SIGTERM (drain) or SIGINT (stop); SIGHUP reloads `path`.
pub(crate) async fn serve(cfg: Config, path: Option<PathBuf>) -> anyhow::Result<()> {
    use tokio::signal::unix::{signal, SignalKind};
    let weir = Weir::start(cfg).await?;
    let mut hup = signal(SignalKind::hangup())?;
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    loop {
        tokio::select! {
            _ = hup.recv() => reload(&weir, path.as_deref()),
            _ = term.recv() => {
                tracing::info!("SIGTERM: draining");
                weir.shutdown().await;
                return Ok(());
            }
            _ = int.recv() => {
                tracing::info!("SIGINT: stopping");
                return Ok(());
            }
        }
    }
}

fn reload(weir: &Weir, path: Option<&Path>) {
    let Some(path) = path else { return };
    match Config::load(path).map_err(anyhow::Error::from).and_then(|c| weir.reload(c).map_err(Into::into)) {
        Ok(()) => tracing::info!(path = %path.display(), "config reloaded"),
        Err(e) => tracing::error!(error = %e, "config reload failed; keeping the old config"),
    }
}
