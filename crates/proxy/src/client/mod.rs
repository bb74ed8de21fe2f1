//! The pooled session: a logged-in client of a configured database (`login`
//! logged it in), through the session loop that borrows servers from its
//! pool, until it leaves. The admin console (`admin`) is the other kind of
//! client; it never touches a pool.

pub mod prepared;
pub mod session;
pub mod transfer;
pub mod transfer_watchdog;

pub use session::Session;
use transfer_watchdog::WatchdogError;

use crate::login::{ClientError, ClientStream};

/// The session a pooled login settled: its unread bytes, its server for
/// life (session mode) and its listing come along.
pub(crate) fn start(client: &mut ClientStream, pooled: crate::login::Pooled) -> Session<'_> {
    let crate::login::Pooled { buf, login, held, listed } = pooled;
    let mut session = Session::new(client, buf, login);
    session.held = held;
    session.listed = Some(listed);
    session
}

/// A watchdog's end of a session, as the client is told it.
impl From<WatchdogError> for ClientError {
    fn from(e: WatchdogError) -> Self {
        ClientError::Watchdog { code: e.sqlstate(), message: e.to_string() }
    }
}
