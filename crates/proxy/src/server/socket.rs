//! Socket options: TCP_NODELAY, keepalive, so that a quiet path that died is
//! detected in seconds rather than the kernel's 2 hours, and TCP_USER_TIMEOUT
//! when configured (off by default: it cannot tell a dead path from a peer
//! that stops reading while it works, a backend in a lock wait mid-COPY or a
//! client reading a large result slowly; the watchdog's probe can). Client
//! sockets get the keepalive only (`keepalive`).

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
pub(crate) fn apply(stream: &TcpStream, l: &Liveness) -> std::io::Result<()> {
    stream.set_nodelay(true)?;
    keepalive(stream, l)?;
    #[cfg(any(target_os = "linux", target_os = "android"))]
    if let Some(t) = l.user_timeout {
        SockRef::from(stream).set_tcp_user_timeout(Some(t))?;
    }
    Ok(())
}

/// Applies the keepalive settings (if on) to a socket, a server's or a
/// client's: a peer whose path died while the connection sat quiet (an idle
/// client, one idle in a transaction or silent mid-COPY, an idle server) is
/// found after `keepidle + keepintvl * keepcnt`.
pub(crate) fn keepalive(stream: &TcpStream, l: &Liveness) -> std::io::Result<()> {
    if l.keepalive {
        let ka = TcpKeepalive::new().with_time(l.keepidle).with_interval(l.keepintvl).with_retries(l.keepcnt);
        SockRef::from(stream).set_tcp_keepalive(&ka)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The options really land on the socket, with the defaults' values.
    #[tokio::test]
    async fn keepalive_and_user_timeout_are_set() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let l = Liveness::from_config(&crate::config::General::default());
        apply(&stream, &l).unwrap();
        let sock = SockRef::from(&stream);
        assert!(stream.nodelay().unwrap());
        assert!(sock.keepalive().unwrap());
        assert_eq!(sock.keepalive_time().unwrap(), l.keepidle);
        assert_eq!(sock.keepalive_interval().unwrap(), l.keepintvl);
        assert_eq!(sock.keepalive_retries().unwrap(), l.keepcnt);
        // Defaults detect a quiet dead path within ~10 s, not the kernel's 2 h.
        let worst = l.keepidle + l.keepintvl * l.keepcnt;
        assert!(worst <= std::time::Duration::from_secs(10), "{worst:?}");
        assert_eq!(l.user_timeout, None, "off by default, as PgBouncer's");
        #[cfg(target_os = "linux")]
        {
            let set = Liveness { user_timeout: Some(std::time::Duration::from_secs(8)), ..l };
            apply(&stream, &set).unwrap();
            assert_eq!(sock.tcp_user_timeout().unwrap(), set.user_timeout, "applied when configured");
        }
    }

    #[tokio::test]
    async fn keepalive_can_be_turned_off() {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let stream = TcpStream::connect(listener.local_addr().unwrap()).await.unwrap();
        let l = Liveness { keepalive: false, user_timeout: None, ..Liveness::from_config(&Default::default()) };
        apply(&stream, &l).unwrap();
        assert!(!SockRef::from(&stream).keepalive().unwrap());
    }
}
