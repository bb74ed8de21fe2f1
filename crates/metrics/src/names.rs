//! Every metric name weir exports, its help text, its label keys, and
//! [`describe_all`], which registers the help texts with the `metrics` facade.
//!
//! This module owns the *spelling* of the exported series; nothing else in
//! the workspace should write a metric name as a string literal.

/// Label key: database name of the pool.
pub const LABEL_DATABASE: &str = "database";
/// Label key: user name of the pool.
pub const LABEL_USER: &str = "user";
/// Label key: why a server connection was closed / a connect failed / a query dropped.
pub const LABEL_REASON: &str = "reason";
/// Label key: rate window (`1s`, `10s`, `60s`).
pub const LABEL_WINDOW: &str = "window";
/// Label key: connection state for pool gauges.
pub const LABEL_STATE: &str = "state";
/// Label key: cancel request outcome.
pub const LABEL_OUTCOME: &str = "outcome";
/// Label key: client connection result.
pub const LABEL_RESULT: &str = "result";
/// Label key: weir version for `weir_build_info`.
pub const LABEL_VERSION: &str = "version";
/// Label key: one host of a database's list, as `address:port` (or the
/// Unix socket's folder and port).
pub const LABEL_HOST: &str = "host";
/// Label key: a host's role (primary, read_only, standby, unreachable, unknown).
pub const LABEL_ROLE: &str = "role";

