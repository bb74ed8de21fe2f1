//! SCRAM-SHA-256 as a client without a password (SCRAM pass-through): a
//! client that authenticated against a user's verifier gave weir its
//! ClientKey; with it and the verifier's StoredKey/ServerKey weir logs in to
//! Postgres as that user, as PgBouncer does, so no plaintext password is
//! stored anywhere. Pure state machine, no I/O; `login` drives it.
//!
//! ClientProof = ClientKey XOR HMAC(StoredKey, AuthMessage), and the server
//! proves itself with HMAC(ServerKey, AuthMessage). The salt and iteration
//! count the server sends must be the verifier's: if they differ, the
//! verifier weir holds is stale (the password changed in Postgres), or
//! Postgres is running a mock exchange (the role's password expired or is
//! unset).

use base64::{engine::general_purpose::STANDARD as B64, Engine};
use rand::RngCore;
use subtle::ConstantTimeEq;

use crate::auth::scram::hmac;
use crate::auth::ScramKeys;

/// Random bytes in weir's client nonce (base64-encoded).
const NONCE_LEN: usize = 18;
/// The gs2 header weir sends: no channel binding, no authzid.
const GS2_HEADER: &str = "n,,";
/// `c=` of the client-final: base64 of the gs2 header.
const CHANNEL_BINDING: &str = "biws";

/// Why a pass-through exchange failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum ScramClientError {
    #[error("malformed SCRAM server message: {0}")]
    Malformed(&'static str),
    #[error("the server's SCRAM nonce does not extend weir's")]
    NonceMismatch,
    #[error("the server's SCRAM salt or iteration count differs from the verifier weir holds (password changed, expired or unset)")]
    StaleVerifier,
    #[error("the server's SCRAM signature is invalid")]
    BadServerSignature,
    #[error("the server refused SCRAM: {0}")]
    ServerError(String),
    #[error("SCRAM message received out of order")]
    OutOfOrder,
}

/// One client side of one pass-through exchange.
pub(crate) struct PassthroughClient {
    keys: ScramKeys,
    client_first_bare: String,
    /// The AuthMessage, once the server-first has been handled.
    auth_message: Option<String>,
}

impl PassthroughClient {
    pub(crate) fn new(keys: ScramKeys) -> PassthroughClient {
        let mut nonce = [0u8; NONCE_LEN];
        rand::thread_rng().fill_bytes(&mut nonce);
        Self::with_nonce(keys, &B64.encode(nonce))
    }

    fn with_nonce(keys: ScramKeys, nonce: &str) -> PassthroughClient {
        PassthroughClient { keys, client_first_bare: format!("n=,r={nonce}"), auth_message: None }
    }

    /// The client-first-message.
    pub(crate) fn client_first(&self) -> String {
        format!("{GS2_HEADER}{}", self.client_first_bare)
    }

    /// Handles the server-first-message; returns the client-final-message.
    pub(crate) fn handle_server_first(&mut self, msg: &[u8]) -> Result<String, ScramClientError> {
        if self.auth_message.is_some() {
            return Err(ScramClientError::OutOfOrder);
        }
        let text = std::str::from_utf8(msg).map_err(|_| ScramClientError::Malformed("not UTF-8"))?;
        let (nonce, salt, iterations) = parse_server_first(text)?;
        let ours = &self.client_first_bare["n=,r=".len()..];
        if nonce.len() <= ours.len() || !nonce.starts_with(ours) {
            return Err(ScramClientError::NonceMismatch);
        }
        if salt != self.keys.salt || iterations != self.keys.iterations {
            return Err(ScramClientError::StaleVerifier);
        }
        let without_proof = format!("c={CHANNEL_BINDING},r={nonce}");
        let auth_message = format!("{},{text},{without_proof}", self.client_first_bare);
        let signature = hmac(&self.keys.stored_key, auth_message.as_bytes());
        let mut proof = self.keys.client_key;
        proof.iter_mut().zip(signature.iter()).for_each(|(p, s)| *p ^= s);
        self.auth_message = Some(auth_message);
        Ok(format!("{without_proof},p={}", B64.encode(proof)))
    }

    /// Checks the server-final-message (`v=<ServerSignature>`).
    pub(crate) fn verify_server_final(&self, msg: &[u8]) -> Result<(), ScramClientError> {
        let auth_message = self.auth_message.as_ref().ok_or(ScramClientError::OutOfOrder)?;
        let text = std::str::from_utf8(msg).map_err(|_| ScramClientError::Malformed("not UTF-8"))?;
        if let Some(e) = text.strip_prefix("e=") {
            return Err(ScramClientError::ServerError(e.chars().take(200).collect()));
        }
        let v = text
            .split(',')
            .next()
            .and_then(|a| a.strip_prefix("v="))
            .ok_or(ScramClientError::Malformed("missing verifier"))?;
        let got = B64.decode(v).map_err(|_| ScramClientError::Malformed("verifier is not base64"))?;
        let want = hmac(&self.keys.server_key, auth_message.as_bytes());
        if bool::from(want.as_slice().ct_eq(&got)) {
            Ok(())
        } else {
            Err(ScramClientError::BadServerSignature)
        }
    }
}

