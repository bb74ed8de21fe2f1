//! `weir check-config`'s reading of a config file's text: every problem in one
//! run, not just the first, each with a hint an operator can act on. Unknown
//! keys get the nearest known key ("did you mean `server_lifetime`?"), and the
//! usual slips of someone coming from PgBouncer get a PgBouncer-aware hint: a
//! bare number where a duration is expected, a pgbouncer.ini database line,
//! `listen_addr` without a port. Pure text in, problems out; the files the
//! config names are checked by the binary (`cli`), which may load them.

use std::path::Path;

use super::{keys, Config, Database, General, MetricsSection, UserSettings};

/// Every problem found, and the config as far as it could be read (the keys
/// with a problem left out), so that the files it names can be checked too.
/// The config is usable only when `problems` is empty.
#[derive(Debug, Default)]
pub struct Checked {
    pub config: Option<Config>,
    pub problems: Vec<String>,
}

/// Checks `text` (a weir.toml whose folder is `base_dir`) and reports every
/// problem found: syntax, unknown keys, wrong types, and `validate()`'s rules.
pub fn check_text(text: &str, base_dir: &Path) -> Checked {
    let (text, mut problems) = ini_database_lines(text);
    let mut table = match text.parse::<toml::Table>() {
        Ok(t) => t,
        Err(e) => {
            problems.push(format!("invalid TOML: {e}"));
            return Checked { config: None, problems };
        }
    };
    problems.extend(check_sections(&mut table));
    let config = match toml::Value::Table(table).try_into::<Config>() {
        Ok(mut cfg) => {
            cfg.base_dir = base_dir.to_path_buf();
            problems.extend(cfg.problems().iter().map(ToString::to_string));
            Some(cfg)
        }
        Err(e) if problems.is_empty() => {
            problems.push(format!("invalid config: {}", one_line(&e.to_string())));
            None
        }
        Err(_) => None,
    };
    Checked { config, problems }
}

/// Finds pgbouncer.ini-style database lines (`app = host=db dbname=app`),
/// which are not TOML, and comments them out so the rest can be checked.
fn ini_database_lines(text: &str) -> (String, Vec<String>) {
    let mut problems = Vec::new();
    let mut out = String::with_capacity(text.len());
    for (i, line) in text.lines().enumerate() {
        // A comment may quote an ini line (`user=/password=`); it is not one.
        let comment = line.trim_start().starts_with('#');
        match line.split_once('=').filter(|_| !comment) {
            Some((name, value)) if is_ini_value(value) && !name.trim().is_empty() => {
                problems.push(ini_line_hint(i + 1, name.trim(), value.trim()));
                out.push('#');
            }
            _ => {}
        }
        out.push_str(line);
        out.push('\n');
    }
    (out, problems)
}

/// An unquoted value holding `key=value` pairs: libpq conninfo, not TOML.
fn is_ini_value(value: &str) -> bool {
    let v = value.trim();
    let quoted = v.starts_with(['"', '\'', '[', '{']);
    !quoted && v.split_whitespace().next().is_some_and(|w| w.contains('=') && !w.starts_with('='))
}

fn ini_line_hint(line: usize, name: &str, conninfo: &str) -> String {
    let name = name.trim_matches('"');
    let migrated = super::migrate::from_pgbouncer_ini(&format!("[databases]\n{name} = {conninfo}\n"));
    let table = migrated.toml.find("[databases.").map(|at| migrated.toml[at..].trim_end().to_owned());
    let table = table.map(|t| format!(":\n{t}")).unwrap_or_default();
    format!(
        "line {line}: `{name} = {conninfo}` is a pgbouncer.ini database line; in weir each database is a \
         [databases.NAME] table (`weir migrate-config pgbouncer.ini` converts a whole file){table}"
    )
}

