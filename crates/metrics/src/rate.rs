//! [`RateWindow`]: a lock-free sliding-window event counter that yields
//! events per second over the last 1, 10 and 60 seconds.
//!
//! # Definition
//!
//! Time is cut into whole seconds since the window was created. Only
//! **complete** seconds count, so values are stable within a second and do
//! not jump when a new second begins:
//!
//! * `1s`  = events in the last complete second (`now - 1`);
//! * `10s` = events in seconds `now-10 ..= now-1`, divided by 10;
//! * `60s` = events in seconds `now-60 ..= now-1`, divided by 60.
//!
//! The current, partial second is recorded but not yet reported. Seconds
//! before the window existed count as zero (so early values under-report
//! rather than extrapolate).
//!
//! # Implementation
//!
//! A ring of 64 slots (60 reported seconds + the current one + slack). Each
//! slot is one `AtomicU64` packing `(second stamp: 32 bits, count: 32 bits)`,
//! updated with a compare-and-swap loop, so a slot is reset and incremented
//! atomically: no locks, no lost increments. Counts saturate at `u32::MAX`
//! per second.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

const SLOTS: usize = 64;
const LOW_MASK: u64 = 0xFFFF_FFFF;

/// A reporting window.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Window {
    /// The last complete second.
    S1,
    /// The last 10 complete seconds.
    S10,
    /// The last 60 complete seconds.
    S60,
}

impl Window {
    /// All windows, shortest first.
    pub const ALL: &'static [Window] = &[Window::S1, Window::S10, Window::S60];

    /// The exported `window` label value: `"1s"`, `"10s"` or `"60s"`.
    pub const fn label(self) -> &'static str {
        match self {
            Window::S1 => "1s",
            Window::S10 => "10s",
            Window::S60 => "60s",
        }
    }

    /// Length of the window in seconds.
    pub const fn seconds(self) -> u64 {
        match self {
            Window::S1 => 1,
            Window::S10 => 10,
            Window::S60 => 60,
        }
    }

    /// Dense index in `0..3`.
    pub const fn index(self) -> usize {
        self as usize
    }
}

impl std::fmt::Display for Window {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.label())
    }
}

/// Sliding-window event counter; see the module docs for the exact definition.
#[derive(Debug)]
pub struct RateWindow {
    epoch: Instant,
    slots: [AtomicU64; SLOTS],
}

impl Default for RateWindow {
    fn default() -> Self {
        Self::new()
    }
}

fn pack(stamp: u64, count: u64) -> u64 {
    ((stamp & LOW_MASK) << 32) | count.min(LOW_MASK)
}

fn unpack(v: u64) -> (u64, u64) {
    (v >> 32, v & LOW_MASK)
}

impl RateWindow {
    /// A new, empty window whose clock starts now.
    pub fn new() -> Self {
        RateWindow { epoch: Instant::now(), slots: std::array::from_fn(|_| AtomicU64::new(0)) }
    }

    /// Whole seconds since this window was created (its clock).
    pub fn now_secs(&self) -> u64 {
        self.epoch.elapsed().as_secs()
    }

    /// Records one event now.
    pub fn record(&self) {
        self.record_n_at(1, self.now_secs());
    }

    /// Records `n` events now.
    pub fn record_n(&self, n: u64) {
        self.record_n_at(n, self.now_secs());
    }

    /// Records one event at second `now_secs` (injectable clock, for tests).
    pub fn record_at(&self, now_secs: u64) {
        self.record_n_at(1, now_secs);
    }

    /// Records `n` events at second `now_secs`.
    ///
    /// Events older than the slot's current second (more than 63 s late) are
    /// ignored rather than corrupting newer data.
    pub fn record_n_at(&self, n: u64, now_secs: u64) {
        if n == 0 {
            return;
        }
        let stamp = now_secs & LOW_MASK;
        let slot = &self.slots[(now_secs % SLOTS as u64) as usize];
        let mut cur = slot.load(Ordering::Relaxed);
        loop {
            let (s, c) = unpack(cur);
            let next = match s.cmp(&stamp) {
                std::cmp::Ordering::Equal => pack(stamp, c.saturating_add(n)),
                std::cmp::Ordering::Less => pack(stamp, n),
                std::cmp::Ordering::Greater => return,
            };
            match slot.compare_exchange_weak(cur, next, Ordering::Relaxed, Ordering::Relaxed) {
                Ok(_) => return,
                Err(actual) => cur = actual,
            }
        }
    }

