//! Which paths a sandboxed agent may read and write, as Landlock rules can say it. Landlock
//! only grants, and a grant on a directory covers everything beneath it, so "everything but
//! these" is written as grants on what lies around them: on the way from a granted root down to
//! a hidden path, each directory's other entries are granted, never the directory itself (so
//! the listing of a directory that holds a hidden path is refused too; its entries are not).

use std::path::{Path, PathBuf};

/// The paths to grant, each covering everything beneath it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// Read, list and execute.
    pub read: Vec<PathBuf>,
    /// Read and write: create, remove, rename within, truncate.
    pub write: Vec<PathBuf>,
}

/// What one agent may reach.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reach {
    /// Never readable (unless a path of `readable` or `writable` lies inside), whatever else
    /// is granted: the host's own files, the user's credential stores.
    pub hidden: Vec<PathBuf>,
    /// Read and write, minus what is hidden: the workspace, temp, the agent's own state, the
    /// caches builds need.
    pub writable: Vec<PathBuf>,
    /// Read, even inside a hidden path: what the agent needs of the host (its extensions).
    pub readable: Vec<PathBuf>,
    /// Read and write, even inside a hidden path: the agent's own state the host keeps (its
    /// session files).
    pub own: Vec<PathBuf>,
}

impl Reach {
    /// The grants: everything readable around the hidden paths, the writable paths around
    /// them too, and the explicit grants inside them.
    pub fn plan(&self) -> Plan {
        let hidden = with_canonical(&self.hidden);
        let mut read = around(Path::new("/"), &hidden, 0);
        read.extend(existing(&self.readable));
        let mut write: Vec<PathBuf> = existing(&self.writable)
            .iter()
            .flat_map(|root| around(root, &hidden, 0))
            .collect();
        write.extend(existing(&self.own));
        read.sort();
        read.dedup();
        write.sort();
        write.dedup();
        Plan { read, write }
    }
}

/// How deep [`around`] goes below a root: deeper hidden paths are hidden with their ancestor at
/// this depth (refusing more, never less).
const MAX_DEPTH: usize = 16;

/// The paths under `root` whose subtrees hold no hidden path, together covering everything
/// beneath `root` but the hidden paths and the directories on the way to them.
fn around(root: &Path, hidden: &[PathBuf], depth: usize) -> Vec<PathBuf> {
    if hidden.iter().any(|h| root.starts_with(h)) {
        return Vec::new();
    }
    if !hidden.iter().any(|h| h.starts_with(root)) {
        return vec![root.to_path_buf()];
    }
    if depth >= MAX_DEPTH {
        return Vec::new();
    }
    let Ok(entries) = std::fs::read_dir(root) else {
        return Vec::new();
    };
    let mut granted = Vec::new();
    for entry in entries.flatten() {
        let path = entry.path();
        let is_link = entry.file_type().is_ok_and(|t| t.is_symlink());
        if !is_link {
            granted.extend(around(&path, hidden, depth + 1));
            continue;
        }
        // A grant follows a link to its target: grant the target only when it is clear of
        // every hidden path, so no link leads into one.
        if let Ok(target) = std::fs::canonicalize(&path)
            && !hidden
                .iter()
                .any(|h| target.starts_with(h) || h.starts_with(&target))
        {
            granted.push(target);
        }
    }
    granted
}

/// The paths as given and, where they exist, as the kernel resolves them.
fn with_canonical(paths: &[PathBuf]) -> Vec<PathBuf> {
    let mut all: Vec<PathBuf> = paths.iter().filter(|p| p.is_absolute()).cloned().collect();
    all.extend(paths.iter().filter_map(|p| std::fs::canonicalize(p).ok()));
    all.sort();
    all.dedup();
    all
}

/// The paths that exist, resolved: a rule needs an open file, and a grant on a link is a grant
/// on its target.
fn existing(paths: &[PathBuf]) -> Vec<PathBuf> {
    paths
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tree() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        for sub in [
            "home/.ssh",
            "home/project/src",
            "home/.config/gcloud",
            "home/.config/git",
        ] {
            std::fs::create_dir_all(dir.path().join(sub)).unwrap();
        }
        std::fs::write(dir.path().join("home/.netrc"), "machine x").unwrap();
        std::fs::write(dir.path().join("home/notes"), "n").unwrap();
        dir
    }

    #[test]
    fn what_lies_around_a_hidden_path_is_granted_and_the_path_is_not() {
        let dir = tree();
        let root = dir.path().canonicalize().unwrap();
        let home = root.join("home");
        let hidden = vec![
            home.join(".ssh"),
            home.join(".config/gcloud"),
            home.join(".netrc"),
        ];
        let mut granted = around(&root, &hidden, 0);
        granted.sort();
        assert_eq!(
            granted,
            [
                home.join(".config/git"),
                home.join("notes"),
                home.join("project")
            ]
        );
        // A root with nothing hidden beneath it is granted whole.
        assert_eq!(
            around(&home.join("project"), &hidden, 0),
            [home.join("project")]
        );
        // A root inside a hidden path is granted nothing.
        assert!(around(&home.join(".ssh"), &hidden, 0).is_empty());
    }

    #[test]
    fn a_link_is_granted_by_its_target_only_when_the_target_is_clear() {
        let dir = tree();
        let root = dir.path().canonicalize().unwrap();
        let home = root.join("home");
        std::os::unix::fs::symlink(home.join(".ssh"), home.join("keys")).unwrap();
        std::os::unix::fs::symlink(&home, home.join("back")).unwrap();
        std::os::unix::fs::symlink(home.join("project/src"), home.join("src")).unwrap();
        let hidden = vec![home.join(".ssh")];
        let granted = around(&home, &hidden, 0);
        assert!(
            !granted.iter().any(|p| p.starts_with(home.join(".ssh"))),
            "{granted:?}"
        );
        assert!(
            !granted.contains(&home),
            "a link to an ancestor is not followed: {granted:?}"
        );
        assert!(granted.contains(&home.join("project/src")), "{granted:?}");
    }

    #[test]
    fn explicit_grants_reach_inside_a_hidden_path_and_writes_stay_around_it() {
        let dir = tree();
        let root = dir.path().canonicalize().unwrap();
        let data = root.join("home/project/data");
        std::fs::create_dir_all(data.join("pi-extensions")).unwrap();
        std::fs::create_dir_all(data.join("agent-sessions/ses_1")).unwrap();
        let reach = Reach {
            hidden: vec![data.clone()],
            writable: vec![root.join("home/project")],
            readable: vec![data.join("pi-extensions")],
            own: vec![data.join("agent-sessions/ses_1")],
        };
        let plan = reach.plan();
        assert!(
            plan.write.contains(&root.join("home/project/src")),
            "{plan:?}"
        );
        assert!(
            !plan.write.iter().any(|p| p == &root.join("home/project")),
            "{plan:?}"
        );
        assert!(plan.write.contains(&data.join("agent-sessions/ses_1")));
        assert!(
            !plan
                .write
                .iter()
                .any(|p| p == &data || p == &data.join("agent-sessions"))
        );
        assert!(plan.read.contains(&data.join("pi-extensions")));
        assert!(!plan.read.iter().any(|p| data.starts_with(p)), "{plan:?}");
    }
}
