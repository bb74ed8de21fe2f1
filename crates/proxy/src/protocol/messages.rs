//! Builders for the few backend messages weir writes itself, and readers for
//! the few fields weir needs out of server messages. No I/O.

use std::fmt::Write;

use bytes::{BufMut, BytesMut};

use super::{frame::read_cbytes, sqlstate::SqlState, tags::backend as tag, ProtocolError};

/// Starts a tagged message; `finish` fills in its length.
pub(crate) fn begin(buf: &mut BytesMut, t: u8) -> usize {
    buf.put_u8(t);
    let at = buf.len();
    buf.put_i32(0);
    at
}

pub(crate) fn finish(buf: &mut BytesMut, at: usize) {
    let len = (buf.len() - at) as i32;
    buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

/// Severity of an ErrorResponse or NoticeResponse.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Severity {
    Error,
    Fatal,
    Notice,
    Warning,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Error => "ERROR",
            Severity::Fatal => "FATAL",
            Severity::Notice => "NOTICE",
            Severity::Warning => "WARNING",
        }
    }
}

/// Appends an ErrorResponse (or a NoticeResponse for notice severities).
pub fn error_response(buf: &mut BytesMut, severity: Severity, code: SqlState, message: &str) {
    error_response_detail(buf, severity, code, message, None);
}

/// `error_response` with a DETAIL field, if `detail` is given.
pub fn error_response_detail(
    buf: &mut BytesMut,
    severity: Severity,
    code: SqlState,
    message: &str,
    detail: Option<&str>,
) {
    let t = match severity {
        Severity::Error | Severity::Fatal => tag::ERROR_RESPONSE,
        Severity::Notice | Severity::Warning => tag::NOTICE_RESPONSE,
    };
    let at = begin(buf, t);
    let fields = [(b'S', severity.as_str()), (b'V', severity.as_str()), (b'C', code.code()), (b'M', message)];
    for (field, value) in fields.into_iter().chain(detail.map(|d| (b'D', d))) {
        buf.put_u8(field);
        buf.put_slice(value.as_bytes());
        buf.put_u8(0);
    }
    buf.put_u8(0);
    finish(buf, at);
}

/// ReadyForQuery, idle (outside a transaction).
pub const READY_IDLE: [u8; 6] = [tag::READY_FOR_QUERY, 0, 0, 0, 5, super::tags::status::IDLE];

/// CommandComplete with its command tag (`BEGIN`, `COMMIT`, …).
pub fn command_complete(buf: &mut BytesMut, command: &str) {
    let at = begin(buf, tag::COMMAND_COMPLETE);
    buf.put_slice(command.as_bytes());
    buf.put_u8(0);
    finish(buf, at);
}

pub fn ready_for_query(buf: &mut BytesMut, status: u8) {
    buf.put_slice(&ready(status));
}

/// ReadyForQuery with `status`, as bytes.
pub const fn ready(status: u8) -> [u8; 6] {
    [tag::READY_FOR_QUERY, 0, 0, 0, 5, status]
}

pub fn authentication(buf: &mut BytesMut, code: i32, payload: &[u8]) {
    let at = begin(buf, tag::AUTHENTICATION);
    buf.put_i32(code);
    buf.put_slice(payload);
    finish(buf, at);
}

pub fn parameter_status(buf: &mut BytesMut, name: &str, value: &str) {
    let at = begin(buf, tag::PARAMETER_STATUS);
    buf.put_slice(name.as_bytes());
    buf.put_u8(0);
    buf.put_slice(value.as_bytes());
    buf.put_u8(0);
    finish(buf, at);
}

pub fn backend_key_data(buf: &mut BytesMut, pid: i32, secret: i32) {
    backend_key(buf, pid, &secret.to_be_bytes());
}

/// BackendKeyData with a key of any length (4 bytes in 3.0, longer in 3.2).
pub fn backend_key(buf: &mut BytesMut, pid: i32, key: &[u8]) {
    let at = begin(buf, tag::BACKEND_KEY_DATA);
    buf.put_i32(pid);
    buf.put_slice(key);
    finish(buf, at);
}

/// NegotiateProtocolVersion: `version` is a whole protocol version number,
/// `(3 << 16) | minor`, as Postgres writes it (196608 for 3.0).
pub fn negotiate_protocol_version(buf: &mut BytesMut, version: i32, unknown_options: &[&str]) {
    let at = begin(buf, tag::NEGOTIATE_PROTOCOL_VERSION);
    buf.put_i32(version);
    buf.put_i32(unknown_options.len() as i32);
    for o in unknown_options {
        buf.put_slice(o.as_bytes());
        buf.put_u8(0);
    }
    finish(buf, at);
}

/// A frontend Query message (weir's own, for resets and checks).
pub fn query(buf: &mut BytesMut, sql: &str) {
    let at = begin(buf, super::tags::frontend::QUERY);
    buf.put_slice(sql.as_bytes());
    buf.put_u8(0);
    finish(buf, at);
}

