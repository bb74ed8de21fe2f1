//! The host set's bookkeeping: roles learned, outages and failovers, doubt,
//! reloads. (Dialling and the search run against real servers in
//! tests/e2e/failover.rs.)

use super::*;

fn cfg(hosts: &[&str], target: TargetSessionAttrs) -> HostsConfig {
    HostsConfig {
        hosts: hosts.iter().map(|h| HostPort { host: (*h).into(), port: 5432 }).collect(),
        load_balance: LoadBalanceHosts::RoundRobin,
        target,
        dns_max_ttl: Duration::from_secs(15),
        connect_timeout: Duration::from_secs(5),
        retry_max: Duration::from_secs(2),
    }
}

fn key(h: &str) -> HostKey {
    HostKey::Addr(format!("{h}:5432").parse().unwrap())
}

fn dialled(set: &HostSet) -> Option<HostKey> {
    match set.pick(&[]) {
        Pick::Dial(t) => Some(t.key),
        Pick::Search | Pick::Done => None,
    }
}

#[test]
fn a_standby_listed_first_is_skipped_once_known() {
    let set = HostSet::new("hosts_unit_a", cfg(&["10.9.0.3", "10.9.0.2"], TargetSessionAttrs::ReadWrite));
    assert_eq!(dialled(&set), None, "nothing known: the set searches");
    set.learned(&key("10.9.0.3"), Outcome::Role(HostRole::Standby));
    set.learned(&key("10.9.0.2"), Outcome::Role(HostRole::Primary));
    assert_eq!(dialled(&set), Some(key("10.9.0.2")));
    assert_eq!(set.metrics().matching(), 1);
    let roles: Vec<_> = set.view().into_iter().map(|v| (v.host.to_string(), v.role, v.matches)).collect();
    assert_eq!(
        roles,
        [("10.9.0.3:5432".into(), HostRole::Standby, false), ("10.9.0.2:5432".into(), HostRole::Primary, true)]
    );
}

#[test]
fn a_failover_is_counted_with_its_time_and_a_restart_is_not() {
    let set = HostSet::new("hosts_unit_b", cfg(&["10.9.1.3", "10.9.1.2"], TargetSessionAttrs::ReadWrite));
    set.learned(&key("10.9.1.2"), Outcome::Role(HostRole::Primary));
    set.learned(&key("10.9.1.3"), Outcome::Role(HostRole::Standby));
    set.learned(&key("10.9.1.2"), Outcome::Unreachable("refused".into()));
    assert_eq!(dialled(&set), None, "the primary failed: search");
    assert_eq!(set.metrics().matching(), 0);
    // It comes back (a restart): no failover.
    set.learned(&key("10.9.1.2"), Outcome::Role(HostRole::Primary));
    assert_eq!(set.metrics().failovers(), 0);
    // It fails again and the standby is promoted: one failover.
    set.learned(&key("10.9.1.2"), Outcome::Unreachable("refused".into()));
    std::thread::sleep(Duration::from_millis(5));
    set.learned(&key("10.9.1.3"), Outcome::Role(HostRole::Primary));
    assert_eq!(set.metrics().failovers(), 1);
    let took = set.metrics().failover_durations();
    assert_eq!(took.count, 1);
    assert!(took.sum_us >= 5_000, "from the first failed connect: {took:?}");
    assert_eq!(dialled(&set), Some(key("10.9.1.3")));
    // The old primary back as a standby changes nothing more.
    set.learned(&key("10.9.1.2"), Outcome::Role(HostRole::Standby));
    assert_eq!(set.metrics().failovers(), 1);
}

#[test]
fn a_read_only_primary_does_not_take_writes() {
    let set = HostSet::new("hosts_unit_c", cfg(&["10.9.2.2", "10.9.2.3"], TargetSessionAttrs::ReadWrite));
    set.learned(&key("10.9.2.2"), Outcome::Role(HostRole::ReadOnly));
    set.learned(&key("10.9.2.3"), Outcome::Role(HostRole::Standby));
    assert_eq!(dialled(&set), None);
    let primary = HostSet::new("hosts_unit_c2", cfg(&["10.9.2.2"], TargetSessionAttrs::Primary));
    primary.learned(&key("10.9.2.2"), Outcome::Role(HostRole::ReadOnly));
    assert_eq!(dialled(&primary), Some(key("10.9.2.2")), "primary: not in recovery is enough");
}

