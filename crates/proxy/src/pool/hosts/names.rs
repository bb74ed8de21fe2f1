//! Host names: each configured host that is a name is looked up into its
//! addresses, every one a host of its own. Addresses are kept for
//! `dns_max_ttl` (PgBouncer's key; 0: looked up at every connect); the
//! set's search looks names up afresh at each round. A look-up is bounded
//! by `server_connect_timeout`, and one already running is not started
//! twice: a stuck resolver delays a connect by that bound at most, and the
//! clients waiting for it only within their own budgets. When a name comes
//! to point elsewhere, the servers opened to its old addresses are retired
//! (closed when released).

use std::net::{IpAddr, SocketAddr};
use std::time::Instant;

use weir_metrics::{CloseReason, HostRole};

use super::{Action, Host, HostKey, HostSet, SetState};
use crate::config::HostPort;
use crate::server::dial::resolve;

/// What is known of one configured host's addresses.
#[derive(Debug, Clone, Default)]
pub(super) struct Name {
    /// An address or a Unix socket: never looked up.
    fixed: bool,
    addrs: Vec<SocketAddr>,
    resolved_at: Option<Instant>,
    /// A look-up started then and has not ended.
    resolving_since: Option<Instant>,
    /// Why the last look-up failed.
    error: Option<String>,
}

impl Name {
    pub(super) fn for_hosts(hosts: &[HostPort]) -> Vec<Name> {
        hosts.iter().map(|h| Name { fixed: is_fixed(&h.host), ..Name::default() }).collect()
    }
}

/// An IP address or a Unix socket folder: nothing to look up.
fn is_fixed(host: &str) -> bool {
    host.starts_with('/') || host.parse::<IpAddr>().is_ok()
}

/// The hosts of `cfg` as `names` resolve them, keeping what `old` knew of
/// those that stay; the keys of the hosts that left.
pub(super) fn rebuild(cfg: &[HostPort], names: &[Name], mut old: Vec<Host>) -> (Vec<Host>, Vec<HostKey>) {
    let mut hosts = Vec::new();
    for (hp, name) in cfg.iter().zip(names) {
        let addrs: Vec<Option<SocketAddr>> = if name.fixed {
            vec![hp.host.parse::<IpAddr>().ok().map(|ip| SocketAddr::new(ip, hp.port))]
        } else if name.addrs.is_empty() {
            vec![None]
        } else {
            name.addrs.iter().copied().map(Some).collect()
        };
        for addr in addrs {
            let fresh = Host::new(&hp.host, hp.port, addr);
            let host = match old.iter().position(|h| h.key == fresh.key) {
                Some(i) => old.swap_remove(i),
                None => fresh,
            };
            hosts.push(host);
        }
    }
    for h in hosts.iter_mut().filter(|h| h.addr.is_none() && !h.name.starts_with('/')) {
        // A name with no address yet: unreachable once a look-up failed.
        let name = cfg.iter().position(|c| c.host == h.name).map(|i| &names[i]);
        if let Some(e) = name.and_then(|n| n.error.clone()) {
            h.role = HostRole::Unreachable;
            h.last_error = Some(e);
        }
    }
    let gone = old.into_iter().map(|h| h.key).collect();
    (hosts, gone)
}

/// `rebuild` from nothing known.
pub(super) fn expand(cfg: &[HostPort], names: &[Name], old: Vec<Host>) -> Vec<Host> {
    rebuild(cfg, names, old).0
}

impl HostSet {
    /// Looks up the names whose addresses are older than `dns_max_ttl`
    /// (every name, when `fresh`), each within `server_connect_timeout`.
    /// Returns the look-ups of this call that failed: the host and port.
    pub(super) async fn refresh_names(&self, fresh: bool) -> Vec<(String, u16)> {
        let (due, limit) = {
            let mut st = self.state.lock();
            let now = Instant::now();
            let (ttl, limit) = (st.cfg.dns_max_ttl, st.cfg.connect_timeout);
            let mut due = Vec::new();
            for (i, (hp, name)) in st.cfg.hosts.clone().iter().zip(st.names.iter_mut()).enumerate() {
                let stale = fresh || name.resolved_at.is_none_or(|t| now.duration_since(t) >= ttl);
                let running = name.resolving_since.is_some_and(|t| now.duration_since(t) < limit);
                if !name.fixed && stale && !running {
                    name.resolving_since = Some(now);
                    due.push((i, hp.clone()));
                }
            }
            (due, limit)
        };
        if due.is_empty() {
            return Vec::new();
        }
        let lookups = due.iter().map(|(i, hp)| async move {
            let found = match tokio::time::timeout(limit, resolve(&hp.host, hp.port)).await {
                Ok(Ok(addrs)) => Ok(addrs),
                Ok(Err(e)) => Err(format!("looking up {}: {e}", hp.host)),
                Err(_) => Err(format!("looking up {} took longer than {limit:?}", hp.host)),
            };
            (*i, found)
        });
        let results = futures_util::future::join_all(lookups).await;
        // join_all keeps the order of `due`.
        let failed: Vec<(String, u16)> = (due.iter().zip(&results))
            .filter(|(_, (_, found))| found.is_err())
            .map(|((_, hp), _)| (hp.host.clone(), hp.port))
            .collect();
        let mut actions = Vec::new();
        {
            let mut st = self.state.lock();
            self.resolved(&mut st, results, &mut actions);
            self.publish(&st);
        }
        self.act(actions);
        failed
    }

