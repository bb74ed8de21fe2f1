//! Readers and builders for the few extended-query messages weir rewrites to
//! pool named prepared statements: Parse, Bind (its head only), Describe and
//! Close, plus the small replies weir synthesizes. No I/O; bodies are read
//! only when the caller decided a message needs it (never a DataRow).

use bytes::{BufMut, BytesMut};

use super::{frame::HEADER_LEN, tags::backend as be, tags::frontend as fe, ProtocolError};

/// Describe/Close target: a prepared statement.
pub(crate) const TARGET_STATEMENT: u8 = b'S';

/// The fields of a Parse message weir needs, borrowed from its body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ParseRef<'a> {
    pub name: &'a [u8],
    /// The query text, without its NUL.
    pub query: &'a [u8],
    /// The raw parameter-type section: an Int16 count and that many Int32 OIDs.
    pub param_types: &'a [u8],
}

/// Splits a NUL-terminated byte string off the front of `buf`.
fn cstr<'a>(buf: &mut &'a [u8]) -> Result<&'a [u8], ProtocolError> {
    let end = buf.iter().position(|&b| b == 0).ok_or(ProtocolError::Unterminated)?;
    let s = &buf[..end];
    *buf = &buf[end + 1..];
    Ok(s)
}

/// The statement name at the start of a Parse body (only the name is needed
/// to know whether a Parse is named).
pub(crate) fn parse_name(body: &[u8]) -> Result<&[u8], ProtocolError> {
    let mut b = body;
    cstr(&mut b)
}

/// Reads a whole Parse body.
pub(crate) fn read_parse(body: &[u8]) -> Result<ParseRef<'_>, ProtocolError> {
    let mut b = body;
    let name = cstr(&mut b)?;
    let query = cstr(&mut b)?;
    if b.len() < 2 {
        return Err(ProtocolError::Truncated);
    }
    let n = i16::from_be_bytes([b[0], b[1]]);
    if n < 0 || b.len() != 2 + 4 * n as usize {
        return Err(ProtocolError::TrailingBytes);
    }
    Ok(ParseRef { name, query, param_types: b })
}

/// Appends a Parse message.
pub(crate) fn parse(buf: &mut BytesMut, name: &str, query: &[u8], param_types: &[u8]) {
    buf.put_u8(fe::PARSE);
    buf.put_i32((4 + name.len() + 1 + query.len() + 1 + param_types.len()) as i32);
    buf.put_slice(name.as_bytes());
    buf.put_u8(0);
    buf.put_slice(query);
    buf.put_u8(0);
    buf.put_slice(param_types);
}

/// The head of a Bind message: portal and statement names, and where the
/// rest of the message (formats, parameters) starts, counted from the tag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct BindHead<'a> {
    pub portal: &'a [u8],
    pub statement: &'a [u8],
    pub rest_at: usize,
}

/// Reads the names at the front of a Bind message from as many of its bytes
/// as are at hand (`msg` starts at the tag). None when more bytes are needed.
pub(crate) fn read_bind_head(msg: &[u8]) -> Result<Option<BindHead<'_>>, ProtocolError> {
    let body = &msg[HEADER_LEN.min(msg.len())..];
    let Some(p_end) = body.iter().position(|&b| b == 0) else { return Ok(None) };
    let after = &body[p_end + 1..];
    let Some(s_end) = after.iter().position(|&b| b == 0) else { return Ok(None) };
    Ok(Some(BindHead {
        portal: &body[..p_end],
        statement: &after[..s_end],
        rest_at: HEADER_LEN + p_end + 1 + s_end + 1,
    }))
}

/// Appends the head of a Bind naming `statement` instead, for a message whose
/// original total length (tag included) was `total` with names ending at `rest_at`.
pub(crate) fn bind_head(buf: &mut BytesMut, total: usize, head: &BindHead<'_>, statement: &str) {
    let rest = total - head.rest_at;
    buf.put_u8(fe::BIND);
    buf.put_i32((4 + head.portal.len() + 1 + statement.len() + 1 + rest) as i32);
    buf.put_slice(head.portal);
    buf.put_u8(0);
    buf.put_slice(statement.as_bytes());
    buf.put_u8(0);
}

