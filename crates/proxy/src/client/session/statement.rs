//! The statement a queued request starts with, and the BEGIN held back
//! until it comes (transaction mode).
//!
//! A request that finds no idle server is fingerprinted
//! (`protocol::fingerprint`) before it queues, so the pool can hand servers
//! over fairly between statements and count what each does
//! (`pool::queries`). A transaction's fingerprint is its first statement
//! that is not BEGIN, SET or SAVEPOINT; so a bare `BEGIN` that would queue
//! is answered by weir as Postgres answers it (CommandComplete `BEGIN`,
//! ReadyForQuery `T`), and is sent to the server the transaction gets,
//! ahead of the next statement, which is the one that queues. Only the
//! bare forms (no isolation level or access mode) are held back: Postgres
//! cannot refuse them on an idle connection. A `COMMIT` or `ROLLBACK` that
//! follows at once is answered without a server, as Postgres answers it.
//! If the next statement gets no server, its error leaves the client in a
//! failed transaction (ReadyForQuery `E`), as it would be on Postgres, until
//! its ROLLBACK.

use std::sync::Arc;

use bytes::BytesMut;
use tokio::io::AsyncWriteExt;

use super::Session;
use crate::client::prepared::ClientStatements;
use crate::login::ClientError;
use crate::pool::QueryTag;
use crate::protocol::fingerprint::{self, Lead, Scan};
use crate::protocol::messages::{self, Severity};
use crate::protocol::tags::{frontend as fe, status};
use crate::protocol::{peek_header, sqlstate, HEADER_LEN};

/// Normalized texts are cut here for SHOW QUERIES.
const TEXT_LIMIT: usize = 200;

/// A text this long is no bare BEGIN unless it has comments.
const BARE_BEGIN_LIMIT: usize = 256;

/// Texts longer than this are lexed each time, not remembered.
const MEMO_LIMIT: usize = 4096;

/// Postgres's warning for a BEGIN inside a transaction.
const ALREADY_MESSAGE: &str = "there is already a transaction in progress";

/// The words Postgres answers a statement in a failed transaction with.
const ABORTED_MESSAGE: &str = "current transaction is aborted, commands ignored until end of transaction block";

/// A BEGIN weir answered and holds back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(super) enum Begun {
    /// None held back.
    #[default]
    No,
    /// Answered; sent to the server ahead of the next statement.
    Held,
    /// The statement after it got no server: the client is in a failed
    /// transaction until it ends it.
    Failed,
}

/// A session's statement state, boxed (rarely used: only once the pool
/// has made it queue).
#[derive(Debug, Default)]
pub(super) struct Statements {
    /// The last statement it queued with, whose text is reused when the
    /// next has the same fingerprint.
    pub(super) last: Option<QueryTag>,
    pub(super) begun: Begun,
    /// The text last lexed, and what the lexer found: a text that differs
    /// from it only in its numbers is not lexed again (`same_shape`).
    memo: Option<(Vec<u8>, Scan)>,
}

