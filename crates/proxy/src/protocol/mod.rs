//! The PostgreSQL v3 wire protocol as weir needs it, with no I/O: tag and
//! SQLSTATE constants, header-peeking framing, the startup packet, the
//! handful of messages weir writes itself, replication connections'
//! startup parameter and message boundaries, and statement fingerprints.

pub(crate) mod extended;
pub mod fingerprint;
pub(crate) mod frame;
pub mod messages;
pub(crate) mod replication;
pub mod sqlstate;
pub(crate) mod startup;
pub mod tags;

pub use frame::{decode_frame, peek_header, scan_frames, Frame, HEADER_LEN};
pub use sqlstate::SqlState;

/// Malformed input from a peer.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    #[error("invalid message length {len} for message type {tag}")]
    BadLength { tag: u8, len: i64 },
    #[error("message of type {tag} is {len} bytes, over the limit of {max}")]
    TooLong { tag: u8, len: usize, max: usize },
    #[error("message is truncated")]
    Truncated,
    #[error("string is not NUL-terminated")]
    Unterminated,
    #[error("string is not valid UTF-8")]
    BadUtf8,
    #[error("unexpected bytes after the end of a message")]
    TrailingBytes,
    #[error("unexpected message type {0:#04x}")]
    UnexpectedTag(u8),
}

impl ProtocolError {
    /// Every malformed input is a protocol violation, as Postgres reports an
    /// over-long message or startup packet ("invalid message length").
    pub fn sqlstate(&self) -> SqlState {
        sqlstate::PROTOCOL_VIOLATION
    }
}
