//! Where a server connection stands in the protocol conversation, learned
//! only from message headers as bytes pass through (no row is ever decoded):
//! how many ReadyForQuery the server still owes, whether an extended-protocol
//! batch is open, the transaction status, COPY IN, and half-passed messages.

use bytes::BytesMut;

use crate::protocol::{
    messages, peek_header, sqlstate,
    tags::{backend as be, frontend as fe, status},
    ProtocolError,
};

/// Client messages at most this long are forwarded only when whole, so a
/// client that vanishes mid-message never leaves a runnable fragment behind.
/// Longer ones (huge queries, COPY rows) stream through in pieces.
pub const STREAM_THRESHOLD: usize = 64 * 1024;

/// Largest message weir accepts from a server.
pub const MAX_SERVER_MESSAGE: usize = 1 << 30;

/// The protocol state of one server connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Conversation {
    /// ReadyForQuery messages the server still owes (one per Query, Sync, FunctionCall).
    pending_rfq: u32,
    /// Extended-protocol messages were sent since the last Sync.
    in_batch: bool,
    /// The status byte of the last ReadyForQuery.
    status: u8,
    /// The server is in COPY IN and expects CopyData/CopyDone/CopyFail.
    copy_in: bool,
    /// Bytes of a client message already partly sent to the server.
    to_server_partial: usize,
    /// Bytes of a server message already partly passed to the client.
    from_server_partial: usize,
    /// Syncs sent since the last Execute (and before any CopyDone/CopyFail):
    /// if that Execute starts COPY FROM STDIN, Postgres ignores them.
    syncs_after_execute: Option<u32>,
    /// The errors the server sent since `take_errors` (bits of
    /// `sqlstate::counted_error_bit`).
    errors: u8,
}

impl Default for Conversation {
    fn default() -> Self {
        Conversation {
            pending_rfq: 0,
            in_batch: false,
            status: status::IDLE,
            copy_in: false,
            to_server_partial: 0,
            from_server_partial: 0,
            syncs_after_execute: None,
            errors: 0,
        }
    }
}

/// Whether a client may send a message of type `tag` once logged in (the
/// types Postgres's backend accepts after startup).
pub fn is_session_message(tag: u8) -> bool {
    matches!(
        tag,
        fe::QUERY
            | fe::PARSE
            | fe::BIND
            | fe::DESCRIBE
            | fe::EXECUTE
            | fe::CLOSE
            | fe::SYNC
            | fe::FLUSH
            | fe::FUNCTION_CALL
            | fe::COPY_DATA
            | fe::COPY_DONE
            | fe::COPY_FAIL
            | fe::TERMINATE
    )
}

/// What a scan of client bytes found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Outbound {
    /// Leading bytes that may be sent to the server now.
    pub forward: usize,
    /// A Terminate message starts right after `forward`.
    pub terminate: bool,
}

/// What a scan of server bytes found.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Inbound {
    /// Leading bytes that may be passed to the client now.
    pub forward: usize,
    /// The last ReadyForQuery in `forward` settled everything the server owed.
    pub settled: bool,
    /// The server sent a FATAL error; it will close.
    pub fatal: bool,
    /// The server refused a write: 25006 (read_only_sql_transaction).
    pub refused_write: bool,
}

impl Conversation {
    /// True when the server owes nothing, no batch or COPY is open and no
    /// transaction is: the connection can go back to the pool as it is.
    pub fn is_clean(&self) -> bool {
        self.is_quiet() && self.status == status::IDLE
    }

    /// True when the server owes nothing and nothing is half-sent.
    pub fn is_quiet(&self) -> bool {
        self.pending_rfq == 0
            && !self.in_batch
            && !self.copy_in
            && self.to_server_partial == 0
            && self.from_server_partial == 0
    }

    /// No client message is half sent and no COPY IN is open.
    pub fn is_whole(&self) -> bool {
        self.to_server_partial == 0 && !self.copy_in
    }

