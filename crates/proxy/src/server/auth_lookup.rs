//! auth_query's one parameterised query on a quiet server connection: Parse,
//! Bind with the user name as `$1` (never interpolated), Execute, Sync, and
//! the answer's second column. `auth::query` decides when to ask and caches
//! the answers; the pool lends the connection; this module only talks.

use bytes::BytesMut;
use postgres_protocol::message::frontend;
use postgres_protocol::IsNull;

use super::ServerConn;
use crate::auth::query::{Answer, AuthQueryError};
use crate::protocol::{messages, tags::backend as be};
use crate::wire;

/// Largest message accepted in auth_query's answer.
const MAX_ANSWER_MESSAGE: usize = 1 << 20;

/// Runs `sql` with `$1 = user` on a quiet connection: `Ok(Ok(passwd))` from
/// the second column of the first row (None: no row or NULL), `Ok(Err(..))`
/// when Postgres refused the query. Reads through ReadyForQuery.
pub(crate) async fn run(conn: &mut ServerConn, sql: &str, user: &str) -> Result<Answer, AuthQueryError> {
    let mut out = BytesMut::new();
    let bad = |e: std::io::Error| AuthQueryError::Query(e.to_string());
    frontend::parse("", sql, std::iter::empty(), &mut out).map_err(bad)?;
    let param = |v: &str, buf: &mut BytesMut| -> Result<IsNull, Box<dyn std::error::Error + Sync + Send>> {
        buf.extend_from_slice(v.as_bytes());
        Ok(IsNull::No)
    };
    // A query without `$1` gets no parameter (PgBouncer runs it as written).
    let params: &[&str] = if sql.contains("$1") { &[user] } else { &[] };
    frontend::bind("", "", [0i16], params.iter().copied(), param, [0i16], &mut out).map_err(|e| match e {
        frontend::BindError::Conversion(e) => AuthQueryError::Query(e.to_string()),
        frontend::BindError::Serialization(e) => bad(e),
    })?;
    frontend::execute("", 0, &mut out).map_err(bad)?;
    frontend::sync(&mut out);
    crate::server::exchange::write(conn, &out).await.map_err(|_| AuthQueryError::ServerLost)?;
    let mut result: Answer = Ok(None);
    let mut seen_row = false;
    loop {
        let frame = wire::read_frame(&mut conn.stream, &mut conn.rbuf, MAX_ANSWER_MESSAGE)
            .await
            .map_err(|_| AuthQueryError::ServerLost)?;
        match frame.tag {
            be::DATA_ROW if !seen_row => {
                seen_row = true;
                result =
                    Ok(Some(second_column(frame.body()).ok_or(AuthQueryError::Query("malformed DataRow".into()))?));
            }
            be::ERROR_RESPONSE => {
                let f = messages::parse_error_fields(frame.body()).map_err(|e| AuthQueryError::Query(e.to_string()))?;
                result = Err(f.message_text());
            }
            be::READY_FOR_QUERY => {
                conn.conv.set_status(*frame.body().first().ok_or(AuthQueryError::ServerLost)?);
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
}
