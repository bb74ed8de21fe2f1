//! What a server is, for `target_session_attrs`: in recovery (a hot
//! standby) or not, and whether its sessions start read-only. Postgres 14
//! and later report both at login (`in_hot_standby` and
//! `default_transaction_read_only` in the startup ParameterStatus); before
//! that one query asks, as libpq does. Also the probe the host set sends
//! while it searches for a matching host: a login on a fresh connection
//! that no pool counts, the role read, and a Terminate.

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;
use weir_metrics::{CloseReason, HostRole};

use super::dial::{open, ConnectError, ConnectSpec};
use super::exchange::run_rows;
use super::ServerConn;
use crate::config::TargetSessionAttrs;
use crate::params::ParamMap;
use crate::protocol::{messages, tags::backend as be};
use crate::wire;

/// The parameter Postgres 14+ reports and changes when a standby is promoted.
pub(crate) const IN_HOT_STANDBY: &str = "in_hot_standby";
const DEFAULT_READ_ONLY: &str = "default_transaction_read_only";

/// Both answers in one query, for servers older than 14.
const ROLE_QUERY: &str =
    "SELECT pg_catalog.pg_is_in_recovery(), pg_catalog.current_setting('default_transaction_read_only')";

/// Largest message the probe reads.
const PROBE_MAX_MESSAGE: usize = 1 << 20;

/// A server's role as its login (or the query) told.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ServerRole {
    /// In recovery: a hot standby (`in_hot_standby`, `pg_is_in_recovery()`).
    pub in_recovery: bool,
    /// Its sessions start read-only (`default_transaction_read_only`).
    pub read_only: bool,
}

impl ServerRole {
    /// From the parameters a Postgres 14+ reports at login; None when it
    /// did not report both.
    pub(crate) fn from_params(params: &ParamMap) -> Option<ServerRole> {
        let in_recovery = on(params.get(IN_HOT_STANDBY)?)?;
        let read_only = on(params.get(DEFAULT_READ_ONLY)?)?;
        Some(ServerRole { in_recovery, read_only })
    }

    /// From `ROLE_QUERY`'s DataRow body.
    fn from_row(body: &[u8]) -> Option<ServerRole> {
        let (count, mut rest) = body.split_first_chunk::<2>()?;
        if i16::from_be_bytes(*count) != 2 {
            return None;
        }
        let mut column = || {
            let (len, after) = rest.split_first_chunk::<4>()?;
            let len = usize::try_from(i32::from_be_bytes(*len)).ok()?;
            let (value, after) = (after.len() >= len).then(|| after.split_at(len))?;
            rest = after;
            std::str::from_utf8(value).ok()
        };
        let in_recovery = on(column()?)?;
        let read_only = on(column()?)?;
        Some(ServerRole { in_recovery, read_only })
    }

    /// A Postgres 14+ server reports both: not in recovery, and its
    /// sessions' transactions start read-write. Older servers say nothing.
    pub(crate) fn says_writable(params: &ParamMap) -> bool {
        Self::from_params(params) == Some(ServerRole { in_recovery: false, read_only: false })
    }

    /// The role as SHOW and `/metrics` name it.
    pub(crate) fn host_role(self) -> HostRole {
        match self {
            ServerRole { in_recovery: true, .. } => HostRole::Standby,
            ServerRole { read_only: true, .. } => HostRole::ReadOnly,
            _ => HostRole::Primary,
        }
    }
}

impl ServerConn {
    /// Why the connection must close instead of going back to the pool, as
    /// its loan ends: whoever found it broken says so, and a write it refused
    /// during the loan retires it unless it now says it is a writable primary
    /// (then the client's own transaction was read-only). The refusal is
    /// weighed once: the next loan starts without it.
    pub(crate) fn close_reason_at_release(&mut self) -> Option<CloseReason> {
        if std::mem::take(&mut self.refused_write) && !ServerRole::says_writable(&self.params) {
            self.broken.get_or_insert(CloseReason::RoleChanged);
        }
        self.broken
    }
}

/// Whether a host in `role` is what `target` asks for (libpq's rules;
/// prefer-standby takes any server, the host set prefers standbys). `any`
/// takes a host whose role is not known yet: whatever it is, it will do.
pub(crate) fn matches(role: HostRole, target: TargetSessionAttrs) -> bool {
    use HostRole::{Primary, ReadOnly, Standby, Unknown};
    use TargetSessionAttrs as T;
    match target {
        T::Any => matches!(role, Primary | ReadOnly | Standby | Unknown),
        T::PreferStandby => matches!(role, Primary | ReadOnly | Standby),
        T::ReadWrite => role == Primary,
        T::ReadOnly => matches!(role, ReadOnly | Standby),
        T::Primary => matches!(role, Primary | ReadOnly),
        T::Standby => role == Standby,
    }
}

/// A boolean setting's text: `on`/`off` (SHOW) or `t`/`f` (a bool column).
fn on(v: &str) -> Option<bool> {
    match v {
        "on" | "t" | "true" => Some(true),
        "off" | "f" | "false" => Some(false),
        _ => None,
    }
}

