//! Protocol-level named prepared statements in transaction mode, and the
//! session features that cannot survive it. Owns one client's view:
//!
//! * the client's statements: its name → weir's statement (`weir_<hash>` of
//!   the query text and parameter types, so identical statements of
//!   different clients share one server-side statement);
//! * the outbound rewrite (`outbound.rs`): Parse/Bind/Describe/Close use
//!   weir's names; a statement missing on the current server is prepared
//!   first; evicted ones are closed; DEALLOCATE/DISCARD are followed;
//! * the queue of replies the server owes for what was sent, and the
//!   inbound filter (`inbound.rs`) that swallows replies to weir's own
//!   messages and synthesizes the ones the client expects in their place;
//! * keeping shared statements fresh: a statement weir prepared in a
//!   transaction that then rolled back (wholly or to a savepoint) may name
//!   objects that are gone, so it is made uncertain on that server (closed
//!   and prepared again before anyone uses it); DDL a client runs, and a
//!   server error that means a statement is stale (XX000, 0A000, 26000 on
//!   one of weir's statements), start a new pool-wide generation. The
//!   generation is part of weir's statement name, so a Parse from then on
//!   gets a statement of its own, prepared afresh, while a statement a
//!   client already holds keeps its server-side plan, which Postgres
//!   revalidates as it would a backend's own: a changed result type is
//!   its 0A000, not rows of a shape the client was not told (preparing it
//!   afresh did that);
//! * the client's statement namespace as a backend has it: a Parse of a
//!   name the client holds gets Postgres's own 42P05 (weir sends it to the
//!   server under the held statement's name and renames the error), a Parse
//!   in a failed transaction (or one that may be failing: a Sync or query
//!   before it is unanswered) gets the server's 25P02, for weir's statement
//!   closed and parsed again (`outcome.rs`);
//! * the client's unnamed statement (`unnamed.rs`): one whose text the
//!   client parses again (or its server already holds) is weir's statement
//!   for that text, prepared once per server; any other is remembered so
//!   that a Bind of it after the lease ends works on the next server;
//! * a Bind of a statement weir prepares first, in a failed transaction:
//!   Postgres's own refusal of its parameters (`bind_check.rs`, counted by
//!   `params.rs`), not the 25P02 weir's Parse gets; a Describe of one that
//!   returns no rows: its description, as learned (`describe.rs`);
//! * pinning: a client that used LISTEN, a session advisory lock, WITH HOLD
//!   cursors, SQL PREPARE or temporary tables keeps its server connection.
//!
//! A client that never names a statement (nor, with unnamed statements
//! shared, sends an unnamed Parse) is never tracked: its bytes pass
//! through untouched, apart from a look at the head of each query's text
//! and at message headers, which keep the reply queue (what the server
//! still owes it; a word of 4-bit kinds while untracked, `owed.rs`).
//! Tracking starts at its first named Parse, wherever that falls in a
//! pipeline: the replies weir then writes itself (ParseComplete,
//! CloseComplete, DEALLOCATE's answer) queue behind every reply still owed.
//! weir holds a client message back only where its meaning waits on the
//! server's answer to a batch before it (`outcome.rs`): a message naming a
//! statement, written past a Sync whose batch changed statements and may
//! yet fail.

mod bind_check;
mod describe;
mod inbound;
mod outbound;
mod outcome;
mod owed;
mod params;
mod sql;
#[cfg(test)]
mod tests;
mod unnamed;

#[cfg(test)]
pub use outbound::HOLD_FOR_TEST;

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use bytes::{Bytes, BytesMut};
use sha2::{Digest, Sha256};
use weir_metrics::PoolMetrics;

use crate::protocol::{extended, tags::status, HEADER_LEN};
use crate::server::statements::ServerStatements;
use crate::server::Conversation;

/// One client statement as weir prepares it on servers.
#[derive(Debug, PartialEq, Eq)]
pub struct Statement {
    /// weir's server-side name.
    pub weir: Arc<str>,
    /// The Parse message that prepares it under weir's name.
    pub parse: Bytes,
    /// Its text may change a session setting (`sql::Sql::SessionSet`): each
    /// execution has the settings read back.
    pub sets: bool,
    /// What a Describe of it gets, once seen (`describe.rs`).
    described: describe::Description,
}

