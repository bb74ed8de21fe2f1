//! The statements of one pool, by fingerprint (`protocol::fingerprint`):
//! for each, the servers its transactions hold now, its clients waiting
//! now, its calls, server time, wait time and errors; and the fair
//! hand-over's choice among the fingerprints that wait.
//!
//! A transaction is counted here when it queued for a server: the pool was
//! full, which is when the hand-over has a choice to make and an operator a
//! culprit to find. A transaction that found an idle server is not
//! fingerprinted (no lexer pass on an uncontended pool's per-query path).
//!
//! Lives in the pool's `State`, under its lock; every method is O(1) but
//! `preferred` (O(fingerprints waiting), usually one or two) and the
//! insertion of a new fingerprint into a full table (O(table)).

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;
use std::time::{Duration, Instant};

use weir_metrics::{QuerySeries, OTHER};

/// Fingerprints a pool keeps at most; the one seen longest ago that holds
/// and waits for nothing makes room for a new one.
const MAX_TRACKED: usize = 1000;

/// A fingerprint is already a hash: the map uses it as it is.
#[derive(Default)]
struct Prehashed(u64);

impl Hasher for Prehashed {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

/// The statement a waiter's transaction starts with: its fingerprint and
/// normalized text (shared: a session keeps its last one).
#[derive(Debug, Clone)]
pub struct QueryTag {
    pub fp: u64,
    pub text: Arc<str>,
}

/// What one fingerprint's transactions did in one pool.
#[derive(Debug, Clone)]
pub struct QueryStats {
    pub fingerprint: u64,
    /// The normalized text (cut for display).
    pub text: Arc<str>,
    pub calls: u64,
    /// Servers its transactions hold now.
    pub held: u32,
    /// Its clients queued for a server now.
    pub waiting: u32,
    pub server_time: Duration,
    pub wait_time: Duration,
    /// Errors its transactions met: those of `sqlstate::COUNTED_ERRORS`, then any other.
    pub errors: [u64; 4],
    last_seen: Instant,
}

/// How long another fingerprint counts as active after it last queued or
/// took a server under pressure: while it does, a fingerprint at its cap
/// leaves servers idle for it (the pool's upkeep, every 500 ms, hands them
/// on once it is not).
const ACTIVE_FOR: Duration = Duration::from_secs(1);

/// The pool's fingerprints.
#[derive(Debug, Default)]
pub(super) struct Queries {
    map: HashMap<u64, QueryStats, BuildHasherDefault<Prehashed>>,
    /// The fingerprints with a client waiting now.
    waiting: Vec<u64>,
    /// The two fingerprints that queued or took a server last, and when.
    recent: [(u64, Option<Instant>); 2],
}

impl Queries {
    /// A client of `tag`'s fingerprint joined the queue at `now`.
    pub(super) fn queued(&mut self, tag: &QueryTag, now: Instant) {
        let s = self.seen(tag, now);
        s.waiting += 1;
        if s.waiting == 1 {
            self.waiting.push(tag.fp);
        }
    }

    /// A transaction of `tag`'s fingerprint asked for a server at `now`
    /// while the pool was under pressure: its figures, made if new.
    pub(super) fn seen(&mut self, tag: &QueryTag, now: Instant) -> &mut QueryStats {
        let fp = tag.fp;
        if self.recent[0].0 != fp {
            self.recent[1] = self.recent[0];
        }
        self.recent[0] = (fp, Some(now));
        if self.map.len() >= MAX_TRACKED && !self.map.contains_key(&fp) {
            self.make_room();
        }
        let s = self.map.entry(fp).or_insert_with(|| QueryStats {
            fingerprint: fp,
            text: tag.text.clone(),
            calls: 0,
            held: 0,
            waiting: 0,
            server_time: Duration::ZERO,
            wait_time: Duration::ZERO,
            errors: [0; 4],
            last_seen: now,
        });
        s.last_seen = now;
        s
    }

