//! Renders every live pool's series in the Prometheus text format (0.0.4),
//! straight from [`PoolMetrics`]' atomics ([`render_all`]), and puts together
//! one scrape: the process's own figures, the recorder's series, the pools.
//!
//! Per-pool series are not kept in the `metrics` facade: its registry cannot
//! delete a series, so a pool made on demand (auth_query users, a fallback
//! database) would leave its label set in `/metrics` forever. Rendered from
//! the live pools instead, a removed pool's series leave with it. Two live
//! pools with the same labels (two weirs in one test process) are summed, as
//! the facade did.

use std::collections::BTreeMap;
use std::fmt::{Display, Write};
use std::sync::{Arc, OnceLock};

use metrics_exporter_prometheus::PrometheusHandle;

use crate::close::{CloseReason, ConnectFailure, ConnectRefusal, DropReason};
use crate::hist::{Snapshot, BUCKETS};
use crate::names::{self, *};
use crate::pool::sample::Sample;
use crate::pool::{live_pools, PoolMetrics};
use crate::rate::Window;
use crate::state::{ClientState, ServerState};

/// One scrape: process figures, the recorder's series, every live pool.
pub(crate) fn scrape(handle: &PrometheusHandle) -> String {
    static PROCESS: OnceLock<metrics_process::Collector> = OnceLock::new();
    let process = PROCESS.get_or_init(|| {
        let c = metrics_process::Collector::default();
        c.describe();
        c
    });
    process.collect();
    let mut text = handle.render();
    text.push_str(&render_all());
    text
}

/// The Prometheus text of every live pool's series, then every live host
/// set's (`crate::hosts`).
pub fn render_all() -> String {
    let mut text = render_pools(&live_pools());
    text.push_str(&crate::hosts::render_host_sets());
    text
}

/// The text for `pools`, grouped by (database, user).
pub(crate) fn render_pools(pools: &[Arc<PoolMetrics>]) -> String {
    let mut groups: BTreeMap<(&str, &str), Sample> = BTreeMap::new();
    for p in pools {
        let s = p.sample();
        groups.entry((p.database(), p.user())).and_modify(|g| g.add(&s)).or_insert(s);
    }
    let mut out = Out { text: String::new(), groups: groups.into_iter().collect() };
    out.counters();
    out.gauges();
    out.queries();
    out.histograms();
    out.text
}

/// Writes one series: its extra label, if any, and its value.
type Emit<'e> = &'e mut dyn FnMut(Option<(&str, String)>, String);

struct Out<'a> {
    text: String,
    groups: Vec<((&'a str, &'a str), Sample)>,
}

