//! The client → server half: walks whole client messages (the head of long
//! ones) before they are sent, rewrites statement names to weir's, prepares
//! statements the current server lacks, closes evicted ones, answers the
//! client's own Parse/Close/DEALLOCATE of statements weir keeps, and queues
//! what the server will owe for each message sent.

use std::collections::btree_map::Entry;
use std::sync::Arc;

use bytes::{Buf, BytesMut};

use super::sql::{classify, Sql, INSPECT_LIMIT};
use super::{return_spare, ClientStatements, Expect, Rewrite, Statement, RAN_DDL, SKIPPING, TOUCHED_SETTINGS};
use crate::protocol::{
    extended::{self, TARGET_STATEMENT},
    peek_header,
    tags::{frontend as fe, status},
    ProtocolError, HEADER_LEN,
};
use crate::server::conversation::STREAM_THRESHOLD;
use crate::server::statements::ServerStatements;
use crate::server::Conversation;

/// Tests only: a simple query starting with this is held back forever (a
/// stall made on purpose, for the stall guard's test).
#[cfg(test)]
pub const HOLD_FOR_TEST: &[u8] = b"/* weir test: hold */";

/// Named Parse messages up to this size are tracked (they must fit in the
/// client buffer whole); a longer one passes through and pins the session.
pub const MAX_TRACKED_PARSE: usize = 128 * 1024;

/// What to do with the message at hand.
pub(super) enum Step {
    /// Handled whole; go on after it.
    Next,
    /// Its head was handled; the rest streams through as it comes.
    Stream,
    /// More bytes are needed (or the server must settle first).
    Wait,
    /// Tracking just started: handle the same message again, tracked.
    Again,
}

/// One message at the cursor: its tag, its bytes at hand, its full length.
pub(super) struct Msg<'a> {
    pub(super) tag: u8,
    pub(super) bytes: &'a [u8],
    pub(super) total: usize,
    pub(super) at: usize,
}

impl Msg<'_> {
    pub(super) fn whole(&self) -> bool {
        self.bytes.len() >= self.total
    }

    pub(super) fn body(&self) -> &[u8] {
        &self.bytes[HEADER_LEN..]
    }

    /// Enough of a long message's head to classify its query text.
    pub(super) fn head_ready(&self) -> bool {
        self.whole() || self.bytes.len() >= HEADER_LEN + INSPECT_LIMIT + 256
    }
}

impl ClientStatements {
    /// Rewrites the client messages at the front of `client_in` for the server
    /// this client holds and returns how many leading bytes are ready to send
    /// (all of them are sent before the next call).
    ///
    /// Kept out of line, with `tracked` inside it: the per-message dispatch
    /// then costs no call (measured with `bench/callgrind.sh`).
    #[inline(never)]
    pub fn outbound(
        &mut self,
        client_in: &mut BytesMut,
        conv: &Conversation,
        server: &mut ServerStatements,
        max_message: usize,
    ) -> Result<usize, ProtocolError> {
        if !self.enabled {
            return Ok(client_in.len());
        }
        let src: &[u8] = client_in;
        let mut at = (self.pass_remaining as usize).min(src.len());
        self.pass_remaining -= at as u32;
        if self.pass_remaining > 0 {
            return Ok(src.len());
        }
        let mut rw = Rewrite { room: client_in.capacity(), spare_ok: true, ..Rewrite::default() };
        // Untracked, `expect` is empty and `owed` becomes it, entry for entry.
        let queued = if self.tracking { self.q.expect.len() } else { self.q.owed.len() };
        // Whether the server is in COPY IN when the message at hand reaches it.
        let mut copy_in = conv.copy_in();
        while let Some((tag, total)) = peek_header(&src[at..], max_message)? {
            let avail = src.len() - at;
            let m = Msg { tag, bytes: &src[at..at + avail.min(total)], total, at };
            if !m.whole() && total <= STREAM_THRESHOLD {
                break;
            }
            #[cfg(test)]
            if tag == fe::QUERY && m.body().starts_with(HOLD_FOR_TEST) {
                // Fault injection for the stall guard's test: held forever.
                break;
            }
            let step = if self.tracking {
                self.tracked(&m, src, &mut copy_in, server, &mut rw)?
            } else {
                self.untracked(&m, &mut copy_in, conv, server)?
            };
            match step {
                Step::Wait => break,
                Step::Again => continue,
                Step::Stream => {
                    // A message length is an i32: the rest fits.
                    self.pass_remaining = (total - avail) as u32;
                    at = src.len();
                    break;
                }
                Step::Next if tag == fe::TERMINATE => {
                    at += total;
                    break;
                }
                Step::Next => at += total,
            }
        }
        if self.lease & SKIPPING != 0 {
            if self.tracking {
                self.skipped(queued, server);
            } else {
                let on = self.q.owed.skipped(queued);
                self.set_skipping(on);
            }
        }
        Ok(finish(client_in, rw, at))
    }