impl ServerConn {
    /// This server's role: from its login's parameters, or one query
    /// (unbounded: the caller bounds it).
    pub(crate) async fn role(&mut self) -> Result<ServerRole, CloseReason> {
        if let Some(role) = ServerRole::from_params(&self.params) {
            return Ok(role);
        }
        let mut role = None;
        let refused = run_rows(self, ROLE_QUERY, |row| role = role.or(ServerRole::from_row(row))).await?;
        match (refused, role) {
            (None, Some(role)) => Ok(role),
            _ => Err(CloseReason::ServerError),
        }
    }
}

/// Why a probe learned no role.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ProbeError {
    #[error("{0}")]
    Connect(#[from] ConnectError),
    #[error("the role query failed: {0}")]
    Query(String),
}

/// Logs in to the host `spec` aims at on a connection of its own (no pool
/// counts it), reads the role, and hangs up. Unbounded: the caller bounds it.
pub(crate) async fn probe(spec: &ConnectSpec) -> Result<ServerRole, ProbeError> {
    let (mut stream, mut buf, login) = open(spec).await?;
    let mut params = ParamMap::new();
    for (k, v) in &login.server_params {
        params.set(k, v);
    }
    let role = match ServerRole::from_params(&params) {
        Some(role) => Ok(role),
        None => query(&mut stream, &mut buf).await,
    };
    let mut out = BytesMut::new();
    messages::terminate(&mut out);
    let _ = stream.write_all(&out).await;
    role
}

/// Runs `ROLE_QUERY` on a fresh login's stream.
async fn query(stream: &mut super::stream::ServerStream, buf: &mut BytesMut) -> Result<ServerRole, ProbeError> {
    let mut out = BytesMut::new();
    messages::query(&mut out, ROLE_QUERY);
    let failed = |e: &dyn std::fmt::Display| ProbeError::Query(e.to_string());
    stream.write_all(&out).await.map_err(|e| failed(&e))?;
    let mut role = None;
    let mut refused = None;
    loop {
        let frame = wire::read_frame(stream, buf, PROBE_MAX_MESSAGE).await.map_err(|e| failed(&e))?;
        match frame.tag {
            be::DATA_ROW => role = role.or(ServerRole::from_row(frame.body())),
            be::ERROR_RESPONSE => {
                refused = Some(
                    messages::parse_error_fields(frame.body())
                        .map_or_else(|_| "an unreadable error".to_owned(), |f| f.message_text()),
                )
            }
            be::READY_FOR_QUERY => break,
            _ => {}
        }
    }
    match (refused, role) {
        (None, Some(role)) => Ok(role),
        (Some(why), _) => Err(ProbeError::Query(why)),
        (None, None) => Err(ProbeError::Query("no row".into())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(pairs: &[(&str, &str)]) -> ParamMap {
        let mut p = ParamMap::new();
        pairs.iter().for_each(|(k, v)| p.set(k, v));
        p
    }

    #[test]
    fn roles_come_from_the_login_on_14_and_later() {
        let primary = params(&[("in_hot_standby", "off"), ("default_transaction_read_only", "off")]);
        assert_eq!(ServerRole::from_params(&primary).unwrap().host_role(), HostRole::Primary);
        let standby = params(&[("in_hot_standby", "on"), ("default_transaction_read_only", "off")]);
        assert_eq!(ServerRole::from_params(&standby).unwrap().host_role(), HostRole::Standby);
        let ro = params(&[("in_hot_standby", "off"), ("default_transaction_read_only", "on")]);
        assert_eq!(ServerRole::from_params(&ro).unwrap().host_role(), HostRole::ReadOnly);
        assert_eq!(ServerRole::from_params(&params(&[("in_hot_standby", "off")])), None, "13 and before: ask");
    }

    #[test]
    fn the_query_row_reads_both_columns() {
        let mut row = 2i16.to_be_bytes().to_vec();
        for v in [&b"t"[..], b"off"] {
            row.extend_from_slice(&(v.len() as i32).to_be_bytes());
            row.extend_from_slice(v);
        }
        assert_eq!(ServerRole::from_row(&row), Some(ServerRole { in_recovery: true, read_only: false }));
        assert_eq!(ServerRole::from_row(&row[..row.len() - 1]), None);
    }

    #[test]
    fn targets_match_as_libpq_says() {
        use HostRole::*;
        use TargetSessionAttrs as T;
        let table = [
            (T::Any, [true, true, true, false, true]),
            (T::ReadWrite, [true, false, false, false, false]),
            (T::ReadOnly, [false, true, true, false, false]),
            (T::Primary, [true, true, false, false, false]),
            (T::Standby, [false, false, true, false, false]),
            (T::PreferStandby, [true, true, true, false, false]),
        ];
        for (target, want) in table {
            let got = [Primary, ReadOnly, Standby, Unreachable, Unknown].map(|r| matches(r, target));
            assert_eq!(got, want, "{target:?}");
        }
    }
}