/// `r=<nonce>,s=<salt>,i=<iterations>[,ext...]`.
fn parse_server_first(text: &str) -> Result<(&str, Vec<u8>, u32), ScramClientError> {
    let bad = ScramClientError::Malformed;
    let mut attrs = text.split(',');
    let nonce = attrs.next().and_then(|a| a.strip_prefix("r=")).ok_or(bad("missing nonce"))?;
    let salt = attrs.next().and_then(|a| a.strip_prefix("s=")).ok_or(bad("missing salt"))?;
    let iterations = attrs.next().and_then(|a| a.strip_prefix("i=")).ok_or(bad("missing iteration count"))?;
    let salt = B64.decode(salt).map_err(|_| bad("salt is not base64"))?;
    let iterations = iterations.parse().map_err(|_| bad("iteration count is not a number"))?;
    Ok((nonce, salt, iterations))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::auth::{ScramSecret, ScramServer};

    /// Whether `client_key` hashes to `stored_key` (a ClientKey that matches its verifier).
    fn matches(keys: &ScramKeys) -> bool {
        use sha2::{Digest, Sha256};
        <[u8; 32]>::from(Sha256::digest(keys.client_key)) == keys.stored_key
    }

    /// A client authenticates against weir's server; returns its keys.
    fn learned_keys(secret: &ScramSecret, password: &str) -> ScramKeys {
        use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
        let mut client = ScramSha256::new(password.as_bytes(), ChannelBinding::unsupported());
        let mut server = ScramServer::new(secret.clone());
        let first = server.handle_client_first(client.message()).unwrap();
        client.update(first.as_bytes()).unwrap();
        let ok = server.handle_client_final(client.message()).unwrap();
        ScramKeys::new(secret, ok.client_key)
    }

    fn exchange(keys: ScramKeys, server_secret: ScramSecret) -> Result<(), ScramClientError> {
        let mut client = PassthroughClient::new(keys);
        let mut server = ScramServer::new(server_secret);
        let first = server.handle_client_first(client.client_first().as_bytes()).expect("client-first");
        let fin = client.handle_server_first(first.as_bytes())?;
        let ok =
            server.handle_client_final(fin.as_bytes()).map_err(|_| ScramClientError::ServerError("proof".into()))?;
        client.verify_server_final(ok.server_final.as_bytes())
    }

    #[test]
    fn passes_through_with_a_learned_client_key() {
        let secret = ScramSecret::from_password("s3cret");
        let keys = learned_keys(&secret, "s3cret");
        assert!(matches(&keys));
        assert_eq!(exchange(keys, secret), Ok(()));
    }

    #[test]
    fn a_different_verifier_is_stale_or_refused() {
        let secret = ScramSecret::from_password("s3cret");
        let keys = learned_keys(&secret, "s3cret");
        // Password changed: new salt.
        assert_eq!(exchange(keys.clone(), ScramSecret::from_password("new")), Err(ScramClientError::StaleVerifier));
        // Same salt and iterations, other password: the server refuses the proof.
        let other = ScramSecret::from_password_with("new", secret.salt.clone(), secret.iterations);
        assert!(matches!(exchange(keys, other), Err(ScramClientError::ServerError(_))));
    }

    #[test]
    fn forged_server_final_and_bad_messages_are_refused() {
        let secret = ScramSecret::from_password("pw");
        let keys = learned_keys(&secret, "pw");
        let mut client = PassthroughClient::with_nonce(keys.clone(), "abc");
        assert_eq!(client.verify_server_final(b"v=AAAA"), Err(ScramClientError::OutOfOrder));
        let salt = B64.encode(&secret.salt);
        let iters = secret.iterations;
        for (msg, want) in [
            (format!("r=xyz123,s={salt},i={iters}"), ScramClientError::NonceMismatch),
            (format!("r=abc,s={salt},i={iters}"), ScramClientError::NonceMismatch),
            (format!("r=abcd,i={iters}"), ScramClientError::Malformed("missing salt")),
            (format!("r=abcd,s=!!,i={iters}"), ScramClientError::Malformed("salt is not base64")),
            (format!("r=abcd,s={salt},i=x"), ScramClientError::Malformed("iteration count is not a number")),
            (format!("r=abcd,s={salt},i={}", iters + 1), ScramClientError::StaleVerifier),
        ] {
            assert_eq!(client.handle_server_first(msg.as_bytes()), Err(want), "{msg}");
        }
        client.handle_server_first(format!("r=abcd,s={salt},i={iters}").as_bytes()).unwrap();
        assert_eq!(
            client.verify_server_final(b"v=AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA="),
            Err(ScramClientError::BadServerSignature)
        );
        assert!(matches!(client.verify_server_final(b"e=invalid-proof"), Err(ScramClientError::ServerError(_))));
        assert_eq!(client.verify_server_final(b"x"), Err(ScramClientError::Malformed("missing verifier")));
    }
}
