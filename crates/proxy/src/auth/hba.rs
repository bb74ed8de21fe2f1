//! `auth_hba_file`: PgBouncer's subset of `pg_hba.conf`, used when
//! `auth_type = "hba"`. Each line names a connection type, databases, users,
//! an address and a method; the first line that matches a client decides its
//! method, and a client no line matches is refused (28000), as Postgres does.
//!
//! Supported: `host` lines (every TCP client), `hostssl` (TLS clients only),
//! `hostnossl` and `hostnogssenc` (plain TCP clients only), `local` (clients
//! on weir's Unix socket, which match no `host*` line); `hostgssenc` lines
//! never match (GSS is not planned). Databases: `all`, `sameuser`,
//! `replication` (the lines physical replication clients match, and only
//! they, as in Postgres; a logical one matches by its database), or names
//! (comma-separated, quoted to take a keyword literally); users: `all` or
//! names. Addresses: `all`, a CIDR (`10.0.0.0/8`, `::1/128`), or an
//! address followed by a netmask field. Methods: `trust`, `reject`, `md5`
//! (which does SCRAM for users whose secret is a SCRAM verifier, as Postgres
//! does), `scram-sha-256`, and on `local` lines `peer`, which loads but
//! refuses the client ("peer authentication is not supported") until weir
//! implements it. Anything else (`@file`, `+group`, host names,
//! other methods, options after the method) is an error when the file is
//! loaded, never silently ignored. Parsing and matching only; no I/O but `load`.

use std::net::IpAddr;
use std::path::Path;

use super::AuthError;
use crate::config::AuthType;
use crate::protocol::replication::Replication;

/// What the first matching line says to do with a client.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Method {
    Trust,
    /// `password`: the cleartext exchange (auth_type `plain`).
    Password,
    Md5,
    ScramSha256,
    Reject,
    /// `peer` (local lines only): not supported yet; refuses the client.
    Peer,
}

impl Method {
    /// The exchange to run, or None for `reject`.
    pub fn auth_type(self) -> Option<AuthType> {
        match self {
            Method::Trust => Some(AuthType::Trust),
            Method::Password => Some(AuthType::Plain),
            Method::Md5 => Some(AuthType::Md5),
            Method::ScramSha256 => Some(AuthType::ScramSha256),
            Method::Reject | Method::Peer => None,
        }
    }
}

/// The exchange for one client: `auth_type` itself, or with
/// `auth_type = "hba"` the method of the first line of `hba` that matches;
/// refused, in Postgres's words, by a `reject` line or when none matches.
/// `peer` is None for a client on weir's Unix socket.
pub fn method_for(
    auth_type: AuthType,
    hba: Option<&Hba>,
    peer: Option<IpAddr>,
    tls: bool,
    database: &str,
    user: &str,
) -> Result<AuthType, AuthError> {
    method_for_client(auth_type, hba, peer, tls, database, user, Replication::None)
}

/// `method_for` for a client that may be a replication client: a physical
/// one matches only lines whose databases include the `replication`
/// keyword (whatever database it names), as Postgres and PgBouncer match
/// it; a logical one (`replication=database`) matches by its database, as
/// an ordinary client.
pub fn method_for_client(
    auth_type: AuthType,
    hba: Option<&Hba>,
    peer: Option<IpAddr>,
    tls: bool,
    database: &str,
    user: &str,
    replication: Replication,
) -> Result<AuthType, AuthError> {
    if auth_type != AuthType::Hba {
        return Ok(auth_type);
    }
    let peer = peer.map(|p| p.to_canonical());
    let host = peer.map_or_else(|| "[local]".to_owned(), |p| p.to_string());
    let encryption = if tls { "SSL encryption" } else { "no encryption" };
    let physical = replication == Replication::Physical;
    let (who, what) = if physical {
        (format!("host \"{host}\", user \"{user}\", {encryption}"), "replication connection")
    } else {
        (format!("host \"{host}\", user \"{user}\", database \"{database}\", {encryption}"), "connection")
    };
    match hba.and_then(|h| h.find(peer, tls, database, user, physical)) {
        Some(Method::Peer) => Err(AuthError::Refused("peer authentication is not supported".into())),
        Some(m) => m.auth_type().ok_or_else(|| AuthError::Refused(format!("pg_hba.conf rejects {what} for {who}"))),
        None if physical => Err(AuthError::Refused(format!("no pg_hba.conf entry for {what} from {who}"))),
        None => Err(AuthError::Refused(format!("no pg_hba.conf entry for {who}"))),
    }
}

