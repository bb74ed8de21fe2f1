//! The Prometheus exporter: installs the global `metrics` recorder and serves
//! `/metrics`, `/healthz` and `/readyz` over plain blocking HTTP/1.1 on its own
//! OS threads, so scrapes and probes keep working while the tokio data path is
//! saturated. Also runs recorder upkeep once a second. A scrape is the
//! recorder's process-wide series, the process's own figures (RSS, open file
//! descriptors, CPU, from `metrics-process`) and every live pool's series.

use std::io;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use std::thread::{self, JoinHandle};
use std::time::Duration;

use metrics_exporter_prometheus::{BuildError, Matcher, PrometheusBuilder, PrometheusHandle};

use crate::hist::BUCKETS;
use crate::http::{self, Ctx, ReadyFn, Response};
use crate::names::{describe_all, histogram_names};
use crate::text::scrape;

/// Maximum concurrent request-handling threads; beyond it, requests get 503.
const MAX_CONN_THREADS: usize = 16;
const UPKEEP_INTERVAL: Duration = Duration::from_secs(1);

/// Handle of the recorder this crate installed as the global one, if any.
static INSTALLED: OnceLock<PrometheusHandle> = OnceLock::new();
static INSTALL_LOCK: Mutex<()> = Mutex::new(());

/// Errors starting the exporter.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// Could not bind the HTTP listener.
    #[error("failed to bind metrics listener on {addr}: {source}")]
    Bind {
        /// Address we tried to bind.
        addr: SocketAddr,
        /// Underlying error.
        #[source]
        source: io::Error,
    },
    /// Could not start an exporter thread.
    #[error("failed to start metrics exporter thread: {0}")]
    Spawn(#[source] io::Error),
    /// Invalid recorder configuration.
    #[error("invalid Prometheus recorder configuration: {0}")]
    Build(#[from] BuildError),
}

/// A running exporter. Dropping it stops and joins its threads.
#[derive(Debug)]
pub struct Exporter {
    local_addr: SocketAddr,
    is_global: bool,
    handle: PrometheusHandle,
    stop: Arc<AtomicBool>,
    accept: Option<JoinHandle<()>>,
    upkeep: Option<JoinHandle<()>>,
}

/// Installs the Prometheus recorder globally (once per process) and serves
/// HTTP on `listen` from dedicated OS threads.
///
/// If this crate already installed the global recorder (a second weir in the
/// same process), the existing recorder is shared. If some *other* recorder
/// is global, a private recorder is built and served anyway, with a warning:
/// `/metrics` will then only show descriptions, not values.
///
/// Facade handles bind when created, so call this before creating
/// [`PoolMetrics`](crate::PoolMetrics) / [`GlobalMetrics`](crate::GlobalMetrics).
pub fn install(listen: SocketAddr, ready: ReadyFn) -> Result<Exporter, MetricsError> {
    let (handle, is_global) = recorder_handle()?;
    let listener = TcpListener::bind(listen).map_err(|source| MetricsError::Bind { addr: listen, source })?;
    let local_addr = listener.local_addr().map_err(|source| MetricsError::Bind { addr: listen, source })?;
    let stop = Arc::new(AtomicBool::new(false));
    let ctx = Arc::new(Ctx { handle: handle.clone(), ready });
    let accept = spawn("weir-metrics-http", {
        let stop = Arc::clone(&stop);
        move || accept_loop(listener, ctx, stop)
    })?;
    let mut exporter = Exporter {
        local_addr,
        is_global,
        handle: handle.clone(),
        stop: Arc::clone(&stop),
        accept: Some(accept),
        upkeep: None,
    };
    exporter.upkeep = Some(spawn("weir-metrics-upkeep", move || upkeep_loop(handle, stop))?);
    tracing::info!(%local_addr, is_global, "metrics exporter listening");
    Ok(exporter)
}

/// Renders what `/metrics` serves from the globally installed recorder;
/// `None` if this crate has not installed one.
pub fn render() -> Option<String> {
    INSTALLED.get().map(scrape)
}

impl Exporter {
    /// Address the HTTP listener is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Whether the served recorder is the process-global one.
    pub fn is_global(&self) -> bool {
        self.is_global
    }

    /// Renders the served recorder, as `/metrics` would.
    pub fn render(&self) -> String {
        scrape(&self.handle)
    }
}

impl Drop for Exporter {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(t) = self.upkeep.take() {
            t.thread().unpark();
            let _ = t.join();
        }
        let Some(t) = self.accept.take() else { return };
        // Unblock accept(); if we cannot reach ourselves, detach rather than hang.
        if TcpStream::connect_timeout(&wake_addr(self.local_addr), Duration::from_secs(1)).is_ok() {
            let _ = t.join();
        }
    }
}

