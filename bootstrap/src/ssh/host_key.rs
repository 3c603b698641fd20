//! Host keys: the known_hosts check and what to do with a host seen for the first time.
//!
//! The check follows the OpenSSH client, so that the two never disagree about the same files
//! (docs/reliability.md 4.9 has the attack this closes and the tests that hold it):
//!
//! - Every file `ssh` reads is read (the user files, then the global ones), and the decision is
//!   made over all of them at once; a new host is recorded in the first user file.
//! - The name looked up is [`known_hosts_name`]: `HostKeyAlias` lowercased, else the host
//!   canonicalized the way `ssh` does (names lowercased, IP addresses in their numeric canonical
//!   form), bare for port 22 and `[host]:port` otherwise. Plain names, `*`/`?` patterns, `!`
//!   negation and hashed (`|1|salt|hash`) names are all matched against that one form.
//! - Every plain key on record for the name counts, whatever its type or curve: a host with any
//!   key on record is known, and an offered key that matches none of them has CHANGED. A changed
//!   key is refused under every policy and never recorded, and nobody is asked about it.
//! - `@revoked` refuses a key for the hosts it names; `@cert-authority` lines are CAs, not keys
//!   on record (plain host keys are all this client accepts); unknown markers void the line.
//! - For a port other than 22 with no key on record, a matching key under the bare host name is
//!   accepted, as `ssh` does.
//!
//! The files are read here rather than with russh's helper, which splits fields on single spaces
//! only (a tab-separated line would read as "unknown", and a changed key would then be learned
//! instead of refused), ignores `@revoked`, and compares keys of the same type only.

use crate::ssh::{ChangedHostKey, SshError};
use russh::keys::{HashAlg, PublicKey};
use std::io::Write;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A host seen for the first time.
#[derive(Debug, Clone)]
pub struct UnknownHost {
    /// `host` or `[host]:port` (or the HostKeyAlias), as known_hosts writes it.
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
    /// Ask a person; `true` trusts and records it. Runs on a blocking thread. Never asked about
    /// a host that has a key on record.
    Ask(Arc<dyn Fn(&UnknownHost) -> bool + Send + Sync>),
}

/// One host's lookup in its known_hosts files.
pub(crate) struct KnownHostsCheck<'a> {
    pub host: &'a str,
    pub port: u16,
    /// The config's HostKeyAlias: looked up and recorded instead of the host and port.
    pub host_key_alias: Option<&'a str>,
    /// Read first, and where a new host is recorded.
    pub known_hosts: &'a Path,
    /// Read too (the other user files, then the global ones), as `ssh` reads them all.
    pub other_known_hosts: &'a [PathBuf],
}

/// The name a host's keys are filed under in known_hosts, as the OpenSSH client forms it:
/// the HostKeyAlias lowercased when there is one, else [`canonical_host`] of the host, bare for
/// port 22 and `[host]:port` for any other port.
pub fn known_hosts_name(host: &str, port: u16, host_key_alias: Option<&str>) -> String {
    match host_key_alias {
        Some(alias) => alias.to_ascii_lowercase(),
        None => with_port(&canonical_host(host), port),
    }
}

fn with_port(host: &str, port: u16) -> String {
    if port == 22 {
        host.to_string()
    } else {
        format!("[{host}]:{port}")
    }
}

/// A host as `ssh` names it for known_hosts: an IP address in its canonical numeric form (the
/// text as given when that differs only in case, as `ssh` keeps it then), anything else that
/// looks like an address (a scoped IPv6 address) as given, and a name in ASCII lowercase. A
/// trailing dot is kept: `ssh` strips it only when CanonicalizeHostname is on, so `box.` and
/// `box` are two names to it, and so to this check.
pub fn canonical_host(host: &str) -> String {
    if let Some(canonical) = numeric_address(host) {
        return if canonical.eq_ignore_ascii_case(host) {
            host.to_string()
        } else {
            canonical
        };
    }
    let looks_like_address =
        host.contains(['%', ':']) || host.bytes().all(|b| b.is_ascii_digit() || b == b'.');
    if looks_like_address {
        host.to_string()
    } else {
        host.to_ascii_lowercase()
    }
}

