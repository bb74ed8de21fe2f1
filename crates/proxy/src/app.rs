//! The running proxy: shared state, the accept loop, `max_client_conn`, and
//! graceful shutdown through one cancellation token.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weir_metrics::ClientResult;

use crate::auth::UserList;
use crate::cancel::CancelRegistry;
use crate::client::{self, ClientError};
use crate::config::{Config, ConfigCell};
use crate::pool::Pools;
use crate::protocol::messages::{self, Severity};

/// State every client task shares.
#[derive(Debug)]
pub struct Shared {
    pub config: ConfigCell,
    pub users: ArcSwap<UserList>,
    pub pools: Pools,
    pub cancels: Arc<CancelRegistry>,
    pub clients: AtomicUsize,
    pub shutdown: CancellationToken,
}

/// Why weir could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {0}: {1}")]
    Listen(SocketAddr, std::io::Error),
    #[error("cannot load auth_file {0}: {1}")]
    AuthFile(String, String),
    #[error("cannot start the metrics endpoint: {0}")]
    Metrics(#[from] weir_metrics::MetricsError),
}

/// A running weir.
#[derive(Debug)]
pub struct Weir {
    shared: Arc<Shared>,
    addr: SocketAddr,
    tracker: TaskTracker,
    exporter: Option<weir_metrics::Exporter>,
}

/// Loads the auth_file named by the config (empty when there is none).
pub fn load_users(cfg: &Config) -> Result<UserList, StartError> {
    match cfg.auth_file_path() {
        Some(p) => UserList::load(&p).map_err(|e| StartError::AuthFile(p.display().to_string(), e.to_string())),
        None => Ok(UserList::default()),
    }
}

impl Weir {
    /// Binds the listener (and the metrics endpoint) and starts accepting.
    pub async fn start(cfg: Config) -> Result<Weir, StartError> {
        let exporter = match cfg.metrics.listen_addr {
            Some(addr) => Some(weir_metrics::install(addr, Arc::new(|| true))?),
            None => None,
        };
        weir_metrics::set_build_info(env!("CARGO_PKG_VERSION"));
        let users = load_users(&cfg)?;
        let listener = TcpListener::bind(cfg.weir.listen_addr).await.map_err(|e| StartError::Listen(cfg.weir.listen_addr, e))?;
        let addr = listener.local_addr().map_err(|e| StartError::Listen(cfg.weir.listen_addr, e))?;
        let shared = Arc::new(Shared {
            config: ConfigCell::new(cfg),
            users: ArcSwap::from_pointee(users),
            pools: Pools::new(),
            cancels: CancelRegistry::new(),
            clients: AtomicUsize::new(0),
            shutdown: CancellationToken::new(),
        });
        let tracker = TaskTracker::new();
        tracker.spawn(accept_loop(listener, shared.clone(), tracker.clone()));
        tracing::info!(%addr, "weir is listening");
        Ok(Weir { shared, addr, tracker, exporter })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    pub fn metrics_addr(&self) -> Option<SocketAddr> {
        self.exporter.as_ref().map(|e| e.local_addr())
    }

    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Applies a new config (and reloads the auth_file) without dropping clients.
    pub fn reload(&self, cfg: Config) -> Result<(), StartError> {
        let users = load_users(&cfg)?;
        self.shared.users.store(Arc::new(users));
        self.shared.pools.reconfigure(&cfg);
        self.shared.config.store(cfg);
        Ok(())
    }

    /// Stops accepting, lets running transactions finish for up to
    /// `shutdown_timeout`, then closes everything.
    pub async fn shutdown(self) {
        let limit = self.shared.config.load().weir.shutdown_timeout;
        self.shared.shutdown.cancel();
        self.tracker.close();
        if tokio::time::timeout(limit, self.tracker.wait()).await.is_err() {
            tracing::warn!("shutdown_timeout passed with clients still connected");
        }
        for pool in self.shared.pools.all() {
            pool.close_idle(weir_metrics::CloseReason::Shutdown);
        }
    }
}

async fn accept_loop(listener: TcpListener, shared: Arc<Shared>, tracker: TaskTracker) {
    loop {
        let accepted = tokio::select! {
            r = listener.accept() => r,
            _ = shared.shutdown.cancelled() => return,
        };
        let (socket, peer) = match accepted {
            Ok(a) => a,
            Err(e) => {
                tracing::warn!(error = %e, "accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let _ = socket.set_nodelay(true);
        let max = shared.config.load().weir.max_client_conn as usize;
        if shared.clients.fetch_add(1, Ordering::AcqRel) >= max {
            shared.clients.fetch_sub(1, Ordering::AcqRel);
            shared.cancels.metrics.record_client_connection(ClientResult::Refused);
            tracker.spawn(refuse(socket, peer));
            continue;
        }
        let shared = shared.clone();
        tracker.spawn(async move {
            client::serve(socket, peer, shared.clone()).await;
            shared.clients.fetch_sub(1, Ordering::AcqRel);
        });
    }
}

/// Answers a client over max_client_conn with 53300 and closes gracefully,
/// reading briefly so the error is not lost to a reset.
async fn refuse(mut socket: TcpStream, peer: SocketAddr) {
    tracing::warn!(%peer, "refusing client: max_client_conn reached");
    let err = ClientError::TooManyClients;
    let mut out = BytesMut::new();
    messages::error_response(&mut out, Severity::Fatal, err.sqlstate(), &err.client_message());
    let mut sink = [0u8; 1024];
    let _ = tokio::time::timeout(Duration::from_millis(100), socket.read(&mut sink)).await;
    let _ = socket.write_all(&out).await;
    let _ = socket.shutdown().await;
    let _ = tokio::time::timeout(Duration::from_millis(200), async { while let Ok(n) = socket.read(&mut sink).await { if n == 0 { break; } } }).await;
}
