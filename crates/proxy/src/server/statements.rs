//! Which of weir's own named prepared statements (`weir_<hash>`) exist on one
//! server connection: an LRU of at most `max_prepared_statements` names, plus
//! the names whose existence is uncertain (a client ran DEALLOCATE ALL or
//! DISCARD ALL, or left mid-batch), which are closed before being prepared
//! again. Statements used during
//! the current lease are never evicted, so a portal bound from one stays
//! valid until the transaction ends.

use std::collections::{BTreeMap, HashMap, HashSet};
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
    entries: HashMap<Arc<str>, Entry>,
    by_age: BTreeMap<u64, Arc<str>>,
    maybe: HashSet<Arc<str>>,
    /// Prepared since the server was last idle: if that transaction rolls
    /// back, they may name objects that are gone.
    provisional: Vec<Arc<str>>,
    /// An error or ROLLBACK came since the first of `provisional`.
    rolled_back: bool,
    tick: u64,
    lease: u64,
    /// The number of statements, for SHOW SERVERS.
    shown: SharedCount,
}

impl ServerStatements {
    /// Starts a new lease: statements used from now on are protected from eviction.
    pub fn begin_lease(&mut self) {
        self.lease += 1;
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
    pub fn touch(&mut self, name: &str) {
        let Some((key, e)) = self.entries.get_key_value(name).map(|(k, e)| (k.clone(), *e)) else { return };
        self.by_age.remove(&e.tick);
        self.tick += 1;
        self.by_age.insert(self.tick, key.clone());
        self.entries.insert(key, Entry { tick: self.tick, lease: self.lease });
    }

    /// Records `name` as prepared. Returns the names evicted to stay within
    /// `max` (least recently used first, never one used in this lease); the
    /// caller closes them on the server.
    pub fn insert(&mut self, name: Arc<str>, max: usize) -> Vec<Arc<str>> {
        self.maybe.remove(&name);
        if self.entries.contains_key(&name) {
            self.touch(&name);
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
        self.entries.insert(name, Entry { tick: self.tick, lease: self.lease });
        evicted
    }

    /// A Parse of the statement was not executed (it failed, or the server
    /// skipped it after an error): it is not known to exist, and stays
    /// uncertain if it was (a Close of it was skipped too).
    pub fn remove(&mut self, name: &str) {
        if let Some(e) = self.entries.remove(name) {
            self.by_age.remove(&e.tick);
        }
    }

    /// The statement may or may not exist any more.
    pub fn mark_uncertain(&mut self, name: Arc<str>) {
        if let Some(e) = self.entries.remove(&name) {
            self.by_age.remove(&e.tick);
        }
        self.maybe.insert(name);
    }

    /// Every known statement may have been deallocated (DEALLOCATE ALL,
    /// DISCARD ALL sent by a client, whose outcome weir does not wait for).
    pub fn mark_all_uncertain(&mut self) {
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
        self.entries.clear();
        self.by_age.clear();
        self.maybe.clear();
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
        s.touch("a");
        assert_eq!(s.insert(n("c"), 2), vec![n("b")]);
        assert!(s.contains("a") && s.contains("c") && !s.contains("b"));
        assert_eq!(s.len(), 2);
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
