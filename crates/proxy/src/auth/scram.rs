//! Server-side SCRAM-SHA-256 (RFC 5802 / RFC 7677) as a pure state machine:
//! verifier parsing and derivation, mock verifiers for unknown users, and
//! the two message exchanges. No I/O; `auth::authenticate` drives it.
//!
//! Channel binding is not offered (no SCRAM-SHA-256-PLUS), so the gs2 header
//! must be `n,,` or `y,,`; a client asking for `p=` gets a clear error.

use std::sync::OnceLock;

use base64::{engine::general_purpose::STANDARD as B64, Engine};
use hmac::{Hmac, Mac};
use rand::RngCore;
use sha2::{Digest, Sha256};
use subtle::ConstantTimeEq;

/// The SASL mechanism name weir offers.
pub(crate) const MECHANISM: &str = "SCRAM-SHA-256";
/// Iterations used when weir derives a verifier from a plaintext password.
pub(crate) const DEFAULT_ITERATIONS: u32 = 4096;
/// Salt length used when weir derives a verifier from a plaintext password.
pub(crate) const DEFAULT_SALT_LEN: usize = 16;
/// Random bytes weir appends to the client nonce (base64-encoded).
const SERVER_NONCE_LEN: usize = 18;
/// Longest client nonce accepted (printable characters).
const MAX_NONCE_LEN: usize = 512;
/// Longest client-first or client-final message accepted.
const MAX_MESSAGE_LEN: usize = 4096;
/// Largest iteration count accepted in a stored verifier.
const MAX_ITERATIONS: u32 = 100_000_000;
/// Longest salt accepted in a stored verifier.
const MAX_SALT_LEN: usize = 1024;

type HmacSha256 = Hmac<Sha256>;

/// Why a SCRAM exchange failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ScramError {
    /// The client's proof does not match the verifier: a wrong password
    /// (or an unknown user, whose exchange runs against a mock verifier).
    #[error("invalid SCRAM proof")]
    InvalidProof,
    #[error("malformed SCRAM message: {0}")]
    Malformed(&'static str),
    #[error("channel binding is not supported: weir does not offer SCRAM-SHA-256-PLUS")]
    ChannelBindingUnsupported,
    #[error("SCRAM channel binding check failed")]
    ChannelBindingMismatch,
    #[error("SCRAM authorization identity is not supported")]
    AuthzidUnsupported,
    #[error("SCRAM nonce mismatch")]
    NonceMismatch,
    #[error("SCRAM message received out of order")]
    OutOfOrder,
}

/// A SCRAM-SHA-256 verifier: what a server stores instead of a password.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramSecret {
    pub iterations: u32,
    pub salt: Vec<u8>,
    pub stored_key: [u8; 32],
    pub server_key: [u8; 32],
}

impl std::fmt::Debug for ScramSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramSecret").field("iterations", &self.iterations).finish_non_exhaustive()
    }
}

