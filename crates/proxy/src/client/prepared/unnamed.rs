//! The client's unnamed statement (a Parse with an empty name) in
//! transaction mode. Postgres keeps it until the next unnamed Parse or
//! simple query; weir keeps the client's view of it beside its named
//! statements (`Queues::unnamed_stmt`), as one of:
//!
//! * weir's statement for its text (`weir_<hash>`, shared like named ones):
//!   when the client has parsed that text `prepare_unnamed_after` times
//!   lately, or its server already holds it. The Parse is answered by weir
//!   (the server has it) or sent as a Parse of weir's name; Bind, Describe
//!   and Close of the unnamed statement use weir's name, and it is prepared
//!   on whichever server the client gets next. Unnamed portals stay unnamed.
//! * the server's own unnamed statement (`Unnamed::Raw`), sent as it came:
//!   used as it is in this lease, and as weir's statement (prepared first)
//!   by a Bind or Describe in a later lease, on whatever server that is.
//!   A Parse the server already holds is sent so too when a Sync or simple
//!   query is still unanswered before it: that may leave the transaction
//!   failed, and Postgres would then answer the Parse with 25P02;
//! * none (`Unnamed::Gone`): a Parse of it failed, or a simple query or
//!   Close dropped it. A Bind or Describe of it is preceded by a Close of
//!   the server's own unnamed statement, so that the server answers with
//!   Postgres's 26000 whatever it held.
//!
//! Only text that parsed is kept (a failed Parse is undone), only text that
//! touches nothing weir follows (plain `Sql::Other`), and only for a client
//! whose settings resolve names as the pool's other clients do (no
//! search_path of its own, no SET, no SET ROLE): statements are shared by
//! text, and must never be planned under another client's settings.

use std::sync::Arc;

use bytes::BytesMut;

use super::outbound::{next_or_stream, Msg, Step, MAX_TRACKED_PARSE};
use super::sql::{classify, Sql};
use super::{ClientStatements, Expect, Rewrite, Statement};
use crate::protocol::{
    extended::{self, TARGET_STATEMENT},
    tags::{frontend as fe, status},
    ProtocolError,
};
use crate::server::statements::ServerStatements;

/// Unnamed statement texts a client keeps count of, most recent first.
const RECENT: usize = 16;

/// The unnamed statement's name.
pub(super) const UNNAMED: &[u8] = b"";

/// What the client's unnamed statement is, when not weir's statement
/// (`Queues::unnamed_stmt`).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Unnamed {
    /// weir's statement if there is one, else unknown (the
    /// server's own unnamed statement is used).
    #[default]
    Held,
    /// The server's own unnamed statement, parsed as sent in this lease.
    Raw,
    /// The client has none.
    Gone,
}

impl Unnamed {
    /// A new lease: the server's unnamed statement is not the client's.
    pub(super) fn lease_began(&mut self) {
        if *self == Unnamed::Raw {
            *self = Unnamed::Held;
        }
    }
}

/// An unnamed statement text a client parsed lately, and how many times.
#[derive(Debug)]
pub(super) struct Seen {
    stmt: Arc<Statement>,
    epoch: u64,
    count: u32,
}

impl ClientStatements {
    /// The client's statement behind `name` as weir names it on servers;
    /// None for the server's own unnamed statement of this lease.
    pub(super) fn managed(&self, name: &[u8]) -> Option<Arc<Statement>> {
        if name.is_empty() {
            return if self.q.unnamed == Unnamed::Raw { None } else { self.q.unnamed_stmt.clone() };
        }
        self.statements.get(name).cloned()
    }

    /// Before a Bind or Describe of `name` weir does not manage: a Close of
    /// the server's unnamed statement when the client has none, so that
    /// the server answers 26000 as Postgres would (its own unnamed
    /// statement may be another client's). Nothing is owed to the client.
    pub(super) fn close_if_gone(&mut self, name: &[u8], src: &[u8], at: usize, rw: &mut Rewrite) {
        if name.is_empty() && self.q.unnamed == Unnamed::Gone && self.q.unnamed_stmt.is_none() {
            let mut close = BytesMut::new();
            extended::target(&mut close, fe::CLOSE, TARGET_STATEMENT, "");
            rw.splice(src, at, 0, &close);
            self.q.expect.push_back(Expect::Close { pass: false, evicted: None });
        }
    }

    /// A simple query or Close drops the client's unnamed statement; if it
    /// is skipped, the unnamed statement is as it was.
    pub(super) fn drop_unnamed(&mut self) {
        let prior = self.q.unnamed_stmt.take();
        let was = std::mem::replace(&mut self.q.unnamed, Unnamed::Gone);
        if prior.is_some() || was != Unnamed::Gone {
            self.expect_change(Expect::Unnamed { prior, was });
        }
    }

