//! Async framing over a socket: read whole frames into a reusable buffer.
//! The only I/O glue between sockets and the `protocol` module. Also the
//! spare read buffers that idle clients hand back.

use std::cell::RefCell;

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

/// How much a read buffer grows by when less than half of that is spare,
/// and the size of a spare buffer.
const READ_CHUNK: usize = 8192;

/// Spare buffers kept per thread (512 KiB at most).
const SPARE_BUFFERS: usize = 64;

thread_local! {
    /// Read buffers idle clients gave back, for the next request on this
    /// thread (weir runs one thread by default). An idle client holds no
    /// buffer, 8 KiB each over thousands of idle clients, and a busy one
    /// takes a warm one here instead of allocating one per transaction.
    static SPARE: RefCell<Vec<BytesMut>> = const { RefCell::new(Vec::new()) };
}

/// An empty read buffer with room for 8 KiB, from the spares if any.
pub fn take_buffer() -> BytesMut {
    SPARE.with_borrow_mut(|s| s.pop()).unwrap_or_else(|| BytesMut::with_capacity(READ_CHUNK))
}

/// The largest buffer kept as a spare: one that grew for a big message
/// is freed rather than held on to.
const SPARE_MAX: usize = 64 * 1024;

/// Keeps `buf` (its contents dropped) for `take_buffer` if it can hold
/// 8 KiB without allocating (it shares its memory with no bytes still in
/// use elsewhere), is not over `SPARE_MAX`, and fewer than
/// `SPARE_BUFFERS` are kept; else frees it.
pub fn give_buffer(mut buf: BytesMut) {
    buf.clear();
    if buf.try_reclaim(READ_CHUNK) && buf.capacity() <= SPARE_MAX {
        SPARE.with_borrow_mut(|s| {
            if s.len() < SPARE_BUFFERS {
                s.push(buf);
            }
        });
    }
}

/// The same for a client's login, whose few short messages (startup,
/// password, SASL) fit in far less: its buffer stays a small allocation.
pub const LOGIN_READ_CHUNK: usize = 1024;

/// Reads more bytes into `buf`; EOF is an error.
pub async fn fill<R: AsyncRead + Unpin>(r: &mut R, buf: &mut BytesMut) -> Result<usize, WireError> {
    fill_by(r, buf, READ_CHUNK).await
}

/// Makes room in `buf` for a `fill`'s read.
pub fn make_room(buf: &mut BytesMut) {
    make_room_by(buf, READ_CHUNK);
}

fn make_room_by(buf: &mut BytesMut, chunk: usize) {
    if buf.capacity() - buf.len() < chunk / 2 {
        buf.reserve(chunk);
    }
}

/// `fill`, growing `buf` by `chunk` at a time.
async fn fill_by<R: AsyncRead + Unpin>(r: &mut R, buf: &mut BytesMut, chunk: usize) -> Result<usize, WireError> {
    make_room_by(buf, chunk);
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spare_buffers_come_back_only_when_whole() {
        let mut a = take_buffer();
        a.extend_from_slice(&[1; 100]);
        let ptr = a.as_ptr();
        give_buffer(a);
        let b = take_buffer();
        assert!(b.is_empty() && b.capacity() >= READ_CHUNK);
        assert_eq!(b.as_ptr(), ptr, "the same memory, reused");
        let mut c = b;
        c.extend_from_slice(&[2; 10]);
        let held = c.split_to(5).freeze();
        give_buffer(c);
        let d = take_buffer();
        assert_ne!(d.as_ptr(), ptr, "memory still shared with `held` is not kept");
        assert_eq!(&held[..], &[2; 5]);
        let mut big = take_buffer();
        big.reserve(SPARE_MAX * 2);
        give_buffer(big);
        assert!(take_buffer().capacity() <= SPARE_MAX, "a buffer grown past SPARE_MAX is freed, not kept");
    }
}
