//! `weir migrate-config`: turns a `pgbouncer.ini` into an equivalent
//! `weir.toml`, with a warning for each setting that cannot be carried over.
//! Pure text in, text out. Same-named keys map directly, their TOML type taken
//! from weir's own defaults; PgBouncer's bare seconds become `"Ns"` strings
//! (`tcp_user_timeout` is in milliseconds there); `0` meaning "disabled" is
//! handled key by key. `listen_addr` + `listen_port` become weir's
//! `listen_addr` (`*` is `*:port`, a list keeps every address); an unset
//! `unix_socket_dir` is written as PgBouncer's default `/tmp`, since weir's
//! own default is no Unix socket. The metrics port follows the listen port
//! (`metrics_port`), so weirs migrated side by side on one host differ.

use std::fmt::Write as _;

use super::keys;
use super::General;

/// The generated config and what could not be carried over.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Migration {
    pub toml: String,
    /// Settings not carried over (no weir equivalent, or weir's nearest used).
    pub warnings: Vec<String>,
    /// Values PgBouncer itself refuses (a word where a number belongs): also
    /// in `warnings`; weir run on the ini refuses it (a RELOAD fails) as
    /// PgBouncer does.
    pub errors: Vec<String>,
}

/// PgBouncer keys measured in seconds that weir stores as durations.
const SECONDS: &[&str] = &[
    "reserve_pool_timeout",
    "server_check_delay",
    "stats_period",
    "server_lifetime",
    "server_idle_timeout",
    "server_connect_timeout",
    "server_login_retry",
    "client_login_timeout",
    "query_wait_timeout",
    "query_timeout",
    "idle_transaction_timeout",
    "transaction_timeout",
    "query_wait_notify",
    "client_idle_timeout",
    "autodb_idle_timeout",
    "tcp_keepidle",
    "tcp_keepintvl",
];

/// Keys where PgBouncer's `0` means "off" and weir's optional key is left unset.
const ZERO_IS_UNSET: &[&str] =
    &["query_timeout", "idle_transaction_timeout", "transaction_timeout", "tcp_user_timeout"];

/// Keys where PgBouncer's `0` means "off" (or "OS default") and weir has no
/// such setting: weir's default is kept, with the reason.
const ZERO_KEEPS_DEFAULT: &[(&str, &str)] = &[
    ("server_idle_timeout", "weir always closes idle servers eventually"),
    ("client_login_timeout", "weir always bounds the login"),
    ("query_wait_timeout", "weir always bounds the wait for a server"),
    ("server_connect_timeout", "weir always bounds the connect"),
    ("tcp_keepidle", "weir sets keepalive timing itself"),
    ("tcp_keepintvl", "weir sets keepalive timing itself"),
];

/// PgBouncer settings weir has no equivalent for, and why.
const UNSUPPORTED: &[(&str, &str)] = &[
    ("client_tls_", "weir uses rustls's cipher suites and curves for TLS 1.2 and 1.3"),
    ("server_tls_", "weir uses rustls's cipher suites for TLS 1.2 and 1.3"),
    ("logfile", "weir logs to stderr; let the supervisor collect it"),
    ("syslog", "weir logs to stderr; let the supervisor collect it"),
    ("syslog_", "weir logs to stderr; let the supervisor collect it"),
    ("pidfile", "weir does not daemonize"),
    ("user", "weir does not switch users; run it as the user it should be"),
];

/// Reads `pgbouncer.ini` text and writes the equivalent weir config.
pub fn from_pgbouncer_ini(text: &str) -> Migration {
    let mut m = Mapper::default();
    for line in parse_ini(text) {
        match line {
            IniLine::Entry { section, key, value, line } => m.entry(&section, &key, &value, line),
            IniLine::Other { warning } => m.warnings.push(warning),
        }
    }
    m.finish()
}

#[derive(Debug, PartialEq, Eq)]
enum IniLine {
    Entry { section: String, key: String, value: String, line: usize },
    Other { warning: String },
}

