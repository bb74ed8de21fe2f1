//! A pool's part in the fleet (`Fleet`): what the pool's `State` keeps of
//! its announcement, its share and its demand between rounds. The rounds
//! that fill it in are `fleet/mod.rs`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use tokio::sync::{oneshot, Notify};

use crate::server::ServerConn;

/// Demand samples kept: `want` is the largest of the last four rounds (a
/// second at the 250 ms pace, 400 ms at the 100 ms one).
pub(super) const SAMPLES: usize = 4;
/// The least time between two rounds, however often waiters wake them.
pub(super) const MIN_GAP: Duration = Duration::from_millis(50);

/// A pool's part in the fleet, inside its `State`.
#[derive(Debug, Default)]
pub(in crate::pool) struct Fleet {
    /// The server that holds this pool's announcement (its id).
    pub(super) beacon: Option<u64>,
    /// A tick waiting for a server: the next one released comes here first.
    pub(super) claim: Option<(oneshot::Sender<Box<ServerConn>>, Instant)>,
    /// Servers the fleet query holds now (0 or 1).
    busy: u32,
    /// The share, while enforced (the fleet at its limit).
    pub(in crate::pool) cap: Option<u32>,
    pub(super) limited_until: Option<Instant>,
    pub(super) refusals_seen: u64,
    pub(super) demand: [u32; SAMPLES],
    pub(super) sample: usize,
    /// Wakes the round early: a waiter found no free server.
    pub(super) wake: Arc<Notify>,
    pub(super) woken_at: Option<Instant>,
}

impl Fleet {
    /// A waiter joined a pool with no free server: its demand is announced
    /// at the next round, which starts now rather than at its period (at
    /// most once per `MIN_GAP`).
    pub(in crate::pool) fn waiter_queued(&mut self, enabled: bool, now: Instant) {
        if enabled && self.woken_at.is_none_or(|t| now.duration_since(t) >= MIN_GAP) {
            self.woken_at = Some(now);
            self.wake.notify_one();
        }
    }

    /// Servers the fleet query holds now (0 or 1).
    pub(in crate::pool) fn busy(&self) -> u32 {
        self.busy
    }

    /// The fleet query took a server (from idle, or as it was released).
    pub(in crate::pool) fn took_server(&mut self) {
        self.busy += 1;
    }

    /// The fleet query is done with its server (it goes on, or closes).
    pub(in crate::pool) fn server_back(&mut self) {
        self.busy -= 1;
    }

    /// Whether this pool is below the share enforced now: a refused connect
    /// then retries at the round's pace.
    pub(in crate::pool) fn below_share(&self, total: u32) -> bool {
        self.cap.is_some_and(|cap| total < cap)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_waiter_wakes_the_round_at_most_once_per_gap() {
        let mut f = Fleet::default();
        let t = Instant::now();
        f.waiter_queued(false, t);
        assert_eq!(f.woken_at, None, "off: no wake");
        f.waiter_queued(true, t);
        f.waiter_queued(true, t + MIN_GAP / 2);
        assert_eq!(f.woken_at, Some(t));
        f.waiter_queued(true, t + MIN_GAP);
        assert_eq!(f.woken_at, Some(t + MIN_GAP));
    }
}