/// Counter (database,user): server connections successfully opened.
pub const SERVER_CONNECTIONS_OPENED_TOTAL: &str = "weir_server_connections_opened_total";
/// Counter (database,user,reason): server connections closed.
pub const SERVER_CONNECTIONS_CLOSED_TOTAL: &str = "weir_server_connections_closed_total";
/// Gauge (database,user,window): server connections opened per second.
pub const SERVER_CONNECTIONS_OPENED_PER_SECOND: &str = "weir_server_connections_opened_per_second";
/// Gauge (database,user,window): server connections closed per second.
pub const SERVER_CONNECTIONS_CLOSED_PER_SECOND: &str = "weir_server_connections_closed_per_second";
/// Counter (database,user,reason): failed server connection attempts.
pub const SERVER_CONNECT_FAILURES_TOTAL: &str = "weir_server_connect_failures_total";
/// Counter (database,user,reason): server connects Postgres refused with
/// 53300 (too many connections), by the limit it named.
pub const SERVER_CONNECT_REFUSED_TOTAL: &str = "weir_server_connect_refused_total";
/// Histogram (database,user): time to open and log in a server connection.
pub const SERVER_CONNECT_DURATION_SECONDS: &str = "weir_server_connect_duration_seconds";
/// Gauge (database,user,state): server connections by state.
pub const POOL_SERVERS: &str = "weir_pool_servers";
/// Gauge (database,user,state): client connections by state.
pub const POOL_CLIENTS: &str = "weir_pool_clients";
/// Gauge (database,user): age of the oldest waiting client, in seconds.
pub const POOL_MAXWAIT_SECONDS: &str = "weir_pool_maxwait_seconds";
/// Gauge (database,user): the predicted wait of a client queued now.
pub const POOL_PREDICTED_WAIT_SECONDS: &str = "weir_pool_predicted_wait_seconds";
/// Gauge (database,user): with fleet_share, this instance's share of the
/// connection budget its fleet of weirs shares (0: none).
pub const FLEET_SHARE: &str = "weir_fleet_share";
/// Gauge (database,user): with fleet_share, the weirs announcing themselves
/// in front of the pool's role and database (0: none).
pub const FLEET_INSTANCES: &str = "weir_fleet_instances";
/// Histogram (database,user): time clients waited for a server connection.
pub const CLIENT_WAIT_DURATION_SECONDS: &str = "weir_client_wait_duration_seconds";
/// Counter (database,user,reason): queries dropped before reaching a server.
pub const QUERIES_DROPPED_TOTAL: &str = "weir_queries_dropped_total";
/// Counter (outcome): cancel requests received.
pub const CANCEL_REQUESTS_TOTAL: &str = "weir_cancel_requests_total";
/// Counter (result): client connection attempts.
pub const CLIENT_CONNECTIONS_TOTAL: &str = "weir_client_connections_total";
/// Counter (database,user): transactions completed.
pub const TRANSACTIONS_TOTAL: &str = "weir_transactions_total";
/// Counter (database,user): queries forwarded.
pub const QUERIES_TOTAL: &str = "weir_queries_total";
/// Histogram (database,user): transaction duration.
pub const TRANSACTION_DURATION_SECONDS: &str = "weir_transaction_duration_seconds";
/// Counter (database,user): Parse messages received from clients.
pub const PREPARED_STATEMENTS_CLIENT_PARSES_TOTAL: &str = "weir_prepared_statements_client_parses_total";
/// Counter (database,user): Parse messages sent to servers.
pub const PREPARED_STATEMENTS_SERVER_PARSES_TOTAL: &str = "weir_prepared_statements_server_parses_total";
/// Counter (database,user): Bind messages of clients' named prepared statements.
pub const PREPARED_STATEMENTS_BINDS_TOTAL: &str = "weir_prepared_statements_binds_total";
/// Counter (database,user): unnamed Parse messages answered from a
/// statement the server already had prepared under weir's name.
pub const PREPARED_STATEMENTS_UNNAMED_HITS_TOTAL: &str = "weir_prepared_statements_unnamed_hits_total";
/// Counter (database,user): unnamed Parse messages sent to the server as a
/// Parse of weir's named statement (prepared there from then on).
pub const PREPARED_STATEMENTS_UNNAMED_PREPARES_TOTAL: &str = "weir_prepared_statements_unnamed_prepares_total";
/// Counter (database,user): weir's statements closed on a server to keep its
/// cache within max_prepared_statements.
pub const PREPARED_STATEMENTS_EVICTIONS_TOTAL: &str = "weir_prepared_statements_evictions_total";
/// Counter (database,user): sessions pinned to a server connection.
pub const PINNED_SESSIONS_TOTAL: &str = "weir_pinned_sessions_total";
/// Counter (database,user): session-settings read-backs that failed (the
/// server was reset instead).
pub const SETTINGS_UNFOLLOWED_TOTAL: &str = "weir_session_settings_unfollowed_total";
/// Counter (database,user): pipelines found stalled inside weir (client
/// messages held while the server owed no answer).
pub const STALLED_PIPELINES_TOTAL: &str = "weir_stalled_pipelines_total";
/// Gauge (database,user): the pool's configured `pool_size`.
pub const POOL_SIZE: &str = "weir_pool_size";
/// Gauge (database,user): the pool's configured `reserve_pool_size`.
pub const POOL_RESERVE_POOL_SIZE: &str = "weir_pool_reserve_pool_size";
/// Gauge (database,user): the database's configured `max_db_connections` (0: no limit).
pub const POOL_MAX_DB_CONNECTIONS: &str = "weir_pool_max_db_connections";
/// Counter (database,user): bytes received from clients (PgBouncer's `total_received`).
pub const CLIENT_BYTES_RECEIVED_TOTAL: &str = "weir_client_bytes_received_total";
/// Counter (database,user): bytes sent to clients (PgBouncer's `total_sent`).
pub const CLIENT_BYTES_SENT_TOTAL: &str = "weir_client_bytes_sent_total";
/// Counter (database,user): bytes read from servers while clients held them.
pub const SERVER_BYTES_RECEIVED_TOTAL: &str = "weir_server_bytes_received_total";
/// Counter (database,user): bytes written to servers while clients held them.
pub const SERVER_BYTES_SENT_TOTAL: &str = "weir_server_bytes_sent_total";
/// Gauge: the configured `max_client_conn`.
pub const MAX_CLIENT_CONN: &str = "weir_max_client_conn";
/// Counter (result): configuration reloads (SIGHUP, RELOAD, SET), by result.
pub const CONFIG_RELOADS_TOTAL: &str = "weir_config_reloads_total";
/// Gauge (version): always 1; carries the weir version as a label.
pub const BUILD_INFO: &str = "weir_build_info";
/// Gauge (database,host,role): 1 for the role each host of a database was
/// last found in, 0 for the others.
pub const HOST_ROLE: &str = "weir_host_role";
/// Gauge (database): hosts of the database known to match its
/// `target_session_attrs` now (0 while weir searches for one).
pub const HOSTS_MATCHING: &str = "weir_hosts_matching";
/// Counter (database): failovers: another host came to match after the one
/// that matched failed.
pub const FAILOVERS_TOTAL: &str = "weir_failovers_total";
/// Histogram (database): from the first failed connect to the host that
/// matched, to the first server that matched on another host.
pub const FAILOVER_DURATION_SECONDS: &str = "weir_failover_duration_seconds";
/// Label key: a statement fingerprint (16 hex digits), or `other`.
pub const LABEL_FINGERPRINT: &str = "fingerprint";
/// Counter (database, user, fingerprint): transactions that queued for a
/// server, by the fingerprint of the statement they started with.
pub const QUERY_CALLS_TOTAL: &str = "weir_query_calls_total";
/// Counter (database, user, fingerprint): seconds their servers were held.
pub const QUERY_SERVER_SECONDS_TOTAL: &str = "weir_query_server_seconds_total";
/// Counter (database, user, fingerprint): seconds their clients waited.
pub const QUERY_WAIT_SECONDS_TOTAL: &str = "weir_query_wait_seconds_total";
/// Gauge (database, user, fingerprint): servers they hold now.
pub const QUERY_SERVERS_HELD: &str = "weir_query_servers_held";

