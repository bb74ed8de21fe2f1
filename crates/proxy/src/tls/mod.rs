//! TLS with rustls (ring provider): loading certificates, keys and CAs from
//! PEM files, and the acceptor weir presents to clients
//! (`client_tls_sslmode`), and the connector weir uses towards Postgres
//! (`server_tls_sslmode`). Built from the config at start and at each
//! reload, so new certificate files take effect without a restart.
//! Certificates may be X.509 v1 or v3 (`v1` says how).

pub mod v1;
mod verify;

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::ServerCertVerifier;
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::sign::CertifiedKey;
use rustls::RootCertStore;
use tokio_rustls::{TlsAcceptor, TlsConnector};

use verify::{ClientVerified, Unverified, Verified};

use crate::config::{ClientTlsMode, Config, ServerTlsMode};

/// The ALPN protocol of Postgres (required with direct TLS).
pub const ALPN_POSTGRESQL: &[u8] = b"postgresql";

/// A TLS file that cannot be used, with the file and the reason.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot load {0}: {1}")]
    File(String, String),
    #[error("{0} is required by the TLS mode")]
    Missing(&'static str),
    #[error("TLS setup failed: {0}")]
    Setup(String),
}

/// Client-side TLS as configured: the mode and the acceptor.
pub struct ClientTls {
    pub mode: ClientTlsMode,
    pub acceptor: TlsAcceptor,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls").field("mode", &self.mode).finish_non_exhaustive()
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// The rustls versions of a `*_tls_protocols` value (checked by the
/// config's validation; a bad one here is a setup error).
fn versions(value: &str) -> Result<Vec<&'static rustls::SupportedProtocolVersion>, TlsError> {
    let v = crate::config::tls_protocols::parse(value).map_err(TlsError::Setup)?;
    let mut out = Vec::new();
    if v.tls13 {
        out.push(&rustls::version::TLS13);
    }
    if v.tls12 {
        out.push(&rustls::version::TLS12);
    }
    Ok(out)
}

/// Every certificate in a PEM file.
pub fn load_certs(path: &Path) -> Result<Vec<CertificateDer<'static>>, TlsError> {
    let bad = |e: String| TlsError::File(path.display().to_string(), e);
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no PEM certificate in the file".into()));
    }
    Ok(certs)
}

/// weir's own certificate chain and its key, from PEM files, ready to serve
/// (v1 or v3; the key must match the certificate).
pub fn load_certified_key(cert: &Path, key: &Path) -> Result<Arc<CertifiedKey>, TlsError> {
    v1::certified_key(load_certs(cert)?, load_key(key)?, &provider())
        .map_err(|e| TlsError::Setup(format!("{}: {e}", cert.display())))
}

/// Whether a DER certificate is X.509 v1: its TBSCertificate opens without
/// the explicit `[0]` version field that v2 and v3 carry. Anything that is
/// not DER of that shape is left for rustls to judge (false).
pub fn is_x509_v1(der: &[u8]) -> bool {
    const SEQUENCE: u8 = 0x30;
    const VERSION_TAG: u8 = 0xa0;
    /// The contents of the DER element at the start of `b` with tag `tag`.
    fn contents(b: &[u8], tag: u8) -> Option<&[u8]> {
        let (&t, rest) = b.split_first()?;
        let (&len0, rest) = rest.split_first()?;
        if t != tag {
            return None;
        }
        let (len, rest) = match len0 {
            n if n < 0x80 => (usize::from(n), rest),
            n => {
                let k = usize::from(n & 0x7f);
                if k == 0 || k > 4 || rest.len() < k {
                    return None;
                }
                (rest[..k].iter().fold(0usize, |acc, &b| acc << 8 | usize::from(b)), &rest[k..])
            }
        };
        rest.get(..len)
    }
    let tbs = contents(der, SEQUENCE).and_then(|cert| contents(cert, SEQUENCE));
    tbs.and_then(|t| t.first()).is_some_and(|&first| first != VERSION_TAG)
}

/// A failed handshake's error, in OpenSSL's words where a certificate was
/// refused ("certificate verify failed"), with what to do about a v3
/// `peer` certificate that names the host only in its subject CN (rustls,
/// as RFC 6125 asks, reads a v3 certificate's names from subjectAltName only).
pub fn explain(e: &std::io::Error, peer: &str) -> String {
    let text = e.to_string();
    let text = match text.strip_prefix("invalid peer certificate: ") {
        Some(why) => format!("certificate verify failed: the {peer}'s certificate: {why}"),
        None => text,
    };
    if text.contains("not valid for any names") {
        let why = "a name only in the subject CN is not read: reissue it with the name in subjectAltName";
        format!("{text}: the {peer}'s certificate has no subjectAltName for it ({why})")
    } else {
        text
    }
}

