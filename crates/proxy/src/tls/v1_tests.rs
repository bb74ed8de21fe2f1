//! The v1 path against certificates made by `testdata/make.sh` (openssl):
//! v3 CAs, v1 leaves signed by them, a v1 self-signed "CA", a v1 leaf
//! signed by a v3 end entity.

use std::time::Duration;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, Error, SignatureScheme};

use super::*;

fn cert(name: &str) -> CertificateDer<'static> {
    let path = format!("{}/src/tls/testdata/{name}.crt", env!("CARGO_MANIFEST_DIR"));
    CertificateDer::from_pem_file(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn key(name: &str) -> PrivateKeyDer<'static> {
    let path = format!("{}/src/tls/testdata/{name}.key", env!("CARGO_MANIFEST_DIR"));
    PrivateKeyDer::from_pem_file(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn now() -> UnixTime {
    UnixTime::now()
}

fn host(name: &str) -> ServerName<'static> {
    ServerName::try_from(name.to_owned()).unwrap()
}

fn provider() -> rustls::crypto::CryptoProvider {
    rustls::crypto::ring::default_provider()
}

fn is(e: Result<(), Error>, want: CertificateError) -> bool {
    matches!(e, Err(Error::InvalidCertificate(got)) if got == want)
}

#[test]
fn the_fixtures_are_what_the_tests_say() {
    assert!(is_x509_v1(&cert("localhost-ca1")) && is_x509_v1(&cert("v1ca")));
    assert!(!is_x509_v1(&cert("ca1")) && !is_x509_v1(&cert("leafca")));
    // webpki refuses the v1 leaf outright: the reason this module exists.
    assert!(webpki::EndEntityCert::try_from(&cert("localhost-ca1")).is_err());
    assert!(webpki::EndEntityCert::try_from(&cert("ca1")).is_ok());
}

#[test]
fn a_v1_leaf_signed_by_a_configured_ca_verifies_with_its_name() {
    let cas = [cert("ca2"), cert("ca1")];
    let leaf = cert("localhost-ca1");
    assert_eq!(verify_leaf(&leaf, &cas, None, now()), Ok(()));
    assert_eq!(verify_leaf(&leaf, &cas, Some(&host("localhost")), now()), Ok(()));
    assert_eq!(verify_leaf(&leaf, &cas, Some(&host("LOCALHOST")), now()), Ok(()));
    assert!(is(verify_leaf(&leaf, &cas, Some(&host("db.example.org")), now()), CertificateError::NotValidForName));
    assert!(is(verify_leaf(&leaf, &cas, Some(&host("127.0.0.1")), now()), CertificateError::NotValidForName));
}

#[test]
fn a_v1_leaf_from_another_ca_is_refused() {
    let leaf = cert("localhost-ca2");
    assert!(is(verify_leaf(&leaf, &[cert("ca1")], None, now()), CertificateError::UnknownIssuer));
    assert_eq!(verify_leaf(&leaf, &[cert("ca2")], None, now()), Ok(()));
}

#[test]
fn a_v1_certificate_or_an_end_entity_is_never_taken_as_a_ca() {
    // OpenSSL would take the self-signed v1 certificate as a CA; weir does not.
    let by_v1 = cert("localhost-v1ca");
    assert!(is(verify_leaf(&by_v1, &[cert("v1ca")], None, now()), CertificateError::UnknownIssuer));
    let by_leaf = cert("localhost-leafca");
    assert!(is(verify_leaf(&by_leaf, &[cert("leafca")], None, now()), CertificateError::UnknownIssuer));
    // A certificate configured as trusted itself (pinned) is accepted.
    assert_eq!(verify_leaf(&cert("v1ca"), &[cert("v1ca")], Some(&host("v1ca")), now()), Ok(()));
}

#[test]
fn validity_is_checked() {
    let (leaf, cas) = (cert("localhost-ca1"), [cert("ca1")]);
    let past = UnixTime::since_unix_epoch(Duration::from_secs(1_000_000));
    assert!(is(verify_leaf(&leaf, &cas, None, past), CertificateError::NotValidYet));
    let far = UnixTime::since_unix_epoch(Duration::from_secs(200 * 365 * 86_400 + now().as_secs()));
    assert!(is(verify_leaf(&leaf, &cas, None, far), CertificateError::Expired));
}

#[test]
fn only_v1_certificates_take_this_path() {
    assert!(verify_leaf(&cert("ca1"), &[cert("ca1")], None, now()).is_err());
    let junk = CertificateDer::from(vec![0x30, 0x03, 0x02, 0x01, 0x07]);
    assert!(is(verify_leaf(&junk, &[cert("ca1")], None, now()), CertificateError::BadEncoding));
}

#[test]
fn wildcards_stand_for_one_label() {
    let (leaf, cas) = (cert("wild-ca1"), [cert("ca1")]);
    assert_eq!(verify_leaf(&leaf, &cas, Some(&host("db.example.org")), now()), Ok(()));
    assert!(verify_leaf(&leaf, &cas, Some(&host("a.db.example.org")), now()).is_err());
    assert!(verify_leaf(&leaf, &cas, Some(&host("example.org")), now()).is_err());
    assert_eq!(common_name(&leaf).as_deref(), Some("*.example.org"));
    assert_eq!(common_name(&cert("localhost-ca1")).as_deref(), Some("localhost"));
}

#[test]
fn own_v1_certificate_is_served_when_its_key_matches() {
    let p = provider();
    let ck = certified_key(vec![cert("localhost-ca1")], key("localhost-ca1"), &p).expect("v1 served");
    assert_eq!(ck.end_entity_cert().unwrap(), &cert("localhost-ca1"));
    let e = certified_key(vec![cert("localhost-ca1")], key("ca1"), &p).unwrap_err();
    assert!(matches!(e, Error::InconsistentKeys(_)), "{e:?}");
    assert!(matches!(certified_key(vec![], key("ca1"), &p), Err(Error::NoCertificatesPresented)));
    // v3 works the same way.
    assert!(certified_key(vec![cert("ca1")], key("ca1"), &p).is_ok());
}

/// A TLS 1.2 handshake signature made with `key`, checked against `cert`'s
/// key (TLS 1.3 goes through rustls's own raw-key check).
fn signature_checks(cert_name: &str, key_name: &str) -> bool {
    let p = provider();
    let signer = p.key_provider.load_private_key(key(key_name)).unwrap();
    let scheme = SignatureScheme::ECDSA_NISTP256_SHA256;
    let message = b"handshake transcript";
    let sig = signer.choose_scheme(&[scheme]).unwrap().sign(message).unwrap();
    let algs = &p.signature_verification_algorithms;
    let spki = v1_key(&cert(cert_name)).expect("a v1 certificate").unwrap();
    tls12_raw_key_signature(message, &spki, scheme, &sig, algs).is_ok()
}

#[test]
fn handshake_signatures_by_a_v1_key_are_checked() {
    assert!(signature_checks("localhost-ca1", "localhost-ca1"));
    assert!(!signature_checks("localhost-ca1", "wild-ca1"), "another key's signature");
    assert!(v1_key(&cert("ca1")).is_none(), "v3: webpki's own check");
}
