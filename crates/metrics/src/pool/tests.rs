//! Recording and reading one pool back.

use super::*;
use crate::close::{ConnectFailure, DropReason};
use crate::state::{ClientState, ServerState};

#[test]
fn counters_and_gauges_read_back() {
    let p = PoolMetrics::new("db_pool_test", "u");
    p.record_connect_failure(ConnectFailure::Timeout);
    p.record_connect_failure(ConnectFailure::Auth);
    p.record_dropped_query(DropReason::WaitTimeout);
    p.record_transaction(Duration::from_millis(3));
    p.record_query();
    p.record_query();
    p.record_client_parse();
    p.record_server_parse();
    p.record_pinned();
    p.record_client_wait(Duration::from_millis(1));
    assert_eq!(p.connect_failures(ConnectFailure::Timeout), 1);
    assert_eq!(p.connect_failures_total(), 2);
    assert_eq!(p.dropped_queries(DropReason::WaitTimeout), 1);
    assert_eq!(p.dropped_queries_total(), 1);
    assert_eq!((p.transactions(), p.queries()), (1, 2));
    assert_eq!(p.transaction_time(), Duration::from_millis(3));
    assert_eq!((p.server_assignments(), p.wait_time()), (1, Duration::from_millis(1)));
    assert_eq!((p.client_parses(), p.server_parses(), p.pinned()), (1, 1, 1));
    p.record_settings_unfollowed();
    assert_eq!(p.settings_unfollowed(), 1);
    assert_eq!(p.opened(), 0, "connect failures are not opens");

    p.add_servers(ServerState::Login, 1);
    p.move_server(ServerState::Login, ServerState::Idle);
    p.move_server(ServerState::Idle, ServerState::Active);
    p.add_clients(ClientState::Waiting, 2);
    p.move_client(ClientState::Waiting, ClientState::Active);
    p.set_maxwait(Duration::from_millis(1500));
    assert_eq!(p.servers(ServerState::Active), 1);
    assert_eq!(p.servers(ServerState::Login), 0);
    assert_eq!(p.clients(ClientState::Waiting), 1);
    assert_eq!(p.maxwait(), Duration::from_millis(1500));
    assert!(live_pools().iter().any(|l| Arc::ptr_eq(l, &p)));
    assert_eq!((p.database(), p.user()), ("db_pool_test", "u"));
}

#[test]
fn traffic_and_stats_periods() {
    let p = PoolMetrics::new("db_period_test", "u");
    p.record_received(100);
    p.record_sent(40);
    p.record_query_time(Duration::from_millis(2));
    p.record_transaction(Duration::from_millis(3));
    assert_eq!((p.bytes_received(), p.bytes_sent(), p.query_time()), (100, 40, Duration::from_millis(2)));
    assert_eq!(p.last_period(), Period::default(), "no period has completed");
    p.roll_period(Duration::from_secs(2));
    let last = p.last_period();
    assert_eq!((last.delta.received, last.delta.xacts, last.length), (100, 1, Duration::from_secs(2)));
    p.record_sent(10);
    p.roll_period(Duration::from_secs(2));
    let last = p.last_period();
    assert_eq!((last.delta.sent, last.delta.received, last.delta.xacts), (10, 0, 0), "only the last period");
    assert_eq!(p.totals().sent, 50);
}

#[test]
fn server_bytes_and_servers_being_canceled() {
    let p = PoolMetrics::new("db_server_bytes_read_test", "u");
    p.record_server_sent(30);
    p.record_server_received(70);
    assert_eq!((p.server_bytes_sent(), p.server_bytes_received(), p.bytes_received()), (30, 70, 0));
    let (a, b) = (p.being_canceled(), p.being_canceled());
    assert_eq!(p.servers_being_canceled(), 2);
    drop(a);
    assert_eq!(p.servers_being_canceled(), 1);
    drop(b);
    assert_eq!(p.servers_being_canceled(), 0);
}
