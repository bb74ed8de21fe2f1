//! The untagged first packet a client sends: StartupMessage, CancelRequest,
//! SSLRequest or GSSENCRequest. Parsing only; no I/O.

use super::{frame::read_cstr, tags::startup as code, ProtocolError};

/// Postgres refuses startup packets longer than this (`MAX_STARTUP_PACKET_LENGTH`).
pub(crate) const MAX_STARTUP_PACKET_LEN: usize = 10_000;

/// The newest minor version of protocol 3 weir speaks: 3.2, as Postgres 18.
pub(crate) const NEWEST_MINOR: u16 = 2;

/// The first minor version whose cancel keys are longer than 4 bytes (3.2).
pub(crate) const LONG_KEY_MINOR: u16 = 2;

/// The longest cancel key the protocol allows in a CancelRequest (3.2).
pub(crate) const MAX_CANCEL_KEY_LEN: usize = 256;

/// The minor version a client asking for 3.`requested` gets: its own, or
/// weir's newest if it asked for more (as Postgres 18 answers).
pub(crate) fn negotiated_minor(requested: u16) -> u16 {
    requested.min(NEWEST_MINOR)
}

/// Whether a client asking for 3.`requested` (with `unknown_options`
/// `_pq_.` options) is sent NegotiateProtocolVersion before authentication:
/// when it asked for a newer minor version than weir's, or for any option.
pub(crate) fn needs_negotiation(requested: u16, unknown_options: usize) -> bool {
    requested > NEWEST_MINOR || unknown_options > 0
}

/// A parsed untagged packet; a StartupMessage's parameters are read in
/// place (borrowed from the packet).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum StartupPacket<'a> {
    Startup {
        major: u16,
        minor: u16,
        params: Vec<(&'a str, &'a str)>,
    },
    /// A CancelRequest: the key is 4 bytes (3.0) or longer (3.2).
    Cancel {
        pid: i32,
        key: &'a [u8],
    },
    SslRequest,
    GssEncRequest,
}

/// The total length of the untagged packet at the front of `buf`, once 4 bytes are there.
pub(crate) fn peek_len(buf: &[u8]) -> Result<Option<usize>, ProtocolError> {
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
pub(crate) fn parse(packet: &[u8]) -> Result<StartupPacket<'_>, ProtocolError> {
    if packet.len() < 8 {
        return Err(ProtocolError::Truncated);
    }
    let version = i32::from_be_bytes([packet[4], packet[5], packet[6], packet[7]]);
    let mut body = &packet[8..];
    match version {
        code::SSL_REQUEST if body.is_empty() => Ok(StartupPacket::SslRequest),
        code::GSSENC_REQUEST if body.is_empty() => Ok(StartupPacket::GssEncRequest),
        code::CANCEL_REQUEST if (5..=4 + MAX_CANCEL_KEY_LEN).contains(&body.len()) => {
            Ok(StartupPacket::Cancel { pid: i32::from_be_bytes([body[0], body[1], body[2], body[3]]), key: &body[4..] })
        }
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
    fn negotiates_as_postgres_18() {
        assert_eq!((negotiated_minor(0), needs_negotiation(0, 0)), (0, false));
        assert_eq!((negotiated_minor(1), needs_negotiation(1, 0)), (1, false));
        assert_eq!((negotiated_minor(2), needs_negotiation(2, 0)), (2, false));
        assert_eq!((negotiated_minor(9999), needs_negotiation(9999, 0)), (2, true));
        assert!(needs_negotiation(0, 1), "any _pq_. option");
    }

    #[test]
    fn parses_cancel_and_ssl() {
        let mut body = 7i32.to_be_bytes().to_vec();
        body.extend_from_slice(&9i32.to_be_bytes());
        let p = packet(code::CANCEL_REQUEST, &body);
        assert_eq!(parse(&p).unwrap(), StartupPacket::Cancel { pid: 7, key: &9i32.to_be_bytes() });
        body.extend_from_slice(&[0xab; 28]);
        let p = packet(code::CANCEL_REQUEST, &body);
        assert!(matches!(parse(&p).unwrap(), StartupPacket::Cancel { pid: 7, key } if key.len() == 32), "a 3.2 key");
        body.extend_from_slice(&[0; MAX_CANCEL_KEY_LEN]);
        assert_eq!(parse(&packet(code::CANCEL_REQUEST, &body)), Err(ProtocolError::Truncated), "over 256 bytes");
        assert_eq!(parse(&packet(code::CANCEL_REQUEST, &7i32.to_be_bytes())), Err(ProtocolError::Truncated), "no key");
        assert_eq!(parse(&packet(code::SSL_REQUEST, b"")).unwrap(), StartupPacket::SslRequest);
    }
}
