//! Query fingerprints: a 64-bit hash of one statement's text with its
//! literals, letter case, whitespace and comments normalized away, so that
//! `SELECT * FROM t WHERE id = 1` and `select * from t where id=2` count as
//! one statement; and the two other questions about a query's text that
//! ride on the same lexer (does it lead with transaction or setting
//! boilerplate, is it a bare `COMMIT`).
//!
//! The lexer is hand-written, not a SQL parser crate: it runs on every
//! query, so it makes one pass over the bytes, allocates nothing, and
//! hashes the normal form as it goes instead of building it. It needs
//! tokens only, never a parse tree, and takes any bytes (invalid UTF-8,
//! unterminated strings and comments run to the end) without an error.
//! `normalized` builds the same normal form as text, for display.
//!
//! The normal form of a statement is its tokens separated by one space:
//! literals (numbers, with a sign that is not a subtraction, strings of
//! every kind, dollar quotes, `true` and `false`) become `?`, and a
//! parenthesised list of nothing but literals `( ? )`; unquoted words are
//! lowercase; quoted identifiers, parameters (`$1`), operators and
//! punctuation stay as written; comments and the closing `;` are dropped.

/// Only this many bytes of a statement are looked at: the rest of a longer
/// statement is not part of its fingerprint, and no statement after it is
/// looked at. (Boilerplate statements are read through, each within its
/// own limit, up to the first other one.)
pub const STATEMENT_LIMIT: usize = 4096;

/// A statement's fingerprint: the hash of its normalized text. 0 is never
/// returned (reserved for "none").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Fingerprint(pub u64);

impl Fingerprint {
    /// The fingerprint as 16 lowercase hex digits.
    pub fn hex(self) -> String {
        format!("{:016x}", self.0)
    }
}

mod shape;

pub use shape::same_shape;

/// What `fingerprint` found in a query's text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Scan {
    /// The fingerprint of the statement chosen.
    pub fingerprint: Fingerprint,
    /// What the text starts with.
    pub lead: Lead,
}

/// What a query's text starts with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Lead {
    /// The text is exactly one bare `BEGIN` / `BEGIN WORK` / `BEGIN
    /// TRANSACTION` / `START TRANSACTION` (no modes), with optional `;`,
    /// whitespace and comments.
    BareBegin,
    /// The text's statements are all `BEGIN`, `START TRANSACTION`, `SET`,
    /// `SAVEPOINT` or `RELEASE` (its fingerprint is then its first
    /// statement's).
    Boilerplate,
    /// Anything else.
    Statement,
}

/// The fingerprint of the first statement of `text` that is not
/// transaction or setting boilerplate, and what the text starts with. The
/// text ends at its first NUL.
pub fn fingerprint(text: &[u8]) -> Scan {
    let (fnv, lead) = scan(text, Fnv::new);
    Scan { fingerprint: fnv.finish(), lead }
}

/// The fingerprint of a normalized text, as `normalized` returns it.
pub fn hash_of(normalized: &str) -> Fingerprint {
    let mut fnv = Fnv::new();
    normalized.bytes().for_each(|b| fnv.push(b));
    fnv.finish()
}

/// The normalized text of the statement `fingerprint` chose, cut at `max`
/// bytes (on a char boundary), for display: computed only when a
/// fingerprint is new. Bytes that are not UTF-8 show as U+FFFD.
pub fn normalized(text: &[u8], max: usize) -> String {
    let (Buf(bytes), _) = scan(text, || Buf(Vec::new()));
    let mut s = String::from_utf8(bytes).unwrap_or_else(|e| String::from_utf8_lossy(e.as_bytes()).into_owned());
    let mut cut = max.min(s.len());
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    s.truncate(cut);
    s
}