    /// Events per second over `window`, now.
    pub fn per_second(&self, window: Window) -> f64 {
        self.per_second_at(window, self.now_secs())
    }

    /// Events per second over `window`, as seen at second `now_secs`.
    pub fn per_second_at(&self, window: Window, now_secs: u64) -> f64 {
        self.count_at(window, now_secs) as f64 / window.seconds() as f64
    }

    /// Raw number of events in the complete seconds covered by `window` at `now_secs`.
    pub fn count_at(&self, window: Window, now_secs: u64) -> u64 {
        (1..=window.seconds()).filter_map(|back| now_secs.checked_sub(back)).map(|sec| self.count_in_second(sec)).sum()
    }

    fn count_in_second(&self, sec: u64) -> u64 {
        let (s, c) = unpack(self.slots[(sec % SLOTS as u64) as usize].load(Ordering::Relaxed));
        if s == sec & LOW_MASK {
            c
        } else {
            0
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    #[test]
    fn labels() {
        let labels: Vec<_> = Window::ALL.iter().map(|w| w.label()).collect();
        assert_eq!(labels, ["1s", "10s", "60s"]);
    }

    #[test]
    fn empty_is_zero() {
        let w = RateWindow::new();
        for &win in Window::ALL {
            assert_eq!(w.per_second_at(win, 0), 0.0);
            assert_eq!(w.per_second_at(win, 1000), 0.0);
        }
    }

    #[test]
    fn current_second_is_not_reported_until_complete() {
        let w = RateWindow::new();
        w.record_n_at(5, 100);
        assert_eq!(w.per_second_at(Window::S1, 100), 0.0);
        assert_eq!(w.per_second_at(Window::S1, 101), 5.0);
        assert_eq!(w.per_second_at(Window::S1, 102), 0.0);
        assert_eq!(w.per_second_at(Window::S10, 101), 0.5);
        assert_eq!(w.per_second_at(Window::S10, 110), 0.5);
        assert_eq!(w.per_second_at(Window::S10, 111), 0.0);
        assert_eq!(w.per_second_at(Window::S60, 160), 5.0 / 60.0);
        assert_eq!(w.per_second_at(Window::S60, 161), 0.0);
    }

    #[test]
    fn steady_rate_is_exact_in_every_window() {
        let w = RateWindow::new();
        for sec in 0..200 {
            w.record_n_at(3, sec);
        }
        for &win in Window::ALL {
            assert_eq!(w.per_second_at(win, 200), 3.0, "{win:?}");
        }
    }

    #[test]
    fn burst_then_silence_decays() {
        let w = RateWindow::new();
        for sec in 0..10 {
            w.record_n_at(10, sec);
        }
        assert_eq!(w.per_second_at(Window::S10, 10), 10.0);
        assert_eq!(w.per_second_at(Window::S10, 15), 5.0);
        assert_eq!(w.per_second_at(Window::S60, 15), 100.0 / 60.0);
        assert_eq!(w.per_second_at(Window::S60, 70), 0.0);
    }

    #[test]
    fn slot_reuse_after_wraparound_resets() {
        let w = RateWindow::new();
        w.record_n_at(7, 1);
        w.record_n_at(2, 1 + SLOTS as u64);
        assert_eq!(w.count_at(Window::S1, 2 + SLOTS as u64), 2);
        // a very late event for the old second is ignored, not merged
        w.record_at(1);
        assert_eq!(w.count_at(Window::S1, 2 + SLOTS as u64), 2);
        assert_eq!(w.count_at(Window::S1, 2), 0);
    }

    #[test]
    fn early_life_does_not_underflow() {
        let w = RateWindow::new();
        w.record_n_at(4, 0);
        assert_eq!(w.count_at(Window::S60, 1), 4);
        assert_eq!(w.per_second_at(Window::S60, 3), 4.0 / 60.0);
    }

    #[test]
    fn concurrent_records_are_not_lost() {
        let w = Arc::new(RateWindow::new());
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let w = Arc::clone(&w);
                std::thread::spawn(move || (0..10_000).for_each(|_| w.record_at(42)))
            })
            .collect();
        threads.into_iter().for_each(|t| t.join().unwrap());
        assert_eq!(w.count_at(Window::S1, 43), 80_000);
    }

    #[test]
    fn real_clock_smoke() {
        let w = RateWindow::new();
        w.record_n(3);
        w.record();
        let now = w.now_secs();
        assert_eq!(w.count_at(Window::S10, now + 1), 4);
        assert!(w.per_second(Window::S60) >= 0.0);
    }
}
