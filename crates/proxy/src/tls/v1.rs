//! X.509 v1 certificates, which weir accepts where rustls alone would not.
//!
//! rustls reads every certificate through webpki, which accepts X.509 v3
//! only; OpenSSL, and so PgBouncer and Postgres, also accept v1 (`openssl x509
//! -req` without extensions makes one, and many older setups have them). So
//! weir writes here, narrowly, what is needed for them:
//! - its own certificate: the `CertifiedKey` is built here (the key is
//!   matched against the certificate's public key by x509-parser, not
//!   webpki), and served by a fixed resolver;
//! - a peer's v1 certificate, only after webpki has refused it: it must be
//!   signed directly by one of the configured CAs (a v1 certificate is never
//!   taken as a CA: it cannot say basicConstraints), be within its validity
//!   period, and, where a name is asked for, carry it (subjectAltName, else
//!   the subject CN, as libpq reads it);
//! - the handshake's signature by a v1 certificate's key, checked on the
//!   certificate's SubjectPublicKeyInfo.

use std::net::IpAddr;
use std::sync::Arc;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::client::ResolvesClientCert;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, SubjectPublicKeyInfoDer, UnixTime};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{CertificateError, DigitallySignedStruct, Error, PeerMisbehaved, SignatureScheme};
use x509_parser::certificate::X509Certificate;
use x509_parser::extensions::GeneralName;
use x509_parser::oid_registry::{OID_PKCS1_SHA1WITHRSA, OID_SHA1_WITH_RSA};
use x509_parser::prelude::FromDer;
use x509_parser::time::ASN1Time;
use x509_parser::x509::X509Version;

use super::is_x509_v1;

/// A certificate refused here, with the reason (rustls's `Other` error).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
struct Refused(&'static str);

fn refused(why: &'static str) -> Error {
    Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(Arc::new(Refused(why)))))
}

fn parse<'a>(der: &'a [u8]) -> Result<X509Certificate<'a>, Error> {
    match X509Certificate::from_der(der) {
        Ok(([], cert)) => Ok(cert),
        _ => Err(Error::InvalidCertificate(CertificateError::BadEncoding)),
    }
}

/// weir's own certificate chain and key, whatever the version of its first
/// certificate. The key must match the certificate's public key.
pub fn certified_key(
    chain: Vec<CertificateDer<'static>>,
    key: PrivateKeyDer<'static>,
    provider: &rustls::crypto::CryptoProvider,
) -> Result<Arc<CertifiedKey>, Error> {
    let signing = provider.key_provider.load_private_key(key)?;
    let leaf = chain.first().ok_or(Error::NoCertificatesPresented)?;
    let cert = parse(leaf)?;
    // A key type whose public key rustls cannot tell is let through, as
    // rustls's own builders do.
    if signing.public_key().is_some_and(|spki| spki.as_ref() != cert.public_key().raw) {
        return Err(Error::InconsistentKeys(rustls::InconsistentKeys::KeyMismatch));
    }
    Ok(Arc::new(CertifiedKey::new(chain, signing)))
}

/// Serves one certificate and key, to clients (as a server) and to Postgres
/// (as a client).
#[derive(Debug)]
pub struct FixedCert(pub Arc<CertifiedKey>);

