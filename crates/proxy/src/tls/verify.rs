//! How weir checks a peer's certificate: Postgres's (`server_tls_sslmode`)
//! and a client's (`client_tls_sslmode` verify-ca / verify-full). webpki
//! first; a v1 certificate it refuses goes to the narrow path of
//! [`super::v1`]. Handshake signatures are checked for every mode, v1
//! certificates included.

use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::crypto::WebPkiSupportedAlgorithms;
use rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::{CertificateError, DigitallySignedStruct, DistinguishedName, SignatureScheme};

use super::{is_x509_v1, v1};

/// The handshake's signature checks of a verifier with an `algs` field:
/// the same for every mode, v1 certificates included.
macro_rules! handshake_signatures {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            v1::tls12_signature(message, cert, dss, &self.algs)
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            v1::tls13_signature(message, cert, dss, &self.algs)
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.algs.supported_schemes()
        }
    };
}

/// prefer / require: encryption without checking who the server is (as
/// libpq's sslmode=require); the handshake's signatures are still checked.
#[derive(Debug)]
pub(super) struct Unverified {
    pub algs: WebPkiSupportedAlgorithms,
}

/// verify-ca / verify-full: the chain against the CA; the name only with verify-full.
#[derive(Debug)]
pub(super) struct Verified {
    pub webpki: Arc<WebPkiServerVerifier>,
    /// The configured CA certificates, for the v1 path.
    pub cas: Arc<[CertificateDer<'static>]>,
    pub algs: WebPkiSupportedAlgorithms,
    pub check_name: bool,
}

impl ServerCertVerifier for Verified {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        match self.webpki.verify_server_cert(end_entity, intermediates, server_name, ocsp, now) {
            Err(_) if is_x509_v1(end_entity) => {
                let name = self.check_name.then_some(server_name);
                v1::verify_leaf(end_entity, &self.cas, name, now).map(|()| ServerCertVerified::assertion())
            }
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) if !self.check_name => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    handshake_signatures!();
}

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        _: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    handshake_signatures!();
}

/// client_tls_sslmode verify-ca / verify-full: a client certificate that
/// chains to `client_tls_ca_file` (libpq's client side has no name to check).
#[derive(Debug)]
pub(super) struct ClientVerified {
    pub webpki: Arc<dyn ClientCertVerifier>,
    pub cas: Arc<[CertificateDer<'static>]>,
    pub algs: WebPkiSupportedAlgorithms,
}

impl ClientCertVerifier for ClientVerified {
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        self.webpki.root_hint_subjects()
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        match self.webpki.verify_client_cert(end_entity, intermediates, now) {
            Err(_) if is_x509_v1(end_entity) => {
                v1::verify_leaf(end_entity, &self.cas, None, now).map(|()| ClientCertVerified::assertion())
            }
            other => other,
        }
    }

    handshake_signatures!();
}