impl Statement {
    /// weir's statement for a query text and raw parameter-type section,
    /// parsed in the pool's statement generation `epoch` by a client whose
    /// settings resolve names as `scope` says (`ClientStatements::scope`).
    pub fn new(query: &[u8], param_types: &[u8], epoch: u64, scope: u64) -> Statement {
        let mut h = Sha256::new();
        h.update(query);
        h.update([0u8]);
        h.update(param_types);
        h.update(epoch.to_le_bytes());
        if scope != 0 {
            h.update(scope.to_le_bytes());
        }
        let digest = h.finalize();
        let hex: String = digest[..12].iter().map(|b| format!("{b:02x}")).collect();
        let weir: Arc<str> = Arc::from(format!("weir_{hex}"));
        let mut parse = BytesMut::new();
        extended::parse(&mut parse, &weir, query, param_types);
        let sets = sql::classify(query) == sql::Sql::SessionSet;
        Statement { weir, parse: parse.freeze(), sets, described: describe::Description::new() }
    }

    /// Its query text, NUL, and parameter-type section: an unnamed Parse's
    /// body after its empty name, byte for byte, when it is the same.
    fn text(&self) -> &[u8] {
        &self.parse[HEADER_LEN + self.weir.len() + 1..]
    }
}

/// A reply (or group of replies) the server owes, or one weir owes the client.
#[derive(Debug)]
enum Expect {
    /// A Parse sent to the server. `pass`: the client sent it and gets its
    /// ParseComplete. `weir`: the server-side name it prepares. `client`:
    /// the client's statement it stands for. `refused`: weir's Parse
    /// before the client's Bind that Postgres would refuse so (`bind_check`).
    Parse {
        pass: bool,
        weir: Option<Arc<str>>,
        client: Option<(Vec<u8>, Arc<Statement>)>,
        refused: Option<bind_check::Refusal>,
    },
    /// `managed`: the client's statement it names, one of weir's.
    Bind {
        managed: Option<Arc<Statement>>,
    },
    Describe {
        managed: Option<Arc<Statement>>,
    },
    /// weir's own Describe of the client's statement (`describe.rs`).
    OwnDescribe {
        stmt: Arc<Statement>,
    },
    /// The client's Describe of a statement, answered by weir (`describe.rs`).
    FakeDescribe {
        reply: Bytes,
    },
    Execute,
    /// The client's Parse of a name it holds, sent as a Parse of that
    /// statement's weir name (`old`) so that the server answers 42P05 after
    /// checking the text as it would. `new` is the statement it asked for.
    DupParse {
        client: Vec<u8>,
        old: Arc<str>,
        new: Arc<Statement>,
    },
    /// A Close sent to the server; `evicted` names a statement weir closes.
    Close {
        pass: bool,
        evicted: Option<Arc<str>>,
    },
    Sync,
    /// A simple Query or FunctionCall: answered up to ReadyForQuery.
    Query,
    /// An unnamed Parse (or a simple query) replaced the client's unnamed
    /// statement: weir's statement `prior`, with the unnamed state `was`.
    /// No reply: popped when it reaches the head; if the message is
    /// skipped, they are the client's again.
    Unnamed {
        prior: Option<Arc<Statement>>,
        was: unnamed::Unnamed,
    },
    /// The client's Parse of a statement already on the server: weir answers.
    FakeParse {
        client: Vec<u8>,
        stmt: Arc<Statement>,
    },
    /// The client's Close of one of its statements: weir answers.
    FakeClose {
        client: Vec<u8>,
        stmt: Arc<Statement>,
    },
    /// The client's `DEALLOCATE name` of one of its statements: weir answers.
    FakeDeallocate {
        client: Vec<u8>,
        stmt: Arc<Statement>,
    },
    /// The client's CopyDone or CopyFail: no reply of its own; bounds the
    /// Syncs Postgres ignores during COPY IN.
    CopyEnd,
}

impl Expect {
    fn is_synthetic(&self) -> bool {
        matches!(
            self,
            Expect::FakeParse { .. }
                | Expect::FakeDescribe { .. }
                | Expect::FakeClose { .. }
                | Expect::FakeDeallocate { .. }
                | Expect::CopyEnd
                | Expect::Unnamed { .. }
        )
    }
}