    /// The server skips what was just queued, up to the next Sync: an
    /// error came back before it was sent. What weir assumed of it is
    /// undone and nothing is owed for it (no ParseComplete or CloseComplete
    /// of weir's either: Postgres would send none).
    fn skipped(&mut self, from: usize, server: &mut ServerStatements) {
        let end = self.q.expect.iter().skip(from).position(|e| matches!(e, Expect::Sync)).map(|i| from + i);
        let skipped: Vec<Expect> = self.q.expect.drain(from..end.unwrap_or(self.q.expect.len())).collect();
        self.undo_all(skipped, server);
        self.set_skipping(end.is_none());
    }

    /// A client not (yet) tracked: only look at query text, and queue what
    /// the server owes for it; start tracking when it names a statement.
    fn untracked(
        &mut self,
        m: &Msg<'_>,
        copy_in: &mut bool,
        conv: &Conversation,
        server: &mut ServerStatements,
    ) -> Result<Step, ProtocolError> {
        let text = match m.tag {
            fe::QUERY if m.head_ready() => m.body(),
            fe::PARSE if m.head_ready() => {
                let name = extended::parse_name(m.body())?;
                if (!name.is_empty() || self.q.hot > 0) && self.max > 0 {
                    return Ok(self.start_tracking(conv));
                }
                let text = &m.body()[name.len() + 1..];
                self.named_set(name, text);
                text
            }
            fe::QUERY | fe::PARSE => return Ok(Step::Wait),
            _ => return Ok(self.passed(m, copy_in)),
        };
        match classify(text) {
            Sql::Pins(why) => self.pin(why),
            Sql::DropsAll => {
                self.lease |= TOUCHED_SETTINGS;
                self.unshare_unnamed();
                server.mark_all_uncertain();
            }
            Sql::Ddl => self.saw_ddl(),
            Sql::SessionSet => {
                self.lease |= TOUCHED_SETTINGS;
                self.unshare_unnamed();
            }
            Sql::Other | Sql::Deallocate(_) => {}
        }
        Ok(self.passed(m, copy_in))
    }

    /// A message passed on untouched by an untracked client: what the server
    /// owes for it is queued (and popped as its replies pass, `observe`),
    /// so that tracking can start at any message, mid-pipeline included,
    /// with every reply still owed ahead of the ones weir will write.
    fn passed(&mut self, m: &Msg<'_>, copy_in: &mut bool) -> Step {
        if self.max > 0 {
            if !self.tracking {
                self.q.owed.sent(m.tag, copy_in);
            } else if let Some(e) = owed_for(m.tag, copy_in) {
                self.q.expect.push_back(e);
            }
        }
        next_or_stream(m)
    }

    /// Tracking starts at the named Parse at hand: everything before it was
    /// passed on untouched and is in the reply queue, so nothing is held
    /// back waiting for the server.
    fn start_tracking(&mut self, conv: &Conversation) -> Step {
        crate::span::client_event!(debug, "tracking prepared statements for this client");
        self.tracking = true;
        self.q.owed.materialise(&mut self.q.expect);
        if self.q.expect.is_empty() {
            self.status = conv.status();
        }
        Step::Again
    }

    #[inline(always)]
    fn tracked(
        &mut self,
        m: &Msg<'_>,
        src: &[u8],
        copy_in: &mut bool,
        server: &mut ServerStatements,
        rw: &mut Rewrite,
    ) -> Result<Step, ProtocolError> {
        match m.tag {
            fe::PARSE | fe::BIND | fe::DESCRIBE | fe::CLOSE | fe::QUERY if self.q.changes && self.awaits_outcome() => {
                Ok(Step::Wait)
            }
            fe::PARSE => self.on_parse(m, src, server, rw),
            fe::BIND => self.on_bind(m, src, server, rw),
            fe::DESCRIBE => self.on_describe(m, src, server, rw),
            fe::CLOSE => self.on_close(m, src, rw),
            fe::QUERY => self.on_query(m, src, server, rw),
            _ => Ok(self.passed(m, copy_in)),
        }
    }