/// Why an hba file was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum HbaError {
    #[error("cannot read {0}: {1}")]
    Read(String, String),
    #[error("line {line}: {why}")]
    Line { line: usize, why: String },
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ConnType {
    /// `host`: every TCP client.
    Any,
    /// `hostssl`: clients that negotiated TLS.
    Ssl,
    /// `hostnossl`, `hostnogssenc`: plain clients.
    NoSsl,
    /// `local`: clients on weir's Unix socket.
    Local,
    /// Needs an encryption weir does not offer (or a Unix socket): never matches.
    Never,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Names {
    All,
    SameUser,
    List(Vec<String>),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Addr {
    All,
    Net(IpAddr, u8),
}

#[derive(Debug, Clone, PartialEq, Eq)]
struct Rule {
    conn: ConnType,
    databases: Names,
    /// The databases field holds the `replication` keyword: the line is
    /// for physical replication clients (and only they match it by it).
    replication: bool,
    users: Names,
    addr: Addr,
    method: Method,
}

/// A parsed hba file: its rules in order.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Hba {
    rules: Vec<Rule>,
}

/// One comma-separated item of a field, and whether it was quoted.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Token {
    text: String,
    quoted: bool,
}

impl Token {
    fn keyword(&self, word: &str) -> bool {
        !self.quoted && self.text == word
    }
}

impl Hba {
    /// Reads and parses the file at `path`.
    pub fn load(path: &Path) -> Result<Hba, HbaError> {
        let text =
            std::fs::read_to_string(path).map_err(|e| HbaError::Read(path.display().to_string(), e.to_string()))?;
        Hba::parse(&text)
    }

    pub fn parse(text: &str) -> Result<Hba, HbaError> {
        let mut rules = Vec::new();
        for (i, line) in text.lines().enumerate() {
            let bad = |why: String| HbaError::Line { line: i + 1, why };
            let fields = split_fields(line).map_err(|w| bad(w.to_owned()))?;
            if fields.is_empty() {
                continue;
            }
            rules.push(rule(&fields).map_err(bad)?);
        }
        Ok(Hba { rules })
    }

    /// The method of the first line matching a plain-TCP client from `peer`
    /// asking for `database` as `user`; None when no line matches.
    pub fn method(&self, peer: IpAddr, database: &str, user: &str) -> Option<Method> {
        self.method_over(peer, false, database, user)
    }

    /// As `method`, for a physical replication client.
    pub fn method_physical(&self, peer: IpAddr, user: &str) -> Option<Method> {
        self.find(Some(peer.to_canonical()), false, "replication", user, true)
    }

    /// As `method`, for a client that did (`tls`) or did not negotiate TLS.
    pub fn method_over(&self, peer: IpAddr, tls: bool, database: &str, user: &str) -> Option<Method> {
        self.find(Some(peer.to_canonical()), tls, database, user, false)
    }

    /// As `method`, for a client on weir's Unix socket (`local` lines).
    pub fn method_local(&self, database: &str, user: &str) -> Option<Method> {
        self.find(None, false, database, user, false)
    }

    /// The first line matching a TCP client from `peer`, or (None) a
    /// Unix-socket client; `physical`: a physical replication client.
    fn find(&self, peer: Option<IpAddr>, tls: bool, database: &str, user: &str, physical: bool) -> Option<Method> {
        self.rules.iter().find(|r| r.matches(peer, tls, database, user, physical)).map(|r| r.method)
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }
}

impl Rule {
    fn matches(&self, peer: Option<IpAddr>, tls: bool, database: &str, user: &str, physical: bool) -> bool {
        let conn_ok = match (self.conn, peer) {
            (ConnType::Local, local) => local.is_none(),
            (_, None) | (ConnType::Never, _) => false,
            (ConnType::Any, Some(ip)) => addr_match(self.addr, ip),
            (ConnType::Ssl, Some(ip)) => tls && addr_match(self.addr, ip),
            (ConnType::NoSsl, Some(ip)) => !tls && addr_match(self.addr, ip),
        };
        let database_ok = if physical { self.replication } else { names_match(&self.databases, database, user) };
        conn_ok && database_ok && names_match(&self.users, user, user)
    }
}

