//! weir's configuration: the TOML shape (PgBouncer's key names where the
//! meaning matches), explicit defaults, `validate()`, loading, and
//! `check` (every problem of a file at once, for `weir check-config`). The live
//! config is shared as `Arc<Config>` behind one swap cell (see `ConfigCell`).

pub mod check;
mod defaults;
pub mod differences;
pub mod hosts;
pub(crate) mod keys;
mod listen;
pub mod migrate;
mod validate;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use arc_swap::ArcSwap;
use serde::{Deserialize, Serialize};

pub use hosts::{HostPort, LoadBalanceHosts, Ports, TargetSessionAttrs};
pub use listen::{ListenAddr, MAX_SOCKET_PATH};
pub use validate::ConfigError;

/// Client authentication method.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum AuthType {
    /// No password; with an auth_file, only the users it names (PgBouncer's
    /// rule: "\"trust\" authentication failed" for others).
    Trust,
    /// No password and any user name: every client logs in as its
    /// database's forced user (PgBouncer's `any`).
    Any,
    /// The password in cleartext (PgBouncer's `plain`).
    Plain,
    Md5,
    #[serde(rename = "scram-sha-256")]
    ScramSha256,
    /// Per client, by the first matching line of `auth_hba_file`.
    Hba,
}

/// TLS towards clients (PgBouncer's `client_tls_sslmode`): `allow`/`prefer`
/// answer a client's SSLRequest with TLS, `require` refuses clients without
/// TLS, `verify-ca`/`verify-full` also require a client certificate signed by
/// `client_tls_ca_file`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClientTlsMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl ClientTlsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ClientTlsMode::Disable => "disable",
            ClientTlsMode::Allow => "allow",
            ClientTlsMode::Prefer => "prefer",
            ClientTlsMode::Require => "require",
            ClientTlsMode::VerifyCa => "verify-ca",
            ClientTlsMode::VerifyFull => "verify-full",
        }
    }
    /// Clients must use TLS.
    pub fn required(self) -> bool {
        matches!(self, ClientTlsMode::Require | ClientTlsMode::VerifyCa | ClientTlsMode::VerifyFull)
    }
    /// Clients must present a certificate that verifies against the CA.
    pub fn verifies_client(self) -> bool {
        matches!(self, ClientTlsMode::VerifyCa | ClientTlsMode::VerifyFull)
    }
}

/// TLS towards Postgres (PgBouncer's `server_tls_sslmode`): `prefer` uses TLS
/// when the server offers it, `require` insists on it (certificate not
/// checked), `verify-ca` checks the chain against `server_tls_ca_file`,
/// `verify-full` also the database's `host` against the certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServerTlsMode {
    Disable,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl ServerTlsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ServerTlsMode::Disable => "disable",
            ServerTlsMode::Prefer => "prefer",
            ServerTlsMode::Require => "require",
            ServerTlsMode::VerifyCa => "verify-ca",
            ServerTlsMode::VerifyFull => "verify-full",
        }
    }
}

/// When a server connection goes back to the pool.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum PoolMode {
    Session,
    Transaction,
}

impl PoolMode {
    pub fn as_str(self) -> &'static str {
        match self {
            PoolMode::Session => "session",
            PoolMode::Transaction => "transaction",
        }
    }
}

/// Log output format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum LogFormat {
    Text,
    Json,
}

/// The whole file.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    pub weir: General,
    #[serde(default)]
    pub metrics: MetricsSection,
    /// `[databases.NAME]`; the name `"*"` is the fallback database.
    #[serde(default)]
    pub databases: BTreeMap<String, Database>,
    /// `[users.NAME]`: per-user pool settings (PgBouncer's `[users]`).
    #[serde(default)]
    pub users: BTreeMap<String, UserSettings>,
    /// The folder relative paths are resolved against (the config file's folder).
    #[serde(skip)]
    pub base_dir: PathBuf,
}