/// What the server owes one client, in order.
#[derive(Debug, Default)]
struct Queues {
    expect: VecDeque<Expect>,
    /// The queue while the client is not tracked (`expect` is empty until
    /// then): becomes `expect`, entry for entry, when tracking starts.
    owed: owed::Owed,
    /// Unnamed statements this client parsed lately (`unnamed.rs`).
    recent: Vec<unnamed::Seen>,
    /// prepare_unnamed_after for this client (0: off).
    hot: u32,
    /// The client's unnamed statement as weir's statement, kept apart
    /// from the named ones in `ClientStatements::statements` (it changes
    /// with every unnamed Parse).
    unnamed_stmt: Option<Arc<Statement>>,
    /// What the client's unnamed statement is, besides `unnamed_stmt`
    /// (`unnamed.rs`).
    unnamed: unnamed::Unnamed,
    /// How the client's settings resolve names (`ClientStatements::scope`).
    scope: u64,
    /// A change of statements queued may yet be skipped (`outcome.rs`).
    changes: bool,
    /// The ParameterDescription of a Describe whose answer is being learned
    /// (`describe.rs`).
    parameters: Option<Bytes>,
    /// Binds of named statements not yet added to the pool's count
    /// (`publish_counts`): a plain increment per Bind, one shared add per
    /// reply batch.
    binds: u64,
}

/// `ClientStatements::lease`: a statement sent during this lease may have
/// changed a session-level setting Postgres does not report (see
/// `sql::Sql::SessionSet`).
const TOUCHED_SETTINGS: u8 = 1;
/// `ClientStatements::lease`: the client ran DDL in this lease.
const RAN_DDL: u8 = 2;
/// `ClientStatements::lease`: an extended-protocol message failed and the
/// queue held no Sync after it: the server skips what the client sends up
/// to its next Sync.
const SKIPPING: u8 = 4;

/// Marks a scope no other client shares (`private_scope`); shared ones,
/// hashed from a search_path, never have it.
const PRIVATE_SCOPE: u64 = 1 << 63;

/// A statement scope of one client alone, while its settings are unknown.
fn private_scope() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed) | PRIVATE_SCOPE
}

/// One client's prepared-statement and pinning state.
#[derive(Debug)]
pub struct ClientStatements {
    /// Transaction mode: weir looks at what the client sends.
    enabled: bool,
    /// max_prepared_statements; 0 leaves named statements alone.
    max: u32,
    /// Replies are tracked (the client used a named statement).
    tracking: bool,
    /// What this lease's statements did: `TOUCHED_SETTINGS`, `RAN_DDL`, and
    /// whether the server is `SKIPPING` to Sync (one byte for all keeps every client's task future within its budget,
    /// see `app/footprint.rs`).
    lease: u8,
    /// Why the client keeps its server connection, once it must.
    pinned: Option<&'static str>,
    /// A B-tree, not a hash map: half the size inline, and every client
    /// holds one (almost always empty).
    statements: BTreeMap<Vec<u8>, Arc<Statement>>,
    /// The reply queues, boxed: every client's task future stays within its
    /// budget (see `app/footprint.rs`).
    q: Box<Queues>,
    /// Bytes of a client message being streamed through, not yet seen.
    pass_remaining: u32,
    /// Bytes of a server message being streamed through, not yet seen.
    reply_partial: u32,
    /// Transaction status of the last ReadyForQuery the client got.
    status: u8,
    metrics: Arc<PoolMetrics>,
}

impl ClientStatements {
    /// The SQL text of the client's named statement `name`, if it holds one.
    pub fn query_text(&self, name: &[u8]) -> Option<&[u8]> {
        let text = self.statements.get(name)?.text();
        Some(&text[..memchr::memchr(0, text).unwrap_or(text.len())])
    }

    /// `enabled` is true in transaction mode; `max` is max_prepared_statements.
    pub fn new(enabled: bool, max: u32, metrics: Arc<PoolMetrics>) -> ClientStatements {
        ClientStatements {
            enabled,
            max: if enabled { max } else { 0 },
            tracking: false,
            lease: 0,
            pinned: None,
            statements: BTreeMap::new(),
            q: Box::default(),
            pass_remaining: 0,
            reply_partial: 0,
            status: status::IDLE,
            metrics,
        }
    }

