//! `SHOW STATS`, `STATS_TOTALS`, `STATS_AVERAGES` and `TOTALS`: each
//! database's counters summed over its pools, with PgBouncer 1.25's columns
//! in its order (1.23's figures, each group followed by the prepared
//! statements' parse and bind counts), then weir's own.
//! Averages cover the last completed `stats_period`, which the task started
//! by [`spawn_periods`] closes for every pool.

use std::collections::BTreeMap;
use std::sync::Arc;

use weir_metrics::{Period, StatTotals};

use super::result::{int, text, Cell, Kind, ResultSet};
use crate::state::Shared;

use Kind::{Numeric, Text};

/// Closes a stats period for every pool each `stats_period` (read anew
/// every period, so a reload or SET changes it) until weir stops.
pub fn spawn_periods(shared: &Arc<Shared>) {
    let weak = Arc::downgrade(shared);
    let stopped = shared.stopped.clone();
    tokio::spawn(async move {
        let mut started = tokio::time::Instant::now();
        loop {
            let period = match weak.upgrade() {
                Some(shared) => shared.config.load().weir.stats_period,
                None => return,
            };
            tokio::select! {
                _ = tokio::time::sleep_until(started + period) => {}
                _ = stopped.cancelled() => return,
            }
            let Some(shared) = weak.upgrade() else { return };
            let now = tokio::time::Instant::now();
            let log = shared.config.load().weir.log_stats;
            for pool in shared.pools.all() {
                pool.metrics.roll_period(now - started);
                if log {
                    log_period(&pool.key.database, &pool.key.user, pool.metrics.last_period());
                }
            }
            started = now;
        }
    });
}

/// PgBouncer's `log_stats` line, for one pool and the period just closed.
fn log_period(database: &str, user: &str, p: Period) {
    let d = p.delta;
    tracing::info!(
        "stats: {database}/{user} {} xacts/s, {} queries/s, in {} B/s, out {} B/s, xact {} us, query {} us, wait {} us",
        p.per_second(d.xacts),
        p.per_second(d.queries),
        p.per_second(d.received),
        p.per_second(d.sent),
        Period::per(d.xact_time_us, d.xacts),
        Period::per(d.query_time_us, d.queries),
        Period::per(d.wait_time_us, d.assignments),
    );
}

/// One database's figures.
#[derive(Default)]
struct Db {
    totals: StatTotals,
    period: Period,
    opened: u64,
    closed: u64,
    failures: u64,
    dropped: u64,
}

fn by_database(shared: &Shared) -> BTreeMap<String, Db> {
    let mut dbs: BTreeMap<String, Db> = BTreeMap::new();
    for pool in shared.pools.all() {
        let (m, d) = (&pool.metrics, dbs.entry(pool.key.database.clone()).or_default());
        d.totals = d.totals + m.totals();
        d.period = d.period.merge(m.last_period());
        d.opened += m.opened();
        d.closed += m.closed_total();
        d.failures += m.connect_failures_total();
        d.dropped += m.dropped_queries_total();
    }
    // The console's database: its queries, each a transaction of its own.
    let console = dbs.entry(crate::login::CONSOLE_DATABASE.to_owned()).or_default();
    let queries = shared.admin.queries();
    console.totals.queries += queries;
    console.totals.xacts += queries;
    dbs
}

/// PgBouncer 1.23's eight figures, in its order.
fn totals_cells(t: &StatTotals) -> [Cell; 8] {
    [
        int(t.assignments),
        int(t.xacts),
        int(t.queries),
        int(t.received),
        int(t.sent),
        int(t.xact_time_us),
        int(t.query_time_us),
        int(t.wait_time_us),
    ]
}

/// The last period's averages: counts and bytes per second, times per
/// transaction, query and server assignment.
fn averages(p: &Period) -> StatTotals {
    let d = &p.delta;
    StatTotals {
        xacts: p.per_second(d.xacts),
        queries: p.per_second(d.queries),
        received: p.per_second(d.received),
        sent: p.per_second(d.sent),
        xact_time_us: Period::per(d.xact_time_us, d.xacts),
        query_time_us: Period::per(d.query_time_us, d.queries),
        wait_time_us: Period::per(d.wait_time_us, d.assignments),
        assignments: p.per_second(d.assignments),
        client_parses: p.per_second(d.client_parses),
        server_parses: p.per_second(d.server_parses),
        binds: p.per_second(d.binds),
    }
}

