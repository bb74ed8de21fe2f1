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

/// How much a read buffer grows by when less than half of that is spare.
const READ_CHUNK: usize = 8192;

/// The same for a client's login, whose few short messages (startup,
/// password, SASL) fit in far less: its buffer stays a small allocation.
pub const LOGIN_READ_CHUNK: usize = 1024;

/// Reads more bytes into `buf`; EOF is an error.
pub async fn fill<R: AsyncRead + Unpin>(r: &mut R, buf: &mut BytesMut) -> Result<usize, WireError> {
    fill_by(r, buf, READ_CHUNK).await
}

/// `fill`, growing `buf` by `chunk` at a time.
async fn fill_by<R: AsyncRead + Unpin>(r: &mut R, buf: &mut BytesMut, chunk: usize) -> Result<usize, WireError> {
    if buf.capacity() - buf.len() < chunk / 2 {
        buf.reserve(chunk);
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
    read_frame_by(r, buf, max_len, READ_CHUNK).await
}

/// `read_frame`, growing `buf` by `chunk` at a time (`LOGIN_READ_CHUNK`).
pub async fn read_frame_by<R: AsyncRead + Unpin>(
    r: &mut R,
    buf: &mut BytesMut,
    max_len: usize,
    chunk: usize,
) -> Result<Frame, WireError> {
    loop {
        if let Some(frame) = protocol::decode_frame(buf, max_len)? {
            return Ok(frame);
        }
        fill_by(r, buf, chunk).await?;
    }
}

/// Reads one untagged startup-phase packet (length prefix included), in
/// `LOGIN_READ_CHUNK`s. Cancel-safe in the same way as `read_frame`.
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
        fill_by(r, buf, LOGIN_READ_CHUNK).await?;
    }
}
