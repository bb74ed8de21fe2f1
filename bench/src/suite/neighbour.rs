//! The busy neighbour: a thread of this process spinning on one core while a
//! workload runs, as an application beside a sidecar proxy would. It is not
//! any target's process, so no target's CPU figure includes it.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;

/// Spins until dropped.
pub struct Neighbour {
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<u64>>,
}

impl Neighbour {
    pub fn start() -> Neighbour {
        let stop = Arc::new(AtomicBool::new(false));
        let flag = Arc::clone(&stop);
        let thread = std::thread::Builder::new()
            .name("busy-neighbour".into())
            .spawn(move || {
                let mut turns = 0u64;
                while !flag.load(Ordering::Relaxed) {
                    turns = turns.wrapping_add(1);
                    std::hint::spin_loop();
                }
                turns
            })
            .ok();
        if thread.is_none() {
            eprintln!("warning: could not start the busy-neighbour thread; this row runs without it");
        }
        Neighbour { stop, thread }
    }

    /// Stops the thread; the loop turns it made.
    pub fn stop(mut self) -> u64 {
        self.halt()
    }

    fn halt(&mut self) -> u64 {
        self.stop.store(true, Ordering::Relaxed);
        self.thread.take().and_then(|t| t.join().ok()).unwrap_or(0)
    }
}

impl Drop for Neighbour {
    fn drop(&mut self) {
        self.halt();
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn spins_until_stopped() {
        let n = super::Neighbour::start();
        std::thread::sleep(std::time::Duration::from_millis(20));
        assert!(n.stop() > 1000, "the thread spun");
    }
}
