//! auth_query: the verifier of a user who is not in the auth_file, looked up
//! in Postgres (PgBouncer's `auth_user` / `auth_query`). The query runs on
//! the ordinary pool of (auth_dbname or the client's database, auth_user),
//! whose password comes from the auth_file, with the extended protocol and
//! the user name as `$1` (never interpolated), within the client's login
//! deadline. Answers are cached per (database, user): found verifiers for
//! `auth_query_cache_ttl`, "no such user" briefly.

use parking_lot::Mutex;
use std::collections::HashMap;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use postgres_protocol::message::frontend;
use postgres_protocol::IsNull;

use super::userlist::Secret;
use crate::app::Shared;
use crate::config::Config;
use crate::pool::PoolKey;
use crate::protocol::{messages, tags::backend as be};
use crate::server::ServerConn;
use crate::wire;

/// Largest message accepted in auth_query's answer.
const MAX_ANSWER_MESSAGE: usize = 1 << 20;
/// How long "no such user" is remembered (at most auth_query_cache_ttl).
const NEGATIVE_TTL: Duration = Duration::from_secs(2);

/// Why a lookup failed (not "no such user", which is `Ok(None)`).
#[derive(Debug, thiserror::Error)]
pub enum AuthQueryError {
    #[error("auth_query: database \"{0}\" is not configured")]
    UnknownDatabase(String),
    #[error("auth_query: auth_user \"{0}\" is not in auth_file")]
    NoAuthUser(String),
    #[error("auth_query: no server connection for auth_user: {0}")]
    NoServer(String),
    #[error("auth_query failed: {0}")]
    Query(String),
    #[error("auth_query: the server connection failed")]
    ServerLost,
}

/// Cached answers, keyed by (database, user): when each was fetched, and
/// the verifier (None: no such user).
type Cached = HashMap<(String, String), (Instant, Option<Secret>)>;

/// Cached answers of auth_query.
#[derive(Debug, Default)]
pub struct AuthQueryCache {
    entries: Mutex<Cached>,
}

impl AuthQueryCache {
    fn get(&self, key: &(String, String), ttl: Duration) -> Option<Option<Secret>> {
        let entries = self.entries.lock();
        let (at, secret) = entries.get(key)?;
        let ttl = if secret.is_some() { ttl } else { ttl.min(NEGATIVE_TTL) };
        (at.elapsed() < ttl).then(|| secret.clone())
    }

    fn put(&self, key: (String, String), secret: Option<Secret>) {
        let mut entries = self.entries.lock();
        // Bounded: a flood of made-up user names cannot grow it without end.
        if entries.len() >= 10_000 {
            entries.retain(|_, (at, _)| at.elapsed() < NEGATIVE_TTL);
        }
        entries.insert(key, (Instant::now(), secret));
    }
}

/// The verifier of `user` for a client of `database`: from the cache, or by
/// running auth_query. `Ok(None)`: no such user (or no password).
pub async fn lookup(
    shared: &Shared,
    cfg: &Config,
    database: &str,
    user: &str,
    deadline: Instant,
) -> Result<Option<Secret>, AuthQueryError> {
    let g = &cfg.weir;
    let db = if g.auth_dbname.is_empty() { database } else { g.auth_dbname.as_str() };
    let cache_key = (db.to_owned(), user.to_owned());
    if let Some(hit) = shared.auth_query_cache.get(&cache_key, g.auth_query_cache_ttl) {
        return Ok(hit);
    }
    let users = shared.users.load();
    let auth_secret = users.get(&g.auth_user).ok_or_else(|| AuthQueryError::NoAuthUser(g.auth_user.clone()))?;
    let key = PoolKey { database: db.to_owned(), user: g.auth_user.clone() };
    let credentials = match auth_secret {
        Secret::Plain(p) => crate::server::login::Credentials::Password(p.clone()),
        Secret::Md5(m) => crate::server::login::Credentials::Md5(m.clone()),
        Secret::Scram(_) => crate::server::login::Credentials::None,
    };
    let pool = shared.pool_for(cfg, &key, credentials).ok_or_else(|| AuthQueryError::UnknownDatabase(db.to_owned()))?;
    let mut lease = pool.acquire(deadline).await.map_err(|e| AuthQueryError::NoServer(e.to_string()))?;
    let answer = tokio::time::timeout_at(deadline.into(), run(lease.conn_mut(), &g.auth_query, user)).await;
    let answer = match answer {
        Ok(Ok(a)) => a,
        Ok(Err(e)) => {
            lease.close(weir_metrics::CloseReason::ServerError);
            return Err(e);
        }
        Err(_) => {
            lease.close(weir_metrics::CloseReason::ServerError);
            return Err(AuthQueryError::NoServer("timed out".into()));
        }
    };
    drop(lease);
    let secret = match answer {
        Ok(Some(pw)) => Secret::parse(&pw).ok(),
        Ok(None) => None,
        Err(message) => return Err(AuthQueryError::Query(message)),
    };
    shared.auth_query_cache.put(cache_key, secret.clone());
    Ok(secret)
}

