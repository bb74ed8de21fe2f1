//! The one raw wire client of the end-to-end tests, for what drivers are too
//! polite to do: malformed packets, abrupt departures (RST, Terminate,
//! pgx's cancel-then-Terminate), pipelining, CancelRequest, TLS sessions
//! driven by hand. Generic over the stream (plain TCP or a TLS stream).
//!
//! Packets are built with weir's own `protocol::messages` where a
//! well-formed one is wanted, and by the byte builders here (`untagged`,
//! `tagged`, `header`) where a test lies about lengths; frames are read with
//! `weir::wire::read_frame`.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use weir::protocol::messages::{self, ErrorFields};
use weir::protocol::tags::{auth, backend as be, frontend as fe, startup as code};
use weir::wire::{self, WireError};

/// How long one read waits for weir to answer or close, unless `with_limit` says otherwise.
pub const ANSWER_LIMIT: Duration = Duration::from_secs(10);

/// The largest message a raw client accepts from weir.
const MAX_FRAME: usize = 1 << 20;

/// A raw step's failure, as text for the test's panic message.
pub type Result<T> = std::result::Result<T, String>;

/// A raw client logged in as `user` to `app` at `addr` where no password is
/// asked (`auth_type = "trust"`), with `extra` startup parameters.
pub async fn login(addr: SocketAddr, user: &str, extra: &[(&str, &str)]) -> Raw {
    Raw::login(addr, user, "", extra).await.expect("raw login")
}

/// What weir did with a connection it ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Outcome {
    /// A FATAL ErrorResponse with this SQLSTATE and message, then EOF.
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

/// What a simple query got back, up to its ReadyForQuery.
#[derive(Debug, Default)]
pub struct Reply {
    /// Text values of every DataRow (None for NULL).
    pub rows: Vec<Vec<Option<String>>>,
    /// SQLSTATE and message of the first ErrorResponse, if any.
    pub error: Option<(String, String)>,
    /// Status byte of the ReadyForQuery.
    pub status: u8,
}

impl Reply {
    /// The first column of the first row.
    pub fn scalar(&self) -> Option<&str> {
        self.rows.first()?.first()?.as_deref()
    }

    pub fn code(&self) -> Option<&str> {
        self.error.as_ref().map(|(c, _)| c.as_str())
    }
}

/// One raw connection to weir.
pub struct Raw<S = TcpStream> {
    pub s: S,
    buf: BytesMut,
    /// weir's BackendKeyData for this client, once logged in.
    pub key: Option<(i32, i32)>,
    limit: Duration,
}

impl Raw<TcpStream> {
    /// A new TCP connection to weir (TCP_NODELAY), nothing sent yet.
    pub async fn connect(addr: SocketAddr) -> Raw {
        let s = TcpStream::connect(addr).await.expect("connect to weir");
        let _ = s.set_nodelay(true);
        Raw::new(s)
    }

    /// Connects and logs in as `user` to database `app` (trust or cleartext
    /// password), returning once the first ReadyForQuery has come.
    pub async fn login(addr: SocketAddr, user: &str, password: &str, extra: &[(&str, &str)]) -> Result<Raw> {
        Raw::login_within(ANSWER_LIMIT, addr, user, password, extra).await
    }

    /// `login`, with each step (and each later read and write) bounded by `limit`.
    pub async fn login_within(
        limit: Duration,
        addr: SocketAddr,
        user: &str,
        password: &str,
        extra: &[(&str, &str)],
    ) -> Result<Raw> {
        let s = within(limit, "connect", TcpStream::connect(addr)).await?;
        let _ = s.set_nodelay(true);
        let mut raw = Raw::new(s).with_limit(limit);
        raw.start(user, password, extra).await?;
        Ok(raw)
    }

    /// Leaves with a TCP reset: SO_LINGER 0, then close.
    pub fn reset(self) {
        let _ = self.s.set_zero_linger();
        drop(self.s);
    }

    /// Leaves the way pgx does when a context expires: CancelRequest on a new
    /// socket, then Terminate, then close.
    pub async fn leave_like_pgx(self, addr: SocketAddr) -> Result<()> {
        cancel(addr, self.key()).await?;
        self.terminate().await;
        Ok(())
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
        tokio::time::timeout(self.limit, wait).await.unwrap_or(false)
    }
}