impl ScramSecret {
    /// Parses `SCRAM-SHA-256$<iter>:<salt b64>$<StoredKey b64>:<ServerKey b64>`.
    pub fn parse(s: &str) -> Result<ScramSecret, &'static str> {
        let rest = s.strip_prefix("SCRAM-SHA-256$").ok_or("missing SCRAM-SHA-256$ prefix")?;
        let (params, keys) = rest.split_once('$').ok_or("missing '$' before the keys")?;
        let (iter, salt) = params.split_once(':').ok_or("missing ':' between iterations and salt")?;
        let (stored, server) = keys.split_once(':').ok_or("missing ':' between the keys")?;
        let iterations: u32 = iter.parse().map_err(|_| "iteration count is not a number")?;
        if iterations == 0 || iterations > MAX_ITERATIONS {
            return Err("iteration count is out of range");
        }
        let salt = B64.decode(salt).map_err(|_| "salt is not valid base64")?;
        if salt.is_empty() || salt.len() > MAX_SALT_LEN {
            return Err("salt length is out of range");
        }
        let stored_key = decode_key(stored).ok_or("StoredKey is not 32 bytes of base64")?;
        let server_key = decode_key(server).ok_or("ServerKey is not 32 bytes of base64")?;
        Ok(ScramSecret { iterations, salt, stored_key, server_key })
    }

    /// Derives a verifier from a plaintext password with a random salt.
    pub fn from_password(password: &str) -> ScramSecret {
        let mut salt = vec![0u8; DEFAULT_SALT_LEN];
        rand::thread_rng().fill_bytes(&mut salt);
        Self::from_password_with(password, salt, DEFAULT_ITERATIONS)
    }

    /// Derives a verifier from a plaintext password, salt and iteration count.
    ///
    /// The password is used as given (no SASLprep), which matches clients for
    /// any password of printable ASCII.
    pub fn from_password_with(password: &str, salt: Vec<u8>, iterations: u32) -> ScramSecret {
        let salted = hi(password.as_bytes(), &salt, iterations.max(1));
        let client_key = hmac(&salted, b"Client Key");
        let stored_key: [u8; 32] = Sha256::digest(client_key).into();
        let server_key = hmac(&salted, b"Server Key");
        ScramSecret { iterations: iterations.max(1), salt, stored_key, server_key }
    }

    /// A verifier for a user that does not exist: deterministic per user for
    /// this `process_secret`, so repeated attempts look alike, and matching
    /// no password (its StoredKey is not the hash of any known ClientKey).
    pub fn mock(user: &str, process_secret: &[u8]) -> ScramSecret {
        let derive = |label: &[u8]| {
            let mut mac = new_mac(process_secret);
            mac.update(label);
            mac.update(user.as_bytes());
            <[u8; 32]>::from(mac.finalize().into_bytes())
        };
        ScramSecret {
            iterations: DEFAULT_ITERATIONS,
            salt: derive(b"salt")[..DEFAULT_SALT_LEN].to_vec(),
            stored_key: derive(b"stored"),
            server_key: derive(b"server"),
        }
    }

    /// `mock` with this process's random key.
    pub fn mock_for(user: &str) -> ScramSecret {
        Self::mock(user, process_secret())
    }

    /// The verifier in Postgres's `SCRAM-SHA-256$...` text form.
    pub fn to_verifier_string(&self) -> String {
        format!(
            "SCRAM-SHA-256${}:{}${}:{}",
            self.iterations,
            B64.encode(&self.salt),
            B64.encode(self.stored_key),
            B64.encode(self.server_key)
        )
    }
}

/// A random key drawn once per process, used for mock verifiers.
pub(crate) fn process_secret() -> &'static [u8; 32] {
    static KEY: OnceLock<[u8; 32]> = OnceLock::new();
    KEY.get_or_init(|| {
        let mut k = [0u8; 32];
        rand::thread_rng().fill_bytes(&mut k);
        k
    })
}

fn decode_key(s: &str) -> Option<[u8; 32]> {
    B64.decode(s).ok()?.try_into().ok()
}

fn new_mac(key: &[u8]) -> HmacSha256 {
    <HmacSha256 as Mac>::new_from_slice(key).expect("HMAC accepts keys of any length")
}

/// HMAC-SHA-256 of `data` under `key`.
pub(crate) fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    let mut mac = new_mac(key);
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// PBKDF2-HMAC-SHA-256 with a single output block (RFC 5802 `Hi`).
fn hi(password: &[u8], salt: &[u8], iterations: u32) -> [u8; 32] {
    let keyed = new_mac(password);
    let mut mac = keyed.clone();
    mac.update(salt);
    mac.update(&1u32.to_be_bytes());
    let mut u: [u8; 32] = mac.finalize().into_bytes().into();
    let mut out = u;
    for _ in 1..iterations {
        let mut mac = keyed.clone();
        mac.update(&u);
        u = mac.finalize().into_bytes().into();
        out.iter_mut().zip(u.iter()).for_each(|(o, x)| *o ^= x);
    }
    out
}

/// The result of a successful exchange.
#[derive(Clone, PartialEq, Eq)]
pub struct ScramSuccess {
    /// The server-final-message (`v=<ServerSignature>`), for AuthenticationSASLFinal.
    pub server_final: String,
    /// The ClientKey recovered from the proof, usable to log in to servers
    /// on the client's behalf with the same verifier.
    pub client_key: [u8; 32],
}

impl std::fmt::Debug for ScramSuccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScramSuccess").field("server_final", &self.server_final).finish_non_exhaustive()
    }
}

/// What the first exchange remembers for the second.
struct FirstExchange {
    gs2_header: &'static str,
    client_first_bare: String,
    server_first: String,
    nonce: String,
}

enum State {
    Initial,
    SentServerFirst(FirstExchange),
    Done,
}

/// One server side of one SCRAM-SHA-256 exchange.
pub struct ScramServer {
    secret: ScramSecret,
    state: State,
}

impl ScramServer {
    pub fn new(secret: ScramSecret) -> ScramServer {
        ScramServer { secret, state: State::Initial }
    }

