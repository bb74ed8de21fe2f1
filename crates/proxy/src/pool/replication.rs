//! A replication client's place among its pool's server connections. A
//! replication client gets a server connection of its own, never pooled,
//! and that connection counts as one of the pool's (under pool_size,
//! max_db_connections and max_user_connections), as PgBouncer counts it:
//! the client takes a free place, else the longest-idle server's (closed:
//! `evicted`), else, in its turn among the pool's waiters, the place of the
//! first server freed for it (closed the same way). The place is the
//! client's until its `ReplicationPlace` drops. The connection itself is
//! opened with `replication_spec`: the pool's, with the client's startup
//! parameters, and no connect_query (a physical walsender runs no SQL),
//! through the database's hosts (`open_replication`).

use std::sync::Arc;
use std::time::Instant;

use weir_metrics::CloseReason;

use super::{Lease, Pool, PoolError};
use crate::server::{ConnectError, ConnectSpec, CountSlot, ServerConn};

/// A place a replication client holds in its pool; given back when dropped.
#[derive(Debug)]
pub struct ReplicationPlace {
    pool: Arc<Pool>,
    _slots: (CountSlot, CountSlot),
}

impl ReplicationPlace {
    pub fn pool(&self) -> &Arc<Pool> {
        &self.pool
    }
}

impl Pool {
    /// Takes a place for a replication connection, waiting for one (in
    /// order with the pool's other waiters) until `deadline`.
    /// Cancel-safe, as `acquire`.
    pub async fn replication_place(self: &Arc<Self>, deadline: Instant) -> Result<ReplicationPlace, PoolError> {
        if let Some(place) = self.free_place() {
            return Ok(place);
        }
        let lease = self.acquire(deadline).await?;
        Ok(self.place_of(lease))
    }

    /// A place now: a free one under pool_size (and the database's and
    /// user's caps), or the longest-idle server's. None while paused, or
    /// when every place is busy.
    fn free_place(self: &Arc<Self>) -> Option<ReplicationPlace> {
        let mut st = self.state.lock();
        if st.is_paused() {
            return None;
        }
        let settings = &st.opts.settings;
        let (max_db, max_user) = (settings.max_db_connections, settings.max_user_connections);
        let slots = if st.total() < settings.pool_size {
            let db = CountSlot::take(&self.db_servers.count, max_db)?;
            (db, CountSlot::take(&self.user_servers.count, max_user)?)
        } else if let Some(conn) = st.take_longest_idle() {
            self.give_up_place(conn)
        } else {
            return None;
        };
        st.counts_mut().replication_started();
        Some(ReplicationPlace { pool: self.clone(), _slots: slots })
    }

    /// The place of a server lent to a replication client in its turn: the
    /// server closes, its place is the client's.
    fn place_of(self: &Arc<Self>, lease: Lease) -> ReplicationPlace {
        let slots = self.give_up_place(lease.into_conn());
        let mut st = self.state.lock();
        st.counts_mut().lent_to_replication();
        drop(st);
        ReplicationPlace { pool: self.clone(), _slots: slots }
    }

    /// Closes `conn` (reason `evicted`) and keeps its places in the
    /// database's and user's counts.
    fn give_up_place(&self, mut conn: Box<ServerConn>) -> (CountSlot, CountSlot) {
        // A pooled connection holds its places from its connect on (were
        // one missing, it is counted again, past the cap: the client has
        // had its turn).
        let db = conn.take_db_slot().unwrap_or_else(|| self.uncapped(&self.db_servers.count));
        let user = conn.take_user_slot().unwrap_or_else(|| self.uncapped(&self.user_servers.count));
        crate::span::client_event!(info,
            database = %self.key.database,
            user = %self.key.user,
            server = conn.id,
            "closing because: evicted (a replication connection takes its place)"
        );
        conn.close(CloseReason::Evicted);
        (db, user)
    }

    fn uncapped(&self, count: &Arc<std::sync::atomic::AtomicU32>) -> CountSlot {
        CountSlot::take(count, 0).expect("a count without a cap always has room")
    }

    /// The spec of a replication client's server: the pool's, with the
    /// client's startup parameters over the database's, and no
    /// connect_query.
    pub fn replication_spec(&self, client_params: &[(String, String)]) -> ConnectSpec {
        let mut spec = self.state.lock().opts.spec.clone();
        spec.connect_query.clear();
        spec.startup_params.retain(|(k, _)| !client_params.iter().any(|(c, _)| c.eq_ignore_ascii_case(k)));
        spec.startup_params.extend(client_params.iter().cloned());
        spec
    }

    /// Opens a replication client's server through the database's hosts,
    /// as the pool's own connects go: a host that matches
    /// target_session_attrs, its role learned and told to the host set.
    pub(crate) async fn open_replication(self: &Arc<Self>, spec: Arc<ConnectSpec>) -> Result<ServerConn, ConnectError> {
        super::hosts::connect(self, spec).await
    }
}

impl Drop for ReplicationPlace {
    fn drop(&mut self) {
        let mut st = self.pool.state.lock();
        st.counts_mut().replication_ended();
        self.pool.want_connects(&mut st);
        drop(st);
        self.pool.wake_blocked_siblings();
    }
}
