//! The server → client half: walks the headers of server messages about to
//! reach a tracked client, pops the reply queue, swallows the replies to
//! weir's own Parse/Close, and puts the replies weir owes (ParseComplete,
//! CloseComplete, DEALLOCATE's answer) in their place in the stream.
//!
//! After an ErrorResponse to an extended-protocol message the server skips
//! everything up to Sync: the queued expectations up to that Sync are dropped
//! and what weir assumed about them is undone. Replies weir owed before the
//! failing message were already sent, since they are sent as soon as they
//! reach the head of the queue.

use bytes::{Bytes, BytesMut};

use super::{ClientStatements, Expect, Rewrite};
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
            if !self.on_reply(tag, msg, server) {
                rw.splice(src, at, total, &[]);
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

    /// Replies weir owes at the head of the queue, when no server message is
    /// being passed on: for a transfer loop with nothing else to send.
    pub fn synthetic(&mut self) -> Option<Synthetic> {
        if !self.tracking || self.reply_partial > 0 || !self.expect.front().is_some_and(Expect::is_synthetic) {
            return None;
        }
        let mut out = BytesMut::new();
        let settled = self.emit_owed(&mut out);
        Some(Synthetic { bytes: out.freeze(), settled })
    }

    fn owed_here(&mut self, src: &[u8], at: usize, rw: &mut Rewrite) {
        if self.expect.front().is_some_and(Expect::is_synthetic) {
            let mut out = BytesMut::new();
            self.emit_owed(&mut out);
            rw.splice(src, at, 0, &out);
        }
    }

    /// Writes the replies weir owes from the head of the queue. True when it
    /// wrote a ReadyForQuery that left nothing owed.
    fn emit_owed(&mut self, out: &mut BytesMut) -> bool {
        let mut settled = false;
        while self.expect.front().is_some_and(Expect::is_synthetic) {
            match self.expect.pop_front() {
                Some(Expect::FakeParse { .. }) => extended::parse_complete(out),
                Some(Expect::FakeClose { .. }) => extended::close_complete(out),
                Some(Expect::FakeDeallocate { client, stmt }) => {
                    if self.status == status::FAILED {
                        let msg = "current transaction is aborted, commands ignored until end of transaction block";
                        messages::error_response(out, Severity::Error, sqlstate::IN_FAILED_SQL_TRANSACTION, msg);
                        self.statements.entry(client).or_insert(stmt);
                    } else {
                        extended::command_complete(out, "DEALLOCATE");
                    }
                    messages::ready_for_query(out, self.status);
                    settled = self.expect.is_empty();
                }
                _ => {}
            }
        }
        settled
    }

    /// Pops what one server message answers. False when the client must not
    /// see it (the reply to weir's own Parse or Close).
    fn on_reply(&mut self, tag: u8, msg: &[u8], server: &mut ServerStatements) -> bool {
        let front = self.expect.front();
        match tag {
            be::PARSE_COMPLETE => match front {
                Some(Expect::Parse { pass, .. }) => {
                    let pass = *pass;
                    self.expect.pop_front();
                    pass
                }
                _ => true,
            },
            be::CLOSE_COMPLETE => match front {
                Some(Expect::Close { pass, .. }) => {
                    let pass = *pass;
                    self.expect.pop_front();
                    pass
                }
                _ => true,
            },
            be::BIND_COMPLETE => self.pop_if(|e| matches!(e, Expect::Bind)),
            be::COPY_IN_RESPONSE | be::COPY_BOTH_RESPONSE => {
                self.drop_ignored_syncs();
                true
            }
            be::ROW_DESCRIPTION | be::NO_DATA => self.pop_if(|e| matches!(e, Expect::Describe)),
            be::COMMAND_COMPLETE | be::EMPTY_QUERY_RESPONSE | be::PORTAL_SUSPENDED => {
                self.pop_if(|e| matches!(e, Expect::Execute))
            }
            be::ERROR_RESPONSE => {
                if !matches!(front, None | Some(Expect::Query) | Some(Expect::Sync)) {
                    self.skip_to_sync(server);
                }
                true
            }
            be::READY_FOR_QUERY => {
                if let Some(&s) = msg.get(HEADER_LEN) {
                    self.status = s;
                }
                self.pop_through_sync(server);
                true
            }
            _ => true,
        }
    }

    /// An extended-protocol Execute started COPY IN: Postgres ignores the
    /// Syncs sent after it until the client's CopyDone or CopyFail.
    fn drop_ignored_syncs(&mut self) {
        if !matches!(self.expect.front(), Some(Expect::Execute)) {
            return;
        }
        let end = self.expect.iter().position(|e| matches!(e, Expect::CopyEnd)).unwrap_or(self.expect.len());
        let mut i = 1;
        let mut end = end;
        while i < end {
            if matches!(self.expect[i], Expect::Sync) {
                self.expect.remove(i);
                end -= 1;
            } else {
                i += 1;
            }
        }
    }

    fn pop_if(&mut self, f: impl Fn(&Expect) -> bool) -> bool {
        if self.expect.front().is_some_and(f) {
            self.expect.pop_front();
        }
        true
    }

    /// The message at the head failed: it and everything up to the next
    /// Sync were not executed.
    fn skip_to_sync(&mut self, server: &mut ServerStatements) {
        while let Some(e) = self.expect.front() {
            if matches!(e, Expect::Sync) {
                break;
            }
            let e = self.expect.pop_front().expect("front exists");
            self.undo(e, server);
        }
    }

    /// A ReadyForQuery ends the Sync or Query at the head (anything before it
    /// was never answered, so it was not executed).
    fn pop_through_sync(&mut self, server: &mut ServerStatements) {
        while let Some(e) = self.expect.pop_front() {
            if matches!(e, Expect::Sync | Expect::Query) {
                return;
            }
            self.undo(e, server);
        }
    }
}
