//! `max_db_connections` across users, and `max_user_connections` across
//! databases: a pool whose clients wait while the database (or the user) is
//! at its cap takes room from another pool of the same database (or of the
//! same user), by closing that pool's longest-idle connection (reason
//! `evicted`; PgBouncer's evict_connection and evict_user_connection do the
//! same). Without it, a pool that got there first would keep every slot
//! while idle, and the others' logins and queries would wait out their
//! budgets. The evicted backend is ended (Terminate, then its socket's
//! close) before its place is given away, so the database never has a
//! backend more than the cap, not even while one exits.
//!
//! The place freed goes to the pool that evicted, not to whichever pool
//! asks first: the evicted connection's count slot moves into the evicting
//! pool's next connect (`room::Room`, in the pool's `State`), which is made even if its waiter
//! was served meanwhile (PgBouncer launches right after it evicts).
//! Otherwise two held-back pools could each evict while the other took the
//! freed place, or the place could go unused, and the database would end one
//! server short of its cap. A pool evicts only while it still has demand it
//! cannot serve.
//!
//! A held-back pool does not wait for its next upkeep (500 ms): when a
//! connection of the database or user closes, or one goes idle in another
//! pool, the held-back pools are woken at once to connect or to evict it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use weir_metrics::CloseReason;

use super::pools::DbCount;
use super::room::Cap;
use super::state::State;
use super::Pool;
use crate::server::exchange::goodbye;
use crate::server::ServerConn;

/// The longest weir waits for an evicted backend to close its socket.
const GOODBYE_LIMIT: Duration = Duration::from_secs(1);

impl Pool {
    fn counts(&self, cap: Cap) -> &Arc<DbCount> {
        match cap {
            Cap::Db => &self.db_servers,
            Cap::User => &self.user_servers,
        }
    }

    /// Called (lock held) when `cap` refused a connect that demand calls
    /// for. The eviction runs in its own task, so no two pool locks are ever
    /// held together; then this pool tries again with the freed place.
    pub(super) fn make_room(self: &Arc<Self>, st: &mut State, cap: Cap) {
        self.counts(cap).blocked.store(true, Ordering::Release);
        if !st.begin_eviction() {
            return;
        }
        let pool = self.clone();
        tokio::spawn(async move {
            // Demand may have gone (a server came back) since the refusal.
            let still_needed = pool.state.lock().unmet_demand() > 0;
            let evicted = if still_needed { pool.evict_from_siblings(cap) } else { None };
            let freed = match evicted {
                Some(mut conn) => {
                    let slot = match cap {
                        Cap::Db => conn.take_db_slot(),
                        Cap::User => conn.take_user_slot(),
                    };
                    goodbye(conn, GOODBYE_LIMIT, CloseReason::Evicted).await;
                    slot
                }
                None => None,
            };
            let mut st = pool.state.lock();
            st.end_eviction();
            if let Some(slot) = freed {
                st.room_mut().give(cap, slot);
                // Used by the next connect, or (demand went meanwhile) given
                // back to the count there.
                pool.want_connects(&mut st);
            }
        });
    }

    /// A place in the database's or user's count freed up, or a connection
    /// went idle that a held-back pool could evict: the other pools run
    /// their connects now. Two loads while no pool is held back; else a
    /// task, since callers may hold this pool's lock and no two pool locks
    /// are ever held together.
    pub(super) fn wake_blocked_siblings(self: &Arc<Self>) {
        for cap in [Cap::Db, Cap::User] {
            let blocked = &self.counts(cap).blocked;
            if !blocked.load(Ordering::Acquire) || !blocked.swap(false, Ordering::AcqRel) {
                continue;
            }
            let pool = self.clone();
            tokio::spawn(async move {
                for p in pool.siblings(cap) {
                    let mut st = p.state.lock();
                    p.want_connects(&mut st);
                }
            });
        }
    }

    /// The other live pools of this database (or user).
    fn siblings(self: &Arc<Self>, cap: Cap) -> Vec<Arc<Pool>> {
        let mut pools = self.counts(cap).pools.lock();
        pools.retain(|p| p.strong_count() > 0);
        pools.iter().filter_map(Weak::upgrade).filter(|p| !Arc::ptr_eq(p, self)).collect()
    }

    /// Takes the longest-idle connection among the other pools of this
    /// database (or user), as PgBouncer picks it.
    fn evict_from_siblings(self: &Arc<Self>, cap: Cap) -> Option<Box<ServerConn>> {
        let mut candidates: Vec<(Instant, Arc<Pool>)> =
            self.siblings(cap).into_iter().filter_map(|p| Some((p.oldest_idle()?, p))).collect();
        candidates.sort_by_key(|(at, _)| *at);
        let conn = candidates.iter().find_map(|(_, p)| p.evict_idle())?;
        crate::span::client_event!(info,
            database = %self.key.database,
            user = %self.key.user,
            server = conn.id,
            "closing because: evicted (an idle server connection makes room under {})",
            cap.key()
        );
        Some(conn)
    }

    /// When this pool's longest-idle connection was last used, if it may
    /// give one up.
    fn oldest_idle(&self) -> Option<Instant> {
        let st = self.state.lock();
        if st.total() <= st.opts.settings.min_pool_size {
            return None;
        }
        st.idle().first().map(|c| c.last_used())
    }

    /// Takes this pool's longest-idle connection, unless the pool is at
    /// min_pool_size or has none idle.
    fn evict_idle(&self) -> Option<Box<ServerConn>> {
        let mut st = self.state.lock();
        if st.total() <= st.opts.settings.min_pool_size {
            return None;
        }
        // The idle stack lends from the top: the bottom waited longest.
        st.take_longest_idle()
    }
}
