//! The running proxy: the listeners (`listen`) and their accept loops, `max_client_conn`,
//! readiness for the metrics endpoint, and starting, reloading and ending a
//! `Weir`. Each accepted socket becomes one task (`connection`), which sends
//! it to the pooled session (`client`) or the admin console (`admin`). The
//! state those share, and its lifecycle, is `state`'s.

mod connection;
#[cfg(test)]
mod footprint;
mod listen;
#[cfg(test)]
mod stall_guard_tests;

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock, Weak};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use weir_metrics::{ClientResult, ConnAddr};

use crate::config::Config;
use crate::login::{ClientError, ClientStream};
use crate::protocol::messages::{self, Severity};
pub use crate::state::{load_hba, load_users, quiesce, Quiesced, ReloadError, Shared, StartError};
pub use connection::serve;
pub use listen::group_id;
use listen::Listener;

/// How often the client gauges are refreshed from the client registry.
const GAUGE_PERIOD: Duration = Duration::from_millis(500);

/// A running weir.
#[derive(Debug)]
pub struct Weir {
    shared: Arc<Shared>,
    /// The TCP addresses bound (the first is `local_addr`).
    addrs: Vec<SocketAddr>,
    /// The Unix socket's path, if weir listens on one.
    unix: Option<PathBuf>,
    exporter: Option<weir_metrics::Exporter>,
}

impl Weir {
    /// Binds the listener (and the metrics endpoint) and starts accepting.
    pub async fn start(cfg: Config) -> Result<Weir, StartError> {
        let cell: Arc<OnceLock<Weak<Shared>>> = Arc::new(OnceLock::new());
        let exporter = match cfg.metrics_endpoint() {
            Some((addr, configured)) => {
                let cell = cell.clone();
                let ready = Arc::new(move || cell.get().and_then(Weak::upgrade).is_some_and(|s| s.is_ready()));
                match weir_metrics::install(addr, ready) {
                    Ok(exporter) => Some(exporter),
                    Err(e) if !configured => {
                        tracing::warn!(error = %e, "no metrics endpoint: the default port is taken (set [metrics] listen_addr, or enabled = false)");
                        None
                    }
                    Err(e) => return Err(e.into()),
                }
            }
            None => None,
        };
        weir_metrics::set_build_info(env!("CARGO_PKG_VERSION"));
        weir_metrics::set_max_client_conn(cfg.weir.max_client_conn as usize);
        let users = load_users(&cfg)?;
        let hba = load_hba(&cfg)?;
        let client_tls = crate::tls::load_client_tls(&cfg)?;
        crate::tls::load_server_tls(&cfg)?;
        let bound = listen::bind(&cfg)?;
        crate::verbosity::set(cfg.weir.verbose);
        let shared = Arc::new(Shared::new(cfg, users));
        shared.hba.store(hba);
        shared.client_tls.store(client_tls);
        let _ = cell.set(Arc::downgrade(&shared));
        shared.listening.store(true, Ordering::SeqCst);
        for listener in bound.listeners {
            shared.tracker.spawn(accept_loop(listener, shared.clone()));
        }
        shared.open_forced_pools();
        spawn_client_gauges(&shared);
        crate::admin::stats::spawn_periods(&shared);
        tracing::info!(addrs = ?bound.tcp, "weir is listening");
        Ok(Weir { shared, addrs: bound.tcp, unix: bound.unix, exporter })
    }

    /// The first TCP address weir listens on.
    pub fn local_addr(&self) -> SocketAddr {
        self.addrs[0]
    }

    /// Every TCP address weir listens on.
    pub fn local_addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The Unix socket weir listens on (`<unix_socket_dir>/.s.PGSQL.<port>`).
    pub fn unix_socket_path(&self) -> Option<&std::path::Path> {
        self.unix.as_deref()
    }

    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.exporter.as_ref().map(|e| e.local_addr())
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// The file RELOAD and SIGHUP re-read.
    pub fn set_config_path(&self, path: PathBuf) {
        self.shared.set_config_path(path);
    }

    /// Applies a new config (and reloads the auth_file) without dropping
    /// clients. Returns notes about settings that need a restart.
    pub fn reload(&self, cfg: Config) -> Result<Vec<String>, ReloadError> {
        self.shared.reload(cfg)
    }

    /// Drains (see `Shared::drain`) and returns when it is done.
    pub async fn shutdown(self) {
        self.shared.drain().await;
    }

    /// Stops accepting and returns once every client has left (see
    /// `Shared::wait_for_clients`).
    pub async fn wait_for_clients(self) {
        self.shared.wait_for_clients().await;
    }
}

