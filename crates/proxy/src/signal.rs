//! One-way flags with a wake-up. `Signal`, for many waiters: the drain at
//! shutdown (every request checks it; admin sessions and the accept loop
//! wait on it). Checking it is one atomic load, where
//! `CancellationToken::is_cancelled` takes a mutex. `Switch`, for one
//! client's own task: KILL (end now) or the drain (end when idle), waited
//! on with no lock at all.

use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::Poll;

use futures_util::task::AtomicWaker;
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

/// A client's switch. Its only waiter is the client's own task (the session
/// and the KILL watch around it share one waker), so an `AtomicWaker` does.
#[derive(Debug, Default)]
pub struct Switch {
    state: AtomicU8,
    reason: OnceLock<&'static str>,
    waker: AtomicWaker,
}

const DRAIN: u8 = 1;
const KILL: u8 = 2;

impl Switch {
    /// Ends the client now, telling it `why`. Wins over a drain.
    pub fn kill(&self, why: &'static str) {
        let _ = self.reason.set(why);
        self.state.fetch_max(KILL, Ordering::SeqCst);
        self.waker.wake();
    }

    /// Wakes the client so that, if it is idle, it sees the drain.
    pub fn drain(&self) {
        self.state.fetch_max(DRAIN, Ordering::SeqCst);
        self.waker.wake();
    }

    /// Ready with the reason once the client is killed. A poll function:
    /// the session polls it beside its own future (no state while it waits).
    pub fn poll_killed(&self, cx: &mut std::task::Context<'_>) -> Poll<&'static str> {
        self.poll_state(cx, KILL)
            .map(|()| self.reason.get().copied().unwrap_or("terminating connection due to administrator command"))
    }

    /// Ready while a drain (and no KILL) is on; polled beside the client's
    /// socket in its waits between requests.
    pub fn poll_drained(&self, cx: &mut std::task::Context<'_>) -> Poll<()> {
        self.poll_state(cx, DRAIN)
    }

    /// Wakes the client's task for a reason of its cancel slot's (a
    /// CancelRequest for its queued query).
    pub fn wake(&self) {
        self.waker.wake();
    }

    /// Ready once `done()` holds, else Pending with the task's waker
    /// registered for `kill`, `drain` and `wake` (checked again after
    /// registering, so a wake in between is not lost).
    pub fn poll_until(&self, cx: &mut std::task::Context<'_>, done: impl Fn() -> bool) -> Poll<()> {
        if done() {
            return Poll::Ready(());
        }
        self.waker.register(cx.waker());
        if done() {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    }

    pub fn is_killed(&self) -> bool {
        self.state.load(Ordering::SeqCst) == KILL
    }

    fn poll_state(&self, cx: &mut std::task::Context<'_>, want: u8) -> Poll<()> {
        self.poll_until(cx, || self.state.load(Ordering::SeqCst) == want)
    }
}

#[cfg(test)]
mod tests {
    use std::future::poll_fn;

    use super::*;

    #[tokio::test]
    async fn a_switch_tells_drain_from_kill() {
        let s = Arc::new(Switch::default());
        let waiting = tokio::spawn({
            let s = s.clone();
            async move { poll_fn(|cx| s.poll_drained(cx)).await }
        });
        tokio::task::yield_now().await;
        s.drain();
        tokio::time::timeout(std::time::Duration::from_secs(5), waiting).await.unwrap().unwrap();
        assert!(!s.is_killed());
        let killed = tokio::spawn({
            let s = s.clone();
            async move { poll_fn(|cx| s.poll_killed(cx)).await }
        });
        tokio::task::yield_now().await;
        s.kill("bye");
        assert_eq!(tokio::time::timeout(std::time::Duration::from_secs(5), killed).await.unwrap().unwrap(), "bye");
        s.drain();
        assert!(s.is_killed(), "a later drain does not undo a kill");
        let drained = futures_util::FutureExt::now_or_never(poll_fn(|cx| s.poll_drained(cx)));
        assert!(drained.is_none(), "a killed client is not drained");
    }

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