    /// `fp` holds `cap` servers or more while no other fingerprint waits
    /// but one was active within `ACTIVE_FOR` of `now`: a server freed now
    /// stays idle for that other one rather than go to `fp`. (While
    /// another waits, `preferred` already decides.)
    pub(super) fn held_back(&self, fp: u64, cap: impl FnOnce() -> u32, now: Instant) -> bool {
        let active = |&(f, at): &(u64, Option<Instant>)| {
            f != fp && f != 0 && at.is_some_and(|at| now.saturating_duration_since(at) < ACTIVE_FOR)
        };
        self.recent.iter().any(active)
            && !self.waiting.iter().any(|&f| f != fp)
            && self.map.get(&fp).is_some_and(|s| s.held >= cap())
    }

    /// A client of `fp` left the queue (served, gone, expired or shed).
    pub(super) fn unqueued(&mut self, fp: u64) {
        if fp == 0 {
            return;
        }
        let Some(s) = self.map.get_mut(&fp) else { return };
        s.waiting = s.waiting.saturating_sub(1);
        if s.waiting == 0 {
            if let Some(i) = self.waiting.iter().position(|&f| f == fp) {
                self.waiting.swap_remove(i);
            }
        }
    }

    /// A transaction of `fp` took a server after waiting `waited`; Some
    /// (the servers it holds now) when that is over half of `pool_size`
    /// while other clients wait.
    pub(super) fn lent(&mut self, fp: u64, waited: Duration, pool_size: u32) -> Option<(u32, Arc<str>)> {
        let others_wait = self.waiting.len() > 1 || self.waiting.first().is_some_and(|&f| f != fp);
        let s = self.map.get_mut(&fp)?;
        s.held += 1;
        s.calls += 1;
        s.wait_time += waited;
        (others_wait && s.held * 2 > pool_size).then(|| (s.held, s.text.clone()))
    }

    /// A transaction of `fp` gave its server back after `held_for`, having
    /// met the errors `errors` (`sqlstate::counted_error_bit`).
    pub(super) fn returned(&mut self, fp: u64, held_for: Duration, errors: u8) {
        let Some(s) = self.map.get_mut(&fp) else { return };
        s.held = s.held.saturating_sub(1);
        s.server_time += held_for;
        if errors != 0 {
            for (i, n) in s.errors.iter_mut().enumerate() {
                *n += u64::from(errors >> i & 1);
            }
        }
    }

    /// The fingerprints the next server should go to, when more than one
    /// waits: those below the cap (`cap` servers) if any, and among them
    /// the ones holding the fewest servers. None: at most one fingerprint
    /// waits, and the oldest waiter gets it.
    pub(super) fn preferred(&self, cap: impl FnOnce() -> u32) -> Option<Vec<u64>> {
        if self.waiting.len() < 2 {
            return None;
        }
        let cap = cap();
        let key = |fp: &u64| self.map.get(fp).map_or((false, 0), |s| (s.held >= cap, s.held));
        let best = self.waiting.iter().map(key).min()?;
        Some(self.waiting.iter().copied().filter(|fp| key(fp) == best).collect())
    }

    /// Every fingerprint, ordered by servers held now, then server time.
    pub(super) fn listing(&self) -> Vec<QueryStats> {
        let mut all: Vec<QueryStats> = self.map.values().cloned().collect();
        all.sort_by(|a, b| b.held.cmp(&a.held).then(b.server_time.cmp(&a.server_time)));
        all
    }