fn names_match(names: &Names, name: &str, user: &str) -> bool {
    match names {
        Names::All => true,
        Names::SameUser => name == user,
        Names::List(list) => list.iter().any(|n| n == name),
    }
}

fn addr_match(addr: Addr, peer: IpAddr) -> bool {
    match (addr, peer) {
        (Addr::All, _) => true,
        (Addr::Net(IpAddr::V4(net), bits), IpAddr::V4(p)) => {
            prefix_eq(net.to_bits().into(), p.to_bits().into(), bits, 32)
        }
        (Addr::Net(IpAddr::V6(net), bits), IpAddr::V6(p)) => prefix_eq(net.to_bits(), p.to_bits(), bits, 128),
        _ => false,
    }
}

/// Whether the first `bits` of two `width`-bit addresses agree.
fn prefix_eq(a: u128, b: u128, bits: u8, width: u8) -> bool {
    let shift = u32::from(width - bits.min(width));
    a.checked_shr(shift).unwrap_or(0) == b.checked_shr(shift).unwrap_or(0)
}

/// Splits a line into fields of comma-separated tokens, honouring double
/// quotes (`""` inside quotes is a quote) and `#` comments.
fn split_fields(line: &str) -> Result<Vec<Vec<Token>>, &'static str> {
    let mut fields: Vec<Vec<Token>> = Vec::new();
    let mut field: Vec<Token> = Vec::new();
    let mut tok = Token { text: String::new(), quoted: false };
    let (mut in_quotes, mut started) = (false, false);
    let mut chars = line.chars().peekable();
    while let Some(c) = chars.next() {
        match c {
            '"' if in_quotes && chars.peek() == Some(&'"') => {
                chars.next();
                tok.text.push('"');
            }
            '"' => {
                in_quotes = !in_quotes;
                tok.quoted = true;
                started = true;
            }
            _ if in_quotes => tok.text.push(c),
            '#' => break,
            ',' => {
                field.push(std::mem::replace(&mut tok, Token { text: String::new(), quoted: false }));
            }
            c if c.is_whitespace() => {
                if started {
                    field.push(std::mem::replace(&mut tok, Token { text: String::new(), quoted: false }));
                    fields.push(std::mem::take(&mut field));
                    started = false;
                }
            }
            c => {
                tok.text.push(c);
                started = true;
            }
        }
    }
    if in_quotes {
        return Err("unterminated quoted string");
    }
    if started {
        field.push(tok);
        fields.push(field);
    } else if !field.is_empty() {
        return Err("a comma-separated list ends with a comma");
    }
    if fields.iter().flatten().any(|t| t.text.is_empty() && !t.quoted) {
        return Err("empty item in a comma-separated list");
    }
    Ok(fields)
}

fn single<'a>(field: &'a [Token], what: &str) -> Result<&'a Token, String> {
    match field {
        [t] => Ok(t),
        _ => Err(format!("{what} takes one value, not a list")),
    }
}

fn rule(fields: &[Vec<Token>]) -> Result<Rule, String> {
    let kind = single(&fields[0], "the connection type")?;
    let conn = match kind.text.as_str() {
        "host" => ConnType::Any,
        "hostssl" => ConnType::Ssl,
        "hostnossl" | "hostnogssenc" => ConnType::NoSsl,
        "local" => ConnType::Local,
        "hostgssenc" => ConnType::Never,
        other => return Err(format!("unknown connection type \"{other}\"")),
    };
    let rest = &fields[1..];
    let (databases, users, addr, method_at) = match (kind.text.as_str(), rest) {
        ("local", [db, user, ..]) => (db, user, Addr::All, 2),
        (_, [db, user, addr, ..]) => {
            let (addr, used) = address(addr, rest.get(3))?;
            (db, user, addr, 2 + used)
        }
        _ => return Err("too few fields: want type, database, user, address and method".into()),
    };
    let method = match rest.get(method_at) {
        Some(m) => method(single(m, "the method")?)?,
        None => return Err("missing the method".into()),
    };
    if rest.len() > method_at + 1 {
        return Err("options after the method are not supported".into());
    }
    if method == Method::Peer && conn != ConnType::Local {
        return Err("peer authentication is only supported on local sockets".into());
    }
    let replication = databases.iter().any(|t| t.keyword("replication"));
    Ok(Rule { conn, databases: names(databases, true)?, replication, users: names(users, false)?, addr, method })
}