/// The first private key in a PEM file (PKCS#8, PKCS#1 or SEC1).
pub fn load_key(path: &Path) -> Result<PrivateKeyDer<'static>, TlsError> {
    PrivateKeyDer::from_pem_file(path).map_err(|e| TlsError::File(path.display().to_string(), e.to_string()))
}

/// A root store from a PEM file of CA certificates, and the certificates
/// themselves (for the v1 path).
pub fn load_roots(path: &Path) -> Result<(RootCertStore, Arc<[CertificateDer<'static>]>), TlsError> {
    let mut roots = RootCertStore::empty();
    let certs = load_certs(path)?;
    for cert in &certs {
        roots.add(cert.clone()).map_err(|e| TlsError::File(path.display().to_string(), e.to_string()))?;
    }
    Ok((roots, certs.into()))
}

/// The client-side acceptor the config asks for (None with `disable`).
pub fn load_client_tls(cfg: &Config) -> Result<Option<Arc<ClientTls>>, TlsError> {
    let g = &cfg.weir;
    if g.client_tls_sslmode == ClientTlsMode::Disable {
        return Ok(None);
    }
    let cert = cfg.resolve(&g.client_tls_cert_file).ok_or(TlsError::Missing("client_tls_cert_file"))?;
    let key = cfg.resolve(&g.client_tls_key_file).ok_or(TlsError::Missing("client_tls_key_file"))?;
    let builder = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&versions(&g.client_tls_protocols)?)
        .map_err(|e| TlsError::Setup(e.to_string()))?;
    let builder = if g.client_tls_sslmode.verifies_client() {
        let ca = cfg.resolve(&g.client_tls_ca_file).ok_or(TlsError::Missing("client_tls_ca_file"))?;
        let (roots, cas) = load_roots(&ca)?;
        let webpki = WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .map_err(|e| TlsError::Setup(e.to_string()))?;
        let algs = provider().signature_verification_algorithms;
        builder.with_client_cert_verifier(Arc::new(ClientVerified { webpki, cas, algs }))
    } else {
        builder.with_no_client_auth()
    };
    let own = v1::FixedCert(load_certified_key(&cert, &key)?);
    let mut server = builder.with_cert_resolver(Arc::new(own));
    server.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
    Ok(Some(Arc::new(ClientTls { mode: g.client_tls_sslmode, acceptor: TlsAcceptor::from(Arc::new(server)) })))
}

/// Server-side TLS as configured: the mode and the connector.
pub struct ServerTls {
    pub mode: ServerTlsMode,
    /// Err: the files stopped loading; connections fail with this reason.
    pub connector: Result<TlsConnector, String>,
}

impl std::fmt::Debug for ServerTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ServerTls").field("mode", &self.mode).finish_non_exhaustive()
    }
}

/// The same loaded configuration (specs compare equal until a reload).
impl PartialEq for ServerTls {
    fn eq(&self, other: &Self) -> bool {
        std::ptr::eq(self, other)
    }
}
impl Eq for ServerTls {}

/// The connector the config asks for (None with `disable`).
pub fn load_server_tls(cfg: &Config) -> Result<Option<Arc<ServerTls>>, TlsError> {
    let g = &cfg.weir;
    let verifier: Arc<dyn ServerCertVerifier> = match g.server_tls_sslmode {
        ServerTlsMode::Disable | ServerTlsMode::Allow => return Ok(None),
        ServerTlsMode::Prefer | ServerTlsMode::Require => {
            Arc::new(Unverified { algs: provider().signature_verification_algorithms })
        }
        mode => {
            let ca = cfg.resolve(&g.server_tls_ca_file).ok_or(TlsError::Missing("server_tls_ca_file"))?;
            let (roots, cas) = load_roots(&ca)?;
            let webpki = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .map_err(|e| TlsError::Setup(e.to_string()))?;
            let algs = provider().signature_verification_algorithms;
            Arc::new(Verified { webpki, cas, algs, check_name: mode == ServerTlsMode::VerifyFull })
        }
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&versions(&g.server_tls_protocols)?)
        .map_err(|e| TlsError::Setup(e.to_string()))?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    let mut client = match (cfg.resolve(&g.server_tls_cert_file), cfg.resolve(&g.server_tls_key_file)) {
        (Some(cert), Some(key)) => {
            builder.with_client_cert_resolver(Arc::new(v1::FixedCert(load_certified_key(&cert, &key)?)))
        }
        _ => builder.with_no_client_auth(),
    };
    client.alpn_protocols = vec![ALPN_POSTGRESQL.to_vec()];
    Ok(Some(Arc::new(ServerTls { mode: g.server_tls_sslmode, connector: Ok(TlsConnector::from(Arc::new(client))) })))
}

