//! Result sets the admin console writes: RowDescription (int4, int8,
//! numeric, float8, bytea or text columns, PgBouncer's types), DataRows in text format, CommandComplete. Pure encoding,
//! no I/O; psql and any driver render them like a server's own results.

use bytes::{BufMut, BytesMut};

use crate::protocol::messages::{begin, finish};
use crate::protocol::tags::backend as tag;

/// Type OIDs of the column types the console uses (pg_type.oid).
pub const BYTEA_OID: i32 = 17;
pub const INT8_OID: i32 = 20;
pub const INT4_OID: i32 = 23;
pub const TEXT_OID: i32 = 25;
pub const FLOAT8_OID: i32 = 701;
pub const NUMERIC_OID: i32 = 1700;

/// A column's type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// int8.
    Int,
    /// int4 (PgBouncer's counts of connections, ports, flags).
    Int4,
    /// numeric (PgBouncer's 64-bit statistics).
    Numeric,
    Float,
    Text,
    Bytea,
}

impl Kind {
    fn oid_and_len(self) -> (i32, i16) {
        match self {
            Kind::Int => (INT8_OID, 8),
            Kind::Int4 => (INT4_OID, 4),
            Kind::Numeric => (NUMERIC_OID, -1),
            Kind::Float => (FLOAT8_OID, 8),
            Kind::Text => (TEXT_OID, -1),
            Kind::Bytea => (BYTEA_OID, -1),
        }
    }
}

/// A value in a row; None is SQL NULL.
pub type Cell = Option<String>;

/// Rows under named, typed columns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ResultSet {
    pub columns: Vec<(&'static str, Kind)>,
    pub rows: Vec<Vec<Cell>>,
}

impl ResultSet {
    pub fn new(columns: &[(&'static str, Kind)]) -> Self {
        ResultSet { columns: columns.to_vec(), rows: Vec::new() }
    }

    /// Adds a row; it must have one cell per column.
    pub fn push(&mut self, row: Vec<Cell>) {
        debug_assert_eq!(row.len(), self.columns.len(), "row width");
        self.rows.push(row);
    }

    /// The column named `name`, for tests that read results back.
    pub fn column(&self, name: &str) -> Option<usize> {
        self.columns.iter().position(|(n, _)| *n == name)
    }

    /// RowDescription, DataRows and CommandComplete with `command_tag`.
    pub fn encode(&self, out: &mut BytesMut, command_tag: &str) {
        row_description(out, &self.columns);
        for row in &self.rows {
            data_row(out, row);
        }
        command_complete(out, command_tag);
    }
}

/// Cell helpers.
pub fn int(v: impl Into<i128>) -> Cell {
    Some(v.into().to_string())
}

pub fn float(v: f64) -> Cell {
    Some(format!("{v:.3}"))
}

pub fn text(v: impl Into<String>) -> Cell {
    Some(v.into())
}

fn row_description(out: &mut BytesMut, columns: &[(&'static str, Kind)]) {
    let at = begin(out, tag::ROW_DESCRIPTION);
    out.put_i16(columns.len() as i16);
    for (name, kind) in columns {
        let (oid, len) = kind.oid_and_len();
        out.put_slice(name.as_bytes());
        out.put_u8(0);
        out.put_i32(0); // table oid
        out.put_i16(0); // column number
        out.put_i32(oid);
        out.put_i16(len);
        out.put_i32(-1); // type modifier
        out.put_i16(0); // text format
    }
    finish(out, at);
}

fn data_row(out: &mut BytesMut, row: &[Cell]) {
    let at = begin(out, tag::DATA_ROW);
    out.put_i16(row.len() as i16);
    for cell in row {
        match cell {
            Some(v) => {
                out.put_i32(v.len() as i32);
                out.put_slice(v.as_bytes());
            }
            None => out.put_i32(-1),
        }
    }
    finish(out, at);
}

/// CommandComplete with `command_tag` (e.g. "SHOW", "PAUSE").
pub fn command_complete(out: &mut BytesMut, command_tag: &str) {
    let at = begin(out, tag::COMMAND_COMPLETE);
    out.put_slice(command_tag.as_bytes());
    out.put_u8(0);
    finish(out, at);
}

/// EmptyQueryResponse, for a query string with no command in it.
pub fn empty_query(out: &mut BytesMut) {
    out.put_slice(&[tag::EMPTY_QUERY_RESPONSE, 0, 0, 0, 4]);
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::{decode_frame, frame::read_cstr};

    #[test]
    fn encodes_what_a_client_can_read_back() {
        let mut rs = ResultSet::new(&[("database", Kind::Text), ("cl_active", Kind::Int), ("rate", Kind::Float)]);
        rs.push(vec![text("app"), int(3u32), float(0.5)]);
        rs.push(vec![None, int(-1i64), float(2.0)]);
        let mut out = BytesMut::new();
        rs.encode(&mut out, "SHOW");
        let t = decode_frame(&mut out, 1 << 20).unwrap().unwrap();
        assert_eq!(t.tag, tag::ROW_DESCRIPTION);
        let mut body = &t.body()[2..];
        assert_eq!(read_cstr(&mut body).unwrap(), "database");
        assert_eq!(&body[6..10], &TEXT_OID.to_be_bytes());
        let d = decode_frame(&mut out, 1 << 20).unwrap().unwrap();
        assert_eq!(d.tag, tag::DATA_ROW);
        assert_eq!(d.body(), b"\x00\x03\x00\x00\x00\x03app\x00\x00\x00\x013\x00\x00\x00\x050.500");
        let d2 = decode_frame(&mut out, 1 << 20).unwrap().unwrap();
        assert_eq!(&d2.body()[2..6], &(-1i32).to_be_bytes(), "NULL");
        let c = decode_frame(&mut out, 1 << 20).unwrap().unwrap();
        assert_eq!((c.tag, c.body()), (tag::COMMAND_COMPLETE, &b"SHOW\0"[..]));
        assert!(out.is_empty());
        assert_eq!(rs.column("rate"), Some(2));
    }
}
