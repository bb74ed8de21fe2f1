//! The admin console's command language (PgBouncer's): parsing a query
//! string into commands, case-insensitively, with optional trailing `;`.
//! Pure; no I/O.

/// What `SHOW` can show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Show {
    Pools,
    Stats,
    StatsTotals,
    StatsAverages,
    Totals,
    Clients,
    Servers,
    Databases,
    Users,
    Config,
    Lists,
    Mem,
    Sockets,
    ActiveSockets,
    DnsHosts,
    DnsZones,
    Fds,
    State,
    Peers,
    PeerPools,
    Queries,
    Version,
    Help,
}

impl Show {
    const ALL: &'static [(&'static str, Show)] = &[
        ("POOLS", Show::Pools),
        ("STATS", Show::Stats),
        ("STATS_TOTALS", Show::StatsTotals),
        ("STATS_AVERAGES", Show::StatsAverages),
        ("TOTALS", Show::Totals),
        ("CLIENTS", Show::Clients),
        ("SERVERS", Show::Servers),
        ("DATABASES", Show::Databases),
        ("USERS", Show::Users),
        ("CONFIG", Show::Config),
        ("LISTS", Show::Lists),
        ("MEM", Show::Mem),
        ("SOCKETS", Show::Sockets),
        ("ACTIVE_SOCKETS", Show::ActiveSockets),
        ("DNS_HOSTS", Show::DnsHosts),
        ("DNS_ZONES", Show::DnsZones),
        ("FDS", Show::Fds),
        ("STATE", Show::State),
        ("PEERS", Show::Peers),
        ("PEER_POOLS", Show::PeerPools),
        ("QUERIES", Show::Queries),
        ("VERSION", Show::Version),
        ("HELP", Show::Help),
    ];
}

/// SHUTDOWN's modes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shutdown {
    /// SHUTDOWN: the drain, as on SIGTERM.
    Drain,
    /// SHUTDOWN WAIT_FOR_SERVERS: no new clients; each client finishes its
    /// transaction; weir exits once no server is in use.
    WaitForServers,
    /// SHUTDOWN WAIT_FOR_CLIENTS: no new clients; weir exits once every
    /// client has left on its own.
    WaitForClients,
}

/// One console command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Show(Show),
    /// PAUSE [db]: new transactions wait; returns once servers are released.
    Pause(Option<String>),
    Resume(Option<String>),
    Reload,
    /// KILL [db]: every database's clients when no name is given.
    Kill(Option<String>),
    /// KILL_CLIENT id: one client, by SHOW CLIENTS' id (kept as given: a
    /// word that is no id is refused when the command runs, as PgBouncer does).
    KillClient(String),
    Shutdown(Shutdown),
    /// SET key = value: a setting a reload may change.
    Set {
        key: String,
        value: String,
    },
    /// RECONNECT [db]: close each server connection once it is released.
    Reconnect(Option<String>),
    /// DISABLE db: refuse new clients of db.
    Disable(String),
    /// ENABLE db: accept them again.
    Enable(String),
    /// WAIT_CLOSE [db]: until the servers a RECONNECT marked have closed.
    WaitClose(Option<String>),
    /// SUSPEND: refused (weir has no online restart).
    Suspend,
}

impl Command {
    /// Commands that change weir need a user in admin_users.
    pub fn needs_admin(&self) -> bool {
        !matches!(self, Command::Show(_))
    }

    /// The CommandComplete tag.
    pub fn tag(&self) -> &'static str {
        match self {
            Command::Show(_) => "SHOW",
            Command::Pause(_) => "PAUSE",
            Command::Resume(_) => "RESUME",
            Command::Reload => "RELOAD",
            Command::Kill(_) => "KILL",
            Command::KillClient(_) => "KILL_CLIENT",
            Command::Shutdown(_) => "SHUTDOWN",
            Command::Set { .. } => "SET",
            Command::Reconnect(_) => "RECONNECT",
            Command::Disable(_) => "DISABLE",
            Command::Enable(_) => "ENABLE",
            Command::WaitClose(_) => "WAIT_CLOSE",
            Command::Suspend => "SUSPEND",
        }
    }
}