/// For a mode whose files no longer load: every connection fails (never plain).
pub fn broken_server_tls(mode: ServerTlsMode, why: String) -> Option<Arc<ServerTls>> {
    (!matches!(mode, ServerTlsMode::Disable | ServerTlsMode::Allow))
        .then(|| Arc::new(ServerTls { mode, connector: Err(why) }))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(lines: &str) -> Result<Config, crate::config::ConfigError> {
        Config::from_toml(&format!("[weir]\nauth_type = \"trust\"\n{lines}"), Path::new("/nonexistent-weir-dir"))
    }

    #[test]
    fn v1_is_told_from_v3_by_the_version_field() {
        // SEQUENCE { SEQUENCE { [0] { INTEGER 2 } ... } }: v3.
        let v3 = [0x30, 0x08, 0x30, 0x06, 0xa0, 0x03, 0x02, 0x01, 0x02, 0x05];
        // SEQUENCE { SEQUENCE { INTEGER serial ... } }: v1.
        let v1 = [0x30, 0x05, 0x30, 0x03, 0x02, 0x01, 0x07];
        assert!(!is_x509_v1(&v3) && is_x509_v1(&v1));
        // Long-form lengths, and what is not DER at all (left to rustls).
        let long = [0x30, 0x81, 0x05, 0x30, 0x81, 0x02, 0x02, 0x00];
        assert!(is_x509_v1(&long));
        assert!(!is_x509_v1(b"") && !is_x509_v1(b"junk") && !is_x509_v1(&[0x30, 0x84, 0xff]));
    }

    #[test]
    fn handshake_errors_say_what_to_reissue() {
        let e = |t: &str| std::io::Error::new(std::io::ErrorKind::InvalidData, t.to_owned());
        let ca = explain(&e("invalid peer certificate: UnknownIssuer"), "server");
        assert_eq!(ca, "certificate verify failed: the server's certificate: UnknownIssuer");
        let cn = explain(&e("certificate not valid for name \"db\"; certificate is not valid for any names"), "server");
        assert!(cn.contains("subjectAltName"), "{cn}");
        assert_eq!(explain(&e("other"), "client"), "other");
    }

    #[test]
    fn disable_needs_no_files_and_builds_no_acceptor() {
        let cfg = config("").unwrap();
        assert!(load_client_tls(&cfg).unwrap().is_none());
    }

    #[test]
    fn modes_name_the_missing_file() {
        let e = config("client_tls_sslmode = \"require\"").unwrap_err().to_string();
        assert!(e.contains("client_tls_cert_file") && e.contains("require"), "{e}");
        let e = config("client_tls_sslmode = \"prefer\"\nclient_tls_cert_file = \"a.crt\"").unwrap_err().to_string();
        assert!(e.contains("/nonexistent-weir-dir/a.crt does not exist"), "{e}");
        assert!(config("client_tls_sslmode = \"sometimes\"").is_err());
    }

    /// The v1 fixtures of `v1`'s tests, in a config (relative paths).
    fn v1_config(lines: &str) -> Config {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/tls/testdata");
        Config::from_toml(&format!("[weir]\nauth_type = \"trust\"\n{lines}"), &dir).unwrap()
    }

    #[test]
    fn v1_certificates_build_the_acceptor_and_the_connector() {
        let cfg = v1_config(
            "client_tls_sslmode = \"verify-full\"\nclient_tls_cert_file = \"localhost-ca1.crt\"\n\
             client_tls_key_file = \"localhost-ca1.key\"\nclient_tls_ca_file = \"ca1.crt\"\n\
             server_tls_sslmode = \"verify-full\"\nserver_tls_ca_file = \"ca1.crt\"\n\
             server_tls_cert_file = \"wild-ca1.crt\"\nserver_tls_key_file = \"wild-ca1.key\"\n",
        );
        assert!(load_client_tls(&cfg).unwrap().is_some());
        assert!(load_server_tls(&cfg).unwrap().is_some_and(|t| t.connector.is_ok()));
        // A v1 certificate in a CA file loads (it is only ever matched exactly).
        assert!(load_roots(&cfg.resolve(&Some("v1ca.crt".into())).unwrap()).is_ok());
        // A key that is not the certificate's is refused, naming the certificate.
        let bad = v1_config(
            "client_tls_sslmode = \"require\"\nclient_tls_cert_file = \"localhost-ca1.crt\"\n\
             client_tls_key_file = \"wild-ca1.key\"\n",
        );
        let e = load_client_tls(&bad).unwrap_err().to_string();
        assert!(e.contains("localhost-ca1.crt") && e.contains("KeyMismatch"), "{e}");
    }

    #[test]
    fn a_file_that_is_not_pem_is_refused_with_its_name() {
        let dir = std::env::temp_dir().join(format!("weir-tls-unit-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let junk = dir.join("junk.pem");
        std::fs::write(&junk, "not a certificate\n").unwrap();
        let e = load_certs(&junk).unwrap_err().to_string();
        assert!(e.contains("junk.pem") && e.contains("no PEM certificate"), "{e}");
        assert!(load_key(&junk).unwrap_err().to_string().contains("junk.pem"));
        let _ = std::fs::remove_dir_all(&dir);
    }
}