    /// The errors the server sent since the last call (bits of
    /// `sqlstate::counted_error_bit`), cleared.
    pub fn take_errors(&mut self) -> u8 {
        std::mem::take(&mut self.errors)
    }

    /// A query the server has not answered yet is running or queued there.
    pub fn query_in_flight(&self) -> bool {
        self.pending_rfq > 0 || self.in_batch || self.to_server_partial > 0
    }

    /// ReadyForQuery messages the server still owes.
    #[inline]
    pub(crate) fn owed(&self) -> u32 {
        self.pending_rfq
    }

    /// The status byte of the last ReadyForQuery.
    #[inline]
    pub(crate) fn status(&self) -> u8 {
        self.status
    }

    /// The server is in COPY IN.
    #[inline]
    pub(crate) fn copy_in(&self) -> bool {
        self.copy_in
    }

    /// Extended-protocol messages were sent since the last Sync.
    #[inline]
    pub(crate) fn in_batch(&self) -> bool {
        self.in_batch
    }

    /// The server still owes a ReadyForQuery or the rest of a message.
    pub(crate) fn owes_output(&self) -> bool {
        self.pending_rfq > 0 || self.from_server_partial > 0
    }

    /// A ReadyForQuery weir read itself (outside `scan_server`) set the
    /// transaction status to `status`.
    pub(crate) fn set_status(&mut self, status: u8) {
        self.status = status;
    }

    /// What puts the client→server stream back on a message boundary and
    /// out of any batch or COPY, without ever making a fragment runnable or
    /// committing an unsynced Execute: filler for a half-sent message,
    /// CopyFail, a failing Close before the Sync, appended to `out`
    /// and noted as sent. False (nothing written) when the half-sent rest is
    /// longer than `max_filler`: closing the connection costs less.
    pub(crate) fn finish_client_side(&mut self, out: &mut BytesMut, max_filler: usize) -> bool {
        if self.to_server_partial > max_filler {
            return false;
        }
        if self.to_server_partial > 0 {
            // Filler with no NUL byte: the half-sent string never terminates, so
            // Postgres rejects the message instead of running a fragment.
            out.resize(out.len() + self.to_server_partial, 0x01);
            self.to_server_partial = 0;
        }
        if self.copy_in {
            copy_fail(out, "client disconnected during COPY");
            self.note_client(fe::COPY_FAIL);
        }
        if self.in_batch {
            if self.syncs_after_execute == Some(0) {
                // An Execute since the last Sync: its work must not commit.
                messages::failing_close(out);
                self.note_client(fe::CLOSE);
            }
            messages::sync(out);
            self.note_client(fe::SYNC);
        }
        true
    }

    /// Walks client bytes; notes each whole message (and the head of a long
    /// one) as sent. Stops before a Terminate, which is never forwarded.
    pub fn scan_client(&mut self, buf: &[u8], max_len: usize) -> Result<Outbound, ProtocolError> {
        let mut at = self.take_partial_to_server(buf.len());
        if self.to_server_partial > 0 {
            return Ok(Outbound { forward: at, terminate: false });
        }
        while at < buf.len() {
            // Whole messages before a malformed one go first; the error is
            // returned once it leads, with nothing of it noted or sent.
            let (tag, total) = match peek_header(&buf[at..], max_len) {
                Ok(Some(h)) => h,
                Ok(None) => break,
                Err(_) if at > 0 => break,
                Err(e) => return Err(e),
            };
            if tag == fe::TERMINATE {
                return Ok(Outbound { forward: at, terminate: true });
            }
            if !is_session_message(tag) {
                // Postgres answers an unknown type with FATAL and closes the
                // connection; weir refuses it itself and keeps the server.
                if at > 0 {
                    break;
                }
                return Err(ProtocolError::UnexpectedTag(tag));
            }
            let avail = buf.len() - at;
            if avail < total {
                if total > STREAM_THRESHOLD {
                    self.note_client(tag);
                    self.to_server_partial = total - avail;
                    at = buf.len();
                }
                break;
            }
            self.note_client(tag);
            at += total;
        }
        Ok(Outbound { forward: at, terminate: false })
    }

