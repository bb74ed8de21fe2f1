//! What weir proves itself to a server with: the client-side credentials
//! that `auth` derives from a user's auth_file entry and the client's proof
//! (`server_credentials`), and that `server::handshake` presents. `auth` owns
//! them; `server` only uses them.

use super::scram::ScramSecret;

/// How weir proves itself to a server.
#[derive(Clone, Default, PartialEq, Eq)]
pub enum Credentials {
    /// Trust only: any password request fails with `NoPassword`.
    #[default]
    None,
    /// A plaintext password (cleartext, md5 and SCRAM).
    Password(String),
    /// A stored `md5...` hash: md5 pass-through (md5 server auth only).
    Md5(String),
    /// SCRAM pass-through with a ClientKey a client proved (SCRAM only).
    ScramKeys(ScramKeys),
    /// Only a SCRAM verifier, which proves a password but cannot produce a
    /// proof: a server that asks for any password fails the login with
    /// PgBouncer's "wrong password type"; a server that trusts the user
    /// lets it in.
    VerifierOnly,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Credentials::None => "Credentials::None",
            Credentials::Password(_) => "Credentials::Password(..)",
            Credentials::Md5(_) => "Credentials::Md5(..)",
            Credentials::ScramKeys(_) => "Credentials::ScramKeys(..)",
            Credentials::VerifierOnly => "Credentials::VerifierOnly",
        })
    }
}

impl Credentials {
    /// What weir logs in with as a user no client proved anything for (a
    /// forced user, the auth_user): its auth_file password or md5 hash; an
    /// empty password when it has no entry (as PgBouncer: works where
    /// Postgres trusts the user). A SCRAM verifier cannot log in where
    /// Postgres asks for a password (see `stored_login_problems`).
    pub fn of_stored(secret: Option<&super::Secret>) -> Credentials {
        match secret {
            Some(super::Secret::Plain(p)) => Credentials::Password(p.clone()),
            Some(super::Secret::Md5(m)) => Credentials::Md5(m.clone()),
            Some(super::Secret::Scram(_)) => Credentials::VerifierOnly,
            None => Credentials::None,
        }
    }
}

impl From<Option<&str>> for Credentials {
    fn from(p: Option<&str>) -> Self {
        p.map_or(Credentials::None, |p| Credentials::Password(p.to_owned()))
    }
}

/// What SCRAM pass-through needs: the ClientKey a client proved, and the
/// verifier it proved it against.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramKeys {
    pub client_key: [u8; 32],
    pub stored_key: [u8; 32],
    pub server_key: [u8; 32],
    pub salt: Vec<u8>,
    pub iterations: u32,
}

impl std::fmt::Debug for ScramKeys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramKeys").field("iterations", &self.iterations).finish_non_exhaustive()
    }
}

impl ScramKeys {
    /// The keys for a ClientKey proved against `secret`.
    pub fn new(secret: &ScramSecret, client_key: [u8; 32]) -> ScramKeys {
        ScramKeys {
            client_key,
            stored_key: secret.stored_key,
            server_key: secret.server_key,
            salt: secret.salt.clone(),
            iterations: secret.iterations,
        }
    }
}

/// The users weir logs in to Postgres as with a stored secret (the
/// auth_users, forced users without a `password`) whose auth_file entry is a
/// SCRAM verifier only: one warning each. A verifier proves a password but
/// cannot produce the proof itself, so where Postgres asks for a password
/// those logins fail ("wrong password type", as in PgBouncer, which also
/// starts on such a file).
pub fn stored_login_problems(cfg: &crate::config::Config, users: &super::UserList) -> Vec<String> {
    let mut found: Vec<(String, &str)> = Vec::new();
    if !cfg.weir.auth_user.is_empty() {
        found.push(("weir.auth_user".into(), &cfg.weir.auth_user));
    }
    for (name, db) in &cfg.databases {
        if let Some(u) = &db.auth_user {
            found.push((format!("databases.{name}.auth_user"), u));
        }
        if let (Some(u), None) = (&db.user, &db.password) {
            found.push((format!("databases.{name}.user"), u));
        }
    }
    found
        .into_iter()
        .filter(|(_, user)| matches!(users.get(user), Some(super::Secret::Scram(_))))
        .map(|(key, user)| {
            format!(
                "{key}: \"{user}\" has only a SCRAM verifier in the auth_file, and no one can log in to Postgres \
                 with a verifier (no client proves a key for this user): where Postgres asks for a password, these \
                 logins fail with \"server login failed: wrong password type\" (as in PgBouncer); give it a \
                 plaintext or md5 password there, or remove its entry to log in without a password where Postgres \
                 trusts it"
            )
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_scram_only_login_user_is_named_and_a_missing_one_is_not() {
        let text = "[weir]\nauth_type = \"md5\"\nauth_file = \"u.txt\"\nauth_user = \"lookup\"\n\
                    [databases.app]\nuser = \"owner\"\n[databases.other]\nauth_user = \"absent\"\n";
        let cfg = crate::config::Config::from_toml(text, std::path::Path::new(".")).unwrap();
        let verifier = "SCRAM-SHA-256$4096:c2FsdA==$c3RvcmVka2V5c3RvcmVka2V5c3RvcmVka2V5c3RvcmU=:\
                        c2VydmVya2V5c2VydmVya2V5c2VydmVya2V5c2VydmU=";
        let users = super::super::UserList::parse(&format!(
            "\"lookup\" \"{verifier}\"\n\"owner\" \"md545f2603610af569b6155c45067268c6b\"\n"
        ))
        .expect("userlist");
        let problems = stored_login_problems(&cfg, &users);
        assert_eq!(problems.len(), 1, "{problems:?}");
        assert!(problems[0].starts_with("weir.auth_user: \"lookup\" has only a SCRAM verifier"), "{problems:?}");
        assert_eq!(Credentials::of_stored(users.get("absent")), Credentials::None, "no entry: no password");
        assert_eq!(Credentials::of_stored(users.get("lookup")), Credentials::VerifierOnly);
        assert_eq!(
            Credentials::of_stored(users.get("owner")),
            Credentials::Md5("md545f2603610af569b6155c45067268c6b".into())
        );
    }
}
