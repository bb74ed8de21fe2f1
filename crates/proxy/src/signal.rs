//! `Signal`: a one-way flag with a wake-up, for the drain at shutdown (every
//! request checks it; idle clients, admin sessions and the accept loop wait
//! on it) and for KILL of one client (its task waits on it all session).
//! Checking it is one atomic load, where `CancellationToken::is_cancelled`
//! takes a mutex, and it is about half a token's size.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use tokio::sync::Notify;

/// Set once, never cleared. Clones share it.
#[derive(Debug, Clone, Default)]
pub struct Signal(Arc<Inner>);

#[derive(Debug, Default)]
struct Inner {
    set: AtomicBool,
    notify: Notify,
}

impl Signal {
    pub fn new() -> Self {
        Self::default()
    }

    /// Sets the flag and wakes every waiter. Later calls do nothing.
    pub fn cancel(&self) {
        if !self.0.set.swap(true, Ordering::SeqCst) {
            self.0.notify.notify_waiters();
        }
    }

    pub fn is_cancelled(&self) -> bool {
        self.0.set.load(Ordering::SeqCst)
    }

    /// Resolves once the flag is set. Cancel-safe.
    pub async fn cancelled(&self) {
        // Created before the flag is read: `notify_waiters` completes every
        // `Notified` that exists when it runs, so no wake-up is lost.
        let notified = self.0.notify.notified();
        if self.is_cancelled() {
            return;
        }
        notified.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waiters_before_and_after_the_cancel_both_see_it() {
        let s = Signal::new();
        let early = tokio::spawn({
            let s = s.clone();
            async move { s.cancelled().await }
        });
        tokio::task::yield_now().await;
        assert!(!s.is_cancelled());
        s.cancel();
        s.cancel();
        assert!(s.is_cancelled());
        tokio::time::timeout(std::time::Duration::from_secs(5), early).await.unwrap().unwrap();
        tokio::time::timeout(std::time::Duration::from_secs(5), s.cancelled()).await.unwrap();
    }
}