/// Problems with section names, key names and value types. What has a
/// problem is removed from `table`, so the rest can still be read.
fn check_sections(table: &mut toml::Table) -> Vec<String> {
    let mut problems = Vec::new();
    if !table.contains_key("weir") {
        problems.push("[weir] is missing: it holds listen_addr, auth_type and the other general keys".into());
    }
    table.retain(|name, value| {
        let Some(section) = value.as_table_mut() else {
            problems.push(misplaced_top_level(name));
            return false;
        };
        match name {
            "weir" => problems.extend(check_keys::<General>("weir", section, keys::general_keys())),
            "metrics" => problems.extend(check_keys::<MetricsSection>("metrics", section, keys::metrics_keys())),
            "databases" => problems.extend(check_databases(section)),
            "users" => problems.extend(check_users(section)),
            other => {
                problems.push(unknown_section(other));
                return false;
            }
        }
        true
    });
    problems
}

fn misplaced_top_level(name: &str) -> String {
    if keys::general_keys().contains(&name) {
        format!("`{name}` is outside any section: put it under [weir]")
    } else {
        format!("`{name}` is outside any section and is not a weir key{}", did_you_mean(name, keys::general_keys()))
    }
}

fn unknown_section(name: &str) -> String {
    let hint = match name {
        "pgbouncer" => "; pgbouncer.ini's [pgbouncer] section is [weir] here".to_owned(),
        _ => did_you_mean(name, &["weir", "metrics", "databases", "users"]),
    };
    format!("unknown section [{name}]{hint}")
}

fn check_databases(section: &mut toml::Table) -> Vec<String> {
    let mut problems = Vec::new();
    section.retain(|name, value| {
        match value {
            toml::Value::Table(t) => {
                problems.extend(check_keys::<Database>(&format!("databases.{name}"), t, keys::database_keys()));
                return true;
            }
            toml::Value::String(s) if s.contains('=') => problems.push(format!(
                "databases.{name}: {}",
                ini_line_hint(0, name, s).split_once(": ").map_or("", |(_, rest)| rest)
            )),
            _ => problems.push(format!("databases.{name}: must be a table: [databases.{name}] with host, port, …")),
        }
        false
    });
    problems
}

fn check_users(section: &mut toml::Table) -> Vec<String> {
    let mut problems = Vec::new();
    section.retain(|name, value| match value {
        toml::Value::Table(t) => {
            problems.extend(check_keys::<UserSettings>(&format!("users.{name}"), t, keys::user_keys()));
            true
        }
        toml::Value::String(s) if s.contains('=') => {
            problems.push(format!(
                "users.{name}: `{s}` is a pgbouncer.ini [users] line; in weir it is a [users.{name}] table \
                 (`weir migrate-config pgbouncer.ini` converts a whole file)"
            ));
            false
        }
        _ => {
            problems.push(format!("users.{name}: must be a table: [users.{name}] with pool_mode, pool_size, …"));
            false
        }
    });
    problems
}

/// Each key of `section` on its own: unknown keys get the nearest known one,
/// and each value is deserialized alone so that every bad value is reported.
/// Keys with a problem are removed.
fn check_keys<T: serde::de::DeserializeOwned>(
    section_name: &str,
    section: &mut toml::Table,
    known: &[&str],
) -> Vec<String> {
    let mut problems = Vec::new();
    section.retain(|key, value| {
        let at = format!("{section_name}.{key}");
        if !known.contains(&key) {
            problems.push(format!("{at}: unknown key{}", unknown_key_hint(key, known)));
            return false;
        }
        let one = toml::Table::from_iter([(key.to_owned(), value.clone())]);
        match toml::Value::Table(one).try_into::<T>() {
            Ok(_) => true,
            Err(e) => {
                problems.push(format!("{at}: {}{}", one_line(&e.to_string()), value_hint(key, value)));
                false
            }
        }
    });
    problems
}

/// A serde error on one line, without toml's "in `key`" context line.
fn one_line(message: &str) -> String {
    let lines = message.lines().map(str::trim).filter(|l| !l.is_empty() && !l.starts_with("in `"));
    lines.collect::<Vec<_>>().join(" ")
}

