//! A client's connection: plain TCP, a Unix-domain socket, or TLS (rustls,
//! over TCP only, as Postgres), and how it is closed (after a FATAL, or after
//! a client that left mid-query). The plain cases keep their sockets'
//! zero-cost halves on the hot path (see `client::transfer`); TLS goes through
//! `tokio::io::split`. rustls may keep records of a write
//! when the socket is full; every TLS read flushes them first, and every
//! exchange with a client ends in a read, so nothing is left unsent.

use std::future::Future;
use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::server::TlsStream;
use weir_metrics::ConnAddr;

use crate::protocol::messages::{self, Severity};

/// A client's byte stream.
pub enum ClientStream {
    Plain(TcpStream),
    /// A client on weir's Unix socket (never TLS, as in Postgres); boxed so
    /// that the enum, which every client task holds, stays TcpStream's size.
    Unix(Box<UnixStream>),
    Tls(Box<TlsStream<TcpStream>>),
    /// Only while a TLS handshake owns the socket; it failed if still here.
    Closed,
}

fn closed() -> io::Error {
    io::Error::new(io::ErrorKind::NotConnected, "client stream closed")
}

impl ClientStream {
    pub fn is_tls(&self) -> bool {
        matches!(self, ClientStream::Tls(_))
    }

    /// A client on weir's Unix socket.
    pub fn is_unix(&self) -> bool {
        matches!(self, ClientStream::Unix(_))
    }

    /// The OS user id of a Unix-socket client's process (its socket's peer
    /// credentials); None over TCP or when the OS does not say.
    pub fn peer_uid(&self) -> Option<u32> {
        match self {
            ClientStream::Unix(s) => s.peer_cred().ok().map(|c| c.uid()),
            _ => None,
        }
    }

    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            ClientStream::Plain(s) => Some(s),
            ClientStream::Tls(s) => Some(s.get_ref().0),
            ClientStream::Unix(_) | ClientStream::Closed => None,
        }
    }

    /// weir's end: the TCP address, or for a Unix-socket client the same
    /// `unix` address as its peer's (PgBouncer shows both so).
    pub fn local_addr(&self, peer: &ConnAddr) -> Option<ConnAddr> {
        match self {
            ClientStream::Unix(_) => Some(*peer),
            _ => self.tcp().and_then(|s| s.local_addr().ok()).map(ConnAddr::Tcp),
        }
    }

    /// The ALPN protocol the TLS client negotiated.
    pub fn alpn(&self) -> Option<Vec<u8>> {
        match self {
            ClientStream::Tls(s) => s.get_ref().1.alpn_protocol().map(<[u8]>::to_vec),
            _ => None,
        }
    }

    /// Runs the TLS handshake on a plain stream and becomes the TLS stream.
    pub async fn upgrade(&mut self, acceptor: &tokio_rustls::TlsAcceptor) -> io::Result<()> {
        let ClientStream::Plain(tcp) = std::mem::replace(self, ClientStream::Closed) else {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "TLS requested twice"));
        };
        let tls = acceptor.accept(tcp).await?;
        *self = ClientStream::Tls(Box::new(tls));
        Ok(())
    }

    /// Ready when a read may make progress. For TLS this is at once:
    /// rustls may hold decrypted bytes the socket's readiness does not show,
    /// so the caller's read is what waits. A poll function rather than a
    /// future: an idle client's task waits here, and tokio's `readable()`
    /// future would add its waiter node (over 100 bytes) to every idle
    /// client. The socket's read waker is the task's own (no other task
    /// reads this socket).
    pub fn poll_read_ready(&self, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self {
            ClientStream::Plain(s) => s.poll_read_ready(cx),
            ClientStream::Unix(s) => s.poll_read_ready(cx),
            ClientStream::Tls(_) => Poll::Ready(Ok(())),
            ClientStream::Closed => Poll::Ready(Err(closed())),
        }
    }

    /// Reads what is there without waiting (`WouldBlock` if nothing is).
    /// For TLS: one poll of the TLS reader, which sees EOF and close_notify.
    pub fn try_read_buf(&mut self, buf: &mut BytesMut) -> io::Result<usize> {
        match self {
            ClientStream::Plain(s) => s.try_read_buf(buf),
            ClientStream::Unix(s) => s.try_read_buf(buf),
            ClientStream::Tls(s) => {
                let mut cx = Context::from_waker(std::task::Waker::noop());
                let read = s.read_buf(buf);
                match std::pin::pin!(read).poll(&mut cx) {
                    Poll::Ready(r) => r,
                    Poll::Pending => Err(io::ErrorKind::WouldBlock.into()),
                }
            }
            ClientStream::Closed => Err(closed()),
        }
    }
}

