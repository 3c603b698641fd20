//! The host's TLS identity: a self-signed certificate and key made at first start, kept in the
//! data directory and reused across restarts. Devices pin the certificate's SHA-256 when they
//! pair, so a process that takes over the host's port cannot pass for the host
//! (docs/protocol.md §2.4, docs/reliability.md §4.11).
//!
//! A present but unreadable or corrupt file is a startup error, never a reason to make a new
//! identity: a new certificate breaks every paired device's pin, which must be a deliberate act
//! (remove both files, then pair again).

use racp_proto::fingerprint::CertSha256;
use std::path::{Path, PathBuf};
use tokio_rustls::rustls::pki_types::CertificateDer;
use tokio_rustls::rustls::pki_types::pem::PemObject;

/// The certificate (PEM), public.
pub const CERT_FILE: &str = "tls-cert.pem";
/// The private key (PEM, PKCS#8), mode 0600.
pub const KEY_FILE: &str = "tls-key.pem";

#[derive(Debug, thiserror::Error)]
pub enum IdentityError {
    #[error("cannot create the data directory {path}: {source}")]
    DataDir {
        path: String,
        source: std::io::Error,
    },
    #[error("cannot generate the host's TLS certificate: {0}")]
    Generate(String),
    #[error("cannot write {path}: {source}")]
    Write {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "the host's TLS identity is incomplete: {present} exists but {missing} does not. Restore \
         it, or remove {present} to make a new identity (every paired device must then pair again)"
    )]
    Incomplete { present: String, missing: String },
    #[error("cannot read the TLS certificate {path}: {reason}")]
    Certificate { path: String, reason: String },
}

/// The certificate and key files, and the certificate's fingerprint.
#[derive(Debug, Clone)]
pub struct Identity {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub sha256: CertSha256,
}

/// Loads the identity from `data_dir`, generating it when neither file exists.
pub fn load_or_create(data_dir: &Path) -> Result<Identity, IdentityError> {
    let cert = data_dir.join(CERT_FILE);
    let key = data_dir.join(KEY_FILE);
    match (cert.exists(), key.exists()) {
        (true, true) => {}
        (false, false) => generate(data_dir, &cert, &key)?,
        (cert_present, _) => {
            let (present, missing) = if cert_present {
                (&cert, &key)
            } else {
                (&key, &cert)
            };
            return Err(IdentityError::Incomplete {
                present: present.display().to_string(),
                missing: missing.display().to_string(),
            });
        }
    }
    let sha256 = fingerprint(&cert)?;
    Ok(Identity { cert, key, sha256 })
}

/// The SHA-256 of the first (end-entity) certificate in a PEM file: what clients pin.
pub fn fingerprint(cert: &Path) -> Result<CertSha256, IdentityError> {
    let unreadable = |reason: String| IdentityError::Certificate {
        path: cert.display().to_string(),
        reason,
    };
    let first = CertificateDer::pem_file_iter(cert)
        .map_err(|e| unreadable(e.to_string()))?
        .next()
        .ok_or_else(|| unreadable("no certificate in the file".into()))?
        .map_err(|e| unreadable(e.to_string()))?;
    Ok(sha256_of(first.as_ref()))
}

fn sha256_of(der: &[u8]) -> CertSha256 {
    let digest = ring::digest::digest(&ring::digest::SHA256, der);
    let mut out = [0u8; 32];
    out.copy_from_slice(digest.as_ref());
    CertSha256(out)
}

/// An ECDSA P-256 key and a self-signed certificate for the loopback names, written so the key
/// is never readable by others, not even for a moment.
fn generate(data_dir: &Path, cert: &Path, key: &Path) -> Result<(), IdentityError> {
    crate::private_file::create_private_dir(data_dir).map_err(|source| IdentityError::DataDir {
        path: data_dir.display().to_string(),
        source,
    })?;
    let generate_failed = |e: rcgen::Error| IdentityError::Generate(e.to_string());
    let key_pair =
        rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).map_err(generate_failed)?;
    let mut params = rcgen::CertificateParams::new(vec![
        "localhost".to_string(),
        "127.0.0.1".to_string(),
        "::1".to_string(),
    ])
    .map_err(generate_failed)?;
    params
        .distinguished_name
        .push(rcgen::DnType::CommonName, "pi-host");
    let certificate = params.self_signed(&key_pair).map_err(generate_failed)?;
    // Each file goes to a fresh temporary name first and is renamed into place, the key last:
    // a crash leaves either no identity or a complete one... or only the certificate, which
    // the next start reports instead of silently replacing.
    let key_tmp = write_temp(key, key_pair.serialize_pem().as_bytes())?;
    let cert_tmp = write_temp(cert, certificate.pem().as_bytes())?;
    let rename = |from: &Path, to: &Path| {
        std::fs::rename(from, to).map_err(|source| IdentityError::Write {
            path: to.display().to_string(),
            source,
        })
    };
    rename(&cert_tmp, cert)?;
    rename(&key_tmp, key)?;
    tracing::info!(
        cert = %cert.display(),
        sha256 = %sha256_of(certificate.der()),
        "generated the host's TLS identity"
    );
    Ok(())
}

fn write_temp(path: &Path, bytes: &[u8]) -> Result<PathBuf, IdentityError> {
    crate::private_file::stage_private(path, bytes).map_err(|source| IdentityError::Write {
        path: path.display().to_string(),
        source,
    })
}

/// A pairing link to `address` (the one writer of the form, for hosts and gateways).
pub fn pairing_link(address: &str, cert: Option<&CertSha256>, tls: bool, token: &str) -> String {
    match (cert, tls) {
        (Some(sha256), _) => format!("racps://{address}/pair?cert=sha256:{sha256}#{token}"),
        (None, true) => format!("racps://{address}/pair#{token}"),
        (None, false) => format!("racp://{address}/pair#{token}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn generated_once_then_reused_with_a_private_key() {
        let dir = tempfile::tempdir().unwrap();
        let data = dir.path().join("data");
        let first = load_or_create(&data).unwrap();
        let mode = std::fs::metadata(&first.key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = load_or_create(&data).unwrap();
        assert_eq!(first.sha256, again.sha256);
        assert_eq!(fingerprint(&first.cert).unwrap(), first.sha256);
        // The files load as a TLS server configuration.
        crate::tls::server_config(&first.cert, &first.key).unwrap();
    }

    #[test]
    fn a_damaged_identity_is_an_error_not_a_new_identity() {
        let dir = tempfile::tempdir().unwrap();
        let first = load_or_create(dir.path()).unwrap();
        std::fs::write(&first.cert, "not a certificate").unwrap();
        let err = load_or_create(dir.path()).unwrap_err();
        assert!(matches!(err, IdentityError::Certificate { .. }), "{err}");
        std::fs::remove_file(&first.cert).unwrap();
        let err = load_or_create(dir.path()).unwrap_err();
        assert!(err.to_string().contains("incomplete"), "{err}");
        assert!(!first.cert.exists(), "nothing was regenerated");
    }
}
