//! Command-line entry points: `weir --config PATH`, `weir check-config PATH`,
//! `weir migrate-config INI`, `weir demo` (with the `demo` feature), and
//! `--help`/`--version` for each. Signals are handled in `signals`.
//!
//! Arguments are parsed with lexopt rather than clap: weir has four commands
//! and one option, and lexopt does that with no dependencies and no proc
//! macros (clap's derive adds about ten crates and a slow build), while still
//! handling `--config=X`, `-cX`, `--` and non-UTF-8 paths correctly. The help
//! text is written out by hand so that it can document the signals.

mod check;
#[cfg(feature = "demo")]
mod demo;
mod signals;

use std::ffi::OsString;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use weir::config::{Config, LogFormat};

const USAGE: &str = "usage:
  weir --config PATH            run the proxy (also `weir run --config PATH`, `-c PATH`)
  weir check-config PATH        check a config and the files it names; report every problem
  weir migrate-config INI       print a weir.toml equivalent to a pgbouncer.ini
  weir demo                     throwaway Postgres with weir in front, until Ctrl-C
  weir help [COMMAND]           this text, or a command's (also `weir COMMAND --help`)
  weir --version";

const SIGNALS: &str = "signals (PgBouncer 1.23's meanings):
  SIGHUP    reload the config file, auth_file and hba file without dropping clients
  SIGINT    safe shutdown: stop accepting, let running transactions finish (up to
            shutdown_timeout), then exit; idle clients are told (57P01) at once
  SIGTERM   the same drain (what Kubernetes and `docker stop` send); with
            sigterm = \"wait_for_clients\", PgBouncer's: stop accepting, keep every
            client, exit once the last has left (a rolling restart)
  SIGQUIT   stop at once
  SIGUSR1   PAUSE: hold new transactions; servers in use are closed once released
  SIGUSR2   RESUME: release what PAUSE (or SIGUSR1) held
  A second SIGINT or SIGTERM during a shutdown stops at once.";

const ENVIRONMENT: &str = "environment:
  WEIR_LOG=FILTER           log level or filter (default: info)
  WEIR_WORKER_THREADS=N     N runtime worker threads (overrides worker_threads; 1 is one event loop)";

/// What the command line asks for.
#[derive(Debug, PartialEq, Eq)]
enum Command {
    Run(PathBuf),
    CheckConfig(PathBuf),
    MigrateConfig(PathBuf),
    Demo,
    Help(Option<String>),
    Version,
}

