//! [`GlobalMetrics`]: process-wide metrics that belong to no pool — cancel
//! request outcomes, client connection results — and the process-wide
//! series set directly: `weir_build_info`, `weir_max_client_conn` and
//! `weir_config_reloads_total{result}`.

use std::sync::atomic::{AtomicU64, Ordering};

use metrics::Counter;

use crate::close::{label_enum, CancelOutcome, ClientResult};
use crate::names::{
    BUILD_INFO, CANCEL_REQUESTS_TOTAL, CLIENT_CONNECTIONS_TOTAL, CONFIG_RELOADS_TOTAL, LABEL_OUTCOME, LABEL_RESULT,
    LABEL_VERSION, MAX_CLIENT_CONN,
};

label_enum! {
    /// How a configuration reload (SIGHUP, the console's RELOAD or SET) ended.
    ReloadResult {
        /// The new configuration is in force.
        Ok => "ok",
        /// The new configuration was refused; the old one stays.
        Failed => "failed",
    }
}

/// Unlabelled-by-pool counters. Create once (after installing the exporter)
/// and share as `Arc<GlobalMetrics>`.
pub struct GlobalMetrics {
    cancels: [AtomicU64; CancelOutcome::COUNT],
    clients: [AtomicU64; ClientResult::COUNT],
    cancel_h: Vec<Counter>,
    client_h: Vec<Counter>,
}

impl std::fmt::Debug for GlobalMetrics {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GlobalMetrics").finish_non_exhaustive()
    }
}

impl Default for GlobalMetrics {
    fn default() -> Self {
        Self::new()
    }
}

impl GlobalMetrics {
    /// Resolves the facade handles against the currently installed recorder.
    pub fn new() -> Self {
        GlobalMetrics {
            cancels: std::array::from_fn(|_| AtomicU64::new(0)),
            clients: std::array::from_fn(|_| AtomicU64::new(0)),
            cancel_h: CancelOutcome::ALL
                .iter()
                .map(|o| metrics::counter!(CANCEL_REQUESTS_TOTAL, LABEL_OUTCOME => o.as_label()))
                .collect(),
            client_h: ClientResult::ALL
                .iter()
                .map(|r| metrics::counter!(CLIENT_CONNECTIONS_TOTAL, LABEL_RESULT => r.as_label()))
                .collect(),
        }
    }

    /// Counts one cancel request with its outcome.
    pub fn record_cancel(&self, outcome: CancelOutcome) {
        self.cancels[outcome.index()].fetch_add(1, Ordering::Relaxed);
        self.cancel_h[outcome.index()].increment(1);
    }

    /// Counts one client connection attempt with its result.
    pub fn record_client_connection(&self, result: ClientResult) {
        self.clients[result.index()].fetch_add(1, Ordering::Relaxed);
        self.client_h[result.index()].increment(1);
    }

    /// Cancel requests with `outcome` so far.
    pub fn cancels(&self, outcome: CancelOutcome) -> u64 {
        self.cancels[outcome.index()].load(Ordering::Relaxed)
    }

    /// Client connection attempts with `result` so far.
    pub fn client_connections(&self, result: ClientResult) -> u64 {
        self.clients[result.index()].load(Ordering::Relaxed)
    }
}

/// Counts one configuration reload with its result.
pub fn record_reload(result: ReloadResult) {
    metrics::counter!(CONFIG_RELOADS_TOTAL, LABEL_RESULT => result.as_label()).increment(1);
}

/// Sets `weir_max_client_conn` (at start and on every reload).
pub fn set_max_client_conn(n: usize) {
    metrics::gauge!(MAX_CLIENT_CONN).set(n as f64);
}

/// Sets `weir_build_info{version}` to 1.
pub fn set_build_info(version: &str) {
    metrics::gauge!(BUILD_INFO, LABEL_VERSION => version.to_owned()).set(1.0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_read_back() {
        let g = GlobalMetrics::new();
        g.record_cancel(CancelOutcome::Forwarded);
        g.record_cancel(CancelOutcome::Forwarded);
        g.record_client_connection(ClientResult::AuthFailed);
        assert_eq!(g.cancels(CancelOutcome::Forwarded), 2);
        assert_eq!(g.cancels(CancelOutcome::Unknown), 0);
        assert_eq!(g.client_connections(ClientResult::AuthFailed), 1);
    }
}
