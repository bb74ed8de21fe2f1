//! The console's own state in shared state: the databases DISABLE closed
//! to new clients (set by `admin`, read by the pooled login in `client`),
//! the SETs waiting for a setting they must agree with (TLS files and
//! modes), which a reload from the file forgets, and the count of console
//! queries (SHOW STATS's row for the console's database).

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;

/// Kept in `Shared::admin`.
#[derive(Debug, Default)]
pub struct AdminState {
    disabled: Mutex<BTreeSet<String>>,
    /// `[weir]` values SET but not yet in effect, as TOML.
    pending: Mutex<toml::Table>,
    /// Queries the console answered (each one a transaction too, as
    /// PgBouncer counts them).
    queries: AtomicU64,
}

impl AdminState {
    fn lock(&self) -> parking_lot::MutexGuard<'_, BTreeSet<String>> {
        self.disabled.lock()
    }

    /// DISABLE (true) or ENABLE (false) `database`; true when that changed it.
    pub fn set_disabled(&self, database: &str, disabled: bool) -> bool {
        if disabled {
            self.lock().insert(database.to_owned())
        } else {
            self.lock().remove(database)
        }
    }

    /// True when new clients of `database` are refused.
    pub fn is_disabled(&self, database: &str) -> bool {
        self.lock().contains(database)
    }

    /// The SET values not yet in effect.
    pub fn pending(&self) -> toml::Table {
        self.pending.lock().clone()
    }

    /// Replaces the SET values not yet in effect (empty: none).
    pub fn set_pending(&self, values: toml::Table) {
        *self.pending.lock() = values;
    }

    /// The console got a query.
    pub fn count_query(&self) {
        self.queries.fetch_add(1, Ordering::Relaxed);
    }

    /// Queries the console got since weir started.
    pub fn queries(&self) -> u64 {
        self.queries.load(Ordering::Relaxed)
    }
}

/// The error a client of a disabled database gets, as PgBouncer words it.
pub(crate) fn disabled_message(database: &str) -> String {
    format!("database \"{database}\" is disabled")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn disable_and_enable() {
        let s = AdminState::default();
        assert!(!s.is_disabled("app"));
        assert!(s.set_disabled("app", true));
        assert!(!s.set_disabled("app", true), "already disabled");
        assert!(s.is_disabled("app") && !s.is_disabled("other"));
        assert!(s.set_disabled("app", false));
        assert!(!s.is_disabled("app"));
    }
}
