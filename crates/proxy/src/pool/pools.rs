//! All pools (`Pools`), keyed by (database, user), created on first use from
//! the live config (not to be confused with `state::client_list`, the list
//! of clients, or `cancel_keys`); plus the per-database server count behind `max_db_connections`.

use std::collections::HashMap;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Weak};

use parking_lot::Mutex;

use super::{Pool, PoolOptions};
use crate::auth::Credentials;
use crate::config::Config;
use crate::server::{probe::Watch, socket::Liveness, ConnectSpec};

/// Which pool: the database name clients ask for, and the user.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolKey {
    pub database: String,
    pub user: String,
}

/// Server connections open or opening to one database, across users, and
/// the pools (one per user) that share that count.
#[derive(Debug, Default)]
pub(crate) struct DbCount {
    pub count: Arc<AtomicU32>,
    pub pools: Mutex<Vec<Weak<Pool>>>,
}

/// The set of pools.
#[derive(Debug, Default)]
pub struct Pools {
    pools: Mutex<HashMap<PoolKey, Arc<Pool>>>,
    dbs: Mutex<HashMap<String, Arc<DbCount>>>,
    /// Clients queued in any pool (`max_waiting_clients_total`).
    queued: Arc<super::QueueCount>,
}

impl Pools {
    pub fn new() -> Self {
        Pools::default()
    }

    /// The pool for `key`, created from `cfg` if it does not exist yet.
    /// None when the database is not configured. An existing pool whose
    /// credentials differ from `credentials` (not `None`) takes them: a later
    /// client proved a new ClientKey or hash (the password changed).
    pub fn get_or_create(&self, cfg: &Config, key: &PoolKey, credentials: impl Into<Credentials>) -> Option<Arc<Pool>> {
        let credentials = credentials.into();
        let existing = self.pools.lock().get(key).cloned();
        if let Some(p) = existing {
            update_credentials(&p, credentials);
            return Some(p);
        }
        let opts = PoolOptions::from_config(cfg, key, credentials)?;
        let db = self.db_count(&key.database);
        let mut pools = self.pools.lock();
        Some(pools.entry(key.clone()).or_insert_with(|| Pool::new(key.clone(), opts, db, self.queued.clone())).clone())
    }

    fn db_count(&self, database: &str) -> Arc<DbCount> {
        let mut dbs = self.dbs.lock();
        dbs.entry(database.to_owned()).or_default().clone()
    }

    /// Clients queued for a server across all pools.
    pub fn queued(&self) -> u32 {
        self.queued.get()
    }

    /// Every pool, sorted by key.
    pub fn all(&self) -> Vec<Arc<Pool>> {
        let mut v: Vec<_> = self.pools.lock().values().cloned().collect();
        v.sort_by(|a, b| a.key.cmp(&b.key));
        v
    }

    pub fn get(&self, database: &str, user: &str) -> Option<Arc<Pool>> {
        let key = PoolKey { database: database.into(), user: user.into() };
        self.pools.lock().get(&key).cloned()
    }

    /// Applies a new config to existing pools (their passwords stay).
    pub fn reconfigure(&self, cfg: &Config) {
        for pool in self.all() {
            let credentials = pool.state.lock().opts.spec.credentials.clone();
            if let Some(opts) = PoolOptions::from_config(cfg, &pool.key, credentials) {
                pool.reconfigure(opts);
            }
        }
    }
}

/// Gives `pool` new credentials when they are known and differ; idle
/// connections pick the new spec up at the next upkeep.
fn update_credentials(pool: &Arc<Pool>, credentials: Credentials) {
    if credentials == Credentials::None {
        return;
    }
    let mut st = pool.state.lock();
    if st.opts.spec.credentials != credentials {
        st.opts.spec.credentials = credentials;
    }
}

impl PoolOptions {
    /// Resolves a pool's options from the config; None for unknown databases.
    pub fn from_config(cfg: &Config, key: &PoolKey, credentials: impl Into<Credentials>) -> Option<PoolOptions> {
        let settings = cfg.pool_settings(&key.database)?;
        let g = &cfg.weir;
        let spec = ConnectSpec {
            host: settings.host.clone(),
            port: settings.port,
            user: key.user.clone(),
            credentials: credentials.into(),
            dbname: settings.dbname.clone(),
            liveness: Liveness::from_config(g),
            connect_timeout: g.server_connect_timeout,
            watch: Watch::from_config(g),
            // Loaded (and checked) at start and reload already; a file gone since is logged.
            tls: crate::tls::load_server_tls(cfg).unwrap_or_else(|e| {
                tracing::error!(error = %e, "server TLS files no longer load; connections will fail");
                crate::tls::broken_server_tls(g.server_tls_sslmode, e.to_string())
            }),
        };
        Some(PoolOptions {
            connect_concurrency: g
                .server_connect_concurrency
                .min(settings.pool_size + settings.reserve_pool_size)
                .max(1),
            reserve_pool_timeout: g.reserve_pool_timeout,
            login_retry_max: g.server_login_retry,
            // Run only on connections marked for it: every one in session mode,
            // pinned sessions' in transaction mode.
            reset_query: Some(g.server_reset_query.clone()),
            reset_timeout: g.server_reset_timeout,
            idle_timeout: g.server_idle_timeout,
            lifetime: g.server_lifetime,
            check_delay: g.server_check_delay,
            check_query: g.server_check_query.clone(),
            check_timeout: g.server_check_timeout,
            admission: super::AdmissionConfig {
                max_waiting_total: g.max_waiting_clients_total,
                shed: g.wait_shedding,
                deadline_start: g.deadline_start,
                deadline_margin: g.deadline_start_margin,
                client_deadline: settings.client_deadline,
            },
            settings,
            spec,
        })
    }
}