/// Kind of a metric, for [`ALL`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Monotonic counter.
    Counter,
    /// Gauge.
    Gauge,
    /// Histogram (seconds).
    Histogram,
}

/// Every metric: (name, kind, help text).
pub const ALL: &[(&str, Kind, &str)] = &[
    (SERVER_CONNECTIONS_OPENED_TOTAL, Kind::Counter, "Server connections successfully opened."),
    (SERVER_CONNECTIONS_CLOSED_TOTAL, Kind::Counter, "Server connections closed, by reason."),
    (
        SERVER_CONNECTIONS_OPENED_PER_SECOND,
        Kind::Gauge,
        "Server connections opened per second over the window (complete seconds only).",
    ),
    (
        SERVER_CONNECTIONS_CLOSED_PER_SECOND,
        Kind::Gauge,
        "Server connections closed per second over the window (complete seconds only).",
    ),
    (
        SERVER_CONNECT_FAILURES_TOTAL,
        Kind::Counter,
        "Failed server connection attempts, by reason (not counted as opens or closes).",
    ),
    (
        SERVER_CONNECT_REFUSED_TOTAL,
        Kind::Counter,
        "Server connects Postgres refused as too many connections (53300), by the limit it named; weir backs off.",
    ),
    (SERVER_CONNECT_DURATION_SECONDS, Kind::Histogram, "Time to connect and authenticate a server connection."),
    (POOL_SERVERS, Kind::Gauge, "Server connections by state."),
    (POOL_CLIENTS, Kind::Gauge, "Client connections by state."),
    (POOL_MAXWAIT_SECONDS, Kind::Gauge, "How long the oldest waiting client has waited."),
    (
        POOL_PREDICTED_WAIT_SECONDS,
        Kind::Gauge,
        "Predicted wait of a client queued now: waiters ahead x mean server hold time / servers (0 when not full).",
    ),
    (FLEET_SHARE, Kind::Gauge, "This weir's share of the connection budget its fleet of weirs shares (fleet_share)."),
    (FLEET_INSTANCES, Kind::Gauge, "Weirs sharing the pool's connection budget (fleet_share)."),
    (CLIENT_WAIT_DURATION_SECONDS, Kind::Histogram, "Time clients waited for a server connection."),
    (QUERIES_DROPPED_TOTAL, Kind::Counter, "Queries dropped before completing, by reason."),
    (CANCEL_REQUESTS_TOTAL, Kind::Counter, "Cancel requests received, by outcome."),
    (CLIENT_CONNECTIONS_TOTAL, Kind::Counter, "Client connection attempts, by result."),
    (TRANSACTIONS_TOTAL, Kind::Counter, "Transactions completed."),
    (QUERIES_TOTAL, Kind::Counter, "Queries forwarded to servers."),
    (TRANSACTION_DURATION_SECONDS, Kind::Histogram, "Transaction duration."),
    (PREPARED_STATEMENTS_CLIENT_PARSES_TOTAL, Kind::Counter, "Parse messages received from clients."),
    (PREPARED_STATEMENTS_SERVER_PARSES_TOTAL, Kind::Counter, "Parse messages sent to servers."),
    (PREPARED_STATEMENTS_BINDS_TOTAL, Kind::Counter, "Bind messages of clients' named prepared statements."),
    (
        PREPARED_STATEMENTS_UNNAMED_HITS_TOTAL,
        Kind::Counter,
        "Unnamed Parse messages answered from a statement the server had prepared.",
    ),
    (
        PREPARED_STATEMENTS_UNNAMED_PREPARES_TOTAL,
        Kind::Counter,
        "Unnamed Parse messages sent as a Parse of a server-side prepared statement.",
    ),
    (PREPARED_STATEMENTS_EVICTIONS_TOTAL, Kind::Counter, "Prepared statements closed to stay within the cache."),
    (PINNED_SESSIONS_TOTAL, Kind::Counter, "Client sessions pinned to one server connection."),
    (
        STALLED_PIPELINES_TOTAL,
        Kind::Counter,
        "Pipelines found stalled inside weir: client messages held while the server owed no answer.",
    ),
    (
        SETTINGS_UNFOLLOWED_TOTAL,
        Kind::Counter,
        "Session-settings read-backs that failed; the server connection was reset instead.",
    ),
    (POOL_SIZE, Kind::Gauge, "The pool's configured pool_size."),
    (POOL_RESERVE_POOL_SIZE, Kind::Gauge, "The pool's configured reserve_pool_size."),
    (POOL_MAX_DB_CONNECTIONS, Kind::Gauge, "The database's configured max_db_connections (0: no limit)."),
    (
        CLIENT_BYTES_RECEIVED_TOTAL,
        Kind::Counter,
        "Bytes read from clients (forwarded to servers, or answered by weir).",
    ),
    (CLIENT_BYTES_SENT_TOTAL, Kind::Counter, "Bytes sent to clients."),
    (SERVER_BYTES_RECEIVED_TOTAL, Kind::Counter, "Bytes read from servers while clients held them."),
    (
        SERVER_BYTES_SENT_TOTAL,
        Kind::Counter,
        "Bytes written to servers while clients held them (client bytes as forwarded, and settings weir applied).",
    ),
    (MAX_CLIENT_CONN, Kind::Gauge, "The configured max_client_conn."),
    (CONFIG_RELOADS_TOTAL, Kind::Counter, "Configuration reloads, by result (ok or failed)."),
    (BUILD_INFO, Kind::Gauge, "Build information; the value is always 1."),
    (HOST_ROLE, Kind::Gauge, "1 for the role each host of a database was last found in (target_session_attrs)."),
    (HOSTS_MATCHING, Kind::Gauge, "Hosts of the database known to match its target_session_attrs (0: searching)."),
    (FAILOVERS_TOTAL, Kind::Counter, "Failovers: another host came to match after the matching one failed."),
    (
        FAILOVER_DURATION_SECONDS,
        Kind::Histogram,
        "From the first failed connect to the matching host to the first matching server on another host.",
    ),
    (
        QUERY_CALLS_TOTAL,
        Kind::Counter,
        "Transactions that queued for a server, by the fingerprint of their first statement (top K, then other).",
    ),
    (QUERY_SERVER_SECONDS_TOTAL, Kind::Counter, "Seconds servers were held by those transactions."),
    (QUERY_WAIT_SECONDS_TOTAL, Kind::Counter, "Seconds those transactions' clients waited for a server."),
    (QUERY_SERVERS_HELD, Kind::Gauge, "Servers those transactions hold now (SHOW QUERIES names the statement)."),
];

