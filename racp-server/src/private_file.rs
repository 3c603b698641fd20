//! Files and folders that hold secrets are private to the user.

use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt, PermissionsExt};
use std::path::Path;

/// Creates `dir` (and parents) with mode 0700, and tightens it if it already exists.
pub fn create_private_dir(dir: &Path) -> std::io::Result<()> {
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))
}

/// Writes `bytes` to a new file with mode 0600 (never readable by others, even briefly).
pub fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

/// Replaces `path` with a file of `bytes`, mode 0600, atomically: a reader sees the old file or
/// the new one, never a part.
pub fn replace_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let staged = stage_private(path, bytes)?;
    std::fs::rename(&staged, path).inspect_err(|_| {
        let _ = std::fs::remove_file(&staged);
    })
}

/// Writes `bytes` to a new 0600 file next to `path` and returns its name, for the caller to
/// rename over `path`. The file is made with `create_new` (O_EXCL), which never follows a link
/// planted under its name, and synced, so the rename publishes a whole file.
pub fn stage_private(path: &Path, bytes: &[u8]) -> std::io::Result<std::path::PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::other("no file name"))?;
    let mut staged_name = std::ffi::OsString::from(".");
    staged_name.push(name);
    staged_name.push(format!(".{}.tmp", std::process::id()));
    let staged = path.with_file_name(staged_name);
    // A file left by a process of the same pid that died here is ours to replace; a planted
    // link goes with it (removing a link never touches what it points at).
    match std::fs::remove_file(&staged) {
        Ok(()) => {}
        Err(err) if err.kind() == std::io::ErrorKind::NotFound => {}
        Err(err) => return Err(err),
    }
    write_private(&staged, bytes)?;
    Ok(staged)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_link_planted_at_the_staged_name_is_not_followed() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "untouched").unwrap();
        let path = dir.path().join("state.json");
        let staged = dir
            .path()
            .join(format!(".state.json.{}.tmp", std::process::id()));
        std::os::unix::fs::symlink(&victim, &staged).unwrap();

        replace_private(&path, b"new").unwrap();

        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "untouched");
        assert_eq!(std::fs::read(&path).unwrap(), b"new");
        let mode = std::fs::symlink_metadata(&path)
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600);
        assert!(!staged.exists(), "nothing is left at the staged name");
    }
}
