//! Which of weir's own named prepared statements (`weir_<hash>`) exist on one
//! server connection: an LRU of at most `max_prepared_statements` names, plus
//! the names whose existence is uncertain (a client ran DEALLOCATE ALL or
//! DISCARD ALL, or left mid-batch), which are closed before being prepared
//! again. Statements used during
//! the current lease are never evicted, so a portal bound from one stays
//! valid until the transaction ends.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::hash::{BuildHasherDefault, Hasher};
use std::sync::Arc;

use weir_metrics::SharedCount;

#[derive(Debug, Clone, Copy)]
struct Entry {
    tick: u64,
    lease: u64,
}

/// The prepared-statement cache of one server connection.
#[derive(Debug, Default)]
pub struct ServerStatements {
    entries: HashMap<Arc<str>, Entry, BuildHasherDefault<NameHasher>>,
    by_age: BTreeMap<u64, Arc<str>>,
    maybe: HashSet<Arc<str>>,
    /// Prepared since the server was last idle: if that transaction rolls
    /// back, they may name objects that are gone.
    provisional: Vec<Arc<str>>,
    /// An error or ROLLBACK came since the first of `provisional`.
    rolled_back: bool,
    tick: u64,
    lease: u64,
    /// The name last held or inserted, as the caller named it, while its
    /// entry is the most recently used and marked with this lease: held
    /// again (the Bind after its Parse), it needs no look-up. Keeping the
    /// caller's `Arc` keeps its address its own, so the same pointer is
    /// the same name.
    last: Option<Arc<str>>,
    /// The number of statements, for SHOW SERVERS.
    shown: SharedCount,
}

impl ServerStatements {
    /// Starts a new lease: statements used from now on are protected from eviction.
    pub fn begin_lease(&mut self) {
        self.lease += 1;
        self.last = None;
    }

    /// `name` is being prepared, maybe inside a transaction.
    pub fn add_provisional(&mut self, name: Arc<str>) {
        self.provisional.push(name);
    }

    /// Statements were prepared since the server was last idle.
    pub fn has_provisional(&self) -> bool {
        !self.provisional.is_empty()
    }

    /// An error or a ROLLBACK (of the transaction or to a savepoint).
    pub fn rolled_back(&mut self) {
        self.rolled_back |= !self.provisional.is_empty();
    }

    /// The server is idle again (`finished`), or was left mid-transaction:
    /// what was prepared since it was last idle stays if its transaction
    /// committed, else it becomes uncertain (closed and prepared afresh
    /// before its next use).
    pub fn settle(&mut self, finished: bool) {
        if std::mem::take(&mut self.rolled_back) || !finished {
            let names = std::mem::take(&mut self.provisional);
            names.into_iter().for_each(|n| self.mark_uncertain(n));
        } else {
            self.provisional.clear();
        }
    }

    /// The statement count as the admin console sees it (updated when a lease ends).
    pub fn shown(&self) -> SharedCount {
        self.shown.clone()
    }

    /// Publishes the statement count.
    pub fn publish(&self) {
        self.shown.set(self.entries.len() as u64);
    }

