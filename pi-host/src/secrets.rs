//! Token minting and verification.
//!
//! A token is `<prefix><id>.<secret>`: the id finds the row, and the secret is checked against
//! an HMAC-SHA256 tag with `ring::hmac::verify`, which compares in constant time. The host keeps
//! only tags, keyed by a host secret in a 0600 file, so a copy of the database alone cannot
//! mint or test tokens.

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
pub use racp_server::token::{Presented, split};
use ring::hmac;
use ring::rand::{SecureRandom, SystemRandom};
use std::path::Path;

pub const DEVICE_PREFIX: &str = "pdt_";
pub const PAIRING_PREFIX: &str = "ppt_";
/// Device secrets carry 256 bits.
const DEVICE_SECRET_BYTES: usize = 32;
/// Pairing secrets carry 128 bits; they are single use, short lived and attempt-capped.
const PAIRING_SECRET_BYTES: usize = 16;

#[derive(Debug, thiserror::Error)]
pub enum SecretError {
    #[error("the system random generator failed")]
    Random,
    #[error("cannot read or write the host key {path}: {source}")]
    KeyFile {
        path: String,
        source: std::io::Error,
    },
}

/// The host's HMAC key and random source.
pub struct Secrets {
    key: hmac::Key,
    rng: SystemRandom,
}

/// A freshly minted token: give `token` to the client once, keep `id` and `tag`.
pub struct Minted {
    pub id: String,
    pub token: String,
    pub tag: Vec<u8>,
}

impl Secrets {
    /// Loads the host key from `path`, creating it (mode 0600) on first start.
    pub fn load_or_create(path: &Path) -> Result<Self, SecretError> {
        let rng = SystemRandom::new();
        let key_error = |source| SecretError::KeyFile {
            path: path.display().to_string(),
            source,
        };
        let bytes = if path.exists() {
            let bytes = std::fs::read(path).map_err(key_error)?;
            if bytes.len() != 32 {
                return Err(key_error(std::io::Error::new(
                    std::io::ErrorKind::InvalidData,
                    "host key must be 32 bytes",
                )));
            }
            bytes
        } else {
            let mut bytes = vec![0u8; 32];
            rng.fill(&mut bytes).map_err(|_| SecretError::Random)?;
            racp_server::private_file::write_private(path, &bytes).map_err(key_error)?;
            bytes
        };
        Ok(Secrets {
            key: hmac::Key::new(hmac::HMAC_SHA256, &bytes),
            rng,
        })
    }

    fn random(&self, len: usize) -> Result<Vec<u8>, SecretError> {
        let mut bytes = vec![0u8; len];
        self.rng.fill(&mut bytes).map_err(|_| SecretError::Random)?;
        Ok(bytes)
    }

    /// A random 64-bit value (session epochs).
    pub fn random_u64(&self) -> Result<u64, SecretError> {
        let bytes = self.random(8)?;
        let mut array = [0u8; 8];
        array.copy_from_slice(&bytes);
        Ok(u64::from_le_bytes(array))
    }

    /// A random id with a readable prefix, e.g. `dev_3f9a0c1b2d4e`.
    pub fn new_id(&self, prefix: &str) -> Result<String, SecretError> {
        let bytes = self.random(9)?;
        Ok(format!("{prefix}{}", URL_SAFE_NO_PAD.encode(bytes)))
    }

    pub fn mint_device(&self, id: String) -> Result<Minted, SecretError> {
        self.mint(DEVICE_PREFIX, id, DEVICE_SECRET_BYTES)
    }

    pub fn mint_pairing(&self, id: String) -> Result<Minted, SecretError> {
        self.mint(PAIRING_PREFIX, id, PAIRING_SECRET_BYTES)
    }

    fn mint(&self, prefix: &str, id: String, secret_bytes: usize) -> Result<Minted, SecretError> {
        let secret = URL_SAFE_NO_PAD.encode(self.random(secret_bytes)?);
        let tag = hmac::sign(&self.key, secret.as_bytes()).as_ref().to_vec();
        let token = format!("{prefix}{id}.{secret}");
        Ok(Minted { id, token, tag })
    }

    /// Constant-time check of a presented secret against a stored tag.
    pub fn verify(&self, secret: &str, tag: &[u8]) -> bool {
        hmac::verify(&self.key, secret.as_bytes(), tag).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn minted_tokens_verify_and_others_do_not() {
        let dir = std::env::temp_dir().join(format!("pi-host-secrets-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let secrets = Secrets::load_or_create(&dir.join("host.key")).unwrap();
        let minted = secrets.mint_device("dev_x".into()).unwrap();
        let presented = split(&minted.token, DEVICE_PREFIX).unwrap();
        assert_eq!(presented.id, "dev_x");
        assert!(secrets.verify(presented.secret, &minted.tag));
        assert!(!secrets.verify("wrong", &minted.tag));
        assert!(split(&minted.token, PAIRING_PREFIX).is_none());
        assert!(split("pdt_a.b c", DEVICE_PREFIX).is_none());
        // A reloaded key verifies the same tags.
        let again = Secrets::load_or_create(&dir.join("host.key")).unwrap();
        assert!(again.verify(presented.secret, &minted.tag));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
