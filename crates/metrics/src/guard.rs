//! [`ServerConnGuard`]: RAII accounting for one open server connection.
//! Constructing it counts the open; consuming or dropping it counts exactly
//! one close, with the explicit reason, the pre-set reason, or
//! [`CloseReason::Dropped`].
//!
//! It also writes the two log lines operators grep for, at the default
//! level, in PgBouncer's words: `new connection to server` once the
//! connection is described, and `closing because: <reason> (age=…)` at the
//! close, each with the pool (`database/user@server`) and the backend pid.

use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::close::CloseReason;
use crate::pool::{PoolMetrics, ServerInfo};

/// Lives exactly as long as one successfully opened server connection.
///
/// * [`opened`](Self::opened) counts the open (counter, rate, histogram).
/// * [`close`](Self::close) consumes the guard and counts the close once.
/// * Dropping it without `close` counts the close once with the reason set by
///   [`set_reason`](Self::set_reason), or [`CloseReason::Dropped`] if none was
///   set — so a task cancelled mid-flight, or a code path that forgot to give a
///   reason, is still counted and visible.
///
/// Double counting is impossible: `close` takes `self`, and the single count
/// happens in `Drop`.
#[derive(Debug)]
#[must_use = "dropping the guard immediately counts the connection as closed"]
pub struct ServerConnGuard {
    pool: Arc<PoolMetrics>,
    reason: CloseReason,
    opened_at: Instant,
    /// Its entry in the pool's live server table, once described.
    live: Option<u64>,
    /// The backend's pid and address, once described (for the close line).
    server: Option<(i32, crate::ConnAddr)>,
}

impl ServerConnGuard {
    /// Counts one server connection open that took `connect_duration`.
    pub fn opened(pool: Arc<PoolMetrics>, connect_duration: Duration) -> Self {
        pool.record_open(connect_duration);
        ServerConnGuard { pool, reason: CloseReason::Dropped, opened_at: Instant::now(), live: None, server: None }
    }

    /// Lists the connection in its pool's live server table (`SHOW SERVERS`)
    /// until the close is counted. A second call replaces the first entry.
    /// The first call logs the open.
    pub fn describe(&mut self, info: ServerInfo) {
        if let Some(id) = self.live.take() {
            self.pool.remove_live(id);
        }
        if self.server.is_none() {
            let (db, user, addr) = (self.pool.database(), self.pool.user(), info.addr);
            let from = info.local_addr.map_or_else(|| "unknown".to_owned(), |a| a.to_string());
            tracing::info!(pid = info.pid, "S: {db}/{user}@{addr} new connection to server (from {from})");
        }
        self.server = Some((info.pid, info.addr));
        self.live = Some(self.pool.add_live(info));
    }

    /// Counts the close with `reason` and consumes the guard.
    pub fn close(mut self, reason: CloseReason) {
        self.reason = reason;
    }

    /// Sets the reason counted if the guard is later dropped without `close`.
    pub fn set_reason(&mut self, reason: CloseReason) {
        self.reason = reason;
    }

    /// The reason that would be counted if dropped now.
    pub fn pending_reason(&self) -> CloseReason {
        self.reason
    }

    /// The pool this connection belongs to.
    pub fn pool(&self) -> &Arc<PoolMetrics> {
        &self.pool
    }

    /// Time since the open was counted.
    pub fn age(&self) -> Duration {
        self.opened_at.elapsed()
    }
}

