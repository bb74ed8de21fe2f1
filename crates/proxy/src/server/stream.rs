//! A server connection's byte stream: plain TCP, Postgres's Unix socket
//! (a database `host` that starts with `/`; never TLS, as libpq), or TLS
//! (rustls, weir as the TLS client). `split()` gives the socket's own
//! zero-cost halves for plain connections; TLS halves go through
//! `tokio::io::split`. rustls may keep records of a write when the socket is
//! full; every TLS read flushes them first, and every exchange with a server
//! ends in a read, so nothing is left unsent.

use std::io;
use std::pin::Pin;
use std::task::{Context, Poll};

use socket2::SockRef;
use tokio::io::{AsyncRead, AsyncWrite, Interest, ReadBuf, ReadHalf, WriteHalf};
use tokio::net::{tcp, unix};
use tokio::net::{TcpStream, UnixStream};
use tokio_rustls::client::TlsStream;

/// A server connection's stream.
#[derive(Debug)]
pub enum ServerStream {
    Plain(TcpStream),
    Unix(UnixStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl ServerStream {
    /// The TCP socket underneath (addresses); None over a Unix socket.
    pub fn tcp(&self) -> Option<&TcpStream> {
        match self {
            ServerStream::Plain(s) => Some(s),
            ServerStream::Tls(s) => Some(s.get_ref().0),
            ServerStream::Unix(_) => None,
        }
    }

    /// Whether unread bytes or EOF wait on the socket, by a non-blocking
    /// MSG_PEEK once the reactor says it is readable (see
    /// `ServerConn::has_unexpected_input`).
    pub fn peek_ready(&self) -> bool {
        let mut probe = [std::mem::MaybeUninit::<u8>::uninit(); 1];
        let found = match (self, self.tcp()) {
            (ServerStream::Unix(s), _) => s.try_io(Interest::READABLE, || SockRef::from(s).peek(&mut probe)),
            (_, Some(s)) => s.try_io(Interest::READABLE, || SockRef::from(s).peek(&mut probe)),
            (_, None) => return true,
        };
        match found {
            Ok(_) => true, // data or EOF
            Err(e) => e.kind() != io::ErrorKind::WouldBlock,
        }
    }

    pub fn is_tls(&self) -> bool {
        matches!(self, ServerStream::Tls(_))
    }

    /// Read and write halves for the forwarding loop.
    pub fn split(&mut self) -> (ServerReader<'_>, ServerWriter<'_>) {
        match self {
            ServerStream::Plain(s) => {
                let (r, w) = s.split();
                (ServerReader::Plain(r), ServerWriter::Plain(w))
            }
            ServerStream::Unix(s) => {
                let (r, w) = s.split();
                (ServerReader::Unix(r), ServerWriter::Unix(w))
            }
            tls => {
                let (r, w) = tokio::io::split(tls);
                (ServerReader::Tls(r), ServerWriter::Tls(w))
            }
        }
    }
}

impl AsyncRead for ServerStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ServerStream::Unix(s) => Pin::new(s).poll_read(cx, buf),
            ServerStream::Tls(s) => {
                let _ = Pin::new(s.as_mut()).poll_flush(cx);
                Pin::new(s.as_mut()).poll_read(cx, buf)
            }
        }
    }
}

impl AsyncWrite for ServerStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ServerStream::Unix(s) => Pin::new(s).poll_write(cx, buf),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_flush(cx),
            ServerStream::Unix(s) => Pin::new(s).poll_flush(cx),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerStream::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ServerStream::Unix(s) => Pin::new(s).poll_shutdown(cx),
            ServerStream::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The read half of a server stream.
pub enum ServerReader<'a> {
    Plain(tcp::ReadHalf<'a>),
    Unix(unix::ReadHalf<'a>),
    Tls(ReadHalf<&'a mut ServerStream>),
}

/// The write half of a server stream.
pub enum ServerWriter<'a> {
    Plain(tcp::WriteHalf<'a>),
    Unix(unix::WriteHalf<'a>),
    Tls(WriteHalf<&'a mut ServerStream>),
}

impl AsyncRead for ServerReader<'_> {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerReader::Plain(r) => Pin::new(r).poll_read(cx, buf),
            ServerReader::Unix(r) => Pin::new(r).poll_read(cx, buf),
            ServerReader::Tls(r) => Pin::new(r).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ServerWriter<'_> {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            ServerWriter::Plain(w) => Pin::new(w).poll_write(cx, buf),
            ServerWriter::Unix(w) => Pin::new(w).poll_write(cx, buf),
            ServerWriter::Tls(w) => Pin::new(w).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerWriter::Plain(w) => Pin::new(w).poll_flush(cx),
            ServerWriter::Unix(w) => Pin::new(w).poll_flush(cx),
            ServerWriter::Tls(w) => Pin::new(w).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            ServerWriter::Plain(w) => Pin::new(w).poll_shutdown(cx),
            ServerWriter::Unix(w) => Pin::new(w).poll_shutdown(cx),
            ServerWriter::Tls(w) => Pin::new(w).poll_shutdown(cx),
        }
    }
}