    /// Handles the client-first-message; returns the server-first-message.
    pub fn handle_client_first(&mut self, msg: &[u8]) -> Result<String, ScramError> {
        if !matches!(self.state, State::Initial) {
            return Err(ScramError::OutOfOrder);
        }
        self.state = State::Done;
        let parsed = parse_client_first(msg)?;
        let mut server_nonce = [0u8; SERVER_NONCE_LEN];
        rand::thread_rng().fill_bytes(&mut server_nonce);
        let nonce = format!("{}{}", parsed.client_nonce, B64.encode(server_nonce));
        let server_first = format!("r={},s={},i={}", nonce, B64.encode(&self.secret.salt), self.secret.iterations);
        self.state = State::SentServerFirst(FirstExchange {
            gs2_header: parsed.gs2_header,
            client_first_bare: parsed.bare.to_owned(),
            server_first: server_first.clone(),
            nonce,
        });
        Ok(server_first)
    }

    /// Handles the client-final-message; on a valid proof returns the
    /// server-final-message and the recovered ClientKey.
    pub fn handle_client_final(&mut self, msg: &[u8]) -> Result<ScramSuccess, ScramError> {
        let State::SentServerFirst(first) = std::mem::replace(&mut self.state, State::Done) else {
            return Err(ScramError::OutOfOrder);
        };
        let parsed = parse_client_final(msg)?;
        if B64.decode(parsed.channel_binding).ok().as_deref() != Some(first.gs2_header.as_bytes()) {
            return Err(ScramError::ChannelBindingMismatch);
        }
        if parsed.nonce != first.nonce {
            return Err(ScramError::NonceMismatch);
        }
        let auth_message = format!("{},{},{}", first.client_first_bare, first.server_first, parsed.without_proof);
        let client_key = self.verify_proof(auth_message.as_bytes(), &parsed.proof)?;
        let server_signature = hmac(&self.secret.server_key, auth_message.as_bytes());
        Ok(ScramSuccess { server_final: format!("v={}", B64.encode(server_signature)), client_key })
    }

    fn verify_proof(&self, auth_message: &[u8], proof: &[u8; 32]) -> Result<[u8; 32], ScramError> {
        let client_signature = hmac(&self.secret.stored_key, auth_message);
        let mut client_key = [0u8; 32];
        for (k, (p, s)) in client_key.iter_mut().zip(proof.iter().zip(client_signature.iter())) {
            *k = p ^ s;
        }
        let stored: [u8; 32] = Sha256::digest(client_key).into();
        if bool::from(stored.ct_eq(&self.secret.stored_key)) {
            Ok(client_key)
        } else {
            Err(ScramError::InvalidProof)
        }
    }
}

struct ClientFirst<'a> {
    gs2_header: &'static str,
    bare: &'a str,
    client_nonce: &'a str,
}

fn as_text(msg: &[u8]) -> Result<&str, ScramError> {
    if msg.len() > MAX_MESSAGE_LEN {
        return Err(ScramError::Malformed("message is too long"));
    }
    std::str::from_utf8(msg).map_err(|_| ScramError::Malformed("message is not valid UTF-8"))
}

/// Splits `gs2-header` off a client-first-message.
fn split_gs2_header(msg: &str) -> Result<(&'static str, &str), ScramError> {
    let (flag, rest) = msg.split_once(',').ok_or(ScramError::Malformed("missing gs2 header"))?;
    let header = match flag {
        "n" => "n,,",
        "y" => "y,,",
        f if f.starts_with("p=") => return Err(ScramError::ChannelBindingUnsupported),
        _ => return Err(ScramError::Malformed("invalid channel binding flag")),
    };
    let (authzid, bare) = rest.split_once(',').ok_or(ScramError::Malformed("missing gs2 header"))?;
    match authzid {
        "" => Ok((header, bare)),
        a if a.starts_with("a=") => Err(ScramError::AuthzidUnsupported),
        _ => Err(ScramError::Malformed("invalid authorization identity")),
    }
}

fn parse_client_first(msg: &[u8]) -> Result<ClientFirst<'_>, ScramError> {
    let (gs2_header, bare) = split_gs2_header(as_text(msg)?)?;
    let mut attrs = bare.split(',');
    match attrs.next() {
        Some(a) if a.starts_with("m=") => return Err(ScramError::Malformed("unsupported mandatory extension")),
        Some(a) if a.starts_with("n=") => {}
        _ => return Err(ScramError::Malformed("missing username attribute")),
    }
    let client_nonce =
        attrs.next().and_then(|a| a.strip_prefix("r=")).ok_or(ScramError::Malformed("missing nonce attribute"))?;
    check_nonce(client_nonce)?;
    attrs.try_for_each(check_extension)?;
    Ok(ClientFirst { gs2_header, bare, client_nonce })
}