fn names(field: &[Token], database: bool) -> Result<Names, String> {
    let mut list = Vec::new();
    for t in field {
        match t.text.as_str() {
            _ if t.quoted => list.push(t.text.clone()),
            "all" if field.len() == 1 => return Ok(Names::All),
            "sameuser" if database && field.len() == 1 => return Ok(Names::SameUser),
            // Physical replication clients match it (`Rule::replication`);
            // it names no database.
            "replication" if database => {}
            "all" | "sameuser" => return Err(format!("\"{}\" must stand alone", t.text)),
            "samerole" | "samegroup" => return Err(format!("\"{}\" is not supported: weir has no roles", t.text)),
            s if s.starts_with('@') => return Err(format!("\"{s}\": @file includes are not supported")),
            s if s.starts_with('+') => return Err(format!("\"{s}\": group membership is not supported")),
            s => list.push(s.to_owned()),
        }
    }
    Ok(Names::List(list))
}

/// The address field (and a netmask field after it, if there is one).
/// Returns the address and how many fields it took.
fn address(field: &[Token], next: Option<&Vec<Token>>) -> Result<(Addr, usize), String> {
    let t = single(field, "the address")?;
    if t.keyword("all") {
        return Ok((Addr::All, 1));
    }
    if let Some((ip, bits)) = t.text.split_once('/') {
        let ip: IpAddr = ip.parse().map_err(|_| format!("invalid IP address \"{ip}\""))?;
        let max = if ip.is_ipv4() { 32 } else { 128 };
        let bits: u8 =
            bits.parse().ok().filter(|b| *b <= max).ok_or_else(|| format!("invalid CIDR mask \"{bits}\""))?;
        return Ok((Addr::Net(ip, bits), 1));
    }
    let Ok(ip) = t.text.parse::<IpAddr>() else {
        return Err(format!("\"{}\": host names, samehost and samenet are not supported; use an IP address", t.text));
    };
    let mask = next.ok_or("an address without /bits needs a netmask field")?;
    let mask: IpAddr = single(mask, "the netmask")?.text.parse().map_err(|_| "invalid netmask".to_owned())?;
    let bits = match (ip, mask) {
        (IpAddr::V4(_), IpAddr::V4(m)) => mask_bits(m.to_bits().into(), 32),
        (IpAddr::V6(_), IpAddr::V6(m)) => mask_bits(m.to_bits(), 128),
        _ => None,
    };
    let bits = bits.ok_or("the netmask is not a contiguous mask of the address's family")?;
    Ok((Addr::Net(ip, bits), 2))
}

/// The prefix length of a contiguous netmask of `width` bits.
fn mask_bits(mask: u128, width: u32) -> Option<u8> {
    let aligned = mask << (128 - width);
    let ones = aligned.leading_ones();
    (aligned.checked_shl(ones).unwrap_or(0) == 0).then_some(ones as u8)
}

