//! weir-metrics: metric names, server-connection accounting and the
//! Prometheus exporter for weir.
//!
//! * [`addr`] — [`ConnAddr`], a connection's end as logs and SHOW present it.
//! * [`names`] — every exported metric name, label key and help text.
//! * [`close`] / [`state`] — label vocabularies (close reasons, states, …).
//! * [`rate`] — [`RateWindow`], opens/closes per second over 1 s/10 s/60 s.
//! * [`hist`] — the fixed-bucket histogram of every per-pool duration, and
//!   the [`BUCKETS`](hist::BUCKETS) every `*_seconds` histogram uses.
//! * [`pool`] — [`PoolMetrics`], everything counted per (database, user), in
//!   three parts: recording (the proxy), reads (the admin console's SHOW)
//!   and one sample per pool (for rendering).
//!   The proxy publishes each pool's statement fingerprints ([`QuerySeries`], its top K and `other`).
//! * [`stats`] — [`StatTotals`] and [`Period`], `SHOW STATS` totals and averages.
//! * [`guard`] — [`ServerConnGuard`], exactly-once open/close accounting.
//! * [`hosts`] — [`HostSetMetrics`], each database's hosts: their roles,
//!   failovers and how long each took.
//! * [`global`] — [`GlobalMetrics`], process-wide counters and build info.
//! * `text` — [`render_all`], the Prometheus text (0.0.4) of every live pool,
//!   and the scrape: process figures, the recorder's series, the pools.
//! * `http` — the blocking HTTP/1.1 handling of one request, [`ReadyFn`].
//! * [`exporter`] — [`install`], the recorder and the threads serving
//!   `/metrics`, `/healthz` and `/readyz`.
//!
//! Imports inside the crate run one way: `exporter` → `http` → `text` →
//! `pool` → `hist`, `rate`, `stats` and the vocabularies; `text` → `hosts` →
//! `hist`; `guard` → `pool`.
//!
//! # What `metrics-exporter-prometheus` does, and what is written here
//!
//! Process-wide series (client results, cancels, reloads, build info) go
//! through the `metrics` facade into `metrics-exporter-prometheus`' recorder,
//! and its [`PrometheusHandle::render`] is the start of every scrape. Three
//! pieces beside it are written by hand, each for a reason the crate (0.17)
//! does not cover:
//!
//! * **Per-pool series** (`pool`, `hist`, `text`). The recorder's registry
//!   cannot delete one series by name and labels; its only removal is
//!   `PrometheusBuilder::idle_timeout`, which drops every series of a kind
//!   that was not updated for a while. A pool made on demand (auth_query
//!   users, a fallback database) would then either keep its label set in
//!   `/metrics` after the pool is gone, or a quiet live pool's counters would
//!   vanish and restart from zero. Rendered from the live [`PoolMetrics`]
//!   instead, a pool's series leave exactly when it does. Its histograms are
//!   three relaxed atomic adds per sample, where the recorder's push each
//!   sample with its `Instant` into a bucket drained at upkeep or render.
//! * **The text renderer** (`text`) follows from that: the pools' series are
//!   not in the recorder, so they are rendered here and appended to its text.
//! * **The HTTP server** (`http`, `exporter`). The crate's listener answers
//!   every path but `/health` with the recorder's text alone (no readiness
//!   answer, no per-pool text), and runs on the tokio runtime it is installed
//!   from (weir's data path) or a runtime of its own. weir's is plain std on
//!   its own OS threads, so scrapes and probes are answered while the data
//!   path is saturated, with `/readyz` from a callback.
//!
//! [`PrometheusHandle::render`]: metrics_exporter_prometheus::PrometheusHandle::render
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
pub mod hosts;
mod http;
pub mod names;
pub mod pool;
pub mod rate;
pub mod state;
pub mod stats;
mod text;

pub use addr::ConnAddr;
pub use close::{CancelOutcome, ClientResult, CloseReason, ConnectFailure, ConnectRefusal, DropReason};
pub use exporter::{install, render, Exporter, MetricsError};
pub use global::{record_reload, set_build_info, set_max_client_conn, GlobalMetrics, ReloadResult};
pub use guard::ServerConnGuard;
pub use hosts::HostSetMetrics;
pub use http::ReadyFn;
pub use names::describe_all;
pub use pool::{BeingCanceled, Limits, PoolMetrics, QuerySeries, ServerInfo, SharedCount, OTHER};
pub use rate::{RateWindow, Window};
pub use state::{ClientState, HostRole, ServerState};
pub use stats::{Period, StatTotals};
pub use text::render_all;