fn wake_addr(addr: SocketAddr) -> SocketAddr {
    match addr {
        SocketAddr::V4(a) if a.ip().is_unspecified() => (Ipv4Addr::LOCALHOST, a.port()).into(),
        SocketAddr::V6(a) if a.ip().is_unspecified() => (Ipv6Addr::LOCALHOST, a.port()).into(),
        other => other,
    }
}

fn builder() -> Result<PrometheusBuilder, BuildError> {
    histogram_names()
        .try_fold(PrometheusBuilder::new(), |b, name| b.set_buckets_for_metric(Matcher::Full(name.to_owned()), BUCKETS))
}

/// Returns the handle to serve and whether it belongs to the global recorder.
fn recorder_handle() -> Result<(PrometheusHandle, bool), MetricsError> {
    let _guard = INSTALL_LOCK.lock();
    if let Some(handle) = INSTALLED.get() {
        return Ok((handle.clone(), true));
    }
    let recorder = builder()?.build_recorder();
    let handle = recorder.handle();
    metrics::with_local_recorder(&recorder, describe_all);
    match metrics::set_global_recorder(recorder) {
        Ok(()) => {
            let _ = INSTALLED.set(handle.clone());
            Ok((handle, true))
        }
        Err(_) => {
            tracing::warn!(
                "a foreign global metrics recorder is already installed; \
                 /metrics will serve a private recorder without weir's values"
            );
            Ok((handle, false))
        }
    }
}

fn spawn(name: &str, f: impl FnOnce() + Send + 'static) -> Result<JoinHandle<()>, MetricsError> {
    thread::Builder::new().name(name.to_owned()).spawn(f).map_err(MetricsError::Spawn)
}

fn upkeep_loop(handle: PrometheusHandle, stop: Arc<AtomicBool>) {
    while !stop.load(Ordering::SeqCst) {
        handle.run_upkeep();
        thread::park_timeout(UPKEEP_INTERVAL);
    }
}

fn accept_loop(listener: TcpListener, ctx: Arc<Ctx>, stop: Arc<AtomicBool>) {
    let active = Arc::new(AtomicUsize::new(0));
    for conn in listener.incoming() {
        if stop.load(Ordering::SeqCst) {
            break;
        }
        match conn {
            Ok(stream) => dispatch(stream, &ctx, &active),
            Err(e) => {
                tracing::warn!(error = %e, "metrics listener accept failed");
                thread::sleep(Duration::from_millis(50));
            }
        }
    }
}

/// Decrements the active-handler count when a handler ends (even by panic).
struct Slot(Arc<AtomicUsize>);

impl Drop for Slot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

fn dispatch(mut stream: TcpStream, ctx: &Arc<Ctx>, active: &Arc<AtomicUsize>) {
    if active.fetch_add(1, Ordering::SeqCst) >= MAX_CONN_THREADS {
        active.fetch_sub(1, Ordering::SeqCst);
        let _ = stream.set_write_timeout(Some(Duration::from_millis(200)));
        let busy = Response::text(503, "Service Unavailable", "busy\n");
        let _ = http::write_response(&mut stream, &busy, false);
        return;
    }
    let slot = Slot(Arc::clone(active));
    let ctx = Arc::clone(ctx);
    let spawned = thread::Builder::new().name("weir-metrics-conn".into()).spawn(move || {
        let _slot = slot;
        http::serve_conn(stream, &ctx);
    });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "metrics: cannot spawn request thread");
    }
}