    fn on_parse(
        &mut self,
        m: &Msg<'_>,
        src: &[u8],
        server: &mut ServerStatements,
        rw: &mut Rewrite,
    ) -> Result<Step, ProtocolError> {
        let name = extended::parse_name(m.body())?;
        if name.is_empty() && self.max > 0 {
            return self.on_unnamed_parse(m, src, server, rw);
        }
        if name.is_empty() || self.max == 0 {
            if !m.head_ready() {
                return Ok(Step::Wait);
            }
            self.named_set(name, &m.body()[name.len() + 1..]);
            self.look_at(&m.body()[name.len() + 1..], server);
            self.q.expect.push_back(Expect::Parse { pass: true, weir: None, client: None, refused: None });
            return Ok(next_or_stream(m));
        }
        if !m.whole() {
            if m.total <= MAX_TRACKED_PARSE {
                return Ok(Step::Wait);
            }
            self.pin("prepared statement text over 128 KiB");
            self.q.expect.push_back(Expect::Parse { pass: true, weir: None, client: None, refused: None });
            return Ok(Step::Stream);
        }
        let Ok(p) = extended::read_parse(m.body()) else {
            self.q.expect.push_back(Expect::Parse { pass: true, weir: None, client: None, refused: None });
            return Ok(Step::Next);
        };
        self.look_at(p.query, server);
        self.metrics.record_client_parse();
        let stmt = Arc::new(Statement::new(p.query, p.param_types, self.metrics.statements_epoch(), self.q.scope));
        // One look-up, and the same two copies of the name as ever.
        let name = match self.statements.entry(p.name.to_vec()) {
            Entry::Occupied(held) => {
                let old = held.get().clone();
                let out = self.duplicate(&p, old, stmt, server);
                rw.splice(src, m.at, m.total, &out);
                return Ok(Step::Next);
            }
            Entry::Vacant(free) => {
                let name = free.key().clone();
                free.insert(stmt.clone());
                name
            }
        };
        if server.hold(&stmt.weir) {
            if self.status == status::FAILED || self.outcome_pending() {
                let out = self.parse_again(&stmt, name, server);
                rw.splice(src, m.at, m.total, &out);
                return Ok(Step::Next);
            }
            let mut own = BytesMut::new();
            self.expect_change(Expect::FakeParse { client: name, stmt: stmt.clone() });
            self.describe_own(&stmt, m, src, p.name, &mut own);
            rw.splice(src, m.at, m.total, &own);
            return Ok(Step::Next);
        }
        let mut parse = self.server_parse(&stmt, server, Some((name, stmt.clone())));
        self.describe_own(&stmt, m, src, p.name, &mut parse);
        rw.splice(src, m.at, m.total, &parse);
        Ok(Step::Next)
    }

    /// A Parse of a name the client holds: Postgres checks the text (in a
    /// failed transaction, whether it may run there), then answers 42P05.
    /// The server does both for the held statement's weir name; the error
    /// is renamed on its way back, and the client keeps its statement.
    fn duplicate(
        &mut self,
        p: &extended::ParseRef<'_>,
        old: Arc<Statement>,
        new: Arc<Statement>,
        server: &mut ServerStatements,
    ) -> BytesMut {
        // PgBouncer's words; it closes the client here, weir answers as
        // Postgres does and the client keeps its connection.
        tracing::warn!("prepared statement '{}' was already prepared", String::from_utf8_lossy(p.name));
        let mut out = match server.hold(&old.weir) {
            true => BytesMut::new(),
            false => self.stand_in(&old.weir, server),
        };
        extended::parse(&mut out, &old.weir, p.query, p.param_types);
        self.expect_change(Expect::DupParse { client: p.name.to_vec(), old: old.weir.clone(), new });
        out
    }

    fn on_bind(
        &mut self,
        m: &Msg<'_>,
        src: &[u8],
        server: &mut ServerStatements,
        rw: &mut Rewrite,
    ) -> Result<Step, ProtocolError> {
        let Some(head) = extended::read_bind_head(m.bytes)? else {
            return Ok(if m.whole() { self.pass(m, Expect::Bind { managed: None }) } else { Step::Wait });
        };
        // PgBouncer's bind count: every Bind naming a statement.
        self.q.binds += u64::from(!head.statement.is_empty());
        let Some(stmt) = self.managed(head.statement) else {
            self.close_if_gone(head.statement, src, m.at, rw);
            return Ok(self.pass(m, Expect::Bind { managed: None }));
        };
        if stmt.sets {
            self.lease |= TOUCHED_SETTINGS;
            self.unshare_unnamed();
        }
        if !server.hold(&stmt.weir) {
            self.prepare_for_bind(&stmt, m, head.rest_at, src, server, rw);
        }
        rw.splice_with(src, m.at, head.rest_at, |out| extended::bind_head(out, m.total, &head, &stmt.weir));
        Ok(self.pass(m, Expect::Bind { managed: Some(stmt) }))
    }

