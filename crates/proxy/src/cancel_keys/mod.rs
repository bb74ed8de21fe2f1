//! The cancel keys weir hands its clients: weir's own BackendKeyData for each
//! client, mapped to where that client's query is now (`server::cancel` is
//! the other half: it carries a cancel to Postgres with the server's key). A cancel for a queued query is answered
//! by weir and never reaches Postgres; one for a running query is forwarded
//! to that server with the server's own key.
//!
//! A client of protocol 3.2 gets a 32-byte random key, as Postgres 18 gives;
//! one of 3.0 or 3.1 gets 4 bytes. Either maps to whatever key the server
//! connection has.
//!
//! With `peer_id` set, every key carries it, in PgBouncer's layout (so weirs
//! and PgBouncers can be peers): the pid's second and third bytes hold the
//! id (low byte first), and the two low bits of the key's last byte a
//! forwarding budget, minted at 3. A CancelRequest for another peer's key is
//! sent on to that peer (`peers`) with the budget one less, and dropped when
//! it is spent or no `[peers]` entry owns the id: a request passes at most
//! three weirs, whatever their `[peers]` say, and a loop ends there.

mod peers;

use std::collections::hash_map::{Entry, HashMap};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use parking_lot::Mutex;
use std::time::Duration;

use rand::Rng;
use weir_metrics::{CancelOutcome, GlobalMetrics};

use crate::server::cancel::CancelTarget;
use crate::server::forward_cancel;

const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);

/// The length of the key weir mints for a 3.2 client: 32 random bytes, as
/// Postgres 18's own.
pub(crate) const LONG_KEY_LEN: usize = 32;

/// The length of a 3.0 key.
const SHORT_KEY_LEN: usize = 4;

/// A cancel key weir minted for a client (the secret half of BackendKeyData).
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct Secret {
    len: u8,
    bytes: [u8; LONG_KEY_LEN],
}

impl Secret {
    /// A random key; with peering, its forwarding budget set (`peers`).
    fn mint(rng: &mut impl Rng, long: bool, peering: bool) -> Secret {
        let len = if long { LONG_KEY_LEN } else { SHORT_KEY_LEN };
        let mut bytes = [0u8; LONG_KEY_LEN];
        rng.fill(&mut bytes[..len]);
        if peering {
            bytes[len - 1] |= peers::TTL_MASK;
        }
        Secret { len: len as u8, bytes }
    }

    /// The first four bytes, which tell two keys of one pid apart.
    fn tag(key: &[u8]) -> u32 {
        let mut t = [0u8; 4];
        let n = key.len().min(4);
        t[..n].copy_from_slice(&key[..n]);
        u32::from_be_bytes(t)
    }

    /// The key as BackendKeyData carries it.
    pub fn as_bytes(&self) -> &[u8] {
        &self.bytes[..usize::from(self.len)]
    }

    /// Whether a CancelRequest's key is this one; the comparison does not
    /// stop at the first byte that differs.
    fn matches(&self, key: &[u8]) -> bool {
        let mine = self.as_bytes();
        mine.len() == key.len() && mine.iter().zip(key).fold(0u8, |acc, (a, b)| acc | (a ^ b)) == 0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret({} bytes)", self.len)
    }
}

#[derive(Debug)]
enum Where {
    /// No query pending.
    Idle,
    /// Queued for a server; `cancelled` is set by a CancelRequest.
    Waiting { cancelled: bool },
    /// Running on a server.
    Active(CancelTarget),
}

/// Where a client's query is, and when its latest request began waiting
/// for a server (for SHOW CLIENTS' request_time and wait): one lock for
/// both, as each request sets both.
#[derive(Debug)]
struct At {
    query: Where,
    requested: Option<std::time::Instant>,
}

/// One client's entry.
#[derive(Debug)]
pub struct CancelSlot {
    at: Mutex<At>,
    /// KILL and the drain for the client's task, whose waker it also holds
    /// for a cancel of the queued query.
    pub switch: crate::signal::Switch,
}

impl CancelSlot {
    pub fn set_idle(&self) {
        self.at.lock().query = Where::Idle;
    }

    /// The client's request began waiting for a server at `now`.
    pub fn set_waiting(&self, now: std::time::Instant) {
        let mut at = self.at.lock();
        at.requested = Some(now);
        at.query = Where::Waiting { cancelled: false };
    }

    /// When the latest request began waiting for a server, if there was one.
    pub fn requested_at(&self) -> Option<std::time::Instant> {
        self.at.lock().requested
    }

