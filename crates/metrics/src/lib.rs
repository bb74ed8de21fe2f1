//! weir-metrics: metric names, server-connection accounting and the
//! Prometheus exporter for weir.
//!
//! * [`addr`] — [`ConnAddr`], a connection's end as logs and SHOW present it.
//! * [`names`] — every exported metric name, label key and help text.
//! * [`close`] / [`state`] — label vocabularies (close reasons, states, …).
//! * [`rate`] — [`RateWindow`], opens/closes per second over 1 s/10 s/60 s.
//! * [`pool`] — [`PoolMetrics`], everything counted per (database, user).
//! * [`stats`] — [`StatTotals`] and [`Period`], `SHOW STATS` totals and averages.
//! * [`guard`] — [`ServerConnGuard`], exactly-once open/close accounting.
//! * [`global`] — [`GlobalMetrics`], process-wide counters and build info.
//! * [`exporter`] — [`install`], the `/metrics` `/healthz` `/readyz` server,
//!   which also reports the process's RSS and open file descriptors.
//! * `hist` / `text` — per-pool histograms and the Prometheus text of every
//!   live pool (a removed pool's series leave `/metrics` with it).
//!
//! Call [`install`] before creating [`GlobalMetrics`]: facade handles bind
//! to the recorder that is global at the moment they are created.
#![forbid(unsafe_code)]
#![warn(missing_docs)]

pub mod addr;
pub mod close;
pub mod exporter;
pub mod global;
pub mod guard;
pub mod hist;
mod http;
pub mod names;
pub mod pool;
pub mod rate;
pub mod state;
pub mod stats;
mod text;

pub use addr::ConnAddr;
pub use close::{CancelOutcome, ClientResult, CloseReason, ConnectFailure, ConnectRefusal, DropReason};
pub use exporter::{install, render, Exporter, MetricsError, ReadyFn};
pub use global::{record_reload, set_build_info, set_max_client_conn, GlobalMetrics, ReloadResult};
pub use guard::ServerConnGuard;
pub use names::describe_all;
pub use pool::{render_all, BeingCanceled, Limits, PoolMetrics, ServerInfo, SharedCount};
pub use rate::{RateWindow, Window};
pub use state::{ClientState, ServerState};
pub use stats::{Period, StatTotals};