    /// The series `/metrics` shows: the first `k` of `listing`, and the
    /// rest summed as `other` (none when there is no rest).
    pub(super) fn top(&self, k: usize) -> Vec<QuerySeries> {
        if k == 0 {
            return Vec::new();
        }
        let all = self.listing();
        let mut series: Vec<QuerySeries> =
            all.iter().take(k).map(|s| series_of(format!("{:016x}", s.fingerprint), s)).collect();
        let mut rest = all.iter().skip(k);
        if let Some(first) = rest.next() {
            let mut other = series_of(OTHER.to_owned(), first);
            for s in rest {
                let s = series_of(String::new(), s);
                other.calls += s.calls;
                other.server_us += s.server_us;
                other.wait_us += s.wait_us;
                other.held += s.held;
            }
            series.push(other);
        }
        series
    }

    /// Drops the fingerprint seen longest ago that holds and waits for
    /// nothing, when the table is full.
    fn make_room(&mut self) {
        if self.map.len() < MAX_TRACKED {
            return;
        }
        let quiet = self.map.values().filter(|s| s.held == 0 && s.waiting == 0);
        if let Some(fp) = quiet.min_by_key(|s| s.last_seen).map(|s| s.fingerprint) {
            self.map.remove(&fp);
        }
    }
}

/// One fingerprint's `/metrics` series, labelled `fingerprint`.
fn series_of(fingerprint: String, s: &QueryStats) -> QuerySeries {
    QuerySeries {
        fingerprint,
        calls: s.calls,
        server_us: s.server_time.as_micros() as u64,
        wait_us: s.wait_time.as_micros() as u64,
        held: s.held.into(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::sqlstate::counted_error_bit as error_bit;

    fn tag(fp: u64) -> QueryTag {
        QueryTag { fp, text: Arc::from("select ?") }
    }

    #[test]
    fn the_fingerprint_holding_fewest_is_preferred_and_the_cap_comes_first() {
        let (mut q, now) = (Queries::default(), Instant::now());
        q.queued(&tag(1), now);
        assert_eq!(q.preferred(|| 10), None, "one fingerprint waiting: plain FIFO");
        q.lent(1, Duration::ZERO, 20);
        q.queued(&tag(1), now);
        q.queued(&tag(2), now);
        assert_eq!(q.preferred(|| 10), Some(vec![2]));
        for _ in 0..3 {
            q.lent(2, Duration::ZERO, 20);
        }
        assert_eq!(q.preferred(|| 10), Some(vec![1]));
        // Both at or over the cap of 1: fewest held wins.
        assert_eq!(q.preferred(|| 1), Some(vec![1]));
        q.returned(2, Duration::from_millis(5), error_bit(b"40P01"));
        q.returned(2, Duration::from_millis(5), error_bit(b"22012"));
        let s = q.listing().into_iter().find(|s| s.fingerprint == 2).unwrap();
        assert_eq!((s.held, s.calls, s.errors), (1, 3, [0, 0, 1, 1]));
        assert_eq!(s.server_time, Duration::from_millis(10));
    }

    #[test]
    fn over_half_of_the_pool_while_others_wait_is_reported() {
        let (mut q, now) = (Queries::default(), Instant::now());
        q.queued(&tag(1), now);
        for _ in 0..10 {
            assert!(q.lent(1, Duration::ZERO, 20).is_none(), "no one else waits, or not over half");
        }
        q.queued(&tag(2), now);
        assert_eq!(q.lent(1, Duration::ZERO, 20).map(|(held, _)| held), Some(11));
    }

    #[test]
    fn a_full_table_drops_the_quiet_fingerprint_seen_longest_ago() {
        let (mut q, start) = (Queries::default(), Instant::now());
        for fp in 0..MAX_TRACKED as u64 {
            q.queued(&tag(fp), start + Duration::from_millis(fp));
            q.unqueued(fp);
        }
        q.queued(&tag(0), start + Duration::from_secs(5));
        q.queued(&tag(u64::MAX), start + Duration::from_secs(6));
        assert_eq!(q.map.len(), MAX_TRACKED);
        assert!(q.map.contains_key(&0), "still waiting");
        assert!(!q.map.contains_key(&1), "quiet and seen longest ago");
    }
}
