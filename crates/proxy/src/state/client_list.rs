//! The list of logged-in clients (not the pools, `pool::Pools`, nor the
//! cancel keys, `cancel_keys`), for `SHOW CLIENTS`, `KILL`, the drain
//! at shutdown and the `weir_pool_clients` gauge. A client is listed from
//! login until its `ClientGuard` drops; where it stands (idle, waiting,
//! active) is read from its cancel slot, which the session keeps current.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::{Instant, SystemTime};

use weir_metrics::{ClientState, ConnAddr};

use crate::cancel_keys::CancelSlot;
use crate::pool::{Pool, PoolKey, Pools};
use crate::protocol::replication::Replication;

/// Whose client it is: a pool's (its database and user are the pool's), or
/// the admin console's (boxed: the rare case, and every entry has the size
/// of the larger).
#[derive(Debug)]
pub(crate) enum Owner {
    Pool(Arc<Pool>),
    Console(Box<PoolKey>),
}

impl Owner {
    fn key(&self) -> &PoolKey {
        match self {
            Owner::Pool(pool) => &pool.key,
            Owner::Console(key) => key,
        }
    }
}

/// What is known about one logged-in client.
#[derive(Debug)]
pub(crate) struct ClientEntry {
    pub id: u64,
    /// The registry it is listed in (for `ClientGuard`'s drop).
    registry: std::sync::Weak<ClientList>,
    owner: Owner,
    pub peer: ConnAddr,
    pub local: Option<ConnAddr>,
    pub application_name: String,
    pub connected_at: SystemTime,
    /// The BackendKeyData pid weir gave this client.
    pub key_pid: i32,
    /// An admin console client (not in any pool).
    pub console: bool,
    /// The client's cancel slot, which also holds its KILL/drain switch
    /// (None for console clients).
    slot: Option<Arc<CancelSlot>>,
    /// A replication client (its server is its own, never pooled).
    pub replication: Replication,
    /// Its place in the per-database and per-user client counts, given
    /// back when the entry goes.
    counted_as: Option<super::caps::CapGuard>,
}

impl ClientEntry {
    /// The user the client logged in as (a forced user's pool is keyed on
    /// the forced user; SHOW CLIENTS names the client's own, as PgBouncer).
    pub(crate) fn user(&self) -> &str {
        self.counted_as.as_ref().map_or(&self.owner.key().user, |c| c.user())
    }

    /// The user of the client's pool (a forced user, if its database has one).
    pub(crate) fn pool_user(&self) -> &str {
        &self.owner.key().user
    }

    pub(crate) fn database(&self) -> &str {
        &self.owner.key().database
    }

    /// Idle, waiting or active (console clients are always active).
    pub(crate) fn state(&self) -> ClientState {
        self.slot.as_ref().map_or(ClientState::Active, |s| s.client_state())
    }

    /// Cancels in flight to the server this client is using.
    pub(crate) fn cancels_in_flight(&self) -> usize {
        self.slot.as_ref().map_or(0, |s| s.cancels_in_flight())
    }

    /// When the client's latest request began waiting for a server.
    pub(crate) fn requested_at(&self) -> Option<Instant> {
        self.slot.as_ref().and_then(|s| s.requested_at())
    }

    /// The backend pid of the server this client is using, if any.
    pub(crate) fn server_pid(&self) -> Option<i32> {
        self.slot.as_ref().and_then(|s| s.server_pid())
    }

    /// Asks the client's task to disconnect it, telling it `why`.
    pub(crate) fn kill(&self, why: &'static str) {
        if let Some(slot) = &self.slot {
            slot.switch.kill(why);
        }
    }
}

/// Why client_idle_timeout ends a client: PgBouncer's text, sent with its
/// SQLSTATE (08P01, where KILL and a drain send 57P01).
pub(crate) const IDLE_TIMEOUT: &str = "client_idle_timeout";