    /// True if a cancel came while waiting; the wait should end with 57014.
    pub fn wait_cancelled(&self) -> bool {
        matches!(self.at.lock().query, Where::Waiting { cancelled: true })
    }

    /// Resolves once a cancel has come while waiting. Cancel-safe.
    pub async fn cancelled_in_queue(&self) {
        std::future::poll_fn(|cx| self.switch.poll_until(cx, || self.wait_cancelled())).await
    }

    /// Moves from waiting to running. Returns false, staying put, if a cancel
    /// arrived first: the query must then not run.
    pub fn set_active(&self, target: CancelTarget) -> bool {
        let mut at = self.at.lock();
        if matches!(at.query, Where::Waiting { cancelled: true }) {
            return false;
        }
        at.query = Where::Active(target);
        true
    }

    /// Where the client stands, for SHOW CLIENTS and the client gauges.
    pub fn client_state(&self) -> weir_metrics::ClientState {
        match self.at.lock().query {
            Where::Idle => weir_metrics::ClientState::Idle,
            Where::Waiting { .. } => weir_metrics::ClientState::Waiting,
            Where::Active(_) => weir_metrics::ClientState::Active,
        }
    }

    /// Cancels in flight to the server the client is using (0 if none).
    pub fn cancels_in_flight(&self) -> usize {
        match &self.at.lock().query {
            Where::Active(target) => target.gate.in_flight(),
            _ => 0,
        }
    }

    /// The backend pid of the server the client is using, if any.
    pub fn server_pid(&self) -> Option<i32> {
        match &self.at.lock().query {
            Where::Active(target) => Some(target.pid),
            _ => None,
        }
    }
}

/// Hashes a key's pid with one multiplication. The pids in the map are
/// weir's own random numbers (or servers' pids), so this spreads them as well as SipHash would,
/// and no client can choose them.
#[derive(Debug, Default)]
struct PidHasher(u64);

impl Hasher for PidHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_i32(&mut self, pid: i32) {
        self.write_u64(u64::from(pid as u32));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0 ^ n).wrapping_mul(0x9e37_79b9_7f4a_7c15);
    }
}

type Slots = HashMap<i32, (Secret, Arc<CancelSlot>), BuildHasherDefault<PidHasher>>;

/// Keys whose pid another client holds, by pid and the key's first bytes:
/// with peering a pid has 15 random bits, and past about 30,000 clients a
/// free one may not be found.
type SharedPids = HashMap<(i32, u32), (Secret, Arc<CancelSlot>)>;

/// How many random pids a new client tries before sharing one.
const PID_TRIES: usize = 64;

/// All clients' keys.
#[derive(Debug, Default)]
pub struct CancelKeys {
    slots: Mutex<Slots>,
    /// Keys sharing a pid with one in `slots` (only with peering, and only
    /// when nearly every pid is taken).
    shared: Mutex<SharedPids>,
    /// This weir's peer id (0: no peering), fixed for the process.
    peer_id: u16,
    /// Cancel requests in flight to each peer (`[peers]`' pool_size).
    peers: peers::PeerGates,
    pub metrics: GlobalMetrics,
}

/// Removes a client's key when dropped.
#[derive(Debug)]
pub struct Registration {
    registry: Arc<CancelKeys>,
    pub pid: i32,
    pub slot: Arc<CancelSlot>,
    /// Set when the key is in `CancelKeys::shared`, under this tag.
    shared_tag: Option<u32>,
}

impl Drop for Registration {
    fn drop(&mut self) {
        match self.shared_tag {
            Some(tag) => {
                self.registry.shared.lock().remove(&(self.pid, tag));
            }
            None => {
                self.registry.slots.lock().remove(&self.pid);
            }
        }
    }
}

impl CancelKeys {
    pub fn new() -> Arc<Self> {
        Arc::new(CancelKeys::default())
    }

    /// The keys of a weir with `peer_id` (0: no peering).
    pub fn for_peer(peer_id: u16) -> Arc<Self> {
        Arc::new(CancelKeys { peer_id, ..CancelKeys::default() })
    }

    /// Gives a new client a unique random key (a 4-byte secret, as 3.0's).
    pub fn register(self: &Arc<Self>) -> Registration {
        self.register_as(None, false).0
    }