fn parse_ini(text: &str) -> Vec<IniLine> {
    let mut section = String::new();
    let mut out = Vec::new();
    // A line ending in `\` goes on on the next one (PgBouncer's continuation).
    let mut lines: Vec<(usize, String)> = Vec::new();
    let mut continues = false;
    for (i, raw) in text.lines().enumerate() {
        let (body, more) = match raw.trim_end().strip_suffix('\\') {
            Some(b) => (b, true),
            None => (raw, false),
        };
        match lines.last_mut() {
            Some((_, joined)) if continues => joined.push_str(body),
            _ => lines.push((i, body.to_owned())),
        }
        continues = more;
    }
    for (i, raw) in &lines {
        let (i, raw) = (*i, raw.as_str());
        let line = strip_comment(raw).trim();
        if line.is_empty() {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            section = name.trim().to_ascii_lowercase();
        } else if line.starts_with("%include") {
            out.push(IniLine::Other { warning: format!("line {}: {line}: merge the included file by hand", i + 1) });
        } else if let Some((k, v)) = line.split_once('=') {
            let (key, value) = (k.trim().to_owned(), unquote(v.trim()).to_owned());
            out.push(IniLine::Entry { section: section.clone(), key, value, line: i + 1 });
        } else {
            out.push(IniLine::Other { warning: format!("line {}: cannot read \"{line}\"; skipped", i + 1) });
        }
    }
    out
}

/// Cuts a `;` or `#` comment: at the start of a line, or after whitespace
/// outside quotes.
fn strip_comment(line: &str) -> &str {
    let mut quote = None;
    let mut prev_space = true;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (None, '\'' | '"') => quote = Some(c),
            (Some(q), c) if c == q => quote = None,
            (None, ';' | '#') if prev_space => return &line[..i],
            _ => {}
        }
        prev_space = c.is_whitespace();
    }
    line
}

fn unquote(v: &str) -> &str {
    for q in ['"', '\''] {
        if let Some(inner) = v.strip_prefix(q).and_then(|v| v.strip_suffix(q)) {
            return inner;
        }
    }
    v
}

#[derive(Debug, Default)]
struct Mapper {
    general: Vec<(String, String)>,
    listen_host: Option<String>,
    listen_port: Option<String>,
    /// The ini set unix_socket_dir (perhaps empty: no socket).
    unix_socket_dir_set: bool,
    /// `[metrics]`'s port, derived from the listen port in `finish`.
    metrics_port: u16,
    databases: Vec<(String, Vec<(String, String)>)>,
    users: Vec<(String, Vec<(String, String)>)>,
    peers: Vec<(String, Vec<(String, String)>)>,
    warnings: Vec<String>,
    errors: Vec<String>,
}

impl Mapper {
    fn entry(&mut self, section: &str, key: &str, value: &str, line: usize) {
        match section {
            "pgbouncer" => self.setting(key, value, line),
            "databases" => self.database(key, value, line),
            "users" => self.user(key, value, line),
            "peers" => self.peer(key, value, line),
            other => self.warn(line, format!("[{other}] {key}: section not supported by weir")),
        }
    }

    fn warn(&mut self, line: usize, msg: String) {
        self.warnings.push(format!("line {line}: {msg}"));
    }

    fn set(&mut self, key: &str, toml_value: String) {
        self.general.retain(|(k, _)| k != key);
        self.general.push((key.to_owned(), toml_value));
    }

    /// One `[pgbouncer]` setting.
    fn setting(&mut self, key: &str, value: &str, line: usize) {
        let result = match key {
            "listen_addr" => self.listen_addr(value),
            "listen_port" => {
                self.listen_port = Some(value.to_owned());
                Ok(())
            }
            "unix_socket_dir" => {
                self.unix_socket_dir_set = true;
                self.same_named(key, value)
            }
            "auth_type" => self.auth_type(value),
            "pool_mode" => self.pool_mode(value),
            "max_packet_size" => int(value).map(|v| self.set("max_message_size", v)),
            "tcp_user_timeout" => self.duration(key, value, 0.001),
            k if SECONDS.contains(&k) => self.duration(key, value, 1.0),
            k if keys::general_keys().contains(&k) => self.same_named(key, value),
            _ => Err(unsupported(key)),
        };
        if let Err(why) = result {
            if is_invalid_value(&why) {
                self.errors.push(format!("line {line}: {key} = {value}: {why}"));
            }
            self.warn(line, format!("{key} = {value}: {why}"));
        }
    }

