//! PgBouncer's `verbose`: the log level, raised at run time (SET verbose,
//! RELOAD) above what `WEIR_LOG` allows. 0 keeps WEIR_LOG's level, 1 adds
//! debug, 2 and more trace. The level is tracing's process-wide state, as
//! the subscriber is; a change rebuilds tracing's per-call-site interest,
//! so a log call costs what it did before, and a span enter nothing more.

use std::sync::atomic::{AtomicU8, Ordering};

use tracing::level_filters::LevelFilter;
use tracing::{Level, Metadata, Subscriber};
use tracing_subscriber::filter::Targets;
use tracing_subscriber::layer::{Context, Layer};

static VERBOSE: AtomicU8 = AtomicU8::new(0);

/// The level `verbose = v` allows everywhere.
fn level_of(v: u8) -> LevelFilter {
    match v {
        0 => LevelFilter::OFF,
        1 => LevelFilter::DEBUG,
        _ => LevelFilter::TRACE,
    }
}

/// Sets `verbose`; log calls see it at once.
pub fn set(v: u8) {
    if VERBOSE.swap(v, Ordering::AcqRel) != v {
        tracing::callsite::rebuild_interest_cache();
    }
}

/// The running `verbose`.
pub fn get() -> u8 {
    VERBOSE.load(Ordering::Acquire)
}

/// WEIR_LOG's targets, or what `verbose` allows on top of them.
pub struct Verbosity {
    pub targets: Targets,
}

impl Verbosity {
    fn allows(&self, meta: &Metadata<'_>) -> bool {
        self.allows_at(meta.target(), meta.level())
    }

    fn allows_at(&self, target: &str, level: &Level) -> bool {
        self.targets.would_enable(target, level) || *level <= level_of(get())
    }
}

impl<S: Subscriber> Layer<S> for Verbosity {
    fn register_callsite(&self, meta: &'static Metadata<'static>) -> tracing::subscriber::Interest {
        match self.allows(meta) {
            true => tracing::subscriber::Interest::always(),
            false => tracing::subscriber::Interest::never(),
        }
    }

    fn enabled(&self, meta: &Metadata<'_>, _: Context<'_, S>) -> bool {
        self.allows(meta)
    }

    fn max_level_hint(&self) -> Option<LevelFilter> {
        let own = Layer::<S>::max_level_hint(&self.targets).unwrap_or(LevelFilter::TRACE);
        Some(own.max(level_of(get())))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn verbose_raises_the_level_above_the_targets() {
        let v = Verbosity { targets: "info".parse().unwrap() };
        assert!(v.allows_at("weir::x", &Level::INFO) && !v.allows_at("weir::x", &Level::DEBUG));
        set(1);
        assert!(v.allows_at("weir::x", &Level::DEBUG) && !v.allows_at("weir::x", &Level::TRACE));
        set(2);
        assert!(v.allows_at("weir::x", &Level::TRACE));
        set(0);
        assert!(!v.allows_at("weir::x", &Level::DEBUG), "back to WEIR_LOG's");
    }
}
