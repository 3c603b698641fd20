//! Host keys: the known_hosts check and what to do with a host seen for the first time.
//!
//! The file is read here rather than with russh's helper, which splits fields on single spaces
//! only (a tab-separated line would read as "unknown", and a changed key would then be
//! learned instead of refused) and ignores `@revoked`. Supported: plain and hashed (`|1|`) host
//! names, `[host]:port`, `*`/`?` patterns, `!` negation, and `@revoked`.

use crate::ssh::SshError;
use russh::keys::{HashAlg, PublicKey};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A host seen for the first time.
#[derive(Debug, Clone)]
pub struct UnknownHost {
    /// `host` or `[host]:port`, as known_hosts writes it.
    pub host: String,
    /// `SHA256:…`, as OpenSSH prints it.
    pub fingerprint: String,
    pub algorithm: String,
    pub known_hosts: PathBuf,
}

/// What to do with an unknown host. A changed key is refused under every policy.
#[derive(Clone)]
pub enum HostKeyPolicy {
    /// Refuse it.
    Strict,
    /// Trust it and record it (OpenSSH's `StrictHostKeyChecking accept-new`).
    AcceptNew,
    /// Ask a person; `true` trusts and records it. Runs on a blocking thread.
    Ask(Arc<dyn Fn(&UnknownHost) -> bool + Send + Sync>),
}

/// One host's lookup in one known_hosts file.
pub(crate) struct KnownHostsCheck<'a> {
    pub host: &'a str,
    pub port: u16,
    pub known_hosts: &'a Path,
}

/// What the file says about a key.
#[derive(Debug, PartialEq, Eq)]
enum Verdict {
    Known,
    Unknown,
    Changed { line: usize },
    Revoked { line: usize },
}

impl KnownHostsCheck<'_> {
    fn name(&self) -> String {
        if self.port == 22 {
            self.host.to_string()
        } else {
            format!("[{}]:{}", self.host, self.port)
        }
    }

    pub(crate) async fn verify(
        &self,
        key: &PublicKey,
        policy: &HostKeyPolicy,
    ) -> Result<bool, SshError> {
        let name = self.name();
        let fingerprint = key.fingerprint(HashAlg::Sha256).to_string();
        let known_hosts = self.known_hosts.display().to_string();
        let text = match std::fs::read_to_string(self.known_hosts) {
            Ok(text) => text,
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => String::new(),
            Err(err) => {
                return Err(SshError::KnownHosts {
                    known_hosts,
                    reason: err.to_string(),
                });
            }
        };
        match lookup(&text, &name, key) {
            Verdict::Known => Ok(true),
            Verdict::Changed { line } => Err(SshError::HostKeyChanged {
                host: name,
                known_hosts,
                line,
                fingerprint,
            }),
            Verdict::Revoked { line } => Err(SshError::KnownHosts {
                known_hosts,
                reason: format!("the host key {fingerprint} is marked @revoked on line {line}"),
            }),
            Verdict::Unknown => {
                let unknown = UnknownHost {
                    host: name.clone(),
                    fingerprint: fingerprint.clone(),
                    algorithm: key.algorithm().to_string(),
                    known_hosts: self.known_hosts.to_path_buf(),
                };
                let trusted = match policy {
                    HostKeyPolicy::Strict => false,
                    HostKeyPolicy::AcceptNew => true,
                    HostKeyPolicy::Ask(ask) => {
                        let ask = ask.clone();
                        let question = unknown.clone();
                        tokio::task::spawn_blocking(move || ask(&question))
                            .await
                            .unwrap_or(false)
                    }
                };
                if !trusted {
                    return Err(SshError::HostKeyUnknown {
                        host: name,
                        known_hosts,
                        fingerprint,
                    });
                }
                learn(self.known_hosts, &name, key).map_err(|err| SshError::KnownHosts {
                    known_hosts,
                    reason: format!("cannot record the new host: {err}"),
                })?;
                Ok(true)
            }
        }
    }
}

fn lookup(text: &str, name: &str, key: &PublicKey) -> Verdict {
    let mut verdict = Verdict::Unknown;
    for (index, line) in text.lines().enumerate() {
        let line_number = index + 1;
        let mut fields = line.split_whitespace();
        let Some(mut first) = fields.next() else {
            continue;
        };
        if first.starts_with('#') {
            continue;
        }
        let marker = if first.starts_with('@') {
            let marker = first;
            let Some(hosts) = fields.next() else { continue };
            first = hosts;
            Some(marker)
        } else {
            None
        };
        let (Some(kind), Some(blob)) = (fields.next(), fields.next()) else {
            continue;
        };
        if marker == Some("@cert-authority") || !host_matches(first, name) {
            continue;
        }
        let Ok(recorded) = PublicKey::from_openssh(&format!("{kind} {blob}")) else {
            continue;
        };
        let same = recorded.key_data() == key.key_data();
        if marker == Some("@revoked") {
            if same {
                return Verdict::Revoked { line: line_number };
            }
            continue;
        }
        if same {
            verdict = Verdict::Known;
        } else if recorded.algorithm() == key.algorithm() && verdict != Verdict::Known {
            // Like OpenSSH: another key of the same type on record means the key changed.
            verdict = Verdict::Changed { line: line_number };
        }
    }
    verdict
}

