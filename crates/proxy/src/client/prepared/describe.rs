//! What Postgres answers to a Describe of a statement weir must prepare
//! first, in a failed transaction. Postgres, holding the statement, refuses
//! only a statement that returns rows (25P02, the same error weir's Parse
//! gets there); for one that returns none it sends the ParameterDescription
//! and NoData. The server cannot parse in that state, so weir answers from
//! what it learned of the statement earlier: the server's answer to a
//! Describe of it, the client's own or weir's (one Describe of its own
//! after a named Parse of the client's, unless the client follows it with
//! a Describe of it or its text surely returns rows, its reply swallowed).
//! Where the
//! transaction's state is not known yet (a Sync or query before it is
//! unanswered), the Describe waits for it.

use std::sync::{Arc, OnceLock};

use bytes::{Bytes, BytesMut};

use super::outbound::{Msg, Step};
use super::{ClientStatements, Expect, Rewrite, Statement};
use crate::protocol::extended::{self, TARGET_STATEMENT};
use crate::protocol::tags::{backend as be, frontend as fe, status};
use crate::protocol::HEADER_LEN;

/// What a statement's Describe gets from Postgres, once weir has seen it:
/// the ParameterDescription and NoData of one that returns no rows (empty
/// for one that returns rows).
pub type Description = OnceLock<Bytes>;

impl ClientStatements {
    /// weir's own Describe of `stmt`, to follow the client's Parse `m` of
    /// it (named `name`), unless the client's next message describes it.
    pub(super) fn describe_own(
        &mut self,
        stmt: &Arc<Statement>,
        m: &Msg<'_>,
        src: &[u8],
        name: &[u8],
        out: &mut BytesMut,
    ) {
        let next = &src[(m.at + m.total).min(src.len())..];
        if stmt.described.get().is_none() && !describes(next, name) && !returns_rows(stmt.text()) {
            extended::target(out, fe::DESCRIBE, TARGET_STATEMENT, &stmt.weir);
            self.q.expect.push_back(Expect::OwnDescribe { stmt: stmt.clone() });
        }
    }

    /// A Describe of `stmt`, which the server lacks: answered by weir in a
    /// failed transaction when the statement returns no rows; waits while
    /// the transaction's state is not known. None: prepared first, as any.
    #[cold]
    #[inline(never)]
    pub(super) fn describe_unprepared(
        &mut self,
        stmt: &Arc<Statement>,
        m: &Msg<'_>,
        src: &[u8],
        rw: &mut Rewrite,
    ) -> Option<Step> {
        let reply = stmt.described.get().filter(|r| !r.is_empty())?;
        if self.status != status::FAILED {
            return self.outcome_pending().then_some(Step::Wait);
        }
        rw.splice(src, m.at, m.total, &[]);
        self.q.expect.push_back(Expect::FakeDescribe { reply: reply.clone() });
        Some(Step::Next)
    }

    /// A ParameterDescription from the server: kept while the statement's
    /// description is learned. False: weir's own, not passed on.
    pub(super) fn on_parameters(&mut self, msg: &[u8]) -> bool {
        let (stmt, own) = match self.q.expect.front() {
            Some(Expect::OwnDescribe { stmt }) => (stmt, true),
            Some(Expect::Describe { managed: Some(stmt) }) => (stmt, false),
            _ => return true,
        };
        if stmt.described.get().is_none() && msg.len() > 4 && msg.len() == 1 + read_len(msg) {
            self.q.parameters = Some(Bytes::copy_from_slice(msg));
        }
        !own
    }

    /// A RowDescription or NoData answering a Describe of a statement: what
    /// it describes is learned. False: weir's own, not passed on.
    pub(super) fn on_description(&mut self, tag: u8, msg: &[u8]) -> bool {
        let (stmt, own) = match self.q.expect.front() {
            Some(Expect::OwnDescribe { stmt }) => (stmt, true),
            Some(Expect::Describe { managed: Some(stmt) }) => (stmt, false),
            Some(Expect::Describe { managed: None }) => {
                self.q.expect.pop_front();
                return true;
            }
            _ => return true,
        };
        let parameters = self.q.parameters.take();
        if tag == be::ROW_DESCRIPTION {
            let _ = stmt.described.set(Bytes::new());
        } else if let Some(parameters) = parameters.filter(|_| msg.len() == 5) {
            let _ = stmt.described.set([&parameters[..], msg].concat().into());
        }
        self.q.expect.pop_front();
        !own
    }
}

/// Whether a statement text surely returns rows: it begins with SELECT,
/// VALUES, TABLE or SHOW (a WITH may wrap an INSERT; anything else, a
/// leading comment included, may return none).
fn returns_rows(text: &[u8]) -> bool {
    let start = text.iter().position(|b| !b.is_ascii_whitespace() && *b != b'(').unwrap_or(text.len());
    let word = &text[start..];
    let len = word.iter().position(|b| !b.is_ascii_alphabetic()).unwrap_or(word.len());
    [&b"select"[..], b"values", b"table", b"show"].iter().any(|k| word[..len].eq_ignore_ascii_case(k))
}

/// Whether `next` begins with a Describe of the statement `name`.
fn describes(next: &[u8], name: &[u8]) -> bool {
    let len = HEADER_LEN + 1 + name.len() + 1;
    next.len() >= len
        && next[0] == fe::DESCRIBE
        && read_len(next) == len - 1
        && next[HEADER_LEN] == TARGET_STATEMENT
        && &next[HEADER_LEN + 1..len - 1] == name
}

/// A message's length field (the bytes after the tag).
fn read_len(msg: &[u8]) -> usize {
    u32::from_be_bytes([msg[1], msg[2], msg[3], msg[4]]) as usize
}
