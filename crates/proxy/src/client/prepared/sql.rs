//! A cheap look at the head of a query's text (at most `INSPECT_LIMIT`
//! bytes, words only, never a full parse) to find what transaction pooling
//! must know about: DEALLOCATE / DISCARD ALL (prepared statements), DDL
//! that may leave shared statements stale, the statements that may change
//! session-level settings (weir then reads the outcome back from the
//! server), and the session features that cannot survive a change of server
//! connection.

/// Only this much of a query's text is looked at.
pub(super) const INSPECT_LIMIT: usize = 1024;

/// What a query's text means for pooling.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Sql {
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
    /// May change an unreported setting at session level (`SET`, `RESET`,
    /// `RESET ALL`, `set_config`, `SET SESSION CHARACTERISTICS`, `DO`):
    /// weir reads the server's session settings back when the transaction
    /// is over, so Postgres's own rules (rollback, `SET LOCAL`, savepoints)
    /// decide what the client keeps.
    SessionSet,
}

/// Parameters the server reports with ParameterStatus: the report itself
/// tells weir the outcome, so a SET of these needs no read-back.
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
pub(super) fn classify(text: &[u8]) -> Sql {
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
    } else if is(b"reset") {
        reset(&mut w)
    } else if is(b"do") {
        Sql::SessionSet
    } else {
        Sql::Other
    };
    if kind == Sql::Other {
        return scan_rest(text);
    }
    kind
}

/// What the rest of a query's text holds: a session advisory lock, a
/// `set_config` call, or a later statement that is a SET or RESET. One pass
/// over the bytes that can start these (`_`, `;`), usually one or two.
fn scan_rest(text: &[u8]) -> Sql {
    let mut found = Sql::Other;
    for at in memchr::memchr2_iter(b'_', b';', text) {
        let kind = if text[at] == b';' {
            let mut w = Words { s: &text[at + 1..] };
            let next = w.bare();
            if next.eq_ignore_ascii_case(b"set") {
                set(&mut w)
            } else if next.eq_ignore_ascii_case(b"reset") {
                reset(&mut w)
            } else {
                Sql::Other
            }
        } else if takes_session_advisory_lock(text, at) {
            Sql::Pins("session advisory lock")
        } else {
            calls_set_config(text, at)
        };
        match kind {
            Sql::Pins(_) => return kind,
            Sql::Other => {}
            _ => found = kind,
        }
    }
    found
}

/// `set_config(` around the underscore at `underscore`: a literal name
/// without a dot is followed by read-back; a custom (dotted) name or one
/// weir cannot read pins (Postgres lists no custom settings to read back).
fn calls_set_config(text: &[u8], underscore: usize) -> Sql {
    const CALL: &[u8] = b"set_config";
    let Some(i) = underscore.checked_sub(3) else { return Sql::Other };
    if i + CALL.len() > text.len() || !text[i..i + CALL.len()].eq_ignore_ascii_case(CALL) {
        return Sql::Other;
    }
    let mut w = Words { s: &text[i + CALL.len()..] };
    w.skip_space();
    let Some(rest) = w.s.strip_prefix(b"(") else { return Sql::Other };
    let mut w = Words { s: rest };
    w.skip_space();
    let Some(lit) = w.s.strip_prefix(b"'") else { return Sql::Pins("set_config of a name weir cannot read") };
    match memchr::memchr(b'\'', lit) {
        Some(end) if !lit[..end].contains(&b'.') => Sql::SessionSet,
        _ => Sql::Pins("set_config of a custom parameter"),
    }
}