/// The per-database host-set metrics: rendered from the live host sets
/// (`crate::hosts`), not kept in the `metrics` facade.
pub const PER_HOST_SET: &[&str] = &[HOST_ROLE, HOSTS_MATCHING, FAILOVERS_TOTAL, FAILOVER_DURATION_SECONDS];

/// The per-pool metrics: rendered from the live pools (`crate::text`), not
/// kept in the `metrics` facade, so that a removed pool's series leave.
pub const PER_POOL: &[&str] = &[
    SERVER_CONNECTIONS_OPENED_TOTAL,
    SERVER_CONNECTIONS_CLOSED_TOTAL,
    SERVER_CONNECTIONS_OPENED_PER_SECOND,
    SERVER_CONNECTIONS_CLOSED_PER_SECOND,
    SERVER_CONNECT_FAILURES_TOTAL,
    SERVER_CONNECT_REFUSED_TOTAL,
    SERVER_CONNECT_DURATION_SECONDS,
    POOL_SERVERS,
    POOL_CLIENTS,
    POOL_MAXWAIT_SECONDS,
    POOL_PREDICTED_WAIT_SECONDS,
    FLEET_SHARE,
    FLEET_INSTANCES,
    CLIENT_WAIT_DURATION_SECONDS,
    QUERIES_DROPPED_TOTAL,
    TRANSACTIONS_TOTAL,
    QUERIES_TOTAL,
    TRANSACTION_DURATION_SECONDS,
    PREPARED_STATEMENTS_CLIENT_PARSES_TOTAL,
    PREPARED_STATEMENTS_SERVER_PARSES_TOTAL,
    PREPARED_STATEMENTS_BINDS_TOTAL,
    PREPARED_STATEMENTS_UNNAMED_HITS_TOTAL,
    PREPARED_STATEMENTS_UNNAMED_PREPARES_TOTAL,
    PREPARED_STATEMENTS_EVICTIONS_TOTAL,
    PINNED_SESSIONS_TOTAL,
    SETTINGS_UNFOLLOWED_TOTAL,
    POOL_SIZE,
    POOL_RESERVE_POOL_SIZE,
    POOL_MAX_DB_CONNECTIONS,
    CLIENT_BYTES_RECEIVED_TOTAL,
    CLIENT_BYTES_SENT_TOTAL,
    SERVER_BYTES_RECEIVED_TOTAL,
    SERVER_BYTES_SENT_TOTAL,
    QUERY_CALLS_TOTAL,
    QUERY_SERVER_SECONDS_TOTAL,
    QUERY_WAIT_SECONDS_TOTAL,
    QUERY_SERVERS_HELD,
];