/// Is `text` (one simple Query's text) exactly a bare COMMIT/END/ROLLBACK/
/// ABORT (with optional WORK/TRANSACTION, `;`, whitespace, comments)?
/// Returns the CommandComplete tag Postgres sends for it in an empty
/// transaction: "COMMIT" for COMMIT/END, "ROLLBACK" for ROLLBACK/ABORT.
pub fn bare_end(text: &[u8]) -> Option<&'static str> {
    let (window, whole) = Source { text, searched: 0 }.window(0);
    if !whole {
        return None;
    }
    let mut lexer = Lexer::new(window);
    let first = lexer.next()?;
    let tag = if first.is(window, "commit") || first.is(window, "end") {
        "COMMIT"
    } else if first.is(window, "rollback") || first.is(window, "abort") {
        "ROLLBACK"
    } else {
        return None;
    };
    let mut next = lexer.next();
    if next.is_some_and(|t| t.is(window, "work") || t.is(window, "transaction")) {
        next = lexer.next();
    }
    while let Some(t) = next {
        if t.kind != Kind::Semi {
            return None;
        }
        next = lexer.next();
    }
    Some(tag)
}

/// Walks `text`'s statements for `fingerprint` and `normalized`: the normal
/// form (in an `Out` that `new` makes) of the statement chosen, and what
/// the text leads with.
fn scan<O: Out>(text: &[u8], new: impl Fn() -> O) -> (O, Lead) {
    let mut source = Source { text, searched: 0 };
    let (mut from, mut first, mut statements) = (0, None, 0);
    loop {
        let (out, lead, end) = statement(source.window(from).0, new());
        match lead {
            Some(Lead::Statement) => return (out, Lead::Statement),
            Some(lead) => {
                statements += 1;
                if first.is_none() {
                    first = Some((out, lead));
                }
            }
            None => {}
        }
        let Some(n) = end else { break };
        from += n;
    }
    match first {
        Some((out, Lead::BareBegin)) if statements == 1 => (out, Lead::BareBegin),
        Some((out, _)) => (out, Lead::Boilerplate),
        None => (new(), Lead::Statement),
    }
}

/// One statement from the start of `window`: its normal form, what it is
/// (`None` when it has no token: `Statement` means fingerprint it), and
/// its length up to and including its top-level `;` (`None` when it runs
/// to the end of the window).
fn statement<O: Out>(window: &[u8], out: O) -> (O, Option<Lead>, Option<usize>) {
    let mut lexer = Lexer::new(window);
    let mut normal = Normal { out, started: false, held: None };
    let (mut head, mut count, mut depth, mut end) = ([None; 2], 0, 0u32, None);
    while let Some(t) = lexer.next() {
        match t.kind {
            Kind::Semi if depth == 0 => {
                end = Some(t.end);
                break;
            }
            Kind::Open => depth += 1,
            Kind::Close => depth = depth.saturating_sub(1),
            _ => {}
        }
        if let Some(slot) = head.get_mut(count) {
            *slot = Some(t);
        }
        count += 1;
        normal.token(t, window);
    }
    (normal.finish(), lead(window, head, count), end)
}

/// What a statement of `count` tokens that starts with `head` is.
fn lead(s: &[u8], [first, second]: [Option<Token>; 2], count: usize) -> Option<Lead> {
    let is = |t: Option<Token>, keyword| t.is_some_and(|t| t.is(s, keyword));
    let begin = is(first, "begin");
    let start = is(first, "start") && is(second, "transaction");
    let mode = is(second, "work") || is(second, "transaction");
    Some(if (begin && (count == 1 || (count == 2 && mode))) || (start && count == 2) {
        Lead::BareBegin
    } else if begin || start || is(first, "set") || is(first, "savepoint") || is(first, "release") {
        Lead::Boilerplate
    } else if count > 0 {
        Lead::Statement
    } else {
        return None;
    })
}

/// A query's text up to its first NUL, which is looked for lazily: only in
/// the bytes a statement's window covers, each byte once.
struct Source<'a> {
    /// The text, cut at its NUL once that is found.
    text: &'a [u8],
    /// No NUL comes before this offset.
    searched: usize,
}

