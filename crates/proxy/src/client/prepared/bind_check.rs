//! What Postgres checks of a Bind before the transaction's state, where
//! weir must prepare the statement first: a Bind of a statement the
//! current server lacks is sent after weir's own Parse of it, and in a
//! failed transaction that Parse is refused (25P02) where Postgres, which
//! holds the statement, would have checked the Bind's parameter formats
//! and count first and answered 08P01 (so too for any other error of that
//! Parse but a cancel, a shutdown or a FATAL one, which are the session's,
//! `inbound::refuses_first`). weir answers as Postgres would: the
//! statement's parameter count is that of the parameter types its Parse
//! declared, or the highest `$n` its text refers to (`params.rs`). For a
//! text weir cannot read to its end, the server's own answer stands.

use std::sync::Arc;

use bytes::{Bytes, BytesMut};

use super::outbound::Msg;
use super::{ClientStatements, Expect, Rewrite, Statement};
use crate::protocol::{
    messages::{self, Severity},
    sqlstate,
};
use crate::server::statements::ServerStatements;

/// Postgres's refusal of a Bind, for its parameter formats or count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Refusal {
    /// More than one parameter format, and not one per parameter.
    Formats { formats: u16, params: u16 },
    /// Not the statement's parameter count.
    Count { params: u16, requires: u16 },
}

impl Refusal {
    /// Postgres's ErrorResponse, for a Bind that named `statement`.
    pub(super) fn error(self, statement: &str) -> Bytes {
        let text = match self {
            Refusal::Formats { formats, params } => {
                format!("bind message has {formats} parameter formats but {params} parameters")
            }
            Refusal::Count { params, requires } => format!(
                "bind message supplies {params} parameters, but prepared statement \"{statement}\" requires {requires}"
            ),
        };
        let mut out = BytesMut::new();
        messages::error_response(&mut out, Severity::Error, sqlstate::PROTOCOL_VIOLATION, &text);
        out.freeze()
    }
}

impl ClientStatements {
    /// Prepares `stmt` on the server before the client's Bind `m` of it
    /// (its names end at `rest_at`). Should the server refuse weir's Parse,
    /// the client gets what Postgres says of the Bind before that.
    #[cold]
    #[inline(never)]
    pub(super) fn prepare_for_bind(
        &mut self,
        stmt: &Arc<Statement>,
        m: &Msg<'_>,
        rest_at: usize,
        src: &[u8],
        server: &mut ServerStatements,
        rw: &mut Rewrite,
    ) {
        let parse = self.server_parse(stmt, server, None);
        if let Some(Expect::Parse { refused, .. }) = self.q.expect.back_mut() {
            *refused = refusal(m.bytes, rest_at, stmt);
        }
        rw.splice(src, m.at, 0, &parse);
    }
}

/// How Postgres refuses the Bind `bind` (the whole message, its names
/// ending at `rest_at`) of `stmt`, if it does and weir can tell.
fn refusal(bind: &[u8], rest_at: usize, stmt: &Statement) -> Option<Refusal> {
    let rest = bind.get(rest_at..)?;
    let formats = read_u16(rest, 0)?;
    let params = read_u16(rest, 2 + 2 * formats as usize)?;
    if formats > 1 && formats != params {
        return Some(Refusal::Formats { formats, params });
    }
    let requires = super::params::count(stmt.text())?;
    (params != requires).then_some(Refusal::Count { params, requires })
}

fn read_u16(bytes: &[u8], at: usize) -> Option<u16> {
    let b = bytes.get(at..at + 2)?;
    Some(u16::from_be_bytes([b[0], b[1]]))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A Bind of `stmt` with `formats` parameter formats and `params` values.
    fn bind(formats: u16, params: u16) -> (Vec<u8>, usize) {
        let mut m = vec![b'B', 0, 0, 0, 0];
        m.extend_from_slice(b"\0s1\0");
        let rest_at = m.len();
        m.extend_from_slice(&formats.to_be_bytes());
        for _ in 0..formats {
            m.extend_from_slice(&0u16.to_be_bytes());
        }
        m.extend_from_slice(&params.to_be_bytes());
        for _ in 0..params {
            m.extend_from_slice(&1i32.to_be_bytes());
            m.push(b'7');
        }
        m.extend_from_slice(&0u16.to_be_bytes());
        (m, rest_at)
    }

    fn stmt(query: &str, types: &[u32]) -> Statement {
        let mut t = (types.len() as u16).to_be_bytes().to_vec();
        for ty in types {
            t.extend_from_slice(&ty.to_be_bytes());
        }
        Statement::new(query.as_bytes(), &t, 0, 0)
    }

    #[test]
    fn a_text_without_parameters_requires_the_types_it_declares() {
        let (m, at) = bind(0, 1);
        assert_eq!(refusal(&m, at, &stmt("select 42", &[])), Some(Refusal::Count { params: 1, requires: 0 }));
        assert_eq!(refusal(&m, at, &stmt("select 42", &[23])), None);
        let (m, at) = bind(1, 0);
        assert_eq!(refusal(&m, at, &stmt("select 42", &[23, 25])), Some(Refusal::Count { params: 0, requires: 2 }));
    }

    #[test]
    fn a_text_counts_the_parameters_it_refers_to() {
        let (m, at) = bind(0, 3);
        assert_eq!(refusal(&m, at, &stmt("select $1::int", &[])), Some(Refusal::Count { params: 3, requires: 1 }));
        assert_eq!(refusal(&m, at, &stmt("select $$a$$", &[])), Some(Refusal::Count { params: 3, requires: 0 }));
        assert_eq!(refusal(&m, at, &stmt("select $3", &[])), None);
        assert_eq!(refusal(&m, at, &stmt("select '$1", &[])), None);
    }

    #[test]
    fn formats_are_checked_before_the_count() {
        let (m, at) = bind(2, 1);
        assert_eq!(refusal(&m, at, &stmt("select $1::int", &[])), Some(Refusal::Formats { formats: 2, params: 1 }));
        let (m, at) = bind(1, 3);
        assert_eq!(refusal(&m, at, &stmt("select 1", &[])), Some(Refusal::Count { params: 3, requires: 0 }));
    }

    #[test]
    fn a_bind_cut_short_is_left_to_the_server() {
        let (m, at) = bind(0, 1);
        assert_eq!(refusal(&m[..at + 1], at, &stmt("select 1", &[])), None);
    }

    #[test]
    fn the_errors_are_postgres_texts() {
        let fields = |e: Bytes| messages::parse_error_fields(&e[5..]).unwrap();
        let e = fields(Refusal::Count { params: 1, requires: 0 }.error("s1"));
        assert_eq!((e.severity.as_str(), e.code.as_str()), ("ERROR", "08P01"));
        assert_eq!(e.message_text(), "bind message supplies 1 parameters, but prepared statement \"s1\" requires 0");
        let e = fields(Refusal::Formats { formats: 2, params: 3 }.error("s1"));
        assert_eq!(e.message_text(), "bind message has 2 parameter formats but 3 parameters");
    }
}
