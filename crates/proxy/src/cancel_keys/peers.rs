//! Cancel keys among peers: where a key says it was minted (its pid's
//! second and third bytes, PgBouncer's layout), the forwarding budget in the
//! two low bits of its last byte, and the forward itself: the CancelRequest,
//! budget one less, on a new connection to the peer's address (TCP, or the
//! peer's Unix socket when its `host` is a folder), held until the peer
//! closes it (as Postgres does once the backend is signalled), at most
//! `pool_size` at once per peer and `FORWARD_LIMIT` each.

use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::Rng;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::Semaphore;

use crate::config::Peer;
use crate::protocol::messages;

/// The key's last byte's bits that count the forwards left (3 when minted).
pub(super) const TTL_MASK: u8 = 0x03;

/// How long a forward may take, from the wait for its turn to the peer's close.
const FORWARD_LIMIT: Duration = Duration::from_secs(5);

/// A new pid: random and positive (pg_basebackup once took a negative pid
/// for an error), with `peer_id` in its second and third bytes when peering.
pub(super) fn mint_pid(rng: &mut impl Rng, peer_id: u16) -> i32 {
    if peer_id == 0 {
        return rng.gen_range(1..i32::MAX);
    }
    let mut b: [u8; 4] = rng.gen();
    b[0] &= 0x7f;
    [b[1], b[2]] = peer_id.to_le_bytes();
    i32::from_be_bytes(b)
}

/// The peer a key's pid names.
pub(super) fn owner(pid: i32) -> u16 {
    let b = pid.to_be_bytes();
    u16::from_le_bytes([b[1], b[2]])
}

/// Where a CancelRequest goes.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Route {
    /// This weir's own key, its budget bits as minted, to look up here.
    Local(Vec<u8>),
    /// Another peer's: the key to send it, with one forward less.
    Peer { id: u16, key: Vec<u8> },
    /// Nowhere (why).
    Drop(&'static str),
}

/// Routes a CancelRequest for `pid` and `key` at a weir whose peer id is
/// `own` (0: no peering: always here, the key as it came).
pub(super) fn route(own: u16, pid: i32, key: &[u8]) -> Route {
    let Some(&last) = key.last() else { return Route::Drop("an empty key") };
    if own == 0 {
        return Route::Local(key.to_vec());
    }
    let id = owner(pid);
    let mut key = key.to_vec();
    if id == own {
        // Minted here with a full budget; the request may have spent some.
        *key.last_mut().expect("not empty") = last | TTL_MASK;
        return Route::Local(key);
    }
    if last & TTL_MASK == 0 {
        return Route::Drop("forwarded three times already (a loop in [peers]?)");
    }
    *key.last_mut().expect("not empty") = last - 1;
    Route::Peer { id, key }
}

/// One peer's gate: its pool_size of forwards at once, and how many are
/// under way and waiting (SHOW PEER_POOLS).
#[derive(Debug)]
struct Gate {
    size: u32,
    turns: Semaphore,
    active: AtomicUsize,
    waiting: AtomicUsize,
}

/// Counts one forward under `count` while it lives.
struct Counted<'a>(&'a AtomicUsize);

impl<'a> Counted<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::Relaxed);
        Counted(count)
    }
}

impl Drop for Counted<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The peers' gates, made at a peer's first forward.
#[derive(Debug, Default)]
pub(super) struct PeerGates(Mutex<HashMap<u16, Arc<Gate>>>);

impl PeerGates {
    /// The gate of peer `id` with `size` places (a changed size, after a
    /// reload, gets a new gate).
    fn gate(&self, id: u16, size: u32) -> Arc<Gate> {
        let mut gates = self.0.lock();
        let new = || {
            let turns = Semaphore::new(size as usize);
            Arc::new(Gate { size, turns, active: AtomicUsize::new(0), waiting: AtomicUsize::new(0) })
        };
        let gate = gates.entry(id).or_insert_with(new);
        if gate.size != size {
            *gate = new();
        }
        gate.clone()
    }

    /// Per peer forwarded to so far: (id, forwards under way, waiting for
    /// their turn), by id.
    pub(super) fn shown(&self) -> Vec<(u16, usize, usize)> {
        let gates = self.0.lock();
        let mut rows: Vec<_> = gates
            .iter()
            .map(|(id, g)| (*id, g.active.load(Ordering::Relaxed), g.waiting.load(Ordering::Relaxed)))
            .collect();
        rows.sort_unstable();
        rows
    }