fn check_nonce(nonce: &str) -> Result<(), ScramError> {
    if nonce.is_empty() || nonce.len() > MAX_NONCE_LEN {
        return Err(ScramError::Malformed("nonce length is out of range"));
    }
    if !nonce.bytes().all(|b| (0x21..=0x7e).contains(&b) && b != b',') {
        return Err(ScramError::Malformed("nonce contains invalid characters"));
    }
    Ok(())
}

/// An optional extension attribute: a letter, `=`, and a value.
fn check_extension(attr: &str) -> Result<(), ScramError> {
    let b = attr.as_bytes();
    if b.len() >= 2 && b[0].is_ascii_alphabetic() && b[1] == b'=' {
        Ok(())
    } else {
        Err(ScramError::Malformed("invalid attribute"))
    }
}

struct ClientFinal<'a> {
    channel_binding: &'a str,
    nonce: &'a str,
    without_proof: &'a str,
    proof: [u8; 32],
}

fn parse_client_final(msg: &[u8]) -> Result<ClientFinal<'_>, ScramError> {
    let text = as_text(msg)?;
    let (without_proof, proof) = text.rsplit_once(",p=").ok_or(ScramError::Malformed("missing proof attribute"))?;
    let proof = B64.decode(proof).map_err(|_| ScramError::Malformed("proof is not valid base64"))?;
    let proof: [u8; 32] = proof.try_into().map_err(|_| ScramError::Malformed("proof is not 32 bytes"))?;
    let mut attrs = without_proof.split(',');
    let channel_binding = attrs
        .next()
        .and_then(|a| a.strip_prefix("c="))
        .ok_or(ScramError::Malformed("missing channel binding attribute"))?;
    let nonce =
        attrs.next().and_then(|a| a.strip_prefix("r=")).ok_or(ScramError::Malformed("missing nonce attribute"))?;
    attrs.try_for_each(check_extension)?;
    Ok(ClientFinal { channel_binding, nonce, without_proof, proof })
}