/// The canonical text of a numeric IPv4 or IPv6 address, as the C library's
/// `getaddrinfo(AI_NUMERICHOST)` and `getnameinfo(NI_NUMERICHOST)` give it to `ssh`: IPv4 in
/// any `inet_aton` form (`127.1`, `0x7f.0.0.1`), IPv6 compressed in lowercase.
fn numeric_address(host: &str) -> Option<String> {
    if host.contains(':') {
        let address: Ipv6Addr = host.parse().ok()?;
        let s = address.segments();
        // inet_ntop writes an IPv4-compatible address (::a.b.c.d) with a dotted tail; Rust
        // would write ::102:304.
        if s[..6] == [0; 6] && s[6] != 0 {
            let tail = (u32::from(s[6]) << 16) | u32::from(s[7]);
            return Some(format!("::{}", Ipv4Addr::from(tail)));
        }
        return Some(address.to_string());
    }
    inet_aton(host).map(|address| address.to_string())
}

/// `inet_aton`: one to four parts, each decimal, octal (leading `0`) or hex (`0x`); the last
/// part fills the bytes that are left.
fn inet_aton(text: &str) -> Option<Ipv4Addr> {
    let parts = text
        .split('.')
        .map(aton_part)
        .collect::<Option<Vec<u64>>>()?;
    let (last, leading) = parts.split_last()?;
    if leading.len() > 3 || leading.iter().any(|part| *part > 0xff) {
        return None;
    }
    let room = 32 - 8 * leading.len() as u32;
    if *last >= 1u64 << room {
        return None;
    }
    let mut value = *last;
    for (index, part) in leading.iter().enumerate() {
        value |= part << (24 - 8 * index as u32);
    }
    u32::try_from(value).ok().map(Ipv4Addr::from)
}

fn aton_part(part: &str) -> Option<u64> {
    if !part.bytes().next()?.is_ascii_digit() {
        return None;
    }
    let (digits, radix) =
        if let Some(hex) = part.strip_prefix("0x").or_else(|| part.strip_prefix("0X")) {
            (hex, 16)
        } else if let Some(octal) = part.strip_prefix('0') {
            (octal, 8)
        } else {
            (part, 10)
        };
    if digits.is_empty() {
        return Some(0);
    }
    if !digits.chars().all(|c| c.is_digit(radix)) {
        return None;
    }
    u64::from_str_radix(digits, radix)
        .ok()
        .filter(|value| *value <= u64::from(u32::MAX))
}

/// Characters `ssh` never writes into a known_hosts name (it checks the lookup and refuses to
/// record), plus `,` and whitespace, which would turn the recorded name into a pattern list.
fn recordable(host: &str) -> bool {
    !host
        .chars()
        .any(|c| "@?*#[]|'\"\\,".contains(c) || c.is_whitespace() || c.is_control())
}

/// A line of one of the files: the file's index (0: the one new hosts are recorded in) and the
/// line number.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Place {
    file: usize,
    line: usize,
}

/// What the files say about a key.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Verdict {
    /// A key on record for the name is this key.
    Known { at: Place },
    /// No key on record for the name.
    Unknown,
    /// Keys are on record for the name and none is this key; `at` and `recorded` are the last
    /// of them, the one `ssh` reports as the offending key.
    Changed { at: Place, recorded: PublicKey },
    /// An `@revoked` line for the name holds this key.
    Revoked { at: Place },
}

