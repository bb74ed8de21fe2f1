//! [`PoolHandles`]: the `metrics` facade handles for one pool, resolved once
//! (labels allocated once) so the hot path only touches pre-built handles.
//!
//! Handles bind to whichever global recorder is installed when they are
//! built; install the exporter before creating pools.

use metrics::{Counter, Gauge, Histogram, Label};

use crate::close::{CloseReason, ConnectFailure, DropReason};
use crate::names::*;
use crate::rate::Window;
use crate::state::{ClientState, ServerState};

/// Pre-resolved facade handles for one (database, user) pool.
pub(crate) struct PoolHandles {
    pub opened: Counter,
    pub closed: Vec<Counter>,
    pub connect_failures: Vec<Counter>,
    pub dropped: Vec<Counter>,
    pub transactions: Counter,
    pub queries: Counter,
    pub client_parses: Counter,
    pub server_parses: Counter,
    pub pinned: Counter,
    pub connect_duration: Histogram,
    pub client_wait: Histogram,
    pub transaction_duration: Histogram,
    pub opens_rate: Vec<Gauge>,
    pub closes_rate: Vec<Gauge>,
    pub servers: Vec<Gauge>,
    pub clients: Vec<Gauge>,
    pub maxwait: Gauge,
}

struct Labels {
    base: Vec<Label>,
}

impl Labels {
    fn with(&self, key: &'static str, value: &'static str) -> Vec<Label> {
        let mut v = self.base.clone();
        v.push(Label::new(key, value));
        v
    }

    fn counter(&self, name: &'static str) -> Counter {
        metrics::counter!(name, self.base.clone())
    }

    fn counter_with(&self, name: &'static str, key: &'static str, value: &'static str) -> Counter {
        metrics::counter!(name, self.with(key, value))
    }

    fn gauge_with(&self, name: &'static str, key: &'static str, value: &'static str) -> Gauge {
        metrics::gauge!(name, self.with(key, value))
    }

    fn histogram(&self, name: &'static str) -> Histogram {
        metrics::histogram!(name, self.base.clone())
    }
}

impl PoolHandles {
    pub fn new(database: &str, user: &str) -> Self {
        let l = Labels {
            base: vec![Label::new(LABEL_DATABASE, database.to_owned()), Label::new(LABEL_USER, user.to_owned())],
        };
        let per_window = |name| Window::ALL.iter().map(|w| l.gauge_with(name, LABEL_WINDOW, w.label())).collect();
        PoolHandles {
            opened: l.counter(SERVER_CONNECTIONS_OPENED_TOTAL),
            closed: CloseReason::ALL
                .iter()
                .map(|r| l.counter_with(SERVER_CONNECTIONS_CLOSED_TOTAL, LABEL_REASON, r.as_label()))
                .collect(),
            connect_failures: ConnectFailure::ALL
                .iter()
                .map(|r| l.counter_with(SERVER_CONNECT_FAILURES_TOTAL, LABEL_REASON, r.as_label()))
                .collect(),
            dropped: DropReason::ALL
                .iter()
                .map(|r| l.counter_with(QUERIES_DROPPED_TOTAL, LABEL_REASON, r.as_label()))
                .collect(),
            transactions: l.counter(TRANSACTIONS_TOTAL),
            queries: l.counter(QUERIES_TOTAL),
            client_parses: l.counter(PREPARED_STATEMENTS_CLIENT_PARSES_TOTAL),
            server_parses: l.counter(PREPARED_STATEMENTS_SERVER_PARSES_TOTAL),
            pinned: l.counter(PINNED_SESSIONS_TOTAL),
            connect_duration: l.histogram(SERVER_CONNECT_DURATION_SECONDS),
            client_wait: l.histogram(CLIENT_WAIT_DURATION_SECONDS),
            transaction_duration: l.histogram(TRANSACTION_DURATION_SECONDS),
            opens_rate: per_window(SERVER_CONNECTION_OPENS_PER_SECOND),
            closes_rate: per_window(SERVER_CONNECTION_CLOSES_PER_SECOND),
            servers: ServerState::ALL.iter().map(|s| l.gauge_with(POOL_SERVERS, LABEL_STATE, s.as_label())).collect(),
            clients: ClientState::ALL.iter().map(|s| l.gauge_with(POOL_CLIENTS, LABEL_STATE, s.as_label())).collect(),
            maxwait: metrics::gauge!(POOL_MAXWAIT_SECONDS, l.base.clone()),
        }
    }
}
