//! The bytes between a replication client and its own server, both ways at
//! once, forwarded untouched: CopyBoth streams, replication commands, and
//! SQL on a logical walsender alike. Each direction has one fixed buffer
//! (`CHUNK`), read into only once what it held has been written: a side
//! that does not read holds the other side's reads back through TCP (so
//! a stream of any size passes in bounded memory). Message boundaries are
//! followed from the headers (`Boundaries`), so that weir's own last words
//! (a FATAL on KILL, or when the server vanished without one) and a
//! Terminate for a vanished client land between two messages, never inside
//! one. Polled by hand, in one task: each side's read and write wakers are
//! the task's own.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};

use crate::protocol::replication::Boundaries;

/// Each direction's buffer: as much as one read or write moves.
pub(super) const CHUNK: usize = 64 * 1024;

/// How long weir lets the server's current message reach the client before
/// its own FATAL (KILL, a drain): past it the client's socket just closes.
const FINISH_LIMIT: Duration = Duration::from_secs(1);

/// One direction: what was read from one side and not yet written to the
/// other, and where the bytes written so far leave the message stream.
pub(super) struct Pipe {
    buf: Box<[u8]>,
    start: usize,
    end: usize,
    /// Fed with the bytes as they are written.
    pub(super) marks: Boundaries,
    /// Bytes written since the last flush.
    unflushed: bool,
    /// Bytes passed, for the pool's traffic counters.
    pub(super) passed: u64,
}

/// Why a pipe stopped.
pub(super) enum Stop {
    /// Its source ended (EOF) or failed.
    SourceGone,
    /// Its destination failed.
    DestinationGone,
    /// Its source sent a header whose length is below 4.
    Garbled,
}

impl Pipe {
    /// A pipe holding `first` (bytes already read from the source; more
    /// than `CHUNK` make its buffer that much larger).
    pub(super) fn new(first: &[u8]) -> Pipe {
        let mut buf = vec![0u8; CHUNK.max(first.len())].into_boxed_slice();
        buf[..first.len()].copy_from_slice(first);
        Pipe { buf, start: 0, end: first.len(), marks: Boundaries::default(), unflushed: false, passed: 0 }
    }

    fn is_empty(&self) -> bool {
        self.start == self.end
    }