    /// Why this client keeps its server connection, if it must.
    pub fn pinned(&self) -> Option<&'static str> {
        self.pinned
    }

    /// Unnamed statements this client parses `after` times are served from
    /// weir's server-side statements (0: never). Off when statements are
    /// not tracked, or when the client's session names objects differently
    /// from other clients' (its own search_path).
    pub fn prepare_unnamed_after(&mut self, after: u32) {
        self.q.hot = if self.max > 0 { after } else { 0 };
    }

    /// This client may have changed a setting: its statements may resolve
    /// names differently from other clients' from now on, so its unnamed
    /// statements are no longer shared, and its named ones are its own
    /// until its settings are known again (`resolves_names_with`).
    fn unshare_unnamed(&mut self) {
        self.q.hot = 0;
        self.q.scope = private_scope();
    }

    /// The client's settings, as weir knows them now, resolve names with
    /// `search_path` (None: the pool's default). Statements are shared
    /// with the clients whose search_path is the same; a pinned client's
    /// (SET ROLE, say) stay its own.
    pub fn resolves_names_with(&mut self, search_path: Option<&str>) {
        if self.pinned.is_some() {
            return;
        }
        self.q.scope = search_path.map_or(0, |path| {
            let digest = Sha256::digest(path.as_bytes());
            u64::from_le_bytes(digest[..8].try_into().unwrap_or_default()) & !PRIVATE_SCOPE
        });
    }

    /// Whether a statement of this lease may have changed an unreported
    /// session setting (the session then reads them back); clears it.
    pub fn take_settings_touched(&mut self) -> bool {
        self.take_lease_flag(TOUCHED_SETTINGS)
    }

    fn set_skipping(&mut self, on: bool) {
        if on {
            self.lease |= SKIPPING;
        } else {
            self.lease &= !SKIPPING;
        }
    }

    fn take_lease_flag(&mut self, flag: u8) -> bool {
        let was = self.lease & flag != 0;
        self.lease &= !flag;
        was
    }

    /// Whether weir tracks this client's statements (and may rewrite what
    /// the server sends it); when not, server bytes pass through untouched.
    pub fn is_tracking(&self) -> bool {
        self.tracking
    }

    /// A server connection was just lent to this client; `max` is the
    /// pool's max_prepared_statements now. A changed value (console SET,
    /// RELOAD) bounds the server's cache from this lease on, as in
    /// PgBouncer; 0 leaves a client that logged in before it as it was:
    /// the statements it holds keep working (PgBouncer would send their
    /// names to a server that lacks them).
    pub fn begin(&mut self, server: &mut ServerStatements, conv: &Conversation, max: u32) {
        if self.enabled && max > 0 {
            self.max = max;
        }
        server.begin_lease();
        self.q.expect.clear();
        self.q.owed.clear();
        self.q.changes = false;
        // This server's unnamed statement is not the client's.
        self.q.unnamed.lease_began();
        self.lease &= !SKIPPING;
        self.reply_partial = 0;
        self.status = conv.status();
    }

    /// The lease ends. Whatever weir sent and never saw answered (the client
    /// or server left mid-batch) leaves those statements uncertain.
    pub fn end(&mut self, server: &mut ServerStatements) {
        for e in self.q.expect.drain(..) {
            match e {
                Expect::Parse { weir: Some(w), .. } | Expect::Close { evicted: Some(w), .. } => {
                    server.mark_uncertain(w)
                }
                _ => {}
            }
        }
        // Prepared in a transaction that did not end cleanly in this lease.
        self.q.owed.clear();
        server.settle(false);
        if self.take_lease_flag(RAN_DDL) {
            // Again now that the DDL has run: a statement prepared by
            // someone else meanwhile may predate its commit.
            self.invalidate();
        }
        self.reply_partial = 0;
        self.pass_remaining = 0;
        self.publish_counts();
        server.publish();
    }

    /// Adds the Binds counted since the last call to the pool's count
    /// (SHOW STATS's total_bind_count): called as a reply batch passes to
    /// the client, so the count is there before the client has its answer.
    #[inline]
    pub fn publish_counts(&mut self) {
        if self.tracking && self.q.binds != 0 {
            self.metrics.record_binds(std::mem::take(&mut self.q.binds));
        }
    }

    /// Every shared statement of the pool may be stale: a new generation,
    /// whose Parses get statements of their own.
    fn invalidate(&mut self) {
        crate::span::client_event!(debug, "shared prepared statements may be stale: new Parses prepare afresh");
        self.metrics.invalidate_statements();
    }

    fn pin(&mut self, why: &'static str) {
        if self.pinned.is_none() {
            self.unshare_unnamed();
            crate::span::client_event!(
                info,
                reason = why,
                "client pinned to its server connection for the rest of its session"
            );
            self.metrics.record_pinned();
            self.pinned = Some(why);
        }
    }

    /// Skipped messages, in the order sent: undone last first, so that a
    /// Parse and a Close of one name leave it as it was before both.
    fn undo_all(&mut self, skipped: Vec<Expect>, server: &mut ServerStatements) {
        for e in skipped.into_iter().rev() {
            self.undo(e, server);
        }
    }

    /// A skipped or failed message: undo what weir assumed it would do.
    fn undo(&mut self, e: Expect, server: &mut ServerStatements) {
        match e {
            Expect::Parse { weir, client, .. } => {
                if let Some(w) = weir {
                    server.remove(&w);
                }
                if let Some((name, stmt)) = client {
                    self.forget_if_same(&name, &stmt);
                }
            }
            Expect::FakeParse { client, stmt } => self.forget_if_same(&client, &stmt),
            Expect::FakeClose { client, stmt } | Expect::FakeDeallocate { client, stmt } => self.keep(client, stmt),
            Expect::Close { evicted: Some(w), .. } => server.mark_uncertain(w),
            Expect::Unnamed { prior, was } => self.restore_unnamed(prior, was),
            _ => {}
        }
    }

    /// A Parse of `stmt` under `name` was not executed. An unnamed one
    /// that failed leaves no unnamed statement (Postgres drops the old one
    /// first); one that was skipped gets its old one back from the
    /// `Expect::Unnamed` before it, undone next.
    fn forget_if_same(&mut self, name: &[u8], stmt: &Arc<Statement>) {
        if name.is_empty() {
            if self.q.unnamed_stmt.as_ref().is_some_and(|s| Arc::ptr_eq(s, stmt)) {
                self.q.unnamed_stmt = None;
                self.q.unnamed = unnamed::Unnamed::Gone;
            }
        } else if self.statements.get(name).is_some_and(|s| Arc::ptr_eq(s, stmt)) {
            self.statements.remove(name);
        }
    }

    /// The client holds `stmt` under `name` again, unless it holds another.
    fn keep(&mut self, name: Vec<u8>, stmt: Arc<Statement>) {
        if name.is_empty() {
            self.q.unnamed_stmt.get_or_insert(stmt);
        } else {
            self.statements.entry(name).or_insert(stmt);
        }
    }
}

