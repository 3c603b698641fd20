//! What `pi-remote` keeps beside the profiles: the default profile (`pi-remote use`), when each
//! profile last reached its host, and the background forwards' lock and log files.
//!
//! Under the config directory ([`profile::config_dir`]): `default-profile` (one name),
//! `seen/<name>` (seconds since the Unix epoch), `run/<name>.lock` (held with `flock` by the
//! profile's background `connect`, holding its pid) and `run/<name>.log` (its output, 0600).

use crate::remote::profile::{self, DEFAULT_PROFILE};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

/// The file naming the default profile.
pub fn default_file(dir: &Path) -> PathBuf {
    dir.join("default-profile")
}

/// The default profile `pi-remote use` chose, if any (an unreadable or invalid file counts as
/// none: the built-in default applies).
pub fn chosen_default(dir: &Path) -> Option<String> {
    let text = std::fs::read_to_string(default_file(dir)).ok()?;
    let name = text.trim();
    profile::check_name(name).ok().map(|()| name.to_string())
}

/// The profile a command uses: `--profile` or `PI_REMOTE_PROFILE` (`given`), else the one
/// `pi-remote use` chose, else `default`.
pub fn resolve_profile(given: Option<String>) -> String {
    given
        .or_else(|| profile::config_dir().ok().and_then(|d| chosen_default(&d)))
        .unwrap_or_else(|| DEFAULT_PROFILE.to_string())
}

/// The stored profiles' names, sorted.
pub fn profile_names(dir: &Path) -> Vec<String> {
    let Ok(entries) = std::fs::read_dir(dir.join("profiles")) else {
        return Vec::new();
    };
    let mut names: Vec<String> = entries
        .filter_map(|entry| {
            let name = entry.ok()?.file_name().into_string().ok()?;
            let name = name.strip_suffix(".json")?.to_string();
            profile::check_name(&name).ok().map(|()| name)
        })
        .collect();
    names.sort();
    names
}

/// Creates `path`'s directory, 0700.
pub fn private_dir(path: &Path) -> Result<(), String> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(path)
        .map_err(|e| format!("cannot create {}: {e}", path.display()))
}

/// Writes `text` to `path` through a 0600 temporary file renamed into place.
pub fn write_private(path: &Path, text: &str) -> Result<(), String> {
    use std::os::unix::fs::OpenOptionsExt;
    let parent = path.parent().unwrap_or(Path::new("."));
    private_dir(parent)?;
    let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("file");
    let temp = parent.join(format!(".{name}.{}.tmp", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&temp)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .and_then(|()| std::fs::rename(&temp, path));
    if let Err(e) = written {
        let _ = std::fs::remove_file(&temp);
        return Err(format!("cannot write {}: {e}", path.display()));
    }
    Ok(())
}

/// Makes `name` the default profile; refuses a profile that is not stored, naming those that are.
pub fn choose_default(dir: &Path, name: &str) -> Result<PathBuf, String> {
    profile::check_name(name)?;
    let known = profile_names(dir);
    if !known.iter().any(|k| k == name) {
        let listed = if known.is_empty() {
            "there are none yet: `pi-remote connect TARGET` or `pi-remote pair LINK` makes one"
                .to_string()
        } else {
            format!("known profiles: {}", known.join(", "))
        };
        return Err(format!("no profile {name:?}; {listed}"));
    }
    let file = default_file(dir);
    write_private(&file, &format!("{name}\n"))?;
    Ok(file)
}

/// Seconds since the Unix epoch.
pub fn now_secs() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

fn seen_file(dir: &Path, name: &str) -> PathBuf {
    dir.join("seen").join(name)
}

/// Records that profile `name` reached its host now (best effort: a read-only config directory
/// must not fail the command that reached the host).
pub fn touch_seen(name: &str) {
    if profile::check_name(name).is_err() {
        return;
    }
    if let Ok(dir) = profile::config_dir()
        && let Err(error) = write_private(&seen_file(&dir, name), &now_secs().to_string())
    {
        tracing::debug!(%error, "last-seen time not stored");
    }
}

/// When profile `name` last reached its host (seconds since the Unix epoch).
pub fn last_seen(dir: &Path, name: &str) -> Option<u64> {
    std::fs::read_to_string(seen_file(dir, name))
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// The background forwards' directory.
pub fn run_dir(dir: &Path) -> PathBuf {
    dir.join("run")
}

/// The lock a profile's background `connect` holds.
pub fn lock_file(dir: &Path, name: &str) -> PathBuf {
    run_dir(dir).join(format!("{name}.lock"))
}

/// A profile's background `connect`'s output.
pub fn log_file(dir: &Path, name: &str) -> PathBuf {
    run_dir(dir).join(format!("{name}.log"))
}

/// Makes `path` absolute against the working directory (a later command runs elsewhere).
pub fn absolute(path: PathBuf) -> PathBuf {
    std::path::absolute(&path).unwrap_or(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_default_is_a_stored_profile() {
        let dir = tempfile::tempdir().unwrap();
        let error = choose_default(dir.path(), "devbox").unwrap_err();
        assert!(error.contains("there are none yet"), "{error}");
        std::fs::create_dir_all(dir.path().join("profiles")).unwrap();
        std::fs::write(dir.path().join("profiles/a.json"), "{}").unwrap();
        std::fs::write(dir.path().join("profiles/devbox.json"), "{}").unwrap();
        let error = choose_default(dir.path(), "other").unwrap_err();
        assert!(error.contains("known profiles: a, devbox"), "{error}");
        assert_eq!(chosen_default(dir.path()), None);
        choose_default(dir.path(), "devbox").unwrap();
        assert_eq!(chosen_default(dir.path()).as_deref(), Some("devbox"));
    }
}
