//! Raw bytes at weir for the hostile-input tests: a socket that sends
//! whatever it is given and reads back what weir answers before it closes
//! (an ErrorResponse, then EOF), and the byte builders for malformed packets.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weir::protocol::messages::{self, ErrorFields};
use weir::protocol::tags::{backend as be, startup as code};
use weir::wire::{self, WireError};

/// How long weir may take to answer or close.
pub const ANSWER_LIMIT: Duration = Duration::from_secs(10);

/// What weir did with a hostile connection.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A FATAL ErrorResponse with this SQLSTATE, then EOF.
    Fatal(String, String),
    /// EOF (or a reset) with nothing said: the client had already left.
    Closed,
}

impl Outcome {
    pub fn code(&self) -> &str {
        match self {
            Outcome::Fatal(c, _) => c,
            Outcome::Closed => "(closed)",
        }
    }
}

pub struct Hostile {
    pub s: TcpStream,
    pub buf: BytesMut,
}

impl Hostile {
    pub async fn connect(addr: SocketAddr) -> Hostile {
        let s = TcpStream::connect(addr).await.expect("connect to weir");
        let _ = s.set_nodelay(true);
        Hostile { s, buf: BytesMut::new() }
    }

    /// Sends bytes; weir may already have closed, which is not an error here.
    pub async fn send(&mut self, bytes: &[u8]) {
        let _ = self.s.write_all(bytes).await;
    }

    /// The next message, or None at EOF or reset.
    pub async fn next(&mut self) -> Option<(u8, Bytes)> {
        let read = wire::read_frame(&mut self.s, &mut self.buf, 1 << 20);
        match tokio::time::timeout(ANSWER_LIMIT, read).await.expect("weir answered or closed in time") {
            Ok(f) => Some((f.tag, f.bytes.slice(weir::protocol::HEADER_LEN..))),
            Err(WireError::Eof | WireError::Io(_)) => None,
            Err(e) => panic!("weir sent a malformed message: {e}"),
        }
    }

    /// Reads until weir closes: its FATAL (which must be the last thing it
    /// sends) or a silent close. Other messages before it are skipped.
    pub async fn outcome(&mut self) -> Outcome {
        loop {
            let Some((tag, body)) = self.next().await else { return Outcome::Closed };
            if tag == be::ERROR_RESPONSE {
                let f: ErrorFields = messages::parse_error_fields(&body).expect("a well-formed ErrorResponse");
                assert_eq!(f.severity, "FATAL", "{f:?}");
                assert!(self.next().await.is_none(), "the socket closes after the FATAL ({f:?})");
                return Outcome::Fatal(f.code.clone(), f.message_text());
            }
        }
    }

    /// Reads the next message, which must be an authentication request;
    /// returns its code and payload.
    pub async fn auth_request(&mut self) -> (i32, Bytes) {
        let (tag, body) = self.next().await.expect("an authentication request");
        assert_eq!(tag, be::AUTHENTICATION, "{:?}", messages::parse_error_fields(&body));
        (i32::from_be_bytes(body[..4].try_into().unwrap()), body.slice(4..))
    }

    /// Half-closes (FIN) and then reads what weir does.
    pub async fn eof_then_outcome(mut self) -> Outcome {
        let _ = self.s.shutdown().await;
        self.outcome().await
    }

    /// True once weir has closed the socket (reads EOF within the limit).
    pub async fn closed_by_weir(&mut self) -> bool {
        let mut sink = [0u8; 4096];
        let wait = async {
            loop {
                match self.s.read(&mut sink).await {
                    Ok(0) | Err(_) => return true,
                    Ok(_) => {}
                }
            }
        };
        tokio::time::timeout(ANSWER_LIMIT, wait).await.unwrap_or(false)
    }
}

/// Sends `bytes` on a new connection and returns what weir answered.
pub async fn answer(addr: SocketAddr, bytes: &[u8]) -> Outcome {
    let mut c = Hostile::connect(addr).await;
    c.send(bytes).await;
    c.outcome().await
}

/// An untagged packet: its length (or `len` when given, to lie) and body.
pub fn untagged(len: Option<i32>, version: i32, body: &[u8]) -> Vec<u8> {
    let real = (body.len() + 8) as i32;
    let mut p = len.unwrap_or(real).to_be_bytes().to_vec();
    p.extend_from_slice(&version.to_be_bytes());
    p.extend_from_slice(body);
    p
}

/// A v3.0 StartupMessage with these raw body bytes (pairs must be encoded by the caller).
pub fn startup_body(body: &[u8]) -> Vec<u8> {
    untagged(None, code::PROTOCOL_3_0, body)
}

/// A well-formed StartupMessage.
pub fn startup(params: &[(&str, &str)]) -> Vec<u8> {
    let mut buf = BytesMut::new();
    messages::startup_message(&mut buf, code::PROTOCOL_3_0, params);
    buf.to_vec()
}

/// A tagged message with the true length.
pub fn tagged(tag: u8, body: &[u8]) -> Vec<u8> {
    header(tag, (body.len() + 4) as i32).into_iter().chain(body.iter().copied()).collect()
}

/// A 5-byte header claiming `len` (which counts itself, not the tag).
pub fn header(tag: u8, len: i32) -> Vec<u8> {
    let mut m = vec![tag];
    m.extend_from_slice(&len.to_be_bytes());
    m
}