impl<'a> Source<'a> {
    /// The window of at most `STATEMENT_LIMIT` bytes at `from` (an offset
    /// within an earlier window), and whether it runs to the end of the
    /// text.
    fn window(&mut self, from: usize) -> (&'a [u8], bool) {
        let end = from.saturating_add(STATEMENT_LIMIT).min(self.text.len());
        if end > self.searched {
            let fresh = &self.text[self.searched..end];
            // `contains` is std's fast memchr; the position only when found.
            if fresh.contains(&0) {
                let at = fresh.iter().position(|&b| b == 0).unwrap_or(fresh.len());
                self.text = &self.text[..self.searched + at];
            }
            self.searched = end;
        }
        let end = end.min(self.text.len());
        (self.text.get(from..end).unwrap_or_default(), end == self.text.len())
    }
}

/// Where the normal form goes: into a hash, or a buffer for display.
trait Out {
    /// Adds the next byte of the normal form.
    fn push(&mut self, b: u8);
}

/// FNV-1a 64 over the normal form (measured faster here than a hash that
/// takes 8 bytes at a time: the state stays in a register).
struct Fnv(u64);

impl Fnv {
    /// The hash of nothing: FNV-1a's 64-bit offset basis.
    fn new() -> Self {
        Fnv(0xcbf2_9ce4_8422_2325)
    }

    /// The fingerprint: the hash, with 0 (reserved) moved to 1.
    fn finish(self) -> Fingerprint {
        Fingerprint(self.0.max(1))
    }
}

impl Out for Fnv {
    fn push(&mut self, b: u8) {
        self.0 = (self.0 ^ u64::from(b)).wrapping_mul(0x0000_0100_0000_01b3);
    }
}

/// The normal form as bytes, for `normalized`.
struct Buf(Vec<u8>);

impl Out for Buf {
    fn push(&mut self, b: u8) {
        self.0.push(b);
    }
}

/// Writes a statement's tokens in normal form.
struct Normal<O> {
    /// Where the normal form goes.
    out: O,
    /// A token was written (the next one needs a space before it).
    started: bool,
    /// A `(` held back with this many tokens after it, literals and commas
    /// in turn, until it is known whether the parentheses hold only
    /// literals (written `( ? )`) or not.
    held: Option<u32>,
}

impl<O: Out> Normal<O> {
    /// Takes the next token of the statement in `s`.
    fn token(&mut self, t: Token, s: &[u8]) {
        match (self.held, t.kind) {
            (Some(n), Kind::Literal) if n % 2 == 0 => self.held = Some(n + 1),
            (Some(n), Kind::Comma) if n % 2 == 1 => self.held = Some(n + 1),
            (Some(n), Kind::Close) if n % 2 == 1 => {
                self.held = None;
                [b"(", b"?", b")"].iter().for_each(|b| self.write(*b, false));
            }
            (_, kind) => {
                self.flush();
                match kind {
                    Kind::Open => self.held = Some(0),
                    Kind::Literal => self.write(b"?", false),
                    _ => self.write(&s[t.start..t.end], kind == Kind::Word),
                }
            }
        }
    }

    /// Writes the tokens held back, as they would have been written.
    fn flush(&mut self) {
        if let Some(n) = self.held.take() {
            self.write(b"(", false);
            (0..n).for_each(|i| self.write(if i % 2 == 0 { b"?" } else { b"," }, false));
        }
    }

    /// Writes one token, in lowercase if `lower`, after a space unless it
    /// is the first.
    fn write(&mut self, bytes: &[u8], lower: bool) {
        if self.started {
            self.out.push(b' ');
        }
        self.started = true;
        for &b in bytes {
            self.out.push(if lower { b.to_ascii_lowercase() } else { b });
        }
    }

    /// The normal form, with anything held back written.
    fn finish(mut self) -> O {
        self.flush();
        self.out
    }
}