impl<S: AsyncRead + AsyncWrite + Unpin> Raw<S> {
    pub fn new(s: S) -> Raw<S> {
        Raw { s, buf: BytesMut::with_capacity(8192), key: None, limit: ANSWER_LIMIT }
    }

    /// How long each read (and write) may wait.
    pub fn with_limit(mut self, limit: Duration) -> Raw<S> {
        self.limit = limit;
        self
    }

    /// The BackendKeyData weir sent at login.
    pub fn key(&self) -> (i32, i32) {
        self.key.expect("BackendKeyData before ReadyForQuery")
    }

    /// Writes and flushes `bytes`.
    pub async fn send(&mut self, bytes: &[u8]) -> Result<()> {
        let s = &mut self.s;
        within(self.limit, "write", async move {
            s.write_all(bytes).await?;
            s.flush().await
        })
        .await
    }

    /// Sends bytes where weir may already have closed, which is not an error.
    pub async fn send_anyway(&mut self, bytes: &[u8]) {
        let _ = self.send(bytes).await;
    }

    /// One whole frame; panics if weir neither answers nor closes in time.
    async fn frame(&mut self) -> std::result::Result<(u8, Bytes), WireError> {
        let read = wire::read_frame(&mut self.s, &mut self.buf, MAX_FRAME);
        let f = tokio::time::timeout(self.limit, read).await.expect("weir answered or closed in time")?;
        Ok((f.tag, f.bytes.slice(weir::protocol::HEADER_LEN..)))
    }

    /// The next message, or None at EOF; any other failure panics.
    pub async fn next(&mut self) -> Option<(u8, Bytes)> {
        match self.frame().await {
            Ok(m) => Some(m),
            Err(WireError::Eof) => None,
            Err(e) => panic!("reading from weir: {e}"),
        }
    }

    /// The next message, or None at EOF or reset; a malformed message panics.
    pub async fn next_or_reset(&mut self) -> Option<(u8, Bytes)> {
        match self.frame().await {
            Ok(m) => Some(m),
            Err(WireError::Eof | WireError::Io(_)) => None,
            Err(e) => panic!("weir sent a malformed message: {e}"),
        }
    }

    /// Reads one whole message: (tag, body); EOF is an error.
    pub async fn read_msg(&mut self) -> Result<(u8, Bytes)> {
        let read = wire::read_frame(&mut self.s, &mut self.buf, MAX_FRAME);
        match tokio::time::timeout(self.limit, read).await {
            Ok(Ok(f)) => Ok((f.tag, f.bytes.slice(weir::protocol::HEADER_LEN..))),
            Ok(Err(WireError::Eof)) => Err("connection closed by weir".into()),
            Ok(Err(e)) => Err(format!("read: {e}")),
            Err(_) => Err(format!("read: no answer in {:?}", self.limit)),
        }
    }

    /// Sends a StartupMessage and logs in (trust, cleartext or md5 password),
    /// up to the first ReadyForQuery; keeps the BackendKeyData.
    pub async fn start(&mut self, user: &str, password: &str, extra: &[(&str, &str)]) -> Result<()> {
        let mut params = vec![("user", user), ("database", crate::APP_DB)];
        params.extend_from_slice(extra);
        self.send(&startup(&params)).await?;
        loop {
            let (tag, mut body) = self.read_msg().await?;
            match tag {
                be::AUTHENTICATION => match body.get_i32() {
                    auth::OK => {}
                    auth::CLEARTEXT_PASSWORD => {
                        self.send(&tagged(fe::PASSWORD, &[password.as_bytes(), b"\0"].concat())).await?
                    }
                    auth::MD5_PASSWORD => {
                        let salt: [u8; 4] = body[..4].try_into().map_err(|_| "short md5 salt".to_string())?;
                        let hash =
                            postgres_protocol::authentication::md5_hash(user.as_bytes(), password.as_bytes(), salt);
                        self.send(&tagged(fe::PASSWORD, &[hash.as_bytes(), b"\0"].concat())).await?
                    }
                    other => {
                        return Err(format!("raw client supports trust/cleartext/md5 only, got auth request {other}"))
                    }
                },
                be::BACKEND_KEY_DATA => self.key = Some((body.get_i32(), body.get_i32())),
                be::ERROR_RESPONSE => return Err(format!("login refused: {:?}", error_fields(&body))),
                be::READY_FOR_QUERY => return Ok(()),
                _ => {}
            }
        }
    }