/// A frontend Sync message.
pub fn sync(buf: &mut BytesMut) {
    buf.put_slice(&[super::tags::frontend::SYNC, 0, 0, 0, 4]);
}

/// A frontend Close of a kind that does not exist: Postgres answers it with
/// an ERROR (08P01, "invalid CLOSE message subtype"), and the next Sync then
/// rolls back what the batch did instead of committing it. weir sends it to
/// end a batch whose client left before its Sync, as Postgres, reading that
/// client's Terminate or end of input, would roll it back.
pub fn failing_close(buf: &mut BytesMut) {
    buf.put_slice(&[super::tags::frontend::CLOSE, 0, 0, 0, 6, INVALID_CLOSE_KIND, 0]);
}

/// The kind byte of `failing_close`: neither 'S' (statement) nor 'P' (portal).
const INVALID_CLOSE_KIND: u8 = b'X';

/// A frontend Terminate message.
pub fn terminate(buf: &mut BytesMut) {
    buf.put_slice(&[super::tags::frontend::TERMINATE, 0, 0, 0, 4]);
}

/// An untagged CancelRequest packet with a key of any length (3.2's are longer than 4 bytes).
pub fn cancel_request_with_key(pid: i32, key: &[u8]) -> Vec<u8> {
    let mut p = Vec::with_capacity(12 + key.len());
    p.extend_from_slice(&((12 + key.len()) as i32).to_be_bytes());
    p.extend_from_slice(&super::tags::startup::CANCEL_REQUEST.to_be_bytes());
    p.extend_from_slice(&pid.to_be_bytes());
    p.extend_from_slice(key);
    p
}

/// An untagged CancelRequest packet.
pub fn cancel_request(pid: i32, secret: i32) -> [u8; 16] {
    let mut p = [0u8; 16];
    p[..4].copy_from_slice(&16i32.to_be_bytes());
    p[4..8].copy_from_slice(&super::tags::startup::CANCEL_REQUEST.to_be_bytes());
    p[8..12].copy_from_slice(&pid.to_be_bytes());
    p[12..16].copy_from_slice(&secret.to_be_bytes());
    p
}

/// An untagged StartupMessage: `version` is `(major << 16) | minor`
/// (`tags::startup::PROTOCOL_3_0` for 3.0), then name/value pairs.
pub fn startup_message(buf: &mut BytesMut, version: i32, params: &[(&str, &str)]) {
    let at = buf.len();
    buf.put_i32(0);
    buf.put_i32(version);
    for (name, value) in params {
        buf.put_slice(name.as_bytes());
        buf.put_u8(0);
        buf.put_slice(value.as_bytes());
        buf.put_u8(0);
    }
    buf.put_u8(0);
    let len = (buf.len() - at) as i32;
    buf[at..at + 4].copy_from_slice(&len.to_be_bytes());
}

/// An untagged SSLRequest or GSSENCRequest (`code` from `tags::startup`).
pub fn encryption_request(code: i32) -> [u8; 8] {
    let mut p = [0u8; 8];
    p[..4].copy_from_slice(&8i32.to_be_bytes());
    p[4..].copy_from_slice(&code.to_be_bytes());
    p
}

/// Fields of an ErrorResponse or NoticeResponse body that weir cares about.
/// Postgres writes them in the client's encoding, whatever that is: the
/// severity (`V`, never translated) and the SQLSTATE are ASCII; the message
/// is opaque bytes.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorFields {
    pub severity: String,
    /// Empty when the server sent no SQLSTATE (a broken server may omit it).
    pub code: String,
    pub message: Vec<u8>,
}

impl ErrorFields {
    /// The message as text weir can put in its own ErrorResponse or a log:
    /// unchanged when it is UTF-8, else ASCII with other bytes as `\xNN`, so
    /// that it is valid in any client encoding.
    pub fn message_text(&self) -> String {
        text_or_escaped(&self.message)
    }
}

/// `bytes` as UTF-8 when they are; else printable ASCII kept and every other
/// byte written `\xNN`.
pub fn text_or_escaped(bytes: &[u8]) -> String {
    match std::str::from_utf8(bytes) {
        Ok(s) => s.to_owned(),
        Err(_) => {
            let mut out = String::with_capacity(bytes.len() + 8);
            for &b in bytes {
                if b.is_ascii() && !b.is_ascii_control() {
                    out.push(char::from(b));
                } else {
                    let _ = write!(out, "\\x{b:02x}");
                }
            }
            out
        }
    }
}

/// Reads an ErrorResponse/NoticeResponse body (after the header).
pub fn parse_error_fields(mut body: &[u8]) -> Result<ErrorFields, ProtocolError> {
    let mut f = ErrorFields::default();
    loop {
        let Some((&field, rest)) = body.split_first() else { return Err(ProtocolError::Truncated) };
        body = rest;
        if field == 0 {
            return Ok(f);
        }
        let value = read_cbytes(&mut body)?;
        let ascii = || String::from_utf8_lossy(value).into_owned();
        match field {
            b'V' => f.severity = ascii(),
            b'S' if f.severity.is_empty() => f.severity = ascii(),
            b'C' => f.code = ascii(),
            b'M' => f.message = value.to_owned(),
            _ => {}
        }
    }
}

