//! [`QuerySeries`]: one statement fingerprint's figures in one pool, as the
//! proxy publishes them (its top K, plus the rest summed as `other`) for
//! `/metrics`. The proxy replaces the whole list at each publish, so a
//! fingerprint that leaves the top K leaves `/metrics` with it.

use super::PoolMetrics;

/// The fingerprint label of the series that sums every fingerprint
/// outside the top K.
pub const OTHER: &str = "other";

/// One fingerprint's figures (or `other`'s).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QuerySeries {
    /// 16 hex digits, or [`OTHER`].
    pub fingerprint: String,
    /// Transactions that queued.
    pub calls: u64,
    /// Microseconds their servers were held.
    pub server_us: u64,
    /// Microseconds their clients waited.
    pub wait_us: u64,
    /// Servers they hold now.
    pub held: u64,
}

impl QuerySeries {
    /// Adds `o`'s figures (same fingerprint).
    fn add(&mut self, o: &QuerySeries) {
        self.calls += o.calls;
        self.server_us += o.server_us;
        self.wait_us += o.wait_us;
        self.held += o.held;
    }
}

/// `a` with `b`'s series added, by fingerprint (two pools with the same
/// labels are summed).
pub(crate) fn merge(a: &mut Vec<QuerySeries>, b: &[QuerySeries]) {
    for s in b {
        match a.iter_mut().find(|x| x.fingerprint == s.fingerprint) {
            Some(x) => x.add(s),
            None => a.push(s.clone()),
        }
    }
}

impl PoolMetrics {
    /// Replaces the pool's per-fingerprint series.
    pub fn set_queries(&self, series: Vec<QuerySeries>) {
        *self.fingerprints.lock() = series;
    }

    /// The pool's per-fingerprint series now (what `/metrics` renders).
    pub fn fingerprint_series(&self) -> Vec<QuerySeries> {
        self.fingerprints.lock().clone()
    }
}
