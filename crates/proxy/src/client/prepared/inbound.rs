//! The server → client half: walks the headers of server messages about to
//! reach a tracked client, pops the reply queue, swallows the replies to
//! weir's own Parse/Close, and puts the replies weir owes (ParseComplete,
//! CloseComplete, DEALLOCATE's answer) in their place in the stream.
//!
//! Replies also settle what weir keeps fresh: an idle ReadyForQuery settles
//! the statements prepared in the transaction it ends (an error or ROLLBACK
//! makes them uncertain), a stale-statement error on one of weir's
//! statements starts a new generation, and the 42P05 answering a Parse of a
//! name the client holds is renamed to the client's name.
//!
//! After an ErrorResponse to an extended-protocol message the server skips
//! everything up to Sync: the queued expectations up to that Sync are dropped
//! and what weir assumed about them is undone. Replies weir owed before the
//! failing message were already sent, since they are sent as soon as they
//! reach the head of the queue.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::owed::Observed;
use super::{ClientStatements, Expect, Rewrite, Statement};
use crate::protocol::{
    extended,
    messages::{self, Severity},
    peek_header, sqlstate,
    tags::{backend as be, status},
    HEADER_LEN,
};
use crate::server::conversation::MAX_SERVER_MESSAGE;
use crate::server::statements::ServerStatements;

/// Replies weir produced on its own, with no server bytes to carry them.
#[derive(Debug)]
pub struct Synthetic {
    pub bytes: Bytes,
    /// A ReadyForQuery weir produced answered the last thing owed.
    pub settled: bool,
}

impl ClientStatements {
    /// Applies the reply queue to server bytes on their way to the client.
    pub fn inbound(&mut self, chunk: Bytes, server: &mut ServerStatements) -> Bytes {
        if !self.tracking {
            return chunk;
        }
        let src: &[u8] = &chunk;
        let mut rw = Rewrite::default();
        let mut at = (self.reply_partial as usize).min(src.len());
        self.reply_partial -= at as u32;
        if self.reply_partial > 0 {
            return chunk;
        }
        self.owed_here(src, at, &mut rw);
        while let Ok(Some((tag, total))) = peek_header(&src[at..], MAX_SERVER_MESSAGE) {
            let avail = src.len() - at;
            let msg = &src[at..at + avail.min(total)];
            match self.on_reply(tag, msg, server) {
                Fate::Pass => {}
                Fate::Swallow => rw.splice(src, at, total, &[]),
                Fate::Replace(with) => rw.splice(src, at, total, &with),
            }
            if avail < total {
                // A message length is an i32: the rest fits.
                self.reply_partial = (total - avail) as u32;
                break;
            }
            at += total;
            self.owed_here(src, at, &mut rw);
        }
        match rw.out.take() {
            None => chunk,
            Some(mut out) => {
                out.extend_from_slice(&src[rw.copied..]);
                out.freeze()
            }
        }
    }

    /// Server bytes passed untouched to a client that is not tracked (yet):
    /// pops what they answer, so that the queue holds exactly the replies
    /// still owed when tracking starts.
    #[inline]
    pub fn observe(&mut self, src: &[u8]) {
        if self.tracking || self.max == 0 {
            return;
        }
        let at = (self.reply_partial as usize).min(src.len());
        self.reply_partial -= at as u32;
        if self.reply_partial == 0 {
            self.observe_untracked(src, at);
        }
    }

    fn observe_untracked(&mut self, src: &[u8], at: usize) {
        let mut seen = Observed::default();
        self.reply_partial = self.q.owed.observe(src, at, &mut seen);
        if let Some(s) = seen.status {
            self.status = s;
        }
        if let Some(on) = seen.skipping {
            self.set_skipping(on);
        }
    }

