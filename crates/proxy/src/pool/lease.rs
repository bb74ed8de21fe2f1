//! `Lease`: a client's loan of a server connection. Dropping it always gives
//! the connection back to the pool, which recovers it if it is not clean, so
//! no code path on the client side can lose or close a healthy server.

use std::sync::Arc;

use weir_metrics::CloseReason;

use super::Pool;
use crate::server::ServerConn;

/// A server connection on loan to one client.
#[derive(Debug)]
pub struct Lease {
    pool: Arc<Pool>,
    /// Boxed here as everywhere in the pool (from connect to close): a
    /// connection moves through several futures and queues per
    /// transaction, and a pointer moves for free where the 464-byte
    /// connection would be copied each time.
    conn: Option<Box<ServerConn>>,
    /// Session mode: run server_reset_query before anyone else gets it.
    needs_reset: bool,
}

impl Lease {
    /// A lease of `conn`, taken from the pool at `taken_at` (the pool's
    /// clock reading: the client's transaction time starts from it, and
    /// reads no clock of its own). Kept in the boxed connection, not here:
    /// the lease is part of every request's future.
    pub(super) fn new(pool: Arc<Pool>, mut conn: Box<ServerConn>, taken_at: std::time::Instant) -> Self {
        conn.taken(taken_at);
        Lease { pool, conn: Some(conn), needs_reset: false }
    }

    /// When the connection was taken from the pool (or `restamp`ed).
    pub fn taken_at(&self) -> std::time::Instant {
        self.conn().taken_at()
    }

    /// The connection counts as taken at `now` (after its check, or for a
    /// session-mode lease taken at login, at its first request).
    pub fn restamp(&mut self, now: std::time::Instant) {
        self.conn_mut().taken(now);
    }

    pub fn conn(&self) -> &ServerConn {
        self.conn.as_deref().expect("lease holds a connection until dropped")
    }

    pub fn conn_mut(&mut self) -> &mut ServerConn {
        self.conn.as_deref_mut().expect("lease holds a connection until dropped")
    }

    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }

    /// Marks the connection for server_reset_query when it comes back.
    pub fn set_needs_reset(&mut self) {
        self.needs_reset = true;
    }

    /// Gives the connection back now, at `now` (the caller's clock reading,
    /// so the return costs none of its own).
    pub fn release_at(mut self, now: std::time::Instant) {
        if let Some(conn) = self.conn.take() {
            self.pool.give_back(conn, self.needs_reset, Some(now));
        }
    }

    /// The connection itself, out of the loan (still counted `active`: the
    /// caller settles the count).
    pub(super) fn into_conn(mut self) -> Box<ServerConn> {
        self.conn.take().expect("lease holds a connection until dropped")
    }

    /// The server is broken (it died or spoke nonsense): close it, counted with
    /// `reason`, and let the pool replace it.
    pub fn close(mut self, reason: CloseReason) {
        if let Some(mut conn) = self.conn.take() {
            let query = conn.take_query();
            let mut st = self.pool.state.lock();
            st.counts_mut().returned();
            Pool::query_returned(&mut st, &conn, query, None);
            drop(st);
            self.pool.discard(conn, reason);
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            self.pool.give_back(conn, self.needs_reset, None);
        }
    }
}
