//! A cheap look at the head of a query's text (at most `INSPECT_LIMIT`
//! bytes, words only, never a full parse) to find what transaction pooling
//! must know about: DEALLOCATE / DISCARD ALL (prepared statements), DDL
//! that may leave shared statements stale, and the session features that
//! cannot survive a change of server connection.

/// Only this much of a query's text is looked at.
pub const INSPECT_LIMIT: usize = 1024;

/// What a query's text means for pooling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Sql {
    /// Nothing weir cares about.
    Other,
    /// `DEALLOCATE [PREPARE] name`, alone in the query.
    Deallocate(Vec<u8>),
    /// `DEALLOCATE [PREPARE] ALL` or `DISCARD ALL`.
    DropsAll,
    /// `DROP ...` or `ALTER ...`: statements prepared before may be stale.
    Ddl,
    /// A session feature that needs the same server connection from now on.
    Pins(&'static str),
    /// `SET` at session level of a parameter weir does not carry across
    /// server connections (the name, lowercase).
    SessionSet(String),
}

/// Parameters the server reports with ParameterStatus: weir re-applies
/// them on every server a client borrows, so a session SET of these is safe.
const REPORTED: &[&str] = &[
    "application_name",
    "client_encoding",
    "datestyle",
    "intervalstyle",
    "timezone",
    "standard_conforming_strings",
    "default_transaction_read_only",
    "in_hot_standby",
    "integer_datetimes",
    "is_superuser",
];

/// Classifies the start of a query's text (`text` may be cut short, and
/// ends at its first NUL).
pub fn classify(text: &[u8]) -> Sql {
    let text = &text[..text.len().min(INSPECT_LIMIT)];
    let text = &text[..memchr::memchr(0, text).unwrap_or(text.len())];
    let mut w = Words { s: text };
    // Compared in place, not lowercased into a buffer: this runs on every
    // query, and almost every query starts with some other word.
    let first = w.bare();
    let is = |keyword: &[u8]| first.eq_ignore_ascii_case(keyword);
    let kind = if is(b"deallocate") {
        deallocate(&mut w)
    } else if is(b"discard") {
        if w.bare().eq_ignore_ascii_case(b"all") {
            Sql::DropsAll
        } else {
            Sql::Other
        }
    } else if is(b"drop") || is(b"alter") {
        Sql::Ddl
    } else if is(b"listen") {
        Sql::Pins("LISTEN")
    } else if is(b"prepare") {
        Sql::Pins("SQL PREPARE")
    } else if is(b"declare") && contains(text, b"with hold") {
        Sql::Pins("DECLARE ... WITH HOLD")
    } else if is(b"create") {
        create(&mut w, text)
    } else if is(b"set") {
        set(&mut w)
    } else {
        Sql::Other
    };
    if kind == Sql::Other && takes_session_advisory_lock(text) {
        return Sql::Pins("session advisory lock");
    }
    kind
}

/// `pg_advisory_lock…` or `pg_try_advisory_lock…` (not the `_xact_` forms,
/// which end with the transaction). Visits only the text's underscores (one
/// or two in a typical query), each the `_` inside a candidate
/// `advisory_lock`.
fn takes_session_advisory_lock(text: &[u8]) -> bool {
    const LOCK: &[u8] = b"advisory_lock";
    const UNDERSCORE_AT: usize = 8;
    memchr::memchr_iter(b'_', text).any(|underscore| {
        let Some(i) = underscore.checked_sub(UNDERSCORE_AT) else { return false };
        i >= 3
            && i + LOCK.len() <= text.len()
            && text[i..i + LOCK.len()].eq_ignore_ascii_case(LOCK)
            && (text[i - 3..i].eq_ignore_ascii_case(b"pg_")
                || (i >= 7 && text[i - 7..i].eq_ignore_ascii_case(b"pg_try_")))
    })
}

fn deallocate(w: &mut Words<'_>) -> Sql {
    let mut save = Words { s: w.s };
    if save.word() == b"prepare" {
        *w = save;
    }
    let Some(name) = w.ident() else { return Sql::Other };
    if !w.at_end() {
        return Sql::Other;
    }
    if name.1 || name.0 != b"all" {
        Sql::Deallocate(name.0)
    } else {
        Sql::DropsAll
    }
}