/// A copy-on-write edit of a byte region: nothing is copied until the first
/// change, then unchanged spans are copied around the changes.
#[derive(Debug, Default)]
struct Rewrite {
    out: Option<BytesMut>,
    /// Source bytes already accounted for in `out`.
    copied: usize,
    /// Room the edited copy is made with, at least (so that it can take the
    /// place of a read buffer of that capacity without growing).
    room: usize,
    /// `out` is the thread's spare buffer (`SPARE`): the first splice shrank
    /// the bytes (a Parse weir answers, dropped), so the edited bytes are
    /// likely to fit where the source bytes were, and are written back
    /// there, with no buffer of `room` made. Only where the caller returns
    /// it (`outbound`); else `out` is a copy of `room`.
    in_spare: bool,
    /// The caller returns the spare buffer (`take_spare`).
    spare_ok: bool,
}

/// The spare buffer is dropped when an edit made it larger than this.
const MAX_SPARE: usize = 1024;

thread_local! {
    /// A small buffer, one per worker thread, kept from one edit to the
    /// next (`Rewrite::in_spare`): taken and returned within one call.
    static SPARE: std::cell::Cell<BytesMut> = std::cell::Cell::new(BytesMut::new());
}

/// The thread's spare buffer, empty.
fn take_spare() -> BytesMut {
    SPARE.with(std::cell::Cell::take)
}

/// Returns the spare buffer for the next edit, unless it grew large.
fn return_spare(mut spare: BytesMut) {
    if spare.capacity() <= MAX_SPARE {
        spare.clear();
        SPARE.with(|s| s.set(spare));
    }
}

impl Rewrite {
    /// Replaces `len` source bytes at `at` (at or after earlier splices) with `with`.
    fn splice(&mut self, src: &[u8], at: usize, len: usize, with: &[u8]) {
        if self.out.is_none() && with.len() < len && self.spare_ok {
            self.out = Some(take_spare());
            self.in_spare = true;
        }
        self.splice_with(src, at, len, |out| out.extend_from_slice(with));
    }

    /// Replaces `len` source bytes at `at` with what `write` appends.
    fn splice_with(&mut self, src: &[u8], at: usize, len: usize, write: impl FnOnce(&mut BytesMut)) {
        let room = self.room.max(src.len() + 256);
        let out = self.out.get_or_insert_with(|| BytesMut::with_capacity(room));
        out.extend_from_slice(&src[self.copied..at]);
        write(out);
        self.copied = at + len;
    }
}