impl KnownHostsCheck<'_> {
    fn name(&self) -> String {
        known_hosts_name(self.host, self.port, self.host_key_alias)
    }

    /// Where `ssh` looks next when the name with a port has no key on record: the bare host.
    fn name_without_port(&self) -> Option<String> {
        (self.host_key_alias.is_none() && self.port != 22).then(|| canonical_host(self.host))
    }

    /// What `texts` (the files' contents, in order) say about `key` for this host.
    fn lookup(&self, texts: &[String], key: &PublicKey) -> Verdict {
        match lookup(texts, &self.name(), key) {
            Verdict::Unknown => match self.name_without_port() {
                // A revoked key stays refused here, which `ssh` does not insist on: it would go
                // on to treat the host as new.
                Some(bare) => match lookup(texts, &bare, key) {
                    verdict @ (Verdict::Known { .. } | Verdict::Revoked { .. }) => verdict,
                    Verdict::Unknown | Verdict::Changed { .. } => Verdict::Unknown,
                },
                None => Verdict::Unknown,
            },
            verdict => verdict,
        }
    }

    /// The files this check reads, the one new hosts are recorded in first.
    fn files(&self) -> Vec<&Path> {
        std::iter::once(self.known_hosts)
            .chain(self.other_known_hosts.iter().map(PathBuf::as_path))
            .collect()
    }

    pub(crate) async fn verify(
        &self,
        key: &PublicKey,
        policy: &HostKeyPolicy,
    ) -> Result<bool, SshError> {
        let name = self.name();
        let fingerprint = key.fingerprint(HashAlg::Sha256).to_string();
        let files = self.files();
        let texts = read_all(&files)?;
        let file_name = |place: Place| {
            files
                .get(place.file)
                .map(|file| file.display().to_string())
                .unwrap_or_default()
        };
        match self.lookup(&texts, key) {
            Verdict::Known { at } => {
                tracing::debug!(host = %name, known_hosts = %file_name(at), line = at.line, "host key known");
                Ok(true)
            }
            Verdict::Changed { at, recorded } => {
                let (known_hosts, line) = (file_name(at), at.line);
                let recorded_fingerprint = recorded.fingerprint(HashAlg::Sha256).to_string();
                tracing::warn!(host = %name, %known_hosts, line, %fingerprint, %recorded_fingerprint, "host key changed");
                Err(SshError::HostKeyChanged(Box::new(ChangedHostKey {
                    host: name,
                    known_hosts,
                    line,
                    fingerprint,
                    algorithm: key.algorithm().to_string(),
                    recorded_fingerprint,
                    recorded_algorithm: recorded.algorithm().to_string(),
                })))
            }
            Verdict::Revoked { at } => {
                let (known_hosts, line) = (file_name(at), at.line);
                tracing::warn!(host = %name, %known_hosts, line, %fingerprint, "host key revoked");
                Err(SshError::HostKeyRevoked {
                    host: name,
                    known_hosts,
                    line,
                    fingerprint,
                })
            }
            Verdict::Unknown => self.first_seen(name, fingerprint, key, policy).await,
        }
    }

    /// A host with no key on record: recorded when `policy` trusts it, else refused.
    async fn first_seen(
        &self,
        name: String,
        fingerprint: String,
        key: &PublicKey,
        policy: &HostKeyPolicy,
    ) -> Result<bool, SshError> {
        let known_hosts = self.known_hosts.display().to_string();
        let host_part = match self.host_key_alias {
            Some(_) => name.clone(),
            None => canonical_host(self.host),
        };
        // Said under every policy: --accept-new would not help.
        if !recordable(&host_part) {
            return Err(SshError::KnownHosts {
                known_hosts,
                reason: format!(
                    "{name} is not in it (key {fingerprint}), and a name with any of @?*#[]|'\"\\, or spaces is never recorded; add the key by hand"
                ),
            });
        }
        let unknown = UnknownHost {
            host: name.clone(),
            fingerprint: fingerprint.clone(),
            algorithm: key.algorithm().to_string(),
            known_hosts: self.known_hosts.to_path_buf(),
        };
        if !policy.trusts(unknown).await {
            return Err(SshError::HostKeyUnknown {
                host: name,
                known_hosts,
                fingerprint,
            });
        }
        tracing::info!(host = %name, %known_hosts, %fingerprint, "recording a new host key");
        learn(self.known_hosts, &name, key).map_err(|err| SshError::KnownHosts {
            known_hosts,
            reason: format!("cannot record the new host: {err}"),
        })?;
        Ok(true)
    }
}

impl HostKeyPolicy {
    /// Whether a host seen for the first time is trusted (and so recorded).
    async fn trusts(&self, unknown: UnknownHost) -> bool {
        match self {
            HostKeyPolicy::Strict => false,
            HostKeyPolicy::AcceptNew => true,
            HostKeyPolicy::Ask(ask) => {
                let ask = ask.clone();
                tokio::task::spawn_blocking(move || ask(&unknown))
                    .await
                    .unwrap_or(false)
            }
        }
    }
}

