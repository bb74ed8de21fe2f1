//! Async framing over a socket: read whole frames into a reusable buffer.
//! The only I/O glue between sockets and the `protocol` module.

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt};

use crate::protocol::{self, Frame, ProtocolError};

/// Why a frame could not be read.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    #[error("connection closed")]
    Eof,
    #[error("i/o error: {0}")]
    Io(#[from] std::io::Error),
    #[error(transparent)]
    Protocol(#[from] ProtocolError),
}

/// Reads more bytes into `buf`; EOF is an error.
pub async fn fill<R: AsyncRead + Unpin>(r: &mut R, buf: &mut BytesMut) -> Result<usize, WireError> {
    if buf.capacity() - buf.len() < 4096 {
        buf.reserve(8192);
    }
    match r.read_buf(buf).await? {
        0 => Err(WireError::Eof),
        n => Ok(n),
    }
}

/// Reads one whole tagged frame. Bytes past it stay in `buf` for the next call.
/// Cancel-safe: a cancelled call leaves any bytes read so far in `buf`.
pub async fn read_frame<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
    max_len: usize,
) -> Result<Frame, WireError> {
    loop {
        if let Some(frame) = protocol::decode_frame(buf, max_len)? {
            return Ok(frame);
        }
        fill(r, buf).await?;
    }
}

/// Reads one untagged startup-phase packet (length prefix included).
/// Cancel-safe in the same way as `read_frame`.
pub async fn read_startup_packet<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
) -> Result<bytes::Bytes, WireError> {
    loop {
        if let Some(len) = protocol::startup::peek_len(buf)? {
            if buf.len() >= len {
                return Ok(buf.split_to(len).freeze());
            }
        }
        fill(r, buf).await?;
    }
}