/// The prepared statements' counts, after 1.23's figures.
fn later_cells(t: &StatTotals) -> [Cell; 3] {
    [int(t.client_parses), int(t.server_parses), int(t.binds)]
}

const FIGURES: [&str; 8] = [
    "server_assignment_count",
    "xact_count",
    "query_count",
    "bytes_received",
    "bytes_sent",
    "xact_time",
    "query_time",
    "wait_time",
];
const LATER: [&str; 3] = ["client_parse_count", "server_parse_count", "bind_count"];
/// `STATS_AVERAGES` names its prepared-statement columns so (PgBouncer's).
const LATER_AVG: [&str; 3] = ["avg_client_parse_count", "avg_server_parse_count", "avg_bind_count"];

fn numeric_columns(names: impl IntoIterator<Item = &'static str>) -> Vec<(&'static str, Kind)> {
    names.into_iter().map(|n| (n, Numeric)).collect()
}

pub fn stats(shared: &Shared) -> ResultSet {
    let mut cols = vec![("database", Text)];
    cols.extend(numeric_columns([
        "total_server_assignment_count",
        "total_xact_count",
        "total_query_count",
        "total_received",
        "total_sent",
        "total_xact_time",
        "total_query_time",
        "total_wait_time",
        "total_client_parse_count",
        "total_server_parse_count",
        "total_bind_count",
        "avg_server_assignment_count",
        "avg_xact_count",
        "avg_query_count",
        "avg_recv",
        "avg_sent",
        "avg_xact_time",
        "avg_query_time",
        "avg_wait_time",
        "avg_client_parse_count",
        "avg_server_parse_count",
        "avg_bind_count",
        // weir's own.
        "total_server_opened",
        "total_server_closed",
        "total_connect_failures",
        "total_dropped",
    ]));
    let mut rs = ResultSet::new(&cols);
    for (db, d) in by_database(shared) {
        let (t, a) = (&d.totals, averages(&d.period));
        let mut row = vec![text(db)];
        row.extend(totals_cells(t));
        row.extend(later_cells(t));
        row.extend(totals_cells(&a));
        row.extend(later_cells(&a));
        row.extend([int(d.opened), int(d.closed), int(d.failures), int(d.dropped)]);
        rs.push(row);
    }
    rs
}

/// STATS_TOTALS (`averaged` false) or STATS_AVERAGES (true).
pub fn stats_part(shared: &Shared, averaged: bool) -> ResultSet {
    let mut cols = vec![("database", Text)];
    cols.extend(numeric_columns(FIGURES.into_iter().chain(if averaged { LATER_AVG } else { LATER })));
    let mut rs = ResultSet::new(&cols);
    for (db, d) in by_database(shared) {
        let t = if averaged { averages(&d.period) } else { d.totals };
        let mut row = vec![text(db)];
        row.extend(totals_cells(&t));
        row.extend(later_cells(&t));
        rs.push(row);
    }
    rs
}

/// TOTALS: the figures over every database, one row each, named as
/// PgBouncer names them (client bytes = received, server bytes = sent).
pub fn totals(shared: &Shared) -> ResultSet {
    let mut rs = ResultSet::new(&[("name", Text), ("value", Numeric)]);
    let (mut t, mut p) = (StatTotals::default(), Period::default());
    for d in by_database(shared).into_values() {
        t = t + d.totals;
        p = p.merge(d.period);
    }
    const NAMES: [&str; 11] = [
        "server_assignment_count",
        "xact_count",
        "query_count",
        "client_bytes",
        "server_bytes",
        "xact_time",
        "query_time",
        "wait_time",
        "ps_client_parse_count",
        "ps_server_parse_count",
        "ps_bind_count",
    ];
    for (prefix, figures) in [("total", t), ("avg", averages(&p))] {
        for (name, cell) in NAMES.iter().zip(totals_cells(&figures).into_iter().chain(later_cells(&figures))) {
            rs.push(vec![text(format!("{prefix}_{name}")), cell]);
        }
    }
    rs
}