/// Why server_fast_close ends a session client at RECONNECT: PgBouncer's
/// text, sent with its SQLSTATE (08P01).
pub(crate) const FAST_CLOSE: &str = "database configuration changed";

/// The SQLSTATE a client ended by weir is told: PgBouncer's 08P01 for the
/// reasons that are PgBouncer's own, 57P01 (Postgres's administrator
/// shutdown) for KILL and a drain.
pub(crate) fn farewell_code(why: &str) -> crate::protocol::sqlstate::SqlState {
    use crate::protocol::sqlstate;
    if why == IDLE_TIMEOUT || why == FAST_CLOSE {
        sqlstate::PROTOCOL_VIOLATION
    } else {
        sqlstate::ADMIN_SHUTDOWN
    }
}

/// The details a client registers with.
#[derive(Debug)]
pub(crate) struct NewClient {
    /// Its connection id (`server::next_socket_id`, taken at login).
    pub id: u64,
    pub owner: Owner,
    pub peer: ConnAddr,
    pub local: Option<ConnAddr>,
    pub application_name: String,
    pub key_pid: i32,
    pub slot: Option<Arc<CancelSlot>>,
    pub replication: Replication,
    pub counted: Option<super::caps::CapGuard>,
}

/// Pooled clients of one (database, user) by where they stand.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct ClientCounts {
    pub(crate) idle: i64,
    pub(crate) active: i64,
    pub(crate) waiting: i64,
}

/// All logged-in clients.
#[derive(Debug, Default)]
pub(crate) struct ClientList {
    clients: Mutex<BTreeMap<u64, Arc<ClientEntry>>>,
}

/// Keeps a client listed; dropping it removes the entry. One pointer (the
/// entry knows its registry): every idle client's task holds one.
#[derive(Debug)]
pub(crate) struct ClientGuard {
    pub entry: Arc<ClientEntry>,
}

impl Drop for ClientGuard {
    fn drop(&mut self) {
        if let Some(registry) = self.entry.registry.upgrade() {
            registry.clients.lock().remove(&self.entry.id);
        }
    }
}

impl ClientList {
    pub(crate) fn new() -> Arc<Self> {
        Arc::new(ClientList::default())
    }

    /// Lists a client until the returned guard drops.
    pub(crate) fn register(self: &Arc<Self>, c: NewClient) -> ClientGuard {
        let id = c.id;
        let entry = Arc::new(ClientEntry {
            id,
            registry: Arc::downgrade(self),
            console: c.slot.is_none(),
            owner: c.owner,
            peer: c.peer,
            local: c.local,
            application_name: c.application_name,
            connected_at: SystemTime::now(),
            key_pid: c.key_pid,
            slot: c.slot,
            replication: c.replication,
            counted_as: c.counted,
        });
        self.clients.lock().insert(id, entry.clone());
        ClientGuard { entry }
    }

    /// Every listed client, oldest first.
    pub(crate) fn all(&self) -> Vec<Arc<ClientEntry>> {
        self.clients.lock().values().cloned().collect()
    }

    pub(crate) fn len(&self) -> usize {
        self.clients.lock().len()
    }

    /// Kills the pooled client with connection id `id`; false when there is
    /// no such client (a console client is not killed: false as well).
    pub(crate) fn kill_id(&self, id: u64, why: &'static str) -> bool {
        let found = self.clients.lock().get(&id).filter(|c| !c.console).cloned();
        found.inspect(|c| c.kill(why)).is_some()
    }

    /// Kills the pooled clients of `database` (every pooled client when None).
    /// Returns how many were told to go.
    pub(crate) fn kill_database(&self, database: Option<&str>, why: &'static str) -> usize {
        let doomed: Vec<_> =
            self.all().into_iter().filter(|c| !c.console && database.is_none_or(|d| c.database() == d)).collect();
        doomed.iter().for_each(|c| c.kill(why));
        doomed.len()
    }