impl Session<'_> {
    /// Tags the buffered request (`Statements::last` holds the tag): the
    /// fingerprint and normalized text of its first statement that is not
    /// BEGIN, SET or SAVEPOINT (or of its first, if all are). False when it
    /// has no statement text (a FunctionCall): it queues untagged.
    pub(super) fn tag_request(&mut self) -> bool {
        let st = self.statements.get_or_insert_with(Box::default);
        let Some((scan, text)) = request_statement(&self.client_in, self.max_message, &self.prepared, &mut st.memo)
        else {
            return false;
        };
        let fp = scan.fingerprint.0;
        if st.last.as_ref().is_none_or(|l| l.fp != fp) {
            st.last = Some(QueryTag { fp, text: Arc::from(fingerprint::normalized(text, TEXT_LIMIT)) });
        }
        true
    }

    /// The buffered request is one whole simple Query, a bare BEGIN, and
    /// nothing follows it.
    pub(super) fn request_is_bare_begin(&self) -> bool {
        let Ok(Some((tag, total))) = peek_header(&self.client_in, self.max_message as usize) else { return false };
        if tag != fe::QUERY || total != self.client_in.len() {
            return false;
        }
        let text = query_text(&self.client_in[HEADER_LEN..total]);
        may_be_bare_begin(text) && fingerprint::fingerprint(text).lead == Lead::BareBegin
    }

    /// Answers a bare BEGIN as Postgres would, and holds it back (a second
    /// one, before any statement, gets Postgres's warning and changes
    /// nothing).
    pub(super) async fn hold_begin(&mut self) -> Result<bool, ClientError> {
        self.client_in.clear();
        let already = self.begun() == Begun::Held;
        self.statements.get_or_insert_with(Box::default).begun = Begun::Held;
        let mut out = BytesMut::new();
        if already {
            messages::error_response(&mut out, Severity::Warning, sqlstate::ACTIVE_SQL_TRANSACTION, ALREADY_MESSAGE);
        }
        messages::command_complete(&mut out, "BEGIN");
        messages::ready_for_query(&mut out, status::IN_TRANSACTION);
        self.client.write_all(&out).await.map_err(ClientError::Io)?;
        Ok(true)
    }

    /// What a BEGIN held back (or failed) is.
    pub(super) fn begun(&self) -> Begun {
        self.statements.as_ref().map_or(Begun::No, |s| s.begun)
    }

    pub(super) fn set_begun(&mut self, begun: Begun) {
        if let Some(s) = self.statements.as_mut() {
            s.begun = begun;
        }
    }

    /// With a BEGIN held back or failed: answers, without a server, a
    /// COMMIT or ROLLBACK that ends the transaction (and, in a failed one,
    /// any other request, with 25P02). Some(true) when it answered.
    pub(super) async fn end_without_server(&mut self) -> Result<Option<bool>, ClientError> {
        let begun = self.begun();
        let Ok(Some((tag, total))) = peek_header(&self.client_in, self.max_message as usize) else { return Ok(None) };
        let bare_end = (tag == fe::QUERY && total <= self.client_in.len())
            .then(|| fingerprint::bare_end(query_text(&self.client_in[HEADER_LEN..total])))
            .flatten();
        let mut out = BytesMut::new();
        match (begun, bare_end) {
            (Begun::No, _) | (Begun::Held, None) => return Ok(None),
            (Begun::Held, Some(done)) => messages::command_complete(&mut out, done),
            // COMMIT of a failed transaction rolls it back.
            (Begun::Failed, Some(_)) => messages::command_complete(&mut out, "ROLLBACK"),
            (Begun::Failed, None) => {
                self.refuse_request(sqlstate::IN_FAILED_SQL_TRANSACTION, ABORTED_MESSAGE).await?;
                return Ok(Some(true));
            }
        }
        bytes::Buf::advance(&mut self.client_in, total);
        messages::ready_for_query(&mut out, status::IDLE);
        self.set_begun(Begun::No);
        self.client.write_all(&out).await.map_err(ClientError::Io)?;
        Ok(Some(true))
    }

    /// The status a ReadyForQuery weir sends between transactions carries:
    /// in a transaction while a BEGIN is held back, failed once its next
    /// statement got no server.
    pub(super) fn status_between(&self) -> u8 {
        match self.begun() {
            Begun::No => status::IDLE,
            Begun::Held => status::IN_TRANSACTION,
            Begun::Failed => status::FAILED,
        }
    }

    /// Sends the held-back BEGIN on the transaction's server, before the
    /// statement that followed it. False when the server failed (the
    /// caller closes it); an error from Postgres leaves the client's
    /// transaction failed.
    pub(super) async fn send_held_begin(&mut self, conn: &mut crate::server::ServerConn) -> BeginSent {
        let limit = crate::server::exchange::SETTINGS_LIMIT;
        let ran = tokio::time::timeout(limit, crate::server::exchange::run_checked(conn, "BEGIN")).await;
        match ran {
            Ok(Ok(None)) => {
                self.set_begun(Begun::No);
                BeginSent::Ok
            }
            Ok(Ok(Some(refused))) => BeginSent::Refused(refused.message_text()),
            Ok(Err(reason)) => BeginSent::Lost(reason),
            Err(_) => BeginSent::Lost(weir_metrics::CloseReason::ServerError),
        }
    }
}

