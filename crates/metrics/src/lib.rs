//! weir-metrics: metric names, server-connection accounting and the
//! Prometheus exporter for weir.
//!
//! * [`names`] — every exported metric name, label key and help text.
//! * [`close`] / [`state`] — label vocabularies (close reasons, states, …).
//! * [`rate`] — [`RateWindow`], opens/closes per second over 1 s/10 s/60 s.
//! * [`pool`] — [`PoolMetrics`], everything counted per (database, user).
//! * [`stats`] — [`StatTotals`] and [`Period`], `SHOW STATS` totals and averages.
//! * [`guard`] — [`ServerConnGuard`], exactly-once open/close accounting.
//! * [`global`] — [`GlobalMetrics`], process-wide counters and build info.
//! * [`exporter`] — [`install`], the `/metrics` `/healthz` `/readyz` server.
//!
//! Call [`install`] before creating any [`PoolMetrics`]: facade handles bind
//! to the recorder that is global at the moment they are created.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod close;
pub mod exporter;
pub mod global;
pub mod guard;
mod handles;
mod http;
pub mod names;
pub mod pool;
pub mod rate;
pub mod state;
pub mod stats;

pub use close::{CancelOutcome, ClientResult, CloseReason, ConnectFailure, DropReason};
pub use exporter::{install, render, Exporter, MetricsError, ReadyFn};
pub use global::{set_build_info, GlobalMetrics};
pub use guard::ServerConnGuard;
pub use names::describe_all;
pub use pool::{publish_all, PoolMetrics, ServerInfo, SharedCount};
pub use rate::{RateWindow, Window};
pub use state::{ClientState, ServerState};
pub use stats::{Period, StatTotals};
