//! Where a path a tool call names leads (docs/protocol.md, "Permissions"): `~` and the tool's
//! working directory applied as pi applies them, `..` resolved, and symlinks followed; a path
//! that does not exist yet is judged by its nearest existing parent.

use std::path::{Component, Path, PathBuf};

/// A path as named and as it really leads.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resolved {
    /// Absolute, `.` and `..` removed, no symlink followed.
    pub named: PathBuf,
    /// The nearest existing ancestor's real path (every symlink followed), with the rest of
    /// the path after it.
    pub real: PathBuf,
}

impl Resolved {
    /// Whether it lies inside `dir` (a real path) wherever it leads.
    pub fn inside(&self, dir: &Path) -> bool {
        self.real.starts_with(dir)
    }

    /// The directory a grant for it covers: itself when it is a directory, else its parent.
    pub fn grant_dir(&self) -> PathBuf {
        if self.real.is_dir() {
            return self.real.clone();
        }
        self.real
            .parent()
            .map_or_else(|| self.real.clone(), Path::to_path_buf)
    }
}

/// `raw` as pi's tools read it in `cwd` (pi drops a leading `@`, reads Unicode spaces as
/// spaces and expands `~` to the home directory).
pub fn resolve(raw: &str, cwd: &Path, home: Option<&Path>) -> Resolved {
    let raw = raw.strip_prefix('@').unwrap_or(raw);
    let raw: String = raw.chars().map(unicode_space).collect();
    let expanded = match (raw.as_str(), home) {
        ("~", Some(home)) => home.to_path_buf(),
        (tilde, Some(home)) if tilde.starts_with("~/") => home.join(&tilde[2..]),
        _ => PathBuf::from(&raw),
    };
    let joined = cwd.join(expanded);
    let named = normalise(&joined);
    Resolved {
        real: real(&joined),
        named,
    }
}

/// pi's tools read these as a plain space (`path-utils.js`).
fn unicode_space(c: char) -> char {
    match c {
        '\u{00A0}' | '\u{2000}'..='\u{200A}' | '\u{202F}' | '\u{205F}' | '\u{3000}' => ' ',
        c => c,
    }
}

/// `.` and `..` removed without looking at the disk (`..` at the root stays at the root).
pub fn normalise(path: &Path) -> PathBuf {
    let mut out = PathBuf::from("/");
    for part in path.components() {
        match part {
            Component::Normal(name) => out.push(name),
            Component::ParentDir => {
                out.pop();
            }
            Component::RootDir | Component::CurDir | Component::Prefix(_) => {}
        }
    }
    out
}

/// The real path of the nearest ancestor that exists, with what follows it normalised on top:
/// a file not written yet is judged by the directory it would land in.
fn real(path: &Path) -> PathBuf {
    let mut existing = path.to_path_buf();
    let mut rest = Vec::new();
    loop {
        if let Ok(real) = std::fs::canonicalize(&existing) {
            let mut out = real;
            for part in rest.iter().rev() {
                out.push(part);
            }
            return normalise(&out);
        }
        match (existing.file_name(), existing.parent()) {
            (Some(name), Some(parent)) => {
                rest.push(name.to_os_string());
                existing = parent.to_path_buf();
            }
            // `..` or `.` last: step over it lexically.
            _ => match existing.parent() {
                Some(parent) if parent != existing => {
                    rest.push(
                        existing
                            .components()
                            .next_back()
                            .map_or_else(|| ".".into(), |c| c.as_os_str().to_os_string()),
                    );
                    existing = parent.to_path_buf();
                }
                _ => return normalise(path),
            },
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    fn dirs() -> (tempfile::TempDir, PathBuf, PathBuf) {
        let tmp = tempfile::tempdir().unwrap();
        let root = std::fs::canonicalize(tmp.path()).unwrap();
        let ws = root.join("ws");
        let home = root.join("home");
        std::fs::create_dir_all(ws.join("src")).unwrap();
        std::fs::create_dir_all(home.join(".ssh")).unwrap();
        std::fs::write(home.join(".ssh/id_ed25519"), "key").unwrap();
        (tmp, ws, home)
    }

    #[test]
    fn tilde_cwd_and_dots_resolve_as_pi_reads_them() {
        let (_tmp, ws, home) = dirs();
        let h = Some(home.as_path());
        assert_eq!(resolve("~", &ws, h).real, home);
        assert_eq!(
            resolve("~/.ssh/id_ed25519", &ws, h).real,
            home.join(".ssh/id_ed25519")
        );
        assert_eq!(resolve("@src/a.rs", &ws, h).named, ws.join("src/a.rs"));
        assert_eq!(resolve("a\u{00A0}b", &ws, h).named, ws.join("a b"));
        let up = resolve("src/../../home/.ssh/id_ed25519", &ws, h);
        assert_eq!(up.real, home.join(".ssh/id_ed25519"));
        assert!(!up.inside(&ws));
        assert!(resolve("src/./x/../y", &ws, h).inside(&ws));
        // "~user" is not the home directory: it is a relative name, as pi reads it.
        assert_eq!(resolve("~other/x", &ws, h).named, ws.join("~other/x"));
    }

    #[test]
    fn symlinks_are_followed_to_where_they_lead() {
        let (_tmp, ws, home) = dirs();
        symlink(home.join(".ssh/id_ed25519"), ws.join("notes.txt")).unwrap();
        symlink(home.join(".ssh"), ws.join("keys")).unwrap();
        let h = Some(home.as_path());
        let file = resolve("notes.txt", &ws, h);
        assert_eq!(file.named, ws.join("notes.txt"));
        assert_eq!(file.real, home.join(".ssh/id_ed25519"));
        assert!(!file.inside(&ws));
        // A file not written yet under a linked directory lands where the link leads.
        let new = resolve("keys/id_new", &ws, h);
        assert_eq!(new.real, home.join(".ssh/id_new"));
    }

    #[test]
    fn a_path_not_written_yet_is_judged_by_its_nearest_parent() {
        let (_tmp, ws, home) = dirs();
        let h = Some(home.as_path());
        let deep = resolve("new/dir/../file.txt", &ws, h);
        assert_eq!(deep.real, ws.join("new/file.txt"));
        assert!(deep.inside(&ws));
        let out = resolve("/nonexistent-root-dir/x", &ws, h);
        assert_eq!(out.real, PathBuf::from("/nonexistent-root-dir/x"));
        assert!(!out.inside(&ws));
        assert_eq!(resolve("src/x.rs", &ws, h).grant_dir(), ws.join("src"));
        assert_eq!(resolve("src", &ws, h).grant_dir(), ws.join("src"));
    }

    #[test]
    fn normalise_never_climbs_above_the_root() {
        assert_eq!(
            normalise(Path::new("/../../etc/./x")),
            PathBuf::from("/etc/x")
        );
        assert_eq!(normalise(Path::new("/a/b/..")), PathBuf::from("/a"));
    }
}