    /// Reads the login answer up to ReadyForQuery (no password exchange);
    /// returns the tags seen and the ParameterStatus values.
    pub async fn expect_login_ok(&mut self) -> (Vec<u8>, Vec<(String, String)>) {
        let (mut tags, mut params) = (Vec::new(), Vec::new());
        loop {
            let (tag, body) = self.next().await.expect("login answer");
            assert_ne!(tag, be::ERROR_RESPONSE, "{:?}", messages::parse_error_fields(&body));
            tags.push(tag);
            if tag == be::PARAMETER_STATUS {
                let (k, v) = messages::parameter_status_text(&body).unwrap().expect("UTF-8 parameters");
                params.push((k.to_owned(), v.to_owned()));
            }
            if tag == be::BACKEND_KEY_DATA {
                let mut b = body.clone();
                self.key = Some((b.get_i32(), b.get_i32()));
            }
            if tag == be::READY_FOR_QUERY {
                return (tags, params);
            }
        }
    }

    /// Reads the next message, which must be an authentication request;
    /// returns its code and payload.
    pub async fn auth_request(&mut self) -> (i32, Bytes) {
        let (tag, body) = self.next_or_reset().await.expect("an authentication request");
        assert_eq!(tag, be::AUTHENTICATION, "{:?}", messages::parse_error_fields(&body));
        (i32::from_be_bytes(body[..4].try_into().unwrap()), body.slice(4..))
    }

    /// Reads until weir closes: its FATAL (which must be the last thing it
    /// sends) or a silent close (EOF or reset). Other messages before it are skipped.
    pub async fn outcome(&mut self) -> Outcome {
        loop {
            let Some((tag, body)) = self.next_or_reset().await else { return Outcome::Closed };
            if tag == be::ERROR_RESPONSE {
                let f: ErrorFields = messages::parse_error_fields(&body).expect("a well-formed ErrorResponse");
                assert_eq!(f.severity, "FATAL", "{f:?}");
                assert!(self.next_or_reset().await.is_none(), "the socket closes after the FATAL ({f:?})");
                return Outcome::Fatal(f.code.clone(), f.message_text());
            }
        }
    }

    /// Reads until an ErrorResponse, which must be FATAL and followed by EOF
    /// (a reset is a failure here).
    pub async fn expect_fatal(&mut self) -> ErrorFields {
        loop {
            let (tag, body) = self.next().await.expect("an ErrorResponse before EOF");
            if tag == be::ERROR_RESPONSE {
                let f = messages::parse_error_fields(&body).unwrap();
                assert_eq!(f.severity, "FATAL", "{f:?}");
                assert!(self.next().await.is_none(), "connection closed after the FATAL");
                return f;
            }
        }
    }

    /// Half-closes (FIN) and then reads what weir does.
    pub async fn eof_then_outcome(mut self) -> Outcome {
        let _ = self.s.shutdown().await;
        self.outcome().await
    }

    /// Sends a simple Query without waiting for its answer.
    pub async fn send_query(&mut self, sql: &str) -> Result<()> {
        let mut out = BytesMut::new();
        messages::query(&mut out, sql);
        self.send(&out).await
    }

    /// Sends a simple Query and reads its whole answer.
    pub async fn query(&mut self, sql: &str) -> Result<Reply> {
        self.send_query(sql).await?;
        self.reply().await
    }

    /// A simple query's first column of its first row; an error or no row panics.
    pub async fn query_one(&mut self, sql: &str) -> String {
        let reply = self.query(sql).await.unwrap();
        assert!(reply.error.is_none(), "{sql}: {:?}", reply.error);
        reply.scalar().expect("a row").to_owned()
    }

    /// Reads messages up to the next ReadyForQuery, as a simple query's `Reply`.
    pub async fn reply(&mut self) -> Result<Reply> {
        let mut reply = Reply::default();
        loop {
            let (tag, mut body) = self.read_msg().await?;
            match tag {
                be::DATA_ROW => reply.rows.push(data_row(&mut body)),
                be::ERROR_RESPONSE if reply.error.is_none() => reply.error = Some(error_fields(&body)),
                be::READY_FOR_QUERY => {
                    reply.status = body.first().copied().unwrap_or(0);
                    return Ok(reply);
                }
                _ => {}
            }
        }
    }

