//! Builders for the few backend messages weir writes itself, and readers for
//! the few fields weir needs out of server messages. No I/O.

use bytes::{BufMut, BytesMut};

use super::{frame::read_cstr, sqlstate::SqlState, tags::backend as tag, ProtocolError};

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
    let t = match severity {
        Severity::Error | Severity::Fatal => tag::ERROR_RESPONSE,
        Severity::Notice | Severity::Warning => tag::NOTICE_RESPONSE,
    };
    let at = begin(buf, t);
    for (field, value) in [(b'S', severity.as_str()), (b'V', severity.as_str()), (b'C', code.code()), (b'M', message)] {
        buf.put_u8(field);
        buf.put_slice(value.as_bytes());
        buf.put_u8(0);
    }
    buf.put_u8(0);
    finish(buf, at);
}

/// ReadyForQuery, idle (outside a transaction).
pub const READY_IDLE: [u8; 6] = [tag::READY_FOR_QUERY, 0, 0, 0, 5, super::tags::status::IDLE];

pub fn ready_for_query(buf: &mut BytesMut, status: u8) {
    buf.put_slice(&[tag::READY_FOR_QUERY, 0, 0, 0, 5, status]);
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
    let at = begin(buf, tag::BACKEND_KEY_DATA);
    buf.put_i32(pid);
    buf.put_i32(secret);
    finish(buf, at);
}

pub fn negotiate_protocol_version(buf: &mut BytesMut, newest_minor: i32, unknown_options: &[&str]) {
    let at = begin(buf, tag::NEGOTIATE_PROTOCOL_VERSION);
    buf.put_i32(newest_minor);
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

/// A frontend Terminate message.
pub fn terminate(buf: &mut BytesMut) {
    buf.put_slice(&[super::tags::frontend::TERMINATE, 0, 0, 0, 4]);
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
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ErrorFields {
    pub severity: String,
    /// Empty when the server sent no SQLSTATE (a broken server may omit it).
    pub code: String,
    pub message: String,
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
        let value = read_cstr(&mut body)?;
        match field {
            b'V' => f.severity = value.to_owned(),
            b'S' if f.severity.is_empty() => f.severity = value.to_owned(),
            b'C' => f.code = value.to_owned(),
            b'M' => f.message = value.to_owned(),
            _ => {}
        }
    }
}

/// Reads a ParameterStatus body into (name, value).
pub fn parse_parameter_status(mut body: &[u8]) -> Result<(String, String), ProtocolError> {
    let name = read_cstr(&mut body)?.to_owned();
    let value = read_cstr(&mut body)?.to_owned();
    Ok((name, value))
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
        assert_eq!((f.severity.as_str(), f.code.as_str(), f.message.as_str()), ("FATAL", "28P01", "nope"));
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
        assert_eq!(f.message, "boom");
        assert_eq!(parse_error_fields(b"SERROR\0Mbo"), Err(ProtocolError::Unterminated));
    }
}