pub fn main() -> ExitCode {
    let command = match parse(std::env::args_os().skip(1)) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("weir: {e}\n\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    let result = match command {
        Command::Run(path) => run_file(&path),
        Command::CheckConfig(path) => return check::run(&path),
        Command::MigrateConfig(path) => migrate_config(&path),
        Command::Demo => demo(),
        Command::Help(topic) => {
            println!("{}", help(topic.as_deref()));
            Ok(())
        }
        Command::Version => {
            println!("weir {}", env!("CARGO_PKG_VERSION"));
            Ok(())
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

/// Parses the arguments (without the program name).
fn parse(args: impl IntoIterator<Item = OsString>) -> Result<Command, lexopt::Error> {
    use lexopt::prelude::*;
    let mut parser = lexopt::Parser::from_args(args);
    let mut subcommand: Option<String> = None;
    let mut config: Option<PathBuf> = None;
    let mut operand: Option<PathBuf> = None;
    let mut help = false;
    while let Some(arg) = parser.next()? {
        match arg {
            Short('h') | Long("help") => help = true,
            Short('V') | Long("version") if subcommand.is_none() => return Ok(Command::Version),
            Short('c') | Long("config") if matches!(subcommand.as_deref(), None | Some("run")) => {
                config = Some(parser.value()?.into())
            }
            Value(v) if subcommand.is_none() && config.is_none() => subcommand = Some(v.string()?),
            Value(v) if operand.is_none() && subcommand.is_some() => operand = Some(v.into()),
            _ => return Err(arg.unexpected()),
        }
    }
    let needs = |what: &str| lexopt::Error::from(format!("`weir {what}` needs a path"));
    match (subcommand.as_deref(), help) {
        (Some("help"), _) => Ok(Command::Help(operand.map(|p| p.to_string_lossy().into_owned()))),
        (Some(name @ ("run" | "check-config" | "migrate-config" | "demo")), true) => {
            Ok(Command::Help(Some(name.to_owned())))
        }
        (None, true) => Ok(Command::Help(None)),
        (Some("check-config"), false) => operand.map(Command::CheckConfig).ok_or_else(|| needs("check-config PATH")),
        (Some("migrate-config"), false) => {
            operand.map(Command::MigrateConfig).ok_or_else(|| needs("migrate-config INI"))
        }
        (Some("demo"), false) if operand.is_none() => Ok(Command::Demo),
        (None | Some("run"), false) if operand.is_none() => {
            config.map(Command::Run).ok_or_else(|| "nothing to do: run the proxy with `--config PATH`".into())
        }
        (Some(other), _) if !["run", "demo"].contains(&other) => Err(format!("unknown command `{other}`").into()),
        _ => Err("unexpected argument".into()),
    }
}

/// `weir --help`, or one command's help.
fn help(topic: Option<&str>) -> String {
    let version = env!("CARGO_PKG_VERSION");
    match topic {
        Some("check-config") => "usage: weir check-config PATH\n\n\
            Reads a weir.toml and reports every problem in one run: TOML syntax, unknown keys (with the\n\
            nearest known key), values of the wrong type (with PgBouncer-aware hints: durations are\n\
            strings such as \"3600s\", listen_addr takes a port, [databases.NAME] tables instead of\n\
            pgbouncer.ini lines), weir's rules, whether the auth_file, auth_hba_file and TLS files\n\
            exist and load, and whether unix_socket_dir is a folder weir can create its socket in.\n\
            Exit status 0 when the config can be used, 1 otherwise."
            .into(),
        Some("migrate-config") => "usage: weir migrate-config pgbouncer.ini > weir.toml\n\n\
            Prints the weir.toml equivalent to a pgbouncer.ini on stdout (with [metrics] on\n\
            127.0.0.1, its port following the listen port: 6432 -> 9930, 6433 -> 9931), and one\n\
            warning line on stderr for each setting weir does not have.\n\
            An unset unix_socket_dir is written as PgBouncer's default \"/tmp\" (weir's own default\n\
            is no Unix socket)."
            .into(),
        Some("demo") => "usage: weir demo\n\n\
            Starts a throwaway PostgreSQL in a temp dir (as the postgres user when run as root) with\n\
            weir in front of it on 127.0.0.1:6432 (or a free port), prints the psql and /metrics URLs,\n\
            and removes everything on Ctrl-C. The PostgreSQL is the newest installed in Debian's layout,\n\
            /usr/lib/postgresql/<version>/bin (apt-get install postgresql), or the one whose initdb and\n\
            pg_ctl are in the folder WEIR_PG_BIN names.\n\
            Only in builds with the `demo` feature (on by default; the Docker image leaves it out)."
            .into(),
        Some("run") => format!("usage: weir --config PATH   (or weir run --config PATH)\n\n{SIGNALS}\n\n{ENVIRONMENT}"),
        _ => format!("weir {version}: a transparent PostgreSQL pooling proxy\n\n{USAGE}\n\n{SIGNALS}\n\n{ENVIRONMENT}"),
    }
}

#[cfg(feature = "demo")]
fn demo() -> anyhow::Result<()> {
    demo::run()
}

#[cfg(not(feature = "demo"))]
fn demo() -> anyhow::Result<()> {
    anyhow::bail!("this weir was built without the `demo` feature (cargo run --release -- demo has it)")
}

fn run_file(path: &Path) -> anyhow::Result<()> {
    let cfg = Config::load(path)?;
    init_logging(cfg.weir.log_format);
    runtime(cfg.weir.worker_threads)?.block_on(signals::serve(cfg, Some(path.to_path_buf())))
}

/// Logs to stderr at `WEIR_LOG` (EnvFilter syntax; default `info`).
///
/// A plain list of levels and targets (`info`, `weir=debug,warn`) becomes a
/// `Targets` filter, which decides once per call site; only a directive that
/// names spans or fields needs an `EnvFilter`. The difference is on every
/// poll of every client task, which enters the client's span: EnvFilter
/// looks the span up under a lock at each enter and exit (about a quarter
/// of the span's cost per poll, measured with callgrind at `-c 1000`).
pub(crate) fn init_logging(format: LogFormat) {
    use tracing_subscriber::{filter::Targets, layer::SubscriberExt, util::SubscriberInitExt, EnvFilter};
    // What EnvFilter refuses means `info`, as before.
    let spec = std::env::var("WEIR_LOG").ok().filter(|s| EnvFilter::try_new(s).is_ok());
    let spec = spec.unwrap_or_else(|| "info".into());
    // (An empty WEIR_LOG is EnvFilter's: errors only.)
    // A Targets filter goes through `verbosity`, which SET verbose raises;
    // an EnvFilter (spans or fields named) is WEIR_LOG's alone.
    let (targets, env) = match spec.parse::<Targets>() {
        Ok(targets) if !spec.trim().is_empty() => (Some(weir::verbosity::Verbosity { targets }), None),
        _ => (None, Some(EnvFilter::new(&spec))),
    };
    let ansi = std::io::IsTerminal::is_terminal(&std::io::stderr());
    // The layers above filter; the builder's own cap (info by default) would
    // hide what WEIR_LOG or SET verbose allow below it.
    let builder = tracing_subscriber::fmt()
        .with_max_level(tracing::level_filters::LevelFilter::TRACE)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    let _ = match format {
        LogFormat::Json => builder.json().finish().with(targets).with(env).try_init(),
        LogFormat::Text => builder.finish().with(targets).with(env).try_init(),
    };
}

/// One thread by default (`worker_threads = 1`): a sidecar proxy's work is
/// syscalls and wakeups, and on a small box shared with Postgres a single
/// event loop spends 15-35% less CPU per transaction than two workers handing
/// tasks to each other (see bench/README.md). More threads give a
/// multi-thread runtime; `WEIR_WORKER_THREADS=N` (N ≥ 1) overrides the config.
pub(crate) fn runtime(configured: u32) -> anyhow::Result<tokio::runtime::Runtime> {
    let from_env = std::env::var("WEIR_WORKER_THREADS").ok().and_then(|v| v.parse::<u32>().ok()).filter(|n| *n > 0);
    let mut builder = match from_env.unwrap_or(configured) {
        0 | 1 => tokio::runtime::Builder::new_current_thread(),
        n => {
            let mut b = tokio::runtime::Builder::new_multi_thread();
            b.worker_threads(n as usize);
            b
        }
    };
    builder.enable_all().build().context("cannot start the tokio runtime")
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

#[cfg(test)]
mod tests {
    use super::*;

    fn parsed(args: &str) -> Result<Command, String> {
        parse(args.split_whitespace().map(OsString::from)).map_err(|e| e.to_string())
    }

    #[test]
    fn every_existing_invocation_still_parses() {
        let p = || PathBuf::from("x.toml");
        assert_eq!(parsed("--config x.toml"), Ok(Command::Run(p())));
        assert_eq!(parsed("-c x.toml"), Ok(Command::Run(p())));
        assert_eq!(parsed("--config=x.toml"), Ok(Command::Run(p())));
        assert_eq!(parsed("run --config x.toml"), Ok(Command::Run(p())));
        assert_eq!(parsed("check-config x.toml"), Ok(Command::CheckConfig(p())));
        assert_eq!(parsed("migrate-config x.toml"), Ok(Command::MigrateConfig(p())));
        assert_eq!(parsed("demo"), Ok(Command::Demo));
        assert_eq!(parsed("--version"), Ok(Command::Version));
        assert_eq!(parsed("-V"), Ok(Command::Version));
    }

    #[test]
    fn help_for_weir_and_each_command() {
        assert_eq!(parsed("--help"), Ok(Command::Help(None)));
        assert_eq!(parsed("-h"), Ok(Command::Help(None)));
        assert_eq!(parsed("help"), Ok(Command::Help(None)));
        assert_eq!(parsed("help check-config"), Ok(Command::Help(Some("check-config".into()))));
        for name in ["run", "check-config", "migrate-config", "demo"] {
            assert_eq!(parsed(&format!("{name} --help")), Ok(Command::Help(Some(name.into()))));
        }
        assert!(help(None).contains("SIGUSR1") && help(None).contains("SIGQUIT"), "the signals are documented");
        let demo = help(Some("demo"));
        assert!(
            demo.contains("/usr/lib/postgresql/") && demo.contains("WEIR_PG_BIN"),
            "where the demo's Postgres comes from"
        );
    }

    #[test]
    fn mistakes_are_usage_errors() {
        for bad in ["", "check-config", "frobnicate", "--config", "check-config a b", "--bogus", "demo x"] {
            assert!(parsed(bad).is_err(), "`weir {bad}` should be a usage error: {:?}", parsed(bad));
        }
    }
}
