//! What one pool, database or user gets from the config: `[users.USER]`
//! over `[databases.NAME]` over `[weir]` (`pool_settings_for`), the
//! fallback database, forced and auth_query users, client limits, and
//! where the metrics endpoint listens.

use std::net::SocketAddr;
use std::time::Duration;

use super::{Config, Database, PoolSettings, FALLBACK_DATABASE};

impl Config {
    /// Where the metrics endpoint (/metrics, /healthz, /readyz) listens,
    /// and whether that address was configured (a configured address that
    /// cannot be bound stops weir; the derived one is only logged). Unset,
    /// it is 127.0.0.1 on the port derived from the listen port, as `weir
    /// migrate-config` writes it (6432 -> 9930; a listen port of 0 gives
    /// 0, any free port). None with `[metrics] enabled = false`.
    pub fn metrics_endpoint(&self) -> Option<(SocketAddr, bool)> {
        if !self.metrics.enabled {
            return None;
        }
        if let Some(addr) = self.metrics.listen_addr {
            return Some((addr, true));
        }
        let port = match self.weir.listen_addr.port() {
            0 => 0,
            p => super::migrate::metrics_port(Some(p)),
        };
        Some((SocketAddr::from(([127, 0, 0, 1], port)), false))
    }

    /// The client connections database `name` may have (0: no limit).
    pub fn db_client_cap(&self, name: &str) -> u32 {
        let own = self.databases.get(name).and_then(|d| d.max_db_client_connections);
        own.filter(|n| *n > 0).unwrap_or(self.weir.max_db_client_connections)
    }

    /// The client connections `user` may have (0: no limit).
    pub fn user_client_cap(&self, user: &str) -> u32 {
        let own = self.users.get(user).and_then(|u| u.max_user_client_connections);
        own.filter(|n| *n > 0).unwrap_or(self.weir.max_user_client_connections)
    }

    /// The entry serving database `name`: its own, or the fallback `"*"`
    /// (true: the fallback's).
    pub fn database(&self, name: &str) -> Option<(&Database, bool)> {
        match self.databases.get(name) {
            Some(db) => Some((db, name == FALLBACK_DATABASE)),
            None => self.databases.get(FALLBACK_DATABASE).map(|db| (db, true)),
        }
    }

    /// The forced user of database `name` and its configured password.
    pub fn forced_user(&self, name: &str) -> Option<(&str, Option<&str>)> {
        let (db, _) = self.database(name)?;
        db.user.as_deref().map(|u| (u, db.password.as_deref()))
    }

    /// The database auth_query runs in for clients of database `name`: its
    /// own auth_dbname, else `[weir]`'s; None: the client's own database.
    pub fn auth_dbname(&self, name: &str) -> Option<&str> {
        let own = self.database(name).and_then(|(db, _)| db.auth_dbname.as_deref());
        own.or(Some(self.weir.auth_dbname.as_str())).filter(|d| !d.is_empty())
    }

    /// The auth_query for clients of database `name`: its own, else `[weir]`'s.
    pub fn auth_query(&self, name: &str) -> &str {
        let own = self.database(name).and_then(|(db, _)| db.auth_query.as_deref());
        own.unwrap_or(&self.weir.auth_query)
    }

    /// The auth_query user for clients of database `name` (empty: none).
    pub fn auth_user(&self, name: &str) -> &str {
        let own = self.database(name).and_then(|(db, _)| db.auth_user.as_deref());
        own.unwrap_or(&self.weir.auth_user)
    }

    /// Resolved settings for clients asking for database `name` (any user).
    pub fn pool_settings(&self, name: &str) -> Option<PoolSettings> {
        self.pool_settings_for(name, None)
    }

    /// Resolved settings for the pool of database `name` and `user`:
    /// `[users.USER]` over `[databases.NAME]` over `[weir]`.
    pub fn pool_settings_for(&self, name: &str, user: Option<&str>) -> Option<PoolSettings> {
        let (db, auto) = self.database(name)?;
        let u = user.and_then(|u| self.users.get(u)).cloned().unwrap_or_default();
        let g = &self.weir;
        let pool_size = u.pool_size.or(db.pool_size).unwrap_or(g.default_pool_size);
        Some(PoolSettings {
            host: db.host.clone(),
            port: db.port.first(),
            hosts: super::hosts::host_list(&db.host, &db.port).unwrap_or_default(),
            load_balance_hosts: db.load_balance_hosts.unwrap_or_default(),
            target_session_attrs: db.target_session_attrs.unwrap_or_default(),
            dbname: db.dbname.clone().unwrap_or_else(|| name.to_owned()),
            pool_mode: u.pool_mode.or(db.pool_mode).unwrap_or(g.pool_mode),
            pool_size,
            // Capped by the pool's size, as PgBouncer does (not refused).
            min_pool_size: db.min_pool_size.unwrap_or(g.min_pool_size).min(pool_size),
            reserve_pool_size: u.reserve_pool_size.or(db.reserve_pool_size).unwrap_or(g.reserve_pool_size),
            max_db_connections: db.max_db_connections.unwrap_or(g.max_db_connections),
            server_lifetime: db.server_lifetime.filter(|d| !d.is_zero()).unwrap_or(g.server_lifetime),
            query_wait_timeout: db.query_wait_timeout.unwrap_or(g.query_wait_timeout),
            query_timeout: u.query_timeout.or(g.query_timeout).filter(|d| !d.is_zero()),
            idle_transaction_timeout: u
                .idle_transaction_timeout
                .or(g.idle_transaction_timeout)
                .filter(|d| !d.is_zero()),
            transaction_timeout: u.transaction_timeout.or(g.transaction_timeout).filter(|d| !d.is_zero()),
            client_idle_timeout: u.client_idle_timeout.unwrap_or(g.client_idle_timeout),
            query_wait_notify: g.query_wait_notify,
            client_deadline: db.client_deadline.or(g.client_deadline),
            max_waiting_clients: db.max_waiting_clients.unwrap_or(g.max_waiting_clients),
            max_prepared_statements: g.max_prepared_statements,
            prepare_unnamed_after: g.prepare_unnamed_after,
            max_user_connections: u.max_user_connections.unwrap_or(g.max_user_connections),
            fleet_share: db.fleet_share.unwrap_or(g.fleet_share),
            auto,
            connect_query: db.connect_query.clone().unwrap_or_default(),
            startup_params: db.startup_params(),
        })
    }
}

impl PoolSettings {
    /// How long a client may wait for a server, and the key that says so:
    /// query_wait_timeout, or query_timeout when it is shorter (PgBouncer
    /// ends a waiting client at whichever comes first).
    pub fn wait_limit(&self) -> (Duration, &'static str) {
        match self.query_timeout {
            Some(q) if q < self.query_wait_timeout => (q, "query_timeout"),
            _ => (self.query_wait_timeout, "query_wait_timeout"),
        }
    }
}

impl Database {
    /// The server startup parameters this entry sets, in PgBouncer's order.
    fn startup_params(&self) -> Vec<(String, String)> {
        let named = [
            ("client_encoding", &self.client_encoding),
            ("DateStyle", &self.datestyle),
            ("TimeZone", &self.timezone),
            ("application_name", &self.application_name),
        ];
        named.into_iter().filter_map(|(k, v)| Some((k.to_owned(), v.clone()?))).collect()
    }
}