    fn listen_addr(&mut self, value: &str) -> Result<(), String> {
        if value
            .split(',')
            .any(|a| !matches!(a.trim(), "*" | "localhost") && a.trim().parse::<std::net::IpAddr>().is_err())
        {
            return Err("weir listens on IP addresses (or *), not host names; weir's default is kept".into());
        }
        // weir listens on an address, not a name: localhost is the loopback.
        let hosts: Vec<&str> =
            value.split(',').map(|a| if a.trim() == "localhost" { "127.0.0.1" } else { a.trim() }).collect();
        self.listen_host = Some(hosts.join(","));
        Ok(())
    }

    fn auth_type(&mut self, value: &str) -> Result<(), String> {
        match value {
            "trust" | "any" | "plain" | "md5" | "scram-sha-256" | "hba" => {
                self.set("auth_type", quoted(value));
                Ok(())
            }
            other => Err(format!(
                "weir supports trust, any, plain, md5, scram-sha-256 and hba, not {other}; weir's default md5 is kept"
            )),
        }
    }

    fn pool_mode(&mut self, value: &str) -> Result<(), String> {
        match value {
            "session" | "transaction" => {
                self.set("pool_mode", quoted(value));
                Ok(())
            }
            _ => {
                self.set("pool_mode", quoted("transaction"));
                Err("weir supports session and transaction pooling; transaction, the nearest, is used".into())
            }
        }
    }

    /// A duration in PgBouncer units of `unit` seconds.
    fn duration(&mut self, key: &str, value: &str, unit: f64) -> Result<(), String> {
        let n: f64 =
            value.parse().map_err(|_| format!("not a number of {}", if unit < 1.0 { "ms" } else { "seconds" }))?;
        if n < 0.0 || !n.is_finite() {
            return Err("not a valid duration".into());
        }
        if n == 0.0 {
            if ZERO_IS_UNSET.contains(&key) {
                return Ok(());
            }
            if let Some((_, why)) = ZERO_KEEPS_DEFAULT.iter().find(|(k, _)| *k == key) {
                return Err(format!("0 (off) has no weir equivalent: {why}; weir's default is kept"));
            }
        }
        self.set(key, quoted(&seconds(n * unit)));
        Ok(())
    }

    /// A key with the same name in weir; the TOML type is that of weir's default.
    fn same_named(&mut self, key: &str, value: &str) -> Result<(), String> {
        let defaults = toml::Value::try_from(General::default()).ok();
        let default = defaults.as_ref().and_then(|d| d.get(key));
        let v = match default {
            // A duration weir has that this list does not know: PgBouncer's are seconds.
            Some(toml::Value::String(d)) if humantime::parse_duration(d).is_ok() => {
                return self.duration(key, value, 1.0);
            }
            Some(toml::Value::Integer(_)) => int(value)?,
            Some(toml::Value::Float(_)) => value.parse::<f64>().map_err(|_| "not a number".to_string())?.to_string(),
            Some(toml::Value::Boolean(_)) => boolean(value)?,
            Some(toml::Value::Array(_)) => list(value),
            _ => quoted(value),
        };
        self.set(key, v);
        Ok(())
    }

    /// One `[users]` line: `name = pool_mode=session pool_size=5 ...`.
    fn user(&mut self, name: &str, value: &str, line: usize) {
        let mut out = Vec::new();
        for (k, v) in conninfo(value) {
            let kv = match k.as_str() {
                "pool_size" | "reserve_pool_size" | "max_user_connections" | "max_user_client_connections" => {
                    int(&v).map(|n| (k.clone(), n))
                }
                "pool_mode" => pool_mode_value(&v).map(|m| (k.clone(), m)),
                "query_timeout" | "idle_transaction_timeout" | "client_idle_timeout" | "transaction_timeout" => v
                    .parse::<f64>()
                    .map_err(|_| "not a number of seconds".to_string())
                    .map(|n| (k.clone(), quoted(&seconds(n)))),
                _ => Err("not supported per user by weir".into()),
            };
            match kv {
                Ok(kv) => out.push(kv),
                Err(why) => self.warn(line, format!("[users] {name}: {k}={v}: {why}")),
            }
        }
        self.users.push((name.to_owned(), out));
    }