    /// Gives a new client a key with `pid` (a session-mode client's server's
    /// own pid) if no other client holds that pid, else a random one; the
    /// secret is always weir's: 32 random bytes when `long` (protocol 3.2),
    /// else 4. The secret comes back beside the registration, for the
    /// greeting only: the client's task does not keep it.
    pub fn register_as(self: &Arc<Self>, mut pid: Option<i32>, long: bool) -> (Registration, Secret) {
        let slot = Arc::new(CancelSlot {
            at: Mutex::new(At { query: Where::Idle, requested: None }),
            switch: Default::default(),
        });
        let mut rng = rand::thread_rng();
        let peering = self.peer_id != 0;
        if peering {
            // The pid carries the peer id: not the server's.
            pid = None;
        }
        let mut slots = self.slots.lock();
        for _ in 0..PID_TRIES {
            let pid = pid.take().unwrap_or_else(|| peers::mint_pid(&mut rng, self.peer_id));
            if let Entry::Vacant(free) = slots.entry(pid) {
                let secret = Secret::mint(&mut rng, long, peering);
                free.insert((secret, slot.clone()));
                return (Registration { registry: self.clone(), pid, slot, shared_tag: None }, secret);
            }
        }
        drop(slots);
        // Nearly every pid is taken (peering, tens of thousands of
        // clients): share one, told apart by the key's first bytes.
        let mut shared = self.shared.lock();
        loop {
            let pid = peers::mint_pid(&mut rng, self.peer_id);
            let secret = Secret::mint(&mut rng, long, peering);
            let tag = Secret::tag(secret.as_bytes());
            if let Entry::Vacant(free) = shared.entry((pid, tag)) {
                free.insert((secret, slot.clone()));
                return (Registration { registry: self.clone(), pid, slot, shared_tag: Some(tag) }, secret);
            }
        }
    }

    /// The peers cancels went to: (peer id, forwards under way, waiting for
    /// their turn under the peer's pool_size), for SHOW PEER_POOLS.
    pub fn peer_forwards(&self) -> Vec<(u16, usize, usize)> {
        self.peers.shown()
    }

    /// Handles a CancelRequest as it came: for this weir's own key, `cancel`;
    /// for another peer's, sends it on to that peer (`[peers]` in `cfg`);
    /// else drops it. The handle, if any, is the forward's.
    pub fn route(
        self: &Arc<Self>,
        cfg: &crate::config::Config,
        pid: i32,
        key: &[u8],
    ) -> Option<tokio::task::JoinHandle<()>> {
        match peers::route(self.peer_id, pid, key) {
            peers::Route::Local(key) => self.cancel(pid, &key).1,
            peers::Route::Peer { id, key } => match cfg.peer(id) {
                Some(peer) => {
                    self.metrics.record_cancel(CancelOutcome::Peer);
                    Some(self.peers.forward(id, peer, cfg.weir.default_pool_size, pid, key))
                }
                None => {
                    tracing::info!(peer = id, "cancel request for a peer [peers] does not list: dropped");
                    self.metrics.record_cancel(CancelOutcome::Unknown);
                    None
                }
            },
            peers::Route::Drop(why) => {
                tracing::info!("cancel request dropped: {why}");
                self.metrics.record_cancel(CancelOutcome::Unknown);
                None
            }
        }
    }

