//! [`HostSetMetrics`]: what weir knows of one database's hosts — each host's
//! role, how many match the database's `target_session_attrs`, failovers and
//! how long each took — and their Prometheus text. Like the pools' series,
//! a host set's series are rendered from the live sets, so they leave
//! `/metrics` when the set goes (a fallback database's pools removed).

use std::fmt::Write;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;

use crate::hist::{Histogram, Snapshot, BUCKETS};
use crate::names::{
    self, FAILOVERS_TOTAL, FAILOVER_DURATION_SECONDS, HOSTS_MATCHING, HOST_ROLE, LABEL_DATABASE, LABEL_HOST, LABEL_ROLE,
};
use crate::state::HostRole;

const R: Ordering = Ordering::Relaxed;

/// Live host sets, for `/metrics`. Dead entries are pruned on each render.
static REGISTRY: Mutex<Vec<Weak<HostSetMetrics>>> = Mutex::new(Vec::new());

/// The metrics of one database's hosts. Create with [`HostSetMetrics::new`],
/// share as `Arc`.
#[derive(Debug)]
pub struct HostSetMetrics {
    database: String,
    /// Each host (`address:port`) and its role, in the set's order.
    hosts: Mutex<Vec<(String, HostRole)>>,
    matching: AtomicU64,
    failovers: AtomicU64,
    failover_duration: Histogram,
}

impl HostSetMetrics {
    /// Creates the metrics of `database`'s hosts and lists them for
    /// `/metrics` until dropped.
    pub fn new(database: impl Into<String>) -> Arc<Self> {
        let set = Arc::new(HostSetMetrics {
            database: database.into(),
            hosts: Mutex::new(Vec::new()),
            matching: AtomicU64::new(0),
            failovers: AtomicU64::new(0),
            failover_duration: Histogram::default(),
        });
        let mut reg = REGISTRY.lock();
        reg.retain(|w| w.strong_count() > 0);
        reg.push(Arc::downgrade(&set));
        set
    }

    /// Database label.
    pub fn database(&self) -> &str {
        &self.database
    }

    /// Every host and its role now (replaces the last list).
    pub fn set_hosts(&self, hosts: Vec<(String, HostRole)>) {
        *self.hosts.lock() = hosts;
    }

    /// The hosts and roles last set.
    pub fn hosts(&self) -> Vec<(String, HostRole)> {
        self.hosts.lock().clone()
    }

    /// Hosts known to match the target now.
    pub fn set_matching(&self, n: u64) {
        self.matching.store(n, R);
    }

    /// Hosts known to match, as last set.
    pub fn matching(&self) -> u64 {
        self.matching.load(R)
    }

    /// Counts one failover that took `took` (first failed connect to first
    /// matching server on another host; None when no connect failed: the
    /// new host was found matching while the old one still seemed to).
    pub fn record_failover(&self, took: Option<Duration>) {
        self.failovers.fetch_add(1, R);
        if let Some(took) = took {
            self.failover_duration.record(took);
        }
    }

    /// Failovers so far.
    pub fn failovers(&self) -> u64 {
        self.failovers.load(R)
    }

    /// How long the failovers so far took.
    pub fn failover_durations(&self) -> Snapshot {
        self.failover_duration.snapshot()
    }
}

/// The Prometheus text of every live host set (empty when there is none).
pub(crate) fn render_host_sets() -> String {
    let sets: Vec<Arc<HostSetMetrics>> = {
        let mut reg = REGISTRY.lock();
        reg.retain(|w| w.strong_count() > 0);
        reg.iter().filter_map(Weak::upgrade).collect()
    };
    render(&sets)
}