/// Keeps the idle/active client gauges in step with the registry, ends
/// clients idle past client_idle_timeout, and removes fallback-database
/// pools unused for autodb_idle_timeout.
fn spawn_client_gauges(shared: &Arc<Shared>) {
    let weak = Arc::downgrade(shared);
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(GAUGE_PERIOD);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(shared) = weak.upgrade() else { return };
            if shared.stopped.is_cancelled() {
                return;
            }
            shared.client_list.publish_gauges(&shared.pools);
            let cfg = shared.config.load();
            let per_user = cfg.users.values().any(|u| u.client_idle_timeout.is_some_and(|d| !d.is_zero()));
            if !cfg.weir.client_idle_timeout.is_zero() || per_user {
                shared.client_list.kill_idle();
            }
            let idle_timeout = shared.config.load().weir.autodb_idle_timeout;
            for key in shared.pools.remove_idle_auto(idle_timeout) {
                tracing::info!(database = %key.database, user = %key.user, "removed an idle fallback-database pool");
            }
        }
    });
}

async fn accept_loop(listener: Listener, shared: Arc<Shared>) {
    // SHUTDOWN WAIT_FOR_CLIENTS closes the TCP listeners, so that new clients
    // go to the other weirs on the port or address; the Unix socket stays,
    // for cancel requests (a peer's forward) and the console.
    let tcp = matches!(listener, Listener::Tcp(_));
    loop {
        // Biased: once told to stop, no connection is accepted any more
        // (those still queued are refused when the listener closes).
        let accepted = tokio::select! {
            biased;
            _ = shared.shutdown.cancelled() => break,
            _ = shared.stopping.cancelled(), if tcp => break,
            r = listener.accept() => r,
        };
        let (socket, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let cfg = shared.config.load();
        // Keepalive: a client whose path dies while it sits quiet (idle, or
        // holding a server mid-transaction) is found in seconds.
        if let Some(tcp) = socket.tcp() {
            let liveness = crate::server::socket::Liveness::from_config(&cfg.weir);
            if let Err(e) = crate::server::socket::keepalive(tcp, &liveness) {
                tracing::debug!(%peer, error = %e, "could not set keepalive on a client socket");
            }
        }
        let max = cfg.weir.max_client_conn as usize;
        drop(cfg);
        if shared.clients.fetch_add(1, Ordering::AcqRel) >= max {
            shared.clients.fetch_sub(1, Ordering::AcqRel);
            shared.cancels.metrics.record_client_connection(ClientResult::Refused);
            shared.tracker.spawn(refuse_over_limit(socket, peer));
            continue;
        }
        // `serve` gives the count back when the client is done.
        shared.tracker.spawn(serve(socket, peer, shared.clone()));
    }
    // The listener closes here (a Unix socket's file goes): new connections
    // are refused from now on.
    shared.listening.store(false, Ordering::SeqCst);
    drop(listener);
    tracing::info!("stopped accepting clients");
}

/// Answers a client over max_client_conn with 53300 and closes gracefully,
/// reading briefly so the error is not lost to a reset.
async fn refuse_over_limit(mut socket: ClientStream, peer: ConnAddr) {
    static REFUSED: crate::ratelog::RateLimited = crate::ratelog::RateLimited::new();
    if let Some(held) = REFUSED.allow() {
        tracing::warn!(%peer, "refusing client: max_client_conn reached ({held} more since the last line)");
    }
    let err = ClientError::TooManyClients;
    let mut out = BytesMut::new();
    messages::error_response(&mut out, Severity::Fatal, err.sqlstate(), &err.client_message());
    let mut sink = [0u8; 1024];
    // An SSLRequest or GSSENCRequest first gets "N" (as Postgres answers when
    // it cannot serve one), so the client reads the error as the answer to its
    // startup packet, as PgBouncer sends it, not as a broken TLS exchange.
    let read = tokio::time::timeout(Duration::from_millis(100), socket.read(&mut sink)).await;
    if let Ok(Ok(8)) = read {
        use crate::protocol::startup::{parse, StartupPacket};
        if matches!(parse(&sink[..8]), Ok(StartupPacket::SslRequest | StartupPacket::GssEncRequest)) {
            let _ = socket.write_all(b"N").await;
            let _ = tokio::time::timeout(Duration::from_millis(100), socket.read(&mut sink)).await;
        }
    }
    let _ = socket.write_all(&out).await;
    let _ = socket.shutdown().await;
    let _ = tokio::time::timeout(Duration::from_millis(200), async {
        while let Ok(n) = socket.read(&mut sink).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}