/// The first statement of the buffered request that leads a transaction:
/// what the lexer found, and its text.
fn request_statement<'b>(
    client_in: &'b [u8],
    max_message: u32,
    prepared: &'b ClientStatements,
    memo: &mut Option<(Vec<u8>, Scan)>,
) -> Option<(Scan, &'b [u8])> {
    let mut first = None;
    let mut at = 0;
    while let Ok(Some((tag, total))) = peek_header(&client_in[at..], max_message as usize) {
        let Some(msg) = client_in.get(at..at + total) else { break };
        at += total;
        let Some(text) = statement_text(tag, &msg[HEADER_LEN..], prepared) else {
            if tag == fe::SYNC {
                break;
            }
            continue;
        };
        let scan = scan_remembered(memo, text);
        if scan.lead == Lead::Statement {
            return Some((scan, text));
        }
        first.get_or_insert((scan, text));
        if tag == fe::QUERY {
            break;
        }
    }
    first
}

/// `fingerprint::fingerprint(text)`, from `memo` when the text differs
/// from the one lexed last only in its numbers.
fn scan_remembered(memo: &mut Option<(Vec<u8>, Scan)>, text: &[u8]) -> Scan {
    if let Some((last, scan)) = memo.as_ref() {
        if fingerprint::same_shape(last, text) {
            return *scan;
        }
    }
    let scan = fingerprint::fingerprint(text);
    if text.len() <= MEMO_LIMIT {
        let (last, kept) = memo.get_or_insert_with(|| (Vec::new(), scan));
        last.clear();
        last.extend_from_slice(text);
        *kept = scan;
    }
    scan
}

/// The SQL text a client message carries or names: a Query's, a Parse's,
/// or that of the statement a Bind names.
fn statement_text<'b>(tag: u8, body: &'b [u8], prepared: &'b ClientStatements) -> Option<&'b [u8]> {
    let cstr = |b: &'b [u8]| -> Option<(&'b [u8], &'b [u8])> {
        let end = memchr::memchr(0, b)?;
        Some((&b[..end], &b[end + 1..]))
    };
    match tag {
        fe::QUERY => Some(query_text(body)),
        fe::PARSE => cstr(body).and_then(|(_, rest)| cstr(rest)).map(|(text, _)| text),
        fe::BIND => {
            let (_, rest) = cstr(body)?;
            let (name, _) = cstr(rest)?;
            prepared.query_text(name)
        }
        _ => None,
    }
}

/// A Query's text: its body without the NUL that ends it (the lexer stops
/// at an earlier one, as Postgres does).
fn query_text(body: &[u8]) -> &[u8] {
    body.strip_suffix(&[0]).unwrap_or(body)
}

/// A bare BEGIN is short and starts with its keyword (or with whitespace
/// or a comment, where the lexer decides): most texts are ruled out here,
/// unlexed.
fn may_be_bare_begin(text: &[u8]) -> bool {
    let head = &text[..text.len().min(5)];
    text.len() <= BARE_BEGIN_LIMIT
        && match text.first() {
            Some(b'b' | b'B') => head.eq_ignore_ascii_case(b"begin"),
            Some(b's' | b'S') => head.eq_ignore_ascii_case(b"start"),
            Some(b'/' | b'-') => true,
            Some(c) => c.is_ascii_whitespace(),
            None => false,
        }
}

/// How sending a held-back BEGIN went.
pub(super) enum BeginSent {
    Ok,
    /// Postgres refused it, with this message.
    Refused(String),
    /// The server failed.
    Lost(weir_metrics::CloseReason),
}
