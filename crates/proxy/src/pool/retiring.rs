//! The rules that retire a host's servers (`Retiring`): after a host's role
//! changed or its name came to point elsewhere, the pool's servers of that
//! host opened before that moment close when released, with the reason the
//! rule names. Kept in the pool's `State` for server_lifetime.

use std::time::{Duration, Instant};

use weir_metrics::CloseReason;

use super::hosts::HostKey;
use crate::server::ServerConn;

/// The servers of one host opened before `before` retire with `reason`.
#[derive(Debug)]
pub(super) struct Rule {
    host: HostKey,
    before: Instant,
    reason: CloseReason,
}

impl Rule {
    /// `conn` is a server of the rule's host, opened before the rule.
    pub(super) fn applies(&self, conn: &ServerConn) -> bool {
        let spec = conn.spec();
        let same_host = match &self.host {
            HostKey::Addr(a) => spec.addr == Some(*a),
            HostKey::Named(h, p) => spec.addr.is_none() && spec.host == *h && spec.port == *p,
        };
        same_host && conn.created < self.before
    }
}

/// A pool's rules, at most one a host.
#[derive(Debug, Default)]
pub(super) struct Retiring(Vec<Rule>);

impl Retiring {
    /// A rule for `host` from `now`, in place of the host's last one; rules
    /// older than `lifetime` (server_lifetime) go, their servers gone anyway.
    pub(super) fn add(&mut self, host: &HostKey, reason: CloseReason, now: Instant, lifetime: Duration) -> &Rule {
        self.0.retain(|r| now.saturating_duration_since(r.before) < lifetime && r.host != *host);
        self.0.push(Rule { host: host.clone(), before: now, reason });
        self.0.last().expect("just pushed")
    }

    /// Why `conn` must close when released, if a rule says so. One length
    /// check unless a host's role changed or its name moved within
    /// server_lifetime.
    pub(super) fn reason_for(&self, conn: &ServerConn) -> Option<CloseReason> {
        if self.0.is_empty() {
            return None;
        }
        self.0.iter().find(|r| r.applies(conn)).map(|r| r.reason)
    }
}
