//! Shared state and its lifecycle: what every client task shares (`Shared`:
//! the live config, the auth_file and hba rules, the pools, the cancel keys,
//! the list of logged-in clients), the PAUSE bookkeeping, config reload, and
//! the drain and stop. `app` owns the listener and starts and ends a running
//! weir through this; the client tasks and the console read and change it.

pub(crate) mod caps;
pub(crate) mod client_list;
pub(crate) mod disabled;
mod shutdown;
mod stopping;

pub use stopping::StopMode;

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::{ArcSwap, ArcSwapOption};
use parking_lot::Mutex;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;
use weir_metrics::CloseReason;

use crate::auth::hba::Hba;
use crate::auth::UserList;
use crate::cancel_keys::CancelKeys;
use crate::config::{Config, ConfigCell, ConfigError};
use crate::pool::{Pool, PoolKey, Pools};
use client_list::ClientList;

/// State every client task shares.
#[derive(Debug)]
pub struct Shared {
    pub config: ConfigCell,
    pub users: ArcSwap<UserList>,
    /// The auth_hba_file's rules, with auth_type = "hba".
    pub(crate) hba: ArcSwapOption<Hba>,
    /// The client-side TLS acceptor (None with client_tls_sslmode = disable).
    pub(crate) client_tls: ArcSwapOption<crate::tls::ClientTls>,
    pub pools: Pools,
    /// Verifiers found by auth_query, for users not in auth_file.
    pub(crate) auth_query_cache: crate::auth::query::AuthQueryCache,
    pub cancels: Arc<CancelKeys>,
    /// Client connections open (logged in or not), for max_client_conn.
    pub clients: AtomicUsize,
    /// Logged-in clients (SHOW CLIENTS, KILL, the drain).
    pub(crate) client_list: Arc<ClientList>,
    /// Clients by database and user (max_db/user_client_connections).
    pub(crate) caps: Arc<caps::ClientCaps>,
    /// Cancelled when the drain starts: no new clients, idle clients leave.
    pub shutdown: crate::signal::Signal,
    /// Set by SHUTDOWN WAIT_FOR_SERVERS / WAIT_FOR_CLIENTS (`stopping`).
    pub stopping: crate::signal::Signal,
    /// Cancelled when the drain (or a stop) is complete.
    pub(crate) stopped: CancellationToken,
    /// Every client task (and the accept loop).
    pub(crate) tracker: TaskTracker,
    config_path: Mutex<Option<PathBuf>>,
    paused: Mutex<Paused>,
    pub(crate) listening: AtomicBool,
    draining: AtomicBool,
    reload_lock: Mutex<()>,
    /// The console's DISABLE list.
    pub admin: disabled::AdminState,
}

/// What PAUSE/KILL left paused: everything, or some databases.
#[derive(Debug, Default)]
struct Paused {
    all: bool,
    databases: BTreeSet<String>,
}

/// Why weir could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot listen on {0}: {1}")]
    Listen(String, std::io::Error),
    #[error("cannot load auth_file {0}: {1}")]
    AuthFile(String, String),
    #[error("cannot load auth_hba_file {0}: {1}")]
    HbaFile(String, String),
    #[error("cannot start the metrics endpoint: {0}{hint}", hint = metrics_hint(.0))]
    Metrics(#[from] weir_metrics::MetricsError),
    #[error("TLS: {0}")]
    Tls(#[from] crate::tls::TlsError),
}

/// What to change when the metrics port cannot be bound: the key, since a
/// second weir on a host with the same (migrated) config meets this first.
fn metrics_hint(e: &weir_metrics::MetricsError) -> &'static str {
    match e {
        weir_metrics::MetricsError::Bind { .. } => {
            " (another process holds it: set [metrics] listen_addr to a free address, or remove it for no endpoint)"
        }
        _ => "",
    }
}

/// Why a reload was not applied (the old config stays).
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    #[error("weir was started without a config file, so there is nothing to reload")]
    NoConfigFile,
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("{0}")]
    AuthFile(String),
    #[error("TLS: {0}")]
    Tls(#[from] crate::tls::TlsError),
}

/// Loads the auth_file named by the config (empty when there is none). A
/// user weir logs in as with only a SCRAM verifier there is logged, not
/// refused: PgBouncer starts on such a file and fails only those logins.
pub fn load_users(cfg: &Config) -> Result<UserList, StartError> {
    let Some(p) = cfg.auth_file_path() else { return Ok(UserList::default()) };
    let users = UserList::load(&p).map_err(|e| StartError::AuthFile(p.display().to_string(), e.to_string()))?;
    for problem in crate::auth::stored_login_problems(cfg, &users) {
        tracing::warn!("{problem}");
    }
    Ok(users)
}

