//! A statement's parameter count, as Postgres would have it, from its Parse:
//! the parameter types it declares, or the highest `$n` its text refers to
//! if that is more (Postgres adds a parameter for each `$n` it reads). The
//! text is read as Postgres's lexer reads it, far enough to tell a `$n`
//! from the same characters inside a string, a quoted identifier, a
//! comment, a dollar-quoted string or an identifier. Used only on cold
//! paths (`bind_check`), where weir answers for a statement it cannot ask
//! the server about.

/// The parameter count of a statement whose Parse body after its name is
/// `text` (query, NUL, parameter types). None when the text is not one
/// weir reads to its end (an unterminated quote or comment: Postgres
/// refuses it anyway).
pub(super) fn count(text: &[u8]) -> Option<u16> {
    let end = memchr::memchr(0, text)?;
    let declared = text.get(end + 1..end + 3).map(|b| u16::from_be_bytes([b[0], b[1]]))?;
    let referred = highest_param(&text[..end])?;
    Some(declared.max(referred))
}

/// The highest `$n` in `sql` outside strings, quoted identifiers, comments
/// and identifiers (0 for none).
fn highest_param(sql: &[u8]) -> Option<u16> {
    let mut highest: u32 = 0;
    let mut i = 0;
    while i < sql.len() {
        let c = sql[i];
        i = match c {
            b'\'' => {
                // E'...' (escape string syntax) takes backslash escapes.
                let escapes = i > 0 && sql[i - 1].eq_ignore_ascii_case(&b'e') && !ident_before(sql, i - 1);
                quoted(sql, i + 1, b'\'', escapes)?
            }
            b'"' => quoted(sql, i + 1, b'"', false)?,
            b'-' if sql.get(i + 1) == Some(&b'-') => memchr::memchr(b'\n', &sql[i..]).map_or(sql.len(), |n| i + n + 1),
            b'/' if sql.get(i + 1) == Some(&b'*') => block_comment(sql, i + 2)?,
            b'$' if ident_before(sql, i) => i + 1,
            b'$' if sql.get(i + 1).is_some_and(u8::is_ascii_digit) => {
                let digits = sql[i + 1..].iter().take_while(|b| b.is_ascii_digit()).count();
                let n = std::str::from_utf8(&sql[i + 1..i + 1 + digits]).ok()?.parse::<u32>().unwrap_or(u32::MAX);
                highest = highest.max(n);
                i + 1 + digits
            }
            b'$' => dollar_quoted(sql, i).unwrap_or(Some(i + 1))?,
            _ => i + 1,
        };
    }
    u16::try_from(highest).ok()
}

/// Whether the byte before `at` continues an identifier or a number (so a
/// `$` or a quote at `at` belongs to it).
fn ident_before(sql: &[u8], at: usize) -> bool {
    at > 0 && {
        let b = sql[at - 1];
        b.is_ascii_alphanumeric() || b == b'_' || b == b'$' || b >= 0x80
    }
}

/// The end of a quoted run opened before `from`, closed by `quote` (doubled
/// inside it); with `escapes`, a backslash escapes the next byte.
fn quoted(sql: &[u8], mut from: usize, quote: u8, escapes: bool) -> Option<usize> {
    while from < sql.len() {
        match sql[from] {
            b'\\' if escapes => from += 2,
            c if c == quote => {
                if sql.get(from + 1) == Some(&quote) {
                    from += 2;
                } else {
                    return Some(from + 1);
                }
            }
            _ => from += 1,
        }
    }
    None
}

/// The end of a `/* */` comment opened before `from` (they nest).
fn block_comment(sql: &[u8], mut from: usize) -> Option<usize> {
    let mut depth = 1;
    while from + 1 < sql.len() {
        match (sql[from], sql[from + 1]) {
            (b'/', b'*') => {
                depth += 1;
                from += 2;
            }
            (b'*', b'/') => {
                depth -= 1;
                from += 2;
                if depth == 0 {
                    return Some(from);
                }
            }
            _ => from += 1,
        }
    }
    None
}

/// At a `$` that starts no parameter: the end of the dollar-quoted string
/// it opens (`$tag$ ... $tag$`), Some(None) for one never closed, or None
/// when it opens none (a lone `$`).
fn dollar_quoted(sql: &[u8], at: usize) -> Option<Option<usize>> {
    let tag_len = sql[at + 1..].iter().take_while(|b| b.is_ascii_alphanumeric() || **b == b'_' || **b >= 0x80).count();
    if sql.get(at + 1 + tag_len) != Some(&b'$') {
        return None;
    }
    let tag = &sql[at..at + tag_len + 2];
    let body = at + tag.len();
    Some(memchr::memmem::find(&sql[body..], tag).map(|n| body + n + tag.len()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(query: &str, declared: u16) -> Vec<u8> {
        let mut t = query.as_bytes().to_vec();
        t.push(0);
        t.extend_from_slice(&declared.to_be_bytes());
        t.extend(std::iter::repeat_n(0u8, 4 * declared as usize));
        t
    }

    #[test]
    fn the_highest_reference_or_the_declared_types() {
        assert_eq!(count(&text("select 42", 0)), Some(0));
        assert_eq!(count(&text("select 42", 2)), Some(2));
        assert_eq!(count(&text("select $1::int as i, $2::text as t", 0)), Some(2));
        assert_eq!(count(&text("select $3", 1)), Some(3));
        assert_eq!(count(&text("insert into fz values ($1::int)", 2)), Some(2));
        assert_eq!(count(&text("select $12+$2", 0)), Some(12));
    }

    #[test]
    fn a_dollar_in_a_string_comment_or_name_is_no_parameter() {
        assert_eq!(count(&text("select '$1', 'it''s $2'", 0)), Some(0));
        assert_eq!(count(&text(r"select E'\'$1', $2", 0)), Some(2));
        assert_eq!(count(&text(r"select '\', $1", 0)), Some(1));
        assert_eq!(count(&text("select \"a$1\" from t -- $4\n where x = $1", 0)), Some(1));
        assert_eq!(count(&text("select /* $5 /* $6 */ $7 */ $2", 0)), Some(2));
        assert_eq!(count(&text("select $$ $3 $$, $body$ $4 $body$, $1", 0)), Some(1));
        assert_eq!(count(&text("select a$1 from b$2", 0)), Some(0));
        assert_eq!(count(&text("select $ + $1", 0)), Some(1));
    }

    #[test]
    fn an_unterminated_text_is_not_counted() {
        assert_eq!(count(&text("select '$1", 0)), None);
        assert_eq!(count(&text("select /* $1", 0)), None);
        assert_eq!(count(&text("select $$ $1", 0)), None);
        assert_eq!(count(b"select $1"), None);
    }
}
