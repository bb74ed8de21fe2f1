//! Where weir listens: `listen_addr` (one or more `address:port`, or
//! `*:port` for every IPv4 and IPv6 address, as PgBouncer's `*`) and the
//! Unix-domain socket settings (`unix_socket_dir`, `unix_socket_mode`,
//! `unix_socket_group`). Parsing and paths only; binding is `app`'s.

use std::fmt;
use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr};
use std::path::PathBuf;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Config;

/// `listen_addr`: the TCP addresses weir listens on, all with one port
/// (PgBouncer has one `listen_port` for every address and the Unix socket).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListenAddr {
    addrs: Vec<SocketAddr>,
    /// Written as `*:port`: every IPv4 and IPv6 address.
    any: bool,
}

impl ListenAddr {
    /// The addresses to bind, in order (`*` is `0.0.0.0` and `[::]`).
    pub fn addrs(&self) -> &[SocketAddr] {
        &self.addrs
    }

    /// The one port (0: a free port, chosen at the first bind, for all).
    pub fn port(&self) -> u16 {
        self.addrs[0].port()
    }

    /// `*`: an address family the machine lacks is skipped, not an error.
    pub fn is_any(&self) -> bool {
        self.any
    }
}

impl From<SocketAddr> for ListenAddr {
    fn from(a: SocketAddr) -> Self {
        ListenAddr { addrs: vec![a], any: false }
    }
}

impl FromStr for ListenAddr {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        let items: Vec<&str> = s.split(',').map(str::trim).collect();
        if items.iter().any(|i| i.is_empty()) {
            return Err("an empty address in the list".into());
        }
        if let [one] = items.as_slice() {
            if let Some(port) = one.strip_prefix("*:") {
                let port: u16 = port.parse().map_err(|_| format!("invalid port \"{port}\""))?;
                let addrs = vec![(Ipv4Addr::UNSPECIFIED, port).into(), (Ipv6Addr::UNSPECIFIED, port).into()];
                return Ok(ListenAddr { addrs, any: true });
            }
        }
        let mut addrs = Vec::with_capacity(items.len());
        for item in items {
            if item == "*" {
                return Err("needs a port".into());
            }
            if item.starts_with('*') {
                return Err("* stands alone, with its port: \"*:6432\"".into());
            }
            let a: SocketAddr = item.parse().map_err(|_| format!("\"{item}\" is not an IP address with a port"))?;
            addrs.push(a);
        }
        if addrs.iter().any(|a| a.port() != addrs[0].port()) {
            return Err("every address takes the same port (PgBouncer's one listen_port)".into());
        }
        Ok(ListenAddr { addrs, any: false })
    }
}

impl fmt::Display for ListenAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.any {
            return write!(f, "*:{}", self.port());
        }
        let text: Vec<String> = self.addrs.iter().map(ToString::to_string).collect();
        f.write_str(&text.join(","))
    }
}

impl Serialize for ListenAddr {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for ListenAddr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        text.parse().map_err(|why| serde::de::Error::custom(format!("listen_addr \"{text}\": {why}")))
    }
}

/// Longest Unix-socket path Linux takes (`sun_path` less its NUL).
pub const MAX_SOCKET_PATH: usize = 107;

impl Config {
    /// The Unix socket weir listens on when its port is `port`:
    /// `<unix_socket_dir>/.s.PGSQL.<port>` (relative dirs resolve against the
    /// config file's folder); None when unix_socket_dir is empty (off).
    pub fn unix_socket_path(&self, port: u16) -> Option<PathBuf> {
        let dir = &self.weir.unix_socket_dir;
        (!dir.is_empty()).then(|| self.base_dir.join(dir).join(format!(".s.PGSQL.{port}")))
    }

    /// unix_socket_mode as permission bits (an octal string such as "0777").
    pub fn unix_socket_mode_bits(&self) -> Option<u32> {
        parse_mode(&self.weir.unix_socket_mode)
    }
}

fn parse_mode(s: &str) -> Option<u32> {
    u32::from_str_radix(s, 8).ok().filter(|m| *m <= 0o777)
}

/// unix_socket_* rules, each as (key, why).
pub(super) fn problems(cfg: &Config) -> Vec<(&'static str, String)> {
    let g = &cfg.weir;
    let mut found = Vec::new();
    if parse_mode(&g.unix_socket_mode).is_none() {
        found.push(("unix_socket_mode", format!("\"{}\" is not an octal mode such as \"0777\"", g.unix_socket_mode)));
    }
    if g.unix_socket_dir.starts_with('@') {
        found.push(("unix_socket_dir", "abstract-namespace sockets (@name) are not supported; use a directory".into()));
    } else if let Some(path) = cfg.unix_socket_path(65535) {
        if path.as_os_str().len() > MAX_SOCKET_PATH {
            let why = format!("{} is longer than a Unix socket path may be ({MAX_SOCKET_PATH} bytes)", path.display());
            found.push(("unix_socket_dir", why));
        }
    }
    if g.unix_socket_dir.is_empty() && !g.unix_socket_group.is_empty() {
        found.push(("unix_socket_group", "is set but unix_socket_dir is empty (no Unix socket)".into()));
    }
    found
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<ListenAddr, String> {
        s.parse()
    }

    #[test]
    fn one_address_a_list_or_star() {
        let one = parse("127.0.0.1:6432").unwrap();
        assert_eq!((one.addrs().len(), one.port(), one.to_string()), (1, 6432, "127.0.0.1:6432".into()));
        let two = parse("127.0.0.1:7000, [::1]:7000").unwrap();
        assert_eq!(two.addrs()[1], "[::1]:7000".parse::<SocketAddr>().unwrap());
        assert_eq!(two.to_string(), "127.0.0.1:7000,[::1]:7000");
        let any = parse("*:6432").unwrap();
        assert!(any.is_any());
        assert_eq!(any.addrs(), &["0.0.0.0:6432".parse().unwrap(), "[::]:6432".parse::<SocketAddr>().unwrap()]);
        assert_eq!(any.to_string(), "*:6432");
    }

    #[test]
    fn bad_lists_say_why() {
        assert!(parse("127.0.0.1:1,127.0.0.2:2").unwrap_err().contains("same port"));
        assert!(parse("*").unwrap_err().contains("needs a port"));
        assert!(parse("*:1,127.0.0.1:1").unwrap_err().contains("stands alone"));
        assert!(parse("127.0.0.1:1,").unwrap_err().contains("empty"));
        assert!(parse("10.0.0.1").unwrap_err().contains("with a port"));
    }

    #[test]
    fn modes_are_octal() {
        assert_eq!(parse_mode("0777"), Some(0o777));
        assert_eq!(parse_mode("660"), Some(0o660));
        assert_eq!(parse_mode("0888"), None);
        assert_eq!(parse_mode("01777"), None);
    }
}
