//! `max_db_connections` across users: a pool whose clients wait while the
//! database is at its cap takes room from another user's pool of the same
//! database, by closing that pool's longest-idle connection (reason
//! `evicted`; PgBouncer's evict_connection does the same). Without it, a
//! pool that got there first would keep every slot while idle, and the
//! other users' logins and queries would wait out their budgets.

use std::sync::{Arc, Weak};

use weir_metrics::CloseReason;

use super::state::State;
use super::Pool;

impl Pool {
    /// Called (lock held) when max_db_connections refused a connect that
    /// demand calls for. The eviction runs in its own task, so no two pool
    /// locks are ever held together; then this pool tries again.
    pub(super) fn make_room(self: &Arc<Self>, st: &mut State) {
        if st.evicting {
            return;
        }
        st.evicting = true;
        let pool = self.clone();
        tokio::spawn(async move {
            let freed = pool.evict_from_siblings();
            let mut st = pool.state.lock();
            st.evicting = false;
            if freed {
                pool.want_connects(&mut st);
            }
        });
    }

    /// Closes one idle connection of another pool of this database.
    fn evict_from_siblings(self: &Arc<Self>) -> bool {
        let siblings: Vec<Arc<Pool>> = {
            let mut pools = self.db_servers.pools.lock();
            pools.retain(|p| p.strong_count() > 0);
            pools.iter().filter_map(Weak::upgrade).filter(|p| !Arc::ptr_eq(p, self)).collect()
        };
        siblings.iter().any(|p| p.evict_idle())
    }

    /// Closes this pool's longest-idle connection, unless the pool is at
    /// min_pool_size or has none idle.
    fn evict_idle(&self) -> bool {
        let conn = {
            let mut st = self.state.lock();
            if st.idle.is_empty() || st.total() <= st.opts.settings.min_pool_size {
                return false;
            }
            // The idle stack lends from the top: the bottom waited longest.
            st.idle.remove(0)
        };
        tracing::info!(
            database = %self.key.database,
            user = %self.key.user,
            "closing an idle server connection to make room under max_db_connections"
        );
        conn.close(CloseReason::Evicted);
        true
    }
}
