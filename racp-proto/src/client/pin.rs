//! TLS that trusts exactly one certificate: the host's, pinned by its SHA-256 at pairing
//! (docs/protocol.md §2.4). A squatter on the host's port cannot present it, so the client
//! stops after the TLS handshake, before a token or any request has been written.

use crate::fingerprint::CertSha256;
use std::sync::{Arc, Mutex};
use tokio_rustls::rustls::client::danger::{
    HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier,
};
use tokio_rustls::rustls::crypto::{
    CryptoProvider, WebPkiSupportedAlgorithms, verify_tls12_signature, verify_tls13_signature,
};
use tokio_rustls::rustls::pki_types::{CertificateDer, ServerName, UnixTime};
use tokio_rustls::rustls::{self, DigitallySignedStruct, SignatureScheme};

/// Accepts the end-entity certificate whose DER hashes to the pin; the handshake signatures are
/// still verified (with the ring provider's algorithms), so the peer must hold the key too. No
/// name, chain or validity check: the pin is the whole trust decision.
#[derive(Debug)]
pub struct PinnedVerifier {
    expected: CertSha256,
    algorithms: WebPkiSupportedAlgorithms,
    /// The fingerprint of a certificate that did not match, for the error report.
    mismatch: Arc<Mutex<Option<CertSha256>>>,
}

impl PinnedVerifier {
    pub fn new(expected: CertSha256, provider: &CryptoProvider) -> Self {
        PinnedVerifier {
            expected,
            algorithms: provider.signature_verification_algorithms,
            mismatch: Arc::new(Mutex::new(None)),
        }
    }

    /// Where a mismatch is recorded (shared, read after a failed handshake).
    pub(super) fn mismatch(&self) -> Arc<Mutex<Option<CertSha256>>> {
        self.mismatch.clone()
    }
}

/// SHA-256 of a DER certificate.
pub fn certificate_sha256(der: &[u8]) -> CertSha256 {
    let digest = ring::digest::digest(&ring::digest::SHA256, der);
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    CertSha256(out)
}

impl ServerCertVerifier for PinnedVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let found = certificate_sha256(end_entity.as_ref());
        if found == self.expected {
            return Ok(ServerCertVerified::assertion());
        }
        if let Ok(mut slot) = self.mismatch.lock() {
            *slot = Some(found);
        }
        Err(rustls::Error::InvalidCertificate(
            rustls::CertificateError::ApplicationVerificationFailure,
        ))
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.algorithms)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}