/// `pg_advisory_lock…` or `pg_try_advisory_lock…` (not the `_xact_` forms,
/// which end with the transaction) around the underscore at `underscore`,
/// the `_` inside a candidate `advisory_lock`.
fn takes_session_advisory_lock(text: &[u8], underscore: usize) -> bool {
    const LOCK: &[u8] = b"advisory_lock";
    const UNDERSCORE_AT: usize = 8;
    let Some(i) = underscore.checked_sub(UNDERSCORE_AT) else { return false };
    i >= 3
        && i + LOCK.len() <= text.len()
        && text[i..i + LOCK.len()].eq_ignore_ascii_case(LOCK)
        && (text[i - 3..i].eq_ignore_ascii_case(b"pg_") || (i >= 7 && text[i - 7..i].eq_ignore_ascii_case(b"pg_try_")))
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

/// The rest of a `SET`: transaction-level forms change nothing after the
/// transaction; role and session authorization are never carried (they
/// pin: Postgres does not list them among its settings); a custom (dotted)
/// name pins too; a reported name needs no read-back.
fn set(w: &mut Words<'_>) -> Sql {
    let mut save = Words { s: w.s };
    let mut word = save.word();
    match word.as_slice() {
        b"local" | b"transaction" | b"constraints" => return Sql::Other,
        b"role" => return Sql::Pins("SET ROLE"),
        b"session" => {
            *w = save;
            let mut after = Words { s: w.s };
            word = after.word();
            match word.as_slice() {
                b"authorization" => return Sql::Pins("SET SESSION AUTHORIZATION"),
                b"role" => return Sql::Pins("SET ROLE"),
                b"characteristics" => return Sql::SessionSet,
                _ => {}
            }
        }
        b"time" | b"names" => return Sql::Other,
        _ => {}
    }
    setting_name(w)
}

/// The rest of a `RESET`: `ALL` and unreported names are read back.
fn reset(w: &mut Words<'_>) -> Sql {
    let mut save = Words { s: w.s };
    match save.word().as_slice() {
        b"all" => Sql::SessionSet,
        b"role" | b"session" => Sql::Other,
        _ => match setting_name(w) {
            Sql::Pins(_) => Sql::Other,
            other => other,
        },
    }
}

/// A setting's name: reported ones are followed by their ParameterStatus,
/// custom (dotted) ones pin, any other is read back.
fn setting_name(w: &mut Words<'_>) -> Sql {
    let Some((name, _)) = w.ident() else { return Sql::Other };
    if w.s.first() == Some(&b'.') || name.contains(&b'.') {
        return Sql::Pins("SET of a custom parameter");
    }
    if REPORTED.iter().any(|r| r.as_bytes() == name.as_slice()) {
        Sql::Other
    } else {
        Sql::SessionSet
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

    /// The text ends at its first NUL: whatever follows (a Parse's
    /// parameter types, or garbage) never changes the verdict, wherever
    /// the NUL falls, including inside words, comments and literals.
    #[test]
    fn a_nul_ends_the_text_wherever_it_falls() {
        let queries: &[&[u8]] = &[
            b"SELECT abalance FROM pgbench_accounts WHERE aid = 12345;",
            b"select pg_advisory_lock(1)",
            b"select pg_try_advisory_lock(1); select 1",
            b"select pg_advisory_xact_lock(1)",
            b"select set_config('work_mem', '1MB', false)",
            b"select set_config('a.b', '1', false)",
            b"select 1; set work_mem = 1",
            b"select 1; /* c */ reset all",
            b"/* c */ set search_path = x",
            b"-- c\nlisten x",
            b"deallocate s1",
            b"create temp table t (a int)",
            b"declare c cursor with hold for select 1",
        ];
        let tails: &[&[u8]] = &[b"", b"; set work_mem = 2", b"'; select pg_advisory_lock(1) */ set x = 1", b"\n(x"];
        for q in queries {
            for cut in 0..=q.len() {
                for tail in tails {
                    let text = [&q[..cut], b"\0", tail].concat();
                    assert_eq!(classify(&text), classify(&q[..cut]), "{:?}", String::from_utf8_lossy(&text));
                }
            }
        }
    }

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
        assert_eq!(classify(b"SET search_path = a"), Sql::SessionSet);
        assert_eq!(classify(b"set session work_mem to '1MB'"), Sql::SessionSet);
        assert_eq!(classify(b"set \"statement_timeout\" to 5"), Sql::SessionSet);
        assert_eq!(classify(b"set session characteristics as transaction read only"), Sql::SessionSet);
        assert_eq!(classify(b"set local work_mem to '1MB'"), Sql::Other);
        assert_eq!(classify(b"set transaction isolation level serializable"), Sql::Other);
        assert_eq!(classify(b"SET TIME ZONE 'UTC'"), Sql::Other);
        assert_eq!(classify(b"set application_name = 'x'"), Sql::Other);
        assert_eq!(classify(b"set DateStyle = ISO"), Sql::Other);
        assert_eq!(classify(b"RESET ALL"), Sql::SessionSet);
        assert_eq!(classify(b"reset statement_timeout"), Sql::SessionSet);
        assert_eq!(classify(b"reset application_name"), Sql::Other);
        assert_eq!(classify(b"reset myapp.x"), Sql::Other);
        assert_eq!(classify(b"do $$ begin perform 1; end $$"), Sql::SessionSet);
        assert_eq!(classify(b"begin; set lock_timeout = 1; commit"), Sql::SessionSet);
        assert_eq!(classify(b"begin; set local lock_timeout = 1; commit"), Sql::Other);
    }

    #[test]
    fn set_config_is_read_back_or_pins() {
        assert_eq!(classify(b"select set_config('statement_timeout', '1s', false)"), Sql::SessionSet);
        assert_eq!(classify(b"SELECT pg_catalog.SET_CONFIG ( 'work_mem','1MB',false)"), Sql::SessionSet);
        assert_eq!(
            classify(b"select set_config('app.user', '1', false)"),
            Sql::Pins("set_config of a custom parameter")
        );
        assert_eq!(classify(b"select set_config($1, $2, false)"), Sql::Pins("set_config of a name weir cannot read"));
        assert_eq!(classify(b"select my_set_configs()"), Sql::Other);
        assert_eq!(classify(b"select reset_config"), Sql::Other);
    }

    #[test]
    fn what_weir_cannot_follow_pins() {
        assert_eq!(classify(b"SET ROLE other"), Sql::Pins("SET ROLE"));
        assert_eq!(classify(b"set session authorization bob"), Sql::Pins("SET SESSION AUTHORIZATION"));
        assert_eq!(classify(b"set session role bob"), Sql::Pins("SET ROLE"));
        assert_eq!(classify(b"set myapp.tenant = '7'"), Sql::Pins("SET of a custom parameter"));
        assert_eq!(classify(b"set \"myapp.tenant\" = '7'"), Sql::Pins("SET of a custom parameter"));
        assert_eq!(classify(b"select 1; set myapp.tenant = '7'"), Sql::Pins("SET of a custom parameter"));
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
