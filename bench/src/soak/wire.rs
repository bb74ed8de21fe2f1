//! A minimal raw wire-protocol client for the soak's load: trust login,
//! messages written as built (so a pipeline is one write, and a client can
//! vanish between any two bytes it chooses), replies read up to ReadyForQuery
//! with every CommandComplete tag and ErrorResponse SQLSTATE kept. Every read
//! and write is bounded by the caller's timeout: nothing here waits forever.

use std::time::Duration;

use bytes::{Buf, BytesMut};
use postgres_protocol::message::frontend;
use postgres_protocol::IsNull;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

/// Why an exchange failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Fail {
    /// The server (pooler or Postgres) sent an ErrorResponse with this SQLSTATE
    /// (and message) during login, or a FATAL one after it.
    Sql(String, String),
    /// The connection closed (EOF) before the reply was complete.
    Closed,
    /// A socket error (reset, refused).
    Io,
    /// No complete reply within the timeout.
    Timeout,
}

impl Fail {
    /// The server's message, for an ErrorResponse.
    pub fn message(&self) -> Option<&str> {
        match self {
            Fail::Sql(_, m) => Some(m),
            _ => None,
        }
    }

    /// The label the soak counts errors under: the SQLSTATE, or
    /// `closed` / `io` / `timeout`.
    pub fn label(&self) -> String {
        match self {
            Fail::Sql(code, _) => code.clone(),
            Fail::Closed => "closed".into(),
            Fail::Io => "io".into(),
            Fail::Timeout => "timeout".into(),
        }
    }
}

/// A reply up to and including ReadyForQuery.
#[derive(Debug, Default)]
pub struct Reply {
    /// CommandComplete tags, in order.
    pub tags: Vec<String>,
    /// SQLSTATEs of the ErrorResponses, in order.
    pub errors: Vec<String>,
    /// Their messages.
    pub messages: Vec<String>,
    /// DataRows received.
    pub rows: usize,
    /// ReadyForQuery messages received.
    pub ready: usize,
    /// The last ReadyForQuery's transaction status (I, T or E).
    pub status: u8,
}

/// One client connection.
pub struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    /// BackendKeyData (process id, secret key) the server sent, if any.
    pub key: Option<(i32, i32)>,
}

const TAG_ERROR: u8 = b'E';
const TAG_READY: u8 = b'Z';
const TAG_COMPLETE: u8 = b'C';
const TAG_DATA_ROW: u8 = b'D';
const TAG_AUTH: u8 = b'R';
const TAG_KEY_DATA: u8 = b'K';
const AUTH_OK: i32 = 0;
const FIELD_SQLSTATE: u8 = b'C';
const FIELD_SEVERITY: u8 = b'V';
const FIELD_MESSAGE: u8 = b'M';

impl Conn {
    /// Connects and logs in (trust) as `user` to `db`, up to ReadyForQuery.
    pub async fn connect(addr: &str, user: &str, db: &str, limit: Duration) -> Result<Conn, Fail> {
        tokio::time::timeout(limit, async {
            let stream = TcpStream::connect(addr).await.map_err(|_| Fail::Io)?;
            let _ = stream.set_nodelay(true);
            let mut conn = Conn { stream, buf: BytesMut::with_capacity(8192), key: None };
            let mut out = BytesMut::new();
            frontend::startup_message([("user", user), ("database", db), ("application_name", "soak")], &mut out)
                .map_err(|_| Fail::Io)?;
            conn.write(&out).await?;
            loop {
                let (tag, body) = conn.read_message().await?;
                match tag {
                    TAG_AUTH if body.len() >= 4 => {
                        let code = i32::from_be_bytes([body[0], body[1], body[2], body[3]]);
                        if code != AUTH_OK {
                            return Err(Fail::Sql("auth".into(), format!("authentication request {code}")));
                        }
                    }
                    TAG_KEY_DATA if body.len() >= 8 => {
                        let pid = i32::from_be_bytes([body[0], body[1], body[2], body[3]]);
                        let secret = i32::from_be_bytes([body[4], body[5], body[6], body[7]]);
                        conn.key = Some((pid, secret));
                    }
                    TAG_ERROR => {
                        let (code, _, message) = error_fields(&body);
                        return Err(Fail::Sql(code, message));
                    }
                    TAG_READY => return Ok(conn),
                    _ => {}
                }
            }
        })
        .await
        .unwrap_or(Err(Fail::Timeout))
    }

    /// Writes `bytes` as they are.
    pub async fn write(&mut self, bytes: &[u8]) -> Result<(), Fail> {
        self.stream.write_all(bytes).await.map_err(|_| Fail::Io)
    }

    /// Writes `bytes`, then reads until `syncs` ReadyForQuery messages came.
    /// A FATAL error ends the exchange as `Fail::Sql`.
    pub async fn exchange(&mut self, bytes: &[u8], syncs: usize, limit: Duration) -> Result<Reply, Fail> {
        tokio::time::timeout(limit, async {
            self.write(bytes).await?;
            let mut reply = Reply::default();
            while reply.ready < syncs {
                let (tag, body) = self.read_message().await?;
                match tag {
                    TAG_COMPLETE => reply.tags.push(cstr(&body)),
                    TAG_DATA_ROW => reply.rows += 1,
                    TAG_ERROR => {
                        let (code, fatal, message) = error_fields(&body);
                        if fatal {
                            return Err(Fail::Sql(code, message));
                        }
                        reply.errors.push(code);
                        reply.messages.push(message);
                    }
                    TAG_READY => {
                        reply.ready += 1;
                        reply.status = body.first().copied().unwrap_or(b'?');
                    }
                    _ => {}
                }
            }
            Ok(reply)
        })
        .await
        .unwrap_or(Err(Fail::Timeout))
    }

