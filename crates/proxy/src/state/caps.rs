//! Client connections counted per database and per user, for
//! `max_db_client_connections` and `max_user_client_connections` and the
//! `current_client_connections` columns of SHOW DATABASES and SHOW USERS.
//! A client is counted from its startup packet (before it authenticates,
//! as PgBouncer counts it) until its `CapGuard` drops, when its connection
//! ends; the console's clients count against the console's database.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

/// Which limit refused a client (its name is the key's, as PgBouncer says it).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CapExceeded {
    Database,
    User,
}

impl CapExceeded {
    /// The key that set the limit.
    pub(crate) fn key(self) -> &'static str {
        match self {
            CapExceeded::Database => "max_db_client_connections",
            CapExceeded::User => "max_user_client_connections",
        }
    }
}

/// The counts, by database and by user name.
#[derive(Debug, Default)]
pub(crate) struct ClientCaps {
    counts: Mutex<Counts>,
}

#[derive(Debug, Default)]
struct Counts {
    databases: HashMap<String, u32>,
    users: HashMap<String, u32>,
}

/// One client's place in the counts; dropping it gives the place back.
#[derive(Debug)]
pub(crate) struct CapGuard {
    caps: Arc<ClientCaps>,
    database: String,
    user: String,
}

/// The limits one client meets: its database's and its user's (0: none),
/// and whether it is exempt from refusal (an admin user on the console).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Caps {
    pub database: u32,
    pub user: u32,
    pub exempt: bool,
}

impl ClientCaps {
    /// Counts a new client of `database` and `user`; refuses it when that
    /// takes either count over its limit (the client is then not counted).
    pub(crate) fn admit(self: &Arc<Self>, database: &str, user: &str, caps: Caps) -> Result<CapGuard, CapExceeded> {
        let mut c = self.counts.lock();
        let db_count = c.databases.get(database).copied().unwrap_or(0) + 1;
        let user_count = c.users.get(user).copied().unwrap_or(0) + 1;
        if !caps.exempt {
            if caps.database > 0 && db_count > caps.database {
                return Err(CapExceeded::Database);
            }
            if caps.user > 0 && user_count > caps.user {
                return Err(CapExceeded::User);
            }
        }
        c.databases.insert(database.to_owned(), db_count);
        c.users.insert(user.to_owned(), user_count);
        Ok(CapGuard { caps: self.clone(), database: database.to_owned(), user: user.to_owned() })
    }

    /// Clients of `database` now.
    pub(crate) fn database_count(&self, database: &str) -> u32 {
        self.counts.lock().databases.get(database).copied().unwrap_or(0)
    }

    /// Clients of `user` now.
    pub(crate) fn user_count(&self, user: &str) -> u32 {
        self.counts.lock().users.get(user).copied().unwrap_or(0)
    }

    /// The users with a client now.
    pub(crate) fn users(&self) -> Vec<String> {
        self.counts.lock().users.keys().cloned().collect()
    }
}

impl CapGuard {
    /// The user name the client is counted under (the one it logged in as).
    pub(crate) fn user(&self) -> &str {
        &self.user
    }
}

impl Drop for CapGuard {
    fn drop(&mut self) {
        let mut guard = self.caps.counts.lock();
        let c = &mut *guard;
        for (map, key) in [(&mut c.databases, &self.database), (&mut c.users, &self.user)] {
            if let Some(n) = map.get_mut(key.as_str()) {
                *n -= 1;
                if *n == 0 {
                    map.remove(key.as_str());
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const NONE: Caps = Caps { database: 0, user: 0, exempt: false };

    #[test]
    fn a_client_over_either_limit_is_refused_and_not_counted() {
        let caps = Arc::new(ClientCaps::default());
        let limited = Caps { database: 2, user: 0, ..NONE };
        let a = caps.admit("db", "u1", limited).unwrap();
        let _b = caps.admit("db", "u2", limited).unwrap();
        assert_eq!(caps.admit("db", "u3", limited).unwrap_err(), CapExceeded::Database);
        assert_eq!((caps.database_count("db"), caps.user_count("u3")), (2, 0));
        drop(a);
        assert_eq!(caps.database_count("db"), 1);
        let _c = caps.admit("db", "u3", limited).unwrap();
        let by_user = Caps { user: 1, ..NONE };
        assert_eq!(caps.admit("other", "u3", by_user).unwrap_err(), CapExceeded::User);
    }

    #[test]
    fn an_exempt_client_is_counted_but_never_refused() {
        let caps = Arc::new(ClientCaps::default());
        let limited = Caps { database: 1, user: 1, exempt: false };
        let _a = caps.admit("pgbouncer", "admin", limited).unwrap();
        let _b = caps.admit("pgbouncer", "admin", Caps { exempt: true, ..limited }).unwrap();
        assert_eq!((caps.database_count("pgbouncer"), caps.user_count("admin")), (2, 2));
        assert!(caps.admit("pgbouncer", "other", limited).is_err());
    }
}