    /// Applies look-ups: new addresses join, old ones leave (their servers retired).
    fn resolved(
        &self,
        st: &mut SetState,
        results: Vec<(usize, Result<Vec<SocketAddr>, String>)>,
        actions: &mut Vec<Action>,
    ) {
        let now = Instant::now();
        let mut changed = false;
        for (i, found) in results {
            let Some(name) = st.names.get_mut(i) else { continue };
            name.resolving_since = None;
            match found {
                Ok(addrs) => {
                    name.resolved_at = Some(now);
                    name.error = None;
                    if name.addrs != addrs {
                        if !name.addrs.is_empty() {
                            tracing::info!(database = %self.database, host = %st.cfg.hosts[i].host,
                                from = ?name.addrs, to = ?addrs, "host name now resolves elsewhere");
                        }
                        name.addrs = addrs;
                        changed = true;
                    }
                }
                // A failed look-up keeps the addresses last found.
                Err(e) => {
                    if name.error.as_ref() != Some(&e) {
                        tracing::warn!(database = %self.database, error = %e, "host name look-up failed");
                    }
                    name.resolved_at = Some(now);
                    changed |= name.addrs.is_empty();
                    name.error = Some(e);
                }
            }
        }
        if changed {
            let old = std::mem::take(&mut st.hosts);
            let (hosts, gone) = rebuild(&st.cfg.hosts, &st.names, old);
            st.hosts = hosts;
            actions.extend(gone.into_iter().map(|k| Action::Retire(k, CloseReason::HostGone)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(h: &str) -> HostPort {
        HostPort { host: h.into(), port: 5432 }
    }

    #[test]
    fn a_name_counts_once_per_address_and_keeps_what_was_known() {
        let cfg = [hp("10.0.0.9"), hp("db.example"), hp("/run/pg")];
        let mut names = Name::for_hosts(&cfg);
        let hosts = expand(&cfg, &names, Vec::new());
        let keys: Vec<String> = hosts.iter().map(|h| h.key.to_string()).collect();
        assert_eq!(keys, ["10.0.0.9:5432", "db.example:5432", "/run/pg:5432"], "not looked up yet");
        names[1].addrs = vec!["10.1.0.1:5432".parse().unwrap(), "10.1.0.2:5432".parse().unwrap()];
        let mut known = hosts;
        known[0].role = HostRole::Primary;
        let (hosts, gone) = rebuild(&cfg, &names, known);
        let keys: Vec<String> = hosts.iter().map(|h| h.key.to_string()).collect();
        assert_eq!(keys, ["10.0.0.9:5432", "10.1.0.1:5432", "10.1.0.2:5432", "/run/pg:5432"]);
        assert_eq!(hosts[0].role, HostRole::Primary, "kept");
        assert_eq!(hosts[1].name, "db.example", "the name stays the TLS server name");
        assert_eq!(gone, [HostKey::Named("db.example".into(), 5432)]);
        names[1].addrs = vec!["10.1.0.2:5432".parse().unwrap()];
        let (_, gone) = rebuild(&cfg, &names, hosts);
        assert_eq!(gone, [HostKey::Addr("10.1.0.1:5432".parse().unwrap())], "the old address leaves");
    }

    #[test]
    fn a_name_that_never_resolved_is_unreachable_after_a_failed_look_up() {
        let cfg = [hp("nowhere.invalid")];
        let mut names = Name::for_hosts(&cfg);
        names[0].error = Some("looking up nowhere.invalid: no address".into());
        let hosts = expand(&cfg, &names, Vec::new());
        assert_eq!(hosts[0].role, HostRole::Unreachable);
        assert!(hosts[0].last_error.as_deref().unwrap().contains("no address"));
    }
}
