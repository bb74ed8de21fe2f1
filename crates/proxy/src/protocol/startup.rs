//! The untagged first packet a client sends: StartupMessage, CancelRequest,
//! SSLRequest or GSSENCRequest. Parsing only; no I/O.

use super::{frame::read_cstr, tags::startup as code, ProtocolError};

/// Postgres refuses startup packets longer than this (`MAX_STARTUP_PACKET_LENGTH`).
pub const MAX_STARTUP_PACKET_LEN: usize = 10_000;

/// A parsed untagged packet; a StartupMessage's parameters are read in
/// place (borrowed from the packet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StartupPacket<'a> {
    Startup { major: u16, minor: u16, params: Vec<(&'a str, &'a str)> },
    Cancel { pid: i32, secret: i32 },
    SslRequest,
    GssEncRequest,
}

/// The total length of the untagged packet at the front of `buf`, once 4 bytes are there.
pub fn peek_len(buf: &[u8]) -> Result<Option<usize>, ProtocolError> {
    if buf.len() < 4 {
        return Ok(None);
    }
    let len = i32::from_be_bytes([buf[0], buf[1], buf[2], buf[3]]);
    if len < 8 {
        return Err(ProtocolError::BadLength { tag: 0, len: len as i64 });
    }
    if len as usize > MAX_STARTUP_PACKET_LEN {
        return Err(ProtocolError::TooLong { tag: 0, len: len as usize, max: MAX_STARTUP_PACKET_LEN });
    }
    Ok(Some(len as usize))
}

/// Parses one whole untagged packet (length prefix included).
pub fn parse(packet: &[u8]) -> Result<StartupPacket<'_>, ProtocolError> {
    if packet.len() < 8 {
        return Err(ProtocolError::Truncated);
    }
    let version = i32::from_be_bytes([packet[4], packet[5], packet[6], packet[7]]);
    let mut body = &packet[8..];
    match version {
        code::SSL_REQUEST if body.is_empty() => Ok(StartupPacket::SslRequest),
        code::GSSENC_REQUEST if body.is_empty() => Ok(StartupPacket::GssEncRequest),
        code::CANCEL_REQUEST if body.len() == 8 => Ok(StartupPacket::Cancel {
            pid: i32::from_be_bytes([body[0], body[1], body[2], body[3]]),
            secret: i32::from_be_bytes([body[4], body[5], body[6], body[7]]),
        }),
        code::SSL_REQUEST | code::GSSENC_REQUEST | code::CANCEL_REQUEST => Err(ProtocolError::Truncated),
        _ => {
            let major = (version >> 16) as u16;
            let minor = (version & 0xffff) as u16;
            let mut params = Vec::new();
            loop {
                let key = read_cstr(&mut body)?;
                if key.is_empty() {
                    break;
                }
                let value = read_cstr(&mut body)?;
                params.push((key, value));
            }
            if !body.is_empty() {
                return Err(ProtocolError::TrailingBytes);
            }
            Ok(StartupPacket::Startup { major, minor, params })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn packet(version: i32, body: &[u8]) -> Vec<u8> {
        let mut p = ((body.len() + 8) as i32).to_be_bytes().to_vec();
        p.extend_from_slice(&version.to_be_bytes());
        p.extend_from_slice(body);
        p
    }

    #[test]
    fn parses_startup_params() {
        let p = packet(code::PROTOCOL_3_0, b"user\0bob\0database\0app\0\0");
        let StartupPacket::Startup { major, minor, params } = parse(&p).unwrap() else { panic!() };
        assert_eq!((major, minor), (3, 0));
        assert_eq!(params, vec![("user", "bob"), ("database", "app")]);
    }

    #[test]
    fn rejects_unterminated_and_oversized() {
        assert_eq!(parse(&packet(code::PROTOCOL_3_0, b"user\0bob")), Err(ProtocolError::Unterminated));
        assert!(matches!(peek_len(&20_000i32.to_be_bytes()), Err(ProtocolError::TooLong { .. })));
        assert!(matches!(peek_len(&(-1i32).to_be_bytes()), Err(ProtocolError::BadLength { .. })));
    }

    #[test]
    fn parses_cancel_and_ssl() {
        let mut body = 7i32.to_be_bytes().to_vec();
        body.extend_from_slice(&9i32.to_be_bytes());
        assert_eq!(parse(&packet(code::CANCEL_REQUEST, &body)).unwrap(), StartupPacket::Cancel { pid: 7, secret: 9 });
        assert_eq!(parse(&packet(code::SSL_REQUEST, b"")).unwrap(), StartupPacket::SslRequest);
    }
}
