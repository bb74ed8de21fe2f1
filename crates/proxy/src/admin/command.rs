//! The admin console's command language (PgBouncer's): parsing a query
//! string into commands, case-insensitively, with optional trailing `;`.
//! Pure; no I/O.

/// What `SHOW` can show.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Show {
    Pools,
    Stats,
    Clients,
    Servers,
    Databases,
    Config,
    Lists,
    Version,
    Help,
}

impl Show {
    const ALL: &'static [(&'static str, Show)] = &[
        ("POOLS", Show::Pools),
        ("STATS", Show::Stats),
        ("CLIENTS", Show::Clients),
        ("SERVERS", Show::Servers),
        ("DATABASES", Show::Databases),
        ("CONFIG", Show::Config),
        ("LISTS", Show::Lists),
        ("VERSION", Show::Version),
        ("HELP", Show::Help),
    ];
}

/// One console command.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Command {
    Show(Show),
    /// PAUSE [db]: new transactions wait; returns once servers are released.
    Pause(Option<String>),
    Resume(Option<String>),
    Reload,
    Kill(String),
    Shutdown,
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
            Command::Shutdown => "SHUTDOWN",
        }
    }
}

/// Every command, for help texts and error messages.
pub const SYNOPSIS: &[(&str, &str)] = &[
    ("SHOW POOLS", "clients and servers per pool, with opens/closes per second"),
    ("SHOW STATS", "transaction, query and wait totals per database"),
    ("SHOW CLIENTS", "every logged-in client"),
    ("SHOW SERVERS", "every open server connection"),
    ("SHOW DATABASES", "the configured databases and their pool settings"),
    ("SHOW CONFIG", "every setting with its value and default"),
    ("SHOW LISTS", "counts of databases, users, pools, clients and servers"),
    ("SHOW VERSION", "the weir version"),
    ("SHOW HELP", "this list"),
    ("PAUSE [db]", "hold new transactions; returns when the servers are released and closed"),
    ("RESUME [db]", "release what PAUSE or KILL held"),
    ("RELOAD", "re-read the config file and auth_file"),
    ("KILL db", "disconnect the database's clients, close its servers; it stays paused until RESUME"),
    ("SHUTDOWN", "drain and exit, as on SIGTERM"),
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
    match verb.as_str() {
        "SHOW" => show(args),
        "PAUSE" => Ok(Command::Pause(name(args)?)),
        "RESUME" => Ok(Command::Resume(name(args)?)),
        "KILL" => match name(args)? {
            Some(db) => Ok(Command::Kill(db)),
            None => Err(usage(&verb, "needs a database name")),
        },
        "RELOAD" if args.is_empty() => Ok(Command::Reload),
        "SHUTDOWN" if args.is_empty() => Ok(Command::Shutdown),
        "RELOAD" | "SHUTDOWN" => Err(usage(&verb, "takes no arguments")),
        _ => Err(ParseError(format!("unknown command \"{stmt}\"; {}", commands_hint()))),
    }
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
    let synopsis = SYNOPSIS.iter().find(|(s, _)| s.starts_with(verb)).map(|(s, _)| *s).unwrap_or(verb);
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
        assert_eq!(parse("kill app").unwrap(), vec![Command::Kill("app".into())]);
        assert_eq!(parse("reload; shutdown").unwrap(), vec![Command::Reload, Command::Shutdown]);
        assert_eq!(parse(" ; ").unwrap(), vec![]);
    }

    #[test]
    fn errors_say_what_would_work() {
        let e = parse("SHOW PUDDLES").unwrap_err().0;
        assert!(e.contains("PUDDLES") && e.contains("POOLS"), "{e}");
        let e = parse("SELECT 1").unwrap_err().0;
        assert!(e.contains("unknown command") && e.contains("PAUSE [db]") && e.contains("SHOW {POOLS|"), "{e}");
        assert!(parse("KILL").unwrap_err().0.contains("usage: KILL db"));
        assert!(parse("PAUSE a b").is_err());
        assert!(parse("RELOAD now").is_err());
        assert!(parse("SHOW").is_err());
    }

    #[test]
    fn only_show_is_for_stats_users() {
        assert!(!Command::Show(Show::Pools).needs_admin());
        assert!(Command::Pause(None).needs_admin());
        assert!(Command::Kill("x".into()).needs_admin());
        assert_eq!(Command::Reload.tag(), "RELOAD");
    }
}