/// The texts of `files`, in order; a missing file reads as empty.
fn read_all(files: &[&Path]) -> Result<Vec<String>, SshError> {
    let mut texts = Vec::with_capacity(files.len());
    for file in files {
        match std::fs::read_to_string(file) {
            Ok(text) => texts.push(text),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => texts.push(String::new()),
            // A file that cannot be read may hold the key on record: refuse rather than
            // take the host for new.
            Err(err) => {
                return Err(SshError::KnownHosts {
                    known_hosts: file.display().to_string(),
                    reason: err.to_string(),
                });
            }
        }
    }
    Ok(texts)
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Marker {
    None,
    CertAuthority,
    Revoked,
}

/// A line of a file whose names match.
struct Entry {
    at: Place,
    marker: Marker,
    key: PublicKey,
}

/// The lines for `name`, read as `ssh` reads them: fields split on spaces and tabs, `#`
/// comments, at most one marker (an unknown one voids the line), and lines whose names or key
/// cannot be read skipped.
fn entries(text: &str, name: &str, file: usize, found: &mut Vec<Entry>) {
    for (index, line) in text.split('\n').enumerate() {
        let mut fields = line.split([' ', '\t']).filter(|field| !field.is_empty());
        let Some(mut first) = fields.next() else {
            continue;
        };
        if first.starts_with('#') {
            continue;
        }
        let mut marker = Marker::None;
        while first.starts_with('@') {
            marker = match (marker, first) {
                (Marker::None, "@cert-authority") => Marker::CertAuthority,
                (Marker::None, "@revoked") => Marker::Revoked,
                _ => break,
            };
            let Some(next) = fields.next() else { break };
            first = next;
        }
        if first.starts_with('@') {
            continue;
        }
        let (Some(kind), Some(blob)) = (fields.next(), fields.next()) else {
            continue;
        };
        if !host_matches(first, name) {
            continue;
        }
        let Ok(key) = PublicKey::from_openssh(&format!("{kind} {blob}")) else {
            continue;
        };
        found.push(Entry {
            at: Place {
                file,
                line: index + 1,
            },
            marker,
            key,
        });
    }
}

/// What the files (their texts, in order) say about `key` for `name`, the way `ssh` decides
/// it over all of them at once: the first plain key on record that equals it makes it known,
/// else any plain key on record makes it changed (any type, any curve); an `@revoked` line
/// holding it overrides both.
fn lookup(texts: &[String], name: &str, key: &PublicKey) -> Verdict {
    let mut found = Vec::new();
    for (file, text) in texts.iter().enumerate() {
        entries(text, name, file, &mut found);
    }
    let mut verdict = Verdict::Unknown;
    for entry in found.iter().filter(|e| e.marker == Marker::None) {
        if entry.key.key_data() == key.key_data() {
            verdict = Verdict::Known { at: entry.at };
            break;
        }
        verdict = Verdict::Changed {
            at: entry.at,
            recorded: entry.key.clone(),
        };
    }
    let revoked = found
        .iter()
        .find(|e| e.marker == Marker::Revoked && e.key.key_data() == key.key_data());
    match revoked {
        Some(entry) => Verdict::Revoked { at: entry.at },
        None => verdict,
    }
}

/// Whether a line's names match `name`: a hashed field (`|1|…`) as a whole, else a comma list
/// of patterns compared in lowercase, where a matching `!pattern` rules the line out.
fn host_matches(names: &str, name: &str) -> bool {
    if names.starts_with('|') {
        return hashed_matches(names, name);
    }
    let name = name.to_ascii_lowercase();
    let mut matched = false;
    for pattern in names.split(',') {
        let (negated, pattern) = match pattern.strip_prefix('!') {
            Some(rest) => (true, rest),
            None => (false, pattern),
        };
        // ssh gives up on the whole list at a pattern this long.
        if pattern.len() >= 1023 {
            return false;
        }
        if glob(&pattern.to_ascii_lowercase(), &name) {
            if negated {
                return false;
            }
            matched = true;
        }
    }
    matched
}

/// `|1|salt|hash`: HMAC-SHA1 of the name keyed by a 20-byte salt (OpenSSH's HashKnownHosts),
/// compared as the text `ssh` would write for it. The name is hashed exactly as given, so it
/// must already be canonical: `[LOCALHOST]:2299` and `[localhost]:2299` hash differently.
fn hashed_matches(names: &str, name: &str) -> bool {
    use base64::Engine;
    let engine = base64::engine::general_purpose::STANDARD;
    let Some((salt, _)) = names
        .strip_prefix("|1|")
        .and_then(|rest| rest.split_once('|'))
    else {
        return false;
    };
    let Ok(salt) = engine.decode(salt) else {
        return false;
    };
    if salt.len() != 20 {
        return false;
    }
    let key = ring::hmac::Key::new(ring::hmac::HMAC_SHA1_FOR_LEGACY_USE_ONLY, &salt);
    let mac = ring::hmac::sign(&key, name.as_bytes());
    let expected = format!(
        "|1|{}|{}",
        engine.encode(&salt),
        engine.encode(mac.as_ref())
    );
    expected == names
}

/// OpenSSH patterns: `*` any run, `?` one character (both sides already lowercase).
fn glob(pattern: &str, name: &str) -> bool {
    fn go(p: &[u8], n: &[u8]) -> bool {
        match p.split_first() {
            None => n.is_empty(),
            Some((b'*', rest)) => (0..=n.len()).any(|skip| go(rest, &n[skip..])),
            Some((b'?', rest)) => !n.is_empty() && go(rest, &n[1..]),
            Some((c, rest)) => n.first() == Some(c) && go(rest, &n[1..]),
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

    // Made with ssh-keygen for these tests.
    const ED_A: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIOsNS5l8q3ltJOAAiTyruCSYpsHK+yiU0y8u18+e74Pb";
    const ED_B: &str =
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIB/cz+KPPPcI3/b1oAFey0NUgusMGSz3gfGQ1hfwqGnX";
    const RSA: &str = "ssh-rsa AAAAB3NzaC1yc2EAAAADAQABAAAAgQCrcocJqIcBK2BvPNiErS1MzAEP38nrAycuoIPzaOBwxT6OVZQKq0o6sXi13Q2Dz/iD0rbXDpABPIIKWk+2hCaTAtPYlIOhfdjz5oshV9bJaxV84D/zfw4WB7MZg5cAHyiP8YqDJyXBiuNz6x599+WfJlrEKstYtgNvphP6sN8TLw==";
    const P256: &str = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBMYfWpiPS6q3qeWiFFKAEY4TerUAKayFNnGMxAcGGQIe4ioSZaS3jJzpyug7AZZFY0wDYr8LiwnoH+PscZiEJzY=";
    const P256_B: &str = "ecdsa-sha2-nistp256 AAAAE2VjZHNhLXNoYTItbmlzdHAyNTYAAAAIbmlzdHAyNTYAAABBBLkmNTqjPZ4dYzQ9h6T2O0QLWBZRsdu8P09WHV4OzTwXUejURZ71oU8f2N3o4h6KGr4Tlk/qxzp30HXreu2YMsY=";
    const P384: &str = "ecdsa-sha2-nistp384 AAAAE2VjZHNhLXNoYTItbmlzdHAzODQAAAAIbmlzdHAzODQAAABhBHFxuMDoead+DNl2Bzkah7E14vJ1ogB64gWohZaO9HifXVQr2vtFoiYqqAOezKAhbaUYaSoDd0TzbMG0/slI0q5IBBhaDfrc8WzfF+1zFAkyVQkslakJ3yZd/fAKf0aIcA==";
    // `ssh-keygen -H` of "[localhost]:2299 ED_A" and of "box.example ED_A".
    const HASHED_LOCALHOST_2299: &str =
        "|1|ZAFsmNCrRHKyq10nNdd2rGUEkF4=|g0mW9hzHrMGPYb6lbUPp3UbFsig=";
    const HASHED_BOX_EXAMPLE: &str = "|1|RBjz92ayVZSSbEM0CDvXjQ9op70=|cTUcrjab5DhtHMREdqi2/WmEk8s=";

    fn key(text: &str) -> PublicKey {
        PublicKey::from_openssh(text).unwrap()
    }

    /// `known:LINE`, `changed:LINE:TYPE`, ...; `FILE/LINE` for a file after the first.
    fn label(verdict: &Verdict) -> String {
        let place = |at: &Place| match at.file {
            0 => at.line.to_string(),
            file => format!("{file}/{}", at.line),
        };
        match verdict {
            Verdict::Known { at } => format!("known:{}", place(at)),
            Verdict::Unknown => "unknown".into(),
            Verdict::Changed { at, recorded } => {
                format!("changed:{}:{}", place(at), recorded.algorithm())
            }
            Verdict::Revoked { at } => format!("revoked:{}", place(at)),
        }
    }

    /// What the check says for `target` (as typed: host and port) with `offered`.
    fn decide(file: &str, host: &str, port: u16, alias: Option<&str>, offered: &str) -> String {
        decide_files(&[file], host, port, alias, offered)
    }

    fn decide_files(
        files: &[&str],
        host: &str,
        port: u16,
        alias: Option<&str>,
        offered: &str,
    ) -> String {
        let check = KnownHostsCheck {
            host,
            port,
            host_key_alias: alias,
            known_hosts: Path::new("/nonexistent"),
            other_known_hosts: &[],
        };
        let texts: Vec<String> = files.iter().map(|f| f.to_string()).collect();
        label(&check.lookup(&texts, &key(offered)))
    }

    #[test]
    fn a_table_of_known_hosts_files_and_offered_keys() {
        let h = HASHED_LOCALHOST_2299;
        #[rustfmt::skip]
        let cases: &[(&str, String, &str, u16, &str, &str)] = &[
            // (what, file, host, port, offered, verdict)
            ("plain, same key", format!("[127.0.0.1]:2222 {ED_A}\n"), "127.0.0.1", 2222, ED_A, "known:1"),
            ("plain, other key", format!("[127.0.0.1]:2222 {ED_A}\n"), "127.0.0.1", 2222, ED_B, "changed:1:ssh-ed25519"),
            ("plain, other port", format!("[127.0.0.1]:2222 {ED_A}\n"), "127.0.0.1", 2223, ED_B, "unknown"),
            ("comment and blank lines", format!("# x\n\n  \n[127.0.0.1]:2222 {ED_A}\n"), "127.0.0.1", 2222, ED_B, "changed:4:ssh-ed25519"),
            ("tabs", format!("[127.0.0.1]:2222\t{}\n", ED_A.replace(' ', "\t")), "127.0.0.1", 2222, ED_B, "changed:1:ssh-ed25519"),
            ("plain, mixed-case target", format!("[localhost]:2299 {ED_A}\n"), "LOCALHOST", 2299, ED_B, "changed:1:ssh-ed25519"),
            ("plain, mixed-case entry", format!("[LocalHost]:2299 {ED_A}\n"), "localhost", 2299, ED_B, "changed:1:ssh-ed25519"),
            ("hashed, same key", format!("{h} {ED_A}\n"), "localhost", 2299, ED_A, "known:1"),
            ("hashed, mixed-case target, same key", format!("{h} {ED_A}\n"), "LOCALHOST", 2299, ED_A, "known:1"),
            ("hashed, mixed-case target, other key", format!("{h} {ED_A}\n"), "LOCALHOST", 2299, ED_B, "changed:1:ssh-ed25519"),
            ("hashed, mixed-case target, rsa offered", format!("{h} {ED_A}\n"), "LocalHost", 2299, RSA, "changed:1:ssh-ed25519"),
            ("hashed, other port", format!("{h} {ED_A}\n"), "localhost", 2298, ED_B, "unknown"),
            ("hashed port 22", format!("{HASHED_BOX_EXAMPLE} {ED_A}\n"), "Box.Example", 22, ED_B, "changed:1:ssh-ed25519"),
            ("hashed field with a bad salt", format!("|1|AAAA|AAAA {ED_A}\n"), "localhost", 2299, ED_B, "unknown"),
            ("pattern", format!("*.example.org {ED_A}\n"), "BOX.example.org", 22, ED_B, "changed:1:ssh-ed25519"),
            ("pattern ?", format!("box?.example.org {ED_A}\n"), "box1.example.org", 22, ED_A, "known:1"),
            ("pattern with port", format!("[*.example.org]:2200 {ED_A}\n"), "box.example.org", 2200, ED_B, "changed:1:ssh-ed25519"),
            ("negation", format!("*.example.org,!bad.example.org {ED_A}\n"), "BAD.example.org", 22, ED_B, "unknown"),
            ("negation elsewhere", format!("*.example.org,!bad.example.org {ED_A}\n"), "good.example.org", 22, ED_B, "changed:1:ssh-ed25519"),
            ("comma list", format!("gate,box {ED_A}\n"), "box", 22, ED_B, "changed:1:ssh-ed25519"),
            ("port 22 is the bare name", format!("[box]:22 {ED_A}\n"), "box", 22, ED_B, "unknown"),
            ("bare name covers port 22", format!("box {ED_A}\n"), "box", 22, ED_B, "changed:1:ssh-ed25519"),
            ("bare name, same key, other port", format!("box {ED_A}\n"), "box", 2222, ED_A, "known:1"),
            ("bare name, other key, other port", format!("box {ED_A}\n"), "box", 2222, ED_B, "unknown"),
            ("ed25519 on record, rsa offered", format!("box {ED_A}\n"), "box", 22, RSA, "changed:1:ssh-ed25519"),
            ("rsa on record, ed25519 offered", format!("box {RSA}\n"), "box", 22, ED_A, "changed:1:ssh-rsa"),
            ("p256 on record, p384 offered", format!("box {P256}\n"), "box", 22, P384, "changed:1:ecdsa-sha2-nistp256"),
            ("p384 on record, p256 offered", format!("box {P384}\n"), "box", 22, P256, "changed:1:ecdsa-sha2-nistp384"),
            ("p256 on record, other p256 offered", format!("box {P256}\n"), "box", 22, P256_B, "changed:1:ecdsa-sha2-nistp256"),
            ("a second key matches", format!("box {ED_A}\nbox {RSA}\nbox {P384}\n"), "box", 22, RSA, "known:2"),
            ("a second key matches through a pattern", format!("box {ED_A}\nb* {P256}\n"), "box", 22, P256, "known:2"),
            ("none of several matches: the last is reported", format!("box {ED_A}\nbox {RSA}\nother {P256}\n"), "box", 22, P384, "changed:2:ssh-rsa"),
            ("revoked", format!("@revoked * {ED_A}\nbox {ED_A}\n"), "box", 22, ED_A, "revoked:1"),
            ("revoked for another host only", format!("@revoked other {ED_A}\nbox {ED_A}\n"), "box", 22, ED_A, "known:2"),
            ("revoked other key: known stays known", format!("@revoked * {ED_B}\nbox {ED_A}\n"), "box", 22, ED_A, "known:2"),
            ("revoked and nothing else on record", format!("@revoked * {ED_A}\n"), "box", 22, ED_A, "revoked:1"),
            ("a revoked line is not a key on record", format!("@revoked box {ED_A}\n"), "box", 22, ED_B, "unknown"),
            ("a CA is not a key on record", format!("@cert-authority box {ED_A}\n"), "box", 22, ED_B, "unknown"),
            ("a CA and a plain key", format!("@cert-authority * {ED_B}\nbox {ED_A}\n"), "box", 22, ED_B, "changed:2:ssh-ed25519"),
            ("an unknown marker voids the line", format!("@bogus box {ED_A}\n"), "box", 22, ED_B, "unknown"),
            ("two markers void the line", format!("@revoked @revoked box {ED_A}\n"), "box", 22, ED_A, "unknown"),
            ("an unreadable key is skipped", format!("box ssh-ed25519 AAAAnotakey\nbox {ED_A}\n"), "box", 22, ED_B, "changed:2:ssh-ed25519"),
            ("ipv6 literal", format!("[::1]:2222 {ED_A}\n"), "0:0:0:0:0:0:0:1", 2222, ED_B, "changed:1:ssh-ed25519"),
            ("ipv6 literal, port 22", format!("fe80::1 {ED_A}\n"), "FE80:0::1", 22, ED_B, "changed:1:ssh-ed25519"),
            ("ipv4 short form", format!("127.0.0.1 {ED_A}\n"), "127.1", 22, ED_B, "changed:1:ssh-ed25519"),
            ("trailing dot is another name", format!("box.example {ED_A}\n"), "box.example.", 22, ED_B, "unknown"),
            ("trailing dot on record", format!("box.example. {ED_A}\n"), "BOX.example.", 22, ED_B, "changed:1:ssh-ed25519"),
        ];
        let mut failures = Vec::new();
        for (what, file, host, port, offered, expected) in cases {
            let got = decide(file, host, *port, None, offered);
            if got != *expected {
                failures.push(format!("{what}: expected {expected}, got {got}"));
            }
        }
        assert!(failures.is_empty(), "{}", failures.join("\n"));
    }

    #[test]
    fn every_file_counts_as_ssh_reads_them_all() {
        let user = format!("other {ED_A}\n");
        let global = format!("# global\nbox {ED_A}\n");
        // A key on record only in a global file: the host is known, a new key changed.
        assert_eq!(
            decide_files(&[&user, &global], "box", 22, None, ED_A),
            "known:1/2"
        );
        assert_eq!(
            decide_files(&[&user, &global], "box", 22, None, RSA),
            "changed:1/2:ssh-ed25519"
        );
        // The first match wins across files; revocation anywhere wins over it.
        let second = format!("box {RSA}\n");
        assert_eq!(
            decide_files(&[&global, &second], "box", 22, None, RSA),
            "known:1/1"
        );
        let revoked = format!("@revoked * {RSA}\n");
        assert_eq!(
            decide_files(&[&second, &revoked], "box", 22, None, RSA),
            "revoked:1/1"
        );
        assert_eq!(decide_files(&[&user, ""], "box", 22, None, RSA), "unknown");
    }

    #[test]
    fn a_host_key_alias_is_the_name_whatever_the_host_and_port() {
        let file = format!("prod-box {ED_A}\n[10.0.0.5]:2222 {ED_B}\n");
        assert_eq!(
            decide(&file, "10.0.0.5", 2222, Some("Prod-Box"), ED_A),
            "known:1"
        );
        assert_eq!(
            decide(&file, "10.0.0.5", 2222, Some("prod-box"), ED_B),
            "changed:1:ssh-ed25519"
        );
        assert_eq!(
            decide(&file, "10.0.0.5", 2222, Some("other"), ED_B),
            "unknown"
        );
        assert_eq!(known_hosts_name("X", 2222, Some("Prod-Box")), "prod-box");
    }

    #[test]
    fn names_are_canonical_as_ssh_forms_them() {
        for (host, port, name) in [
            ("LOCALHOST", 2299, "[localhost]:2299"),
            ("Box.Example.", 22, "box.example."),
            ("box", 22, "box"),
            ("127.0.0.1", 2222, "[127.0.0.1]:2222"),
            ("127.1", 22, "127.0.0.1"),
            ("0x7f.0.0.1", 22, "127.0.0.1"),
            ("0177.0.0.1", 22, "127.0.0.1"),
            ("2130706433", 22, "127.0.0.1"),
            ("127.0.0.256", 22, "127.0.0.256"),
            ("1.2.3.4.", 22, "1.2.3.4."),
            ("::1", 2222, "[::1]:2222"),
            ("0:0:0:0:0:0:0:1", 22, "::1"),
            ("FE80::1", 22, "FE80::1"),
            ("FE80:0::1", 22, "fe80::1"),
            ("fe80::1%eth0", 22, "fe80::1%eth0"),
            ("::FFFF:127.0.0.1", 22, "::FFFF:127.0.0.1"),
            ("::FFFF:7F00:1", 22, "::ffff:127.0.0.1"),
            ("::1.2.3.4", 22, "::1.2.3.4"),
            ("::2", 22, "::2"),
            ("1:0:0:1:0:0:0:1", 22, "1:0:0:1::1"),
            ("0:0:0:0:0:1:0:0", 22, "::1:0:0"),
        ] {
            assert_eq!(known_hosts_name(host, port, None), name, "{host}:{port}");
        }
        assert!(recordable("box.example"));
        for bad in ["a,b", "a*", "a?b", "a[b", "x|y", "a b", "a@b"] {
            assert!(!recordable(bad), "{bad}");
        }
    }

    #[test]
    fn learning_appends_a_line_that_reads_back_as_known() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ssh/known_hosts");
        learn(&path, "[127.0.0.1]:2222", &key(ED_A)).unwrap();
        learn(&path, "box", &key(ED_B)).unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        assert_eq!(text.lines().count(), 2);
        let texts = [text];
        assert_eq!(
            label(&lookup(&texts, "[127.0.0.1]:2222", &key(ED_A))),
            "known:1"
        );
        assert_eq!(label(&lookup(&texts, "box", &key(ED_B))), "known:2");
    }

    fn verify_with(
        file: &str,
        host: &str,
        port: u16,
        offered: &str,
        policy: HostKeyPolicy,
    ) -> (Result<bool, SshError>, String) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("known_hosts");
        std::fs::write(&path, file).unwrap();
        let check = KnownHostsCheck {
            host,
            port,
            host_key_alias: None,
            known_hosts: &path,
            other_known_hosts: &[],
        };
        let runtime = tokio::runtime::Builder::new_current_thread()
            .build()
            .unwrap();
        let result = runtime.block_on(check.verify(&key(offered), &policy));
        (result, std::fs::read_to_string(&path).unwrap())
    }

    #[test]
    fn a_changed_key_is_refused_unrecorded_and_unasked_under_every_policy() {
        let file = format!("[localhost]:2299 {ED_A}\n");
        let asked = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let flag = asked.clone();
        let ask = HostKeyPolicy::Ask(Arc::new(move |_: &UnknownHost| {
            flag.store(true, std::sync::atomic::Ordering::SeqCst);
            true
        }));
        for policy in [HostKeyPolicy::Strict, HostKeyPolicy::AcceptNew, ask] {
            let (result, after) = verify_with(&file, "LOCALHOST", 2299, RSA, policy);
            match result {
                Err(SshError::HostKeyChanged(changed)) => {
                    let ChangedHostKey {
                        host,
                        line,
                        algorithm,
                        recorded_algorithm,
                        recorded_fingerprint,
                        fingerprint,
                        ..
                    } = *changed;
                    assert_eq!(host, "[localhost]:2299");
                    assert_eq!(line, 1);
                    assert_eq!(algorithm, "ssh-rsa");
                    assert_eq!(recorded_algorithm, "ssh-ed25519");
                    assert_eq!(
                        recorded_fingerprint,
                        key(ED_A).fingerprint(HashAlg::Sha256).to_string()
                    );
                    assert_eq!(
                        fingerprint,
                        key(RSA).fingerprint(HashAlg::Sha256).to_string()
                    );
                }
                other => panic!("expected a changed key, got {other:?}"),
            }
            assert_eq!(after, file, "nothing recorded");
        }
        assert!(!asked.load(std::sync::atomic::Ordering::SeqCst));
    }

    #[test]
    fn a_new_host_is_recorded_under_its_canonical_name_and_an_odd_name_never() {
        let (result, after) = verify_with("", "LocalHost", 2299, ED_A, HostKeyPolicy::AcceptNew);
        assert!(result.unwrap());
        assert_eq!(after, format!("[localhost]:2299 {ED_A}\n"));

        let (result, after) = verify_with("", "a,b", 22, ED_A, HostKeyPolicy::AcceptNew);
        assert!(
            matches!(result, Err(SshError::KnownHosts { .. })),
            "{result:?}"
        );
        assert_eq!(after, "");
        let (result, _) = verify_with("", "a*b", 22, ED_A, HostKeyPolicy::Strict);
        assert!(
            matches!(result, Err(SshError::KnownHosts { .. })),
            "{result:?}"
        );
    }
}