/// Loads the auth_hba_file named by the config (None when there is none).
pub fn load_hba(cfg: &Config) -> Result<Option<Arc<Hba>>, StartError> {
    match cfg.auth_hba_file_path() {
        Some(p) => Hba::load(&p)
            .map(|h| Some(Arc::new(h)))
            .map_err(|e| StartError::HbaFile(p.display().to_string(), e.to_string())),
        None => Ok(None),
    }
}

impl Shared {
    /// The file RELOAD and SIGHUP re-read.
    pub fn set_config_path(&self, path: PathBuf) {
        *self.config_path.lock() = Some(path);
    }

    pub fn new(cfg: Config, users: UserList) -> Shared {
        let cancels = CancelKeys::for_peer(cfg.weir.peer_id);
        Shared {
            config: ConfigCell::new(cfg),
            users: ArcSwap::from_pointee(users),
            hba: ArcSwapOption::empty(),
            client_tls: ArcSwapOption::empty(),
            pools: Pools::new(),
            auth_query_cache: Default::default(),
            cancels,
            clients: AtomicUsize::new(0),
            client_list: ClientList::new(),
            caps: Arc::default(),
            shutdown: crate::signal::Signal::new(),
            stopping: crate::signal::Signal::new(),
            stopped: CancellationToken::new(),
            tracker: TaskTracker::new(),
            config_path: Mutex::new(None),
            paused: Mutex::new(Paused::default()),
            listening: AtomicBool::new(false),
            draining: AtomicBool::new(false),
            reload_lock: Mutex::new(()),
            admin: Default::default(),
        }
    }

    /// The pool for `key`, created if needed; a new pool of a paused
    /// database starts paused.
    pub fn pool_for(
        &self,
        cfg: &Config,
        key: &PoolKey,
        credentials: impl Into<crate::auth::Credentials>,
    ) -> Option<Arc<Pool>> {
        let pool = self.pools.get_or_create(cfg, key, credentials)?;
        if self.is_paused(&key.database) {
            pool.pause();
        }
        if self.is_stopping() {
            pool.stop_lending();
        }
        Some(pool)
    }

    /// Opens the pool of each database with a forced user and a
    /// min_pool_size, so that its upkeep keeps min_pool_size servers open
    /// before any client comes (PgBouncer's janitor fills such pools from
    /// the start, and after a RELOAD adds one).
    pub fn open_forced_pools(&self) {
        let cfg = self.config.load();
        let users = self.users.load();
        for name in cfg.databases.keys() {
            let Some((forced, password)) = cfg.forced_user(name) else { continue };
            if cfg.pool_settings(name).is_none_or(|s| s.min_pool_size == 0) {
                continue;
            }
            let credentials = match password {
                Some(p) => crate::auth::Credentials::Password(p.to_owned()),
                None => crate::auth::Credentials::of_stored(users.get(forced)),
            };
            let key = PoolKey { database: name.clone(), user: forced.to_owned() };
            self.pool_for(&cfg, &key, credentials);
        }
    }

    pub fn is_paused(&self, database: &str) -> bool {
        let p = self.paused.lock();
        p.all || p.databases.contains(database)
    }

    /// Every database name PAUSE or KILL left paused ("*" for all).
    pub fn paused_databases(&self) -> Vec<String> {
        let p = self.paused.lock();
        p.all.then(|| "*".to_owned()).into_iter().chain(p.databases.iter().cloned()).collect()
    }

    /// Marks `database` (or everything, for None) paused or resumed, and
    /// pauses or resumes the pools that exist. Returns the pools touched.
    pub fn set_paused(&self, database: Option<&str>, paused: bool) -> Vec<Arc<Pool>> {
        {
            let mut p = self.paused.lock();
            match (database, paused) {
                (None, true) => p.all = true,
                (None, false) => *p = Paused::default(),
                (Some(db), true) => {
                    p.databases.insert(db.to_owned());
                }
                (Some(db), false) => {
                    p.databases.remove(db);
                }
            }
        }
        let pools: Vec<_> =
            self.pools.all().into_iter().filter(|p| database.is_none_or(|d| p.key.database == d)).collect();
        for pool in &pools {
            if paused {
                pool.pause();
            } else if !self.is_paused(&pool.key.database) {
                pool.resume();
            }
        }
        pools
    }

    /// Ready for clients: listening, not draining, and either a server
    /// connection has been made or no pool is waiting or failing to connect.
    pub fn is_ready(&self) -> bool {
        if !self.listening.load(Ordering::SeqCst) || self.shutdown.is_cancelled() {
            return false;
        }
        let pools = self.pools.all();
        pools.iter().any(|p| p.metrics.opened() > 0)
            || pools.iter().all(|p| p.snapshot().waiting == 0 && p.metrics.connect_failures_total() == 0)
    }