/// Whether an ErrorResponse body is FATAL or PANIC (the server is ending the
/// session). Reads only the severity fields, as bytes.
pub fn error_is_fatal(mut body: &[u8]) -> Result<bool, ProtocolError> {
    let mut severity: &[u8] = b"";
    loop {
        let Some((&field, rest)) = body.split_first() else { return Err(ProtocolError::Truncated) };
        body = rest;
        if field == 0 {
            return Ok(severity == b"FATAL" || severity == b"PANIC");
        }
        let value = read_cbytes(&mut body)?;
        if field == b'V' || (field == b'S' && severity.is_empty()) {
            severity = value;
        }
    }
}

/// The SQLSTATE of an ErrorResponse body, as the server's bytes.
pub fn error_code(mut body: &[u8]) -> Result<&[u8], ProtocolError> {
    loop {
        let Some((&field, rest)) = body.split_first() else { return Err(ProtocolError::Truncated) };
        body = rest;
        if field == 0 {
            return Ok(b"");
        }
        let value = read_cbytes(&mut body)?;
        if field == b'C' {
            return Ok(value);
        }
    }
}

/// Reads a ParameterStatus body into (name, value), as the server's bytes.
pub fn parse_parameter_status(mut body: &[u8]) -> Result<(&[u8], &[u8]), ProtocolError> {
    let name = read_cbytes(&mut body)?;
    let value = read_cbytes(&mut body)?;
    Ok((name, value))
}

/// A ParameterStatus as text, for weir's parameter maps (which build SQL):
/// `None` when the name or value is not UTF-8 (a value in a client encoding
/// such as LATIN1; it is forwarded untouched but not tracked).
pub fn parameter_status_text(body: &[u8]) -> Result<Option<(&str, &str)>, ProtocolError> {
    let (name, value) = parse_parameter_status(body)?;
    Ok(std::str::from_utf8(name).ok().zip(std::str::from_utf8(value).ok()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::sqlstate;

    #[test]
    fn error_response_round_trips() {
        let mut buf = BytesMut::new();
        error_response(&mut buf, Severity::Fatal, sqlstate::INVALID_PASSWORD, "nope");
        assert_eq!(buf[0], tag::ERROR_RESPONSE);
        let len = i32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
        assert_eq!(len + 1, buf.len());
        let f = parse_error_fields(&buf[5..]).unwrap();
        assert_eq!((f.severity.as_str(), f.code.as_str(), &f.message[..]), ("FATAL", "28P01", &b"nope"[..]));
    }

    #[test]
    fn startup_message_parses_back() {
        use crate::protocol::startup::{parse, StartupPacket};
        use crate::protocol::tags::startup as code;
        let mut buf = BytesMut::new();
        startup_message(&mut buf, code::PROTOCOL_3_0, &[("user", "u"), ("database", "d")]);
        let StartupPacket::Startup { major, minor, params } = parse(&buf).unwrap() else { panic!() };
        assert_eq!((major, minor, params.len()), (3, 0, 2));
        assert_eq!(parse(&encryption_request(code::SSL_REQUEST)).unwrap(), StartupPacket::SslRequest);
    }

    #[test]
    fn error_without_sqlstate_is_tolerated() {
        let f = parse_error_fields(b"SERROR\0Mboom\0\0").unwrap();
        assert_eq!(f.code, "");
        assert_eq!(f.message, b"boom");
        assert_eq!(parse_error_fields(b"SERROR\0Mbo"), Err(ProtocolError::Unterminated));
    }

    #[test]
    fn server_text_in_any_encoding_is_read_as_bytes() {
        // LATIN9 'foo\xa4bar' (the euro sign), as Postgres sends it to a LATIN9 client.
        let body = b"SERROR\0VERROR\0CP0001\0Mfoo\xa4bar\0\0";
        let f = parse_error_fields(body).unwrap();
        assert_eq!((f.severity.as_str(), f.code.as_str(), &f.message[..]), ("ERROR", "P0001", &b"foo\xa4bar"[..]));
        assert_eq!(f.message_text(), "foo\\xa4bar");
        assert_eq!(error_is_fatal(body), Ok(false));
        assert_eq!(error_is_fatal(b"SFATAL\0VFATAL\0M\xe9\0\0"), Ok(true));
        assert_eq!(parse_parameter_status(b"session_authorization\0Jos\xe9\0").unwrap().1, b"Jos\xe9");
        assert_eq!(parameter_status_text(b"session_authorization\0Jos\xe9\0"), Ok(None));
        assert_eq!(parameter_status_text(b"TimeZone\0UTC\0"), Ok(Some(("TimeZone", "UTC"))));
    }
}
