//! [`ConnAddr`]: one end of a client or server connection as logs and the
//! admin console show it: an IP address and port, or a Unix-domain socket,
//! which PgBouncer shows as the address `unix` and the port of the socket's
//! name (`.s.PGSQL.<port>`).

use std::fmt;
use std::net::{IpAddr, SocketAddr};

/// Where a connection comes from or goes to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ConnAddr {
    /// A TCP connection's address.
    Tcp(SocketAddr),
    /// A Unix-domain socket named for `port` (`.s.PGSQL.<port>`).
    Unix(u16),
}

impl ConnAddr {
    /// The IP address; None for a Unix-domain socket.
    pub fn ip(&self) -> Option<IpAddr> {
        match self {
            ConnAddr::Tcp(a) => Some(a.ip()),
            ConnAddr::Unix(_) => None,
        }
    }

    /// The port (for a Unix-domain socket, the one in its name).
    pub fn port(&self) -> u16 {
        match self {
            ConnAddr::Tcp(a) => a.port(),
            ConnAddr::Unix(port) => *port,
        }
    }

    /// The address column of `SHOW CLIENTS` / `SHOW SERVERS`: the IP, or `unix`.
    pub fn host(&self) -> String {
        match self {
            ConnAddr::Tcp(a) => a.ip().to_string(),
            ConnAddr::Unix(_) => "unix".to_owned(),
        }
    }
}

impl From<SocketAddr> for ConnAddr {
    fn from(a: SocketAddr) -> Self {
        ConnAddr::Tcp(a)
    }
}

impl fmt::Display for ConnAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConnAddr::Tcp(a) => a.fmt(f),
            ConnAddr::Unix(port) => write!(f, "unix:{port}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unix_shows_as_pgbouncer_does() {
        let u = ConnAddr::Unix(6432);
        assert_eq!((u.host(), u.port(), u.ip(), u.to_string()), ("unix".into(), 6432, None, "unix:6432".into()));
        let t = ConnAddr::from("10.0.0.1:5432".parse::<SocketAddr>().unwrap());
        assert_eq!((t.host(), t.port(), t.to_string()), ("10.0.0.1".into(), 5432, "10.0.0.1:5432".into()));
    }
}