    /// Re-reads the config file and applies it (RELOAD, SIGHUP).
    pub fn reload_from_disk(&self) -> Result<Vec<String>, ReloadError> {
        let path = self.config_path.lock().clone().ok_or(ReloadError::NoConfigFile)?;
        let cfg = Config::load(&path)?;
        let applied = self.reload(cfg)?;
        // The file's values replace every SET, those still waiting too.
        self.admin.set_pending(toml::Table::new());
        Ok(applied)
    }

    /// Applies a validated config and its auth_file without dropping clients.
    /// Settings that need a restart keep their running values; the returned
    /// notes say which ones changed.
    pub fn reload(&self, cfg: Config) -> Result<Vec<String>, ReloadError> {
        let max_client_conn = cfg.weir.max_client_conn;
        let result = self.apply(cfg);
        let counted = if result.is_ok() { weir_metrics::ReloadResult::Ok } else { weir_metrics::ReloadResult::Failed };
        weir_metrics::record_reload(counted);
        if result.is_ok() {
            weir_metrics::set_max_client_conn(max_client_conn as usize);
        }
        result
    }

    /// `reload` without the counting.
    fn apply(&self, mut cfg: Config) -> Result<Vec<String>, ReloadError> {
        let _one_at_a_time = self.reload_lock.lock();
        let users = load_users(&cfg).map_err(|e| ReloadError::AuthFile(e.to_string()))?;
        let hba = load_hba(&cfg).map_err(|e| ReloadError::AuthFile(e.to_string()))?;
        let client_tls = crate::tls::load_client_tls(&cfg)?;
        crate::tls::load_server_tls(&cfg)?;
        let old = self.config.load();
        let mut notes = Vec::new();
        let mut keep = |key: &str, changed: bool| {
            if changed {
                notes.push(format!("{key} changed in the file but needs a restart; the running value is kept"));
            }
        };
        keep("listen_addr", cfg.weir.listen_addr != old.weir.listen_addr);
        let (new_unix, old_unix) = (&cfg.weir, &old.weir);
        let unix_changed = (&new_unix.unix_socket_dir, &new_unix.unix_socket_mode, &new_unix.unix_socket_group)
            != (&old_unix.unix_socket_dir, &old_unix.unix_socket_mode, &old_unix.unix_socket_group);
        keep("unix_socket_dir, unix_socket_mode or unix_socket_group", unix_changed);
        keep("log_format", cfg.weir.log_format != old.weir.log_format);
        keep("worker_threads", cfg.weir.worker_threads != old.weir.worker_threads);
        // The keys handed out carry the peer id: it cannot change under them.
        keep("peer_id", cfg.weir.peer_id != old.weir.peer_id);
        keep("so_reuseport", cfg.weir.so_reuseport != old.weir.so_reuseport);
        cfg.weir.peer_id = old.weir.peer_id;
        cfg.weir.so_reuseport = old.weir.so_reuseport;
        let metrics = |m: &crate::config::MetricsSection| (m.listen_addr, m.enabled);
        keep("metrics.listen_addr", metrics(&cfg.metrics) != metrics(&old.metrics));
        cfg.weir.listen_addr = old.weir.listen_addr.clone();
        cfg.weir.unix_socket_dir = old.weir.unix_socket_dir.clone();
        cfg.weir.unix_socket_mode = old.weir.unix_socket_mode.clone();
        cfg.weir.unix_socket_group = old.weir.unix_socket_group.clone();
        cfg.weir.log_format = old.weir.log_format;
        cfg.weir.worker_threads = old.weir.worker_threads;
        cfg.metrics = old.metrics.clone();
        self.users.store(Arc::new(users));
        // auth_query, auth_user or auth_dbname may have changed.
        self.auth_query_cache.clear();
        self.hba.store(hba);
        self.client_tls.store(client_tls);
        let server_tls = |g: &crate::config::General| {
            (
                g.server_tls_sslmode,
                g.server_tls_ca_file.clone(),
                g.server_tls_cert_file.clone(),
                g.server_tls_key_file.clone(),
            )
        };
        let tls_changed = server_tls(&cfg.weir) != server_tls(&old.weir);
        self.pools.reconfigure(&cfg);
        if tls_changed {
            self.pools.all().iter().for_each(|p| p.new_server_settings());
        }
        crate::verbosity::set(cfg.weir.verbose);
        self.config.store(cfg);
        self.open_forced_pools();
        Ok(notes)
    }

