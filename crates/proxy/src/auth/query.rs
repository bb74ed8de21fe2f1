//! auth_query: the verifier of a user who is not in the auth_file, looked up
//! in Postgres (PgBouncer's `auth_user` / `auth_query`). The query runs on
//! the ordinary pool of (auth_dbname or the client's database, auth_user),
//! whose password comes from the auth_file, with the extended protocol and
//! the user name as `$1` (never interpolated), within the client's login
//! deadline. Answers are cached per (database, user): found verifiers for
//! `auth_query_cache_ttl`, "no such user" briefly, and none past a reload.

use std::collections::HashMap;
use std::future::Future;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::userlist::{Secret, UserList};
use super::Credentials;
use crate::config::Config;

/// How long "no such user" is remembered (at most auth_query_cache_ttl).
const NEGATIVE_TTL: Duration = Duration::from_secs(2);

/// Why a lookup failed (not "no such user", which is `Ok(None)`).
#[derive(Debug, thiserror::Error)]
pub(crate) enum AuthQueryError {
    #[error("auth_query: database \"{0}\" is not configured")]
    UnknownDatabase(String),
    #[error("auth_query: no server connection for auth_user \"{user}\": {why}")]
    NoServer { user: String, why: String },
    /// Postgres refused auth_user's login: the client gets Postgres's
    /// SQLSTATE and message, as the pool's own waiters do, and the name of
    /// the auth_user whose login it was.
    #[error("{message} (auth_user \"{user}\")")]
    Rejected { user: String, code: crate::protocol::SqlState, message: String },
    #[error("auth_query failed: {0}")]
    Query(String),
    #[error("auth_query: the server connection failed")]
    ServerLost,
}

/// What auth_query answered: `Ok(Some(passwd))` from the second column of
/// the first row (None: NULL), `Ok(None)` for no row, `Err(message)` when
/// Postgres refused the query.
pub(crate) type Answer = Result<Option<Option<String>>, String>;

/// A user auth_query found: its verifier, None when its password is NULL
/// (`trust` admits such a user, as PgBouncer does; nothing else does).
pub(crate) type Found = Option<Secret>;

/// Cached answers, keyed by (database, user): when each was fetched, and
/// what was found (None: no such user).
type Cached = HashMap<(String, String), (Instant, Option<Found>)>;

/// Cached answers of auth_query.
#[derive(Debug, Default)]
pub(crate) struct AuthQueryCache {
    entries: Mutex<Cached>,
}

impl AuthQueryCache {
    fn get(&self, key: &(String, String), ttl: Duration) -> Option<Option<Found>> {
        let entries = self.entries.lock();
        let (at, secret) = entries.get(key)?;
        let ttl = if secret.is_some() { ttl } else { ttl.min(NEGATIVE_TTL) };
        (at.elapsed() < ttl).then(|| secret.clone())
    }

    /// Forgets every answer (a reload may have changed auth_query,
    /// auth_user or auth_dbname).
    pub(crate) fn clear(&self) {
        self.entries.lock().clear();
    }

    fn put(&self, key: (String, String), secret: Option<Found>) {
        let mut entries = self.entries.lock();
        // Bounded: a flood of made-up user names cannot grow it without end.
        if entries.len() >= 10_000 {
            entries.retain(|_, (at, _)| at.elapsed() < NEGATIVE_TTL);
        }
        entries.insert(key, (Instant::now(), secret));
    }
}

/// The verifier of `user` for a client of `database`: from the cache, or by
/// running auth_query through `fetch`, which gets the database to run it in
/// and the auth_user's name and credentials, and answers as
/// `server::auth_lookup::run` does. `Ok(None)`: no such user.
/// The auth_user is the database's own or `[weir]`'s; one not in the
/// auth_file logs in without a password, as in PgBouncer.
pub(crate) async fn lookup<F, Fut>(
    cache: &AuthQueryCache,
    users: &UserList,
    cfg: &Config,
    database: &str,
    user: &str,
    fetch: F,
) -> Result<Option<Found>, AuthQueryError>
where
    F: FnOnce(String, String, Credentials) -> Fut,
    Fut: Future<Output = Result<Answer, AuthQueryError>>,
{
    let g = &cfg.weir;
    let db = cfg.auth_dbname(database).unwrap_or(database);
    let cache_key = (db.to_owned(), user.to_owned());
    if let Some(hit) = cache.get(&cache_key, g.auth_query_cache_ttl) {
        return Ok(hit);
    }
    let auth_user = cfg.auth_user(database);
    let credentials = Credentials::of_stored(users.get(auth_user));
    let secret = match fetch(db.to_owned(), auth_user.to_owned(), credentials).await? {
        Ok(Some(Some(pw))) => Some(Secret::parse(&pw).ok()),
        Ok(Some(None)) => Some(None),
        Ok(None) => None,
        Err(message) => return Err(AuthQueryError::Query(message)),
    };
    cache.put(cache_key, secret.clone());
    Ok(secret)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_expires_and_negative_answers_are_brief() {
        let c = AuthQueryCache::default();
        let k = ("db".to_owned(), "u".to_owned());
        assert_eq!(c.get(&k, Duration::from_secs(30)), None);
        c.put(k.clone(), Some(Some(Secret::Plain("x".into()))));
        assert_eq!(c.get(&k, Duration::from_secs(30)), Some(Some(Some(Secret::Plain("x".into())))));
        assert_eq!(c.get(&k, Duration::ZERO), None);
        c.put(k.clone(), None);
        assert_eq!(c.get(&k, Duration::from_secs(30)), Some(None));
    }
}