    fn on_describe(
        &mut self,
        m: &Msg<'_>,
        src: &[u8],
        server: &mut ServerStatements,
        rw: &mut Rewrite,
    ) -> Result<Step, ProtocolError> {
        let stmt = match extended::read_target(m.body()) {
            Ok((TARGET_STATEMENT, name)) => {
                let stmt = self.managed(name);
                if stmt.is_none() {
                    self.close_if_gone(name, src, m.at, rw);
                }
                stmt
            }
            _ => None,
        };
        if let Some(stmt) = &stmt {
            if !server.contains(&stmt.weir) {
                if let Some(step) = self.describe_unprepared(stmt, m, src, rw) {
                    return Ok(step);
                }
            }
            self.ensure(stmt, src, m.at, server, rw);
            rw.splice_with(src, m.at, m.total, |out| extended::target(out, fe::DESCRIBE, TARGET_STATEMENT, &stmt.weir));
        }
        Ok(self.pass(m, Expect::Describe { managed: stmt }))
    }

    fn on_close(&mut self, m: &Msg<'_>, src: &[u8], rw: &mut Rewrite) -> Result<Step, ProtocolError> {
        if let Ok((TARGET_STATEMENT, name)) = extended::read_target(m.body()) {
            if name.is_empty() {
                // Postgres drops it; weir's statement, or the server's own,
                // whose Close answers.
                let stmt = self.managed(name);
                self.drop_unnamed();
                if let Some(stmt) = stmt {
                    rw.splice(src, m.at, m.total, &[]);
                    self.expect_change(Expect::FakeClose { client: name.to_vec(), stmt });
                    return Ok(Step::Next);
                }
            } else if let Some(stmt) = self.statements.remove(name) {
                // The server-side statement stays: other clients may share it.
                rw.splice(src, m.at, m.total, &[]);
                self.expect_change(Expect::FakeClose { client: name.to_vec(), stmt });
                return Ok(Step::Next);
            }
        }
        Ok(self.pass(m, Expect::Close { pass: true, evicted: None }))
    }

    fn on_query(
        &mut self,
        m: &Msg<'_>,
        src: &[u8],
        server: &mut ServerStatements,
        rw: &mut Rewrite,
    ) -> Result<Step, ProtocolError> {
        if !m.head_ready() {
            return Ok(Step::Wait);
        }
        // A simple query drops the unnamed statement.
        self.drop_unnamed();
        if let (true, Sql::Deallocate(name)) = (m.whole(), classify(m.body())) {
            if let Some(stmt) = self.statements.remove(&name) {
                rw.splice(src, m.at, m.total, self.flush_first());
                self.expect_change(Expect::FakeDeallocate { client: name, stmt });
                return Ok(Step::Next);
            }
        }
        self.look_at(m.body(), server);
        Ok(self.pass(m, Expect::Query))
    }

    /// Acts on what a tracked query's text means for pooling.
    pub(super) fn look_at(&mut self, text: &[u8], server: &mut ServerStatements) {
        match classify(text) {
            Sql::Pins(why) => self.pin(why),
            Sql::DropsAll => {
                self.lease |= TOUCHED_SETTINGS;
                self.unshare_unnamed();
                self.statements.clear();
                self.q.unnamed_stmt = None;
                server.mark_all_uncertain();
            }
            Sql::Ddl => self.saw_ddl(),
            Sql::SessionSet => {
                self.lease |= TOUCHED_SETTINGS;
                self.unshare_unnamed();
            }
            _ => {}
        }
    }

    /// DDL may leave shared statements stale: a new generation now, and
    /// another when the lease ends (after the DDL has run).
    fn saw_ddl(&mut self) {
        self.lease |= RAN_DDL;
        self.invalidate();
    }

    /// A named statement weir does not track (max_prepared_statements = 0)
    /// that may change a setting: its executions cannot be seen, so pin.
    fn named_set(&mut self, name: &[u8], text: &[u8]) {
        if !name.is_empty() && classify(text) == Sql::SessionSet {
            self.pin("SET in a named statement weir does not track");
        }
    }

    fn pass(&mut self, m: &Msg<'_>, e: Expect) -> Step {
        self.q.expect.push_back(e);
        next_or_stream(m)
    }

