//! Which host a new connection dials: among the hosts known to match the
//! target (not already tried by this connect), by `load_balance_hosts`
//! (`disable` stays on the host it took until that host fails).
//! `prefer-standby` takes a standby first, and any other server only once
//! no host's role is unknown. None: no host is known to match (the set
//! searches). A set of one host with target `any` always dials it.

use rand::Rng;
use weir_metrics::HostRole;

use super::{Host, HostKey};
use crate::config::{LoadBalanceHosts, TargetSessionAttrs};
use crate::server::role::matches;

/// The index of the host to dial, or None.
pub(super) fn choose(
    hosts: &[Host],
    target: TargetSessionAttrs,
    balance: LoadBalanceHosts,
    cursor: &mut usize,
    tried: &[HostKey],
) -> Option<usize> {
    let fresh = |h: &&Host| !tried.contains(&h.key);
    if hosts.len() == 1 && target == TargetSessionAttrs::Any {
        return fresh(&&hosts[0]).then_some(0);
    }
    let indices = |keep: &dyn Fn(&Host) -> bool| -> Vec<usize> {
        hosts.iter().enumerate().filter(|(_, h)| fresh(h) && keep(h)).map(|(i, _)| i).collect()
    };
    let candidates = if target == TargetSessionAttrs::PreferStandby {
        let standbys = indices(&|h| h.role == HostRole::Standby);
        if !standbys.is_empty() {
            standbys
        } else if hosts.iter().any(|h| fresh(&h) && h.role == HostRole::Unknown) {
            Vec::new()
        } else {
            indices(&|h| matches(h.role, target))
        }
    } else {
        indices(&|h| matches(h.role, target))
    };
    if candidates.is_empty() {
        return None;
    }
    let at = match balance {
        // PgBouncer's `disable`: the host the last connect took while it is
        // a candidate, else the next one after it in the list (wrapping); a
        // host that answers again does not take the connections back.
        // `cursor` is that host's place in the list.
        LoadBalanceHosts::Disable => {
            let current = *cursor % hosts.len();
            let at = candidates.iter().position(|&i| i >= current).unwrap_or(0);
            *cursor = candidates[at];
            at
        }
        LoadBalanceHosts::RoundRobin => {
            let at = *cursor % candidates.len();
            *cursor = cursor.wrapping_add(1);
            at
        }
        LoadBalanceHosts::Random => rand::thread_rng().gen_range(0..candidates.len()),
    };
    Some(candidates[at])
}

#[cfg(test)]
mod tests {
    use super::*;
    use HostRole::*;
    use LoadBalanceHosts as L;
    use TargetSessionAttrs as T;

    fn hosts(roles: &[HostRole]) -> Vec<Host> {
        roles
            .iter()
            .enumerate()
            .map(|(i, r)| {
                let mut h = Host::new(&format!("10.0.0.{i}"), 5432, Some(format!("10.0.0.{i}:5432").parse().unwrap()));
                h.role = *r;
                h
            })
            .collect()
    }

    fn pick(hs: &[Host], target: T, balance: L, cursor: &mut usize) -> Option<usize> {
        choose(hs, target, balance, cursor, &[])
    }

    #[test]
    fn read_write_skips_a_standby_listed_first() {
        let hs = hosts(&[Standby, Primary]);
        assert_eq!(pick(&hs, T::ReadWrite, L::RoundRobin, &mut 0), Some(1));
        assert_eq!(pick(&hs, T::Standby, L::Disable, &mut 0), Some(0));
        assert_eq!(pick(&hosts(&[Standby, ReadOnly]), T::ReadWrite, L::Disable, &mut 0), None, "search");
        assert_eq!(pick(&hosts(&[Unknown, Unknown]), T::ReadWrite, L::Disable, &mut 0), None, "search");
    }

    #[test]
    fn balancing_spreads_over_matching_hosts_only() {
        let hs = hosts(&[Primary, Standby, Standby, Unreachable]);
        let mut cursor = 0;
        let rr: Vec<_> = (0..4).map(|_| pick(&hs, T::ReadOnly, L::RoundRobin, &mut cursor).unwrap()).collect();
        assert_eq!(rr, [1, 2, 1, 2]);
        let first: Vec<_> = (0..3).map(|_| pick(&hs, T::Any, L::Disable, &mut cursor).unwrap()).collect();
        assert_eq!(first, [0, 0, 0], "disable: the first matching host until it fails");
        for _ in 0..20 {
            assert!(matches!(pick(&hs, T::Any, L::Random, &mut cursor), Some(0..=2)), "never the unreachable one");
        }
    }

    #[test]
    fn disable_keeps_the_host_it_took_until_that_host_fails() {
        let mut hs = hosts(&[Unreachable, Primary, Primary]);
        let mut cursor = 0;
        assert_eq!(pick(&hs, T::Any, L::Disable, &mut cursor), Some(1), "the first not known to fail");
        hs[0].role = Primary;
        assert_eq!(pick(&hs, T::Any, L::Disable, &mut cursor), Some(1), "the first host back takes nothing back");
        hs[1].role = Unreachable;
        assert_eq!(pick(&hs, T::Any, L::Disable, &mut cursor), Some(2), "the next after the one that failed");
        hs[2].role = Unreachable;
        assert_eq!(pick(&hs, T::Any, L::Disable, &mut cursor), Some(0), "from the end to the start of the list");
        assert_eq!(pick(&hs, T::Any, L::Disable, &mut cursor), Some(0));
    }

    #[test]
    fn any_takes_hosts_not_yet_known_and_a_lone_host_even_unreachable() {
        assert_eq!(pick(&hosts(&[Unknown, Unknown]), T::Any, L::Disable, &mut 0), Some(0));
        assert_eq!(pick(&hosts(&[Unreachable, Unreachable]), T::Any, L::Disable, &mut 0), None);
        assert_eq!(pick(&hosts(&[Unreachable]), T::Any, L::Disable, &mut 0), Some(0), "one host: dial it");
        assert_eq!(pick(&hosts(&[Unreachable]), T::ReadWrite, L::Disable, &mut 0), None, "one host with a target");
    }

    #[test]
    fn prefer_standby_waits_for_unknown_hosts_before_settling_for_a_primary() {
        assert_eq!(pick(&hosts(&[Primary, Standby]), T::PreferStandby, L::Disable, &mut 0), Some(1));
        assert_eq!(pick(&hosts(&[Primary, Unknown]), T::PreferStandby, L::Disable, &mut 0), None);
        assert_eq!(pick(&hosts(&[Primary, Unreachable]), T::PreferStandby, L::Disable, &mut 0), Some(0));
    }

    #[test]
    fn hosts_tried_by_this_connect_are_skipped() {
        let hs = hosts(&[Primary, Primary]);
        assert_eq!(choose(&hs, T::ReadWrite, L::Disable, &mut 0, &[hs[0].key.clone()]), Some(1));
        let both = [hs[0].key.clone(), hs[1].key.clone()];
        assert_eq!(choose(&hs, T::ReadWrite, L::Disable, &mut 0, &both), None);
    }
}