/// The `[weir]` section.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct General {
    /// `address:port`, a comma-separated list of them (one port), or `*:port`.
    pub listen_addr: ListenAddr,
    /// The folder of weir's Unix socket `.s.PGSQL.<port>`; empty: none.
    pub unix_socket_dir: String,
    /// The socket file's permissions, octal ("0777", PgBouncer's default).
    pub unix_socket_mode: String,
    /// The socket file's group (a name or number); empty: weir's own.
    pub unix_socket_group: String,
    pub auth_type: AuthType,
    pub auth_file: Option<PathBuf>,
    /// PgBouncer's subset of pg_hba.conf, used when `auth_type = "hba"`.
    pub auth_hba_file: Option<PathBuf>,
    /// The user auth_query runs as (in auth_file); empty: no auth_query.
    pub auth_user: String,
    /// Looks up a user not in auth_file: `$1` is the user name; the second
    /// column is the verifier (NULL or no row: no such user).
    pub auth_query: String,
    /// The database (a `[databases]` name) auth_query runs in; empty: the
    /// client's own.
    pub auth_dbname: String,
    /// How long a verifier found by auth_query is reused.
    #[serde(with = "humantime_serde")]
    pub auth_query_cache_ttl: Duration,
    /// A pool of the fallback database (`[databases."*"]`) with no client and
    /// no lent server for this long is removed (PgBouncer's autodb_idle_timeout).
    #[serde(with = "humantime_serde")]
    pub autodb_idle_timeout: Duration,
    /// Server connections per user across databases; 0: no limit.
    pub max_user_connections: u32,
    /// Share the connection budget Postgres gives a pool's role and
    /// database fairly with the other weirs in front of it (the default of
    /// every database's `fleet_share`).
    pub fleet_share: bool,
    pub pool_mode: PoolMode,
    pub default_pool_size: u32,
    pub min_pool_size: u32,
    pub reserve_pool_size: u32,
    #[serde(with = "humantime_serde")]
    pub reserve_pool_timeout: Duration,
    pub max_client_conn: u32,
    pub max_db_connections: u32,
    pub server_reset_query: String,
    #[serde(with = "humantime_serde")]
    pub client_login_timeout: Duration,
    /// How long a client may wait for a server before it gets an error.
    #[serde(with = "humantime_serde")]
    pub query_wait_timeout: Duration,
    /// The deadline applications use; `query_wait_timeout` must sit below it.
    #[serde(with = "humantime_serde")]
    pub client_deadline: Option<Duration>,
    /// Share of a client-declared deadline that weir spends waiting for a server.
    pub client_deadline_fraction: f64,
    /// Clients one pool may keep queued for a server; past it a new waiter
    /// gets 53300 at once. 0: no bound.
    pub max_waiting_clients: u32,
    /// Clients queued for a server across all pools; past it a new waiter
    /// gets 53300 at once. 0: no bound.
    pub max_waiting_clients_total: u32,
    /// Refuse at once (53300) a waiter whose predicted wait exceeds the
    /// budget it has left, instead of at the end of that budget.
    pub wait_shedding: bool,
    /// Do not start a transaction when the client's deadline leaves less time
    /// than this pool's transactions take (53300, never reaches Postgres).
    pub deadline_start: bool,
    /// Added to a pool's transaction time estimate for `deadline_start`.
    #[serde(with = "humantime_serde")]
    pub deadline_start_margin: Duration,
    #[serde(with = "humantime_serde")]
    pub server_reset_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub server_connect_timeout: Duration,
    /// The longest back-off between failed connect attempts.
    #[serde(with = "humantime_serde")]
    pub server_login_retry: Duration,
    /// How long a host name's addresses are reused before it is looked up
    /// again (PgBouncer's key); "0s" looks names up at every connect.
    #[serde(with = "humantime_serde")]
    pub dns_max_ttl: Duration,
    pub server_connect_concurrency: u32,
    #[serde(with = "humantime_serde")]
    pub server_idle_timeout: Duration,
    #[serde(with = "humantime_serde")]
    pub server_lifetime: Duration,
    #[serde(with = "humantime_serde")]
    pub server_check_delay: Duration,
    /// The period SHOW STATS averages cover (PgBouncer's stats_period).
    #[serde(with = "humantime_serde")]
    pub stats_period: Duration,
    pub server_check_query: String,
    #[serde(with = "humantime_serde")]
    pub server_check_timeout: Duration,
    /// A server that owes an answer and has sent nothing for this long gets an
    /// out-of-band liveness probe (see `server::watch`); "0s" turns it off.
    #[serde(with = "humantime_serde")]
    pub server_check_silence: Duration,
    #[serde(with = "humantime_serde")]
    pub idle_transaction_timeout: Option<Duration>,
    /// A client whose latest request began this long ago and that holds no
    /// server is disconnected ("client_idle_timeout", PgBouncer's meaning);
    /// "0s" turns it off.
    #[serde(with = "humantime_serde")]
    pub client_idle_timeout: Duration,
    /// After RECONNECT, session-mode clients whose server is to close are
    /// disconnected at once ("database configuration changed") instead of
    /// when they leave (PgBouncer's server_fast_close; PgBouncer lets an
    /// open transaction end first, weir does not).
    pub server_fast_close: bool,
    #[serde(with = "humantime_serde")]
    pub query_timeout: Option<Duration>,
    pub tcp_keepalive: bool,
    #[serde(with = "humantime_serde")]
    pub tcp_keepidle: Duration,
    #[serde(with = "humantime_serde")]
    pub tcp_keepintvl: Duration,
    pub tcp_keepcnt: u32,
    #[serde(with = "humantime_serde")]
    pub tcp_user_timeout: Option<Duration>,
    /// Largest message a client may send, in bytes.
    pub max_message_size: u32,
    /// Named prepared statements kept per server connection in transaction
    /// mode (PgBouncer's key); 0 turns prepared-statement tracking off.
    pub max_prepared_statements: u32,
    /// Transaction mode: an unnamed statement a client has parsed this many
    /// times (or one its server already holds) is served from weir's
    /// server-side prepared statement; 0 turns that off.
    pub prepare_unnamed_after: u32,
    #[serde(with = "humantime_serde")]
    pub shutdown_timeout: Duration,
    pub log_format: LogFormat,
    /// Runtime threads: 1 is one event loop on the main thread (a sidecar's
    /// setting); more gives a multi-thread runtime with that many workers.
    /// The WEIR_WORKER_THREADS environment variable overrides it.
    pub worker_threads: u32,
    pub log_connections: bool,
    pub log_disconnections: bool,
    /// PgBouncer's verbose: 0 logs at WEIR_LOG's level, 1 adds debug, 2
    /// trace (when WEIR_LOG is a list of levels and targets).
    pub verbose: u8,
    /// One stats line per pool every stats_period (PgBouncer's log_stats).
    pub log_stats: bool,
    pub admin_users: Vec<String>,
    pub stats_users: Vec<String>,
    /// Startup parameters accepted from clients and dropped (PgBouncer's meaning).
    pub ignore_startup_parameters: Vec<String>,
    /// Startup parameters, beyond the always-tracked ones, that clients may
    /// set and weir applies on every server it lends them (PgBouncer's
    /// meaning). Any other parameter is refused at login.
    pub track_extra_parameters: Vec<String>,
    pub client_tls_sslmode: ClientTlsMode,
    pub client_tls_cert_file: Option<PathBuf>,
    pub client_tls_key_file: Option<PathBuf>,
    pub client_tls_ca_file: Option<PathBuf>,
    pub server_tls_sslmode: ServerTlsMode,
    pub server_tls_ca_file: Option<PathBuf>,
    pub server_tls_cert_file: Option<PathBuf>,
    pub server_tls_key_file: Option<PathBuf>,
}