impl Drop for ServerConnGuard {
    fn drop(&mut self) {
        if let Some(id) = self.live.take() {
            self.pool.remove_live(id);
        }
        self.pool.record_close(self.reason);
        let (db, user, reason, age) = (self.pool.database(), self.pool.user(), self.reason, self.age().as_secs_f64());
        match self.server {
            Some((pid, addr)) => {
                tracing::info!(pid, "S: {db}/{user}@{addr} closing because: {reason} (age={age:.3}s)");
            }
            None => tracing::info!("S: {db}/{user} closing because: {reason} (age={age:.3}s)"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rate::Window;

    fn pool(name: &str) -> Arc<PoolMetrics> {
        PoolMetrics::new(format!("guard_{name}"), "u")
    }

    #[test]
    fn open_then_close_counts_once() {
        let p = pool("close");
        let g = ServerConnGuard::opened(Arc::clone(&p), Duration::from_millis(5));
        assert_eq!((p.opened(), p.closed_total()), (1, 0));
        g.close(CloseReason::IdleTimeout);
        assert_eq!(p.closed(CloseReason::IdleTimeout), 1);
        assert_eq!(p.closed_total(), 1);
        assert_eq!(p.closed(CloseReason::Dropped), 0);
    }

    #[test]
    fn drop_without_close_counts_dropped_once() {
        let p = pool("drop");
        drop(ServerConnGuard::opened(Arc::clone(&p), Duration::ZERO));
        assert_eq!(p.closed(CloseReason::Dropped), 1);
        assert_eq!(p.closed_total(), 1);
    }

    #[test]
    fn preset_reason_used_on_drop() {
        let p = pool("preset");
        let mut g = ServerConnGuard::opened(Arc::clone(&p), Duration::ZERO);
        g.set_reason(CloseReason::Shutdown);
        assert_eq!(g.pending_reason(), CloseReason::Shutdown);
        drop(g);
        assert_eq!(p.closed(CloseReason::Shutdown), 1);
        assert_eq!(p.closed_total(), 1);
    }

    #[test]
    fn explicit_close_overrides_preset() {
        let p = pool("override");
        let mut g = ServerConnGuard::opened(Arc::clone(&p), Duration::ZERO);
        g.set_reason(CloseReason::Shutdown);
        g.close(CloseReason::ServerError);
        assert_eq!(p.closed(CloseReason::ServerError), 1);
        assert_eq!(p.closed(CloseReason::Shutdown), 0);
        assert_eq!(p.closed_total(), 1);
    }

    #[test]
    fn panic_while_held_still_counts_once() {
        let p = pool("panic");
        let p2 = Arc::clone(&p);
        let r = std::thread::spawn(move || {
            let mut g = ServerConnGuard::opened(p2, Duration::ZERO);
            g.set_reason(CloseReason::ProtocolError);
            panic!("boom");
        })
        .join();
        assert!(r.is_err());
        assert_eq!(p.closed(CloseReason::ProtocolError), 1);
        assert_eq!(p.closed_total(), 1);
    }

    #[tokio::test]
    async fn cancelled_task_counts_once() {
        let p = pool("cancel");
        let p2 = Arc::clone(&p);
        let task = tokio::spawn(async move {
            let mut g = ServerConnGuard::opened(p2, Duration::ZERO);
            g.set_reason(CloseReason::ClientGoneUnclean);
            std::future::pending::<()>().await;
            g.close(CloseReason::IdleTimeout);
        });
        while p.opened() == 0 {
            tokio::task::yield_now().await;
        }
        task.abort();
        assert!(task.await.unwrap_err().is_cancelled());
        assert_eq!(p.closed(CloseReason::ClientGoneUnclean), 1);
        assert_eq!(p.closed_total(), 1);
    }

    #[test]
    fn described_servers_are_listed_until_closed() {
        let p = pool("live");
        let mut g = ServerConnGuard::opened(Arc::clone(&p), Duration::ZERO);
        let info = ServerInfo {
            id: 1,
            pid: 42,
            addr: "127.0.0.1:5432".parse::<std::net::SocketAddr>().unwrap().into(),
            local_addr: None,
            connected_at: std::time::SystemTime::now(),
            prepared_statements: Default::default(),
        };
        g.describe(info.clone());
        g.describe(info.clone());
        assert_eq!(p.live_servers(), vec![info]);
        g.close(CloseReason::Admin);
        assert!(p.live_servers().is_empty());
    }

    #[test]
    fn many_guards_balance_and_feed_rates() {
        let p = pool("many");
        let guards: Vec<_> = (0..100).map(|_| ServerConnGuard::opened(Arc::clone(&p), Duration::ZERO)).collect();
        for (i, g) in guards.into_iter().enumerate() {
            if i % 2 == 0 {
                g.close(CloseReason::Lifetime);
            }
        }
        assert_eq!(p.opened(), 100);
        assert_eq!(p.closed(CloseReason::Lifetime), 50);
        assert_eq!(p.closed(CloseReason::Dropped), 50);
        assert_eq!(p.closed_total(), p.opened());
        let now = p.opens_window().now_secs();
        assert_eq!(p.opens_window().count_at(Window::S60, now + 1), 100);
        assert_eq!(p.closes_window().count_at(Window::S60, now + 1), 100);
    }
}