fn create(w: &mut Words<'_>, text: &[u8]) -> Sql {
    let mut word = w.word();
    if word == b"global" || word == b"local" {
        word = w.word();
    }
    let temp = word == b"temp" || word == b"temporary";
    if temp && !contains(text, b"on commit drop") {
        Sql::Pins("temporary table")
    } else {
        Sql::Other
    }
}

fn set(w: &mut Words<'_>) -> Sql {
    let mut word = w.word();
    match word.as_slice() {
        b"local" | b"transaction" | b"constraints" => return Sql::Other,
        b"session" => {
            word = w.word();
            if word == b"characteristics" || word == b"authorization" {
                return Sql::SessionSet(format!("session {}", String::from_utf8_lossy(&word)));
            }
        }
        _ => {}
    }
    if word == b"time" {
        word = b"timezone".to_vec();
    }
    let name = String::from_utf8_lossy(&word).into_owned();
    if name.is_empty() || REPORTED.contains(&name.as_str()) {
        Sql::Other
    } else {
        Sql::SessionSet(name)
    }
}

/// Case-insensitive search for an ASCII lowercase `needle`.
fn contains(hay: &[u8], needle: &[u8]) -> bool {
    // The first-byte test keeps this cheap: it runs on every query's text.
    let Some(&first) = needle.first() else { return true };
    hay.len() >= needle.len()
        && hay.windows(needle.len()).any(|w| w[0].to_ascii_lowercase() == first && w.eq_ignore_ascii_case(needle))
}

/// Words of SQL text, skipping whitespace and comments.
struct Words<'a> {
    s: &'a [u8],
}

impl<'a> Words<'a> {
    fn skip_space(&mut self) {
        loop {
            let s = self.s;
            if let Some((&c, rest)) = s.split_first() {
                if c.is_ascii_whitespace() {
                    self.s = rest;
                    continue;
                }
            }
            if s.starts_with(b"--") {
                let end = s.iter().position(|&c| c == b'\n').unwrap_or(s.len());
                self.s = &s[end..];
                continue;
            }
            if s.starts_with(b"/*") {
                let end = s.windows(2).position(|w| w == b"*/").map(|p| p + 2).unwrap_or(s.len());
                self.s = &s[end..];
                continue;
            }
            return;
        }
    }