    fn take_partial_to_server(&mut self, avail: usize) -> usize {
        let n = self.to_server_partial.min(avail);
        self.to_server_partial -= n;
        n
    }

    /// Records one client message as sent to the server.
    pub fn note_client(&mut self, tag: u8) {
        match tag {
            fe::QUERY | fe::FUNCTION_CALL => {
                self.pending_rfq += 1;
                self.syncs_after_execute = None;
            }
            // Postgres ignores Sync during COPY IN.
            fe::SYNC if self.copy_in => {}
            fe::SYNC => {
                self.pending_rfq += 1;
                self.in_batch = false;
                if let Some(n) = &mut self.syncs_after_execute {
                    *n += 1;
                }
            }
            fe::EXECUTE => {
                self.in_batch = true;
                self.syncs_after_execute = Some(0);
            }
            fe::PARSE | fe::BIND | fe::DESCRIBE | fe::CLOSE | fe::FLUSH => self.in_batch = true,
            fe::COPY_DONE | fe::COPY_FAIL => {
                self.copy_in = false;
                self.syncs_after_execute = None;
            }
            _ => {}
        }
    }

    /// Walks server bytes. Small control messages are read whole (waiting for
    /// the rest if needed); everything else streams. Stops right after a
    /// ReadyForQuery that settles what the server owed, so bytes after it stay
    /// with the connection. `on_param` sees every ParameterStatus.
    pub fn scan_server(&mut self, buf: &[u8], mut on_param: impl FnMut(&str, &str)) -> Result<Inbound, ProtocolError> {
        let mut out = Inbound::default();
        let n = self.from_server_partial.min(buf.len());
        self.from_server_partial -= n;
        let mut at = n;
        if self.from_server_partial > 0 {
            out.forward = at;
            return Ok(out);
        }
        while let Some((tag, total)) = peek_header(&buf[at..], MAX_SERVER_MESSAGE)? {
            let avail = buf.len() - at;
            let inspect = matches!(
                tag,
                be::READY_FOR_QUERY
                    | be::PARAMETER_STATUS
                    | be::ERROR_RESPONSE
                    | be::COPY_IN_RESPONSE
                    | be::COPY_BOTH_RESPONSE
            ) && total <= STREAM_THRESHOLD;
            if avail < total {
                if !inspect {
                    self.from_server_partial = total - avail;
                    at = buf.len();
                }
                break;
            }
            let msg = &buf[at..at + total];
            at += total;
            if inspect && self.note_server(tag, msg, &mut on_param, &mut out)? {
                out.settled = true;
                break;
            }
        }
        out.forward = at;
        Ok(out)
    }

    /// Notes one whole server control message; true when it settles the conversation.
    fn note_server(
        &mut self,
        tag: u8,
        msg: &[u8],
        on_param: &mut impl FnMut(&str, &str),
        out: &mut Inbound,
    ) -> Result<bool, ProtocolError> {
        let body = &msg[crate::protocol::HEADER_LEN..];
        match tag {
            be::READY_FOR_QUERY => {
                self.status = *body.first().ok_or(ProtocolError::Truncated)?;
                self.pending_rfq = self.pending_rfq.saturating_sub(1);
                self.copy_in = false;
                return Ok(self.pending_rfq == 0);
            }
            be::PARAMETER_STATUS => {
                if let Some((k, v)) = messages::parameter_status_text(body)? {
                    on_param(k, v);
                }
            }
            be::ERROR_RESPONSE => {
                out.fatal |= messages::error_is_fatal(body)?;
                let code = messages::error_code(body)?;
                out.refused_write |= code == sqlstate::READ_ONLY_SQL_TRANSACTION.code().as_bytes();
                self.errors |= sqlstate::counted_error_bit(code);
            }
            be::COPY_IN_RESPONSE | be::COPY_BOTH_RESPONSE => {
                self.copy_in = true;
                // Syncs pipelined behind an extended-protocol COPY were ignored:
                // the batch stays open until the Sync after CopyDone.
                if let Some(n) = self.syncs_after_execute.take().filter(|&n| n > 0) {
                    self.pending_rfq = self.pending_rfq.saturating_sub(n);
                    self.in_batch = true;
                }
            }
            _ => {}
        }
        Ok(false)
    }
}

