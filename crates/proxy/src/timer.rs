//! A future raced against a timer: the one helper both the pool's checks and
//! a client's login (one timer for its whole login) bound their steps by.

use std::pin::Pin;

use tokio::time::Sleep;

/// `fut`'s output, or None if `timer` fires first.
pub(crate) async fn within<F: std::future::Future>(timer: Pin<&mut Sleep>, fut: F) -> Option<F::Output> {
    tokio::select! {
        biased;
        v = fut => Some(v),
        _ = timer => None,
    }
}
