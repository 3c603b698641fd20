//! Provider API keys set from a desktop (`credential/set`): kept in one 0600 file,
//! `credentials.json` in the data directory, and nowhere else. The host reads them only to list
//! them (provider, time, fingerprint) and to tell the redactor which exact values to scrub;
//! agents get them from the file when they start (docs/protocol.md §7.20).

use super::file::{FileError, Keyed};
use crate::redact::Redactor;
use racp_proto::methods::model::CredentialInfo;
use serde::{Deserialize, Serialize};

pub const FILE: &str = "credentials.json";

#[derive(Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Entry {
    api_key: String,
    set_at: u64,
}

pub struct Credentials(Keyed<Entry>);

impl Credentials {
    /// Reads the file; `redactor` is handed every key's value now and after each change,
    /// under the lock of the file's write, so it never scrubs an older set than the agents get
    /// (and keeps scrubbing a replaced or deleted key, which an agent may still hold).
    pub fn open(data_dir: &std::path::Path, redactor: Redactor) -> Result<Credentials, FileError> {
        let keyed = Keyed::<Entry>::open(data_dir, FILE, "credentials")?.observed(move |entries| {
            redactor.set_secrets(entries.values().map(|e| e.api_key.clone()).collect());
        });
        Ok(Credentials(keyed))
    }

    /// Sets a provider's key, on disk before it returns.
    pub fn set(
        &self,
        provider: &str,
        api_key: &str,
        now: u64,
    ) -> Result<CredentialInfo, FileError> {
        let entry = Entry {
            api_key: api_key.to_string(),
            set_at: now,
        };
        let info = info(provider, &entry);
        self.0.insert(provider, entry)?;
        Ok(info)
    }

    /// Deletes a provider's key; false when it had none.
    pub fn delete(&self, provider: &str) -> Result<bool, FileError> {
        self.0.remove(provider)
    }

    pub fn count(&self) -> usize {
        self.0.lock().len()
    }

    pub fn has(&self, provider: &str) -> bool {
        self.0.lock().contains_key(provider)
    }

    pub fn list(&self) -> Vec<CredentialInfo> {
        self.0.lock().iter().map(|(p, e)| info(p, e)).collect()
    }

    /// Every key's exact value.
    #[cfg(test)]
    pub fn values(&self) -> Vec<String> {
        self.0.lock().values().map(|e| e.api_key.clone()).collect()
    }
}

fn info(provider: &str, entry: &Entry) -> CredentialInfo {
    CredentialInfo {
        provider: provider.to_string(),
        set_at: entry.set_at,
        fingerprint: fingerprint(&entry.api_key),
    }
}

/// `sha256:` and the first 8 hex digits of the key's SHA-256.
pub fn fingerprint(api_key: &str) -> String {
    let digest = ring::digest::digest(&ring::digest::SHA256, api_key.as_bytes());
    let hex: String = digest.as_ref()[..4]
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect();
    format!("sha256:{hex}")
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn keys_persist_in_one_private_file_and_are_listed_without_their_value() {
        let dir = tempfile::tempdir().unwrap();
        let credentials = Credentials::open(dir.path(), Redactor::default()).unwrap();
        let info = credentials.set("openai", "sk-test-0123456789", 7).unwrap();
        assert_eq!(info.fingerprint, fingerprint("sk-test-0123456789"));
        assert!(!format!("{:?}", credentials.list()).contains("0123456789"));
        let path = dir.path().join(FILE);
        let mode = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        let again = Credentials::open(dir.path(), Redactor::default()).unwrap();
        assert_eq!(again.list(), vec![info]);
        assert_eq!(again.values(), ["sk-test-0123456789"]);
        assert!(again.delete("openai").unwrap());
        assert!(!again.delete("openai").unwrap());
        assert!(
            Credentials::open(dir.path(), Redactor::default())
                .unwrap()
                .list()
                .is_empty()
        );
        let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
        assert_eq!(names.len(), 1, "no staged file is left behind");
    }

    #[test]
    fn the_redactor_scrubs_the_keys_of_the_file_as_it_changes() {
        let dir = tempfile::tempdir().unwrap();
        let redactor = Redactor::default();
        let credentials = Credentials::open(dir.path(), redactor.clone()).unwrap();
        credentials.set("custom", "plain-value-0001", 1).unwrap();
        assert_eq!(redactor.text("x plain-value-0001 y"), "x [redacted] y");
        // At open, from the file.
        let reopened = Redactor::default();
        let _again = Credentials::open(dir.path(), reopened.clone()).unwrap();
        assert_eq!(reopened.text("plain-value-0001"), "[redacted]");
        // Deleted (or replaced), it stays scrubbed: an agent started before may still hold it.
        credentials.delete("custom").unwrap();
        assert_eq!(redactor.text("plain-value-0001"), "[redacted]");
    }

    #[test]
    fn a_damaged_file_is_an_error_that_quotes_no_value() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join(FILE);
        std::fs::write(
            &path,
            r#"{"version":1,"credentials":{"x":{"apiKey":7,"setAt":"sk-leak"}}}"#,
        )
        .unwrap();
        let err = Credentials::open(dir.path(), Redactor::default())
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("fix it or move it away"), "{err}");
        assert!(!err.contains("sk-leak"), "{err}");
    }
}
