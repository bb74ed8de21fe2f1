//! What a server connection's watchdog is told: the timeouts it keeps
//! (`Watch`, from the config) and where its liveness probe's connection
//! counts (`ProbeRoom`, the pool's places). Set when a connection is dialled;
//! read by the client's transfer and by `probe`.

use std::sync::Arc;
use std::time::Duration;

/// Watchdog settings for conversations on a server connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Watch {
    /// `query_timeout`: cancel a query that runs longer (None = off).
    pub query_timeout: Option<Duration>,
    /// How long a cancelled query may take to end before the connection is
    /// declared frozen (`server_check_timeout`).
    pub cancel_grace: Duration,
    /// `server_check_silence`: probe a server owing an answer that has been
    /// silent this long (None = off).
    pub silence: Option<Duration>,
    /// `idle_transaction_timeout` (None = off).
    pub idle_transaction: Option<Duration>,
    /// `transaction_timeout` (None = off).
    pub transaction: Option<Duration>,
}

impl Watch {
    pub fn from_config(g: &crate::config::General) -> Self {
        let nonzero = |d: Option<Duration>| d.filter(|d| !d.is_zero());
        Watch {
            query_timeout: nonzero(g.query_timeout),
            cancel_grace: g.server_check_timeout,
            silence: nonzero(Some(g.server_check_silence)),
            idle_transaction: nonzero(g.idle_transaction_timeout),
            transaction: nonzero(g.transaction_timeout),
        }
    }

    /// The watch of one pool: `[weir]`'s, with the timeouts its user may
    /// set for itself (`[users]`) as resolved in its settings.
    pub fn for_pool(g: &crate::config::General, settings: &crate::config::PoolSettings) -> Self {
        Watch {
            query_timeout: settings.query_timeout,
            idle_transaction: settings.idle_transaction_timeout,
            transaction: settings.transaction_timeout,
            ..Watch::from_config(g)
        }
    }
}

/// Gives a probe its place among its pool's server connections.
pub trait ProbePlaces: Send + Sync {
    /// A place held until the returned value is dropped; None when every
    /// place of the pool is busy.
    fn take(&self) -> Option<Box<dyn Send + Sync>>;
}

/// Where a connect spec's probes count (the pool's places); none for a spec
/// no pool owns. Any two compare equal: it is no part of what a connection
/// is opened with.
#[derive(Clone, Default)]
pub struct ProbeRoom(pub Option<Arc<dyn ProbePlaces>>);

impl PartialEq for ProbeRoom {
    fn eq(&self, _: &Self) -> bool {
        true
    }
}

impl Eq for ProbeRoom {}

impl std::fmt::Debug for ProbeRoom {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(if self.0.is_some() { "ProbeRoom(pool)" } else { "ProbeRoom(none)" })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn zero_durations_turn_checks_off() {
        let mut g = crate::config::General {
            server_check_silence: Duration::ZERO,
            query_timeout: Some(Duration::ZERO),
            ..Default::default()
        };
        let w = Watch::from_config(&g);
        assert_eq!(w.silence, None);
        assert_eq!(w.query_timeout, None);
        g.server_check_silence = Duration::from_secs(5);
        assert_eq!(Watch::from_config(&g).silence, Some(Duration::from_secs(5)));
    }
}
