//! Framing of tagged v3 messages: peek the 5-byte header, never decode bodies.
//!
//! The decoder owns no socket. Callers fill a `BytesMut` and ask for whole
//! frames (or for the boundary of a run of whole frames, for batch forwarding).

use bytes::{Buf, Bytes, BytesMut};

use super::ProtocolError;

/// Size of a tagged message header: one tag byte and a 4-byte length.
pub const HEADER_LEN: usize = 5;

/// One whole tagged message: the tag and the raw bytes, header included.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Frame {
    pub tag: u8,
    pub bytes: Bytes,
}

impl Frame {
    /// The body, after the 5-byte header.
    pub fn body(&self) -> &[u8] {
        &self.bytes[HEADER_LEN..]
    }
}

/// The header of the message at the start of `buf`, if 5 bytes are there.
/// Returns the tag and the total length of the message including its tag byte.
#[inline]
pub fn peek_header(buf: &[u8], max_len: usize) -> Result<Option<(u8, usize)>, ProtocolError> {
    if buf.len() < HEADER_LEN {
        return Ok(None);
    }
    let tag = buf[0];
    let len = i32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]);
    if len < 4 {
        return Err(ProtocolError::BadLength { tag, len: len as i64 });
    }
    let len = len as usize;
    if len > max_len {
        return Err(ProtocolError::TooLong { tag, len, max: max_len });
    }
    Ok(Some((tag, len + 1)))
}

/// Splits one whole frame off the front of `buf`, if it is all there.
pub fn decode_frame(buf: &mut BytesMut, max_len: usize) -> Result<Option<Frame>, ProtocolError> {
    match peek_header(buf, max_len)? {
        Some((tag, total)) if buf.len() >= total => Ok(Some(Frame { tag, bytes: buf.split_to(total).freeze() })),
        _ => Ok(None),
    }
}

/// Scans whole frames at the front of `buf` and calls `visit(tag, frame_bytes)`
/// for each, stopping early when `visit` returns false (that frame is counted).
/// Returns the number of bytes covered by whole frames visited.
#[inline]
pub fn scan_frames(
    buf: &[u8],
    max_len: usize,
    mut visit: impl FnMut(u8, &[u8]) -> bool,
) -> Result<usize, ProtocolError> {
    let mut at = 0;
    while let Some((tag, total)) = peek_header(&buf[at..], max_len)? {
        if buf.len() - at < total {
            break;
        }
        let keep_going = visit(tag, &buf[at..at + total]);
        at += total;
        if !keep_going {
            break;
        }
    }
    Ok(at)
}

/// Reads a NUL-terminated string from the front of `buf`, advancing past it.
pub(crate) fn read_cstr<'a>(buf: &mut &'a [u8]) -> Result<&'a str, ProtocolError> {
    let mut rest = *buf;
    let s = std::str::from_utf8(read_cbytes(&mut rest)?).map_err(|_| ProtocolError::BadUtf8)?;
    *buf = rest;
    Ok(s)
}

/// Reads NUL-terminated bytes from the front of `buf`, advancing past them:
/// server text is in the client's encoding, whatever that is, so it is not
/// validated.
pub(crate) fn read_cbytes<'a>(buf: &mut &'a [u8]) -> Result<&'a [u8], ProtocolError> {
    let end = buf.iter().position(|&b| b == 0).ok_or(ProtocolError::Unterminated)?;
    let s = &buf[..end];
    buf.advance(end + 1);
    Ok(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_whole_frames_only() {
        let mut buf = BytesMut::from(&b"Q\0\0\0\x09abcd\0Z\0\0"[..]);
        let f = decode_frame(&mut buf, 1 << 20).unwrap().unwrap();
        assert_eq!(f.tag, b'Q');
        assert_eq!(f.body(), b"abcd\0");
        assert_eq!(decode_frame(&mut buf, 1 << 20).unwrap(), None);
        assert_eq!(&buf[..], b"Z\0\0");
    }

    #[test]
    fn rejects_short_and_oversized_lengths() {
        let mut neg = BytesMut::from(&b"Q\xff\xff\xff\xff"[..]);
        assert!(matches!(decode_frame(&mut neg, 100), Err(ProtocolError::BadLength { .. })));
        let mut big = BytesMut::from(&b"Q\0\x10\0\0"[..]);
        assert!(matches!(decode_frame(&mut big, 100), Err(ProtocolError::TooLong { .. })));
    }

    #[test]
    fn scan_stops_at_partial_frame() {
        let buf = b"P\0\0\0\x04S\0\0\0\x04D\0\0";
        let mut tags = vec![];
        let n = scan_frames(buf, 100, |t, _| {
            tags.push(t);
            true
        })
        .unwrap();
        assert_eq!(n, 10);
        assert_eq!(tags, b"PS");
    }
}