#[cfg(test)]
mod tests {
    use super::*;
    use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};

    /// Runs a full exchange with postgres-protocol's client; returns the
    /// server's verdict and whether the client accepted the server-final.
    fn round_trip(secret: ScramSecret, password: &str) -> Result<[u8; 32], ScramError> {
        let mut client = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
        let mut server = ScramServer::new(secret);
        let server_first = server.handle_client_first(client.message())?;
        client.update(server_first.as_bytes()).expect("client accepts server-first");
        let ok = server.handle_client_final(client.message())?;
        client.finish(ok.server_final.as_bytes()).expect("client verifies server signature");
        Ok(ok.client_key)
    }

    #[test]
    fn round_trip_with_derived_verifier() {
        let key = round_trip(ScramSecret::from_password("s3cret"), "s3cret").unwrap();
        assert_ne!(key, [0u8; 32]);
        assert_eq!(round_trip(ScramSecret::from_password("s3cret"), "wrong"), Err(ScramError::InvalidProof));
    }

    #[test]
    fn round_trip_with_postgres_verifier() {
        let text = postgres_protocol::password::scram_sha_256(b"pw");
        let secret = ScramSecret::parse(&text).unwrap();
        assert_eq!(secret.to_verifier_string(), text);
        let key = round_trip(secret.clone(), "pw").unwrap();
        assert_eq!(<[u8; 32]>::from(Sha256::digest(key)), secret.stored_key);
        assert_eq!(round_trip(secret, "pW"), Err(ScramError::InvalidProof));
    }

    #[test]
    fn derived_verifier_matches_postgres_for_same_salt() {
        let text = postgres_protocol::password::scram_sha_256(b"hunter2");
        let pg = ScramSecret::parse(&text).unwrap();
        let ours = ScramSecret::from_password_with("hunter2", pg.salt.clone(), pg.iterations);
        assert_eq!(ours, pg);
    }

    #[test]
    fn mock_is_deterministic_and_fails_like_a_wrong_password() {
        let a = ScramSecret::mock("alice", b"k1");
        assert_eq!(a, ScramSecret::mock("alice", b"k1"));
        assert_ne!(a, ScramSecret::mock("bob", b"k1"));
        assert_ne!(a, ScramSecret::mock("alice", b"k2"));
        assert_eq!(round_trip(ScramSecret::mock_for("alice"), ""), Err(ScramError::InvalidProof));
    }

    #[test]
    fn rejects_bad_verifier_strings() {
        for bad in [
            "SCRAM-SHA-256$",
            "SCRAM-SHA-256$0:c2FsdA==$AAAA:AAAA",
            "SCRAM-SHA-256$4096:c2FsdA==$AAAA:AAAA",
            "SCRAM-SHA-256$4096:!!$AAAA:AAAA",
            "SCRAM-SHA-256$99999999999:c2FsdA==$AAAA:AAAA",
            "md5abc",
        ] {
            assert!(ScramSecret::parse(bad).is_err(), "{bad}");
        }
    }

    fn server() -> ScramServer {
        ScramServer::new(ScramSecret::from_password_with("pw", b"salt".to_vec(), 1))
    }

    #[test]
    fn malformed_client_first_is_an_error() {
        let long_nonce = format!("n,,n=,r={}", "x".repeat(MAX_NONCE_LEN + 1));
        let cases: [(&[u8], ScramError); 11] = [
            (b"", ScramError::Malformed("missing gs2 header")),
            (b"n", ScramError::Malformed("missing gs2 header")),
            (b"x,,n=,r=abc", ScramError::Malformed("invalid channel binding flag")),
            (b"p=tls-server-end-point,,n=,r=abc", ScramError::ChannelBindingUnsupported),
            (b"n,a=bob,n=,r=abc", ScramError::AuthzidUnsupported),
            (b"n,,m=ext,n=,r=abc", ScramError::Malformed("unsupported mandatory extension")),
            (b"n,,n=", ScramError::Malformed("missing nonce attribute")),
            (b"n,,n=,r=", ScramError::Malformed("nonce length is out of range")),
            (b"n,,n=,r=a b", ScramError::Malformed("nonce contains invalid characters")),
            (b"n,,n=,r=abc,,", ScramError::Malformed("invalid attribute")),
            (b"n,,n=,r=\xff", ScramError::Malformed("message is not valid UTF-8")),
        ];
        for (msg, want) in cases {
            assert_eq!(server().handle_client_first(msg), Err(want), "{:?}", String::from_utf8_lossy(msg));
        }
        assert!(server().handle_client_first(long_nonce.as_bytes()).is_err());
        assert!(server().handle_client_first(&vec![b'a'; MAX_MESSAGE_LEN + 1]).is_err());
    }

    fn after_first(gs2: &str) -> (ScramServer, String) {
        let mut s = server();
        let first = s.handle_client_first(format!("{gs2}n=,r=abc").as_bytes()).unwrap();
        let nonce = first.split(',').next().unwrap()[2..].to_owned();
        (s, nonce)
    }

    #[test]
    fn malformed_client_final_is_an_error() {
        let proof = B64.encode([0u8; 32]);
        let cases = [
            ("c=biws,r=NONCE".to_owned(), ScramError::Malformed("missing proof attribute")),
            ("c=biws,r=NONCE,p=!!".to_owned(), ScramError::Malformed("proof is not valid base64")),
            ("c=biws,r=NONCE,p=AAAA".to_owned(), ScramError::Malformed("proof is not 32 bytes")),
            (format!("r=NONCE,p={proof}"), ScramError::Malformed("missing channel binding attribute")),
            (format!("c=biws,p={proof}"), ScramError::Malformed("missing nonce attribute")),
            (format!("c=eSws,r=NONCE,p={proof}"), ScramError::ChannelBindingMismatch),
            (format!("c=!!,r=NONCE,p={proof}"), ScramError::ChannelBindingMismatch),
            (format!("c=biws,r=NONCEx,p={proof}"), ScramError::NonceMismatch),
            (format!("c=biws,r=NONCE,p={proof}"), ScramError::InvalidProof),
        ];
        for (msg, want) in cases {
            let (mut s, nonce) = after_first("n,,");
            let msg = msg.replace("NONCE", &nonce);
            assert_eq!(s.handle_client_final(msg.as_bytes()), Err(want), "{msg}");
        }
    }

    #[test]
    fn y_flag_needs_matching_binding_and_order_is_enforced() {
        let proof = B64.encode([0u8; 32]);
        let (mut s, nonce) = after_first("y,,");
        let msg = format!("c=eSws,r={nonce},p={proof}");
        assert_eq!(s.handle_client_final(msg.as_bytes()), Err(ScramError::InvalidProof));
        assert_eq!(s.handle_client_final(msg.as_bytes()), Err(ScramError::OutOfOrder));
        assert_eq!(s.handle_client_first(b"n,,n=,r=abc"), Err(ScramError::OutOfOrder));
        assert_eq!(server().handle_client_final(msg.as_bytes()), Err(ScramError::OutOfOrder));
    }
}
