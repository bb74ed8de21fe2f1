//! Session parameters: which ones weir tracks per client and per server, and
//! the SET statement that makes a server match a client. Pure logic.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

/// Parameters Postgres reports with ParameterStatus and that a client may
/// change; weir re-applies them when a server with other values is assigned.
pub(crate) const TRACKED: &[&str] =
    &["application_name", "client_encoding", "DateStyle", "TimeZone", "IntervalStyle", "standard_conforming_strings"];

/// Parameters Postgres reports that no client can change: never synced, and
/// never taken into a client's parameters (a standby promoted under a
/// client's server reports a new in_hot_standby; it is the server's, not the
/// client's).
pub(crate) const FIXED: &[&str] = &[
    "server_version",
    "server_encoding",
    "integer_datetimes",
    "is_superuser",
    "session_authorization",
    "in_hot_standby",
];

/// True for a name in `FIXED` (as Postgres matches names: any case).
pub(crate) fn is_fixed(name: &str) -> bool {
    FIXED.iter().any(|f| f.eq_ignore_ascii_case(name))
}

/// Parameter values by name. The `TRACKED` ones sit in fixed slots, so
/// comparing a client's with a server's is six string comparisons and no
/// lookups; any other name goes in a short list in insertion order (small,
/// so a Vec beats a map). Names match case-insensitively, as Postgres's do.
///
/// Each map carries a stamp that names its content: a change takes a new
/// process-wide number, a clone keeps it, and the empty map has 0. Equal
/// stamps mean equal content, so a comparison that found two maps matching
/// need not be repeated while neither stamp moves (`Stamps`).
///
/// The values sit behind a shared pointer that an empty map does not have:
/// a session holds two maps for its whole life, the second (startup
/// settings) is almost always empty, and clients with equal values share one
/// copy (`StampCache::canonicalize`); a change copies first.
#[derive(Debug, Clone, Default)]
pub struct ParamMap {
    values: Option<Arc<Values>>,
    stamp: u64,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct Values {
    tracked: [Option<String>; TRACKED.len()],
    other: Vec<(String, String)>,
    /// The values RESET returns to, where they are not the server's own (a
    /// client's startup settings: `ParamMap::keep_as_reset_values`).
    reset: Vec<(String, String)>,
}

static EMPTY: Values = Values { tracked: [const { None }; TRACKED.len()], other: Vec::new(), reset: Vec::new() };

impl PartialEq for ParamMap {
    fn eq(&self, other: &Self) -> bool {
        self.vals() == other.vals()
    }
}

impl Eq for ParamMap {}

static NEXT_STAMP: AtomicU64 = AtomicU64::new(1);

/// The stamps of a client's parameters and settings and a server's, taken
/// when they were found to match.
pub(crate) type Stamps = [u64; 4];

/// How many distinct maps a `StampCache` remembers.
const STAMP_CACHE: usize = 16;

/// Canonical copies of parameter maps, so that clients with the same values
/// (the usual case: one application's connections) share a stamp and one
/// copy of the values, and a server that matched one of them is known to
/// match them all.
#[derive(Debug, Default)]
pub struct StampCache(parking_lot::Mutex<Vec<ParamMap>>);

impl StampCache {
    /// Makes `map` a copy of an equal map seen before (its stamp and its
    /// values), or remembers it (up to `STAMP_CACHE` of them).
    pub fn canonicalize(&self, map: &mut ParamMap) {
        if map.stamp == 0 {
            return;
        }
        let mut seen = self.0.lock();
        match seen.iter().find(|m| **m == *map) {
            Some(m) => *map = m.clone(),
            None if seen.len() < STAMP_CACHE => seen.push(map.clone()),
            None => {}
        }
    }
}

/// The slot of a tracked name.
fn slot(name: &str) -> Option<usize> {
    TRACKED.iter().position(|t| *t == name).or_else(|| TRACKED.iter().position(|t| t.eq_ignore_ascii_case(name)))
}

impl ParamMap {
    pub fn new() -> Self {
        ParamMap::default()
    }

    fn vals(&self) -> &Values {
        self.values.as_deref().unwrap_or(&EMPTY)
    }