    /// client_idle_timeout (PgBouncer's): kills the pooled clients that hold
    /// no server and whose latest request (or login, if none) began at least
    /// `timeout` ago. Returns how many. Runs every gauge tick.
    pub(crate) fn kill_idle(&self) -> usize {
        let (now, wall) = (Instant::now(), SystemTime::now());
        let idle_for = |c: &ClientEntry| match c.requested_at() {
            Some(at) => now.saturating_duration_since(at),
            None => wall.duration_since(c.connected_at).unwrap_or_default(),
        };
        // Each pool's limit (its user's own, or `[weir]`'s), read once per pool.
        let mut limits: HashMap<*const Pool, std::time::Duration> = HashMap::new();
        let mut limit =
            |pool: &Arc<Pool>| *limits.entry(Arc::as_ptr(pool)).or_insert_with(|| pool.client_idle_timeout());
        let doomed: Vec<_> = self
            .all()
            .into_iter()
            .filter(|c| {
                let Owner::Pool(pool) = &c.owner else { return false };
                let timeout = limit(pool);
                !timeout.is_zero() && c.state() == ClientState::Idle && idle_for(c) >= timeout
            })
            .collect();
        doomed.iter().for_each(|c| c.kill(IDLE_TIMEOUT));
        doomed.len()
    }

    /// server_fast_close after RECONNECT: kills the pooled clients of
    /// `pools` (session-mode pools, whose clients hold their server for
    /// life; the list cannot tell whether one is inside a transaction, so
    /// one that is loses it, where PgBouncer waits for its end). Returns how
    /// many.
    pub(crate) fn kill_of_pools(&self, pools: &[Arc<Pool>], why: &'static str) -> usize {
        let doomed: Vec<_> = self
            .all()
            .into_iter()
            .filter(|c| matches!(&c.owner, Owner::Pool(p) if pools.iter().any(|q| Arc::ptr_eq(p, q))))
            .collect();
        doomed.iter().for_each(|c| c.kill(why));
        doomed.len()
    }

    /// Wakes every pooled client for the drain: idle ones leave at once,
    /// busy ones after their transaction (they check the drain flag, which
    /// is set before this runs, before each request).
    pub(crate) fn wake_for_drain(&self) {
        for c in self.all() {
            if let Some(slot) = &c.slot {
                slot.switch.drain();
            }
        }
    }

    /// Idle, active and waiting pooled clients per (database, user), in one
    /// pass under the list's lock, so the three add up to the clients there
    /// are even while other worker threads move clients between them.
    /// Counted by pool (a pointer's hash per client; nothing cloned), then
    /// by key once per pool, so a pool that a reload replaced still counts
    /// toward its (database, user). This runs every gauge tick over every
    /// client: with 1,000 clients, collecting their entries and hashing two
    /// strings each was 2 % of weir's instructions at pgbench -c 1000.
    pub(crate) fn states(&self) -> HashMap<(String, String), ClientCounts> {
        let clients = self.clients.lock();
        let mut by_pool: HashMap<*const PoolKey, (&PoolKey, ClientCounts)> = HashMap::new();
        for c in clients.values() {
            // Console clients have no slot, and are not pooled clients.
            let Some(slot) = &c.slot else { continue };
            let key = c.owner.key();
            let e = &mut by_pool.entry(std::ptr::from_ref(key)).or_insert((key, ClientCounts::default())).1;
            match slot.client_state() {
                ClientState::Idle => e.idle += 1,
                ClientState::Active => e.active += 1,
                ClientState::Waiting => e.waiting += 1,
            }
        }
        let mut counts: HashMap<(String, String), ClientCounts> = HashMap::with_capacity(by_pool.len());
        for (key, n) in by_pool.into_values() {
            let e = counts.entry((key.database.clone(), key.user.clone())).or_default();
            e.idle += n.idle;
            e.active += n.active;
            e.waiting += n.waiting;
        }
        counts
    }

