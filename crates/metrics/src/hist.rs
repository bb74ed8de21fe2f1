//! [`Histogram`]: a fixed-bucket latency histogram made of plain atomics.
//!
//! Per-pool histograms live here rather than in the `metrics` facade so that
//! their series leave `/metrics` together with their pool (the facade's
//! registry has no way to delete one series), and so that recording costs
//! three relaxed atomic adds on the per-transaction path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Histogram buckets (seconds) for every `*_seconds` histogram, per-pool
/// ones here and process-wide ones in the recorder alike.
pub const BUCKETS: &[f64] =
    &[0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0];

const R: Ordering = Ordering::Relaxed;
/// Number of finite buckets (`le` bounds); `+Inf` is the count.
pub(crate) const FINITE: usize = BUCKETS.len();

/// Bucket upper bounds in microseconds, from [`BUCKETS`] (seconds).
const BOUNDS_US: [u64; FINITE] = bounds_us();

const fn bounds_us() -> [u64; FINITE] {
    let mut out = [0u64; FINITE];
    let mut i = 0;
    while i < FINITE {
        out[i] = (BUCKETS[i] * 1_000_000.0) as u64;
        i += 1;
    }
    out
}

/// Cumulative-on-read histogram of durations with the exporter's buckets.
#[derive(Debug)]
pub struct Histogram {
    /// Non-cumulative counts: `buckets[i]` holds samples in `(le[i-1], le[i]]`.
    buckets: [AtomicU64; FINITE],
    count: AtomicU64,
    sum_us: AtomicU64,
}

/// A copy of a [`Histogram`] at one moment, cumulative, ready to render or add.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Snapshot {
    /// Cumulative counts per finite bucket (`le` = [`BUCKETS`]`[i]`).
    pub cumulative: [u64; FINITE],
    /// Number of samples (the `+Inf` bucket).
    pub count: u64,
    /// Sum of the samples, in microseconds.
    pub sum_us: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            count: AtomicU64::new(0),
            sum_us: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    /// Records one sample.
    pub fn record(&self, d: Duration) {
        let us = u64::try_from(d.as_micros()).unwrap_or(u64::MAX);
        if let Some(i) = BOUNDS_US.iter().position(|&b| us <= b) {
            self.buckets[i].fetch_add(1, R);
        }
        self.count.fetch_add(1, R);
        self.sum_us.fetch_add(us, R);
    }

    /// The histogram now, with cumulative buckets.
    pub fn snapshot(&self) -> Snapshot {
        let mut s = Snapshot { count: self.count.load(R), sum_us: self.sum_us.load(R), ..Snapshot::default() };
        let mut running = 0;
        for (out, b) in s.cumulative.iter_mut().zip(&self.buckets) {
            running += b.load(R);
            *out = running;
        }
        // Relaxed loads may see a bucket before its count; keep `+Inf` the largest.
        s.count = s.count.max(running);
        s
    }
}

impl Snapshot {
    /// Adds `other` into `self` (two pools with the same labels in one process).
    pub fn add(&mut self, other: &Snapshot) {
        self.cumulative.iter_mut().zip(&other.cumulative).for_each(|(a, b)| *a += b);
        self.count += other.count;
        self.sum_us += other.sum_us;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buckets_are_cumulative_and_inclusive() {
        let h = Histogram::default();
        h.record(Duration::from_micros(500)); // le=0.0005 exactly
        h.record(Duration::from_millis(3)); // le=0.005
        h.record(Duration::from_secs(120)); // above every finite bound
        let s = h.snapshot();
        assert_eq!(s.cumulative[0], 1);
        assert_eq!(s.cumulative[BUCKETS.iter().position(|&b| b == 0.005).unwrap()], 2);
        assert_eq!(s.cumulative[FINITE - 1], 2);
        assert_eq!(s.count, 3);
        assert_eq!(s.sum_us, 500 + 3_000 + 120_000_000);
        let mut twice = s.clone();
        twice.add(&s);
        assert_eq!((twice.count, twice.cumulative[0]), (6, 2));
    }
}