    /// Statements known to be prepared (or being prepared) on the server.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub fn contains(&self, name: &str) -> bool {
        self.entries.contains_key(name)
    }

    /// The statement may exist on the server; weir does not know.
    pub fn is_uncertain(&self, name: &str) -> bool {
        self.maybe.contains(name)
    }

    /// Marks a prepared statement as just used.
    pub fn touch(&mut self, name: &Arc<str>) {
        self.hold(name);
    }

    /// Whether the statement is prepared (or being prepared) on the server;
    /// if so, marks it as just used. One look-up, none for the name last
    /// held (`last`); none of the LRU order changes when it is already the
    /// most recently used.
    pub fn hold(&mut self, name: &Arc<str>) -> bool {
        if self.last.as_ref().is_some_and(|last| Arc::ptr_eq(last, name)) {
            return true;
        }
        let Some(e) = self.entries.get_mut(&**name) else { return false };
        e.lease = self.lease;
        if e.tick != self.tick {
            self.tick += 1;
            let was = std::mem::replace(&mut e.tick, self.tick);
            if let Some(key) = self.by_age.remove(&was) {
                self.by_age.insert(self.tick, key);
            }
        }
        self.last = Some(name.clone());
        true
    }

    /// Records `name` as prepared. Returns the names evicted to stay within
    /// `max` (least recently used first, never one used in this lease); the
    /// caller closes them on the server.
    pub fn insert(&mut self, name: Arc<str>, max: usize) -> Vec<Arc<str>> {
        self.maybe.remove(&name);
        if self.hold(&name) {
            return Vec::new();
        }
        let mut evicted = Vec::new();
        while self.entries.len() >= max.max(1) {
            let Some((&tick, oldest)) = self.by_age.iter().next() else { break };
            if self.entries.get(oldest).is_some_and(|e| e.lease == self.lease) {
                break;
            }
            let oldest = oldest.clone();
            self.by_age.remove(&tick);
            self.entries.remove(&oldest);
            evicted.push(oldest);
        }
        self.tick += 1;
        self.by_age.insert(self.tick, name.clone());
        self.last = Some(name.clone());
        self.entries.insert(name, Entry { tick: self.tick, lease: self.lease });
        evicted
    }

    /// A Parse of the statement was not executed (it failed, or the server
    /// skipped it after an error): it is not known to exist, and stays
    /// uncertain if it was (a Close of it was skipped too).
    pub fn remove(&mut self, name: &str) {
        self.last = None;
        if let Some(e) = self.entries.remove(name) {
            self.by_age.remove(&e.tick);
        }
    }

    /// The statement may or may not exist any more.
    pub fn mark_uncertain(&mut self, name: Arc<str>) {
        self.last = None;
        if let Some(e) = self.entries.remove(&name) {
            self.by_age.remove(&e.tick);
        }
        self.maybe.insert(name);
    }

    /// Every known statement may have been deallocated (DEALLOCATE ALL,
    /// DISCARD ALL sent by a client, whose outcome weir does not wait for).
    pub fn mark_all_uncertain(&mut self) {
        self.last = None;
        self.by_age.clear();
        let names: Vec<_> = self.entries.drain().map(|(k, _)| k).collect();
        self.maybe.extend(names);
    }

    /// The uncertain name is about to be closed on the server.
    pub fn take_uncertain(&mut self, name: &str) -> bool {
        self.maybe.remove(name)
    }

    /// The server is known to hold none of weir's statements (after a reset).
    pub fn clear(&mut self) {
        self.provisional.clear();
        self.rolled_back = false;
        self.last = None;
        self.entries.clear();
        self.by_age.clear();
        self.maybe.clear();
    }
}

/// Hashes weir's statement names a word at a time (a multiply per eight
/// bytes): they are looked up on every Parse and Bind of a tracked client,
/// and are weir's own (hex digits of a digest), never chosen by a client,
/// so a keyed hash buys nothing.
#[derive(Debug, Default)]
struct NameHasher(u64);

impl NameHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x517c_c1b7_2722_0a95);
    }
}