    /// Moves bytes on: writes what the buffer holds, else reads. Ready(Ok)
    /// when something moved (poll again), Pending when both wait.
    pub(super) fn poll_move<R, W>(&mut self, cx: &mut Context<'_>, src: &mut R, dst: &mut W) -> Poll<Result<(), Stop>>
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        if !self.is_empty() {
            let n = match Pin::new(&mut *dst).poll_write(cx, &self.buf[self.start..self.end]) {
                Poll::Ready(Ok(0)) | Poll::Ready(Err(_)) => return Poll::Ready(Err(Stop::DestinationGone)),
                Poll::Ready(Ok(n)) => n,
                Poll::Pending => return Poll::Pending,
            };
            if !self.marks.feed(&self.buf[self.start..self.start + n]) {
                return Poll::Ready(Err(Stop::Garbled));
            }
            self.start += n;
            self.passed += n as u64;
            self.unflushed = true;
            return Poll::Ready(Ok(()));
        }
        if self.unflushed {
            match Pin::new(&mut *dst).poll_flush(cx) {
                Poll::Ready(Ok(())) => self.unflushed = false,
                Poll::Ready(Err(_)) => return Poll::Ready(Err(Stop::DestinationGone)),
                Poll::Pending => return Poll::Pending,
            }
        }
        self.start = 0;
        self.end = 0;
        let mut read = ReadBuf::new(&mut self.buf);
        match Pin::new(&mut *src).poll_read(cx, &mut read) {
            Poll::Ready(Ok(())) if read.filled().is_empty() => Poll::Ready(Err(Stop::SourceGone)),
            Poll::Ready(Ok(())) => {
                self.end = read.filled().len();
                Poll::Ready(Ok(()))
            }
            Poll::Ready(Err(_)) => Poll::Ready(Err(Stop::SourceGone)),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Writes the rest of the message under way (reading more of it from
    /// `src` if the buffer ends first), within `FINISH_LIMIT`, so that
    /// another message may follow. True once at a boundary.
    pub(super) async fn finish_message<R, W>(&mut self, src: &mut R, dst: &mut W) -> bool
    where
        R: AsyncRead + Unpin,
        W: AsyncWrite + Unpin,
    {
        let finish = async {
            loop {
                let held = &self.buf[self.start..self.end];
                let (upto, done) = match self.marks.to_boundary(held) {
                    Some(n) => (n, true),
                    None => (held.len(), false),
                };
                if dst.write_all(&held[..upto]).await.is_err() {
                    return false;
                }
                self.marks.feed(&held[..upto]);
                self.start += upto;
                if done {
                    return dst.flush().await.is_ok();
                }
                self.start = 0;
                self.end = 0;
                match tokio::io::AsyncReadExt::read(src, &mut self.buf).await {
                    Ok(0) | Err(_) => return false,
                    Ok(n) => self.end = n,
                }
            }
        };
        tokio::time::timeout(FINISH_LIMIT, finish).await.unwrap_or(false)
    }
}

/// Runs `poll_one` until it is Ready, polling it again after each step that
/// moved bytes: a plain poll function, with no state of its own.
pub(super) fn run_until<T>(mut poll_one: impl FnMut(&mut Context<'_>) -> Poll<Option<T>>) -> impl Future<Output = T> {
    std::future::poll_fn(move |cx| loop {
        match poll_one(cx) {
            Poll::Ready(Some(t)) => return Poll::Ready(t),
            Poll::Ready(None) => continue,
            Poll::Pending => return Poll::Pending,
        }
    })
}

/// Writes `bytes` whole within `limit`; false if it could not.
pub(super) async fn write_within<W: AsyncWrite + Unpin>(dst: &mut W, bytes: &[u8], limit: Duration) -> bool {
    let write = async {
        dst.write_all(bytes).await?;
        dst.flush().await
    };
    matches!(tokio::time::timeout(limit, write).await, Ok(Ok(())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    fn msg(tag: u8, body: &[u8]) -> Vec<u8> {
        let mut m = vec![tag];
        m.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
        m.extend_from_slice(body);
        m
    }

    /// A stream far larger than the buffer passes whole, in order, and the
    /// pipe knows it ended between messages.
    #[tokio::test]
    async fn passes_a_large_stream_through_one_chunk() {
        let (mut src_w, mut src_r) = tokio::io::duplex(4096);
        let (mut dst_w, mut dst_r) = tokio::io::duplex(4096);
        let mut stream = Vec::new();
        for i in 0..2000u32 {
            stream.extend(msg(b'd', &vec![(i % 251) as u8; (i as usize * 37) % 3000]));
        }
        let expected = stream.clone();
        let writer = tokio::spawn(async move {
            src_w.write_all(&stream).await.unwrap();
        });
        let reader = tokio::spawn(async move {
            let mut got = Vec::new();
            dst_r.read_to_end(&mut got).await.unwrap();
            got
        });
        let mut pipe = Pipe::new(&[]);
        let stop = run_until(|cx| match pipe.poll_move(cx, &mut src_r, &mut dst_w) {
            Poll::Ready(Ok(())) => Poll::Ready(None),
            Poll::Ready(Err(s)) => Poll::Ready(Some(s)),
            Poll::Pending => Poll::Pending,
        })
        .await;
        assert!(matches!(stop, Stop::SourceGone));
        assert!(pipe.marks.at_boundary());
        assert_eq!(pipe.passed, expected.len() as u64);
        writer.await.unwrap();
        drop(dst_w);
        assert_eq!(reader.await.unwrap(), expected);
    }

    /// Cut inside a message, `finish_message` completes that message (from
    /// the buffer and the source) and stops there.
    #[tokio::test]
    async fn finishes_the_message_under_way_and_no_more() {
        let first = msg(b'd', &[1u8; 100]);
        let second = msg(b'd', &[2u8; 10]);
        let mut pipe = Pipe::new(&first[..30]);
        let (mut src_w, mut src_r) = tokio::io::duplex(4096);
        src_w.write_all(&first[30..]).await.unwrap();
        src_w.write_all(&second).await.unwrap();
        let mut out = Vec::new();
        // Write what the buffer holds, as the relay would have.
        let (mut dst_w, mut dst_r) = tokio::io::duplex(1 << 16);
        let moved = std::future::poll_fn(|cx| pipe.poll_move(cx, &mut src_r, &mut dst_w)).await;
        assert!(moved.is_ok());
        assert!(!pipe.marks.at_boundary());
        assert!(pipe.finish_message(&mut src_r, &mut dst_w).await);
        drop(dst_w);
        dst_r.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, first, "the first message whole, the second not begun");
        assert!(pipe.marks.at_boundary());
    }
}