    /// Sets the idle and active client gauges of every pool from the listed
    /// clients. (The waiting gauge comes from each pool's own queue.)
    pub(crate) fn publish_gauges(&self, pools: &Pools) {
        let counts = self.states();
        for pool in pools.all() {
            let n = counts.get(&(pool.key.database.clone(), pool.key.user.clone())).copied().unwrap_or_default();
            let m = &pool.metrics;
            m.add_clients(ClientState::Idle, n.idle - m.clients(ClientState::Idle));
            m.add_clients(ClientState::Active, n.active - m.clients(ClientState::Active));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use std::sync::atomic::{AtomicU64, Ordering};

    static NEXT_TEST_ID: AtomicU64 = AtomicU64::new(1);

    fn client(db: &str, slot: Option<Arc<CancelSlot>>) -> NewClient {
        NewClient {
            id: NEXT_TEST_ID.fetch_add(1, Ordering::Relaxed),
            owner: Owner::Console(Box::new(PoolKey { user: "u".into(), database: db.into() })),
            peer: "127.0.0.1:1".parse::<std::net::SocketAddr>().unwrap().into(),
            local: None,
            application_name: String::new(),
            key_pid: 1,
            slot,
            replication: Replication::None,
            counted: None,
        }
    }

    #[tokio::test]
    async fn registers_kills_and_forgets() {
        let reg = ClientList::new();
        let cancels = crate::cancel_keys::CancelKeys::new();
        let (ka, kb) = (cancels.register(), cancels.register());
        let a = reg.register(client("a", Some(ka.slot.clone())));
        let _b = reg.register(client("b", Some(kb.slot.clone())));
        let console = reg.register(client("weir", None));
        assert_eq!(reg.len(), 3);
        assert_eq!(a.entry.state(), ClientState::Idle);
        assert_eq!(console.entry.state(), ClientState::Active);
        assert_eq!(reg.kill_database(Some("a"), "bye"), 1);
        assert_eq!(std::future::poll_fn(|cx| ka.slot.switch.poll_killed(cx)).await, "bye");
        assert!(!kb.slot.switch.is_killed());
        assert_eq!(reg.kill_database(None, "all"), 2, "console clients are not pooled clients");
        drop(a);
        assert_eq!(reg.all().iter().map(|c| c.database()).collect::<Vec<_>>(), vec!["b", "weir"]);
    }

    #[test]
    fn counts_states_per_key_without_console_clients() {
        let reg = ClientList::new();
        let cancels = crate::cancel_keys::CancelKeys::new();
        let (ka, kb, kc) = (cancels.register(), cancels.register(), cancels.register());
        let _a = reg.register(client("a", Some(ka.slot.clone())));
        let _a2 = reg.register(client("a", Some(kb.slot.clone())));
        let _b = reg.register(client("b", Some(kc.slot.clone())));
        let _console = reg.register(client("weir", None));
        kc.slot.set_waiting(Instant::now());
        let counts = reg.states();
        let key = |db: &str| (db.to_string(), "u".to_string());
        // Two entries with their own keys, one (database, user): summed.
        assert_eq!(counts.get(&key("a")), Some(&ClientCounts { idle: 2, active: 0, waiting: 0 }));
        assert_eq!(counts.get(&key("b")), Some(&ClientCounts { idle: 0, active: 0, waiting: 1 }));
        assert_eq!(counts.get(&key("weir")), None, "console clients are not pooled clients");
        assert_eq!(counts.len(), 2);
    }

    #[test]
    fn pgbouncers_own_reasons_keep_its_sqlstate() {
        assert_eq!(farewell_code(IDLE_TIMEOUT).0, "08P01");
        assert_eq!(farewell_code(FAST_CLOSE).0, "08P01");
        assert_eq!(farewell_code("terminating connection due to administrator command (KILL)").0, "57P01");
    }
}