/// Reads a Describe or Close body: the target kind and its name.
pub(crate) fn read_target(body: &[u8]) -> Result<(u8, &[u8]), ProtocolError> {
    let (&kind, mut rest) = body.split_first().ok_or(ProtocolError::Truncated)?;
    let name = cstr(&mut rest)?;
    if !rest.is_empty() {
        return Err(ProtocolError::TrailingBytes);
    }
    Ok((kind, name))
}

/// Appends a Describe or Close (by `tag`) of the statement or portal `name`.
pub(crate) fn target(buf: &mut BytesMut, tag: u8, kind: u8, name: &str) {
    buf.put_u8(tag);
    buf.put_i32((4 + 1 + name.len() + 1) as i32);
    buf.put_u8(kind);
    buf.put_slice(name.as_bytes());
    buf.put_u8(0);
}

pub(crate) fn parse_complete(buf: &mut BytesMut) {
    buf.put_slice(&[be::PARSE_COMPLETE, 0, 0, 0, 4]);
}

pub(crate) fn close_complete(buf: &mut BytesMut) {
    buf.put_slice(&[be::CLOSE_COMPLETE, 0, 0, 0, 4]);
}

/// Appends a CommandComplete with `tag` (e.g. "DEALLOCATE").
pub(crate) fn command_complete(buf: &mut BytesMut, tag: &str) {
    buf.put_u8(be::COMMAND_COMPLETE);
    buf.put_i32((4 + tag.len() + 1) as i32);
    buf.put_slice(tag.as_bytes());
    buf.put_u8(0);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parse_round_trips() {
        let mut b = BytesMut::new();
        parse(&mut b, "s1", b"select $1", &[0, 1, 0, 0, 0, 23]);
        let total = i32::from_be_bytes([b[1], b[2], b[3], b[4]]) as usize + 1;
        assert_eq!(total, b.len());
        let p = read_parse(&b[HEADER_LEN..]).unwrap();
        assert_eq!((p.name, p.query, p.param_types), (&b"s1"[..], &b"select $1"[..], &[0u8, 1, 0, 0, 0, 23][..]));
    }

    #[test]
    fn bad_parse_bodies_are_errors() {
        assert!(read_parse(b"s1\0select").is_err());
        assert!(read_parse(b"s1\0select\0\0").is_err());
        assert!(read_parse(b"s1\0select\0\0\x02\0\0\0\x17").is_err());
        assert!(read_parse(b"s1\0select\0\xff\xff").is_err());
    }

    #[test]
    fn bind_head_is_rewritten_keeping_the_rest() {
        let mut m = vec![fe::BIND, 0, 0, 0, 0];
        m.extend_from_slice(b"p\0s1\0\0\0\0\0\0\0");
        let len = (m.len() - 1) as i32;
        m[1..5].copy_from_slice(&len.to_be_bytes());
        assert_eq!(read_bind_head(&m[..7]).unwrap(), None);
        let head = read_bind_head(&m).unwrap().unwrap();
        assert_eq!((head.portal, head.statement), (&b"p"[..], &b"s1"[..]));
        let mut out = BytesMut::new();
        bind_head(&mut out, m.len(), &head, "weir_abc");
        out.extend_from_slice(&m[head.rest_at..]);
        let new_len = i32::from_be_bytes([out[1], out[2], out[3], out[4]]) as usize + 1;
        assert_eq!(new_len, out.len());
        assert_eq!(read_bind_head(&out).unwrap().unwrap().statement, b"weir_abc");
    }

    #[test]
    fn targets_round_trip() {
        let mut b = BytesMut::new();
        target(&mut b, fe::CLOSE, TARGET_STATEMENT, "x");
        assert_eq!(read_target(&b[HEADER_LEN..]).unwrap(), (TARGET_STATEMENT, &b"x"[..]));
        assert!(read_target(b"").is_err());
        assert!(read_target(b"Sx\0junk").is_err());
    }
}