/// Whitespace.
const SPACE: u8 = 1;
/// Starts a word: an ASCII letter, `_`, or any byte of a non-ASCII char.
const WORD: u8 = 2;
/// In a dollar quote's tag: a word byte or a digit.
const TAG: u8 = 4;
/// Continues a word: a tag byte or `$`.
const CONT: u8 = 8;
/// An ASCII digit.
const DIGIT: u8 = 16;
/// In a number's run of digits: a digit or `_`.
const NUM: u8 = 32;
/// In an operator.
const OP: u8 = 64;
/// An operator byte that lets a longer operator end in `+` or `-`.
const KEEPS_SIGN: u8 = 128;

/// The classes (flags above) of each byte: the lexer's only look at a
/// byte, so that a class test is one load.
const CLASS: [u8; 256] = {
    let mut t = [0u8; 256];
    let mut i = 0;
    while i < 256 {
        let b = i as u8;
        let word = if b.is_ascii_alphabetic() || b == b'_' || b >= 0x80 { WORD | TAG | CONT } else { 0 };
        let digit = if b.is_ascii_digit() { DIGIT | NUM | TAG | CONT } else { 0 };
        t[i] = word
            | digit
            | flag(b, b" \t\n\r\x0b\x0c", SPACE)
            | flag(b, b"_", NUM)
            | flag(b, b"$", CONT)
            | flag(b, b"~!@#^&|`?+-*/%<>=", OP)
            | flag(b, b"~!@#^&|`?%", KEEPS_SIGN);
        i += 1;
    }
    t
};

/// `flag` if `b` is in `set`, else 0 (for building `CLASS`).
const fn flag(b: u8, set: &[u8], flag: u8) -> u8 {
    let mut i = 0;
    while i < set.len() {
        if set[i] == b {
            return flag;
        }
        i += 1;
    }
    0
}

/// Words after which a `-` before a number is its sign, not a subtraction
/// (the ones an expression commonly follows; any other word is taken for a
/// column name).
const BEFORE_EXPRESSION: &str =
    "select where and or not when then else case limit offset between like ilike having return returning distinct";

/// What a token is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    /// An unquoted keyword or identifier.
    Word,
    /// A quoted identifier.
    Quoted,
    /// A number, string, dollar quote, `true` or `false`.
    Literal,
    /// `$1`.
    Param,
    /// An operator.
    Op,
    /// `(`.
    Open,
    /// `)`.
    Close,
    /// `,`.
    Comma,
    /// `;`.
    Semi,
    /// Any other punctuation.
    Punct,
}

/// One token: its kind and where it is.
#[derive(Debug, Clone, Copy)]
struct Token {
    /// What the token is.
    kind: Kind,
    /// Its first byte's offset.
    start: usize,
    /// The offset after its last byte.
    end: usize,
}

impl Token {
    /// Whether the token is the word `keyword` (lowercase) in any case.
    fn is(self, s: &[u8], keyword: &str) -> bool {
        self.kind == Kind::Word && s[self.start..self.end].eq_ignore_ascii_case(keyword.as_bytes())
    }
}

/// The tokens of a window of SQL text, skipping whitespace and comments.
struct Lexer<'a> {
    /// The window (with no NUL in it).
    s: &'a [u8],
    /// The offset of the next byte to read.
    i: usize,
    /// The token before, for the sign of a number.
    prev: Token,
}

impl<'a> Lexer<'a> {
    /// A lexer at the start of `s`.
    fn new(s: &'a [u8]) -> Self {
        Lexer { s, i: 0, prev: Token { kind: Kind::Semi, start: 0, end: 0 } }
    }

    /// The next token, if any is left.
    fn next(&mut self) -> Option<Token> {
        self.skip_space();
        let start = self.i;
        let &b = self.s.get(start)?;
        let kind = self.token(b);
        let t = Token { kind, start, end: self.i };
        self.prev = t;
        Some(t)
    }