/// Every command, for help texts and error messages.
pub const SYNOPSIS: &[(&str, &str)] = &[
    ("SHOW POOLS", "clients and servers per pool, with opens/closes per second"),
    ("SHOW STATS", "totals and last stats_period averages per database"),
    ("SHOW STATS_TOTALS", "the totals of SHOW STATS"),
    ("SHOW STATS_AVERAGES", "the averages of SHOW STATS (last stats_period)"),
    ("SHOW TOTALS", "SHOW STATS summed over all databases, one row per figure"),
    ("SHOW CLIENTS", "every logged-in client"),
    ("SHOW SERVERS", "every open server connection"),
    ("SHOW DATABASES", "the configured databases and their pool settings"),
    ("SHOW USERS", "the users with a pool or in the auth_file"),
    ("SHOW CONFIG", "every setting with its value and default"),
    ("SHOW LISTS", "counts of databases, users, pools, clients and servers"),
    ("SHOW MEM", "PgBouncer's memory caches; empty (weir has none)"),
    ("SHOW SOCKETS", "clients and servers with buffer positions (weir reports 0)"),
    ("SHOW ACTIVE_SOCKETS", "SHOW SOCKETS for clients and servers in use"),
    ("SHOW DNS_HOSTS", "PgBouncer's DNS cache; empty (weir has none)"),
    ("SHOW DNS_ZONES", "PgBouncer's DNS zones; empty (weir has none)"),
    ("SHOW FDS", "sockets for an online restart; empty (weir has no online restart)"),
    ("SHOW STATE", "whether weir is active, paused or suspended"),
    ("SHOW PEERS", "the [peers] cancel requests for their keys are forwarded to"),
    ("SHOW PEER_POOLS", "per peer, the cancel requests being forwarded and waiting"),
    ("SHOW QUERIES", "per statement fingerprint that queued: servers held now, waiting, calls, times, errors"),
    ("SHOW VERSION", "the weir version"),
    ("SHOW HELP", "this list"),
    ("SET key = value", "change a setting a RELOAD may change, until the next RELOAD"),
    ("RELOAD", "re-read the config file and auth_file"),
    ("PAUSE [db]", "hold new transactions; returns when the servers are released and closed"),
    ("RESUME [db]", "release what PAUSE or KILL held"),
    ("DISABLE db", "refuse new clients of db"),
    ("ENABLE db", "accept new clients of db again"),
    ("RECONNECT [db]", "close each server connection once it is released"),
    (
        "KILL [db]",
        "disconnect the database's (or every database's) clients, close its servers; it stays paused until RESUME",
    ),
    ("KILL_CLIENT id", "disconnect one client (the id of SHOW CLIENTS)"),
    ("SUSPEND", "refused: weir has no online restart"),
    ("SHUTDOWN", "drain and exit, as on SIGTERM"),
    ("SHUTDOWN WAIT_FOR_SERVERS", "no new clients; exit once no server is in use (transactions finish)"),
    ("SHUTDOWN WAIT_FOR_CLIENTS", "no new clients; exit once every client has left"),
    ("WAIT_CLOSE [db]", "wait until the server connections RECONNECT marked have closed"),
];

/// Why a command string could not be understood.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ParseError(pub String);

/// Splits a query string into commands (`;` separates them). Empty
/// statements are skipped; an empty string gives no commands.
pub fn parse(sql: &str) -> Result<Vec<Command>, ParseError> {
    sql.split(';').map(str::trim).filter(|s| !s.is_empty()).map(parse_one).collect()
}

