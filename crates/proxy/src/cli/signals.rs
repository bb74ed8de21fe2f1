//! The process's signals, with PgBouncer 1.23's meanings: SIGHUP reloads,
//! SIGINT is the safe shutdown (the drain: stop accepting, running
//! transactions finish up to `shutdown_timeout`), SIGTERM the same drain
//! (what Kubernetes sends), or with `sigterm = "wait_for_clients"`
//! PgBouncer's SIGTERM (stop accepting, exit once every client has left),
//! SIGQUIT stops at once, SIGUSR1 pauses and SIGUSR2 resumes, exactly as the
//! admin console's PAUSE and RESUME. A second SIGINT or SIGTERM, or a
//! SIGQUIT, during either shutdown stops at once. (This is the OS
//! side; `weir::signal` holds the in-process flags the drain sets.)

use std::path::PathBuf;
use std::sync::Arc;

use tokio::signal::unix::{signal, Signal, SignalKind};
use weir::app::Shared;
use weir::config::{Config, SigtermMode};
use weir::Weir;

/// The signals weir listens for, registered before it starts listening so
/// none is lost (or takes its default action) once clients can connect.
struct Signals {
    hup: Signal,
    int: Signal,
    term: Signal,
    quit: Signal,
    usr1: Signal,
    usr2: Signal,
}

impl Signals {
    fn register() -> std::io::Result<Signals> {
        Ok(Signals {
            hup: signal(SignalKind::hangup())?,
            int: signal(SignalKind::interrupt())?,
            term: signal(SignalKind::terminate())?,
            quit: signal(SignalKind::quit())?,
            usr1: signal(SignalKind::user_defined1())?,
            usr2: signal(SignalKind::user_defined2())?,
        })
    }
}

/// How the signal loop ended.
enum Stop {
    /// SIGINT, SIGTERM or the admin command SHUTDOWN.
    Drain(&'static str),
    /// SIGTERM with sigterm = "wait_for_clients", or SHUTDOWN WAIT_FOR_CLIENTS.
    WaitForClients(&'static str),
    /// SIGQUIT.
    Now(&'static str),
}

/// Runs weir until a drain or a stop; `path` is what SIGHUP re-reads.
pub(crate) async fn serve(cfg: Config, path: Option<PathBuf>) -> anyhow::Result<()> {
    let mut sig = Signals::register()?;
    let weir = Weir::start(cfg).await?;
    if let Some(p) = path {
        weir.set_config_path(p);
    }
    let shared = weir.shared().clone();
    let stop = loop {
        tokio::select! {
            _ = sig.hup.recv() => reload(&shared),
            _ = sig.usr1.recv() => pause(&shared),
            _ = sig.usr2.recv() => resume(&shared),
            _ = sig.int.recv() => break Stop::Drain("SIGINT"),
            _ = sig.term.recv() => break match shared.config.load().weir.sigterm {
                SigtermMode::Drain => Stop::Drain("SIGTERM"),
                SigtermMode::WaitForClients => Stop::WaitForClients("SIGTERM"),
            },
            _ = sig.quit.recv() => break Stop::Now("SIGQUIT"),
            _ = shared.shutdown.cancelled() => break Stop::Drain("SHUTDOWN"),
        }
    };
    match stop {
        Stop::WaitForClients(why) => {
            tracing::info!("{why}: exiting once every client has left");
            let now = tokio::select! {
                _ = weir.wait_for_clients() => None,
                _ = sig.int.recv() => Some("SIGINT"),
                _ = sig.term.recv() => Some("SIGTERM"),
                _ = sig.quit.recv() => Some("SIGQUIT"),
            };
            if let Some(again) = now {
                tracing::warn!("{again} while waiting for clients: stopping now");
                shared.stop_now();
            }
        }
        Stop::Now(why) => {
            tracing::info!("{why}: stopping now");
            shared.stop_now();
        }
        Stop::Drain(why) => {
            tracing::info!("{why}: draining");
            let now = tokio::select! {
                _ = weir.shutdown() => None,
                _ = sig.int.recv() => Some("SIGINT"),
                _ = sig.term.recv() => Some("SIGTERM"),
                _ = sig.quit.recv() => Some("SIGQUIT"),
            };
            if let Some(again) = now {
                tracing::warn!("{again} during the drain: stopping now");
                shared.stop_now();
            }
        }
    }
    tracing::info!("weir stopped");
    Ok(())
}

/// SIGHUP: re-reads the config file and auth_file; a file that does not
/// validate changes nothing.
fn reload(shared: &Shared) {
    match shared.reload_from_disk() {
        Ok(notes) => {
            notes.iter().for_each(|n| tracing::warn!("{n}"));
            tracing::info!("config reloaded (SIGHUP)");
        }
        Err(e) => tracing::error!(error = %e, "config reload (SIGHUP) failed; keeping the old config"),
    }
}

/// SIGUSR1: the console's PAUSE for every database. It waits for the
/// servers in use in its own task, so other signals are still served.
fn pause(shared: &Arc<Shared>) {
    tracing::info!("SIGUSR1: pausing");
    let shared = shared.clone();
    tokio::spawn(async move {
        match weir::admin::control::pause(&shared, None).await {
            Ok(_) => tracing::info!("SIGUSR1: paused; SIGUSR2 resumes"),
            Err(e) => tracing::warn!(error = %e, "SIGUSR1: PAUSE did not complete"),
        }
    });
}

/// SIGUSR2: the console's RESUME for every database (ignored during a
/// SHUTDOWN WAIT_FOR_*, as PgBouncer ignores it).
fn resume(shared: &Arc<Shared>) {
    if shared.is_stopping() {
        tracing::info!("got SIGUSR2 while shutting down, ignoring");
        return;
    }
    match weir::admin::control::resume(shared, None) {
        Ok(_) => tracing::info!("SIGUSR2: resumed"),
        Err(e) => tracing::warn!(error = %e, "SIGUSR2: RESUME failed"),
    }
}
