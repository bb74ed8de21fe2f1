use super::*;

fn state() -> State {
    test_state("")
}

#[test]
fn the_queue_is_served_in_order_skipping_gone_and_expired_waiters() {
    let mut st = state();
    let now = Instant::now();
    let later = now + Duration::from_secs(60);
    let mut rxs = Vec::new();
    let count = std::sync::Arc::new(super::super::QueueCount::default());
    let mut push = |st: &mut State, deadline| {
        let (tx, rx) = oneshot::channel();
        rxs.push(rx);
        st.push_waiter(tx, now, deadline, count.join(0).unwrap(), None)
    };
    let gone = push(&mut st, later);
    let expired = push(&mut st, now);
    let first_live = push(&mut st, later);
    let removed = push(&mut st, later);
    let second_live = push(&mut st, later);
    rxs[(gone - 1) as usize].close();
    st.remove_waiter(removed);
    assert_eq!(st.live_waiters_up_to(10), 2);
    assert_eq!(st.live_waiters_up_to(1), 1, "counting stops at the cap");
    assert_eq!(st.next_waiter(now).map(|w| w.id), Some(first_live));
    assert_eq!(st.next_waiter(now).map(|w| w.id), Some(second_live));
    assert!(st.next_waiter(now).is_none());
    let left: Vec<u64> = st.waiters.iter().map(|w| w.id).collect();
    assert_eq!(left, vec![expired], "the expired waiter stays for its own timeout to answer; the gone one went");
}

#[test]
fn server_check_query_is_due_only_for_a_connection_lent_before() {
    let st = state();
    let opened = Instant::now();
    let later = opened + st.opts.check_delay + Duration::from_secs(1);
    assert!(!st.check_due((opened, opened), later), "a fresh login is not checked");
    assert!(st.check_due((opened, opened + Duration::from_millis(1)), later), "a returned one is");
}

#[test]
fn a_pool_that_stopped_lending_lets_its_waiters_go_at_upkeep() {
    let mut st = state();
    let now = Instant::now();
    let count = std::sync::Arc::new(super::super::QueueCount::default());
    let (tx, _rx) = oneshot::channel();
    st.push_waiter(tx, now, now + Duration::from_secs(60), count.join(0).unwrap(), None);
    st.let_waiters_go();
    assert_eq!(st.live_waiters_up_to(10), 1, "a lending pool keeps its queue");
    st.stop_lending();
    assert_eq!(st.live_waiters_up_to(10), 1, "kept until the next upkeep");
    st.let_waiters_go();
    assert_eq!(st.live_waiters_up_to(10), 0);
    assert!(st.is_stopping());
}

#[test]
fn a_server_running_the_fleet_query_is_counted_as_tested() {
    let mut st = state();
    st.counts.lent();
    st.counts.returned_dirty();
    st.fleet.took_server();
    let s = st.snapshot();
    assert_eq!(s.recovering, 2, "the fleet query's server is held, not gone");
    assert_eq!(st.total(), 2);
    assert!(!s.is_unused());
}

fn tag(fp: u64) -> QueryTag {
    QueryTag { fp, text: std::sync::Arc::from("select ?") }
}

#[test]
fn a_freed_server_goes_to_the_statement_holding_fewest_then_the_cap_keeps_one_idle() {
    // pool_size 4 at share 0.5: a statement may hold 2 while another is active.
    let mut st = test_state("pool_size = 4");
    st.opts.fingerprint_share = 0.5;
    let now = Instant::now();
    let later = now + Duration::from_secs(60);
    let count = std::sync::Arc::new(super::super::QueueCount::default());
    let mut rxs = Vec::new();
    let mut push = |st: &mut State, fp: u64| {
        let (tx, rx) = oneshot::channel();
        rxs.push(rx);
        st.push_waiter(tx, now, later, count.join(0).unwrap(), Some(&tag(fp)))
    };
    let a1 = push(&mut st, 1);
    let served = st.next_waiter(now).unwrap();
    assert_eq!(served.id, a1, "one statement waiting: FIFO");
    st.queries.lent(1, Duration::ZERO, 4);
    let a2 = push(&mut st, 1);
    let b1 = push(&mut st, 2);
    assert_eq!(st.next_waiter(now).map(|w| w.id), Some(b1), "the statement holding none goes first");
    st.queries.lent(2, Duration::ZERO, 4);
    st.queries.returned(2, Duration::ZERO, 0);
    st.queries.lent(1, Duration::ZERO, 4);
    let a3 = push(&mut st, 1);
    // a2 is next in FIFO order, but statement 1 holds 2 (its cap) and
    // statement 2 was active just now: the server stays idle.
    assert!(st.next_waiter(now).is_none(), "held back for the other statement");
    // Once the other statement is quiet, the cap no longer holds it back.
    let quiet = now + Duration::from_secs(2);
    assert_eq!(st.next_waiter(quiet).map(|w| w.id), Some(a2));
    assert_eq!(st.waiters.iter().map(|w| w.id).collect::<Vec<_>>(), vec![a3]);
}
