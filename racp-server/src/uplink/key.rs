//! The host's NATS identity: an nkey made at first use in the data directory (0600). Its seed
//! never leaves the host; the gateway's operator allows its public key (`pi-host gateway-key`
//! prints it, `pi-gateway enroll` turns it into the NATS user with this host's permissions).

use std::path::Path;

const KEY_FILE: &str = "gateway.nk";

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot read or write the gateway key {path}: {source}")]
    Io {
        path: String,
        source: std::io::Error,
    },
    #[error(
        "the gateway key {path} is damaged: {reason}; remove it to make a new one and enroll the host again"
    )]
    Damaged { path: String, reason: String },
}

pub struct HostKey {
    pub seed: String,
    /// The public key (`U…`) the NATS server knows the host by.
    pub public: String,
}

impl HostKey {
    /// The key pair, to sign with (a gateway signs its routed calls with its key).
    pub fn pair(&self) -> Result<nkeys::KeyPair, KeyError> {
        nkeys::KeyPair::from_seed(&self.seed).map_err(|e| KeyError::Damaged {
            path: KEY_FILE.to_string(),
            reason: e.to_string(),
        })
    }
}

pub fn load_or_create(data_dir: &Path) -> Result<HostKey, KeyError> {
    let path = data_dir.join(KEY_FILE);
    let shown = path.display().to_string();
    let io = |source| KeyError::Io {
        path: shown.clone(),
        source,
    };
    let seed = match std::fs::read_to_string(&path) {
        Ok(seed) => seed.trim().to_string(),
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
            crate::private_file::create_private_dir(data_dir).map_err(io)?;
            let fresh = nkeys::KeyPair::new_user();
            let seed = fresh.seed().map_err(|e| KeyError::Damaged {
                path: shown.clone(),
                reason: e.to_string(),
            })?;
            crate::private_file::write_private(&path, seed.as_bytes()).map_err(io)?;
            seed
        }
        Err(err) => return Err(io(err)),
    };
    let pair = nkeys::KeyPair::from_seed(&seed).map_err(|e| KeyError::Damaged {
        path: shown.clone(),
        reason: e.to_string(),
    })?;
    Ok(HostKey {
        public: pair.public_key(),
        seed,
    })
}