impl AsyncRead for ClientStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ClientStream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            ClientStream::Tls(s) => {
                // Records a write left in rustls (the socket was full) go
                // out before weir waits for the client's answer to them.
                let _ = Pin::new(s.as_mut()).poll_flush(cx);
                Pin::new(s.as_mut()).poll_read(cx, buf)
            }
            ClientStream::Closed => Poll::Ready(Err(closed())),
        }
    }
}

impl AsyncWrite for ClientStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ClientStream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
            ClientStream::Closed => Poll::Ready(Err(closed())),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_flush(cx),
            ClientStream::Unix(s) => Pin::new(s).poll_flush(cx),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
            ClientStream::Closed => Poll::Ready(Err(closed())),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ClientStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ClientStream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            ClientStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
            ClientStream::Closed => Poll::Ready(Ok(())),
        }
    }
}

/// How long a refused client's unread bytes are drained after its FATAL.
const ERROR_LINGER: Duration = Duration::from_millis(500);

/// How long weir tries to hand a client its FATAL (and its close) when the
/// client does not read, its socket full: then the connection is dropped
/// without them.
const GOODBYE_LIMIT: Duration = Duration::from_secs(5);

/// Closes after a FATAL without losing it to a reset: closing a socket with
/// unread input sends RST, which can discard the error before the client
/// reads it. So FIN first, then read and drop what the client still sends
/// until it closes too (or briefly).
pub(crate) async fn close_after_error(socket: &mut ClientStream) {
    if tokio::time::timeout(GOODBYE_LIMIT, socket.shutdown()).await.is_ok() {
        drain(socket, &mut [0u8; 4096], ERROR_LINGER).await;
    }
}

/// How long a client that left mid-query is given to close its end first.
const CLIENT_CLOSE_LINGER: Duration = Duration::from_secs(1);

/// After a client left mid-query (Terminate, or EOF): waits, briefly, for
/// its own close, unless the server answers first (see the session's
/// `left_mid_query`). Postgres reads a Terminate only once the running
/// query is done, so a client that sends Terminate and then closes (libpq's
/// PQfinish) never sees the server's FIN in between; one from weir would
/// wake a wait on the socket that the client is closing (psycopg then
/// reports "connection pointer is NULL" instead of "connection socket
/// closed"). Bytes still sent are dropped. Cancel-safe (reads only).
pub(crate) async fn await_client_close(socket: &mut ClientStream) {
    drain(socket, &mut [0u8; 1024], CLIENT_CLOSE_LINGER).await;
}

/// Reads and drops what the client sends until it closes, or `linger` passes.
async fn drain(socket: &mut ClientStream, sink: &mut [u8], linger: Duration) {
    let drain = async {
        while let Ok(n) = socket.read(sink).await {
            if n == 0 {
                break;
            }
        }
    };
    let _ = tokio::time::timeout(linger, drain).await;
}

/// Sends a FATAL and closes (see `close_after_error`); a client that does
/// not take the FATAL within `GOODBYE_LIMIT` is closed without it.
pub(crate) async fn fatal_and_close(socket: &mut ClientStream, code: crate::protocol::SqlState, message: &str) {
    fatal_detail_and_close(socket, code, message, None).await;
}

/// `fatal_and_close` with a DETAIL, if given.
pub(crate) async fn fatal_detail_and_close(
    socket: &mut ClientStream,
    code: crate::protocol::SqlState,
    message: &str,
    detail: Option<&str>,
) {
    let mut out = BytesMut::new();
    messages::error_response_detail(&mut out, Severity::Fatal, code, message, detail);
    if let Ok(Ok(())) = tokio::time::timeout(GOODBYE_LIMIT, socket.write_all(&out)).await {
        close_after_error(socket).await;
    }
}