    /// Undoes a skipped unnamed Parse or simple query.
    pub(super) fn restore_unnamed(&mut self, prior: Option<Arc<Statement>>, was: Unnamed) {
        self.q.unnamed_stmt = prior;
        self.q.unnamed = was;
    }

    /// A Sync or simple query sent before this point is still unanswered:
    /// the transaction may have failed since the last ReadyForQuery.
    pub(super) fn outcome_pending(&self) -> bool {
        self.q.expect.iter().any(|e| matches!(e, Expect::Sync | Expect::Query))
    }

    /// An unnamed Parse (statements are tracked).
    pub(super) fn on_unnamed_parse(
        &mut self,
        m: &Msg<'_>,
        src: &[u8],
        server: &mut ServerStatements,
        rw: &mut Rewrite,
    ) -> Result<Step, ProtocolError> {
        if !m.head_ready() {
            return Ok(Step::Wait);
        }
        let body = m.body();
        // Postgres drops the unnamed statement before it parses the new
        // one; if this Parse is skipped, the old one stays.
        let prior = self.q.unnamed_stmt.take();
        let was = std::mem::replace(&mut self.q.unnamed, Unnamed::Raw);
        self.expect_change(Expect::Unnamed { prior, was });
        let plain = self.q.hot > 0 && m.whole() && m.total <= MAX_TRACKED_PARSE && self.status != status::FAILED;
        let Some((stmt, hot)) = plain.then(|| self.sighting(body)).flatten() else {
            self.look_at(&body[1..], server);
            self.q.expect.push_back(Expect::Parse { pass: true, weir: None, client: None, refused: None });
            return Ok(next_or_stream(m));
        };
        self.q.unnamed_stmt = Some(stmt.clone());
        let client = Some((UNNAMED.to_vec(), stmt.clone()));
        // One look-up: whether the server holds it, marked as just used
        // unless the server's own answer is wanted.
        let pending = self.outcome_pending();
        let held = if pending { server.contains(&stmt.weir) } else { server.hold(&stmt.weir) };
        let hot = hot || held;
        if !hot || (held && pending) {
            // The server's own answer, whatever the transaction's state.
            self.expect_change(Expect::Parse { pass: true, weir: None, client, refused: None });
            return Ok(Step::Next);
        }
        self.q.unnamed = Unnamed::Held;
        if held {
            self.metrics.record_unnamed_hit();
            rw.splice(src, m.at, m.total, &[]);
            self.expect_change(Expect::FakeParse { client: UNNAMED.to_vec(), stmt });
            return Ok(Step::Next);
        }
        self.metrics.record_unnamed_prepare();
        let parse = self.server_parse(&stmt, server, client);
        rw.splice(src, m.at, m.total, &parse);
        Ok(Step::Next)
    }

    /// Counts a sighting of the unnamed Parse `body`: weir's statement for
    /// it, and whether it is hot by count (parsed often enough lately; it
    /// is hot too when already on this server, which the caller asks).
    /// None for a text that is not plain `Sql::Other` (only such texts are
    /// counted, so a counted one is not classified again), or a malformed
    /// body (the server answers it).
    fn sighting(&mut self, body: &[u8]) -> Option<(Arc<Statement>, bool)> {
        let text = &body[1..];
        let epoch = self.metrics.statements_epoch();
        // Always 0 while unnamed statements are shared (`unshare_unnamed`).
        let scope = self.q.scope;
        let recent = &mut self.q.recent;
        let count = match recent.iter().position(|s| s.stmt.text() == text) {
            Some(i) => {
                recent[..=i].rotate_right(1);
                recent[0].count.saturating_add(1)
            }
            None => {
                if classify(text) != Sql::Other {
                    return None;
                }
                recent.truncate(RECENT - 1);
                let p = extended::read_parse(body).ok()?;
                let stmt = Arc::new(Statement::new(p.query, p.param_types, epoch, scope));
                recent.insert(0, Seen { stmt, epoch, count: 0 });
                1
            }
        };
        let seen = &mut recent[0];
        seen.count = count;
        if seen.epoch != epoch {
            // A new generation: the same text, a statement of its own.
            let p = extended::read_parse(body).ok()?;
            seen.stmt = Arc::new(Statement::new(p.query, p.param_types, epoch, scope));
            seen.epoch = epoch;
        }
        Some((seen.stmt.clone(), count >= self.q.hot))
    }
}