impl Kind {
    /// The Prometheus `# TYPE` word.
    pub const fn as_type(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// The kind and help text of `name`, if weir exports it.
pub fn lookup(name: &str) -> Option<(Kind, &'static str)> {
    ALL.iter().find(|(n, _, _)| *n == name).map(|&(_, k, h)| (k, h))
}

/// Names of all histograms (they get explicit Prometheus buckets).
pub fn histogram_names() -> impl Iterator<Item = &'static str> {
    ALL.iter().filter(|(_, k, _)| *k == Kind::Histogram).map(|(n, _, _)| *n)
}

/// Registers the help text (and unit) of every process-wide metric with the
/// current recorder (per-pool ones are rendered with their own help text).
pub fn describe_all() {
    for &(name, kind, help) in ALL.iter().filter(|(n, _, _)| !PER_POOL.contains(n) && !PER_HOST_SET.contains(n)) {
        match kind {
            Kind::Counter => metrics::describe_counter!(name, help),
            Kind::Gauge => metrics::describe_gauge!(name, help),
            Kind::Histogram => {
                metrics::describe_histogram!(name, metrics::Unit::Seconds, help)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_prefixed() {
        let mut seen = std::collections::HashSet::new();
        for (name, _, help) in ALL {
            assert!(name.starts_with("weir_"), "{name}");
            assert!(!help.is_empty());
            assert!(seen.insert(*name), "duplicate {name}");
        }
        assert_eq!(ALL.len(), 47);
        assert_eq!(histogram_names().count(), 4);
        assert!(PER_POOL.iter().chain(PER_HOST_SET).all(|n| lookup(n).is_some()));
    }
}