    /// Handles a CancelRequest. Never blocks on Postgres: a cancel for a
    /// running query is forwarded by a task of its own, whose handle comes
    /// back so that the caller can hold the client's cancel connection open
    /// until Postgres has signalled the backend, as Postgres itself does
    /// (libpq, pgx and pgjdbc take the close as "delivered"; answering sooner
    /// let a late cancel hit the client's next query).
    pub fn cancel(&self, pid: i32, key: &[u8]) -> (CancelOutcome, Option<tokio::task::JoinHandle<()>>) {
        let found = match self.slots.lock().get(&pid) {
            Some((s, slot)) if s.matches(key) => Some(slot.clone()),
            _ => None,
        };
        let found = found.or_else(|| {
            let shared = self.shared.lock();
            shared.get(&(pid, Secret::tag(key))).filter(|(s, _)| s.matches(key)).map(|(_, slot)| slot.clone())
        });
        let Some(slot) = found else {
            self.metrics.record_cancel(CancelOutcome::Unknown);
            return (CancelOutcome::Unknown, None);
        };
        let (outcome, forwarding) = {
            let mut at = slot.at.lock();
            match &mut at.query {
                Where::Waiting { cancelled } => {
                    *cancelled = true;
                    slot.switch.wake();
                    (CancelOutcome::AnsweredLocally, None)
                }
                Where::Active(target) => {
                    // Shut the server's gate now, under the slot lock
                    // (forward_cancel takes its ticket when called, not when
                    // polled): the session marks itself idle (and returns the
                    // server) only after taking this lock, so the server
                    // cannot reach the next client before this cancel has
                    // been answered.
                    let forward = forward_cancel(target.clone(), FORWARD_TIMEOUT);
                    let task = tokio::spawn(async move {
                        if let Err(e) = forward.await {
                            tracing::warn!(error = %e, "forwarding a cancel request failed");
                        }
                    });
                    (CancelOutcome::Forwarded, Some(task))
                }
                Where::Idle => (CancelOutcome::AnsweredLocally, None),
            }
        };
        self.metrics.record_cancel(outcome);
        (outcome, forwarding)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> crate::config::Config {
        crate::config::Config::from_toml(&format!("[weir]\nauth_type = \"trust\"\n{text}"), std::path::Path::new("."))
            .unwrap()
    }

    /// A peer's keys carry its id and a full forwarding budget; a request
    /// that spent some of it still finds its client; a key of an unknown
    /// peer, or with its budget spent, is dropped.
    #[tokio::test]
    async fn peers_keys_route_home_and_strangers_are_dropped() {
        let keys = CancelKeys::for_peer(300);
        let cfg = cfg("peer_id = 300\n[peers.7]\nhost = \"/nonexistent\"\n");
        for long in [false, true] {
            let (reg, secret) = keys.register_as(Some(4242), long);
            assert_ne!(reg.pid, 4242, "with peering the pid carries the id, never the server's");
            assert_eq!(peers::owner(reg.pid), 300);
            assert_eq!(secret.as_bytes().last().unwrap() & peers::TTL_MASK, peers::TTL_MASK);
            reg.slot.set_waiting(std::time::Instant::now());
            let mut spent = secret.as_bytes().to_vec();
            *spent.last_mut().unwrap() &= !peers::TTL_MASK;
            assert!(keys.route(&cfg, reg.pid, &spent).is_none(), "answered here");
            assert!(reg.slot.wait_cancelled(), "the request found its client");
        }
        let stranger = i32::from_be_bytes([1, 9, 0, 1]);
        assert!(keys.route(&cfg, stranger, &[1, 2, 3, 3]).is_none());
        assert_eq!(keys.metrics.cancels(CancelOutcome::Unknown), 1, "peer 9 is nobody's: dropped");
        let of_seven = i32::from_be_bytes([1, 7, 0, 1]);
        assert!(keys.route(&cfg, of_seven, &[1, 2, 3, 0]).is_none(), "its budget is spent");
        let forward = keys.route(&cfg, of_seven, &[1, 2, 3, 3]).expect("sent on to peer 7");
        forward.await.unwrap();
        assert_eq!(keys.metrics.cancels(CancelOutcome::Peer), 1);
    }

    /// With every pid taken, new clients share pids and are told apart by
    /// their keys.
    #[tokio::test]
    async fn a_full_pid_space_shares_pids() {
        let keys = CancelKeys::for_peer(1);
        let regs: Vec<_> = (0..40_000).map(|_| keys.register_as(None, false)).collect();
        assert!(!keys.shared.lock().is_empty(), "some share a pid");
        for (reg, secret) in regs.iter().step_by(997) {
            reg.slot.set_waiting(std::time::Instant::now());
            assert_eq!(keys.cancel(reg.pid, secret.as_bytes()).0, CancelOutcome::AnsweredLocally);
        }
        drop(regs);
        assert!(keys.slots.lock().is_empty() && keys.shared.lock().is_empty());
    }

    #[tokio::test]
    async fn long_keys_for_3_2_and_exact_matches_only() {
        let keys = CancelKeys::new();
        let (long, long_secret) = keys.register_as(None, true);
        let (short, short_secret) = keys.register_as(None, false);
        assert_eq!(long_secret.as_bytes().len(), LONG_KEY_LEN);
        assert_eq!(short_secret.as_bytes().len(), 4);
        assert_ne!(long_secret.as_bytes(), &[0u8; LONG_KEY_LEN], "random bytes");
        let key = long_secret.as_bytes().to_vec();
        assert_eq!(keys.cancel(long.pid, &key).0, CancelOutcome::AnsweredLocally);
        assert_eq!(keys.cancel(long.pid, &key[..4]).0, CancelOutcome::Unknown, "a prefix is not the key");
        let mut flipped = key.clone();
        flipped[31] ^= 1;
        assert_eq!(keys.cancel(long.pid, &flipped).0, CancelOutcome::Unknown);
        assert_eq!(keys.cancel(short.pid, short_secret.as_bytes()).0, CancelOutcome::AnsweredLocally);
        let mut padded = short_secret.as_bytes().to_vec();
        padded.extend_from_slice(&[0; 28]);
        assert_eq!(keys.cancel(short.pid, &padded).0, CancelOutcome::Unknown, "a 4-byte key padded");
    }
}
