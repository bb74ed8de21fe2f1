//! `max_db_connections` across users: a pool whose clients wait while the
//! database is at its cap takes room from another user's pool of the same
//! database, by closing that pool's longest-idle connection (reason
//! `evicted`; PgBouncer's evict_connection does the same). Without it, a
//! pool that got there first would keep every slot while idle, and the
//! other users' logins and queries would wait out their budgets. The
//! evicted backend is ended (Terminate, then its socket's close) before its
//! place is given away, so the database never has a backend more than
//! max_db_connections, not even while one exits.
//!
//! A held-back pool does not wait for its next upkeep (500 ms): when a
//! connection of the database closes, or one goes idle in another pool,
//! the held-back pools are woken at once to connect or to evict it.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Weak};
use std::time::Duration;

use bytes::BytesMut;
use weir_metrics::CloseReason;

use super::state::State;
use super::Pool;
use crate::protocol::messages;
use crate::server::exchange::write;
use crate::server::ServerConn;

/// The longest weir waits for an evicted backend to close its socket.
const GOODBYE_LIMIT: Duration = Duration::from_secs(1);

impl Pool {
    /// Called (lock held) when max_db_connections refused a connect that
    /// demand calls for. The eviction runs in its own task, so no two pool
    /// locks are ever held together; then this pool tries again.
    pub(super) fn make_room(self: &Arc<Self>, st: &mut State) {
        self.db_servers.blocked.store(true, Ordering::Release);
        if st.evicting {
            return;
        }
        st.evicting = true;
        let pool = self.clone();
        tokio::spawn(async move {
            let freed = match pool.evict_from_siblings() {
                Some(conn) => {
                    goodbye(conn).await;
                    true
                }
                None => false,
            };
            let mut st = pool.state.lock();
            st.evicting = false;
            if freed {
                pool.want_connects(&mut st);
            }
        });
    }

    /// A place in the database's count freed up, or a connection went idle
    /// that a held-back pool could evict: the database's other pools run
    /// their connects now. One load while no pool is held back; else a task,
    /// since callers may hold this pool's lock and no two pool locks are
    /// ever held together.
    pub(super) fn wake_blocked_siblings(self: &Arc<Self>) {
        let blocked = &self.db_servers.blocked;
        if !blocked.load(Ordering::Acquire) || !blocked.swap(false, Ordering::AcqRel) {
            return;
        }
        let pool = self.clone();
        tokio::spawn(async move {
            for p in pool.siblings() {
                let mut st = p.state.lock();
                p.want_connects(&mut st);
            }
        });
    }

    /// The other live pools of this database.
    fn siblings(self: &Arc<Self>) -> Vec<Arc<Pool>> {
        let mut pools = self.db_servers.pools.lock();
        pools.retain(|p| p.strong_count() > 0);
        pools.iter().filter_map(Weak::upgrade).filter(|p| !Arc::ptr_eq(p, self)).collect()
    }

    /// Takes one idle connection of another pool of this database.
    fn evict_from_siblings(self: &Arc<Self>) -> Option<Box<ServerConn>> {
        self.siblings().iter().find_map(|p| p.evict_idle())
    }

    /// Takes this pool's longest-idle connection, unless the pool is at
    /// min_pool_size or has none idle.
    fn evict_idle(&self) -> Option<Box<ServerConn>> {
        let conn = {
            let mut st = self.state.lock();
            if st.idle.is_empty() || st.total() <= st.opts.settings.min_pool_size {
                return None;
            }
            // The idle stack lends from the top: the bottom waited longest.
            st.idle.remove(0)
        };
        crate::span::client_event!(info,
            database = %self.key.database,
            user = %self.key.user,
            "closing an idle server connection to make room under max_db_connections"
        );
        Some(conn)
    }
}

/// Ends an evicted connection: Terminate, then wait (at most
/// `GOODBYE_LIMIT`) for Postgres to close the socket, which it does once the
/// backend has left pg_stat_activity; only then does the connection's place
/// in the database's count free up (on close).
async fn goodbye(mut conn: Box<ServerConn>) {
    let mut out = BytesMut::new();
    messages::terminate(&mut out);
    let wait = async {
        if write(&mut conn, &out).await.is_ok() {
            while crate::wire::fill(&mut conn.stream, &mut conn.rbuf).await.is_ok() {
                conn.rbuf.clear();
            }
        }
    };
    let _ = tokio::time::timeout(GOODBYE_LIMIT, wait).await;
    conn.close(CloseReason::Evicted);
}