    /// Replies weir owes at the head of the queue, when no server message is
    /// being passed on: for a transfer loop with nothing else to send. None
    /// while a Sync or Query the server will answer is queued behind them:
    /// they then go out with the server's replies, in place, in one write.
    pub fn synthetic(&mut self) -> Option<Synthetic> {
        if !self.tracking || self.reply_partial > 0 || !self.q.expect.front().is_some_and(Expect::is_synthetic) {
            return None;
        }
        if self.q.expect.iter().skip_while(|e| e.is_synthetic()).any(|e| matches!(e, Expect::Sync | Expect::Query)) {
            return None;
        }
        let mut out = BytesMut::new();
        let settled = self.emit_owed(&mut out);
        Some(Synthetic { bytes: out.freeze(), settled })
    }

    fn owed_here(&mut self, src: &[u8], at: usize, rw: &mut Rewrite) {
        if self.q.expect.front().is_some_and(Expect::is_synthetic) {
            rw.splice_with(src, at, 0, |out| {
                self.emit_owed(out);
            });
        }
    }

    /// Writes the replies weir owes from the head of the queue. True when it
    /// wrote a ReadyForQuery that left nothing owed.
    fn emit_owed(&mut self, out: &mut BytesMut) -> bool {
        let mut settled = false;
        while self.q.expect.front().is_some_and(Expect::is_synthetic) {
            match self.q.expect.pop_front() {
                Some(Expect::FakeParse { .. }) => extended::parse_complete(out),
                Some(Expect::FakeClose { .. }) => extended::close_complete(out),
                Some(Expect::FakeDescribe { reply }) => out.extend_from_slice(&reply),
                Some(Expect::FakeDeallocate { client, stmt }) => {
                    if self.status == status::FAILED {
                        let msg = "current transaction is aborted, commands ignored until end of transaction block";
                        messages::error_response(out, Severity::Error, sqlstate::IN_FAILED_SQL_TRANSACTION, msg);
                        self.keep(client, stmt);
                    } else {
                        extended::command_complete(out, "DEALLOCATE");
                    }
                    messages::ready_for_query(out, self.status);
                    settled = self.q.expect.is_empty();
                }
                _ => {}
            }
        }
        settled
    }

    /// Pops what one server message answers, and says what the client gets
    /// of it (nothing, for the replies to weir's own Parse or Close).
    fn on_reply(&mut self, tag: u8, msg: &[u8], server: &mut ServerStatements) -> Fate {
        let front = self.q.expect.front();
        let pass = match tag {
            be::PARSE_COMPLETE => match front {
                Some(Expect::Parse { pass, .. }) => {
                    let pass = *pass;
                    self.q.expect.pop_front();
                    pass
                }
                Some(Expect::DupParse { .. }) => {
                    self.duplicate_took(server);
                    true
                }
                _ => true,
            },
            be::CLOSE_COMPLETE => match front {
                Some(Expect::Close { pass, .. }) => {
                    let pass = *pass;
                    self.q.expect.pop_front();
                    pass
                }
                _ => true,
            },
            be::BIND_COMPLETE => self.pop_if(|e| matches!(e, Expect::Bind { .. })),
            be::COPY_IN_RESPONSE | be::COPY_BOTH_RESPONSE => {
                self.drop_ignored_syncs();
                true
            }
            be::PARAMETER_DESCRIPTION => self.on_parameters(msg),
            be::ROW_DESCRIPTION | be::NO_DATA => self.on_description(tag, msg),
            be::COMMAND_COMPLETE | be::EMPTY_QUERY_RESPONSE | be::PORTAL_SUSPENDED => {
                if server.has_provisional() && msg[HEADER_LEN.min(msg.len())..].starts_with(b"ROLLBACK") {
                    server.rolled_back();
                }
                self.pop_if(|e| matches!(e, Expect::Execute))
            }
            be::ERROR_RESPONSE => return self.on_error(msg, server),
            be::READY_FOR_QUERY => {
                if let Some(&s) = msg.get(HEADER_LEN) {
                    self.status = s;
                }
                self.pop_through_sync(server);
                if self.status == status::IDLE {
                    server.settle(true);
                }
                true
            }
            _ => true,
        };
        if pass {
            Fate::Pass
        } else {
            Fate::Swallow
        }
    }

