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
mod peers;
mod resolve;
pub mod tls_protocols;
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
pub use peers::{Peer, MAX_PEER_ID};
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

/// TLS towards Postgres (PgBouncer's `server_tls_sslmode`): `allow` connects
/// without TLS (libpq's first try; weir makes no second one with TLS),
/// `prefer` uses TLS when the server offers it, `require` insists on it (certificate not
/// checked), `verify-ca` checks the chain against `server_tls_ca_file`,
/// `verify-full` also the database's `host` against the certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ServerTlsMode {
    Disable,
    Allow,
    Prefer,
    Require,
    VerifyCa,
    VerifyFull,
}

impl ServerTlsMode {
    pub fn as_str(self) -> &'static str {
        match self {
            ServerTlsMode::Disable => "disable",
            ServerTlsMode::Allow => "allow",
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
    /// `[peers.ID]`: the other weirs (or PgBouncers) behind the same address,
    /// where cancel requests for their keys go (PgBouncer's `[peers]`).
    #[serde(default)]
    pub peers: BTreeMap<String, Peer>,
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
    /// Client connections per database (the console's too; admin_users are
    /// not refused there); 0: no limit. `[databases.X]` may set its own.
    pub max_db_client_connections: u32,
    /// Client connections per user (admin_users on the console are not
    /// refused); 0: no limit. `[users.X]` may set its own.
    pub max_user_client_connections: u32,
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
    /// The part of a pool's pool_size one statement fingerprint may hold
    /// while clients of other fingerprints wait (transaction mode).
    pub max_fingerprint_share: f64,
    /// Statement fingerprints per pool exported on `/metrics` (the rest
    /// are summed as `fingerprint="other"`); 0: none.
    pub top_queries: u32,
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
    /// A client whose transaction has been open this long is disconnected
    /// (PgBouncer's transaction_timeout); unset or "0s": off.
    #[serde(with = "humantime_serde")]
    pub transaction_timeout: Option<Duration>,
    /// A client that has waited this long for a server is told so with a
    /// NOTICE (PgBouncer's query_wait_notify), once per wait; "0s": never.
    #[serde(with = "humantime_serde")]
    pub query_wait_notify: Duration,
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
    /// TLS versions offered to clients and to Postgres, in PgBouncer's
    /// words (`secure`, `all`, `tlsv1.3`, ...; see `tls_protocols`).
    pub client_tls_protocols: String,
    pub server_tls_protocols: String,
    /// This weir's id among its peers (1 to 16383): every cancel key it
    /// mints carries it, and a CancelRequest for another peer's key is
    /// forwarded to that peer (`[peers]`). 0: no peering (PgBouncer's key).
    pub peer_id: u16,
    /// SO_REUSEPORT on the TCP listening sockets: weirs on one host share a
    /// port, and the kernel spreads new connections over them (PgBouncer's key).
    pub so_reuseport: bool,
    /// What SIGTERM does: `drain` (idle clients are told at once, running
    /// transactions finish within shutdown_timeout) or `wait_for_clients`
    /// (PgBouncer's SIGTERM: stop accepting, exit once every client has left).
    pub sigterm: SigtermMode,
}

/// What SIGTERM does (the console's SHUTDOWN and SHUTDOWN WAIT_FOR_CLIENTS
/// do the same two things).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SigtermMode {
    /// Stop accepting; idle clients are told at once (57P01); running
    /// transactions finish within shutdown_timeout.
    Drain,
    /// Stop accepting; every client stays until it leaves, then weir exits
    /// (PgBouncer 1.23's SIGTERM, SHUTDOWN WAIT_FOR_CLIENTS): a rolling
    /// restart of weirs sharing a port (`so_reuseport`).
    WaitForClients,
}

/// The `[metrics]` section: on by default (`Config::metrics_endpoint`).
#[derive(Debug, Clone, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsSection {
    /// Unset: 127.0.0.1 on the port derived from the listen port.
    pub listen_addr: Option<SocketAddr>,
    /// false: no metrics endpoint at all.
    pub enabled: bool,
}

impl Default for MetricsSection {
    fn default() -> Self {
        MetricsSection { listen_addr: None, enabled: true }
    }
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
    /// The database auth_query runs in for clients of this one (over
    /// `[weir]` auth_dbname).
    pub auth_dbname: Option<String>,
    /// The auth_query for clients of this database (over `[weir]`'s).
    pub auth_query: Option<String>,
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
    /// Client connections to this database; 0 or unset: `[weir]`'s.
    pub max_db_client_connections: Option<u32>,
    /// Over `[weir]` server_lifetime.
    #[serde(default, with = "humantime_serde")]
    pub server_lifetime: Option<Duration>,
}

/// One `[users.NAME]` entry: pool settings for every pool of that user.
#[derive(Debug, Clone, Default, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct UserSettings {
    pub pool_mode: Option<PoolMode>,
    pub pool_size: Option<u32>,
    /// Over the database's reserve_pool_size.
    pub reserve_pool_size: Option<u32>,
    /// Server connections of this user across databases; 0: no limit.
    pub max_user_connections: Option<u32>,
    /// Client connections of this user; 0 or unset: `[weir]`'s.
    pub max_user_client_connections: Option<u32>,
    /// Over `[weir]`'s, for this user's pools ("0s": off for this user).
    #[serde(default, with = "humantime_serde")]
    pub query_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub idle_transaction_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub client_idle_timeout: Option<Duration>,
    #[serde(default, with = "humantime_serde")]
    pub transaction_timeout: Option<Duration>,
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
    pub server_lifetime: Duration,
    pub query_wait_timeout: Duration,
    /// `query_timeout` (None: off). A wait for a server is part of the
    /// query, so it also ends the wait when shorter (PgBouncer's janitor).
    pub query_timeout: Option<Duration>,
    /// idle_transaction_timeout, transaction_timeout (None: off) and
    /// client_idle_timeout (zero: off): the user's own over `[weir]`'s.
    pub idle_transaction_timeout: Option<Duration>,
    pub transaction_timeout: Option<Duration>,
    pub client_idle_timeout: Duration,
    pub query_wait_notify: Duration,
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

/// A config file named `*.ini` is a pgbouncer.ini.
pub fn is_pgbouncer_ini(path: &Path) -> bool {
    path.extension().is_some_and(|e| e.eq_ignore_ascii_case("ini"))
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

    /// Reads, parses and validates a config file: a weir.toml, or a
    /// pgbouncer.ini (a name ending in `.ini`), converted as `weir
    /// migrate-config` does each time it is read, so a RELOAD of an edited
    /// ini applies it as PgBouncer would. An ini's relative paths are taken
    /// from the working directory, as PgBouncer takes them; a weir.toml's
    /// from its own folder.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|e| ConfigError::Read(path.to_path_buf(), e.to_string()))?;
        if is_pgbouncer_ini(path) {
            let m = migrate::from_pgbouncer_ini(&text);
            if let Some(bad) = m.errors.first() {
                return Err(ConfigError::Invalid { key: path.display().to_string(), why: bad.clone() });
            }
            for w in &m.warnings {
                tracing::warn!("{}: {w}", path.display());
            }
            let mut cfg = Config::from_toml(&m.toml, Path::new(""))?;
            // The endpoint on the derived port, as migrate-config writes it,
            // but not one a busy port can keep weir from starting on: a
            // pgbouncer.ini has no say in it.
            cfg.metrics.listen_addr = None;
            return Ok(cfg);
        }
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