    /// The next bare word as written (empty when none).
    fn bare(&mut self) -> &'a [u8] {
        self.skip_space();
        let n = self.s.iter().take_while(|c| c.is_ascii_alphanumeric() || **c == b'_').count();
        let (w, rest) = self.s.split_at(n);
        self.s = rest;
        w
    }

    /// The next bare word, lowercase (empty when none).
    fn word(&mut self) -> Vec<u8> {
        self.bare().to_ascii_lowercase()
    }

    /// The next identifier as Postgres folds it, and whether it was quoted.
    fn ident(&mut self) -> Option<(Vec<u8>, bool)> {
        self.skip_space();
        if self.s.first() != Some(&b'"') {
            let w = self.word();
            return (!w.is_empty()).then_some((w, false));
        }
        let mut out = Vec::new();
        let mut i = 1;
        while i < self.s.len() {
            if self.s[i] == b'"' {
                if self.s.get(i + 1) == Some(&b'"') {
                    out.push(b'"');
                    i += 2;
                    continue;
                }
                self.s = &self.s[i + 1..];
                return Some((out, true));
            }
            out.push(self.s[i]);
            i += 1;
        }
        None
    }

    /// Only spaces, comments and semicolons are left.
    fn at_end(&mut self) -> bool {
        loop {
            self.skip_space();
            match self.s.split_first() {
                Some((&b';', rest)) => self.s = rest,
                Some(_) => return false,
                None => return true,
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deallocate_forms() {
        assert_eq!(classify(b"DEALLOCATE s1"), Sql::Deallocate(b"s1".to_vec()));
        assert_eq!(classify(b"  deallocate prepare \"My\"\"S\" ; "), Sql::Deallocate(b"My\"S".to_vec()));
        assert_eq!(classify(b"deallocate S1;"), Sql::Deallocate(b"s1".to_vec()));
        assert_eq!(classify(b"DEALLOCATE ALL"), Sql::DropsAll);
        assert_eq!(classify(b"deallocate \"all\""), Sql::Deallocate(b"all".to_vec()));
        assert_eq!(classify(b"discard all"), Sql::DropsAll);
        assert_eq!(classify(b"deallocate s1; select 1"), Sql::Other);
        assert_eq!(classify(b"deallocate \"unterminated"), Sql::Other);
        assert_eq!(classify(b"discard plans"), Sql::Other);
    }

    #[test]
    fn session_features_pin() {
        assert_eq!(classify(b"LISTEN chan"), Sql::Pins("LISTEN"));
        assert_eq!(classify(b"/* c */ -- x\n listen chan"), Sql::Pins("LISTEN"));
        assert_eq!(classify(b"select pg_advisory_lock(1)"), Sql::Pins("session advisory lock"));
        assert_eq!(classify(b"SELECT PG_TRY_ADVISORY_LOCK_SHARED(1)"), Sql::Pins("session advisory lock"));
        assert_eq!(classify(b"select pg_advisory_xact_lock(1)"), Sql::Other);
        assert_eq!(classify(b"select pg_advisory_unlock(1), x_advisory_lock(2)"), Sql::Other);
        assert_eq!(classify(b"pg_advisory_lock"), Sql::Pins("session advisory lock"));
        assert_eq!(classify(b"select 1 -- pg_try_advisory_lock"), Sql::Pins("session advisory lock"));
        assert_eq!(classify(b"declare c cursor with hold for select 1"), Sql::Pins("DECLARE ... WITH HOLD"));
        assert_eq!(classify(b"declare c cursor for select 1"), Sql::Other);
        assert_eq!(classify(b"create temp table t (a int)"), Sql::Pins("temporary table"));
        assert_eq!(classify(b"create local temporary table t (a int)"), Sql::Pins("temporary table"));
        assert_eq!(classify(b"create temp table t (a int) on commit drop"), Sql::Other);
        assert_eq!(classify(b"create table t (a int)"), Sql::Other);
        assert_eq!(classify(b"prepare p as select 1"), Sql::Pins("SQL PREPARE"));
    }

    #[test]
    fn session_set_of_unreported_parameters_is_flagged() {
        assert_eq!(classify(b"SET search_path = a"), Sql::SessionSet("search_path".into()));
        assert_eq!(classify(b"set session work_mem to '1MB'"), Sql::SessionSet("work_mem".into()));
        assert_eq!(classify(b"set local work_mem to '1MB'"), Sql::Other);
        assert_eq!(classify(b"set transaction isolation level serializable"), Sql::Other);
        assert_eq!(classify(b"SET TIME ZONE 'UTC'"), Sql::Other);
        assert_eq!(classify(b"set application_name = 'x'"), Sql::Other);
        assert_eq!(classify(b"set DateStyle = ISO"), Sql::Other);
    }

    #[test]
    fn ddl_is_flagged() {
        assert_eq!(classify(b"DROP TYPE mood"), Sql::Ddl);
        assert_eq!(classify(b" alter table t alter column a type text"), Sql::Ddl);
        assert_eq!(classify(b"dropped"), Sql::Other);
        assert_eq!(classify(b"create type mood as enum ('a')"), Sql::Other);
    }

    #[test]
    fn odd_input_is_harmless() {
        assert_eq!(classify(b""), Sql::Other);
        assert_eq!(classify(b"/* unterminated"), Sql::Other);
        assert_eq!(classify(b"set"), Sql::Other);
        assert_eq!(classify(&[0xff, 0xfe, b' ', b'x']), Sql::Other);
        let long = [b"select 1 ".as_slice(), &vec![b' '; 2000], b"pg_advisory_lock(1)"].concat();
        assert_eq!(classify(&long), Sql::Other, "only the head is inspected");
    }
}