    /// A simple-protocol query, up to ReadyForQuery.
    pub async fn simple(&mut self, sql: &str, limit: Duration) -> Result<Reply, Fail> {
        self.exchange(&query(sql), 1, limit).await
    }

    /// Sends Terminate and closes (errors ignored: the soak is leaving).
    pub async fn terminate(mut self) {
        let mut out = BytesMut::new();
        frontend::terminate(&mut out);
        let _ = tokio::time::timeout(Duration::from_secs(1), self.stream.write_all(&out)).await;
    }

    async fn read_message(&mut self) -> Result<(u8, BytesMut), Fail> {
        loop {
            if self.buf.len() >= 5 {
                let len = u32::from_be_bytes([self.buf[1], self.buf[2], self.buf[3], self.buf[4]]) as usize;
                if len < 4 {
                    return Err(Fail::Io);
                }
                if self.buf.len() > len {
                    let tag = self.buf[0];
                    self.buf.advance(5);
                    return Ok((tag, self.buf.split_to(len - 4)));
                }
            }
            match self.stream.read_buf(&mut self.buf).await {
                Ok(0) => return Err(Fail::Closed),
                Ok(_) => {}
                Err(_) => return Err(Fail::Io),
            }
        }
    }
}

/// A simple Query message.
pub fn query(sql: &str) -> BytesMut {
    let mut out = BytesMut::new();
    frontend::query(sql, &mut out).expect("a query without NUL bytes");
    out
}

/// Parse (unless `parsed`), Bind with text parameters, Execute into `out`.
pub fn extended(out: &mut BytesMut, name: &str, sql: &str, params: &[&str], parsed: bool) {
    if !parsed {
        frontend::parse(name, sql, std::iter::empty(), out).expect("a statement without NUL bytes");
    }
    let values = params.iter().map(|p| Some(p.as_bytes()));
    frontend::bind(
        "",
        name,
        std::iter::empty::<i16>(),
        values,
        |v: Option<&[u8]>, buf: &mut BytesMut| match v {
            Some(b) => {
                buf.extend_from_slice(b);
                Ok(IsNull::No)
            }
            None => Ok(IsNull::Yes),
        },
        std::iter::empty::<i16>(),
        out,
    )
    .map_err(|_| ())
    .expect("text parameters bind");
    frontend::execute("", 0, out).expect("an unnamed portal");
}

/// Appends Sync.
pub fn sync(out: &mut BytesMut) {
    frontend::sync(out);
}

/// Sends a CancelRequest for `key` on a new connection to `addr`.
pub async fn cancel(addr: &str, key: (i32, i32)) {
    let mut out = BytesMut::new();
    frontend::cancel_request(key.0, key.1, &mut out);
    let _ = tokio::time::timeout(Duration::from_secs(2), async {
        if let Ok(mut s) = TcpStream::connect(addr).await {
            let _ = s.write_all(&out).await;
            let mut sink = [0u8; 16];
            let _ = s.read(&mut sink).await;
        }
    })
    .await;
}

/// The SQLSTATE of an ErrorResponse body, whether it was FATAL or PANIC, and its message.
fn error_fields(body: &[u8]) -> (String, bool, String) {
    let (mut code, mut fatal, mut message) = (String::from("?????"), false, String::new());
    let mut rest = body;
    while let Some((&kind, tail)) = rest.split_first() {
        if kind == 0 {
            break;
        }
        let end = tail.iter().position(|&b| b == 0).unwrap_or(tail.len());
        let value = String::from_utf8_lossy(&tail[..end]);
        match kind {
            FIELD_SQLSTATE => code = value.into_owned(),
            FIELD_SEVERITY => fatal = value == "FATAL" || value == "PANIC",
            FIELD_MESSAGE => message = value.into_owned(),
            _ => {}
        }
        rest = tail.get(end + 1..).unwrap_or(&[]);
    }
    (code, fatal, message)
}

fn cstr(body: &[u8]) -> String {
    let end = body.iter().position(|&b| b == 0).unwrap_or(body.len());
    String::from_utf8_lossy(&body[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_sqlstate_and_severity() {
        let body = b"SFATAL\0VFATAL\0C57P01\0Mterminating connection\0\0";
        assert_eq!(error_fields(body), ("57P01".to_string(), true, "terminating connection".to_string()));
        let mut weir = BytesMut::new();
        weir::protocol::messages::error_response(
            &mut weir,
            weir::protocol::messages::Severity::Error,
            weir::protocol::sqlstate::TOO_MANY_CONNECTIONS,
            "the queue is full",
        );
        assert_eq!(error_fields(&weir[5..]), ("53300".to_string(), false, "the queue is full".to_string()));
        let body = b"SERROR\0VERROR\0C42P01\0\0";
        assert_eq!(error_fields(body), ("42P01".to_string(), false, String::new()));
    }
}
