//! What weir proves itself to a server with: the client-side credentials
//! that `auth` derives from a user's auth_file entry and the client's proof
//! (`server_credentials`), and that `server::login` presents. `auth` owns
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
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Credentials::None => "Credentials::None",
            Credentials::Password(_) => "Credentials::Password(..)",
            Credentials::Md5(_) => "Credentials::Md5(..)",
            Credentials::ScramKeys(_) => "Credentials::ScramKeys(..)",
        })
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
