//! The auth_file: PgBouncer's userlist format, parsed into per-user secrets.
//!
//! Each line is `"username" "password"`; inside quotes `""` is a literal
//! quote. Blank lines and lines starting with `;` or `#` are ignored, and so
//! are fields after the second. A password is plaintext, `md5` followed by
//! 32 hex digits, or a `SCRAM-SHA-256$...` verifier.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use super::scram::ScramSecret;

/// Why an auth_file could not be loaded.
#[derive(Debug, thiserror::Error)]
pub enum UserListError {
    #[error("auth_file line {line}: {reason}")]
    Syntax { line: usize, reason: &'static str },
    #[error("cannot read auth_file {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// What the auth_file stores for one user.
#[derive(Clone, PartialEq, Eq)]
pub enum Secret {
    Plain(String),
    /// `"md5"` followed by 32 lowercase hex digits of md5(password + username).
    Md5(String),
    Scram(ScramSecret),
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Secret::Plain(_) => "Secret::Plain(..)",
            Secret::Md5(_) => "Secret::Md5(..)",
            Secret::Scram(_) => "Secret::Scram(..)",
        })
    }
}

impl Secret {
    /// Classifies a password field from the auth_file.
    pub fn parse(password: &str) -> Result<Secret, &'static str> {
        if password.starts_with("SCRAM-SHA-256$") {
            return ScramSecret::parse(password).map(Secret::Scram);
        }
        match password.strip_prefix("md5") {
            Some(hex) if hex.len() == 32 && hex.bytes().all(|b| b.is_ascii_hexdigit()) => {
                Ok(Secret::Md5(format!("md5{}", hex.to_ascii_lowercase())))
            }
            _ => Ok(Secret::Plain(password.to_owned())),
        }
    }

    /// The cleartext password, when the auth_file holds one.
    pub fn plain_password(&self) -> Option<&str> {
        match self {
            Secret::Plain(p) => Some(p),
            _ => None,
        }
    }
}

/// All users of an auth_file. A user listed twice keeps the last entry.
#[derive(Debug, Clone, Default)]
pub struct UserList {
    users: HashMap<String, Secret>,
}

impl UserList {
    pub fn parse(text: &str) -> Result<UserList, UserListError> {
        let mut users = HashMap::new();
        for (i, line) in text.lines().enumerate() {
            let syntax = |reason| UserListError::Syntax { line: i + 1, reason };
            if let Some((user, password)) = parse_line(line).map_err(syntax)? {
                let secret = Secret::parse(&password).map_err(syntax)?;
                users.insert(user, secret);
            }
        }
        Ok(UserList { users })
    }

    pub fn load(path: &Path) -> Result<UserList, UserListError> {
        let text =
            std::fs::read_to_string(path).map_err(|source| UserListError::Io { path: path.to_owned(), source })?;
        Self::parse(&text)
    }

    pub fn get(&self, user: &str) -> Option<&Secret> {
        self.users.get(user)
    }

    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// The user names (SHOW USERS).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.users.keys().map(String::as_str)
    }

    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }
}

/// One line: `None` for blank and comment lines.
fn parse_line(line: &str) -> Result<Option<(String, String)>, &'static str> {
    let rest = line.trim_start();
    if rest.is_empty() || rest.starts_with(';') || rest.starts_with('#') {
        return Ok(None);
    }
    let (user, rest) = quoted(rest)?;
    if user.is_empty() {
        return Err("empty username");
    }
    let (password, _ignored) = quoted(rest.trim_start())?;
    Ok(Some((user, password)))
}

/// A double-quoted field at the front of `s`, and what follows it.
fn quoted(s: &str) -> Result<(String, &str), &'static str> {
    let mut rest = s.strip_prefix('"').ok_or("expected a double-quoted field")?;
    let mut out = String::new();
    loop {
        let end = rest.find('"').ok_or("unterminated quoted field")?;
        out.push_str(&rest[..end]);
        rest = &rest[end + 1..];
        match rest.strip_prefix('"') {
            Some(after) => {
                out.push('"');
                rest = after;
            }
            None => return Ok((out, rest)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_all_three_secret_kinds_and_comments() {
        let scram = postgres_protocol::password::scram_sha_256(b"pw");
        let text = format!(
            "; comment\n# another\n\n  \"alice\" \"plain pw\"\n\"bob\" \"md5{}\" extra \"fields\"\n\"carol\" \"{scram}\"\n",
            "0123456789ABCDEF0123456789abcdef"
        );
        let list = UserList::parse(&text).unwrap();
        assert_eq!(list.len(), 3);
        assert_eq!(list.get("alice"), Some(&Secret::Plain("plain pw".into())));
        assert_eq!(list.get("alice").unwrap().plain_password(), Some("plain pw"));
        assert_eq!(list.get("bob"), Some(&Secret::Md5("md50123456789abcdef0123456789abcdef".into())));
        assert_eq!(list.get("bob").unwrap().plain_password(), None);
        match list.get("carol") {
            Some(Secret::Scram(s)) => assert_eq!(s.to_verifier_string(), scram),
            other => panic!("{other:?}"),
        }
        assert_eq!(list.get("dave"), None);
    }

    #[test]
    fn doubled_quotes_are_literal_quotes() {
        let list = UserList::parse(r#""we""ird" "p""w""""#).unwrap();
        assert_eq!(list.get(r#"we"ird"#), Some(&Secret::Plain(r#"p"w""#.into())));
        let list = UserList::parse(r#""u" """#).unwrap();
        assert_eq!(list.get("u"), Some(&Secret::Plain(String::new())));
    }

    #[test]
    fn md5_lookalikes_are_plaintext() {
        assert_eq!(Secret::parse("md5secret"), Ok(Secret::Plain("md5secret".into())));
        let not_hex = format!("md5{}", "g".repeat(32));
        assert_eq!(Secret::parse(&not_hex), Ok(Secret::Plain(not_hex.clone())));
    }

    #[test]
    fn errors_carry_line_numbers() {
        for (text, line) in [
            ("\"a\" \"b\"\nbare words\n", 2),
            ("\n\n\"a\" \"unterminated\n", 3),
            ("\"a\"\n", 1),
            ("\"\" \"pw\"\n", 1),
            ("\"a\" \"SCRAM-SHA-256$bad\"\n", 1),
        ] {
            match UserList::parse(text) {
                Err(UserListError::Syntax { line: l, .. }) => assert_eq!(l, line, "{text:?}"),
                other => panic!("{text:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn load_reports_missing_file() {
        let err = UserList::load(Path::new("/nonexistent/weir/userlist.txt")).unwrap_err();
        assert!(matches!(err, UserListError::Io { .. }));
        assert!(err.to_string().contains("/nonexistent/weir/userlist.txt"));
    }
}
