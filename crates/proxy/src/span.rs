//! How a logged-in client's events find its span `client{peer,user,db}`
//! without entering it at every poll.
//!
//! The login and the client's last steps run inside the span, entered per
//! poll as `Instrument` does. The session in between is polled some three
//! times per transaction, and entering a span costs each poll a lookup and
//! two reference counts in the subscriber's registry (about 520
//! instructions per transaction at `pgbench -c 1000`, of some 9,800). So
//! the session's polls only name the span in a thread-local (`Scope`), and
//! the events that can fire in them are written `client_event!(level, ...)`:
//! they take the span as their explicit parent, and print as they would
//! inside it, `client{peer=... user=... db=...}: message`.
//! Outside such a poll (another task, the accept loop) the macro is the
//! plain event, in whatever span is entered.

use std::cell::Cell;
use std::num::NonZeroU64;

use tracing::span::Id;

thread_local! {
    static CURRENT: Cell<Option<NonZeroU64>> = const { Cell::new(None) };
}

/// The span of the client whose session this thread is polling, if any.
pub(crate) fn current() -> Option<Id> {
    CURRENT.with(Cell::get).map(Id::from_non_zero_u64)
}

/// The id to name in a `Scope` (None for a disabled span).
pub(crate) fn id_of(span: &tracing::Span) -> Option<NonZeroU64> {
    span.id().map(|id| id.into_non_zero_u64())
}

/// While alive, `current()` is the given span on this thread; dropping it
/// (also in a panic) puts back what was there before.
pub(crate) struct Scope {
    before: Option<NonZeroU64>,
}

impl Scope {
    pub(crate) fn enter(id: Option<NonZeroU64>) -> Scope {
        Scope { before: CURRENT.with(|c| c.replace(id)) }
    }
}

impl Drop for Scope {
    fn drop(&mut self) {
        CURRENT.with(|c| c.set(self.before));
    }
}

/// A `tracing` event (`client_event!(info, ...)`, arguments as for
/// `tracing::info!`) that belongs to the client whose session is being
/// polled: its span is the event's parent. Anywhere else, the plain event.
macro_rules! client_event {
    ($level:ident, $($arg:tt)+) => {
        match $crate::span::current() {
            Some(parent) => tracing::$level!(parent: parent, $($arg)+),
            None => tracing::$level!($($arg)+),
        }
    };
}
pub(crate) use client_event;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scope_names_the_span_until_it_ends_and_nests() {
        assert_eq!(current(), None);
        let (a, b) = (NonZeroU64::new(7), NonZeroU64::new(9));
        {
            let _outer = Scope::enter(a);
            assert_eq!(current(), a.map(Id::from_non_zero_u64));
            {
                let _inner = Scope::enter(b);
                assert_eq!(current(), b.map(Id::from_non_zero_u64));
            }
            assert_eq!(current(), a.map(Id::from_non_zero_u64));
        }
        assert_eq!(current(), None);
    }

    /// What a subscriber writes, without times or colours.
    fn logged(events: impl FnOnce()) -> String {
        #[derive(Clone, Default)]
        struct Buf(std::sync::Arc<std::sync::Mutex<Vec<u8>>>);
        impl std::io::Write for Buf {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let buf = Buf::default();
        let out = buf.clone();
        let subscriber =
            tracing_subscriber::fmt().with_writer(move || buf.clone()).without_time().with_ansi(false).finish();
        tracing::subscriber::with_default(subscriber, events);
        let text = out.0.lock().unwrap().clone();
        String::from_utf8(text).unwrap()
    }

    #[test]
    fn an_event_in_a_scope_prints_as_inside_the_entered_span() {
        let span = || tracing::info_span!("client", peer = "127.0.0.1:5", user = "u", db = "d");
        let entered = logged(|| span().in_scope(|| tracing::info!(pid = 3, "server silent")));
        let scoped = logged(|| {
            let s = span();
            let _scope = Scope::enter(id_of(&s));
            client_event!(info, pid = 3, "server silent");
        });
        let plain = logged(|| client_event!(info, pid = 3, "server silent"));
        assert_eq!(
            entered,
            " INFO client{peer=\"127.0.0.1:5\" user=\"u\" db=\"d\"}: weir::span::tests: server silent pid=3\n"
        );
        assert_eq!(scoped, entered);
        assert_eq!(plain, " INFO weir::span::tests: server silent pid=3\n");
    }
}