fn host_matches(patterns: &str, name: &str) -> bool {
    let mut matched = false;
    for pattern in patterns.split(',') {
        if let Some(hashed) = pattern.strip_prefix("|1|") {
            if hashed_matches(hashed, name) {
                matched = true;
            }
        } else if let Some(negated) = pattern.strip_prefix('!') {
            if glob(negated, name) {
                return false;
            }
        } else if glob(pattern, name) {
            matched = true;
        }
    }
    matched
}

/// `|1|salt|hash`: HMAC-SHA1 of the name keyed by the salt (OpenSSH's HashKnownHosts).
fn hashed_matches(hashed: &str, name: &str) -> bool {
    use base64::Engine;
    let engine = base64::engine::general_purpose::STANDARD;
    let Some((salt, hash)) = hashed.split_once('|') else {
        return false;
    };
    let (Ok(salt), Ok(hash)) = (engine.decode(salt), engine.decode(hash)) else {
        return false;
    };
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, &salt);
    ring::hmac::verify(&key, name.as_bytes(), &hash).is_ok()
}

/// OpenSSH patterns: `*` any run, `?` one character, case-insensitive.
fn glob(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match p.split_first() {
            None => n.is_empty(),
            Some((b'*', rest)) => (0..=n.len()).any(|skip| go(rest, &n[skip..])),
            Some((b'?', rest)) => !n.is_empty() && go(rest, &n[1..]),
            Some((c, rest)) => {
                n.first().is_some_and(|m| m.eq_ignore_ascii_case(c)) && go(rest, &n[1..])
            }
        }
    }
    go(pattern.as_bytes(), name.as_bytes())
}

/// Appends `name key` to the file, creating it (and a 0700 directory) when missing.
fn learn(path: &Path, name: &str, key: &PublicKey) -> std::io::Result<()> {
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(parent)?;
    }
    let existing = std::fs::read(path).unwrap_or_default();
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o644)
        .open(path)?;
    let key_text = key
        .to_openssh()
        .map_err(|err| std::io::Error::other(err.to_string()))?;
    // Without the comment: only "type blob".
    let mut parts = key_text.split_whitespace();
    let (kind, blob) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let separator = if existing.is_empty() || existing.ends_with(b"\n") {
        ""
    } else {
        "\n"
    };
    file.write_all(format!("{separator}{name} {kind} {blob}\n").as_bytes())
}

#[cfg(test)]
mod tests {
    use super::*;

    const KEY_A: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIPP5Hsxb4wkhjUOohs3HqJLp4IRPASlb33qAT4naZdBH";
    const KEY_B: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFNbp5wNnZJo/zQdKQyjJoEZXF8JtXYc3WCOcRFyEyVe";

    fn key(text: &str) -> PublicKey {
        PublicKey::from_openssh(text).unwrap()
    }

    #[test]
    fn a_recorded_key_is_known_a_different_one_changed_and_a_new_host_unknown() {
        let file = format!("# comment\n[127.0.0.1]:2222 {KEY_A}\nother.example {KEY_B}\n");
        assert_eq!(
            lookup(&file, "[127.0.0.1]:2222", &key(KEY_A)),
            Verdict::Known
        );
        assert_eq!(
            lookup(&file, "[127.0.0.1]:2222", &key(KEY_B)),
            Verdict::Changed { line: 2 }
        );
        assert_eq!(
            lookup(&file, "[127.0.0.1]:2223", &key(KEY_A)),
            Verdict::Unknown
        );
    }

    #[test]
    fn tab_separated_lines_are_read_so_a_changed_key_is_still_caught() {
        let file = format!("[127.0.0.1]:2222\t{}\n", KEY_A.replace(' ', "\t"));
        assert_eq!(
            lookup(&file, "[127.0.0.1]:2222", &key(KEY_B)),
            Verdict::Changed { line: 1 }
        );
    }

    #[test]
    fn patterns_negation_hashes_and_revocation() {
        let file = format!("*.example.org,!bad.example.org {KEY_A}\n");
        assert_eq!(
            lookup(&file, "box.example.org", &key(KEY_A)),
            Verdict::Known
        );
        assert_eq!(
            lookup(&file, "bad.example.org", &key(KEY_A)),
            Verdict::Unknown
        );

        // `ssh-keygen -H` output for the name "hashed.example".
        let salt = [7u8; 20];
        let mac = ring::hmac::sign(
            &ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, &salt),
            b"hashed.example",
        );
        use base64::Engine;
        let b64 = base64::engine::general_purpose::STANDARD;
        let file = format!(
            "|1|{}|{} {KEY_A}\n",
            b64.encode(salt),
            b64.encode(mac.as_ref())
        );
        assert_eq!(lookup(&file, "hashed.example", &key(KEY_A)), Verdict::Known);
        assert_eq!(
            lookup(&file, "other.example", &key(KEY_A)),
            Verdict::Unknown
        );

        let file = format!("@revoked * {KEY_A}\nbox {KEY_A}\n");
        assert_eq!(
            lookup(&file, "box", &key(KEY_A)),
            Verdict::Revoked { line: 1 }
        );
    }

    #[test]
    fn learning_appends_a_line_that_reads_back_as_known() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ssh/known_hosts");
        learn(&path, "[127.0.0.1]:2222", &key(KEY_A)).unwrap();
        learn(&path, "box", &key(KEY_B)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2);
        assert_eq!(
            lookup(&text, "[127.0.0.1]:2222", &key(KEY_A)),
            Verdict::Known
        );
        assert_eq!(lookup(&text, "box", &key(KEY_B)), Verdict::Known);
    }
}
