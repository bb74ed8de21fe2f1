//! The search for a host that matches, when none is known to: one task per
//! set probes every host at once (a login of its own that no pool counts,
//! the role read, a Terminate; `server::role::probe`), at most one probe per
//! host at a time, each within `server_connect_timeout`. Rounds start 50 ms
//! apart, then 100, 200 and 250 ms: a promoted standby is found within a
//! quarter of a second of accepting logins. After 30 s of searching the
//! pace slows to `server_login_retry`. Names are looked up afresh at each
//! round. The search ends when a host matches (the pools are woken and
//! their connects dial it), when a probe's login is refused (the waiting
//! connects end with Postgres's error, as a pool's own login would), or
//! when no connect has wanted it for a while.
//!
//! Between searches, the hosts that do not match (unreachable, a standby
//! where writes are wanted, not known yet) are asked again every 10 s while
//! a pool of the database lives (`survey`): their roles in SHOW and
//! `/metrics` are never older than that, a host back from an outage takes
//! its share again (`any`, round-robin), and a standby that came back is
//! preferred again (`prefer-standby`). Hosts that match are seen by the
//! pools' own connects.

use std::sync::Arc;
use std::time::{Duration, Instant};

use futures_util::stream::{FuturesUnordered, StreamExt};

use super::{HostKey, HostSet, Outcome};
use crate::protocol::SqlState;
use crate::server::role::{probe, ProbeError};
use crate::server::ConnectSpec;

/// The pace of the first 30 s of a search.
const FIRST_PAUSE: Duration = Duration::from_millis(50);
const FAST_PAUSE_MAX: Duration = Duration::from_millis(250);
const FAST_FOR: Duration = Duration::from_secs(30);
/// How often hosts that do not match are asked again between searches.
const SURVEY_EVERY: Duration = Duration::from_secs(10);

/// The set's search, behind the set's lock.
#[derive(Debug, Default)]
pub(super) struct Search {
    running: bool,
    since: Option<Instant>,
    /// When a connect last found no host to dial.
    wanted_at: Option<Instant>,
    /// Whose credentials the probes log in with.
    spec: Option<Arc<ConnectSpec>>,
    /// A probe's login was refused: its SQLSTATE and message.
    refused: Option<(SqlState, String)>,
    /// When the hosts that do not match were last asked (or a survey began).
    surveyed_at: Option<Instant>,
}

/// How a wait for the search ended.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Found {
    Host,
    Refused(SqlState, String),
    TimedOut,
}

/// What one probe found.
enum Probed {
    Outcome(Outcome),
    Refused(SqlState, String),
}

impl HostSet {
    /// A connect found no host to dial: the set searches, its probes
    /// logging in as `spec` does.
    pub(super) fn want_search(self: &Arc<Self>, spec: &Arc<ConnectSpec>) {
        let mut st = self.state.lock();
        let now = Instant::now();
        st.search.wanted_at = Some(now);
        st.search.spec = Some(spec.clone());
        if st.search.running {
            return;
        }
        st.search.running = true;
        st.search.since = Some(now);
        st.search.refused = None;
        tracing::info!(database = %self.database, target = st.cfg.target.as_str(),
            "no host is known to match target_session_attrs; probing every host");
        tokio::spawn(run(self.clone()));
    }

    /// Waits until a host matches, the search's login is refused, or `deadline`.
    pub(super) async fn found_by(&self, deadline: Instant) -> Found {
        loop {
            let notified = self.found.notified();
            let mut notified = std::pin::pin!(notified);
            notified.as_mut().enable();
            {
                let st = self.state.lock();
                if Self::can_pick(&st) {
                    return Found::Host;
                }
                if let Some((code, message)) = st.search.refused.clone() {
                    return Found::Refused(code, message);
                }
            }
            if Instant::now() >= deadline {
                return Found::TimedOut;
            }
            tokio::select! {
                _ = notified => {}
                _ = tokio::time::sleep_until(deadline.into()) => {}
            }
        }
    }

    /// The specs to probe now, aimed at each host not being probed.
    fn probe_targets(&self, probing: &[HostKey]) -> Vec<(HostKey, ConnectSpec, Duration)> {
        let st = self.state.lock();
        let Some(spec) = st.search.spec.clone() else { return Vec::new() };
        let limit = st.cfg.connect_timeout;
        st.hosts
            .iter()
            .filter(|h| !probing.contains(&h.key))
            .map(|h| (h.key.clone(), spec.aimed(&h.name, h.port, h.addr), limit))
            .collect()
    }

    /// Whether the search goes on, and the pause after the round starting now.
    fn next_round(&self, round: u32) -> Option<Duration> {
        let mut st = self.state.lock();
        let linger = st.cfg.connect_timeout + st.cfg.retry_max + Duration::from_secs(1);
        let found = Self::can_pick(&st);
        let unwanted = st.search.wanted_at.is_none_or(|t| t.elapsed() > linger);
        if found || unwanted || st.search.refused.is_some() {
            st.search.running = false;
            if !found {
                tracing::info!(database = %self.database, "no connect is waiting: the search for a matching host stops");
            }
            return None;
        }
        let searching = st.search.since.map(|t| t.elapsed()).unwrap_or_default();
        Some(pause(round, searching, st.cfg.retry_max))
    }