impl Out<'_> {
    fn counters(&mut self) {
        self.family(SERVER_CONNECTIONS_OPENED_TOTAL, |s, emit| emit(None, s.opened.to_string()));
        self.labelled(SERVER_CONNECTIONS_CLOSED_TOTAL, LABEL_REASON, CloseReason::ALL, |s, r| s.closed[r.index()]);
        let failures = SERVER_CONNECT_FAILURES_TOTAL;
        self.labelled(failures, LABEL_REASON, ConnectFailure::ALL, |s, r| s.connect_failures[r.index()]);
        let refused = SERVER_CONNECT_REFUSED_TOTAL;
        self.labelled(refused, LABEL_REASON, ConnectRefusal::ALL, |s, r| s.connect_refusals[r.index()]);
        self.labelled(QUERIES_DROPPED_TOTAL, LABEL_REASON, DropReason::ALL, |s, r| s.dropped[r.index()]);
        self.family(TRANSACTIONS_TOTAL, |s, emit| emit(None, s.transactions.to_string()));
        self.family(QUERIES_TOTAL, |s, emit| emit(None, s.queries.to_string()));
        self.family(PREPARED_STATEMENTS_CLIENT_PARSES_TOTAL, |s, emit| emit(None, s.client_parses.to_string()));
        self.family(PREPARED_STATEMENTS_SERVER_PARSES_TOTAL, |s, emit| emit(None, s.server_parses.to_string()));
        self.family(PREPARED_STATEMENTS_BINDS_TOTAL, |s, emit| emit(None, s.binds.to_string()));
        self.family(PREPARED_STATEMENTS_UNNAMED_HITS_TOTAL, |s, emit| emit(None, s.unnamed_hits.to_string()));
        let prepares = PREPARED_STATEMENTS_UNNAMED_PREPARES_TOTAL;
        self.family(prepares, |s, emit| emit(None, s.unnamed_prepares.to_string()));
        self.family(PREPARED_STATEMENTS_EVICTIONS_TOTAL, |s, emit| emit(None, s.evictions.to_string()));
        self.family(PINNED_SESSIONS_TOTAL, |s, emit| emit(None, s.pinned.to_string()));
        self.family(STALLED_PIPELINES_TOTAL, |s, emit| emit(None, s.stalled.to_string()));
        self.family(SETTINGS_UNFOLLOWED_TOTAL, |s, emit| emit(None, s.settings_unfollowed.to_string()));
        self.family(CLIENT_BYTES_RECEIVED_TOTAL, |s, emit| emit(None, s.received.to_string()));
        self.family(CLIENT_BYTES_SENT_TOTAL, |s, emit| emit(None, s.sent.to_string()));
        self.family(SERVER_BYTES_RECEIVED_TOTAL, |s, emit| emit(None, s.server_received.to_string()));
        self.family(SERVER_BYTES_SENT_TOTAL, |s, emit| emit(None, s.server_sent.to_string()));
    }

    fn gauges(&mut self) {
        self.labelled(SERVER_CONNECTIONS_OPENED_PER_SECOND, LABEL_WINDOW, Window::ALL, |s, w| s.opens_rate[w.index()]);
        self.labelled(SERVER_CONNECTIONS_CLOSED_PER_SECOND, LABEL_WINDOW, Window::ALL, |s, w| s.closes_rate[w.index()]);
        self.labelled(POOL_SERVERS, LABEL_STATE, ServerState::ALL, |s, st| s.servers[st.index()]);
        self.labelled(POOL_CLIENTS, LABEL_STATE, ClientState::ALL, |s, st| s.clients[st.index()]);
        self.family(POOL_MAXWAIT_SECONDS, |s, emit| emit(None, seconds(s.maxwait_us)));
        self.family(POOL_PREDICTED_WAIT_SECONDS, |s, emit| emit(None, seconds(s.predicted_wait_us)));
        self.family(FLEET_SHARE, |s, emit| emit(None, s.fleet_share.to_string()));
        self.family(FLEET_INSTANCES, |s, emit| emit(None, s.fleet_instances.to_string()));
        self.family(POOL_SIZE, |s, emit| emit(None, s.limits.pool_size.to_string()));
        self.family(POOL_RESERVE_POOL_SIZE, |s, emit| emit(None, s.limits.reserve_pool_size.to_string()));
        self.family(POOL_MAX_DB_CONNECTIONS, |s, emit| emit(None, s.limits.max_db_connections.to_string()));
    }

    /// The statement fingerprints' series, one per fingerprint published.
    fn queries(&mut self) {
        if self.groups.iter().all(|(_, s)| s.fingerprints.is_empty()) {
            return;
        }
        let each = |get: fn(&crate::pool::QuerySeries) -> String| {
            move |s: &Sample, emit: Emit<'_>| {
                for q in &s.fingerprints {
                    emit(Some((LABEL_FINGERPRINT, q.fingerprint.clone())), get(q));
                }
            }
        };
        self.family(QUERY_CALLS_TOTAL, each(|q| q.calls.to_string()));
        self.family(QUERY_SERVER_SECONDS_TOTAL, each(|q| seconds(q.server_us)));
        self.family(QUERY_WAIT_SECONDS_TOTAL, each(|q| seconds(q.wait_us)));
        self.family(QUERY_SERVERS_HELD, each(|q| q.held.to_string()));
    }

    fn histograms(&mut self) {
        self.histogram(SERVER_CONNECT_DURATION_SECONDS, |s| &s.connect_duration);
        self.histogram(CLIENT_WAIT_DURATION_SECONDS, |s| &s.client_wait);
        self.histogram(TRANSACTION_DURATION_SECONDS, |s| &s.transaction_duration);
    }

    /// One series per pool and per value of `key` in `values`.
    fn labelled<L: Copy + Display, V: Display>(
        &mut self,
        name: &str,
        key: &str,
        values: &[L],
        get: impl Fn(&Sample, L) -> V,
    ) {
        self.family(name, |s, emit| {
            for &v in values {
                emit(Some((key, v.to_string())), get(s, v).to_string());
            }
        });
    }

    /// `# HELP`/`# TYPE` once, then what `each` emits for every pool.
    fn family(&mut self, name: &str, each: impl Fn(&Sample, Emit<'_>)) {
        if self.groups.is_empty() {
            return;
        }
        self.header(name);
        for ((db, user), sample) in &self.groups {
            let text = &mut self.text;
            each(sample, &mut |extra, value| {
                let _ = write!(text, "{name}{{");
                labels(text, db, user, extra.as_ref().map(|(k, v)| (*k, v.as_str())));
                let _ = writeln!(text, "}} {value}");
            });
        }
    }

    fn histogram(&mut self, name: &str, get: impl Fn(&Sample) -> &Snapshot) {
        if self.groups.is_empty() {
            return;
        }
        self.header(name);
        for ((db, user), sample) in &self.groups {
            let h = get(sample);
            let text = &mut self.text;
            let bounds = BUCKETS.iter().map(|b| b.to_string()).chain(["+Inf".to_owned()]);
            for (le, n) in bounds.zip(h.cumulative.iter().chain([&h.count])) {
                let _ = write!(text, "{name}_bucket{{");
                labels(text, db, user, Some(("le", &le)));
                let _ = writeln!(text, "}} {n}");
            }
            for (suffix, value) in [("sum", seconds(h.sum_us)), ("count", h.count.to_string())] {
                let _ = write!(text, "{name}_{suffix}{{");
                labels(text, db, user, None);
                let _ = writeln!(text, "}} {value}");
            }
        }
    }

    fn header(&mut self, name: &str) {
        let (kind, help) = names::lookup(name).map_or(("untyped", ""), |(k, h)| (k.as_type(), h));
        let _ = writeln!(self.text, "# HELP {name} {help}\n# TYPE {name} {kind}");
    }
}

