//! A fair share of one Postgres's connection budget across the weirs in
//! front of it (`fleet_share`). Nothing runs beside Postgres and the weirs:
//!
//! * Each weir process has a random id. A pool with fleet_share announces
//!   itself with one session-level advisory lock, on one of its own pooled
//!   servers (its "beacon"), whose int8 key carries the id, the servers the
//!   pool holds and the servers its clients would use (`share::key`).
//!   Postgres releases the lock when that backend ends: an instance that
//!   dies, or a Postgres that restarts, leaves no announcement behind.
//! * Every 100 ms while the fleet is at its limit and some instance wants
//!   more servers than it holds, every 250 ms while it otherwise
//!   matters (waiters, refusals, at the limit, above its share), else every
//!   second, the pool runs ONE query on its beacon
//!   between transactions (taken from idle, or from the next release before
//!   any waiter): it moves its announcement to its current figures and reads
//!   the others' back with the role's, the database's and the server's
//!   limits and connection counts (`share::query`).
//! * The fleet's budget is the tightest limit less the connections no
//!   announcing weir holds, less one slot kept free so that an instance
//!   whose load arrives while the fleet is at its limit can open its first
//!   server (and so announce itself). Shares are water-filled over what the
//!   instances want (`share::water_fill`).
//! * Only while the fleet is at its limit (a refusal seen, or no room left
//!   but the free slot) is the share enforced: idle servers above it close
//!   at once (reason `fleet_share`), a released server above it is closed
//!   rather than kept, and no connect goes past it. A pool below its share
//!   whose connects were refused tries again as soon as a round sees room
//!   under the limit (the others gave back), else at the round's pace.
//!   Below the limit the pool refills as fast as without fleet_share.
//! * The announcement is a session lock on a server clients also use: a
//!   client there may release it (pg_advisory_unlock_all(), DISCARD ALL).
//!   The next round takes it again, whichever server it runs on.

pub(super) mod part;
pub(super) mod share;

use std::sync::{Arc, OnceLock, Weak};
use std::time::{Duration, Instant};

use rand::Rng;
use tokio::sync::oneshot;
use weir_metrics::CloseReason;

use super::state::State;
use super::Pool;
use crate::server::exchange::run_rows;
use crate::server::ServerConn;
use part::{MIN_GAP, SAMPLES};
use share::Member;

/// The period while an instance wants more than it holds at the limit,
/// while the share otherwise matters, and otherwise.
const URGENT: Duration = Duration::from_millis(100);
const FAST: Duration = Duration::from_millis(250);
const SLOW: Duration = Duration::from_secs(1);
/// How long the share stays enforced after the fleet was last seen at its limit.
const HOLD: Duration = Duration::from_secs(2);
/// How long a tick waits for its beacon before it takes any server.
const BEACON_WAIT: Duration = Duration::from_millis(500);

/// The pause after a refused connect while below the enforced share: the
/// round's pace, from 200 to 250 ms (so at most 5 refusals a second).
pub(super) fn refusal_pause() -> Duration {
    FAST.mul_f64(rand::thread_rng().gen_range(0.8..=1.0))
}

/// This process's id among the fleet (24 bits, never 0).
fn instance_id() -> u32 {
    static ID: OnceLock<u32> = OnceLock::new();
    *ID.get_or_init(|| rand::thread_rng().gen_range(1..=0xff_ffff))
}