    /// One `[peers]` line: `id = host=... port=... pool_size=...`.
    fn peer(&mut self, id: &str, value: &str, line: usize) {
        if !id.parse::<u16>().is_ok_and(|n| (1..=super::MAX_PEER_ID).contains(&n)) {
            return self.warn(line, format!("[peers] {id}: a peer's id is a number from 1 to 16383; skipped"));
        }
        let mut out = Vec::new();
        for (k, v) in conninfo(value) {
            let kv = match k.as_str() {
                "host" => Ok((k.clone(), quoted(&v))),
                // port, pool_size
                k if keys::peer_keys().contains(&k) => int(&v).map(|n| (k.to_owned(), n)),
                _ => Err("not a peer's key (host, port, pool_size)".into()),
            };
            match kv {
                Ok(kv) => out.push(kv),
                Err(why) => self.warn(line, format!("[peers] {id}: {k}={v}: {why}")),
            }
        }
        // A later line for the same id replaces the earlier, as in PgBouncer.
        self.peers.retain(|(name, _)| name != id);
        self.peers.push((id.to_owned(), out));
    }

    /// One `[databases]` line: `name = host=... port=... dbname=...`;
    /// `*` is the fallback database.
    fn database(&mut self, name: &str, value: &str, line: usize) {
        let mut out = Vec::new();
        for (k, v) in conninfo(value) {
            match self.database_key(&k, &v) {
                Ok(Some(kv)) => out.push(kv),
                Ok(None) => {}
                Err(why) => self.warn(line, format!("[databases] {name}: {k}={v}: {why}")),
            }
        }
        if out.iter().any(|(k, v)| k == "host" && v.contains(',')) {
            self.warn(
                line,
                format!(
                    "[databases] {name}: several hosts: PgBouncer connects to each in turn without checking which \
                     accepts writes, and weir keeps that (target_session_attrs = \"any\"); add \
                     target_session_attrs = \"read-write\" to [databases.{}] if clients write, so weir keeps \
                     servers only on the primary and finds the new one after a failover",
                    toml_key(name)
                ),
            );
        }
        self.databases.push((name.to_owned(), out));
    }

    fn database_key(&self, k: &str, v: &str) -> Result<Option<(String, String)>, String> {
        let kv = |key: &str, val: String| Ok(Some((key.to_owned(), val)));
        match k {
            "host" => kv("host", quoted(v)),
            "port" => kv(k, ports(v)?),
            "load_balance_hosts" => match v {
                "round-robin" | "disable" => kv(k, quoted(v)),
                _ => Err("PgBouncer's values are round-robin and disable".into()),
            },
            "pool_size" | "min_pool_size" | "max_db_connections" | "max_db_client_connections" => kv(k, int(v)?),
            "reserve_pool" | "reserve_pool_size" => kv("reserve_pool_size", int(v)?),
            "pool_mode" => kv("pool_mode", pool_mode_value(v)?),
            "server_lifetime" => kv(k, quoted(&seconds(v.parse::<f64>().map_err(|_| "not a number of seconds")?))),
            "dbname" | "user" | "password" | "auth_user" | "auth_dbname" | "auth_query" | "connect_query"
            | "application_name" | "client_encoding" | "datestyle" | "timezone" => kv(k, quoted(v)),
            _ => Err("not supported per database by weir".into()),
        }
    }