fn parse_one(stmt: &str) -> Result<Command, ParseError> {
    let words: Vec<&str> = stmt.split_whitespace().collect();
    let verb = words[0].to_ascii_uppercase();
    let args = &words[1..];
    let name = |args: &[&str]| match args {
        [] => Ok(None),
        [db] => Ok(Some(identifier(db))),
        _ => Err(usage(&verb, "takes at most one database name")),
    };
    let needs_db = |args: &[&str]| match name(args)? {
        Some(db) => Ok(db),
        None => Err(usage(&verb, "needs a database name")),
    };
    match verb.as_str() {
        "SHOW" => show(args),
        "SET" => set(stmt[verb.len()..].trim()),
        "RECONNECT" => Ok(Command::Reconnect(name(args)?)),
        "WAIT_CLOSE" => Ok(Command::WaitClose(name(args)?)),
        "DISABLE" => Ok(Command::Disable(needs_db(args)?)),
        "ENABLE" => Ok(Command::Enable(needs_db(args)?)),
        "SUSPEND" if args.is_empty() => Ok(Command::Suspend),
        "PAUSE" => Ok(Command::Pause(name(args)?)),
        "RESUME" => Ok(Command::Resume(name(args)?)),
        "KILL" => Ok(Command::Kill(name(args)?)),
        "KILL_CLIENT" => match args {
            [id] => Ok(Command::KillClient((*id).to_owned())),
            _ => Err(usage(&verb, "needs one client id")),
        },
        "RELOAD" if args.is_empty() => Ok(Command::Reload),
        "SHUTDOWN" => match args.iter().map(|a| a.to_ascii_uppercase()).collect::<Vec<_>>().as_slice() {
            [] => Ok(Command::Shutdown(Shutdown::Drain)),
            [m] if m == "WAIT_FOR_SERVERS" => Ok(Command::Shutdown(Shutdown::WaitForServers)),
            [m] if m == "WAIT_FOR_CLIENTS" => Ok(Command::Shutdown(Shutdown::WaitForClients)),
            _ => Err(usage(&verb, "takes WAIT_FOR_SERVERS, WAIT_FOR_CLIENTS or nothing")),
        },
        "RELOAD" | "SUSPEND" => Err(usage(&verb, "takes no arguments")),
        _ => Err(ParseError(format!("unknown command \"{stmt}\"; {}", commands_hint()))),
    }
}

/// `key = value` or `key TO value`; the value bare or single-quoted ('' is ').
fn set(rest: &str) -> Result<Command, ParseError> {
    let split = rest.split_once('=').or_else(|| {
        let at = rest.to_ascii_uppercase().find(" TO ")?;
        Some((&rest[..at], &rest[at + 4..]))
    });
    let Some((key, value)) = split.map(|(k, v)| (k.trim(), v.trim())).filter(|(k, v)| !k.is_empty() && !v.is_empty())
    else {
        return Err(usage("SET", "needs a key and a value"));
    };
    let value = match value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')) {
        Some(inner) => inner.replace("''", "'"),
        None => value.to_owned(),
    };
    Ok(Command::Set { key: key.to_ascii_lowercase(), value })
}

fn show(args: &[&str]) -> Result<Command, ParseError> {
    let what = match args {
        [w] => w.to_ascii_uppercase(),
        _ => return Err(ParseError(format!("SHOW needs one of: {}", show_names()))),
    };
    Show::ALL
        .iter()
        .find(|(n, _)| *n == what)
        .map(|(_, s)| Command::Show(*s))
        .ok_or_else(|| ParseError(format!("unknown SHOW \"{}\"; weir can show: {}", args[0], show_names())))
}

/// A database name, bare or double-quoted ("" inside quotes is one ").
fn identifier(word: &str) -> String {
    match word.strip_prefix('"').and_then(|w| w.strip_suffix('"')) {
        Some(inner) => inner.replace("\"\"", "\""),
        None => word.to_owned(),
    }
}

fn usage(verb: &str, why: &str) -> ParseError {
    let synopsis = SYNOPSIS
        .iter()
        .find(|(s, _)| *s == verb || s.starts_with(&format!("{verb} ")))
        .map(|(s, _)| *s)
        .unwrap_or(verb);
    ParseError(format!("{verb} {why} (usage: {synopsis})"))
}

fn show_names() -> String {
    Show::ALL.iter().map(|(n, _)| *n).collect::<Vec<_>>().join(", ")
}

