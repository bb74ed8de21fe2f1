//! A database's hosts, as libpq and PgBouncer write them: `host` is one host
//! or a comma-separated list (names, addresses, or a Unix socket folder
//! starting with `/`), `port` one port for all or a list with one port per
//! host (`port = "5432,5433"`). `load_balance_hosts` (PgBouncer's
//! `round-robin` and `disable`, libpq's `random`) spreads new connections
//! over the hosts that match; `target_session_attrs` (libpq's six values)
//! says which servers match. Parsing, validation and the explanation
//! `weir check-config` prints; choosing a host is the pool's (`pool::hosts`).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use super::Config;

/// Which new connection goes to which matching host.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum LoadBalanceHosts {
    /// The next matching host in turn for each new connection (PgBouncer's default).
    #[default]
    RoundRobin,
    /// The host the last connection took, until a connect to it fails; then
    /// the next matching one in the list (PgBouncer's meaning).
    Disable,
    /// A matching host at random (libpq's `random`).
    Random,
}

impl LoadBalanceHosts {
    pub fn as_str(self) -> &'static str {
        match self {
            LoadBalanceHosts::RoundRobin => "round-robin",
            LoadBalanceHosts::Disable => "disable",
            LoadBalanceHosts::Random => "random",
        }
    }
}

/// Which servers weir keeps after login (libpq's meanings).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Deserialize, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TargetSessionAttrs {
    /// Any server (libpq's and PgBouncer's default).
    #[default]
    Any,
    /// One that accepts writes: not in recovery, default_transaction_read_only off.
    ReadWrite,
    /// One that does not: in recovery, or default_transaction_read_only on.
    ReadOnly,
    /// Not in recovery.
    Primary,
    /// In recovery (a hot standby).
    Standby,
    /// A standby while one answers; else any server.
    PreferStandby,
}

impl TargetSessionAttrs {
    pub fn as_str(self) -> &'static str {
        match self {
            TargetSessionAttrs::Any => "any",
            TargetSessionAttrs::ReadWrite => "read-write",
            TargetSessionAttrs::ReadOnly => "read-only",
            TargetSessionAttrs::Primary => "primary",
            TargetSessionAttrs::Standby => "standby",
            TargetSessionAttrs::PreferStandby => "prefer-standby",
        }
    }

    /// What a kept server is, in an operator's words.
    fn explained(self) -> &'static str {
        match self {
            TargetSessionAttrs::Any => "any server that logs in",
            TargetSessionAttrs::ReadWrite => {
                "a server that accepts writes (not in recovery, default_transaction_read_only off)"
            }
            TargetSessionAttrs::ReadOnly => {
                "a server that refuses writes (a standby, or default_transaction_read_only on)"
            }
            TargetSessionAttrs::Primary => "a server not in recovery",
            TargetSessionAttrs::Standby => "a hot standby",
            TargetSessionAttrs::PreferStandby => "a hot standby while one answers, else any server",
        }
    }
}

/// `port`: one port for every host, or one per host.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Ports(Vec<u16>);

impl Ports {
    pub fn one(port: u16) -> Ports {
        Ports(vec![port])
    }

    /// The first port (the one SHOW DATABASES shows).
    pub fn first(&self) -> u16 {
        self.0[0]
    }

    pub fn as_slice(&self) -> &[u16] {
        &self.0
    }
}

impl fmt::Display for Ports {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let parts: Vec<String> = self.0.iter().map(u16::to_string).collect();
        f.write_str(&parts.join(","))
    }
}

impl std::str::FromStr for Ports {
    type Err = String;

    fn from_str(s: &str) -> Result<Ports, String> {
        let ports = s
            .split(',')
            .map(|p| p.trim().parse::<u16>().map_err(|_| format!("\"{}\" is not a port", p.trim())))
            .collect::<Result<Vec<u16>, String>>()?;
        Ok(Ports(ports))
    }
}

impl Serialize for Ports {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self.0.as_slice() {
            [one] => s.serialize_u16(*one),
            _ => s.serialize_str(&self.to_string()),
        }
    }
}

impl<'de> Deserialize<'de> for Ports {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Ports, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = Ports;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a port number, or a string of comma-separated ports (\"5432,5433\")")
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<Ports, E> {
                u16::try_from(v).map(Ports::one).map_err(|_| E::custom(format!("{v} is not a port")))
            }
            fn visit_u64<E: serde::de::Error>(self, v: u64) -> Result<Ports, E> {
                u16::try_from(v).map(Ports::one).map_err(|_| E::custom(format!("{v} is not a port")))
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<Ports, E> {
                v.parse().map_err(E::custom)
            }
        }
        d.deserialize_any(Visitor)
    }
}

/// One host of a database's list, with its port.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct HostPort {
    /// A name, an address, or a Unix socket folder (starting with `/`).
    pub host: String,
    pub port: u16,
}