#[test]
fn doubt_sends_the_set_back_to_asking() {
    let set = HostSet::new("hosts_unit_d", cfg(&["10.9.3.2", "10.9.3.3"], TargetSessionAttrs::ReadWrite));
    set.learned(&key("10.9.3.2"), Outcome::Role(HostRole::Primary));
    set.doubt(&key("10.9.3.2"));
    assert_eq!(set.view()[0].role, HostRole::Unknown);
    assert_eq!(dialled(&set), None, "searched for again");
    let before = set.view()[0].learned_ago;
    assert!(before.is_some());
    // A login tells it is a primary again: the outage ends, no failover.
    set.learned(&key("10.9.3.2"), Outcome::Role(HostRole::Primary));
    assert_eq!(dialled(&set), Some(key("10.9.3.2")));
    assert_eq!(set.metrics().failovers(), 0);
    // Doubted again, and found read-only this time: no match.
    set.doubt(&key("10.9.3.2"));
    set.learned(&key("10.9.3.2"), Outcome::Role(HostRole::ReadOnly));
    assert_eq!(dialled(&set), None);
}

#[test]
fn an_answer_without_a_role_keeps_what_was_known() {
    let set = HostSet::new("hosts_unit_e", cfg(&["10.9.4.2", "10.9.4.3"], TargetSessionAttrs::ReadWrite));
    set.learned(&key("10.9.4.2"), Outcome::Role(HostRole::Primary));
    set.learned(&key("10.9.4.2"), Outcome::Answered("too many connections".into()));
    assert_eq!(set.view()[0].role, HostRole::Primary);
    set.learned(&key("10.9.4.3"), Outcome::Unreachable("refused".into()));
    set.learned(&key("10.9.4.3"), Outcome::Answered("password authentication failed".into()));
    assert_eq!(set.view()[1].role, HostRole::Unknown, "it answers: no longer unreachable");
}

#[test]
fn a_lone_host_with_target_any_is_dialled_whatever_happened() {
    let set = HostSet::new("hosts_unit_f", cfg(&["10.9.5.2"], TargetSessionAttrs::Any));
    set.learned(&key("10.9.5.2"), Outcome::Unreachable("refused".into()));
    assert_eq!(dialled(&set), Some(key("10.9.5.2")));
    assert!(matches!(set.pick(&[key("10.9.5.2")]), Pick::Done), "tried: the pool backs off");
}

#[test]
fn a_reload_keeps_the_roles_of_hosts_that_stay() {
    let set = HostSet::new("hosts_unit_g", cfg(&["10.9.6.2", "10.9.6.3"], TargetSessionAttrs::ReadWrite));
    set.learned(&key("10.9.6.3"), Outcome::Role(HostRole::Primary));
    set.configure(cfg(&["10.9.6.3", "10.9.6.4"], TargetSessionAttrs::ReadWrite));
    let roles: Vec<_> = set.view().into_iter().map(|v| (v.host.to_string(), v.role)).collect();
    assert_eq!(roles, [("10.9.6.3:5432".into(), HostRole::Primary), ("10.9.6.4:5432".into(), HostRole::Unknown)]);
    let hosts: Vec<String> = set.metrics().hosts().into_iter().map(|(h, _)| h).collect();
    assert_eq!(hosts, ["10.9.6.3:5432", "10.9.6.4:5432"], "the metrics follow");
}

#[test]
fn a_new_primary_seen_while_the_old_still_matched_displaces_it() {
    let set = HostSet::new("hosts_unit_h", cfg(&["10.9.7.3", "10.9.7.2"], TargetSessionAttrs::ReadWrite));
    set.learned(&key("10.9.7.2"), Outcome::Role(HostRole::Primary));
    set.learned(&key("10.9.7.3"), Outcome::Role(HostRole::Standby));
    // A switchover weir saw no connect fail in: the standby answers as primary.
    set.learned(&key("10.9.7.3"), Outcome::Role(HostRole::Primary));
    assert_eq!(set.view()[1].role, HostRole::Unknown, "the old primary is in doubt");
    assert_eq!(dialled(&set), Some(key("10.9.7.3")));
    assert_eq!(set.metrics().failovers(), 1);
    assert_eq!(set.metrics().failover_durations().count, 0, "no failed connect to time it from");
    // With target any, two matching hosts are no contradiction.
    let any = HostSet::new("hosts_unit_h2", cfg(&["10.9.7.3", "10.9.7.2"], TargetSessionAttrs::Any));
    any.learned(&key("10.9.7.2"), Outcome::Role(HostRole::Primary));
    any.learned(&key("10.9.7.3"), Outcome::Role(HostRole::Primary));
    assert_eq!(any.view()[1].role, HostRole::Primary);
}