/// Runs `sql` with `$1 = user` on a quiet connection: `Ok(Ok(passwd))` from
/// the second column of the first row (None: no row or NULL), `Ok(Err(..))`
/// when Postgres refused the query. Reads through ReadyForQuery.
async fn run(conn: &mut ServerConn, sql: &str, user: &str) -> Result<Result<Option<String>, String>, AuthQueryError> {
    let mut out = BytesMut::new();
    let bad = |e: std::io::Error| AuthQueryError::Query(e.to_string());
    frontend::parse("", sql, std::iter::empty(), &mut out).map_err(bad)?;
    let param = |v: &str, buf: &mut BytesMut| -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        buf.extend_from_slice(v.as_bytes());
        Ok(IsNull::No)
    };
    frontend::bind("", "", [0i16], [user], param, [0i16], &mut out).map_err(|e| match e {
        frontend::BindError::Conversion(e) => AuthQueryError::Query(e.to_string()),
        frontend::BindError::Serialization(e) => bad(e),
    })?;
    frontend::execute("", 0, &mut out).map_err(bad)?;
    frontend::sync(&mut out);
    crate::server::exchange::write(conn, &out).await.map_err(|_| AuthQueryError::ServerLost)?;
    let mut result: Result<Option<String>, String> = Ok(None);
    let mut seen_row = false;
    loop {
        let frame = wire::read_frame(&mut conn.stream, &mut conn.rbuf, MAX_ANSWER_MESSAGE)
            .await
            .map_err(|_| AuthQueryError::ServerLost)?;
        match frame.tag {
            be::DATA_ROW if !seen_row => {
                seen_row = true;
                result = Ok(second_column(frame.body()).ok_or(AuthQueryError::Query("malformed DataRow".into()))?);
            }
            be::ERROR_RESPONSE => {
                let f = messages::parse_error_fields(frame.body()).map_err(|e| AuthQueryError::Query(e.to_string()))?;
                result = Err(f.message);
            }
            be::READY_FOR_QUERY => {
                conn.conv.status = *frame.body().first().ok_or(AuthQueryError::ServerLost)?;
                return Ok(result);
            }
            _ => {}
        }
    }
}

/// The second column of a DataRow as text (None when NULL or absent).
fn second_column(body: &[u8]) -> Option<Option<String>> {
    let (count, mut rest) = body.split_first_chunk::<2>()?;
    let count = i16::from_be_bytes(*count);
    for i in 0..count.min(2) {
        let (len, after) = rest.split_first_chunk::<4>()?;
        let len = i32::from_be_bytes(*len);
        let value = if len < 0 {
            rest = after;
            None
        } else {
            let len = len as usize;
            if after.len() < len {
                return None;
            }
            rest = &after[len..];
            Some(&after[..len])
        };
        if i == 1 {
            return Some(value.map(|v| String::from_utf8_lossy(v).into_owned()));
        }
    }
    Some(None)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(cols: &[Option<&[u8]>]) -> Vec<u8> {
        let mut b = (cols.len() as i16).to_be_bytes().to_vec();
        for c in cols {
            match c {
                None => b.extend_from_slice(&(-1i32).to_be_bytes()),
                Some(v) => {
                    b.extend_from_slice(&(v.len() as i32).to_be_bytes());
                    b.extend_from_slice(v);
                }
            }
        }
        b
    }

    #[test]
    fn second_column_of_data_rows() {
        assert_eq!(second_column(&row(&[Some(b"u"), Some(b"md5abc")])), Some(Some("md5abc".into())));
        assert_eq!(second_column(&row(&[Some(b"u"), None])), Some(None));
        assert_eq!(second_column(&row(&[Some(b"u")])), Some(None));
        assert_eq!(second_column(&row(&[])), Some(None));
        assert_eq!(second_column(&[0, 2, 0, 0, 0, 9, b'x']), None, "truncated");
        assert_eq!(second_column(&[0]), None);
    }

    #[test]
    fn cache_expires_and_negative_answers_are_brief() {
        let c = AuthQueryCache::default();
        let k = ("db".to_owned(), "u".to_owned());
        assert_eq!(c.get(&k, Duration::from_secs(30)), None);
        c.put(k.clone(), Some(Secret::Plain("x".into())));
        assert_eq!(c.get(&k, Duration::from_secs(30)), Some(Some(Secret::Plain("x".into()))));
        assert_eq!(c.get(&k, Duration::ZERO), None);
        c.put(k.clone(), None);
        assert_eq!(c.get(&k, Duration::from_secs(30)), Some(None));
    }
}
