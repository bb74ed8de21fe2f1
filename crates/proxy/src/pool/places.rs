//! The silence probe's place among a pool's server connections: a probe
//! session counts as one of the pool's servers (and under max_db_connections
//! and max_user_connections), so the pool and the probe together never hold
//! more backends than the pool's limit. With no place free, the pool's
//! longest-idle server gives up its own; with every place busy, the probe
//! opens no session (`server::probe` then only checks the path).

use std::sync::{Arc, Weak};

use weir_metrics::CloseReason;

use super::Pool;
use crate::server::watch::{ProbePlaces, ProbeRoom};
use crate::server::CountSlot;

/// The pool seen from its connect spec (weak: a spec outlives no pool).
struct Places(Weak<Pool>);

/// A place a probe holds; given back when dropped.
struct Place {
    pool: Arc<Pool>,
    _slots: (CountSlot, CountSlot),
}

impl Pool {
    /// What this pool's connect spec carries for its probes.
    pub(super) fn probe_room(self: &Arc<Self>) -> ProbeRoom {
        ProbeRoom(Some(Arc::new(Places(Arc::downgrade(self)))))
    }
}

impl ProbePlaces for Places {
    fn take(&self) -> Option<Box<dyn Send + Sync>> {
        let pool = self.0.upgrade()?;
        let mut st = pool.state.lock();
        let settings = &st.opts.settings;
        let (max_db, max_user) = (settings.max_db_connections, settings.max_user_connections);
        let slots = if st.total() < st.capacity() {
            let db = CountSlot::take(&pool.db_servers.count, max_db)?;
            (db, CountSlot::take(&pool.user_servers.count, max_user)?)
        } else if let Some(mut conn) = st.take_longest_idle() {
            let db = conn.take_db_slot().or_else(|| CountSlot::take(&pool.db_servers.count, max_db));
            let user = conn.take_user_slot().or_else(|| CountSlot::take(&pool.user_servers.count, max_user));
            conn.close(CloseReason::Evicted);
            (db?, user?)
        } else {
            return None;
        };
        st.counts_mut().probe_started();
        drop(st);
        Some(Box::new(Place { pool, _slots: slots }))
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut st = self.pool.state.lock();
        st.counts_mut().probe_ended();
        self.pool.want_connects(&mut st);
        drop(st);
        self.pool.wake_blocked_siblings();
    }
}
