//! Minimal blocking HTTP/1.1 handling for the exporter: read one request head
//! under a total deadline, route it, write one `Connection: close` response.
//! Pure std; never touches tokio. `/metrics` is one scrape (`crate::text`).

use std::io::{self, Read, Write};
use std::net::{Shutdown, TcpStream};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::PrometheusHandle;

use crate::text::scrape;

/// Readiness callback for `/readyz`.
pub type ReadyFn = Arc<dyn Fn() -> bool + Send + Sync>;

/// Total time a client gets to send its request head, and per-write timeout.
pub(crate) const IO_TIMEOUT: Duration = Duration::from_secs(2);
/// Largest request head we read; anything longer is answered from what we have.
const MAX_HEAD: usize = 8 * 1024;
const PROM_CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";
const TEXT: &str = "text/plain; charset=utf-8";

/// What the request handlers need.
pub(crate) struct Ctx {
    pub handle: PrometheusHandle,
    pub ready: ReadyFn,
}

/// One HTTP response.
pub(crate) struct Response {
    status: u16,
    reason: &'static str,
    content_type: &'static str,
    body: String,
}

impl Response {
    pub(crate) fn text(status: u16, reason: &'static str, body: &str) -> Self {
        Response { status, reason, content_type: TEXT, body: body.to_owned() }
    }
}

/// Serves one connection: read head, route, respond, close.
pub(crate) fn serve_conn(mut stream: TcpStream, ctx: &Ctx) {
    let _ = stream.set_write_timeout(Some(IO_TIMEOUT));
    let head = match read_head(&mut stream, Instant::now() + IO_TIMEOUT) {
        Ok(Some(head)) => head,
        Ok(None) | Err(_) => return,
    };
    let (resp, head_only) = match parse_request_line(&head) {
        Some((method, path)) => (route(method, path, ctx), method == "HEAD"),
        None => (Response::text(400, "Bad Request", "bad request\n"), false),
    };
    let _ = write_response(&mut stream, &resp, head_only);
    let _ = stream.shutdown(Shutdown::Write);
}

/// Reads until the end of the request head, EOF, `MAX_HEAD` bytes, or the deadline.
fn read_head(stream: &mut TcpStream, deadline: Instant) -> io::Result<Option<String>> {
    let mut buf = Vec::with_capacity(1024);
    let mut chunk = [0u8; 1024];
    while !head_complete(&buf) && buf.len() < MAX_HEAD {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(io::ErrorKind::TimedOut.into());
        }
        stream.set_read_timeout(Some(left))?;
        match stream.read(&mut chunk)? {
            0 => break,
            n => buf.extend_from_slice(&chunk[..n]),
        }
    }
    if !buf.contains(&b'\n') {
        return Ok(None);
    }
    Ok(Some(String::from_utf8_lossy(&buf).into_owned()))
}

fn head_complete(buf: &[u8]) -> bool {
    buf.windows(4).any(|w| w == b"\r\n\r\n") || buf.windows(2).any(|w| w == b"\n\n")
}

/// `"GET /metrics?x HTTP/1.1"` → `("GET", "/metrics")`.
fn parse_request_line(head: &str) -> Option<(&str, &str)> {
    let line = head.lines().next()?;
    let mut parts = line.split_ascii_whitespace();
    let method = parts.next()?;
    let target = parts.next()?;
    parts.next().filter(|v| v.starts_with("HTTP/"))?;
    Some((method, target.split('?').next().unwrap_or(target)))
}

fn route(method: &str, path: &str, ctx: &Ctx) -> Response {
    if method != "GET" && method != "HEAD" {
        return Response::text(405, "Method Not Allowed", "method not allowed\n");
    }
    match path {
        "/metrics" => metrics_response(ctx),
        "/healthz" => Response::text(200, "OK", "ok\n"),
        "/readyz" if is_ready(ctx) => Response::text(200, "OK", "ready\n"),
        "/readyz" => Response::text(503, "Service Unavailable", "not ready\n"),
        _ => Response::text(404, "Not Found", "not found\n"),
    }
}

fn metrics_response(ctx: &Ctx) -> Response {
    let body = scrape(&ctx.handle);
    Response { status: 200, reason: "OK", content_type: PROM_CONTENT_TYPE, body }
}

/// A panicking readiness callback means "not ready", not a dead exporter.
fn is_ready(ctx: &Ctx) -> bool {
    catch_unwind(AssertUnwindSafe(|| (ctx.ready)())).unwrap_or(false)
}

pub(crate) fn write_response(stream: &mut TcpStream, resp: &Response, head_only: bool) -> io::Result<()> {
    let head = format!(
        "HTTP/1.1 {} {}\r\nContent-Type: {}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        resp.status,
        resp.reason,
        resp.content_type,
        resp.body.len()
    );
    stream.write_all(head.as_bytes())?;
    if !head_only {
        stream.write_all(resp.body.as_bytes())?;
    }
    stream.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn request_line_parsing() {
        assert_eq!(parse_request_line("GET /metrics HTTP/1.1\r\n\r\n"), Some(("GET", "/metrics")));
        assert_eq!(parse_request_line("GET /readyz?x=1 HTTP/1.0\r\n"), Some(("GET", "/readyz")));
        assert_eq!(parse_request_line("GET /metrics\r\n"), None);
        assert_eq!(parse_request_line("\r\n"), None);
        assert!(head_complete(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n"));
        assert!(!head_complete(b"GET / HTTP/1.1\r\nHost: x\r\n"));
    }
}