    fn finish(mut self) -> Migration {
        self.metrics_port = metrics_port(self.listen_port.as_deref().and_then(|p| p.trim().parse().ok()));
        if self.listen_host.is_some() || self.listen_port.is_some() {
            let hosts = self.listen_host.take().unwrap_or_else(|| "127.0.0.1".into());
            let port = self.listen_port.take().unwrap_or_else(|| "6432".into());
            let with_port = |h: &str| match h.trim() {
                h if h.contains(':') => format!("[{h}]:{port}"),
                h => format!("{h}:{port}"),
            };
            let addrs: Vec<String> = hosts.split(',').map(with_port).collect();
            self.general.insert(0, ("listen_addr".into(), quoted(&addrs.join(","))));
        }
        if !self.unix_socket_dir_set {
            let tmp = "\"/tmp\"  # PgBouncer's default, kept; weir's own default is no Unix socket";
            self.general.push(("unix_socket_dir".into(), tmp.into()));
        }
        if !self.general.iter().any(|(k, _)| k == "pool_mode") {
            // PgBouncer's default; weir's own default is transaction.
            self.general.push(("pool_mode".into(), quoted("session")));
        }
        if !self.general.iter().any(|(k, _)| k == "sigterm") {
            // PgBouncer 1.23's SIGTERM (SHUTDOWN WAIT_FOR_CLIENTS): a rolling
            // restart of instances that share a port depends on it.
            let keep = "\"wait_for_clients\"  # PgBouncer's SIGTERM, kept; weir's own default is \"drain\"";
            self.general.push(("sigterm".into(), keep.into()));
        }
        for key in ["log_connections", "log_disconnections"] {
            if !self.general.iter().any(|(k, _)| k == key) {
                // PgBouncer's default (its login and `closing because` lines); weir's own is off.
                self.general
                    .push((key.into(), "true  # PgBouncer's default, kept; weir's own default is false".into()));
            }
        }
        let auth_type = self.general.iter().find(|(k, _)| k == "auth_type").map(|(_, v)| v.as_str());
        let has_auth_file = self.general.iter().any(|(k, _)| k == "auth_file");
        if auth_type == Some("\"trust\"") && !has_auth_file {
            self.warnings.push(
                "auth_type = trust without auth_file: weir admits every user name, where PgBouncer refuses every \
                 login (\"trust\" authentication failed); set auth_file to list who may connect"
                    .into(),
            );
        }
        let passwordless = matches!(auth_type, Some("\"trust\"" | "\"any\""));
        if !passwordless && !has_auth_file {
            self.warnings
                .push("auth_file is not set: weir needs one unless auth_type = \"trust\" or \"any\"; add it".into());
        }
        let toml = with_differences(self.render());
        Migration { toml, warnings: self.warnings, errors: self.errors }
    }

    fn render(&self) -> String {
        let mut out = String::from(
            "# Generated by `weir migrate-config` from a pgbouncer.ini.\n\
             # Keys not set there take weir's defaults; config/weir.toml documents every key.\n\n[weir]\n",
        );
        for (k, v) in &self.general {
            let _ = writeln!(out, "{k} = {v}");
        }
        let _ = write!(
            out,
            "\n[metrics]\n# Prometheus /metrics, /healthz, /readyz (PgBouncer has no equivalent). The port follows\n\
             # the listen port (6432 -> 9930, 6433 -> 9931), so weirs on one host do not collide.\n\
             listen_addr = \"127.0.0.1:{}\"\n",
            self.metrics_port
        );
        for (section, entries) in [("databases", &self.databases), ("users", &self.users), ("peers", &self.peers)] {
            for (name, kvs) in entries {
                let _ = writeln!(out, "\n[{section}.{}]", toml_key(name));
                for (k, v) in kvs {
                    let _ = writeln!(out, "{k} = {v}");
                }
            }
        }
        out
    }
}

/// The weir.toml with, after its first two comment lines, the deliberate
/// differences from PgBouncer that it meets (as comments).
fn with_differences(toml: String) -> String {
    let Ok(cfg) = super::Config::from_toml(&toml, std::path::Path::new(".")) else { return toml };
    let notes = super::differences::for_config(&cfg);
    let Some(at) = toml.match_indices('\n').nth(1).map(|(i, _)| i + 1) else { return toml };
    let mut head = String::from("# Where weir differs from PgBouncer on purpose (docs/moving-from-pgbouncer.md):\n");
    for n in notes {
        let _ = writeln!(head, "#   - {n}");
    }
    format!("{}{head}{}", &toml[..at], &toml[at..])
}