    /// An ErrorResponse: the failing message and the rest up to Sync were
    /// skipped. A stale-statement error on one of weir's statements starts a
    /// new generation; the 42P05 for a name the client holds is renamed.
    fn on_error(&mut self, msg: &[u8], server: &mut ServerStatements) -> Fate {
        if server.has_provisional() {
            server.rolled_back();
        }
        let whole = msg.len() >= HEADER_LEN && msg.len() == 1 + read_len(msg);
        let code = match msg.get(HEADER_LEN..) {
            Some(body) if whole => messages::error_code(body).unwrap_or(b""),
            _ => b"",
        };
        let mut fate = Fate::Pass;
        let mut failed = None;
        // Postgres's own answer in place of the server's (`bind_check`).
        let mut own = None;
        match self.q.expect.front() {
            None | Some(Expect::Query) | Some(Expect::Sync) => return fate,
            Some(Expect::DupParse { client, old, .. })
                if code == sqlstate::DUPLICATE_PREPARED_STATEMENT.code().as_bytes() =>
            {
                fate = Fate::Replace(renamed(msg, old.as_bytes(), client));
            }
            Some(Expect::Parse { pass: false, refused: Some(refusal), .. }) if refuses_first(msg, code) => {
                if let Some(Expect::Bind { managed: Some(stmt) }) = self.q.expect.get(1) {
                    own = Some(refusal.error(&stmt.weir));
                    failed = Some(stmt.clone());
                }
            }
            Some(Expect::Bind { managed: Some(stmt) } | Expect::Describe { managed: Some(stmt) }) => {
                failed = Some(stmt.clone());
                if is_stale(code) {
                    self.invalidate();
                }
            }
            _ => {}
        }
        // Skipped Closes and Parses are undone first: the names are the
        // client's as they were when the failing message was sent.
        self.skip_to_sync(server);
        if let Some(stmt) = failed {
            let renamed = self.client_names(own.as_deref().unwrap_or(msg), &stmt);
            fate = renamed.or(own).map_or(Fate::Pass, Fate::Replace);
        }
        fate
    }

    /// The server took a Parse weir sent for a name the client holds: its
    /// statement under that weir name was gone, and now has the new text.
    /// Postgres would have defined the client's statement: so does weir, and
    /// the weir name is closed before its next use.
    fn duplicate_took(&mut self, server: &mut ServerStatements) {
        if let Some(Expect::DupParse { client, old, new }) = self.q.expect.pop_front() {
            server.mark_uncertain(old);
            self.statements.insert(client, new);
        }
    }

    /// An extended-protocol Execute started COPY IN: Postgres ignores the
    /// Syncs sent after it until the client's CopyDone or CopyFail.
    fn drop_ignored_syncs(&mut self) {
        if !matches!(self.q.expect.front(), Some(Expect::Execute)) {
            return;
        }
        let end = self.q.expect.iter().position(|e| matches!(e, Expect::CopyEnd)).unwrap_or(self.q.expect.len());
        let mut i = 1;
        let mut end = end;
        while i < end {
            if matches!(self.q.expect[i], Expect::Sync) {
                self.q.expect.remove(i);
                end -= 1;
            } else {
                i += 1;
            }
        }
    }

    fn pop_if(&mut self, f: impl Fn(&Expect) -> bool) -> bool {
        if self.q.expect.front().is_some_and(f) {
            self.q.expect.pop_front();
        }
        true
    }

    /// The message at the head failed: it and everything up to the next
    /// Sync were not executed.
    fn skip_to_sync(&mut self, server: &mut ServerStatements) {
        let end = self.q.expect.iter().position(|e| matches!(e, Expect::Sync));
        let skipped: Vec<Expect> = self.q.expect.drain(..end.unwrap_or(self.q.expect.len())).collect();
        self.undo_all(skipped, server);
        // No Sync sent yet: what the client sends up to it is skipped too.
        self.set_skipping(end.is_none());
    }