impl Pool {
    /// Called first by `hand_over`: a server released while a tick waits for
    /// one goes to it (the tick's query runs between transactions, before
    /// any waiter is served), and one released while the pool is above its
    /// enforced share is closed rather than kept. None: taken.
    pub(super) fn fleet_release(self: &Arc<Self>, st: &mut State, conn: Box<ServerConn>) -> Option<Box<ServerConn>> {
        let f = st.fleet_mut();
        let mut conn = conn;
        if let Some((_, since)) = &f.claim {
            if f.beacon.is_none_or(|b| b == conn.id) || since.elapsed() >= BEACON_WAIT {
                let (tx, _) = f.claim.take().expect("a claim");
                match tx.send(conn) {
                    Ok(()) => {
                        f.took_server();
                        return None;
                    }
                    Err(back) => conn = back,
                }
            }
        }
        let Some(cap) = st.fleet().cap else { return Some(conn) };
        if st.total() < cap || st.fleet().beacon == Some(conn.id) {
            return Some(conn);
        }
        conn.close(CloseReason::FleetShare);
        self.wake_blocked_siblings();
        None
    }

    /// The servers this pool holds, and the servers its clients would use now.
    fn fleet_load(st: &State) -> (u32, u32) {
        let (lent, recovering) = (st.counts().active(), st.counts().recovering());
        let held = st.idle().len() as u32 + lent + recovering + st.fleet().busy();
        let capacity = st.capacity();
        let waiting = st.live_waiters_up_to(capacity as usize) as u32;
        (held, (lent + recovering + waiting).min(capacity))
    }

    /// `me` brought up to now without a demand sample: the servers held now,
    /// and a want no lower than the demand now. A round may wait for its
    /// server and its query under load; clients that arrived meanwhile
    /// count at once (a pool whose load is just arriving is not announced,
    /// nor judged, on the one client its round began with).
    fn fleet_refresh(st: &State, me: Member) -> Member {
        let (held, now) = Self::fleet_load(st);
        Member { want: me.want.max(now), held, ..me }
    }

    /// This pool's figures for its announcement, and one more demand sample.
    fn fleet_member(st: &mut State) -> Member {
        let (held, now) = Self::fleet_load(st);
        let f = st.fleet_mut();
        f.demand[f.sample % SAMPLES] = now;
        f.sample += 1;
        let want = f.demand.iter().copied().max().unwrap_or(0);
        // A pool that holds a server keeps wanting one, so that load that
        // arrives finds it (and its announcement) there.
        Member { id: instance_id(), want: want.max(held.min(1)), held }
    }
}

pub(super) fn spawn(pool: &Arc<Pool>) {
    let weak = Arc::downgrade(pool);
    let wake = pool.state.lock().fleet().wake.clone();
    tokio::spawn(async move {
        let mut period = SLOW;
        loop {
            let last = Instant::now();
            // Cancel-safe: a notification that comes while the round runs
            // is kept as a permit and ends the next wait at once.
            tokio::select! {
                _ = tokio::time::sleep(period) => {}
                _ = wake.notified() => {}
            }
            tokio::time::sleep_until((last + MIN_GAP).into()).await;
            let Some(pool) = Weak::upgrade(&weak) else { return };
            period = tick(pool).await;
        }
    });
}

/// One round: announce, read, judge, enforce. Returns the next period.
async fn tick(pool: Arc<Pool>) -> Duration {
    let (me, limit) = {
        let mut st = pool.state.lock();
        if !st.opts.settings.fleet_share {
            st.fleet_mut().cap = None;
            pool.metrics.set_fleet(0, 0);
            return SLOW;
        }
        (Pool::fleet_member(&mut st), st.opts.check_timeout)
    };
    if me.held == 0 && me.want == 0 {
        pool.metrics.set_fleet(0, 0);
        return SLOW;
    }
    let Some(mut conn) = take_server(&pool).await else { return FAST };
    let me = Pool::fleet_refresh(&pool.state.lock(), me);
    let mut cols: Vec<Option<String>> = Vec::new();
    let ran = tokio::time::timeout(
        limit,
        run_rows(&mut conn, &share::query(me), |row| {
            if let Some(c) = text_columns(row).filter(|c| c.len() == 8) {
                cols = c;
            }
        }),
    )
    .await;
    let reading = match ran {
        Ok(Ok(None)) if conn.conv.is_clean() => share::parse(&cols.iter().map(|c| c.as_deref()).collect::<Vec<_>>()),
        _ => None,
    };
    let mut st = pool.state.lock();
    st.fleet_mut().server_back();
    let Some(reading) = reading else {
        tracing::warn!(database = %pool.key.database, user = %pool.key.user, "fleet share query failed; closing its server");
        st.fleet_mut().beacon = None;
        conn.close(CloseReason::CheckFailed);
        pool.want_connects(&mut st);
        return SLOW;
    };
    st.fleet_mut().beacon = Some(conn.id);
    let now = Instant::now();
    pool.hand_over(&mut st, conn, now);
    let refusals = pool.metrics.connect_refusals_total();
    let refused = std::mem::replace(&mut st.fleet_mut().refusals_seen, refusals) != refusals;
    // Judged on the demand now, with the servers held as the reading counted them.
    let verdict = share::judge(&reading, Member { held: me.held, ..Pool::fleet_refresh(&st, me) });
    apply(&pool, &mut st, verdict, refused, now)
}

