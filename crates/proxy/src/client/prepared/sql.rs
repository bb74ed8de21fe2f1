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
///
/// This runs on every query. Almost every query starts with a word that is
/// none of the keywords below, and then only its `_` and `;` matter: one
/// search finds them (`scan_marks`), and the text is looked at for its NUL
/// only where a mark gives a verdict.
pub(super) fn classify(text: &[u8]) -> Sql {
    let text = &text[..text.len().min(INSPECT_LIMIT)];
    // A word found past the NUL (in a comment that would end there) is a
    // word the cut text does not have: it reads no word there, and neither
    // leads anywhere unless this one is a keyword.
    if is_keyword(Words { s: text }.bare()) {
        return classify_cut(until_nul(text));
    }
    scan_marks(text)
}

/// The text up to its first NUL.
fn until_nul(text: &[u8]) -> &[u8] {
    &text[..memchr::memchr(0, text).unwrap_or(text.len())]
}

/// One of the first words `classify_cut` looks further at.
fn is_keyword(word: &[u8]) -> bool {
    let keyword: &[u8] = match (word.len(), word.first().map(|b| b.to_ascii_lowercase())) {
        (2, Some(b'd')) => b"do",
        (3, Some(b's')) => b"set",
        (4, Some(b'd')) => b"drop",
        (5, Some(b'a')) => b"alter",
        (5, Some(b'r')) => b"reset",
        (6, Some(b'c')) => b"create",
        (6, Some(b'l')) => b"listen",
        (7, Some(b'p')) => b"prepare",
        (7, Some(b'd')) => return word.eq_ignore_ascii_case(b"declare") || word.eq_ignore_ascii_case(b"discard"),
        (10, Some(b'd')) => b"deallocate",
        _ => return false,
    };
    word.eq_ignore_ascii_case(keyword)
}

/// `classify` of a text that ends at its first NUL (none is left in it).
fn classify_cut(text: &[u8]) -> Sql {
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

/// `scan_rest` of the text up to its first NUL, from a text not yet cut
/// there. A mark that means nothing needs no look for the NUL: only one
/// that gives a verdict is checked to come before it. The look behind and
/// ahead of an `_` compares fixed words with no NUL in them, which a NUL in
/// their place fails as the cut would; reading on past `set_config` or
/// after a `;` is done on the cut text.
fn scan_marks(text: &[u8]) -> Sql {
    let mut found = Sql::Other;
    for at in memchr::memchr2_iter(b'_', b';', text) {
        let kind = if text[at] == b';' { after_semicolon(&text[at + 1..]) } else { at_underscore(text, at) };
        if kind == Sql::Other {
            continue;
        }
        if text[..at].contains(&0) {
            // The text ended before this mark, and before every later one.
            break;
        }
        if let Sql::Pins(_) = kind {
            return kind;
        }
        found = kind;
    }
    found
}

/// What an `_` may be part of: a session advisory lock or a `set_config`
/// call, whose `_` is followed by an `l` or a `c` (a test that rules out
/// almost every other `_` in one comparison).
fn at_underscore(text: &[u8], at: usize) -> Sql {
    match text.get(at + 1).map(u8::to_ascii_lowercase) {
        Some(b'l') if takes_session_advisory_lock(text, at) => Sql::Pins("session advisory lock"),
        Some(b'c') if names_set_config(text, at) => calls_set_config(until_nul(text), at),
        _ => Sql::Other,
    }
}

/// What follows a `;` (in a text not yet cut at its NUL): a SET or RESET.
fn after_semicolon(rest: &[u8]) -> Sql {
    // As for the first word in `classify`: only a SET or RESET leads on.
    let next = Words { s: rest }.bare();
    if !next.eq_ignore_ascii_case(b"set") && !next.eq_ignore_ascii_case(b"reset") {
        return Sql::Other;
    }
    set_or_reset(&mut Words { s: until_nul(rest) })
}

/// A statement that starts at `w`: a SET or RESET, or else `Other`.
fn set_or_reset(w: &mut Words<'_>) -> Sql {
    let next = w.bare();
    if next.eq_ignore_ascii_case(b"set") {
        set(w)
    } else if next.eq_ignore_ascii_case(b"reset") {
        reset(w)
    } else {
        Sql::Other
    }
}

/// What the rest of a query's text holds: a session advisory lock, a
/// `set_config` call, or a later statement that is a SET or RESET. One pass
/// over the bytes that can start these (`_`, `;`), usually one or two.
fn scan_rest(text: &[u8]) -> Sql {
    let mut found = Sql::Other;
    for at in memchr::memchr2_iter(b'_', b';', text) {
        let kind = if text[at] == b';' {
            set_or_reset(&mut Words { s: &text[at + 1..] })
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
    if !names_set_config(text, underscore) {
        return Sql::Other;
    }
    let i = underscore - 3;
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

/// `set_config` around the underscore at `underscore`.
fn names_set_config(text: &[u8], underscore: usize) -> bool {
    const CALL: &[u8] = b"set_config";
    underscore >= 3
        && underscore - 3 + CALL.len() <= text.len()
        && text[underscore - 3..][..CALL.len()].eq_ignore_ascii_case(CALL)
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
        // A local search_path resolves names differently until the
        // transaction ends: the client's statements are its own meanwhile
        // (and its settings are read back once it ends).
        b"local" => return if save.word() == b"search_path" { Sql::SessionSet } else { Sql::Other },
        b"transaction" | b"constraints" => return Sql::Other,
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

/// The bytes of a bare word: ASCII letters, digits and `_` (a table, as
/// the first word of every query is read).
const WORD_BYTE: [bool; 256] = {
    let mut t = [false; 256];
    let mut c = 0;
    while c < 256 {
        let b = c as u8;
        t[c] = b.is_ascii_alphanumeric() || b == b'_';
        c += 1;
    }
    t
};

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
        let n = self.s.iter().position(|&c| !WORD_BYTE[usize::from(c)]).unwrap_or(self.s.len());
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
mod tests;