    /// Drains, as for SIGTERM: stops accepting (the listener closes and
    /// /readyz turns 503), idle clients get FATAL 57P01, running transactions
    /// may finish for up to `shutdown_timeout`; then the remaining clients are
    /// disconnected and every server connection is closed (reason shutdown).
    /// A second call waits for the first.
    pub async fn drain(self: &Arc<Self>) {
        if self.draining.swap(true, Ordering::SeqCst) {
            return self.stopped.cancelled().await;
        }
        let cfg = self.config.load();
        let limit = cfg.weir.shutdown_timeout;
        tracing::info!(clients = self.client_list.len(), shutdown_timeout = ?limit, "draining: not accepting; waiting for running transactions");
        self.shutdown.cancel();
        self.client_list.wake_for_drain();
        self.tracker.close();
        if tokio::time::timeout(limit, self.tracker.wait()).await.is_err() {
            let n = self.client_list.kill_database(None, "weir is shutting down: shutdown_timeout expired");
            tracing::warn!(clients = n, "shutdown_timeout passed; disconnecting the remaining clients");
            let _ = tokio::time::timeout(Duration::from_secs(2), self.tracker.wait()).await;
        }
        let settle = cfg.weir.server_reset_timeout.max(cfg.weir.server_connect_timeout) + Duration::from_millis(500);
        if quiesce(&self.pools.all(), CloseReason::Shutdown, Some(settle)).await != Quiesced::Closed {
            tracing::warn!("some server connections were still busy when the drain ended");
        }
        tracing::info!("drained");
        self.stopped.cancel();
    }

    /// Stops at once (SIGINT): no drain; idle server connections are closed.
    pub fn stop_now(&self) {
        self.draining.store(true, Ordering::SeqCst);
        self.shutdown.cancel();
        for pool in self.pools.all() {
            pool.pause();
            pool.close_idle(CloseReason::Shutdown);
        }
        self.stopped.cancel();
    }
}

/// How a `quiesce` ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Quiesced {
    /// No server of the pools is lent, being recovered or connecting.
    Closed,
    /// The limit passed first.
    TimedOut,
    /// A pool was resumed meanwhile (RESUME, SIGUSR2): the wait is over, and
    /// the servers that come back now stay.
    Resumed,
}

/// Pauses `pools` and closes their server connections with `reason` as they
/// become idle, until none is lent, being recovered or connecting, until
/// `limit` (None: no limit), or until one of them is resumed. Cancel-safe.
pub async fn quiesce(pools: &[Arc<Pool>], reason: CloseReason, limit: Option<Duration>) -> Quiesced {
    pools.iter().for_each(|p| p.pause());
    let deadline = limit.map(|l| tokio::time::Instant::now() + l);
    loop {
        let mut busy = false;
        for pool in pools {
            let s = pool.snapshot();
            if !s.paused {
                return Quiesced::Resumed;
            }
            pool.close_idle(reason);
            busy |= s.active + s.recovering + s.connecting > 0;
        }
        if !busy {
            return Quiesced::Closed;
        }
        if deadline.is_some_and(|d| tokio::time::Instant::now() >= d) {
            return Quiesced::TimedOut;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared() -> Shared {
        let cfg =
            Config::from_toml("[weir]\nauth_type = \"trust\"\n[databases.app]\n", std::path::Path::new(".")).unwrap();
        Shared::new(cfg, UserList::default())
    }

    #[tokio::test]
    async fn pause_bookkeeping() {
        let s = shared();
        assert!(!s.is_paused("app"));
        s.set_paused(Some("app"), true);
        assert!(s.is_paused("app") && !s.is_paused("other"));
        s.set_paused(None, true);
        assert!(s.is_paused("other"));
        assert_eq!(s.paused_databases(), vec!["*", "app"]);
        s.set_paused(None, false);
        assert!(!s.is_paused("app"));
    }

    #[tokio::test]
    async fn reload_keeps_restart_only_settings() {
        let s = shared();
        let next = Config::from_toml(
            "[weir]\nauth_type = \"trust\"\nlisten_addr = \"127.0.0.1:7000\"\ndefault_pool_size = 3\n[databases.app]\n",
            std::path::Path::new("."),
        )
        .unwrap();
        let notes = s.reload(next).unwrap();
        assert_eq!(notes.len(), 1, "{notes:?}");
        let live = s.config.load();
        assert_eq!((live.weir.listen_addr.port(), live.weir.default_pool_size), (6432, 3));
        assert!(matches!(s.reload_from_disk(), Err(ReloadError::NoConfigFile)));
    }

    #[tokio::test]
    async fn not_ready_before_listening_or_while_draining() {
        let s = Arc::new(shared());
        assert!(!s.is_ready());
        s.listening.store(true, Ordering::SeqCst);
        assert!(s.is_ready(), "no pools yet: idle and healthy");
        s.stop_now();
        assert!(!s.is_ready());
        s.drain().await;
    }
}
