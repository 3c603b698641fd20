//! pi-remote's own directories on this machine, found one way: its own variable when set, else
//! the XDG base directory's `pi-remote`, else the same under the home directory.

use std::path::PathBuf;

/// A variable's value, when set and not empty.
fn var(name: &str) -> Option<PathBuf> {
    std::env::var_os(name)
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
}

/// `$OWN` when `own` names a set variable, else `$XDG/pi-remote`, else
/// `$HOME/UNDER_HOME/pi-remote`; `None` with none of them set.
pub fn user_dir(own: Option<&str>, xdg: &str, under_home: &str) -> Option<PathBuf> {
    if let Some(dir) = own.and_then(var) {
        return Some(dir);
    }
    var(xdg)
        .or_else(|| var("HOME").map(|home| home.join(under_home)))
        .map(|base| base.join("pi-remote"))
}