/// The `[metrics]` section.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    pub listen_addr: Option<SocketAddr>,
}

/// One `[databases.NAME]` entry: where clients asking for NAME are sent.
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Database {
    /// One host or a comma-separated list (names, addresses, Unix socket
    /// folders), as libpq's and PgBouncer's `host`.
    #[serde(default = "defaults::host")]
    pub host: String,
    /// One port for every host, or one per host (`"5432,5433"`).
    #[serde(default = "defaults::port")]
    pub port: Ports,
    /// Which matching host a new connection goes to (PgBouncer's key).
    pub load_balance_hosts: Option<LoadBalanceHosts>,
    /// Which servers are kept after login (libpq's key).
    pub target_session_attrs: Option<TargetSessionAttrs>,
    pub dbname: Option<String>,
    pub pool_size: Option<u32>,
    pub min_pool_size: Option<u32>,
    pub reserve_pool_size: Option<u32>,
    pub pool_mode: Option<PoolMode>,
    pub max_db_connections: Option<u32>,
    #[serde(default, with = "humantime_serde")]
    pub query_wait_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub client_deadline: Option<Duration>,
    /// A forced user: servers log in as this user whoever the client is.
    pub user: Option<String>,
    /// The forced user's password (else its auth_file entry).
    pub password: Option<String>,
    /// The auth_query user for clients of this database.
    pub auth_user: Option<String>,
    /// Run once on each new server connection, after login.
    pub connect_query: Option<String>,
    /// Sent in the server's startup packet, as the server's default.
    pub application_name: Option<String>,
    pub client_encoding: Option<String>,
    pub datestyle: Option<String>,
    pub timezone: Option<String>,
    pub max_waiting_clients: Option<u32>,
    /// Over `[weir]` fleet_share.
    pub fleet_share: Option<bool>,
}

/// One `[users.NAME]` entry: pool settings for every pool of that user.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UserSettings {
    pub pool_mode: Option<PoolMode>,
    pub pool_size: Option<u32>,
    /// Server connections of this user across databases; 0: no limit.
    pub max_user_connections: Option<u32>,
}

