//! pi-host's pi extensions, loaded into every agent with `--extension PATH`:
//! - `preload.ts` (docs/architecture.md, "Agent lifecycle"): makes pi load at its start what it
//!   otherwise loads at the first prompt (its model provider's code, Node's fetch), so a warm
//!   agent's first reply comes as fast as the later ones. An extension because pi has no RPC
//!   command that loads these without a prompt, and it knows the session's model, which a Node
//!   preload (`NODE_OPTIONS=--import`) would not; it also would reach every Node program the
//!   agent's tools run. `--disable-agent-preload` leaves it out.
//! - `settings.ts` (docs/protocol.md §7.19-§7.22): the provider keys and model servers a desktop
//!   set, read from the data directory when pi starts, and the model catalogue `model/list`
//!   answers from. pi has no RPC command to hand it a key, and an environment variable would lose
//!   to the user's own auth.json (desktop-set keys must win) and reach every program the agent
//!   runs.
//! - `permissions.ts` (docs/protocol.md, "Permissions"): before each tool call, asks the host's
//!   policy (`policy/`) whether it may run, and blocks it with the host's reason when not.
//!   Always loaded, last, so that no other extension of pi-host's runs a tool unasked.

use std::path::{Path, PathBuf};

/// The preload extension's source, as shipped with this build.
pub const PRELOAD: &str = include_str!("preload.ts");
/// The settings extension's source.
pub const SETTINGS: &str = include_str!("settings.ts");
/// The permissions extension's source.
pub const PERMISSIONS: &str = include_str!("permissions.ts");

/// The folder under the data directory the extensions are written to. `settings.ts` finds the
/// host's settings files one level up from it.
const DIR: &str = "pi-extensions";

/// The folder the extensions are in: the one part of the data directory an agent may read.
pub fn dir(data_dir: &Path) -> PathBuf {
    data_dir.join(DIR)
}

/// Writes the extensions under the data directory (unless they are there already) and returns
/// their paths, the preload's first when `with_preload`. pi reads extensions from files, and the
/// data directory is the host's own.
pub fn install(data_dir: &Path, with_preload: bool) -> std::io::Result<Vec<PathBuf>> {
    let dir = dir(data_dir);
    racp_server::private_file::create_private_dir(&dir)?;
    let mut paths = Vec::new();
    if with_preload {
        paths.push(write(&dir, "pi-host-preload.ts", PRELOAD)?);
    }
    paths.push(write(&dir, "pi-host-settings.ts", SETTINGS)?);
    paths.push(write(&dir, "pi-host-permissions.ts", PERMISSIONS)?);
    Ok(paths)
}

fn write(dir: &Path, name: &str, source: &str) -> std::io::Result<PathBuf> {
    let path = dir.join(name);
    if std::fs::read(&path).is_ok_and(|bytes| bytes == source.as_bytes()) {
        return Ok(path);
    }
    // A new file renamed into place: an agent starting meanwhile reads the old or the new one.
    racp_server::private_file::replace_private(&path, source.as_bytes())?;
    Ok(path)
}

/// The agent arguments that load the extensions at `paths`.
pub fn agent_args(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|path| {
            format!(
                "--extension {}",
                shell_words::quote(&path.to_string_lossy())
            )
        })
        .collect::<Vec<_>>()
        .join(" ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn install_writes_the_extensions_once_and_replaces_another_version() {
        let dir = tempfile::tempdir().unwrap();
        let paths = install(dir.path(), true).unwrap();
        assert_eq!(std::fs::read_to_string(&paths[0]).unwrap(), PRELOAD);
        assert_eq!(std::fs::read_to_string(&paths[1]).unwrap(), SETTINGS);
        assert_eq!(std::fs::read_to_string(&paths[2]).unwrap(), PERMISSIONS);
        std::fs::write(&paths[0], "an older version").unwrap();
        assert_eq!(install(dir.path(), true).unwrap(), paths);
        assert_eq!(std::fs::read_to_string(&paths[0]).unwrap(), PRELOAD);
        let names: Vec<_> = std::fs::read_dir(paths[0].parent().unwrap())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names.len(), 3, "nothing else left behind: {names:?}");
        assert_eq!(install(dir.path(), false).unwrap(), paths[1..]);
    }

    #[test]
    fn agent_args_quote_the_paths_for_the_command_line() {
        let args = agent_args(&[
            PathBuf::from("/data dir/pi-host-preload.ts"),
            PathBuf::from("/d/s.ts"),
        ]);
        assert_eq!(
            shell_words::split(&args).unwrap(),
            [
                "--extension",
                "/data dir/pi-host-preload.ts",
                "--extension",
                "/d/s.ts"
            ]
        );
    }
}