    /// The byte at `i`, NUL at or past the end.
    fn at(&self, i: usize) -> u8 {
        self.s.get(i).copied().unwrap_or(0)
    }

    /// Whether the byte at `i` has a class among `flags`.
    fn has(&self, i: usize, flags: u8) -> bool {
        CLASS[usize::from(self.at(i))] & flags != 0
    }

    /// The offset after a run of bytes with a class among `flags` at `i`.
    fn run(&self, i: usize, flags: u8) -> usize {
        let rest = self.s.get(i..).unwrap_or_default();
        i + rest.iter().position(|&b| CLASS[usize::from(b)] & flags == 0).unwrap_or(rest.len())
    }

    /// Skips whitespace, `--` comments and nested `/* */` comments.
    fn skip_space(&mut self) {
        loop {
            match (self.at(self.i), self.at(self.i + 1)) {
                _ if self.has(self.i, SPACE) => self.i += 1,
                (b'-', b'-') => {
                    let rest = &self.s[self.i..];
                    self.i += rest.iter().position(|&c| c == b'\n' || c == b'\r').unwrap_or(rest.len());
                }
                (b'/', b'*') => self.block_comment(),
                _ => return,
            }
        }
    }

    /// Skips a (nested) block comment, at its `/*`.
    fn block_comment(&mut self) {
        let mut depth = 0u32;
        while self.i < self.s.len() {
            let pair = (self.at(self.i), self.at(self.i + 1));
            depth = match pair {
                (b'/', b'*') => depth + 1,
                (b'*', b'/') => depth - 1,
                _ => {
                    self.i += 1;
                    continue;
                }
            };
            self.i += 2;
            if depth == 0 {
                return;
            }
        }
    }

    /// Reads the token that starts with `b`, at `self.i`.
    fn token(&mut self, b: u8) -> Kind {
        if self.starts_number(self.i) {
            self.number();
            return Kind::Literal;
        }
        if self.has(self.i, WORD) {
            return self.word(b);
        }
        if self.has(self.i, OP) {
            return self.operator();
        }
        self.i += 1;
        match b {
            b'\'' | b'"' => {
                self.quoted(b, false);
                if b == b'"' {
                    Kind::Quoted
                } else {
                    Kind::Literal
                }
            }
            b'$' => self.dollar(),
            b'(' => Kind::Open,
            b')' => Kind::Close,
            b',' => Kind::Comma,
            b';' => Kind::Semi,
            b':' if self.at(self.i) == b':' => {
                self.i += 1;
                Kind::Punct
            }
            _ => Kind::Punct,
        }
    }

    /// Whether a number starts at `i`: a digit, or `.` and a digit.
    fn starts_number(&self, i: usize) -> bool {
        self.has(i, DIGIT) || (self.at(i) == b'.' && self.has(i + 1, DIGIT))
    }

    /// Reads a number: `0x`/`0o`/`0b` and its digits, or digits (`_`
    /// between) with an optional fraction and exponent; letters right
    /// after are taken as part of it.
    fn number(&mut self) {
        let mut j = self.i;
        if self.at(j) == b'0' && matches!(self.at(j + 1).to_ascii_lowercase(), b'x' | b'o' | b'b') {
            self.i = self.run(j + 2, TAG);
            return;
        }
        j = self.run(j, NUM);
        if self.at(j) == b'.' && self.at(j + 1) != b'.' {
            j = self.run(j + 1, NUM);
        }
        if self.at(j).eq_ignore_ascii_case(&b'e') {
            let digits = if matches!(self.at(j + 1), b'+' | b'-') { j + 2 } else { j + 1 };
            if self.has(digits, DIGIT) {
                j = self.run(digits, NUM);
            }
        }
        self.i = self.run(j, TAG);
    }