    /// A ReadyForQuery ends the Sync or Query at the head (anything before it
    /// was never answered, so it was not executed).
    fn pop_through_sync(&mut self, server: &mut ServerStatements) {
        if matches!(self.q.expect.front(), Some(Expect::Sync | Expect::Query)) {
            self.q.expect.pop_front();
            return;
        }
        let end = self.q.expect.iter().position(|e| matches!(e, Expect::Sync | Expect::Query));
        let mut skipped: Vec<Expect> = self.q.expect.drain(..end.map_or(self.q.expect.len(), |i| i + 1)).collect();
        if end.is_some() {
            skipped.pop();
        }
        self.undo_all(skipped, server);
    }
}

impl ClientStatements {
    /// An error about the client's statement `failed`, with weir's name for
    /// it (a Bind's parameter count, say) replaced by the client's: the name
    /// the failing message used, where several name one statement of weir's.
    fn client_names(&self, msg: &[u8], failed: &Arc<Statement>) -> Option<Bytes> {
        let body = msg.get(HEADER_LEN..)?;
        memchr::memmem::find(body, b"weir_")?;
        let named = |s: &Arc<Statement>| memchr::memmem::find(body, s.weir.as_bytes()).is_some();
        // The unnamed statement first, then the named ones in name order,
        // then the ones a Close, DEALLOCATE, unnamed Parse or simple query
        // sent after the failing message dropped (not yet answered).
        let all = || {
            let unnamed = self.q.unnamed_stmt.iter().map(|s| (super::unnamed::UNNAMED, s));
            let closed = self.q.expect.iter().filter_map(|e| match e {
                Expect::FakeClose { client, stmt } | Expect::FakeDeallocate { client, stmt } => {
                    Some((client.as_slice(), stmt))
                }
                Expect::Unnamed { prior: Some(stmt), .. } => Some((super::unnamed::UNNAMED, stmt)),
                _ => None,
            });
            unnamed.chain(self.statements.iter().map(|(k, s)| (k.as_slice(), s))).chain(closed)
        };
        let (client, stmt) =
            all().find(|(_, s)| Arc::ptr_eq(s, failed) && named(s)).or_else(|| all().find(|(_, s)| named(s)))?;
        Some(renamed(msg, stmt.weir.as_bytes(), client))
    }
}

/// What the client gets of one server message.
enum Fate {
    Pass,
    Swallow,
    Replace(Bytes),
}

/// Codes that, on one of weir's statements, mean it no longer matches the
/// catalog: a type or object it names is gone (XX000 "cache lookup
/// failed"), its result type changed (0A000 "cached plan must not change
/// result type"), or it is not on the server (26000).
fn is_stale(code: &[u8]) -> bool {
    [sqlstate::INTERNAL_ERROR, sqlstate::FEATURE_NOT_SUPPORTED, sqlstate::INVALID_SQL_STATEMENT_NAME]
        .iter()
        .any(|s| s.code().as_bytes() == code)
}

/// Whether Postgres, holding the statement weir's Parse failed to prepare
/// (with `code`) before the client's Bind, would have refused the Bind's
/// parameters first: for any error about the statement or the transaction,
/// not for a cancel, a shutdown or a FATAL one, which is the session's.
fn refuses_first(msg: &[u8], code: &[u8]) -> bool {
    !code.starts_with(b"57") && !messages::error_is_fatal(&msg[HEADER_LEN.min(msg.len())..]).unwrap_or(true)
}

/// The length field of a whole message (it counts itself, not the tag).
fn read_len(msg: &[u8]) -> usize {
    u32::from_be_bytes([msg[1], msg[2], msg[3], msg[4]]) as usize
}

/// `msg` with every `from` in its body replaced by `to`, as bytes.
fn renamed(msg: &[u8], from: &[u8], to: &[u8]) -> Bytes {
    let mut out = BytesMut::with_capacity(msg.len() + to.len());
    out.extend_from_slice(&msg[..HEADER_LEN]);
    let mut rest = &msg[HEADER_LEN..];
    while let Some(i) = memchr::memmem::find(rest, from) {
        out.extend_from_slice(&rest[..i]);
        out.extend_from_slice(to);
        rest = &rest[i + from.len()..];
    }
    out.extend_from_slice(rest);
    let len = (out.len() - 1) as u32;
    out[1..HEADER_LEN].copy_from_slice(&len.to_be_bytes());
    out.freeze()
}