    /// Makes sure `stmt` is prepared on the server before the message at `at`.
    fn ensure(
        &mut self,
        stmt: &Arc<Statement>,
        src: &[u8],
        at: usize,
        server: &mut ServerStatements,
        rw: &mut Rewrite,
    ) {
        if let Some(parse) = self.prepare_if_missing(stmt, server) {
            rw.splice(src, at, 0, &parse);
        }
    }

    /// The messages that prepare `stmt` if the server lacks it.
    fn prepare_if_missing(&mut self, stmt: &Arc<Statement>, server: &mut ServerStatements) -> Option<BytesMut> {
        if server.hold(&stmt.weir) {
            return None;
        }
        Some(self.server_parse(stmt, server, None))
    }

    /// The messages that prepare `stmt` on the server: closes first (see
    /// `prelude`), then its Parse, answered to the client only when it is the
    /// client's own (`client`).
    pub(super) fn server_parse(
        &mut self,
        stmt: &Arc<Statement>,
        server: &mut ServerStatements,
        client: Option<(Vec<u8>, Arc<Statement>)>,
    ) -> BytesMut {
        let mut out = BytesMut::new();
        self.prelude(&stmt.weir, server, &mut out);
        out.extend_from_slice(&stmt.parse);
        self.metrics.record_server_parse();
        let pass = client.is_some();
        server.add_provisional(stmt.weir.clone());
        self.expect_change(Expect::Parse { pass, weir: Some(stmt.weir.clone()), client, refused: None });
        out
    }

    /// Closes what must go before `weir` is prepared: the same name if it may
    /// linger, and whatever the cache evicts to make room.
    fn prelude(&mut self, weir: &Arc<str>, server: &mut ServerStatements, pre: &mut BytesMut) {
        if server.take_uncertain(weir) {
            extended::target(pre, fe::CLOSE, TARGET_STATEMENT, weir);
            // Uncertain again if this Close is skipped or never answered.
            self.expect_change(Expect::Close { pass: false, evicted: Some(weir.clone()) });
        }
        let evicted = server.insert(weir.clone(), self.max as usize);
        if !evicted.is_empty() {
            self.metrics.record_evictions(evicted.len() as u64);
        }
        for old in evicted {
            extended::target(pre, fe::CLOSE, TARGET_STATEMENT, &old);
            self.expect_change(Expect::Close { pass: false, evicted: Some(old) });
        }
    }
}

/// Puts the edited bytes in `client_in`; returns how many leading bytes
/// are ready to send (`at` of the source's, as edited).
fn finish(client_in: &mut BytesMut, mut rw: Rewrite, at: usize) -> usize {
    let Some(out) = rw.out.take() else { return at };
    if let Some(start) = rw.copied.checked_sub(out.len()) {
        // The edited bytes fit in the span of source bytes they stand
        // for (a Parse weir answers was dropped): written over its end,
        // and the buffer starts there; the bytes after stay in place.
        client_in[start..rw.copied].copy_from_slice(&out);
        client_in.advance(start);
        if rw.in_spare {
            return_spare(out);
        }
        return at - start;
    }
    let mut out = if rw.in_spare {
        let mut copy = BytesMut::with_capacity(rw.room.max(out.len() + (client_in.len() - rw.copied)));
        copy.extend_from_slice(&out);
        return_spare(out);
        copy
    } else {
        out
    };
    let ready = out.len() + (at - rw.copied);
    out.extend_from_slice(&client_in[rw.copied..]);
    if out.capacity() < client_in.capacity() {
        out.reserve(client_in.capacity() - out.len());
    }
    *client_in = out;
    ready
}

/// What the server owes for a client message passed on as it is (None:
/// nothing, or nothing weir needs to follow).
fn owed_for(tag: u8, copy_in: &mut bool) -> Option<Expect> {
    Some(match tag {
        fe::PARSE => Expect::Parse { pass: true, weir: None, client: None, refused: None },
        fe::BIND => Expect::Bind { managed: None },
        fe::DESCRIBE => Expect::Describe { managed: None },
        fe::CLOSE => Expect::Close { pass: true, evicted: None },
        fe::EXECUTE => Expect::Execute,
        fe::QUERY | fe::FUNCTION_CALL => Expect::Query,
        // Postgres ignores Sync during COPY IN.
        fe::SYNC if *copy_in => return None,
        fe::SYNC => Expect::Sync,
        fe::COPY_DONE | fe::COPY_FAIL => {
            *copy_in = false;
            Expect::CopyEnd
        }
        _ => return None,
    })
}

pub(super) fn next_or_stream(m: &Msg<'_>) -> Step {
    if m.whole() {
        Step::Next
    } else {
        Step::Stream
    }
}