    /// Sends the CancelRequest (`pid`, `key`) to `peer` in a task of its
    /// own; its handle lets the caller hold the client's connection until
    /// the peer has closed its own.
    pub(super) fn forward(
        &self,
        id: u16,
        peer: &Peer,
        default_size: u32,
        pid: i32,
        key: Vec<u8>,
    ) -> tokio::task::JoinHandle<()> {
        let gate = self.gate(id, peer.pool_size.unwrap_or(default_size).max(1));
        let (host, port) = (peer.host.clone(), peer.port);
        tokio::spawn(async move {
            let sent = tokio::time::timeout(FORWARD_LIMIT, async {
                let waiting = Counted::new(&gate.waiting);
                let _turn = gate.turns.acquire().await.map_err(std::io::Error::other)?;
                drop(waiting);
                let _active = Counted::new(&gate.active);
                send(&host, port, pid, &key).await
            });
            match sent.await {
                Ok(Ok(())) => tracing::debug!(peer = id, "cancel request forwarded to a peer"),
                Ok(Err(e)) => {
                    tracing::warn!(peer = id, %host, port, error = %e, "forwarding a cancel request to a peer failed")
                }
                Err(_) => tracing::warn!(peer = id, %host, port, "forwarding a cancel request to a peer timed out"),
            }
        })
    }
}

/// Connects to the peer, sends the request and waits for the peer to close.
async fn send(host: &str, port: u16, pid: i32, key: &[u8]) -> std::io::Result<()> {
    let request = messages::cancel_request_with_key(pid, key);
    let mut sink = [0u8; 64];
    if host.starts_with('/') {
        let path = std::path::Path::new(host).join(format!(".s.PGSQL.{port}"));
        let mut s = tokio::net::UnixStream::connect(path).await?;
        s.write_all(&request).await?;
        while s.read(&mut sink).await? > 0 {}
    } else {
        let mut s = tokio::net::TcpStream::connect((host, port)).await?;
        s.write_all(&request).await?;
        while s.read(&mut sink).await? > 0 {}
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pids_carry_the_peer_id_in_pgbouncers_bytes() {
        let mut rng = rand::thread_rng();
        for id in [1u16, 2, 255, 256, 16383] {
            for _ in 0..100 {
                let pid = mint_pid(&mut rng, id);
                assert!(pid > 0);
                assert_eq!(owner(pid), id);
                let b = pid.to_be_bytes();
                assert_eq!((b[1], b[2]), ((id & 0xff) as u8, (id >> 8) as u8), "PgBouncer's cancel_key[1], [2]");
            }
        }
        assert!((0..100).all(|_| mint_pid(&mut rng, 0) > 0));
    }

    #[test]
    fn own_keys_stay_others_go_once_less_and_a_spent_budget_ends() {
        let pid_of = |id: u16| i32::from_be_bytes([0x12, id.to_le_bytes()[0], id.to_le_bytes()[1], 0x34]);
        assert_eq!(route(0, pid_of(5), &[1, 2, 3, 4]), Route::Local(vec![1, 2, 3, 4]), "no peering: as it came");
        assert_eq!(route(5, pid_of(5), &[1, 2, 3, 0x40]), Route::Local(vec![1, 2, 3, 0x43]), "budget restored");
        assert_eq!(route(5, pid_of(7), &[1, 2, 3, 0x43]), Route::Peer { id: 7, key: vec![1, 2, 3, 0x42] });
        assert_eq!(route(5, pid_of(7), &[1, 2, 3, 0x41]), Route::Peer { id: 7, key: vec![1, 2, 3, 0x40] });
        assert!(matches!(route(5, pid_of(7), &[1, 2, 3, 0x40]), Route::Drop(_)), "three forwards at most");
        let long = [9u8; 32];
        assert_eq!(route(5, pid_of(700), &long), Route::Peer { id: 700, key: [&[9u8; 31][..], &[8]].concat() });
        assert!(matches!(route(5, pid_of(7), &[]), Route::Drop(_)));
    }
}
