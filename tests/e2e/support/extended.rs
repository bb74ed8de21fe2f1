//! Extended-query messages as a driver writes them, for the raw tests that
//! script Parse/Bind/Describe/Execute/Close/Sync by hand (prepared
//! statements, the unnamed statement, pipelining). Statement and portal
//! names are given as text; "" is the unnamed one. Parameters are text.

use weir::protocol::tags::frontend as fe;

use crate::raw::tagged;

/// A Parse of `q` as statement `name`, with no parameter types given.
pub fn parse(name: &str, q: &str) -> Vec<u8> {
    tagged(fe::PARSE, &[name.as_bytes(), b"\0", q.as_bytes(), b"\0\0\0"].concat())
}

/// A Bind of statement `stmt` to the unnamed portal, with text parameters
/// and text results.
pub fn bind(stmt: &str, params: &[&str]) -> Vec<u8> {
    let mut body = [b"\0", stmt.as_bytes(), b"\0\0\0"].concat();
    body.extend_from_slice(&(params.len() as u16).to_be_bytes());
    for p in params {
        body.extend_from_slice(&(p.len() as i32).to_be_bytes());
        body.extend_from_slice(p.as_bytes());
    }
    body.extend_from_slice(b"\0\0");
    tagged(fe::BIND, &body)
}

/// A Describe of statement `name`.
pub fn describe_statement(name: &str) -> Vec<u8> {
    tagged(fe::DESCRIBE, &[b"S", name.as_bytes(), b"\0"].concat())
}

/// A Close of statement `name`.
pub fn close_statement(name: &str) -> Vec<u8> {
    tagged(fe::CLOSE, &[b"S", name.as_bytes(), b"\0"].concat())
}

/// An Execute of the unnamed portal, all rows.
pub fn execute() -> Vec<u8> {
    tagged(fe::EXECUTE, b"\0\0\0\0\0")
}

/// A Sync.
pub fn sync() -> Vec<u8> {
    tagged(fe::SYNC, b"")
}