/// A pool_mode weir has, as TOML.
fn pool_mode_value(v: &str) -> Result<String, String> {
    match v {
        "session" | "transaction" => Ok(quoted(v)),
        _ => Err("weir supports session and transaction pooling".into()),
    }
}

/// The metrics port for a listen port: 9930 for PgBouncer's 6432, and one
/// more for each port above it (6433 -> 9931), so two weirs migrated for one
/// host do not both take 9930. Below 6432 it falls alike (5432 -> 8930); a
/// listen port whose offset leaves the port range counts down instead.
pub(crate) fn metrics_port(listen_port: Option<u16>) -> u16 {
    const OFFSET: u16 = 9930 - 6432;
    let port = listen_port.unwrap_or(6432);
    port.checked_add(OFFSET).unwrap_or(port - OFFSET)
}

fn unsupported(key: &str) -> String {
    match UNSUPPORTED.iter().find(|(k, _)| key == *k || (k.ends_with('_') && key.starts_with(k))) {
        Some((_, why)) => format!("not supported: {why}"),
        None => "not supported by weir".into(),
    }
}

/// libpq-style `key=value key='quoted value'` pairs.
fn conninfo(s: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = s.chars().peekable();
    loop {
        while chars.next_if(|c| c.is_whitespace()).is_some() {}
        let key: String = std::iter::from_fn(|| chars.next_if(|c| *c != '=' && !c.is_whitespace())).collect();
        if key.is_empty() {
            return out;
        }
        while chars.next_if(|c| c.is_whitespace() || *c == '=').is_some() {}
        let mut value = String::new();
        if chars.next_if_eq(&'\'').is_some() {
            while let Some(c) = chars.next() {
                match c {
                    '\\' => value.extend(chars.next()),
                    '\'' => break,
                    c => value.push(c),
                }
            }
        } else {
            value.extend(std::iter::from_fn(|| chars.next_if(|c| !c.is_whitespace())));
        }
        out.push((key, value));
    }
}

/// One port as a TOML integer; a list (libpq's) as a string.
fn ports(v: &str) -> Result<String, String> {
    let ports: super::Ports = v.trim().parse()?;
    Ok(match ports.as_slice() {
        [one] => one.to_string(),
        _ => quoted(&ports.to_string()),
    })
}

/// The reasons `int`, `boolean` and `duration` give for a value of the wrong
/// kind (PgBouncer refuses these), as against a setting weir lacks.
fn is_invalid_value(why: &str) -> bool {
    ["not a whole number", "not a boolean", "not a number", "not a valid duration"].iter().any(|p| why.starts_with(p))
}

fn int(v: &str) -> Result<String, String> {
    v.parse::<u64>().map(|n| n.to_string()).map_err(|_| "not a whole number".into())
}

fn boolean(v: &str) -> Result<String, String> {
    match v.to_ascii_lowercase().as_str() {
        "1" | "yes" | "on" | "true" => Ok("true".into()),
        "0" | "no" | "off" | "false" => Ok("false".into()),
        _ => Err("not a boolean (0 or 1)".into()),
    }
}

fn list(v: &str) -> String {
    let items: Vec<String> = v.split(',').map(str::trim).filter(|s| !s.is_empty()).map(quoted).collect();
    format!("[{}]", items.join(", "))
}

fn quoted(s: &str) -> String {
    toml::Value::String(s.to_owned()).to_string()
}

fn toml_key(name: &str) -> String {
    if !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
        name.to_owned()
    } else {
        quoted(name)
    }
}

/// Seconds as a humantime string: whole seconds as `"Ns"`, else milliseconds.
fn seconds(s: f64) -> String {
    if s.fract() == 0.0 {
        format!("{}s", s as u64)
    } else {
        format!("{}ms", (s * 1000.0).round() as u64)
    }
}

#[cfg(test)]
mod tests;