impl Hasher for NameHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.add(u64::from_le_bytes([w[0], w[1], w[2], w[3], w[4], w[5], w[6], w[7]]));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w));
        }
    }

    #[inline]
    fn write_u8(&mut self, b: u8) {
        self.add(u64::from(b));
    }

    #[inline]
    fn finish(&self) -> u64 {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn n(s: &str) -> Arc<str> {
        Arc::from(s)
    }

    #[test]
    fn evicts_least_recently_used_from_earlier_leases() {
        let mut s = ServerStatements::default();
        s.begin_lease();
        assert!(s.insert(n("a"), 2).is_empty());
        assert!(s.insert(n("b"), 2).is_empty());
        s.begin_lease();
        s.touch(&n("a"));
        assert_eq!(s.insert(n("c"), 2), vec![n("b")]);
        assert!(s.contains("a") && s.contains("c") && !s.contains("b"));
        assert_eq!(s.len(), 2);
    }

    #[test]
    fn holding_the_newest_again_keeps_it_newest_and_protects_it_in_a_new_lease() {
        let mut s = ServerStatements::default();
        s.begin_lease();
        s.insert(n("weir_0123456789abcdef01234567"), 2);
        s.insert(n("weir_76543210fedcba9876543210"), 2);
        assert!(s.hold(&n("weir_76543210fedcba9876543210")), "already the newest");
        assert!(s.hold(&n("weir_76543210fedcba9876543210")));
        assert!(!s.hold(&n("weir_ffffffffffffffffffffffff")));
        s.begin_lease();
        assert!(s.hold(&n("weir_76543210fedcba9876543210")), "used in this lease, not evicted");
        assert_eq!(s.insert(n("c"), 2), vec![n("weir_0123456789abcdef01234567")]);
        assert!(s.insert(n("d"), 2).is_empty(), "both held in this lease: kept over the limit");
        assert_eq!(s.len(), 3);
        s.begin_lease();
        assert!(s.hold(&n("c")));
        assert_eq!(s.insert(n("e"), 2), vec![n("weir_76543210fedcba9876543210"), n("d")]);
    }

    #[test]
    fn holding_the_same_name_again_answers_as_a_look_up_would() {
        let mut s = ServerStatements::default();
        s.begin_lease();
        let a = n("a");
        s.insert(a.clone(), 2);
        assert!(s.hold(&a) && s.hold(&a));
        s.remove("a");
        assert!(!s.hold(&a), "removed");
        s.insert(a.clone(), 2);
        s.mark_uncertain(n("a"));
        assert!(!s.hold(&a), "uncertain");
        s.insert(a.clone(), 1);
        s.begin_lease();
        assert!(s.hold(&a) && s.hold(&a));
        assert!(s.insert(n("b"), 1).is_empty(), "held in this lease: kept over the limit");
        s.mark_all_uncertain();
        assert!(!s.hold(&a), "every statement uncertain");
    }

    #[test]
    fn statements_of_the_current_lease_are_kept_over_the_limit() {
        let mut s = ServerStatements::default();
        s.begin_lease();
        s.insert(n("a"), 1);
        assert!(s.insert(n("b"), 1).is_empty());
        assert_eq!(s.len(), 2);
        s.begin_lease();
        assert_eq!(s.insert(n("c"), 1), vec![n("a"), n("b")]);
    }

    #[test]
    fn uncertain_names_are_tracked_until_prepared_again() {
        let mut s = ServerStatements::default();
        s.insert(n("a"), 5);
        s.insert(n("b"), 5);
        s.mark_all_uncertain();
        assert!(s.is_empty());
        assert!(s.is_uncertain("a") && s.is_uncertain("b"));
        assert!(s.take_uncertain("a"));
        assert!(!s.take_uncertain("a"));
        s.insert(n("b"), 5);
        assert!(!s.is_uncertain("b") && s.contains("b"));
        s.remove("b");
        assert!(!s.contains("b"));
        s.mark_uncertain(n("b"));
        s.remove("b");
        assert!(s.is_uncertain("b"), "a skipped Parse leaves an uncertain name uncertain");
        s.mark_uncertain(n("z"));
        s.clear();
        assert!(!s.is_uncertain("z"));
    }

    #[test]
    fn statements_of_a_rolled_back_transaction_become_uncertain() {
        let mut s = ServerStatements::default();
        for (rolled_back, finished, kept) in [(false, true, true), (true, true, false), (false, false, false)] {
            s.insert(n("a"), 5);
            s.add_provisional(n("a"));
            assert!(s.has_provisional());
            if rolled_back {
                s.rolled_back();
            }
            s.settle(finished);
            assert!(!s.has_provisional());
            assert_eq!((s.contains("a"), s.is_uncertain("a")), (kept, !kept));
        }
    }
}