fn labels(text: &mut String, db: &str, user: &str, extra: Option<(&str, &str)>) {
    let _ = write!(text, "{LABEL_DATABASE}=\"{}\",{LABEL_USER}=\"{}\"", Escaped(db), Escaped(user));
    if let Some((k, v)) = extra {
        let _ = write!(text, ",{k}=\"{}\"", Escaped(v));
    }
}

fn seconds(us: u64) -> String {
    (us as f64 / 1e6).to_string()
}

/// A label value with `\`, `"` and newlines escaped.
struct Escaped<'a>(&'a str);

impl Display for Escaped<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        for c in self.0.chars() {
            match c {
                '\\' => f.write_str("\\\\")?,
                '"' => f.write_str("\\\"")?,
                '\n' => f.write_str("\\n")?,
                c => f.write_char(c)?,
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::ServerConnGuard;

    #[test]
    fn renders_each_family_once_and_sums_equal_labels() {
        let (a, b) = (PoolMetrics::new("text_db", "u\"x"), PoolMetrics::new("text_db", "u\"x"));
        drop(ServerConnGuard::opened(Arc::clone(&a), Duration::from_millis(2)));
        ServerConnGuard::opened(Arc::clone(&b), Duration::from_millis(2)).close(CloseReason::IdleTimeout);
        b.record_transaction(Duration::from_millis(1));
        let text = render_pools(&[a, b]);
        assert_eq!(text.matches("# TYPE weir_server_connections_opened_total counter").count(), 1);
        let labels = r#"database="text_db",user="u\"x""#;
        assert!(text.contains(&format!("weir_server_connections_opened_total{{{labels}}} 2\n")), "{text}");
        assert!(text.contains(&format!("weir_server_connections_closed_total{{{labels},reason=\"dropped\"}} 1\n")));
        assert!(text.contains(&format!("weir_server_connections_closed_total{{{labels},reason=\"idle_timeout\"}} 1\n")));
        assert!(text.contains(&format!("weir_transaction_duration_seconds_bucket{{{labels},le=\"+Inf\"}} 1\n")));
        assert!(text.contains(&format!("weir_transaction_duration_seconds_sum{{{labels}}} 0.001\n")), "{text}");
        assert!(text.contains(&format!("weir_server_connect_duration_seconds_count{{{labels}}} 2\n")));
        assert!(render_pools(&[]).is_empty());
    }

    #[test]
    fn render_all_lists_live_pools_with_server_bytes() {
        let p = PoolMetrics::new("db_server_bytes_test", "u");
        p.record_server_sent(30);
        p.record_server_received(70);
        let text = render_all();
        let line = |name: &str| {
            text.lines().find(|l| l.starts_with(name) && l.contains("db_server_bytes_test")).map(str::to_owned)
        };
        assert!(line("weir_server_bytes_sent_total").is_some_and(|l| l.ends_with(" 30")), "{text}");
        assert!(line("weir_server_bytes_received_total").is_some_and(|l| l.ends_with(" 70")), "{text}");
        drop(p);
        assert!(!render_all().contains("db_server_bytes_test"), "a dropped pool's series leave");
    }
}