fn render(sets: &[Arc<HostSetMetrics>]) -> String {
    let mut out = String::new();
    if sets.is_empty() {
        return out;
    }
    // Two live sets of one database (two weirs in one process) are summed;
    // a host both list is shown once, with the first set's role.
    let mut databases: Vec<&str> = sets.iter().map(|s| s.database()).collect();
    databases.sort_unstable();
    databases.dedup();
    fn of<'a>(sets: &'a [Arc<HostSetMetrics>], db: &'a str) -> impl Iterator<Item = &'a Arc<HostSetMetrics>> {
        sets.iter().filter(move |s| s.database() == db)
    }
    header(&mut out, HOST_ROLE);
    for db in &databases {
        let mut seen: Vec<String> = Vec::new();
        for (host, role) in of(sets, db).flat_map(|s| s.hosts()) {
            if seen.contains(&host) {
                continue;
            }
            for r in HostRole::ALL {
                let _ = writeln!(
                    out,
                    "{HOST_ROLE}{{{LABEL_DATABASE}=\"{}\",{LABEL_HOST}=\"{}\",{LABEL_ROLE}=\"{r}\"}} {}",
                    escaped(db),
                    escaped(&host),
                    u8::from(*r == role)
                );
            }
            seen.push(host);
        }
    }
    header(&mut out, HOSTS_MATCHING);
    for db in &databases {
        let n: u64 = of(sets, db).map(|s| s.matching()).sum();
        let _ = writeln!(out, "{HOSTS_MATCHING}{{{LABEL_DATABASE}=\"{}\"}} {n}", escaped(db));
    }
    header(&mut out, FAILOVERS_TOTAL);
    for db in &databases {
        let n: u64 = of(sets, db).map(|s| s.failovers()).sum();
        let _ = writeln!(out, "{FAILOVERS_TOTAL}{{{LABEL_DATABASE}=\"{}\"}} {n}", escaped(db));
    }
    header(&mut out, FAILOVER_DURATION_SECONDS);
    for db in &databases {
        let mut h = Snapshot::default();
        of(sets, db).for_each(|s| h.add(&s.failover_durations()));
        let name = FAILOVER_DURATION_SECONDS;
        let db = escaped(db);
        let bounds = BUCKETS.iter().map(|b| b.to_string()).chain(["+Inf".to_owned()]);
        for (le, n) in bounds.zip(h.cumulative.iter().chain([&h.count])) {
            let _ = writeln!(out, "{name}_bucket{{{LABEL_DATABASE}=\"{db}\",le=\"{le}\"}} {n}");
        }
        let _ = writeln!(out, "{name}_sum{{{LABEL_DATABASE}=\"{db}\"}} {}", h.sum_us as f64 / 1e6);
        let _ = writeln!(out, "{name}_count{{{LABEL_DATABASE}=\"{db}\"}} {}", h.count);
    }
    out
}

fn header(out: &mut String, name: &str) {
    let (kind, help) = names::lookup(name).map_or(("untyped", ""), |(k, h)| (k.as_type(), h));
    let _ = writeln!(out, "# HELP {name} {help}\n# TYPE {name} {kind}");
}

/// A label value with `\`, `"` and newlines escaped.
fn escaped(v: &str) -> String {
    v.replace('\\', "\\\\").replace('"', "\\\"").replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_roles_matching_and_failovers() {
        let a = HostSetMetrics::new("hosts_db");
        a.set_hosts(vec![("127.0.0.3:5432".into(), HostRole::Standby), ("127.0.0.2:5432".into(), HostRole::Primary)]);
        a.set_matching(1);
        a.record_failover(Some(Duration::from_millis(700)));
        let b = HostSetMetrics::new("hosts_db");
        b.set_hosts(vec![("127.0.0.2:5432".into(), HostRole::Unreachable)]);
        b.record_failover(Some(Duration::from_millis(300)));
        b.record_failover(None);
        let text = render(&[a, b]);
        let has = |line: &str| text.lines().any(|l| l == line);
        assert!(has(r#"weir_host_role{database="hosts_db",host="127.0.0.3:5432",role="standby"} 1"#), "{text}");
        assert!(has(r#"weir_host_role{database="hosts_db",host="127.0.0.3:5432",role="primary"} 0"#));
        assert!(has(r#"weir_host_role{database="hosts_db",host="127.0.0.2:5432",role="primary"} 1"#));
        assert_eq!(text.matches(r#"host="127.0.0.2:5432",role="unreachable""#).count(), 1, "shown once");
        assert!(has(r#"weir_hosts_matching{database="hosts_db"} 1"#));
        assert!(has(r#"weir_failovers_total{database="hosts_db"} 3"#), "untimed ones counted too");
        assert!(has(r#"weir_failover_duration_seconds_bucket{database="hosts_db",le="0.5"} 1"#), "{text}");
        assert!(has(r#"weir_failover_duration_seconds_count{database="hosts_db"} 2"#));
        assert_eq!(text.matches("# TYPE weir_host_role gauge").count(), 1);
        assert!(render(&[]).is_empty());
    }

    #[test]
    fn a_dropped_set_leaves_the_text() {
        let s = HostSetMetrics::new("hosts_db_gone");
        s.set_hosts(vec![("h:1".into(), HostRole::Unknown)]);
        assert!(render_host_sets().contains("hosts_db_gone"));
        drop(s);
        assert!(!render_host_sets().contains("hosts_db_gone"));
    }
}