/// Takes the verdict: the share enforced while the fleet is at its limit,
/// idle servers above it closed, connects up to it started.
fn apply(pool: &Arc<Pool>, st: &mut State, verdict: Option<share::Verdict>, refused: bool, now: Instant) -> Duration {
    let Some(v) = verdict else {
        st.fleet_mut().cap = None;
        pool.metrics.set_fleet(0, 0);
        return SLOW;
    };
    let f = st.fleet_mut();
    if v.at_limit || refused {
        f.limited_until = Some(now + HOLD);
    }
    let limited = f.limited_until.is_some_and(|t| t > now);
    f.cap = limited.then_some(v.share);
    pool.metrics.set_fleet(v.share.into(), v.instances.into());
    // The bottom of the idle stack waited longest; the beacon stays.
    let beacon = st.fleet().beacon;
    let doomed = if limited { st.take_idle_above(v.share, beacon) } else { Vec::new() };
    let above = st.total() > v.share;
    // Refused below the share, and the others have given back: try now
    // rather than at the end of the pause (a connect failure's back-off
    // stays).
    if st.fleet().below_share(st.total()) && v.open > 1 {
        st.backoff_mut().end_refusal_pause();
    }
    pool.want_connects(st);
    for conn in doomed {
        conn.close(CloseReason::FleetShare);
    }
    next_period(limited, v.wanting, above || st.waiting() > 0)
}

/// The next round's period: quickest while the fleet is at its limit and
/// an instance wants more than it holds, so that a newcomer's demand
/// reaches the others, and their servers it, within a round or two.
fn next_period(limited: bool, wanting: bool, busy: bool) -> Duration {
    match (limited, wanting) {
        (true, true) => URGENT,
        (true, false) => FAST,
        _ if busy => FAST,
        _ => SLOW,
    }
}

/// A server for the fleet query: the beacon if idle, else (no beacon) the
/// top idle one, else the next released (the beacon for up to
/// `BEACON_WAIT`). None: none came within a period.
async fn take_server(pool: &Arc<Pool>) -> Option<Box<ServerConn>> {
    let rx = {
        let mut st = pool.state.lock();
        let now = Instant::now();
        let beacon = st.fleet().beacon;
        match st.lend_to_fleet(beacon, now) {
            Some(Ok(conn)) => return Some(conn),
            Some(Err(conn)) => {
                drop(st);
                pool.discard(conn, CloseReason::ServerClosed);
                return None;
            }
            None => {}
        }
        let (tx, rx) = oneshot::channel();
        st.fleet_mut().claim = Some((tx, now));
        rx
    };
    let mut rx = rx;
    tokio::select! {
        got = &mut rx => got.ok(),
        _ = tokio::time::sleep(SLOW) => {
            // The claim is taken under the lock when a server is sent: if it
            // is gone, the server is in the channel already.
            let unclaimed = {
                let mut st = pool.state.lock();
                let f = st.fleet_mut();
                let unclaimed = f.claim.take().is_some();
                if unclaimed {
                    f.beacon = None;
                }
                unclaimed
            };
            if unclaimed {
                return None;
            }
            rx.await.ok()
        }
    }
}