fn method(t: &Token) -> Result<Method, String> {
    match t.text.as_str() {
        "trust" => Ok(Method::Trust),
        "reject" => Ok(Method::Reject),
        "md5" => Ok(Method::Md5),
        "password" => Ok(Method::Password),
        "scram-sha-256" => Ok(Method::ScramSha256),
        "peer" => Ok(Method::Peer),
        other => {
            Err(format!("method \"{other}\" is not supported (trust, reject, password, md5, scram-sha-256, peer)"))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    const FILE: &str = r#"
# TYPE   DATABASE        USER            ADDRESS           METHOD
local    all             all                               trust
hostssl  all             all             0.0.0.0/0         trust   # never without TLS
host     app,"all"       alice           127.0.0.1/32      trust
host     sameuser        all             10.1.0.0/16       md5
host     app             bob,"carol x"   10.2.0.0 255.255.0.0   scram-sha-256
host     all             mallory         all               reject
host     all             all             ::1/128           md5
hostnossl all            all             192.168.0.0/16    scram-sha-256
"#;

    #[test]
    fn first_matching_line_decides() {
        let hba = Hba::parse(FILE).unwrap();
        assert_eq!(hba.len(), 8);
        let m = |peer: &str, db: &str, user: &str| hba.method(ip(peer), db, user);
        assert_eq!(m("127.0.0.1", "app", "alice"), Some(Method::Trust));
        assert_eq!(m("127.0.0.1", "all", "alice"), Some(Method::Trust), "a quoted keyword is a name");
        assert_eq!(m("127.0.0.1", "other", "alice"), None);
        assert_eq!(m("127.0.0.2", "app", "alice"), None, "/32 is one address");
        assert_eq!(m("10.1.200.3", "bob", "bob"), Some(Method::Md5), "sameuser");
        assert_eq!(m("10.1.200.3", "app", "bob"), None);
        assert_eq!(m("10.2.9.9", "app", "carol x"), Some(Method::ScramSha256), "netmask field, quoted user");
        assert_eq!(m("10.3.0.1", "app", "bob"), None);
        assert_eq!(m("8.8.8.8", "app", "mallory"), Some(Method::Reject));
        assert_eq!(m("::1", "app", "dave"), Some(Method::Md5));
        assert_eq!(m("::ffff:192.168.4.4", "app", "dave"), Some(Method::ScramSha256), "IPv4-mapped IPv6");
        assert_eq!(m("::2", "app", "dave"), None);
    }

    #[test]
    fn tls_lines_match_by_encryption_and_local_lines_only_unix_clients() {
        let tls = Hba::parse("hostssl all all all trust\nhostnossl all all all md5\n").unwrap();
        assert_eq!(tls.method_over(ip("127.0.0.1"), true, "app", "u"), Some(Method::Trust));
        assert_eq!(tls.method_over(ip("127.0.0.1"), false, "app", "u"), Some(Method::Md5));
        assert_eq!(tls.method_local("app", "u"), None, "host lines never match a Unix-socket client");
        let hba = Hba::parse("hostssl all all all trust\nlocal all all trust\nhostgssenc all all all trust\n").unwrap();
        assert_eq!(hba.method(ip("127.0.0.1"), "app", "u"), None);
        assert_eq!(hba.method_local("app", "u"), Some(Method::Trust));
        let hba = Hba::parse("local app all md5\nlocal all all peer\n").unwrap();
        assert_eq!(hba.method_local("app", "u"), Some(Method::Md5));
        assert_eq!(hba.method_local("other", "u"), Some(Method::Peer));
        let hba = Hba::parse("hostnogssenc all all all trust").unwrap();
        assert_eq!(hba.method(ip("127.0.0.1"), "app", "u"), Some(Method::Trust));
    }

    #[test]
    fn cidr_edges() {
        let hba = Hba::parse("host all all 0.0.0.0/0 md5\nhost all all ::/0 trust").unwrap();
        assert_eq!(hba.method(ip("1.2.3.4"), "d", "u"), Some(Method::Md5));
        assert_eq!(hba.method(ip("2001:db8::1"), "d", "u"), Some(Method::Trust));
        let hba = Hba::parse("host all all 10.0.0.0/7 md5").unwrap();
        assert_eq!(hba.method(ip("11.255.0.1"), "d", "u"), Some(Method::Md5));
        assert_eq!(hba.method(ip("12.0.0.1"), "d", "u"), None);
        assert_eq!(mask_bits(0xffff_ff00, 32), Some(24));
        assert_eq!(mask_bits(0, 32), Some(0));
        assert_eq!(mask_bits(u128::MAX, 128), Some(128));
        assert_eq!(mask_bits(0xff00_ff00, 32), None);
    }

    #[test]
    fn password_is_the_cleartext_exchange() {
        let hba = Hba::parse("host all all 0.0.0.0/0 password").unwrap();
        assert_eq!(hba.method(ip("1.2.3.4"), "d", "u"), Some(Method::Password));
        assert_eq!(Method::Password.auth_type(), Some(AuthType::Plain));
    }

    #[test]
    fn unsupported_or_malformed_lines_are_errors() {
        for (line, needle) in [
            ("host all all 127.0.0.1/32 ldap", "not supported"),
            ("host all all 127.0.0.1/32 md5 clientcert=verify-full", "options"),
            ("host all all localhost md5", "host names"),
            ("host all all samenet md5", "host names"),
            ("host all all 127.0.0.1/33 md5", "CIDR"),
            ("host all all 300.0.0.1/8 md5", "invalid IP"),
            ("host all all 127.0.0.1 md5", "netmask"),
            ("host all all 10.0.0.0 255.0.255.0 md5", "contiguous"),
            ("host all +admins all md5", "group"),
            ("host @dbs all all md5", "@file"),
            ("host all,app all all md5", "stand alone"),
            ("host all all all", "missing the method"),
            ("host all all", "too few"),
            ("hostx all all all md5", "connection type"),
            ("host \"app all all md5", "unterminated"),
            ("host app, all all md5", "comma"),
            ("host app,,x all all md5", "empty item"),
            ("host all all all md5,trust", "one value"),
            ("host all all all peer", "only supported on local sockets"),
        ] {
            let err = Hba::parse(&format!("# ok\n{line}\n")).unwrap_err();
            assert!(matches!(&err, HbaError::Line { line: 2, .. }), "{line}: {err}");
            assert!(err.to_string().contains(needle), "{line}: {err}");
        }
    }

    #[test]
    fn method_for_resolves_only_hba() {
        let hba = Hba::parse("host app all 127.0.0.0/8 scram-sha-256\nhost all evil all reject").unwrap();
        let local = Some(ip("127.0.0.1"));
        assert_eq!(method_for(AuthType::Md5, Some(&hba), local, false, "x", "evil").unwrap(), AuthType::Md5);
        assert_eq!(method_for(AuthType::Hba, Some(&hba), local, false, "app", "u").unwrap(), AuthType::ScramSha256);
        let e = method_for(AuthType::Hba, Some(&hba), local, false, "other", "evil").unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"pg_hba.conf rejects connection for host "127.0.0.1", user "evil", database "other", no encryption"#
        );
        let e = method_for(AuthType::Hba, Some(&hba), Some(ip("::ffff:10.0.0.1")), false, "app", "u").unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"no pg_hba.conf entry for host "10.0.0.1", user "u", database "app", no encryption"#
        );
        assert_eq!(e.sqlstate(), crate::protocol::sqlstate::INVALID_AUTHORIZATION_SPECIFICATION);
        assert!(method_for(AuthType::Hba, None, local, false, "app", "u").is_err(), "no file loaded: refused");
        let e = method_for(AuthType::Hba, Some(&hba), None, false, "app", "u").unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"no pg_hba.conf entry for host "[local]", user "u", database "app", no encryption"#
        );
        let peer = Hba::parse("local all all peer").unwrap();
        let e = method_for(AuthType::Hba, Some(&peer), None, false, "app", "u").unwrap_err();
        assert_eq!(e.to_string(), "peer authentication is not supported");
    }

    #[test]
    fn physical_replication_matches_only_the_replication_keyword() {
        let hba = Hba::parse(
            "host all evil all reject\nhost replication,app repl 127.0.0.1/32 trust\nhost all all all md5\n",
        )
        .unwrap();
        let local = Some(ip("127.0.0.1"));
        let m = |db: &str, user: &str, r: Replication| {
            method_for_client(AuthType::Hba, Some(&hba), local, false, db, user, r)
        };
        assert_eq!(m("anything", "repl", Replication::Physical).unwrap(), AuthType::Trust);
        assert_eq!(hba.method_physical(ip("127.0.0.1"), "repl"), Some(Method::Trust));
        let e = m("app", "other", Replication::Physical).unwrap_err();
        assert_eq!(
            e.to_string(),
            r#"no pg_hba.conf entry for replication connection from host "127.0.0.1", user "other", no encryption"#
        );
        assert_eq!(m("app", "repl", Replication::Logical).unwrap(), AuthType::Trust, "logical: by its database");
        assert_eq!(m("replication", "x", Replication::None).unwrap(), AuthType::Md5, "the keyword names no database");
        assert!(m("app", "evil", Replication::Physical).is_err(), "`all` does not match physical replication");
    }

    #[test]
    fn empty_and_comment_only_files_have_no_rules() {
        let hba = Hba::parse("\n   # nothing\n\t\n").unwrap();
        assert!(hba.is_empty());
        assert_eq!(hba.method(ip("127.0.0.1"), "d", "u"), None);
    }
}