impl ResolvesServerCert for FixedCert {
    fn resolve(&self, _: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

impl ResolvesClientCert for FixedCert {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A peer's v1 certificate, which webpki has refused: signed directly by one
/// of `cas` (or one of them itself), valid at `now`, and for `name`, if
/// given.
pub fn verify_leaf(
    leaf_der: &CertificateDer<'_>,
    cas: &[CertificateDer<'static>],
    name: Option<&ServerName<'_>>,
    now: UnixTime,
) -> Result<(), Error> {
    let leaf = parse(leaf_der)?;
    if leaf.version() != X509Version::V1 {
        return Err(refused("only an X.509 v1 certificate is checked outside webpki"));
    }
    let at = i64::try_from(now.as_secs()).ok().and_then(|s| ASN1Time::from_timestamp(s).ok());
    match at {
        Some(at) if at < leaf.validity().not_before => return Err(CertificateError::NotValidYet.into()),
        Some(at) if at > leaf.validity().not_after => return Err(CertificateError::Expired.into()),
        Some(_) => {}
        None => return Err(CertificateError::BadEncoding.into()),
    }
    if [OID_PKCS1_SHA1WITHRSA, OID_SHA1_WITH_RSA].contains(&leaf.signature_algorithm.algorithm) {
        return Err(refused("a SHA-1 signature is not accepted"));
    }
    let pinned = cas.iter().any(|ca| ca.as_ref() == leaf_der.as_ref());
    if !pinned && !cas.iter().any(|ca| signed_by(&leaf, ca).is_ok()) {
        return Err(CertificateError::UnknownIssuer.into());
    }
    match name {
        Some(name) if !names_host(&leaf, name) => Err(CertificateError::NotValidForName.into()),
        _ => Ok(()),
    }
}

/// `ca` may sign certificates (X.509 v3, not marked as an end entity) and
/// its key signed `leaf`, whose issuer is its subject.
fn signed_by(leaf: &X509Certificate<'_>, ca: &CertificateDer<'_>) -> Result<(), ()> {
    let ca = parse(ca).map_err(drop)?;
    let is_ca = ca.basic_constraints().ok().flatten().is_some_and(|b| b.value.ca);
    let may_sign = ca.key_usage().ok().flatten().is_none_or(|k| k.value.key_cert_sign());
    if ca.version() != X509Version::V3 || !is_ca || !may_sign || ca.subject().as_raw() != leaf.issuer().as_raw() {
        return Err(());
    }
    leaf.verify_signature(Some(ca.public_key())).map_err(drop)
}

/// The host is named by the certificate: by a subjectAltName entry of its
/// kind, else (no subjectAltName at all) by a subject CN, as libpq reads it.
fn names_host(cert: &X509Certificate<'_>, name: &ServerName<'_>) -> bool {
    let host = match name {
        ServerName::DnsName(d) => d.as_ref().to_owned(),
        ServerName::IpAddress(ip) => IpAddr::from(*ip).to_string(),
        _ => return false,
    };
    if let Ok(Some(san)) = cert.subject_alternative_name() {
        return san.value.general_names.iter().any(|g| match (g, name) {
            (GeneralName::DNSName(d), ServerName::DnsName(_)) => dns_matches(d, &host),
            (GeneralName::IPAddress(b), ServerName::IpAddress(ip)) => ip_bytes(b) == Some(IpAddr::from(*ip)),
            _ => false,
        });
    }
    let mut cns = cert.subject().iter_common_name().filter_map(|cn| cn.as_str().ok());
    match name {
        ServerName::IpAddress(_) => cns.any(|cn| cn == host),
        _ => cns.any(|cn| dns_matches(cn, &host)),
    }
}

fn ip_bytes(b: &[u8]) -> Option<IpAddr> {
    match b.len() {
        4 => <[u8; 4]>::try_from(b).ok().map(IpAddr::from),
        16 => <[u8; 16]>::try_from(b).ok().map(IpAddr::from),
        _ => None,
    }
}

/// A certificate name against the host, without case; a leading `*.`
/// stands for exactly one label (as libpq's wildcard).
fn dns_matches(pattern: &str, host: &str) -> bool {
    match pattern.strip_prefix("*.") {
        Some(rest) => {
            host.split_once('.').is_some_and(|(label, tail)| !label.is_empty() && tail.eq_ignore_ascii_case(rest))
        }
        None => pattern.eq_ignore_ascii_case(host),
    }
}

/// The subject CN of a certificate (what hba method `cert` compares with
/// the user name), any version.
pub fn common_name(der: &[u8]) -> Option<String> {
    let cert = parse(der).ok()?;
    let cn = cert.subject().iter_common_name().next()?.as_str().ok()?.to_owned();
    Some(cn)
}

/// The certificate's SubjectPublicKeyInfo, when it is v1 (webpki reads v3
/// ones itself).
fn v1_key(cert: &CertificateDer<'_>) -> Option<Result<SubjectPublicKeyInfoDer<'static>, Error>> {
    is_x509_v1(cert).then(|| parse(cert).map(|c| SubjectPublicKeyInfoDer::from(c.public_key().raw.to_vec())))
}

/// A TLS 1.2 handshake signature by `cert`'s key, whatever its version.
pub fn tls12_signature(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
    algs: &WebPkiSupportedAlgorithms,
) -> Result<HandshakeSignatureValid, Error> {
    match v1_key(cert) {
        None => rustls::crypto::verify_tls12_signature(message, cert, dss, algs),
        Some(spki) => tls12_raw_key_signature(message, &spki?, dss.scheme, dss.signature(), algs),
    }
}

/// A TLS 1.3 handshake signature by `cert`'s key, whatever its version.
pub fn tls13_signature(
    message: &[u8],
    cert: &CertificateDer<'_>,
    dss: &DigitallySignedStruct,
    algs: &WebPkiSupportedAlgorithms,
) -> Result<HandshakeSignatureValid, Error> {
    match v1_key(cert) {
        None => rustls::crypto::verify_tls13_signature(message, cert, dss, algs),
        Some(spki) => rustls::crypto::verify_tls13_signature_with_raw_key(message, &spki?, dss, algs),
    }
}

/// A TLS 1.2 `signature` over `message` by the key of `spki`, as rustls
/// checks it for a certificate (rustls has this for TLS 1.3 only): TLS 1.2
/// does not tie a scheme to one algorithm, so any of the scheme's may do.
fn tls12_raw_key_signature(
    message: &[u8],
    spki: &SubjectPublicKeyInfoDer<'_>,
    scheme: SignatureScheme,
    signature: &[u8],
    algs: &WebPkiSupportedAlgorithms,
) -> Result<HandshakeSignatureValid, Error> {
    let unadvertised = || Error::from(PeerMisbehaved::SignedHandshakeWithUnadvertisedSigScheme);
    let key = webpki::RawPublicKeyEntity::try_from(spki).map_err(|_| Error::from(CertificateError::BadEncoding))?;
    let candidates = algs.mapping.iter().find(|(s, _)| *s == scheme).map(|(_, a)| *a).ok_or_else(unadvertised)?;
    if candidates.iter().any(|alg| key.verify_signature(*alg, message, signature).is_ok()) {
        Ok(HandshakeSignatureValid::assertion())
    } else {
        Err(CertificateError::BadSignature.into())
    }
}

#[cfg(test)]
#[path = "v1_tests.rs"]
mod tests;