fn unknown_key_hint(key: &str, known: &[&str]) -> String {
    match key {
        "listen_port" => "; weir has no listen_port: the port goes into listen_addr, as in \"127.0.0.1:6432\"".into(),
        "logfile" | "pidfile" | "syslog" => "; weir logs to stderr and does not daemonize".into(),
        "user" if known.contains(&"listen_addr") => {
            "; weir does not switch users: run it as the user it should be (a forced user goes on a database)".into()
        }
        _ => did_you_mean(key, known),
    }
}

/// PgBouncer-aware hints for a value weir cannot read.
fn value_hint(key: &str, value: &toml::Value) -> String {
    let number = match value {
        toml::Value::Integer(n) => Some(n.to_string()),
        toml::Value::Float(f) => Some(f.to_string()),
        _ => None,
    };
    match (key, number, value.as_str()) {
        ("tcp_user_timeout", Some(n), _) => {
            format!("; durations are strings with a unit: write {key} = \"{n}ms\" (PgBouncer's value is milliseconds)")
        }
        (_, Some(n), _) if is_duration_key(key) => {
            format!(
                "; durations are strings with a unit: write {key} = \"{n}s\" (PgBouncer's bare numbers are seconds)"
            )
        }
        ("listen_addr", _, Some(addr)) => listen_addr_hint(addr),
        _ => String::new(),
    }
}

/// A pgbouncer.ini-style `listen_addr` (addresses without the port, which
/// PgBouncer keeps in listen_port) gets the weir spelling.
fn listen_addr_hint(addr: &str) -> String {
    let items: Vec<&str> = addr.split(',').map(str::trim).collect();
    let with_port = |a: &str| {
        if a == "*" {
            Some("*:6432".to_owned())
        } else if a.parse::<std::net::Ipv6Addr>().is_ok() {
            Some(format!("[{a}]:6432"))
        } else if !a.is_empty() && !a.contains(':') {
            Some(format!("{a}:6432"))
        } else {
            None
        }
    };
    if items.iter().all(|a| with_port(a).is_none()) {
        return String::new();
    }
    let fixed: Vec<String> = items.iter().map(|a| with_port(a).unwrap_or_else(|| (*a).to_owned())).collect();
    let star = if items == ["*"] { " (every IPv4 and IPv6 address)" } else { "" };
    format!("; listen_addr needs a port (PgBouncer's listen_port): write \"{}\"{star}", fixed.join(","))
}

/// Keys whose value is a duration string: their default serializes to a
/// string that humantime reads, or they are optional durations.
fn is_duration_key(key: &str) -> bool {
    const OPTIONAL: &[&str] = &["client_deadline", "query_timeout", "idle_transaction_timeout", "tcp_user_timeout"];
    if OPTIONAL.contains(&key) {
        return true;
    }
    let Ok(toml::Value::Table(defaults)) = toml::Value::try_from(General::default()) else { return false };
    defaults.get(key).and_then(toml::Value::as_str).is_some_and(|s| humantime::parse_duration(s).is_ok())
}

/// "; did you mean `x`?" for the nearest of `known`, when it is close enough.
pub fn did_you_mean(word: &str, known: &[&str]) -> String {
    let limit = (word.chars().count() / 3).max(2);
    let nearest = known.iter().map(|k| (edit_distance(word, k), *k)).filter(|(d, _)| *d <= limit).min();
    nearest.map(|(_, k)| format!("; did you mean `{k}`?")).unwrap_or_default()
}

/// Levenshtein distance over characters.
fn edit_distance(a: &str, b: &str) -> usize {
    let b: Vec<char> = b.chars().collect();
    let mut row: Vec<usize> = (0..=b.len()).collect();
    for (i, ca) in a.chars().enumerate() {
        let mut diagonal = row[0];
        row[0] = i + 1;
        for (j, cb) in b.iter().enumerate() {
            let above = row[j + 1];
            row[j + 1] = (above + 1).min(row[j] + 1).min(diagonal + usize::from(ca != *cb));
            diagonal = above;
        }
    }
    row[b.len()]
}