/// `host` and `port` as a list of hosts: libpq's rule, one port for all or
/// one per host.
pub fn host_list(host: &str, ports: &Ports) -> Result<Vec<HostPort>, String> {
    let hosts: Vec<&str> = host.split(',').map(str::trim).collect();
    if hosts.iter().any(|h| h.is_empty()) {
        return Err("an empty host in the list".into());
    }
    let ports = ports.as_slice();
    if ports.len() != 1 && ports.len() != hosts.len() {
        return Err(format!("{} ports for {} hosts: give one port for all, or one per host", ports.len(), hosts.len()));
    }
    if hosts.iter().any(|h| h.starts_with('@')) {
        return Err("abstract Unix sockets (@name) are not supported".into());
    }
    let port = |i: usize| if ports.len() == 1 { ports[0] } else { ports[i] };
    Ok(hosts.iter().enumerate().map(|(i, h)| HostPort { host: (*h).to_owned(), port: port(i) }).collect())
}

/// What `weir check-config` says about each database with a host list or a
/// target_session_attrs: where connections go and which servers are kept.
pub fn explain(cfg: &Config) -> Vec<String> {
    let mut out = Vec::new();
    for (name, db) in &cfg.databases {
        let Ok(hosts) = host_list(&db.host, &db.port) else { continue };
        let target = db.target_session_attrs.unwrap_or_default();
        if hosts.len() < 2 && target == TargetSessionAttrs::Any {
            continue;
        }
        let listed: Vec<String> = hosts.iter().map(|h| format!("{}:{}", h.host, h.port)).collect();
        let spread = match db.load_balance_hosts.unwrap_or_default() {
            LoadBalanceHosts::RoundRobin => "new connections take the matching hosts in turn",
            LoadBalanceHosts::Disable => {
                "new connections stay on the host they went to until it fails, then take the next in the list"
            }
            LoadBalanceHosts::Random => "new connections go to a matching host at random",
        };
        out.push(format!(
            "databases.{name}: hosts {} (a name with several addresses counts as several hosts); \
             target_session_attrs = {}: weir keeps {}, closes any other after login and tries the next host; {spread}; \
             when no host matches, every host is probed at once until one does, while clients wait within their budget",
            listed.join(", "),
            target.as_str(),
            target.explained(),
        ));
        if hosts.len() > 1 && target == TargetSessionAttrs::Any {
            out.push(format!(
                "databases.{name}: target_session_attrs = any with several hosts: writes can reach a standby and fail \
                 with 25006; set target_session_attrs = \"read-write\" for a database clients write to"
            ));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp(h: &str, p: u16) -> HostPort {
        HostPort { host: h.into(), port: p }
    }

    #[test]
    fn lists_take_one_port_for_all_or_one_each() {
        assert_eq!(host_list("a,b", &Ports::one(5432)).unwrap(), vec![hp("a", 5432), hp("b", 5432)]);
        let two: Ports = "5432, 5433".parse().unwrap();
        assert_eq!(host_list("a, b", &two).unwrap(), vec![hp("a", 5432), hp("b", 5433)]);
        assert!(host_list("a,b,c", &two).unwrap_err().contains("2 ports for 3 hosts"));
        assert!(host_list("a,,b", &Ports::one(1)).is_err());
        assert!(host_list("@abstract", &Ports::one(1)).is_err());
        assert_eq!(host_list("/run/pg", &Ports::one(5432)).unwrap(), vec![hp("/run/pg", 5432)]);
    }

    #[test]
    fn ports_read_numbers_and_strings() {
        #[derive(Deserialize, Serialize)]
        struct T {
            port: Ports,
        }
        let t: T = toml::from_str("port = 5433").unwrap();
        assert_eq!(t.port, Ports::one(5433));
        let t: T = toml::from_str("port = \"1,2\"").unwrap();
        assert_eq!(t.port.as_slice(), &[1, 2]);
        assert_eq!(toml::to_string(&t).unwrap().trim(), "port = \"1,2\"");
        assert!(toml::from_str::<T>("port = 70000").is_err());
        assert!(toml::from_str::<T>("port = \"1,x\"").is_err());
    }

    #[test]
    fn explains_lists_and_targets() {
        let text = "[weir]\nauth_type = \"trust\"\n[databases.one]\n[databases.ha]\nhost = \"a,b\"\n\
                    target_session_attrs = \"read-write\"\n[databases.spread]\nhost = \"a,b\"\n";
        let cfg = Config::from_toml(text, std::path::Path::new(".")).unwrap();
        let lines = explain(&cfg);
        assert!(lines.iter().all(|l| !l.contains("databases.one")), "{lines:#?}");
        assert!(lines.iter().any(|l| l.starts_with("databases.ha: hosts a:5432, b:5432") && l.contains("read-write")));
        assert!(lines.iter().any(|l| l.starts_with("databases.spread") && l.contains("25006")), "{lines:#?}");
    }
}
