//! All pools (`Pools`), keyed by (database, user), created on first use from
//! the live config (not to be confused with `state::client_list`, the list
//! of clients, or `cancel_keys`); plus the per-database server count behind
//! `max_db_connections` and the per-user one behind `max_user_connections`.
//! Pools of the fallback database that nobody used for `autodb_idle_timeout`
//! are removed (`remove_idle_auto`), and their metric series with them.

use std::collections::HashMap;
use std::sync::atomic::AtomicU32;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::{Pool, PoolOptions};
use crate::auth::Credentials;
use crate::config::Config;
use crate::server::{socket::Liveness, watch::Watch, ConnectSpec};

/// Which pool: the database name clients ask for, and the user.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PoolKey {
    pub database: String,
    pub user: String,
}

/// Server connections open or opening to one database across users (or of
/// one user across databases), and the pools that share that count.
#[derive(Debug, Default)]
pub(crate) struct DbCount {
    pub count: Arc<AtomicU32>,
    pub pools: Mutex<Vec<Weak<Pool>>>,
    /// Set when a pool's connect was held back by this count's cap;
    /// cleared by whoever then wakes the database's pools (`evict.rs`).
    pub blocked: std::sync::atomic::AtomicBool,
}

/// The set of pools.
#[derive(Debug, Default)]
pub struct Pools {
    pools: Mutex<HashMap<PoolKey, Arc<Pool>>>,
    dbs: Mutex<HashMap<String, Arc<DbCount>>>,
    users: Mutex<HashMap<String, Arc<DbCount>>>,
    /// Fallback-database pools found unused, and since when.
    unused_since: Mutex<HashMap<PoolKey, Instant>>,
    /// Clients queued in any pool (`max_waiting_clients_total`).
    queued: Arc<super::QueueCount>,
    /// Each database's hosts, shared by its pools.
    hosts: Mutex<HashMap<String, Arc<super::HostSet>>>,
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
        let db = count(&self.dbs, &key.database);
        let user = count(&self.users, &key.user);
        let hosts = self.host_set(&key.database, &opts.hosts);
        let mut pools = self.pools.lock();
        // A database the fallback serves is registered with its first pool
        // (PgBouncer's log line, in the client's span).
        if opts.settings.auto && !pools.keys().any(|k| k.database == key.database) {
            tracing::info!("registered new auto-database: {}", key.database);
        }
        Some(
            pools
                .entry(key.clone())
                .or_insert_with(|| Pool::new(key.clone(), opts, db, user, self.queued.clone(), hosts))
                .clone(),
        )
    }

    /// Removes the fallback database's pools that had no client, no lent
    /// server and no waiter for `idle_timeout` (checked at each call), and
    /// closes their idle servers. A removed pool's metric series go with it.
    /// Returns the keys removed.
    pub fn remove_idle_auto(&self, idle_timeout: Duration) -> Vec<PoolKey> {
        let now = Instant::now();
        let mut removed = Vec::new();
        let mut pools = self.pools.lock();
        let mut unused = self.unused_since.lock();
        unused.retain(|k, _| pools.contains_key(k));
        for (key, pool) in pools.iter() {
            // Only the map holds it: no client session and no lease.
            let in_use = Arc::strong_count(pool) > 1 || !pool.snapshot().is_unused();
            if !pool.settings().auto || in_use {
                unused.remove(key);
                continue;
            }
            let since = *unused.entry(key.clone()).or_insert(now);
            if now.duration_since(since) >= idle_timeout {
                removed.push(key.clone());
            }
        }
        for key in &removed {
            unused.remove(key);
            if let Some(pool) = pools.remove(key) {
                pool.close_idle(weir_metrics::CloseReason::IdleTimeout);
            }
        }
        if !removed.is_empty() {
            // A database whose last pool went takes its hosts along (and
            // their series leave /metrics).
            self.hosts.lock().retain(|db, set| set.in_use() || pools.keys().any(|k| k.database == *db));
        }
        removed
    }

    /// The hosts of database `database` (once a pool of it exists).
    pub fn hosts(&self, database: &str) -> Option<Arc<super::HostSet>> {
        self.hosts.lock().get(database).cloned()
    }

    /// The host set of `database`, created if needed.
    fn host_set(&self, database: &str, cfg: &super::HostsConfig) -> Arc<super::HostSet> {
        self.hosts
            .lock()
            .entry(database.to_owned())
            .or_insert_with(|| super::HostSet::new(database, cfg.clone()))
            .clone()
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

/// The shared server count for `name` in `counts`, created if needed.
fn count(counts: &Mutex<HashMap<String, Arc<DbCount>>>, name: &str) -> Arc<DbCount> {
    counts.lock().entry(name.to_owned()).or_default().clone()
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
        let settings = cfg.pool_settings_for(&key.database, Some(&key.user))?;
        let g = &cfg.weir;
        let spec = ConnectSpec {
            // The first host; each connect is aimed at the host the pool chose.
            host: settings.hosts.first().map_or_else(|| settings.host.clone(), |h| h.host.clone()),
            port: settings.port,
            addr: None,
            user: key.user.clone(),
            credentials: credentials.into(),
            dbname: settings.dbname.clone(),
            liveness: Liveness::from_config(g),
            connect_timeout: g.server_connect_timeout,
            watch: Watch::for_pool(g, &settings),
            // Loaded (and checked) at start and reload already; a file gone since is logged.
            tls: crate::tls::load_server_tls(cfg).unwrap_or_else(|e| {
                tracing::error!(error = %e, "server TLS files no longer load; connections will fail");
                crate::tls::broken_server_tls(g.server_tls_sslmode, e.to_string())
            }),
            startup_params: settings.startup_params.clone(),
            connect_query: settings.connect_query.clone(),
            // Set by the pool itself (`Pool::new`, `reconfigure`).
            probe_room: Default::default(),
            refuses_3_2: Default::default(),
        };
        Some(PoolOptions {
            connect_concurrency: g
                .server_connect_concurrency
                .min(settings.pool_size + settings.reserve_pool_size)
                .max(1),
            reserve_pool_timeout: g.reserve_pool_timeout,
            fingerprint_share: g.max_fingerprint_share,
            top_queries: g.top_queries,
            login_retry_max: g.server_login_retry,
            // Run only on connections marked for it: every one in session mode,
            // pinned sessions' in transaction mode.
            reset_query: Some(g.server_reset_query.clone()),
            reset_timeout: g.server_reset_timeout,
            idle_timeout: g.server_idle_timeout,
            lifetime: settings.server_lifetime,
            check_delay: g.server_check_delay,
            check_query: g.server_check_query.clone(),
            check_timeout: g.server_check_timeout,
            hosts: super::HostsConfig {
                hosts: settings.hosts.clone(),
                load_balance: settings.load_balance_hosts,
                target: settings.target_session_attrs,
                dns_max_ttl: g.dns_max_ttl,
                connect_timeout: g.server_connect_timeout,
                retry_max: g.server_login_retry,
            },
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

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg() -> Config {
        let text = "[weir]\nauth_type = \"trust\"\n[databases.app]\n[databases.\"*\"]\nport = 5999\n";
        Config::from_toml(text, std::path::Path::new(".")).unwrap()
    }

    fn key(db: &str) -> PoolKey {
        PoolKey { database: db.into(), user: "u".into() }
    }

    #[tokio::test]
    async fn unused_fallback_pools_are_removed_and_listed_ones_kept() {
        let (pools, cfg) = (Pools::new(), cfg());
        let auto = pools.get_or_create(&cfg, &key("other"), None).expect("the fallback serves any name");
        assert!(auto.settings().auto && auto.settings().dbname == "other");
        let listed = pools.get_or_create(&cfg, &key("app"), None).unwrap();
        assert!(!listed.settings().auto);
        assert!(pools.remove_idle_auto(Duration::ZERO).is_empty(), "a client still holds it");
        drop((auto, listed));
        assert!(pools.remove_idle_auto(Duration::from_secs(3600)).is_empty(), "not idle long enough");
        assert_eq!(pools.remove_idle_auto(Duration::ZERO), vec![key("other")]);
        assert_eq!(pools.all().iter().map(|p| p.key.database.as_str()).collect::<Vec<_>>(), ["app"]);
    }
}
