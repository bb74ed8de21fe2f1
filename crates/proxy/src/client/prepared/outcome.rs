//! Messages that wait for an earlier batch's outcome. A client may write
//! past its Sync before the server answers it (a pipeline). What weir made
//! of the messages before that Sync (a statement the client now holds, one
//! it closed, one weir prepared on the server) holds only if the server
//! ran them; after an error it skips them, and weir undoes what it assumed
//! (`undo`). A statement-naming message after the Sync runs whatever the
//! outcome, so it must be rewritten with the outcome known: it waits, with
//! what follows it, until the server has answered that Sync. Replies flow
//! meanwhile, and nothing waits where the batch could not fail before its
//! statement changes (weir's own answers at the head of a batch).

use std::sync::Arc;

use bytes::BytesMut;

use super::{ClientStatements, Expect, Statement, SKIPPING};
use crate::protocol::extended::{self, TARGET_STATEMENT};
use crate::protocol::tags::frontend as fe;
use crate::server::statements::ServerStatements;

/// A Flush message.
const FLUSH: &[u8] = &[fe::FLUSH, 0, 0, 0, 4];

impl Expect {
    /// This reply stands for a change of the client's statements or of the
    /// server's (weir's): it is undone if the server skips its message.
    fn changes_statements(&self) -> bool {
        match self {
            Expect::Parse { weir, client, .. } => weir.is_some() || client.is_some(),
            Expect::Close { evicted, .. } => evicted.is_some(),
            Expect::DupParse { .. }
            | Expect::FakeParse { .. }
            | Expect::FakeClose { .. }
            | Expect::FakeDeallocate { .. }
            | Expect::Unnamed { .. } => true,
            _ => false,
        }
    }

    /// The server may answer this message with an error (and then skip the
    /// rest of its batch).
    fn may_fail(&self) -> bool {
        matches!(
            self,
            Expect::Parse { .. }
                | Expect::Bind { .. }
                | Expect::Describe { .. }
                | Expect::OwnDescribe { .. }
                | Expect::Execute
                | Expect::DupParse { .. }
        )
    }
}

impl ClientStatements {
    /// Queues `e`, a reply that changes statements (`changes_statements`).
    pub(super) fn expect_change(&mut self, e: Expect) {
        if self.skipping() || e.may_fail() || self.q.expect.iter().any(Expect::may_fail) {
            self.q.changes = true;
        }
        self.q.expect.push_back(e);
    }

    /// Whether the statement-naming message at hand waits: a change queued
    /// before an unanswered Sync may yet be skipped (it, or a message before
    /// it in its batch, may fail).
    #[cold]
    #[inline(never)]
    pub(super) fn awaits_outcome(&mut self) -> bool {
        // The server skips what was sent since an error, up to a Sync.
        let (mut risky, mut uncertain) = (self.skipping(), false);
        for e in &self.q.expect {
            match e {
                Expect::Sync if uncertain => return true,
                Expect::Sync => risky = false,
                e => {
                    risky |= e.may_fail();
                    uncertain |= risky && e.changes_statements();
                }
            }
        }
        // Changes settled stay settled: what could skip them only leaves.
        self.q.changes = uncertain;
        false
    }

    /// An error came back before the Sync that ends its batch was sent.
    fn skipping(&self) -> bool {
        self.lease & SKIPPING != 0
    }

    /// The client's Parse of `stmt` (as `name`), which the server holds,
    /// where the transaction has failed or may have (a Sync or query before
    /// it is unanswered): Postgres answers 25P02 in a failed one (COMMIT
    /// and ROLLBACK parse even there). The server answers for weir's
    /// statement, closed and parsed again; no other statement of the
    /// server's (its unnamed one included) is touched.
    pub(super) fn parse_again(
        &mut self,
        stmt: &Arc<Statement>,
        name: Vec<u8>,
        server: &mut ServerStatements,
    ) -> BytesMut {
        server.remove(&stmt.weir);
        let mut out = BytesMut::new();
        extended::target(&mut out, fe::CLOSE, TARGET_STATEMENT, &stmt.weir);
        self.expect_change(Expect::Close { pass: false, evicted: Some(stmt.weir.clone()) });
        out.extend_from_slice(&self.server_parse(stmt, server, Some((name, stmt.clone()))));
        out
    }

    /// Where the server lacks `weir`, a statement under that name for a
    /// Parse of it to be refused with 42P05 (after the server checks its
    /// text): an empty one, which parses even in a failed transaction,
    /// where preparing the real one would be refused. The name is then
    /// uncertain: closed before it is prepared for real.
    pub(super) fn stand_in(&mut self, weir: &Arc<str>, server: &mut ServerStatements) -> BytesMut {
        let mut out = BytesMut::new();
        extended::target(&mut out, fe::CLOSE, TARGET_STATEMENT, weir);
        self.q.expect.push_back(Expect::Close { pass: false, evicted: None });
        extended::parse(&mut out, weir, b"", b"\0\0");
        self.q.expect.push_back(Expect::Parse { pass: false, weir: None, client: None, refused: None });
        server.mark_uncertain(weir.clone());
        out
    }

    /// What goes to the server in place of a query weir answers itself: a
    /// Flush when replies are still owed for messages before it (that
    /// ended with no Sync or Flush), so that they come before weir's answer
    /// as Postgres would send them at the query's end; else nothing.
    pub(super) fn flush_first(&self) -> &'static [u8] {
        if self.q.expect.iter().any(|e| !e.is_synthetic()) {
            FLUSH
        } else {
            &[]
        }
    }
}