fn copy_fail(buf: &mut BytesMut, why: &str) {
    use bytes::BufMut;
    buf.put_u8(fe::COPY_FAIL);
    buf.put_i32((4 + why.len() + 1) as i32);
    buf.put_slice(why.as_bytes());
    buf.put_u8(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    #[test]
    fn simple_query_round_trip_settles() {
        let mut c = Conversation::default();
        let q = msg(fe::QUERY, b"select 1\0");
        assert_eq!(c.scan_client(&q, 1 << 20).unwrap().forward, q.len());
        assert_eq!(c.pending_rfq, 1);
        let mut reply = msg(be::DATA_ROW, b"\0\x01\0\0\0\x011");
        reply.extend(msg(be::READY_FOR_QUERY, b"I"));
        reply.extend(msg(be::NOTICE_RESPONSE, b"\0"));
        let scanned = c.scan_server(&reply, |_, _| {}).unwrap();
        assert!(scanned.settled);
        assert_eq!(scanned.forward, reply.len() - 6);
        assert!(c.is_clean());
    }

    #[test]
    fn pipelined_syncs_settle_only_at_last_ready() {
        let mut c = Conversation::default();
        let mut batch = msg(fe::PARSE, b"\0select 1\0\0\0");
        batch.extend(msg(fe::SYNC, b""));
        batch.extend(msg(fe::BIND, b"\0\0\0\0\0\0\0\0"));
        batch.extend(msg(fe::SYNC, b""));
        c.scan_client(&batch, 1 << 20).unwrap();
        assert_eq!(c.pending_rfq, 2);
        let first = c.scan_server(&msg(be::READY_FOR_QUERY, b"I"), |_, _| {}).unwrap();
        assert!(!first.settled);
        let second = c.scan_server(&msg(be::READY_FOR_QUERY, b"T"), |_, _| {}).unwrap();
        assert!(second.settled);
        assert!(!c.is_clean(), "inside a transaction");
        assert!(c.is_quiet());
    }

    #[test]
    fn an_unsynced_execute_is_failed_before_the_closing_sync() {
        let mut c = Conversation::default();
        let mut batch = msg(fe::PARSE, b"\0insert into t values (1)\0\0\0");
        batch.extend(msg(fe::BIND, b"\0\0\0\0\0\0\0\0"));
        batch.extend(msg(fe::EXECUTE, b"\0\0\0\0\0"));
        c.scan_client(&batch, 1 << 20).unwrap();
        let mut out = BytesMut::new();
        assert!(c.finish_client_side(&mut out, 0));
        let mut want = BytesMut::new();
        messages::failing_close(&mut want);
        messages::sync(&mut want);
        assert_eq!(out, want, "a failing Close, then the Sync");
        assert_eq!(c.pending_rfq, 1);

        // Without an Execute there is nothing to roll back: only the Sync.
        let mut c = Conversation::default();
        c.scan_client(&msg(fe::PARSE, b"\0select 1\0\0\0"), 1 << 20).unwrap();
        let mut out = BytesMut::new();
        assert!(c.finish_client_side(&mut out, 0));
        assert_eq!(&out[..], &[fe::SYNC, 0, 0, 0, 4]);
    }

    #[test]
    fn small_partial_client_message_is_held_back() {
        let mut c = Conversation::default();
        let q = msg(fe::EXECUTE, b"portal\0\0\0\0\0");
        let out = c.scan_client(&q[..q.len() - 2], 1 << 20).unwrap();
        assert_eq!(out.forward, 0);
        assert!(c.is_clean());
    }

    #[test]
    fn long_client_message_streams_and_is_tracked() {
        let mut c = Conversation::default();
        let body = vec![b'x'; STREAM_THRESHOLD + 10];
        let q = msg(fe::QUERY, &body);
        let out = c.scan_client(&q[..1000], 1 << 30).unwrap();
        assert_eq!(out.forward, 1000);
        assert_eq!(c.to_server_partial, q.len() - 1000);
        let out = c.scan_client(&q[1000..], 1 << 30).unwrap();
        assert_eq!(out.forward, q.len() - 1000);
        assert_eq!(c.to_server_partial, 0);
    }

    #[test]
    fn syncs_pipelined_behind_an_extended_copy_are_not_owed() {
        let mut c = Conversation::default();
        let batch = [msg(fe::BIND, b"\0\0\0\0\0\0\0"), msg(fe::EXECUTE, b"\0\0\0\0\0"), msg(fe::SYNC, b"")].concat();
        c.scan_client(&batch, 1 << 20).unwrap();
        assert_eq!(c.pending_rfq, 1);
        let replies = [msg(be::BIND_COMPLETE, b""), msg(be::COPY_IN_RESPONSE, b"\0\0\0")].concat();
        c.scan_server(&replies, |_, _| {}).unwrap();
        assert_eq!((c.pending_rfq, c.copy_in, c.in_batch), (0, true, true));
        let rest =
            [msg(fe::COPY_DATA, b"1\n"), msg(fe::SYNC, b""), msg(fe::COPY_DONE, b""), msg(fe::SYNC, b"")].concat();
        c.scan_client(&rest, 1 << 20).unwrap();
        assert_eq!(c.pending_rfq, 1, "only the Sync after CopyDone is answered");
        let done = [msg(be::COMMAND_COMPLETE, b"COPY 1\0"), msg(be::READY_FOR_QUERY, b"I")].concat();
        assert!(c.scan_server(&done, |_, _| {}).unwrap().settled);
        assert!(c.is_clean());
    }

    #[test]
    fn terminate_stops_the_scan() {
        let mut c = Conversation::default();
        let mut b = msg(fe::SYNC, b"");
        b.extend(msg(fe::TERMINATE, b""));
        assert_eq!(c.scan_client(&b, 100).unwrap(), Outbound { forward: 5, terminate: true });
    }

    #[test]
    fn malformed_message_is_refused_only_once_it_leads() {
        let mut c = Conversation::default();
        let good = msg(fe::QUERY, b"select 1\0");
        for bad in [msg(b'z', b""), msg(fe::PASSWORD, b"pw\0"), b"Q\xff\xff\xff\xff".to_vec()] {
            let both = [good.clone(), bad.clone()].concat();
            let out = c.scan_client(&both, 1 << 20).unwrap();
            assert_eq!(out.forward, good.len(), "the good message goes first");
            assert_eq!(c.pending_rfq, 1);
            assert!(c.scan_client(&bad, 1 << 20).is_err());
            assert_eq!(c.pending_rfq, 1, "nothing of the bad message is noted");
            c.pending_rfq = 0;
        }
    }

    #[test]
    fn large_data_row_streams_without_buffering() {
        let mut c = Conversation { pending_rfq: 1, ..Default::default() };
        let row = msg(be::DATA_ROW, &vec![0u8; 100_000]);
        let scanned = c.scan_server(&row[..500], |_, _| {}).unwrap();
        assert_eq!(scanned.forward, 500);
        assert_eq!(c.from_server_partial, row.len() - 500);
    }

    #[test]
    fn parameter_status_and_fatal_are_seen() {
        let mut c = Conversation { pending_rfq: 1, ..Default::default() };
        let mut b = msg(be::PARAMETER_STATUS, b"TimeZone\0UTC\0");
        b.extend(msg(be::ERROR_RESPONSE, b"SFATAL\0VFATAL\0C57P01\0Mbye\0\0"));
        let mut seen = vec![];
        let scanned = c.scan_server(&b, |k, v| seen.push((k.to_owned(), v.to_owned()))).unwrap();
        assert!(scanned.fatal);
        assert_eq!(seen, vec![("TimeZone".into(), "UTC".into())]);
    }
}
