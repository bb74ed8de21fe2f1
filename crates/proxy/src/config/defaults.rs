//! Explicit defaults for every key. PgBouncer's defaults where weir agrees;
//! where weir differs (liveness, connect timeouts), the comment says why.

use std::time::Duration;

use super::{AuthType, ClientTlsMode, General, LogFormat, PoolMode, ServerTlsMode, SigtermMode};

pub(super) fn host() -> String {
    "127.0.0.1".into()
}

pub(super) fn port() -> super::Ports {
    super::Ports::one(5432)
}

/// PgBouncer's default. A search for a host that matches looks names up
/// afresh at each round, whatever the cache holds.
const DNS_MAX_TTL: Duration = Duration::from_secs(15);

/// PgBouncer's default. Set it below your application's deadline.
const QUERY_WAIT_TIMEOUT: Duration = Duration::from_secs(120);

/// Not PgBouncer's (it has no bound): a hard backstop under the
/// estimate-based shedding. 1,000 per pool holds pgbench -c 1000 on a pool
/// of 20 (980 wait); 2,000 in all is below the 3,680 of the incident that
/// had no bound.
/// max_fingerprint_share: one statement may hold half of a pool while
/// others wait. Measured with `weir-bench convoy` (docs/performance.md):
/// the fair hand-over alone keeps the unrelated route's p99 low; the cap
/// keeps room for a statement that arrives while the pool is full.
const MAX_FINGERPRINT_SHARE: f64 = 0.5;
const MAX_WAITING_CLIENTS: u32 = 1000;
const MAX_WAITING_CLIENTS_TOTAL: u32 = 2000;

/// PgBouncer has no equivalent: a server owing an answer that stays silent
/// this long, or taking none of weir's bytes, is probed on a fresh
/// connection (`server::probe`). It also does what a TCP_USER_TIMEOUT
/// would, without cutting off a backend that stops reading while it works,
/// so `tcp_user_timeout` stays off, as PgBouncer's.
const SERVER_CHECK_SILENCE: Duration = Duration::from_secs(5);

/// Quiet dead paths are found in about 8 s (5 s idle + 3 probes 1 s apart),
/// not the kernel's 2 hours.
const TCP_KEEPIDLE: Duration = Duration::from_secs(5);
const TCP_KEEPINTVL: Duration = Duration::from_secs(1);
const TCP_KEEPCNT: u32 = 3;

/// Postgres's own limit (PQ_LARGE_MESSAGE_LIMIT, 1 GiB - 2): a longer
/// message is refused by weir before any of it reaches a server, where
/// Postgres would drop the connection without a word.
const MAX_MESSAGE_SIZE: u32 = (1 << 30) - 2;

/// PgBouncer waits 15 s; a sidecar next to its database needs far less.
const SERVER_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// PgBouncer's current default.
const MAX_PREPARED_STATEMENTS: u32 = 200;

/// From a client's second Parse of the same unnamed statement: a query
/// parsed once never leaves a statement on the server.
const PREPARE_UNNAMED_AFTER: u32 = 2;

/// A sidecar shares its cores with the application: one event loop.
const WORKER_THREADS: u32 = 1;

/// PgBouncer's default is IntervalStyle, which weir always tracks. These
/// three only change how statements run, never end a session.
fn track_extra_parameters() -> Vec<String> {
    vec!["search_path".into(), "statement_timeout".into(), "lock_timeout".into()]
}

impl Default for General {
    fn default() -> Self {
        General {
            listen_addr: "127.0.0.1:6432".parse().expect("static address"),
            // PgBouncer's default is /tmp: weir opens a Unix socket only where
            // it is told to (a sidecar is reached over TCP).
            unix_socket_dir: String::new(),
            unix_socket_mode: "0777".into(),
            unix_socket_group: String::new(),
            auth_type: AuthType::Md5,
            auth_file: None,
            auth_hba_file: None,
            auth_user: String::new(),
            auth_query: "SELECT usename, passwd FROM pg_shadow WHERE usename=$1".into(),
            auth_dbname: String::new(),
            auth_query_cache_ttl: Duration::from_secs(30),
            autodb_idle_timeout: Duration::from_secs(3600),
            max_user_connections: 0,
            fleet_share: false,
            pool_mode: PoolMode::Transaction,
            default_pool_size: 20,
            min_pool_size: 0,
            reserve_pool_size: 0,
            reserve_pool_timeout: Duration::from_secs(5),
            max_client_conn: 1000,
            max_db_client_connections: 0,
            max_user_client_connections: 0,
            max_db_connections: 0,
            server_reset_query: "DISCARD ALL".into(),
            client_login_timeout: Duration::from_secs(10),
            query_wait_timeout: QUERY_WAIT_TIMEOUT,
            client_deadline: None,
            client_deadline_fraction: 0.8,
            max_waiting_clients: MAX_WAITING_CLIENTS,
            max_waiting_clients_total: MAX_WAITING_CLIENTS_TOTAL,
            wait_shedding: true,
            deadline_start: true,
            deadline_start_margin: Duration::from_millis(1),
            max_fingerprint_share: MAX_FINGERPRINT_SHARE,
            top_queries: 20,
            server_reset_timeout: Duration::from_secs(5),
            server_connect_timeout: SERVER_CONNECT_TIMEOUT,
            server_login_retry: Duration::from_secs(2),
            dns_max_ttl: DNS_MAX_TTL,
            server_connect_concurrency: 8,
            server_idle_timeout: Duration::from_secs(600),
            server_lifetime: Duration::from_secs(3600),
            server_check_delay: Duration::from_secs(30),
            stats_period: Duration::from_secs(60),
            server_check_query: String::new(),
            server_check_timeout: Duration::from_secs(2),
            server_check_silence: SERVER_CHECK_SILENCE,
            idle_transaction_timeout: None,
            client_idle_timeout: Duration::ZERO,
            server_fast_close: false,
            query_timeout: None,
            transaction_timeout: None,
            // PgBouncer's default.
            query_wait_notify: Duration::from_secs(5),
            tcp_keepalive: true,
            tcp_keepidle: TCP_KEEPIDLE,
            tcp_keepintvl: TCP_KEEPINTVL,
            tcp_keepcnt: TCP_KEEPCNT,
            tcp_user_timeout: None,
            max_message_size: MAX_MESSAGE_SIZE,
            max_prepared_statements: MAX_PREPARED_STATEMENTS,
            prepare_unnamed_after: PREPARE_UNNAMED_AFTER,
            shutdown_timeout: Duration::from_secs(30),
            log_format: LogFormat::Text,
            worker_threads: WORKER_THREADS,
            log_connections: false,
            log_disconnections: false,
            verbose: 0,
            log_stats: true,
            admin_users: Vec::new(),
            stats_users: Vec::new(),
            ignore_startup_parameters: vec!["extra_float_digits".into()],
            track_extra_parameters: track_extra_parameters(),
            client_tls_sslmode: ClientTlsMode::Disable,
            client_tls_cert_file: None,
            client_tls_key_file: None,
            client_tls_ca_file: None,
            server_tls_sslmode: ServerTlsMode::Disable,
            server_tls_ca_file: None,
            server_tls_cert_file: None,
            server_tls_key_file: None,
            client_tls_protocols: "secure".into(),
            server_tls_protocols: "secure".into(),
            peer_id: 0,
            so_reuseport: false,
            // weir's drain, which Kubernetes' grace period bounds; PgBouncer's
            // SIGTERM waits for every client (`migrate-config` keeps that).
            sigterm: SigtermMode::Drain,
        }
    }
}
