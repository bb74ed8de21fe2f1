//! Reading a server's session-level settings back, after a client's
//! transaction that may have changed some Postgres does not report (a SET,
//! RESET, set_config...). The server has already applied its own rules (a
//! rolled-back SET, SET LOCAL, a savepoint's rollback), so what it holds now
//! is what the client keeps. One simple query on a quiet connection.

use weir_metrics::CloseReason;

use super::exchange::run_rows;
use super::ServerConn;
use crate::params::ParamMap;

/// Every setting set at session level, as `pg_settings.setting` (which
/// `set_config` takes back as is). The `transaction_*` ones are the current
/// transaction's, never the session's.
const SESSION_SETTINGS: &str = "SELECT name, setting FROM pg_catalog.pg_settings \
     WHERE source = 'session' AND left(name, 12) <> 'transaction_'";

/// What the read-back found.
#[derive(Debug, PartialEq, Eq)]
pub enum Readback {
    /// The server's session settings, those it reports excepted (their
    /// ParameterStatus already told weir).
    Settings(ParamMap),
    /// Postgres refused the query or sent a value that is not UTF-8: the
    /// server's state is unknown.
    Unreadable,
}

impl ServerConn {
    /// Reads this quiet server's session settings. Err: the connection broke.
    pub async fn read_back_settings(&mut self) -> Result<Readback, CloseReason> {
        let mut rows = Vec::new();
        let refused = run_rows(self, SESSION_SETTINGS, |row| rows.push(row.to_vec())).await?;
        let mut settings = ParamMap::new();
        for row in &rows {
            match two_columns(row).map(|(k, v)| (std::str::from_utf8(k), std::str::from_utf8(v))) {
                Some((Ok(k), Ok(v))) if self.params.get(k).is_none() => settings.set(k, v),
                Some((Ok(_), Ok(_))) => {}
                _ => return Ok(Readback::Unreadable),
            }
        }
        Ok(if refused.is_none() { Readback::Settings(settings) } else { Readback::Unreadable })
    }
}

/// The two non-NULL columns of a DataRow body.
fn two_columns(body: &[u8]) -> Option<(&[u8], &[u8])> {
    let (count, rest) = body.split_first_chunk::<2>()?;
    if i16::from_be_bytes(*count) != 2 {
        return None;
    }
    let (first, rest) = column(rest)?;
    let (second, _) = column(rest)?;
    Some((first, second))
}

fn column(at: &[u8]) -> Option<(&[u8], &[u8])> {
    let (len, rest) = at.split_first_chunk::<4>()?;
    let len = usize::try_from(i32::from_be_bytes(*len)).ok()?;
    (rest.len() >= len).then(|| rest.split_at(len))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn data_rows_of_two_text_columns() {
        let mut row = 2i16.to_be_bytes().to_vec();
        for v in [&b"statement_timeout"[..], b"150"] {
            row.extend_from_slice(&(v.len() as i32).to_be_bytes());
            row.extend_from_slice(v);
        }
        assert_eq!(two_columns(&row), Some((&b"statement_timeout"[..], &b"150"[..])));
        assert_eq!(two_columns(&row[..row.len() - 1]), None, "truncated");
        let null = [0, 2, 0, 0, 0, 1, b'x', 0xff, 0xff, 0xff, 0xff];
        assert_eq!(two_columns(&null), None, "NULL");
        assert_eq!(two_columns(&[0, 1, 0, 0, 0, 0]), None, "one column");
    }
}
