//! `[peers.ID]`: the other weirs (or PgBouncers) behind the same address
//! (a Kubernetes Service, `so_reuseport` on one host), where a CancelRequest
//! for one of their keys is forwarded. PgBouncer's `[peers]`: `host` (an
//! address or name, or a folder starting with `/` that holds the peer's
//! Unix socket `.s.PGSQL.<port>`), `port` (6432), `pool_size` (cancel
//! requests in flight to the peer at once). An entry for this weir's own
//! `peer_id` is allowed and ignored, so every member of a group can share
//! one `[peers]` list. Parsing and rules only; forwarding is `cancel_keys`'.

use serde::{Deserialize, Serialize};

use super::validate::ConfigError;
use super::Config;

/// The largest peer id (PgBouncer's documented limit; a key keeps two
/// bytes for it).
pub const MAX_PEER_ID: u16 = 16383;

/// PgBouncer's default port of a peer.
fn default_port() -> u16 {
    6432
}

/// One `[peers.ID]` entry.
#[derive(Debug, Clone, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct Peer {
    /// An IP address or host name, or (starting with `/`) the folder of the
    /// peer's Unix socket.
    pub host: String,
    #[serde(default = "default_port")]
    pub port: u16,
    /// Cancel requests forwarded to this peer at once; more wait for one to
    /// finish (default: default_pool_size).
    pub pool_size: Option<u32>,
}

impl Config {
    /// The peer `id` (not this weir itself), if `[peers]` lists it.
    pub fn peer(&self, id: u16) -> Option<&Peer> {
        if id == self.weir.peer_id {
            return None;
        }
        self.peers.iter().find(|(k, _)| k.parse::<u16>() == Ok(id)).map(|(_, p)| p)
    }

    pub(super) fn check_peers(&self, found: &mut Vec<ConfigError>) {
        let invalid = |key: String, why: &str| ConfigError::Invalid { key, why: why.into() };
        if self.weir.peer_id > MAX_PEER_ID {
            found.push(invalid("weir.peer_id".into(), "must be at most 16383 (0: no peering)"));
        }
        for (id, peer) in &self.peers {
            let key = |k: &str| format!("peers.{id}{k}");
            if !id.parse::<u16>().is_ok_and(|n| (1..=MAX_PEER_ID).contains(&n)) {
                found.push(invalid(key(""), "a peer's id is a number from 1 to 16383"));
            }
            if peer.host.is_empty() {
                found.push(invalid(key(".host"), "must name the peer's address or Unix socket folder"));
            }
            if peer.port == 0 {
                found.push(invalid(key(".port"), "must be a port number"));
            }
            if peer.pool_size == Some(0) {
                found.push(invalid(key(".pool_size"), "must be at least 1"));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(text: &str) -> Result<Config, ConfigError> {
        Config::from_toml(&format!("[weir]\nauth_type = \"trust\"\n{text}"), std::path::Path::new("."))
    }

    #[test]
    fn peers_by_id_and_own_entry_ignored() {
        let c =
            cfg("peer_id = 2\n[peers.1]\nhost = \"10.0.0.1\"\n[peers.2]\nhost = \"/tmp/w2\"\nport = 7000\n").unwrap();
        assert_eq!(c.peer(1).map(|p| (p.host.as_str(), p.port)), Some(("10.0.0.1", 6432)));
        assert_eq!(c.peer(2), None, "its own entry");
        assert_eq!(c.peer(3), None);
    }

    #[test]
    fn bad_peers_are_refused() {
        for (text, key) in [
            ("peer_id = 16384\n", "weir.peer_id"),
            ("[peers.0]\nhost = \"h\"\n", "peers.0"),
            ("[peers.x]\nhost = \"h\"\n", "peers.x"),
            ("[peers.3]\nhost = \"\"\n", "peers.3.host"),
            ("[peers.3]\nhost = \"h\"\npool_size = 0\n", "peers.3.pool_size"),
        ] {
            let e = cfg(text).unwrap_err().to_string();
            assert!(e.starts_with(key), "{text}: {e}");
        }
        assert!(cfg("[peers.3]\nhost = \"h\"\nweight = 1\n").is_err(), "unknown keys");
    }
}