    /// Called by each pool's upkeep (`spec`: its credentials): every
    /// `SURVEY_EVERY`, when no search runs, the hosts that do not match are
    /// probed once, at once.
    pub(crate) fn survey(self: &Arc<Self>, spec: &ConnectSpec) {
        let targets = {
            let mut st = self.state.lock();
            let due = st.search.surveyed_at.is_none_or(|t| t.elapsed() >= SURVEY_EVERY);
            let lone = st.hosts.len() == 1 && st.cfg.target == crate::config::TargetSessionAttrs::Any;
            if st.search.running || !due || lone {
                return;
            }
            st.search.surveyed_at = Some(Instant::now());
            let (target, limit) = (st.cfg.target, st.cfg.connect_timeout);
            st.hosts
                .iter()
                .filter(|h| !super::matches(h.role, target) || h.role == weir_metrics::HostRole::Unknown)
                .map(|h| (h.key.clone(), spec.aimed(&h.name, h.port, h.addr), limit))
                .collect::<Vec<_>>()
        };
        if targets.is_empty() {
            return;
        }
        let set = self.clone();
        tokio::spawn(async move {
            let probes = targets.into_iter().map(|(key, spec, limit)| probe_one(key, spec, limit));
            for (key, probed) in futures_util::future::join_all(probes).await {
                match probed {
                    Probed::Outcome(outcome) => set.learned(&key, outcome),
                    Probed::Refused(_, message) => set.learned(&key, Outcome::Answered(message)),
                }
            }
        });
    }

    fn refused(&self, code: SqlState, message: String) {
        let mut st = self.state.lock();
        tracing::warn!(database = %self.database, sqlstate = code.code(), "the search's login was refused: {message}");
        st.search.refused = Some((code, message));
        drop(st);
        self.found.notify_waiters();
    }
}

/// The pause between rounds: 50, 100, 200, then 250 ms; after 30 s of
/// searching, `retry_max` (server_login_retry).
fn pause(round: u32, searching: Duration, retry_max: Duration) -> Duration {
    let fast = FIRST_PAUSE.saturating_mul(1 << round.min(3)).min(FAST_PAUSE_MAX);
    if searching < FAST_FOR {
        fast
    } else {
        retry_max.max(fast)
    }
}

async fn run(set: Arc<HostSet>) {
    let mut inflight = FuturesUnordered::new();
    let mut probing: Vec<HostKey> = Vec::new();
    let mut round = 0;
    while let Some(pause) = set.next_round(round) {
        round += 1;
        let next = tokio::time::Instant::now() + pause;
        set.refresh_names(true).await;
        for (key, spec, limit) in set.probe_targets(&probing) {
            probing.push(key.clone());
            inflight.push(probe_one(key, spec, limit));
        }
        let mut wait = std::pin::pin!(tokio::time::sleep_until(next));
        loop {
            tokio::select! {
                Some((key, probed)) = inflight.next(), if !inflight.is_empty() => {
                    probing.retain(|k| *k != key);
                    match probed {
                        Probed::Outcome(outcome) => set.learned(&key, outcome),
                        Probed::Refused(code, message) => {
                            set.learned(&key, Outcome::Answered(message.clone()));
                            set.refused(code, message);
                        }
                    }
                    let st = set.state.lock();
                    if HostSet::can_pick(&st) || st.search.refused.is_some() {
                        break;
                    }
                }
                _ = &mut wait => break,
            }
        }
    }
}

/// One probe of one host, within `limit`.
async fn probe_one(key: HostKey, spec: ConnectSpec, limit: Duration) -> (HostKey, Probed) {
    let probed = match tokio::time::timeout(limit, probe(&spec)).await {
        Ok(Ok(role)) => Probed::Outcome(Outcome::Role(role.host_role())),
        Ok(Err(ProbeError::Connect(e))) => match e.rejection() {
            Some((code, message)) => Probed::Refused(code, message),
            None if e.unreachable() => Probed::Outcome(Outcome::Unreachable(e.to_string())),
            None => Probed::Outcome(Outcome::Answered(e.to_string())),
        },
        Ok(Err(e)) => Probed::Outcome(Outcome::Answered(e.to_string())),
        Err(_) => Probed::Outcome(Outcome::Unreachable(format!("no answer within {limit:?}"))),
    };
    (key, probed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_pace_is_fast_for_thirty_seconds_then_server_login_retry() {
        let retry = Duration::from_secs(2);
        let ms = |r| pause(r, Duration::from_secs(1), retry).as_millis();
        assert_eq!([ms(0), ms(1), ms(2), ms(3), ms(9)], [50, 100, 200, 250, 250]);
        assert_eq!(pause(9, Duration::from_secs(31), retry), retry);
        assert_eq!(pause(9, Duration::from_secs(31), Duration::from_millis(100)), FAST_PAUSE_MAX);
    }
}