/// A DataRow's columns as text (None: NULL); None if it is malformed.
fn text_columns(body: &[u8]) -> Option<Vec<Option<String>>> {
    let (count, mut rest) = body.split_first_chunk::<2>()?;
    let mut cols = Vec::new();
    for _ in 0..i16::from_be_bytes(*count) {
        let (len, after) = rest.split_first_chunk::<4>()?;
        let len = i32::from_be_bytes(*len);
        if len < 0 {
            cols.push(None);
            rest = after;
            continue;
        }
        let len = len as usize;
        if after.len() < len {
            return None;
        }
        cols.push(Some(String::from_utf8_lossy(&after[..len]).into_owned()));
        rest = &after[len..];
    }
    Some(cols)
}

#[cfg(test)]
mod tests {
    use super::part::Fleet;
    use super::*;

    #[test]
    fn data_row_columns_with_nulls() {
        let mut row = 3i16.to_be_bytes().to_vec();
        row.extend_from_slice(&2i32.to_be_bytes());
        row.extend_from_slice(b"12");
        row.extend_from_slice(&(-1i32).to_be_bytes());
        row.extend_from_slice(&0i32.to_be_bytes());
        assert_eq!(text_columns(&row), Some(vec![Some("12".into()), None, Some(String::new())]));
        assert_eq!(text_columns(&row[..5]), None, "truncated");
    }

    #[test]
    fn refused_below_the_share_retries_at_most_five_times_a_second() {
        for _ in 0..100 {
            let p = refusal_pause();
            assert!(p >= Duration::from_millis(200) && p <= FAST);
        }
        let mut f = Fleet::default();
        f.cap = Some(3);
        assert!(f.below_share(2));
        assert!(!f.below_share(3));
        assert!(!Fleet::default().below_share(0), "not enforced");
    }

    #[test]
    fn rounds_quicken_while_an_instance_wants_more_at_the_limit() {
        assert_eq!(next_period(true, true, false), URGENT);
        assert_eq!(next_period(true, false, false), FAST);
        assert_eq!(next_period(false, true, false), SLOW, "below the limit an instance just connects");
        assert_eq!(next_period(false, false, true), FAST);
    }

    fn state() -> State {
        super::super::state::test_state("fleet_share = true\n")
    }

    #[test]
    fn a_round_announces_and_is_judged_on_the_clients_that_came_while_it_waited() {
        let mut st = state();
        st.counts_mut().lent();
        let me = Pool::fleet_member(&mut st);
        assert_eq!((me.want, me.held), (1, 1), "one client when the round began");
        // While the round waits for its server and its query, clients queue.
        let count = Arc::new(super::super::QueueCount::default());
        let far = Instant::now() + Duration::from_secs(60);
        let mut rxs = Vec::new();
        for _ in 0..5 {
            let (tx, rx) = oneshot::channel();
            rxs.push(rx);
            st.push_waiter(tx, Instant::now(), far, count.join(0).unwrap(), None);
        }
        st.fleet_mut().took_server();
        let fresh = Pool::fleet_refresh(&st, me);
        assert_eq!((fresh.id, fresh.want, fresh.held), (me.id, 6, 2), "the demand now, the servers now");
        assert_eq!(st.fleet().sample, 1, "no extra demand sample: the window keeps its length");
        st.drain_waiters();
        st.counts_mut().returned();
        assert_eq!(Pool::fleet_refresh(&st, fresh).want, 6, "a dip does not lower the announced want");
    }

    #[test]
    fn the_instance_id_is_fixed_and_fits_the_key() {
        let id = instance_id();
        assert_eq!(id, instance_id());
        assert!(id > 0 && id <= 0xff_ffff);
    }
}