#[cfg(test)]
mod tests {
    use super::*;

    const BASE: &str = "[weir]\nauth_type = \"trust\"\n";

    fn problems(text: &str) -> Vec<String> {
        check_text(text, Path::new(".")).problems
    }

    #[test]
    fn a_good_config_has_no_problems() {
        let checked = check_text(&format!("{BASE}[databases.app]\nport = 5432\n"), Path::new("."));
        assert!(checked.problems.is_empty() && checked.config.is_some(), "{:?}", checked.problems);
    }

    #[test]
    fn the_rest_of_a_config_with_problems_is_still_read() {
        let checked = check_text(&format!("{BASE}server_lifetime = 3600\nmax_client_conn = 0\n"), Path::new("."));
        assert_eq!(checked.problems.len(), 2, "the bad value and a rule the rest breaks: {:?}", checked.problems);
        assert_eq!(checked.config.map(|c| c.weir.max_client_conn), Some(0));
    }

    #[test]
    fn every_problem_is_reported_in_one_run() {
        let p = problems(&format!(
            "{BASE}server_lifetme = \"1h\"\nserver_idle_timeout = 600\nmax_client_conn = \"many\"\n[databases.app]\nprot = 5432\n"
        ));
        assert_eq!(p.len(), 4, "{p:?}");
    }

    #[test]
    fn a_typo_gets_the_nearest_key() {
        let p = problems(&format!("{BASE}server_lifetme = \"1h\"\n"));
        assert_eq!(p, vec!["weir.server_lifetme: unknown key; did you mean `server_lifetime`?"]);
        let p = problems(&format!("{BASE}[databases.app]\ndbnmae = \"x\"\n"));
        assert!(p[0].contains("did you mean `dbname`?"), "{p:?}");
        let p = problems(&format!("{BASE}completely_unrelated = 1\n"));
        assert!(p[0].ends_with("unknown key"), "no suggestion when nothing is close: {p:?}");
    }

