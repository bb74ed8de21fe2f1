//! MD5 password authentication: the stored `md5...` form and checking a
//! client's salted response against a plaintext or md5 secret.

use ::md5::{Digest, Md5};
use subtle::ConstantTimeEq;

use super::userlist::Secret;

/// `"md5"` and 32 lowercase hex digits: the stored form of an md5 password
/// and the form of a client's response, built without allocating.
type Md5Text = [u8; 35];

const HEX: &[u8; 16] = b"0123456789abcdef";

fn md5_text(parts: &[&[u8]]) -> Md5Text {
    let mut h = Md5::new();
    for p in parts {
        h.update(p);
    }
    let mut out = [0u8; 35];
    out[..3].copy_from_slice(b"md5");
    for (pair, b) in out[3..].chunks_exact_mut(2).zip(h.finalize()) {
        pair[0] = HEX[usize::from(b >> 4)];
        pair[1] = HEX[usize::from(b & 0xf)];
    }
    out
}

fn to_string(text: Md5Text) -> String {
    text.iter().map(|&b| char::from(b)).collect()
}

fn stored_form(password: &str, user: &str) -> Md5Text {
    md5_text(&[password.as_bytes(), user.as_bytes()])
}

fn response_to(stored_md5: &[u8], salt: [u8; 4]) -> Md5Text {
    let inner = stored_md5.strip_prefix(b"md5").unwrap_or(stored_md5);
    md5_text(&[inner, &salt])
}

/// `"md5"` + hex(md5(password + user)): what Postgres stores for md5 users.
pub(crate) fn md5_hex_password(password: &str, user: &str) -> String {
    to_string(stored_form(password, user))
}

/// The response a client must send for a stored `md5...` password and salt
/// (also what weir sends a server for md5 pass-through).
pub(crate) fn expected_response(stored_md5: &str, salt: [u8; 4]) -> String {
    to_string(response_to(stored_md5.as_bytes(), salt))
}

/// Checks a client's PasswordMessage payload (without its NUL) against
/// `secret`. SCRAM verifiers cannot check md5 responses, and an empty
/// plaintext password never matches.
pub(crate) fn verify_md5_response(secret: &Secret, user: &str, salt: [u8; 4], client_response: &[u8]) -> bool {
    let expected = match secret {
        Secret::Plain(p) if !p.is_empty() => response_to(&stored_form(p, user), salt),
        Secret::Md5(m) => response_to(m.as_bytes(), salt),
        Secret::Plain(_) | Secret::Scram(_) => return false,
    };
    bool::from(expected[..].ct_eq(client_response))
}

#[cfg(test)]
mod tests {
    use super::*;
    use postgres_protocol::authentication::md5_hash;

    #[test]
    fn stored_form_matches_postgres() {
        assert_eq!(md5_hex_password("pw", "alice"), postgres_protocol::password::md5(b"pw", "alice"));
    }

    #[test]
    fn verifies_plain_and_md5_secrets() {
        let salt = [1, 2, 3, 4];
        let good = md5_hash(b"alice", b"pw", salt);
        let plain = Secret::Plain("pw".into());
        let hashed = Secret::Md5(md5_hex_password("pw", "alice"));
        assert!(verify_md5_response(&plain, "alice", salt, good.as_bytes()));
        assert!(verify_md5_response(&hashed, "alice", salt, good.as_bytes()));
        assert!(!verify_md5_response(&plain, "alice", [4, 3, 2, 1], good.as_bytes()));
        assert!(!verify_md5_response(&plain, "bob", salt, good.as_bytes()));
        assert!(!verify_md5_response(&hashed, "alice", salt, b"md5"));
        assert!(!verify_md5_response(&hashed, "alice", salt, b""));
    }

    #[test]
    fn scram_and_empty_secrets_never_match() {
        let salt = [9, 9, 9, 9];
        let scram = Secret::Scram(crate::auth::scram::ScramSecret::from_password("pw"));
        assert!(!verify_md5_response(&scram, "alice", salt, md5_hash(b"alice", b"pw", salt).as_bytes()));
        let empty = Secret::Plain(String::new());
        assert!(!verify_md5_response(&empty, "alice", salt, md5_hash(b"alice", b"", salt).as_bytes()));
    }
}
