//! Confining client-supplied paths to the host's permitted roots, symlinks included, and
//! keeping clients out of the host's own files (docs/protocol.md §6.1, "What each role reaches").

use crate::config::ServeConfig;
use racp_proto::{AppError, ErrorCode};
use serde_json::json;
use std::path::{Component, Path, PathBuf};

/// Symlinks followed while working out where a missing path would be (as the kernel's
/// ELOOP limit).
const MAX_LINK_HOPS: usize = 40;

/// Where clients may go: inside a root, and never into the host's own files.
pub struct Fence {
    roots: Vec<PathBuf>,
    canonical_roots: Vec<PathBuf>,
    /// The data directory (keys, database, admin socket) and the host's other files (config,
    /// TLS key, state file), canonical where they exist.
    protected: Vec<PathBuf>,
    /// The host user's home (`$HOME` of the host's process, when absolute): what `~` names.
    home: Option<String>,
}

impl Fence {
    pub fn new(roots: &[PathBuf], protected: &[PathBuf]) -> Fence {
        let canonical = |paths: &[PathBuf]| -> Vec<PathBuf> {
            paths
                .iter()
                .filter_map(|p| std::fs::canonicalize(p).ok())
                .collect()
        };
        let mut protected_all = protected.to_vec();
        protected_all.extend(canonical(protected));
        Fence {
            roots: roots.to_vec(),
            canonical_roots: canonical(roots),
            protected: protected_all,
            home: std::env::var("HOME").ok().filter(|h| h.starts_with('/')),
        }
    }

    /// A path as a person writes it for the remote: `~` and `~/…` are the host user's home,
    /// resolved here because a client's shell can only know its own (docs/protocol.md §7.8,
    /// §7.9); anything else is left as given.
    fn expand<'a>(&self, path: &'a str) -> std::borrow::Cow<'a, str> {
        let Some(home) = &self.home else {
            return path.into();
        };
        match (path, path.strip_prefix("~/")) {
            ("~", _) => home.clone().into(),
            (_, Some(rest)) => format!("{}/{rest}", home.trim_end_matches('/')).into(),
            _ => path.into(),
        }
    }

    /// The fence for a host's configuration (roots, data directory, host files).
    pub fn of(config: &ServeConfig) -> Fence {
        Fence::new(&config.roots, &config.protected_paths())
    }

    /// True when a canonical path lies inside a root and outside the host's own files.
    pub fn allows(&self, canonical: &Path) -> bool {
        self.canonical_roots
            .iter()
            .any(|r| canonical.starts_with(r))
            && !self.protected.iter().any(|p| canonical.starts_with(p))
    }

    /// Resolves `path` (absolute or under `~`, symlinks followed) and checks the fence allows
    /// it.
    ///
    /// Anything the fence does not allow is REMOTE_PATH_FORBIDDEN whether or not it exists; a
    /// missing path is REMOTE_PATH_NOT_FOUND only where it would lie inside the fence, so
    /// probing outside reveals nothing about what exists there.
    pub fn confine(&self, path: &str, field: &str) -> Result<PathBuf, AppError> {
        let expanded = self.expand(path);
        let path: &str = &expanded;
        let requested = Path::new(path);
        if !requested.is_absolute() {
            return Err(racp_proto::validate::invalid(
                field,
                "must be an absolute path, or ~/… for the host user's home",
            ));
        }
        let forbidden = || {
            let roots: Vec<String> = self.roots.iter().map(|r| r.display().to_string()).collect();
            AppError::new(
                ErrorCode::RemotePathForbidden,
                format!(
                    "{path} is outside the host's permitted roots ({}); use a path inside one, or have the host's owner add a root (--root)",
                    roots.join(", ")
                ),
            )
            .with_details(json!({"path": path, "roots": roots}))
        };
        let lexical = normalize(requested);
        // Checked before touching the file system: nothing is even looked up outside.
        if !self
            .roots
            .iter()
            .chain(&self.canonical_roots)
            .any(|r| lexical.starts_with(r))
        {
            return Err(forbidden());
        }
        match std::fs::canonicalize(&lexical) {
            Ok(canonical) if self.allows(&canonical) => Ok(canonical),
            Ok(_) => Err(forbidden()),
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                match would_be(&lexical, MAX_LINK_HOPS) {
                    Some(target) if self.allows(&target) => Err(AppError::new(
                        ErrorCode::RemotePathNotFound,
                        format!("{path} does not exist"),
                    )
                    .with_details(json!({"path": path}))),
                    _ => Err(forbidden()),
                }
            }
            Err(_) => Err(forbidden()),
        }
    }
}

/// Where a path that does not exist would be: its deepest existing ancestor, canonical, with
/// the missing rest appended; a dangling symlink on the way is followed to its target. `None`
/// when that cannot be worked out (too many links, unreadable components).
fn would_be(path: &Path, hops: usize) -> Option<PathBuf> {
    let hops = hops.checked_sub(1)?;
    let mut existing = path.to_path_buf();
    let mut missing = Vec::new();
    loop {
        match std::fs::symlink_metadata(&existing) {
            Ok(meta) if meta.file_type().is_symlink() && std::fs::metadata(&existing).is_err() => {
                // A dangling link: the path continues at its target.
                let target = std::fs::read_link(&existing).ok()?;
                let parent = existing.parent()?;
                let mut next = normalize(&parent.join(target));
                next.extend(missing.iter().rev());
                return would_be(&next, hops);
            }
            Ok(_) => {
                let mut resolved = std::fs::canonicalize(&existing).ok()?;
                resolved.extend(missing.iter().rev());
                return Some(resolved);
            }
            Err(err) if err.kind() == std::io::ErrorKind::NotFound => {
                missing.push(existing.file_name()?.to_os_string());
                existing = existing.parent()?.to_path_buf();
            }
            Err(_) => return None,
        }
    }
}