/// The settings of one pool, resolved from `[weir]` and `[databases.X]`.
#[derive(Debug, Clone, PartialEq)]
pub struct PoolSettings {
    /// `host` as written (one host or a list).
    pub host: String,
    /// The first port (one per host in `hosts`).
    pub port: u16,
    /// The hosts in order, each with its port (empty when `host` or `port`
    /// is invalid: `validate` refuses such a config).
    pub hosts: Vec<HostPort>,
    pub load_balance_hosts: LoadBalanceHosts,
    pub target_session_attrs: TargetSessionAttrs,
    pub dbname: String,
    pub pool_mode: PoolMode,
    pub pool_size: u32,
    pub min_pool_size: u32,
    pub reserve_pool_size: u32,
    pub max_db_connections: u32,
    pub query_wait_timeout: Duration,
    /// `query_timeout` (None: off). A wait for a server is part of the
    /// query, so it also ends the wait when shorter (PgBouncer's janitor).
    pub query_timeout: Option<Duration>,
    pub client_deadline: Option<Duration>,
    pub max_waiting_clients: u32,
    pub max_prepared_statements: u32,
    pub prepare_unnamed_after: u32,
    pub max_user_connections: u32,
    /// Share the budget Postgres gives the pool's role and database fairly
    /// with the other weirs in front of it (`pool::fleet`).
    pub fleet_share: bool,
    /// The pool belongs to the fallback database (created on demand, removed
    /// after autodb_idle_timeout unused).
    pub auto: bool,
    pub connect_query: String,
    /// Startup parameters sent to the server (application_name, client_encoding, …).
    pub startup_params: Vec<(String, String)>,
}

/// The name of the fallback database entry.
pub const FALLBACK_DATABASE: &str = "*";

impl Config {
    /// Parses TOML text; `base_dir` anchors relative paths.
    pub fn from_toml(text: &str, base_dir: &Path) -> Result<Config, ConfigError> {
        let cfg = Config::from_toml_unvalidated(text, base_dir)?;
        cfg.validate()?;
        Ok(cfg)
    }

    /// Parses TOML text without `validate()` (see `problems()` for its rules).
    pub fn from_toml_unvalidated(text: &str, base_dir: &Path) -> Result<Config, ConfigError> {
        let mut cfg: Config = toml::from_str(text).map_err(|e| ConfigError::Parse(e.to_string()))?;
        cfg.base_dir = base_dir.to_path_buf();
        Ok(cfg)
    }

    /// Reads, parses and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read(path.to_path_buf(), e.to_string()))?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();
        Config::from_toml(&text, &base)
    }

    /// The auth file's path, resolved against the config file's folder.
    pub fn auth_file_path(&self) -> Option<PathBuf> {
        self.weir.auth_file.as_ref().map(|p| self.base_dir.join(p))
    }

    /// The hba file's path, resolved against the config file's folder.
    pub fn auth_hba_file_path(&self) -> Option<PathBuf> {
        self.weir.auth_hba_file.as_ref().map(|p| self.base_dir.join(p))
    }

    /// A path from the config, resolved against the config file's folder.
    pub fn resolve(&self, p: &Option<PathBuf>) -> Option<PathBuf> {
        p.as_ref().map(|p| self.base_dir.join(p))
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
            hosts: hosts::host_list(&db.host, &db.port).unwrap_or_default(),
            load_balance_hosts: db.load_balance_hosts.unwrap_or_default(),
            target_session_attrs: db.target_session_attrs.unwrap_or_default(),
            dbname: db.dbname.clone().unwrap_or_else(|| name.to_owned()),
            pool_mode: u.pool_mode.or(db.pool_mode).unwrap_or(g.pool_mode),
            pool_size,
            // Capped by the pool's size, as PgBouncer does (not refused).
            min_pool_size: db.min_pool_size.unwrap_or(g.min_pool_size).min(pool_size),
            reserve_pool_size: db.reserve_pool_size.unwrap_or(g.reserve_pool_size),
            max_db_connections: db.max_db_connections.unwrap_or(g.max_db_connections),
            query_wait_timeout: db.query_wait_timeout.unwrap_or(g.query_wait_timeout),
            query_timeout: g.query_timeout.filter(|d| !d.is_zero()),
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

/// The one place the live config is swapped on reload.
#[derive(Debug)]
pub struct ConfigCell(ArcSwap<Config>);

impl ConfigCell {
    pub fn new(cfg: Config) -> Self {
        ConfigCell(ArcSwap::from_pointee(cfg))
    }
    pub fn load(&self) -> Arc<Config> {
        self.0.load_full()
    }
    pub fn store(&self, cfg: Config) {
        self.0.store(Arc::new(cfg));
    }
}

#[cfg(test)]
mod tests;
