//! A raw-socket PostgreSQL client for the queue tests: it speaks just enough
//! of the protocol (startup with trust or cleartext auth, simple queries,
//! CancelRequest) and can leave the way real clients do: RST, Terminate, or
//! pgx's cancel-then-Terminate. tokio-postgres always sends Terminate on
//! drop, so abrupt departures need this.

use std::net::SocketAddr;
use std::time::Duration;

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use weir::protocol::messages;
use weir::protocol::tags::{auth, backend as be, frontend as fe, startup};

/// Every raw step gives up after this long, so no test can hang.
const STEP_LIMIT: Duration = Duration::from_secs(30);

pub type Result<T> = std::result::Result<T, String>;

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

/// One logged-in raw client.
pub struct Raw {
    pub stream: TcpStream,
    buf: BytesMut,
    /// weir's BackendKeyData for this client.
    pub key: (i32, i32),
}

/// Bytes of a StartupMessage (protocol 3.0) with the given parameters.
pub fn startup_packet(params: &[(&str, &str)]) -> Vec<u8> {
    let mut body = BytesMut::new();
    body.put_i32(startup::PROTOCOL_3_0);
    for (k, v) in params {
        body.put_slice(k.as_bytes());
        body.put_u8(0);
        body.put_slice(v.as_bytes());
        body.put_u8(0);
    }
    body.put_u8(0);
    let mut out = Vec::with_capacity(body.len() + 4);
    out.extend_from_slice(&((body.len() + 4) as i32).to_be_bytes());
    out.extend_from_slice(&body);
    out
}

async fn limit<T>(what: &str, f: impl std::future::Future<Output = std::io::Result<T>>) -> Result<T> {
    match tokio::time::timeout(STEP_LIMIT, f).await {
        Ok(r) => r.map_err(|e| format!("{what}: {e}")),
        Err(_) => Err(format!("{what}: no answer in {STEP_LIMIT:?}")),
    }
}

impl Raw {
    /// Connects and logs in as `user` to database `app` (trust or cleartext
    /// password), returning once the first ReadyForQuery has come.
    pub async fn login(addr: SocketAddr, user: &str, password: &str, extra: &[(&str, &str)]) -> Result<Raw> {
        let stream = limit("connect", TcpStream::connect(addr)).await?;
        let _ = stream.set_nodelay(true);
        let mut raw = Raw { stream, buf: BytesMut::with_capacity(8192), key: (0, 0) };
        let mut params = vec![("user", user), ("database", weir_e2e::APP_DB)];
        params.extend_from_slice(extra);
        raw.send(&startup_packet(&params)).await?;
        loop {
            let (tag, mut body) = raw.read_msg().await?;
            match tag {
                be::AUTHENTICATION => match body.get_i32() {
                    auth::OK => {}
                    auth::CLEARTEXT_PASSWORD => {
                        let mut out = BytesMut::new();
                        out.put_u8(fe::PASSWORD);
                        out.put_i32((4 + password.len() + 1) as i32);
                        out.put_slice(password.as_bytes());
                        out.put_u8(0);
                        raw.send(&out).await?;
                    }
                    other => return Err(format!("raw client supports trust/cleartext only, got auth request {other}")),
                },
                be::BACKEND_KEY_DATA => raw.key = (body.get_i32(), body.get_i32()),
                be::ERROR_RESPONSE => return Err(format!("login refused: {:?}", error_fields(&body))),
                be::READY_FOR_QUERY => return Ok(raw),
                _ => {}
            }
        }
    }

    pub async fn send(&mut self, bytes: &[u8]) -> Result<()> {
        limit("write", self.stream.write_all(bytes)).await
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

    /// Reads messages up to the next ReadyForQuery.
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

    /// Reads one whole message: (tag, body).
    pub async fn read_msg(&mut self) -> Result<(u8, BytesMut)> {
        loop {
            if self.buf.len() >= 5 {
                let len = i32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
                if self.buf.len() > len {
                    let tag = self.buf.get_u8();
                    self.buf.advance(4);
                    return Ok((tag, self.buf.split_to(len - 4)));
                }
            }
            let n = limit("read", self.stream.read_buf(&mut self.buf)).await?;
            if n == 0 {
                return Err("connection closed by weir".into());
            }
        }
    }

    /// Leaves with a TCP reset: SO_LINGER 0, then close.
    pub fn reset(self) {
        let _ = self.stream.set_zero_linger();
        drop(self.stream);
    }

    /// Leaves politely: Terminate, then close.
    pub async fn terminate(mut self) {
        let mut out = BytesMut::new();
        messages::terminate(&mut out);
        let _ = self.send(&out).await;
        let _ = self.stream.shutdown().await;
    }

    /// Leaves the way pgx does when a context expires: CancelRequest on a new
    /// socket, then Terminate, then close.
    pub async fn leave_like_pgx(self, addr: SocketAddr) -> Result<()> {
        cancel(addr, self.key).await?;
        self.terminate().await;
        Ok(())
    }
}

/// Sends a CancelRequest on a new socket and waits for weir to close it.
pub async fn cancel(addr: SocketAddr, key: (i32, i32)) -> Result<()> {
    let mut s = limit("cancel connect", TcpStream::connect(addr)).await?;
    limit("cancel write", s.write_all(&messages::cancel_request(key.0, key.1))).await?;
    let mut sink = [0u8; 64];
    match limit("cancel read", s.read(&mut sink)).await? {
        0 => Ok(()),
        n => Err(format!("weir answered a CancelRequest with {n} bytes")),
    }
}

fn data_row(body: &mut BytesMut) -> Vec<Option<String>> {
    let n = body.get_i16();
    (0..n)
        .map(|_| {
            let len = body.get_i32();
            (len >= 0).then(|| String::from_utf8_lossy(&body.split_to(len as usize)).into_owned())
        })
        .collect()
}

fn error_fields(body: &[u8]) -> (String, String) {
    let f = messages::parse_error_fields(body).unwrap_or_default();
    (f.code.clone(), f.message_text())
}
