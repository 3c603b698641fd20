//! pi-host's pi extension (`preload.ts`, docs/architecture.md, "Agent lifecycle"): loaded with
//! `--extension PATH`, it makes pi load at its start what it otherwise loads at the first prompt
//! (its model provider's code, Node's fetch), so a warm agent's first reply comes as fast as the
//! later ones. An extension because pi has no RPC command that loads these without a prompt, and
//! it knows the session's model, which a Node preload (`NODE_OPTIONS=--import`) would not; it
//! also would reach every Node program the agent's tools run.

use std::path::{Path, PathBuf};

/// The extension's source, as shipped with this build.
pub const SOURCE: &str = include_str!("preload.ts");

/// Writes the extension under the data directory (unless it is there already) and returns its
/// path. pi reads extensions from files, and the data directory is the host's own.
pub fn install(data_dir: &Path) -> std::io::Result<PathBuf> {
    let dir = data_dir.join("pi-extensions");
    crate::fsutil::create_private_dir(&dir)?;
    let path = dir.join("pi-host-preload.ts");
    if std::fs::read(&path).is_ok_and(|bytes| bytes == SOURCE.as_bytes()) {
        return Ok(path);
    }
    // A new file renamed into place: an agent starting meanwhile reads the old or the new one.
    let staged = dir.join(format!(".pi-host-preload.ts.{}", std::process::id()));
    let _ = std::fs::remove_file(&staged);
    crate::fsutil::write_private(&staged, SOURCE.as_bytes())?;
    std::fs::rename(&staged, &path)?;
    Ok(path)
}

/// The agent arguments that load the extension at `path`.
pub fn agent_args(path: &Path) -> String {
    format!(
        "--extension {}",
        shell_words::quote(&path.to_string_lossy())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_writes_the_extension_once_and_replaces_another_version() {
        let dir = tempfile::tempdir().unwrap();
        let path = install(dir.path()).unwrap();
        assert_eq!(std::fs::read_to_string(&path).unwrap(), SOURCE);
        std::fs::write(&path, "an older version").unwrap();
        assert_eq!(install(dir.path()).unwrap(), path);
        assert_eq!(std::fs::read_to_string(&path).unwrap(), SOURCE);
        let names: Vec<_> = std::fs::read_dir(path.parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 1, "nothing else left behind: {names:?}");
    }

    #[test]
    fn agent_args_quote_the_path_for_the_command_line() {
        let args = agent_args(Path::new("/data dir/pi-host-preload.ts"));
        assert_eq!(
            shell_words::split(&args).unwrap(),
            ["--extension", "/data dir/pi-host-preload.ts"]
        );
    }
}