    /// Sends `bytes` and returns every message up to the next ReadyForQuery.
    pub async fn exchange(&mut self, bytes: &[u8]) -> Vec<(u8, Bytes)> {
        self.send(bytes).await.unwrap();
        self.until_ready().await
    }

    /// Every message up to and including the next ReadyForQuery; EOF panics.
    pub async fn until_ready(&mut self) -> Vec<(u8, Bytes)> {
        let mut out = vec![];
        loop {
            let m = self.read_msg().await.unwrap_or_else(|e| panic!("{e}; got {out:?}"));
            let done = m.0 == be::READY_FOR_QUERY;
            out.push(m);
            if done {
                return out;
            }
        }
    }

    /// Leaves politely: Terminate, then close.
    pub async fn terminate(mut self) {
        let mut out = BytesMut::new();
        messages::terminate(&mut out);
        let _ = self.send(&out).await;
        let _ = self.s.shutdown().await;
    }
}

async fn within<T>(limit: Duration, what: &str, f: impl std::future::Future<Output = std::io::Result<T>>) -> Result<T> {
    match tokio::time::timeout(limit, f).await {
        Ok(r) => r.map_err(|e| format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer in {limit:?}")),
    }
}

/// Sends a CancelRequest on a new socket and waits for weir to close it.
pub async fn cancel(addr: SocketAddr, key: (i32, i32)) -> Result<()> {
    let mut s = within(ANSWER_LIMIT, "cancel connect", TcpStream::connect(addr)).await?;
    within(ANSWER_LIMIT, "cancel write", s.write_all(&messages::cancel_request(key.0, key.1))).await?;
    let mut sink = [0u8; 64];
    match within(ANSWER_LIMIT, "cancel read", s.read(&mut sink)).await? {
        0 => Ok(()),
        n => Err(format!("weir answered a CancelRequest with {n} bytes")),
    }
}

/// Sends `bytes` on a new connection and returns what weir answered.
pub async fn answer(addr: SocketAddr, bytes: &[u8]) -> Outcome {
    let mut c = Raw::connect(addr).await;
    c.send_anyway(bytes).await;
    c.outcome().await
}

/// The SQLSTATE and message of an ErrorResponse body.
pub fn error_fields(body: &[u8]) -> (String, String) {
    let f = messages::parse_error_fields(body).unwrap_or_default();
    (f.code.clone(), f.message_text())
}

fn data_row(body: &mut Bytes) -> Vec<Option<String>> {
    let n = body.get_i16();
    (0..n)
        .map(|_| {
            let len = body.get_i32();
            (len >= 0).then(|| String::from_utf8_lossy(&body.split_to(len as usize)).into_owned())
        })
        .collect()
}

/// A well-formed StartupMessage for protocol 3.0.
pub fn startup(params: &[(&str, &str)]) -> Vec<u8> {
    startup_v(3, 0, params)
}

/// A StartupMessage for protocol `major.minor` with `params`.
pub fn startup_v(major: i32, minor: i32, params: &[(&str, &str)]) -> Vec<u8> {
    let mut buf = BytesMut::new();
    messages::startup_message(&mut buf, (major << 16) | minor, params);
    buf.to_vec()
}

/// A v3.0 StartupMessage with these raw body bytes (pairs must be encoded by the caller).
pub fn startup_body(body: &[u8]) -> Vec<u8> {
    untagged(None, code::PROTOCOL_3_0, body)
}

/// An untagged packet: its length (or `len` when given, to lie), code and body.
pub fn untagged(len: Option<i32>, version: i32, body: &[u8]) -> Vec<u8> {
    let real = (body.len() + 8) as i32;
    let mut p = len.unwrap_or(real).to_be_bytes().to_vec();
    p.extend_from_slice(&version.to_be_bytes());
    p.extend_from_slice(body);
    p
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

/// A simple Query message.
pub fn query(sql: &str) -> Vec<u8> {
    let mut out = BytesMut::new();
    messages::query(&mut out, sql);
    out.to_vec()
}