    #[test]
    fn a_bare_number_for_a_duration_says_to_write_seconds() {
        let p = problems(&format!("{BASE}server_lifetime = 3600\n"));
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].contains("write server_lifetime = \"3600s\""), "{p:?}");
        let p = problems(&format!("{BASE}query_timeout = 30\n"));
        assert!(p[0].contains("write query_timeout = \"30s\""), "an optional duration too: {p:?}");
        let p = problems(&format!("{BASE}tcp_user_timeout = 8000\n"));
        assert!(p[0].contains("\"8000ms\""), "PgBouncer's tcp_user_timeout is in ms: {p:?}");
        let p = problems(&format!("{BASE}default_pool_size = \"20\"\n"));
        assert!(!p[0].contains("durations"), "not a duration key: {p:?}");
    }

    #[test]
    fn an_ini_database_line_gets_the_toml_table() {
        let text = format!("{BASE}[databases]\napp = host=10.0.0.5 port=5433 dbname=appdb\n");
        let p = problems(&text);
        assert_eq!(p.len(), 1, "{p:?}");
        assert!(p[0].starts_with("line 4: `app = host=10.0.0.5 port=5433 dbname=appdb` is a pgbouncer.ini"), "{p:?}");
        assert!(p[0].contains("[databases.app]\nhost = \"10.0.0.5\"\nport = 5433\ndbname = \"appdb\""), "{p:?}");
        let quoted = problems(&format!("{BASE}[databases]\napp = \"host=db dbname=app\"\n"));
        assert!(
            quoted[0].starts_with("databases.app: ") && quoted[0].contains("pgbouncer.ini database line"),
            "{quoted:?}"
        );
        let commented = format!("{BASE}# A forced user (PgBouncer's user=/password=) is a database key\n");
        assert_eq!(problems(&commented), Vec::<String>::new(), "a comment quoting an ini line is not one");
    }

    #[test]
    fn listen_addr_without_a_port_gets_one() {
        let p = problems("[weir]\nauth_type = \"trust\"\nlisten_addr = \"10.0.0.1\"\n");
        assert!(p[0].starts_with("weir.listen_addr: ") && p[0].ends_with("write \"10.0.0.1:6432\""), "{p:?}");
        let p = problems("[weir]\nauth_type = \"trust\"\nlisten_addr = \"*\"\n");
        assert!(p[0].ends_with("write \"*:6432\" (every IPv4 and IPv6 address)"), "{p:?}");
        let p = problems("[weir]\nauth_type = \"trust\"\nlisten_addr = \"127.0.0.1, ::1\"\n");
        assert!(p[0].ends_with("write \"127.0.0.1:6432,[::1]:6432\""), "{p:?}");
        let p = problems("[weir]\nauth_type = \"trust\"\nlisten_addr = \"127.0.0.1:6432,[::1]:6432\"\n");
        assert!(p.is_empty(), "a list with one port is fine: {p:?}");
        let p = problems("[weir]\nauth_type = \"trust\"\nunix_socket_mode = \"0999\"\nunix_socket_dir = \"@abs\"\n");
        assert_eq!(p.len(), 2, "{p:?}");
        let p = problems("[weir]\nauth_type = \"trust\"\nlisten_addr = \"::1\"\n");
        assert!(p[0].ends_with("write \"[::1]:6432\""), "{p:?}");
        let p = problems("[weir]\nauth_type = \"trust\"\nlisten_port = 6432\n");
        assert!(p[0].contains("the port goes into listen_addr"), "{p:?}");
    }

    #[test]
    fn pgbouncer_section_names_are_explained() {
        let p = problems("[pgbouncer]\nlisten_addr = \"127.0.0.1:6432\"\n");
        assert!(p.iter().any(|m| m.contains("[pgbouncer] section is [weir] here")), "{p:?}");
        assert!(p.iter().any(|m| m.contains("[weir] is missing")), "{p:?}");
    }

    #[test]
    fn every_rule_violation_is_reported() {
        let p = problems(&format!(
            "{BASE}default_pool_size = 0\nmax_client_conn = 0\n[databases.app]\npool_size = 5\nmin_pool_size = 50\n\
             [databases.weir]\npool_size = 5\n"
        ));
        let want = [
            "weir.default_pool_size: must be at least 1",
            "weir.max_client_conn: must be at least 1",
            "databases.weir: is reserved for the admin console",
        ];
        assert_eq!(p, want);
    }

    #[test]
    fn users_and_the_fallback_database_are_checked_like_databases() {
        let good =
            format!("{BASE}[databases.\"*\"]\nport = 5432\n[users.bob]\npool_mode = \"session\"\npool_size = 3\n");
        assert!(problems(&good).is_empty(), "{:?}", problems(&good));
        let p = problems(&format!("{BASE}[users.bob]\npool_sise = 3\n[users]\nann = \"pool_mode=session\"\n"));
        assert_eq!(p.len(), 2, "{p:?}");
        assert!(p.iter().any(|m| m.contains("did you mean `pool_size`?")), "{p:?}");
        assert!(p.iter().any(|m| m.contains("pgbouncer.ini [users] line")), "{p:?}");
        let p = problems(&format!("{BASE}[users.bob]\npool_size = 0\n[databases.app]\npassword = \"x\"\n"));
        assert!(p.contains(&"users.bob.pool_size: must be at least 1".to_owned()), "{p:?}");
        assert!(p.iter().any(|m| m.starts_with("databases.app.password: ")), "{p:?}");
    }

    #[test]
    fn edit_distance_counts_single_edits() {
        assert_eq!(edit_distance("server_lifetme", "server_lifetime"), 1);
        assert_eq!(edit_distance("abc", "abc"), 0);
        assert_eq!(edit_distance("", "abc"), 3);
        assert_eq!(edit_distance("kitten", "sitting"), 3);
    }
}