fn commands_hint() -> String {
    let all: Vec<&str> = SYNOPSIS.iter().map(|(s, _)| *s).filter(|s| !s.starts_with("SHOW ")).collect();
    format!("weir's console knows SHOW {{{}}}, {}", show_names().replace(", ", "|"), all.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_pgbouncer_commands() {
        assert_eq!(parse("show pools;").unwrap(), vec![Command::Show(Show::Pools)]);
        assert_eq!(parse("  SHOW   Stats  ").unwrap(), vec![Command::Show(Show::Stats)]);
        assert_eq!(parse("PAUSE").unwrap(), vec![Command::Pause(None)]);
        assert_eq!(parse("pause app;").unwrap(), vec![Command::Pause(Some("app".into()))]);
        assert_eq!(parse("RESUME \"My\"\"Db\"").unwrap(), vec![Command::Resume(Some("My\"Db".into()))]);
        assert_eq!(parse("kill app").unwrap(), vec![Command::Kill(Some("app".into()))]);
        assert_eq!(parse("KILL").unwrap(), vec![Command::Kill(None)]);
        assert_eq!(parse("kill_client 12").unwrap(), vec![Command::KillClient("12".into())]);
        assert_eq!(parse("reload; shutdown").unwrap(), vec![Command::Reload, Command::Shutdown(Shutdown::Drain)]);
        assert_eq!(
            parse("SHUTDOWN wait_for_servers; SHUTDOWN WAIT_FOR_CLIENTS").unwrap(),
            vec![Command::Shutdown(Shutdown::WaitForServers), Command::Shutdown(Shutdown::WaitForClients)]
        );
        assert_eq!(parse(" ; ").unwrap(), vec![]);
        assert_eq!(parse("show stats_averages").unwrap(), vec![Command::Show(Show::StatsAverages)]);
        let set = |k: &str, v: &str| Command::Set { key: k.into(), value: v.into() };
        assert_eq!(parse("SET query_timeout = 5").unwrap(), vec![set("query_timeout", "5")]);
        assert_eq!(parse("set Default_Pool_Size to '7'").unwrap(), vec![set("default_pool_size", "7")]);
        assert_eq!(
            parse("SET application_name_add_host='it''s'").unwrap(),
            vec![set("application_name_add_host", "it's")]
        );
        assert_eq!(
            parse("RECONNECT; reconnect app").unwrap(),
            vec![Command::Reconnect(None), Command::Reconnect(Some("app".into()))]
        );
        assert_eq!(
            parse("DISABLE app; ENABLE app").unwrap(),
            vec![Command::Disable("app".into()), Command::Enable("app".into())]
        );
        assert_eq!(parse("wait_close").unwrap(), vec![Command::WaitClose(None)]);
        assert_eq!(parse("SUSPEND").unwrap(), vec![Command::Suspend]);
        assert!(parse("DISABLE").unwrap_err().0.contains("usage: DISABLE db"));
        assert!(parse("SET x").is_err());
    }

    #[test]
    fn errors_say_what_would_work() {
        let e = parse("SHOW PUDDLES").unwrap_err().0;
        assert!(e.contains("PUDDLES") && e.contains("POOLS"), "{e}");
        let e = parse("SELECT 1").unwrap_err().0;
        assert!(e.contains("unknown command") && e.contains("PAUSE [db]") && e.contains("SHOW {POOLS|"), "{e}");
        assert!(parse("KILL_CLIENT").unwrap_err().0.contains("usage: KILL_CLIENT"));
        assert!(parse("SHUTDOWN NOW").unwrap_err().0.contains("WAIT_FOR_SERVERS"));
        assert!(parse("PAUSE a b").is_err());
        assert!(parse("RELOAD now").is_err());
        assert!(parse("SHOW").is_err());
    }

    #[test]
    fn only_show_is_for_stats_users() {
        assert!(!Command::Show(Show::Pools).needs_admin());
        assert!(Command::Pause(None).needs_admin());
        assert!(Command::Kill(Some("x".into())).needs_admin());
        assert!(Command::KillClient("1".into()).needs_admin());
        assert_eq!(Command::Reload.tag(), "RELOAD");
    }
}
