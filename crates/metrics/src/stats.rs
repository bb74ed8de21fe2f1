//! [`StatTotals`]: a pool's `SHOW STATS` counters read at one moment, and
//! [`Period`]: the counters' change over the last completed `stats_period`,
//! from which the console derives PgBouncer's averages (per second for
//! counts and bytes, per transaction / query / assignment for times).

use std::ops::{Add, Sub};
use std::time::Duration;

/// The `SHOW STATS` counters of a pool (or a sum of pools).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StatTotals {
    /// Transactions completed.
    pub xacts: u64,
    /// Queries answered (one per ReadyForQuery).
    pub queries: u64,
    /// Bytes received from clients.
    pub received: u64,
    /// Bytes sent to clients.
    pub sent: u64,
    /// Time in completed transactions, µs.
    pub xact_time_us: u64,
    /// Time from a query's first byte forwarded to its ReadyForQuery, µs.
    pub query_time_us: u64,
    /// Time clients waited for a server, µs.
    pub wait_time_us: u64,
    /// Times a client was given a server.
    pub assignments: u64,
    /// Parse messages from clients.
    pub client_parses: u64,
    /// Parse messages weir sent to servers.
    pub server_parses: u64,
    /// Bind messages of clients' named prepared statements.
    pub binds: u64,
}

macro_rules! each_field {
    ($a:ident, $b:ident, $op:ident) => {
        StatTotals {
            xacts: $a.xacts.$op($b.xacts),
            queries: $a.queries.$op($b.queries),
            received: $a.received.$op($b.received),
            sent: $a.sent.$op($b.sent),
            xact_time_us: $a.xact_time_us.$op($b.xact_time_us),
            query_time_us: $a.query_time_us.$op($b.query_time_us),
            wait_time_us: $a.wait_time_us.$op($b.wait_time_us),
            assignments: $a.assignments.$op($b.assignments),
            client_parses: $a.client_parses.$op($b.client_parses),
            server_parses: $a.server_parses.$op($b.server_parses),
            binds: $a.binds.$op($b.binds),
        }
    };
}

impl Add for StatTotals {
    type Output = StatTotals;
    fn add(self, o: StatTotals) -> StatTotals {
        each_field!(self, o, saturating_add)
    }
}

impl Sub for StatTotals {
    type Output = StatTotals;
    fn sub(self, o: StatTotals) -> StatTotals {
        each_field!(self, o, saturating_sub)
    }
}

/// What changed over one completed stats period, and how long it was.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Period {
    /// Counter increments during the period.
    pub delta: StatTotals,
    /// The period's length (zero before the first one completes).
    pub length: Duration,
}

impl Period {
    /// Sums two pools' periods (the longer length stands for both).
    pub fn merge(self, o: Period) -> Period {
        Period { delta: self.delta + o.delta, length: self.length.max(o.length) }
    }

    /// `n` per second over the period (0 before one completes).
    pub fn per_second(&self, n: u64) -> u64 {
        let per = (u128::from(n) * 1000).checked_div(self.length.as_millis()).unwrap_or(0);
        u64::try_from(per).unwrap_or(u64::MAX)
    }

    /// `total` over `n` (0 when n is 0), as PgBouncer's average times.
    pub fn per(total: u64, n: u64) -> u64 {
        total.checked_div(n).unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn averages_over_the_period() {
        let delta = StatTotals { xacts: 30, xact_time_us: 600, received: 3000, ..Default::default() };
        let p = Period { delta, length: Duration::from_secs(60) };
        assert_eq!(p.per_second(p.delta.received), 50);
        assert_eq!(Period::per(p.delta.xact_time_us, p.delta.xacts), 20);
        assert_eq!(Period::default().per_second(5), 0);
        assert_eq!(Period::per(5, 0), 0);
        let later = StatTotals { xacts: 31, ..delta };
        assert_eq!((later - delta).xacts, 1);
        assert_eq!(p.merge(p).delta.xacts, 60);
    }
}