    pub fn get(&self, name: &str) -> Option<&str> {
        let vals = self.vals();
        match slot(name) {
            Some(i) => vals.tracked[i].as_deref(),
            None => vals.other.iter().find(|(k, _)| k.eq_ignore_ascii_case(name)).map(|(_, v)| v.as_str()),
        }
    }

    pub fn set(&mut self, name: &str, value: &str) {
        if self.get(name) == Some(value) {
            return;
        }
        let vals = Arc::make_mut(self.values.get_or_insert_with(Default::default));
        match slot(name) {
            Some(i) => vals.tracked[i] = Some(value.to_owned()),
            None => match vals.other.iter_mut().find(|(k, _)| k.eq_ignore_ascii_case(name)) {
                Some((_, v)) => *v = value.to_owned(),
                None => vals.other.push((name.to_owned(), value.to_owned())),
            },
        }
        self.stamp = NEXT_STAMP.fetch_add(1, Ordering::Relaxed);
    }

    /// Makes the unreported values now in the map the ones RESET returns
    /// to: a client's startup settings, as Postgres keeps them (not its own
    /// server defaults) through RESET and RESET ALL.
    pub fn keep_as_reset_values(&mut self) {
        if let Some(vals) = self.values.as_mut() {
            let vals = Arc::make_mut(vals);
            if vals.reset != vals.other {
                vals.reset = vals.other.clone();
                self.stamp = NEXT_STAMP.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// A client's settings after a server's session-level ones were read
    /// back: its reset values (see `keep_as_reset_values`), overridden by
    /// `session`'s. Keeps the reset values.
    pub fn after_read_back(&self, session: ParamMap) -> ParamMap {
        let reset = &self.vals().reset;
        if reset.is_empty() {
            return session;
        }
        let mut out = ParamMap::new();
        for (k, v) in reset {
            out.set(k, v);
        }
        out.keep_as_reset_values();
        for (k, v) in session.iter() {
            out.set(k, v);
        }
        out
    }

    /// Names this map's content (see the type's documentation).
    pub fn stamp(&self) -> u64 {
        self.stamp
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, &str)> {
        let vals = self.vals();
        let tracked = vals.tracked.iter().zip(TRACKED).filter_map(|(v, k)| v.as_deref().map(|v| (*k, v)));
        tracked.chain(vals.other.iter().map(|(k, v)| (k.as_str(), v.as_str())))
    }

    pub fn len(&self) -> usize {
        let vals = self.vals();
        vals.tracked.iter().flatten().count() + vals.other.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Appends the statements (made by `statement`) that make a server with
    /// `server` values match `self` for the names `self` has.
    pub fn push_sets(&self, server: &ParamMap, sql: &mut String, statement: fn(&str, &str) -> String) {
        for ((mine, theirs), name) in self.vals().tracked.iter().zip(&server.vals().tracked).zip(TRACKED) {
            if let Some(v) = mine {
                if theirs.as_ref() != Some(v) {
                    sql.push_str(&statement(name, v));
                }
            }
        }
        for (k, v) in &self.vals().other {
            if server.get(k) != Some(v.as_str()) {
                sql.push_str(&statement(k, v));
            }
        }
    }

    /// Appends RESET for names the server has and `self` does not.
    pub fn push_resets(&self, server: &ParamMap, sql: &mut String) {
        for (k, _) in server.iter() {
            if self.get(k).is_none() {
                sql.push_str(&format!("RESET \"{}\";", k.replace('"', "\"\"")));
            }
        }
    }

    /// The SQL that makes a server's reported params and applied settings
    /// match a client's, or None when nothing differs: one simple query,
    /// so one round trip however many differ. Settings go through
    /// `set_config`, which takes a value as Postgres reads it back.
    pub fn sync_sql(
        params: &ParamMap,
        settings: &ParamMap,
        server_params: &ParamMap,
        server_settings: &ParamMap,
    ) -> Option<String> {
        let mut sql = String::new();
        params.push_sets(server_params, &mut sql, set_statement);
        settings.push_sets(server_settings, &mut sql, set_config_statement);
        settings.push_resets(server_settings, &mut sql);
        (!sql.is_empty()).then_some(sql)
    }
}

/// True for names that are safe to splice into SQL as an identifier.
pub(crate) fn valid_name(name: &str) -> bool {
    !name.is_empty() && name.len() <= 63 && name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'.')
}

/// `SET name='value';` (PgBouncer's form; the name double-quoted unless it
/// is a plain one) with the value quoted for any server setting of
/// standard_conforming_strings.
pub(crate) fn set_statement(name: &str, value: &str) -> String {
    if valid_name(name) {
        format!("SET {name}={};", literal(value))
    } else {
        format!("SET \"{}\"={};", name.replace('"', "\"\""), literal(value))
    }
}

/// `SELECT pg_catalog.set_config('name', 'value', false);`: the value as
/// `pg_settings.setting` gives it. (`SET search_path TO 'a, b'` would name
/// one schema "a, b"; set_config reads the list.)
pub(crate) fn set_config_statement(name: &str, value: &str) -> String {
    format!("SELECT pg_catalog.set_config({}, {}, false);", literal(name), literal(value))
}

/// A string literal read the same under either standard_conforming_strings.
fn literal(value: &str) -> String {
    if value.contains('\\') {
        format!("E'{}'", value.replace('\\', "\\\\").replace('\'', "''"))
    } else {
        format!("'{}'", value.replace('\'', "''"))
    }
}

/// What PgBouncer answers an `options` value it cannot read as settings.
const UNSUPPORTED_OPTIONS: &str =
    "unsupported options startup parameter: only '-c config=val' and '--config=val' are allowed";

/// Parses a startup `options` value into `-c name=value` settings.
/// Returns an error message for anything else (weir refuses rather than loses
/// it), in PgBouncer's words.
pub(crate) fn parse_options(options: &str) -> Result<Vec<(String, String)>, String> {
    let mut out = Vec::new();
    let mut words = split_words(options).into_iter();
    while let Some(w) = words.next() {
        let setting = if w == "-c" {
            words.next().ok_or_else(|| UNSUPPORTED_OPTIONS.to_string())?
        } else if let Some(rest) = w.strip_prefix("-c") {
            rest.to_owned()
        } else if let Some(rest) = w.strip_prefix("--") {
            rest.to_owned()
        } else {
            return Err(UNSUPPORTED_OPTIONS.into());
        };
        let (k, v) = setting.split_once('=').ok_or_else(|| UNSUPPORTED_OPTIONS.to_string())?;
        out.push((k.replace('-', "_"), v.to_owned()));
    }
    Ok(out)
}

/// Splits on unescaped spaces; a backslash escapes the next character (libpq's rule).
fn split_words(s: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut cur = String::new();
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => cur.extend(chars.next()),
            c if c.is_whitespace() => {
                if !cur.is_empty() {
                    words.push(std::mem::take(&mut cur));
                }
            }
            c => cur.push(c),
        }
    }
    if !cur.is_empty() {
        words.push(cur);
    }
    words
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn diff_only_sets_what_differs() {
        let mut client = ParamMap::new();
        client.set("application_name", "a'b");
        client.set("TimeZone", "UTC");
        let mut server = ParamMap::new();
        server.set("timezone", "UTC");
        let none = ParamMap::new();
        let sql = ParamMap::sync_sql(&client, &none, &server, &none).unwrap();
        assert_eq!(sql, "SET application_name='a''b';");
        server.set("application_name", "a'b");
        assert_eq!(ParamMap::sync_sql(&client, &none, &server, &none), None);
        let mut leftover = ParamMap::new();
        leftover.set("search_path", "x");
        assert_eq!(ParamMap::sync_sql(&client, &none, &server, &leftover).unwrap(), "RESET \"search_path\";");
        let sql = ParamMap::sync_sql(&client, &leftover, &server, &none).unwrap();
        assert_eq!(sql, "SELECT pg_catalog.set_config('search_path', 'x', false);");
    }

    #[test]
    fn stamps_move_with_the_content_only() {
        let mut a = ParamMap::new();
        assert_eq!(a.stamp(), 0);
        a.set("TimeZone", "UTC");
        let first = a.stamp();
        assert_ne!(first, 0);
        a.set("timezone", "UTC");
        assert_eq!(a.stamp(), first, "same value: same content");
        let b = a.clone();
        assert_eq!(b.stamp(), first);
        a.set("search_path", "x");
        assert_ne!(a.stamp(), first);
        let second = a.stamp();
        a.set("search_path", "y");
        assert_ne!(a.stamp(), second);
        let mut c = ParamMap::new();
        c.set("TimeZone", "UTC");
        assert_eq!(c, b, "equality is by content");
        assert_ne!(c.stamp(), b.stamp());
    }

    #[test]
    fn equal_maps_share_a_canonical_stamp() {
        let cache = StampCache::default();
        let (mut a, mut b, mut c) = (ParamMap::new(), ParamMap::new(), ParamMap::new());
        a.set("application_name", "x");
        b.set("application_name", "x");
        c.set("application_name", "y");
        cache.canonicalize(&mut a);
        cache.canonicalize(&mut b);
        cache.canonicalize(&mut c);
        assert_eq!(a.stamp(), b.stamp());
        assert_ne!(a.stamp(), c.stamp());
        assert!(Arc::ptr_eq(a.values.as_ref().unwrap(), b.values.as_ref().unwrap()), "equal maps share one copy");
        b.set("application_name", "z");
        assert_ne!(a.stamp(), b.stamp(), "a change takes a fresh stamp");
        assert_eq!(a.get("application_name"), Some("x"), "and a copy: the shared values stay as they were");
    }

    #[test]
    fn names_match_in_any_case_and_keep_one_value() {
        let mut p = ParamMap::new();
        p.set("datestyle", "ISO");
        p.set("DateStyle", "ISO, MDY");
        p.set("Search_Path", "a");
        p.set("search_path", "b");
        assert_eq!(p.get("DATESTYLE"), Some("ISO, MDY"));
        assert_eq!(p.get("search_path"), Some("b"));
        assert_eq!(p.len(), 2);
        let all: Vec<_> = p.iter().collect();
        assert_eq!(all, vec![("DateStyle", "ISO, MDY"), ("Search_Path", "b")], "tracked names in canonical spelling");
        assert!(!p.is_empty() && ParamMap::new().is_empty());
    }

    #[test]
    fn reset_values_come_back_after_a_read_back() {
        let mut startup = ParamMap::new();
        startup.set("statement_timeout", "5s");
        startup.keep_as_reset_values();
        let mut session = ParamMap::new();
        session.set("lock_timeout", "1s");
        let after = startup.after_read_back(session.clone());
        assert_eq!(after.get("statement_timeout"), Some("5s"), "RESET returns to the startup value");
        assert_eq!(after.get("lock_timeout"), Some("1s"));
        session.set("statement_timeout", "7s");
        let again = after.after_read_back(session);
        assert_eq!(again.get("statement_timeout"), Some("7s"), "a session value wins");
        assert_eq!(again.after_read_back(ParamMap::new()).get("statement_timeout"), Some("5s"), "RESET ALL");
        let plain = ParamMap::new().after_read_back(ParamMap::new());
        assert!(plain.is_empty());
    }

    #[test]
    fn options_parse_dash_c_forms() {
        let o = parse_options("-c weir.client_deadline=800ms -csearch_path=a\\ b --work-mem=4MB").unwrap();
        assert_eq!(
            o,
            vec![
                ("weir.client_deadline".into(), "800ms".into()),
                ("search_path".into(), "a b".into()),
                ("work_mem".into(), "4MB".into())
            ]
        );
        assert!(parse_options("-d 5").is_err());
    }

    #[test]
    fn backslashes_use_escape_strings() {
        assert_eq!(set_statement("x", "a\\b"), "SET x=E'a\\\\b';");
        assert_eq!(set_statement("a-b", "1"), "SET \"a-b\"='1';");
        assert_eq!(set_config_statement("x", "a'\\"), "SELECT pg_catalog.set_config('x', E'a''\\\\', false);");
        assert!(!valid_name("a;drop"));
    }
}
