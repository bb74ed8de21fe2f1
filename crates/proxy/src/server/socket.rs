//! Socket options: TCP_NODELAY, keepalive and TCP_USER_TIMEOUT, so that a
//! silently dropped path is detected in seconds rather than Linux's ~15 min.

use std::time::Duration;

use socket2::{SockRef, TcpKeepalive};
use tokio::net::TcpStream;

/// Keepalive and user-timeout settings (PgBouncer's key names).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Liveness {
    pub keepalive: bool,
    pub keepidle: Duration,
    pub keepintvl: Duration,
    pub keepcnt: u32,
    pub user_timeout: Option<Duration>,
}

impl Liveness {
    pub fn from_config(g: &crate::config::General) -> Self {
        Liveness {
            keepalive: g.tcp_keepalive,
            keepidle: g.tcp_keepidle,
            keepintvl: g.tcp_keepintvl,
            keepcnt: g.tcp_keepcnt,
            user_timeout: g.tcp_user_timeout,
        }
    }
}

/// Applies NODELAY, keepalive and TCP_USER_TIMEOUT to a server socket.
pub fn apply(stream: &TcpStream, l: &Liveness) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    let sock = SockRef::from(stream);
    if l.keepalive {
        let ka = TcpKeepalive::new().with_time(l.keepidle).with_interval(l.keepintvl).with_retries(l.keepcnt);
        sock.set_tcp_keepalive(&ka)?;
    }
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Some(t) = l.user_timeout {
        sock.set_tcp_user_timeout(Some(t))?;
    }
    Ok(())
}