/// Removes `.` and resolves `..` without touching the file system.
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for component in path.components() {
        match component {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other.as_os_str()),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn s(p: &Path) -> String {
        p.to_str().unwrap().to_string()
    }

    #[test]
    fn confines_to_roots_through_dots_and_symlinks() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let inner = root.path().join("project");
        std::fs::create_dir(&inner).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("escape")).unwrap();
        let fence = Fence::new(&[root.path().to_path_buf()], &[]);

        assert!(fence.confine(&s(&inner), "workspace").is_ok());
        let code = |p: String| fence.confine(&p, "workspace").unwrap_err().code();
        assert_eq!(
            code(s(&inner.join("../../.."))),
            ErrorCode::RemotePathForbidden
        );
        assert_eq!(code(s(outside.path())), ErrorCode::RemotePathForbidden);
        assert_eq!(
            code(s(&root.path().join("escape"))),
            ErrorCode::RemotePathForbidden
        );
        assert_eq!(
            code(s(&inner.join("missing"))),
            ErrorCode::RemotePathNotFound
        );
        assert_eq!(
            code(s(&inner.join("missing/deeper/still"))),
            ErrorCode::RemotePathNotFound
        );
        assert_eq!(code("relative/path".into()), ErrorCode::InvalidParams);
    }

    #[test]
    fn tilde_is_the_host_users_home_in_every_client_path() {
        let home = tempfile::tempdir().unwrap();
        let project = home.path().join("project");
        std::fs::create_dir(&project).unwrap();
        let canonical_project = std::fs::canonicalize(&project).unwrap();
        let mut fence = Fence::new(std::slice::from_ref(&project), &[]);
        fence.home = Some(s(home.path()));

        assert_eq!(
            fence.confine("~/project", "path").unwrap(),
            canonical_project
        );
        assert_eq!(
            fence.confine("~/project/../project/", "path").unwrap(),
            canonical_project
        );
        // Under `~` and outside the roots is refused like any other path outside them.
        let refused = fence.confine("~", "path").unwrap_err();
        assert_eq!(refused.code(), ErrorCode::RemotePathForbidden);
        assert!(refused.message().starts_with(&s(home.path())), "{refused}");
        // Another user's home and a `~` inside a name are not this user's home.
        for other in ["~root/project", "~project", "project/~/x"] {
            assert_eq!(
                fence.confine(other, "path").unwrap_err().code(),
                ErrorCode::InvalidParams,
                "{other}"
            );
        }
        // With no home known, `~` stays a relative path, refused as one.
        fence.home = None;
        let relative = fence.confine("~/project", "path").unwrap_err();
        assert_eq!(relative.code(), ErrorCode::InvalidParams);
        assert!(
            relative.message().contains("~/… for the host user's home"),
            "{relative}"
        );
    }

    #[test]
    fn outside_the_roots_existing_and_missing_paths_answer_alike() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        std::fs::write(outside.path().join("shadow"), "secret").unwrap();
        let link = |target: &Path, name: &str| {
            std::os::unix::fs::symlink(target, root.path().join(name)).unwrap();
        };
        link(outside.path(), "etc");
        link(&outside.path().join("gone"), "dangling-out");
        link(&root.path().join("gone"), "dangling-in");
        link(
            Path::new("../../../../../../../../tmp/nowhere"),
            "dangling-relative",
        );
        let fence = Fence::new(&[root.path().to_path_buf()], &[]);
        let code = |p: PathBuf| fence.confine(&s(&p), "path").unwrap_err().code();

        for probe in [
            root.path().join("etc/shadow"),
            root.path().join("etc/no-such-file"),
            root.path().join("etc/no/such/dir"),
            root.path().join("dangling-out"),
            root.path().join("dangling-out/below"),
            root.path().join("dangling-relative"),
        ] {
            assert_eq!(
                code(probe.clone()),
                ErrorCode::RemotePathForbidden,
                "{}",
                probe.display()
            );
        }
        assert_eq!(
            code(root.path().join("dangling-in")),
            ErrorCode::RemotePathNotFound
        );
        assert_eq!(
            code(root.path().join("dangling-in/below")),
            ErrorCode::RemotePathNotFound
        );
    }

    #[test]
    fn the_hosts_own_files_are_refused_inside_a_root() {
        let root = tempfile::tempdir().unwrap();
        let data = root.path().join(".local/share/pi-host");
        std::fs::create_dir_all(&data).unwrap();
        std::fs::write(data.join("host.key"), "key").unwrap();
        let config = root.path().join("host.toml");
        std::fs::write(&config, "").unwrap();
        std::os::unix::fs::symlink(&data, root.path().join("shortcut")).unwrap();
        let fence = Fence::new(
            &[root.path().to_path_buf()],
            &[data.clone(), config.clone()],
        );
        let code = |p: PathBuf| fence.confine(&s(&p), "path").unwrap_err().code();

        for probe in [
            data.clone(),
            data.join("host.key"),
            data.join("missing"),
            data.join("../pi-host/host.key"),
            root.path().join("shortcut/host.key"),
            config,
        ] {
            assert_eq!(
                code(probe.clone()),
                ErrorCode::RemotePathForbidden,
                "{}",
                probe.display()
            );
        }
        assert!(
            fence
                .confine(&s(&root.path().join(".local")), "path")
                .is_ok()
        );
    }
}