    /// Reads a word, or a string with a prefix (`E'`, `B'`, `X'`, `N'`,
    /// `U&'`) or a `U&"` identifier; `true` and `false` are literals.
    fn word(&mut self, b: u8) -> Kind {
        let (next, after) = (self.at(self.i + 1), self.at(self.i + 2));
        match (b.to_ascii_lowercase(), next) {
            (b'e', b'\'') | (b'b' | b'x' | b'n', b'\'') => {
                self.i += 2;
                self.quoted(b'\'', b.eq_ignore_ascii_case(&b'e'));
                return Kind::Literal;
            }
            (b'u', b'&') if after == b'\'' || after == b'"' => {
                self.i += 3;
                self.quoted(after, false);
                return if after == b'\'' { Kind::Literal } else { Kind::Quoted };
            }
            _ => {}
        }
        let start = self.i;
        self.i = self.run(start + 1, CONT);
        let w = &self.s[start..self.i];
        if w.eq_ignore_ascii_case(b"true") || w.eq_ignore_ascii_case(b"false") {
            Kind::Literal
        } else {
            Kind::Word
        }
    }

    /// Reads the rest of a string or quoted identifier after its opening
    /// `quote` (doubled inside; after a backslash too, in an `E''` string).
    fn quoted(&mut self, quote: u8, backslash: bool) {
        let mut j = self.i;
        while let Some(&c) = self.s.get(j) {
            if (c == b'\\' && backslash) || (c == quote && self.at(j + 1) == quote) {
                j += 2;
            } else if c == quote {
                self.i = j + 1;
                return;
            } else {
                j += 1;
            }
        }
        self.i = self.s.len();
    }

    /// Reads an operator as Postgres does: a run of operator bytes that
    /// stops before a comment, and sheds a trailing `+`/`-` unless it has
    /// one of `~!@#^&|`?%`. A lone `-` before a number that does not follow
    /// an operand is the number's sign.
    fn operator(&mut self) -> Kind {
        let start = self.i;
        let mut end = start + 1;
        while self.has(end, OP) && !matches!((self.at(end), self.at(end + 1)), (b'-', b'-') | (b'/', b'*')) {
            end += 1;
        }
        let signed = |end: usize| end - start > 1 && matches!(self.s[end - 1], b'+' | b'-');
        if signed(end) && !self.s[start..end].iter().any(|&b| CLASS[usize::from(b)] & KEEPS_SIGN != 0) {
            while signed(end) {
                end -= 1;
            }
        }
        self.i = end;
        if end - start == 1 && self.s[start] == b'-' && self.starts_number(end) && !self.after_operand() {
            self.number();
            return Kind::Literal;
        }
        Kind::Op
    }

    /// Whether the token before ends an operand (a `-` after it subtracts).
    fn after_operand(&self) -> bool {
        let p = self.prev;
        match p.kind {
            Kind::Literal | Kind::Param | Kind::Quoted | Kind::Close => true,
            Kind::Punct => self.s[p.start] == b']',
            Kind::Word => !BEFORE_EXPRESSION.split(' ').any(|k| p.is(self.s, k)),
            Kind::Op | Kind::Open | Kind::Comma | Kind::Semi => false,
        }
    }

    /// Reads what follows a `$`: a parameter's digits, or a dollar quote's
    /// tag and body up to its closing tag.
    fn dollar(&mut self) -> Kind {
        let open = self.i - 1;
        if self.has(self.i, DIGIT) {
            self.i = self.run(self.i, DIGIT);
            return Kind::Param;
        }
        let close = if self.has(self.i, WORD) { self.run(self.i, TAG) } else { self.i };
        if self.at(close) != b'$' {
            return Kind::Punct;
        }
        let (tag, body) = (&self.s[open..=close], &self.s[close + 1..]);
        // Compared at each `$` only: a tag has no `$` inside, so no byte is
        // compared twice (`windows` would be quadratic in a long tag).
        let found = (0..body.len()).find(|&at| body[at] == b'$' && body[at..].starts_with(tag));
        self.i = found.map_or(self.s.len(), |at| close + 1 + at + tag.len());
        Kind::Literal
    }
}

#[cfg(test)]
mod tests;
