//! SCRAM verifiers derived from plaintext auth_file passwords, kept per
//! user. Deriving one is 4,096 PBKDF2-SHA-256 rounds on the event loop, and
//! it happens before the client has proved anything: without the cache
//! every SCRAM login of such a user, or a bare startup packet naming one,
//! cost that again (a large share of weir's CPU while 1,000 clients log
//! in), and a burst of logins stalled every other client.
//!
//! An entry holds the password it came from, so a reload that changes the
//! password derives afresh. One salt per user for the life of the process is
//! what Postgres does with its stored verifier (one salt per password).

use std::collections::HashMap;
use std::sync::OnceLock;

use parking_lot::Mutex;

use super::scram::ScramSecret;

/// More users than any auth_file holds: past it the cache starts over, so
/// it cannot grow without bound.
const MAX_ENTRIES: usize = 10_000;

type Entries = HashMap<String, (String, ScramSecret)>;

fn entries() -> &'static Mutex<Entries> {
    static ENTRIES: OnceLock<Mutex<Entries>> = OnceLock::new();
    ENTRIES.get_or_init(Default::default)
}

/// The verifier for `user`'s plaintext `password`: derived at the first
/// call, then the same one (same salt and keys) while the password stays.
pub(super) fn verifier(user: &str, password: &str) -> ScramSecret {
    if let Some((p, secret)) = entries().lock().get(user) {
        if p == password {
            return secret.clone();
        }
    }
    // Derived outside the lock: two logins racing derive twice, and the
    // later one's verifier stays; both are valid for the same password.
    let secret = ScramSecret::from_password(password);
    let mut map = entries().lock();
    if map.len() >= MAX_ENTRIES && !map.contains_key(user) {
        map.clear();
    }
    map.insert(user.to_owned(), (password.to_owned(), secret.clone()));
    secret
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_password_gets_the_same_verifier_and_a_new_password_a_new_one() {
        let first = verifier("derived_test_user", "pw");
        let again = verifier("derived_test_user", "pw");
        assert_eq!(first.salt, again.salt);
        assert_eq!(first.stored_key, again.stored_key);
        let changed = verifier("derived_test_user", "new pw");
        assert_ne!(changed.stored_key, first.stored_key, "a changed password is derived afresh");
        let back = verifier("derived_test_user", "pw");
        assert_ne!(back.salt, first.salt, "only the latest password is kept");
        let other = verifier("derived_test_other", "pw");
        assert_ne!(other.salt, first.salt, "each user has a salt of its own");
    }

    #[test]
    fn a_derived_verifier_checks_the_password_it_came_from() {
        let secret = verifier("derived_test_check", "s3cret");
        let fresh = ScramSecret::from_password_with("s3cret", secret.salt.clone(), secret.iterations);
        assert_eq!(fresh.stored_key, secret.stored_key);
        assert_eq!(fresh.server_key, secret.server_key);
    }
}
