//! What a turn changed (`turn.finished`'s `files`, docs/protocol.md §8.9): the files pi's
//! `write` and `edit` tools name, with the edit tool's own diff counts, merged with what the
//! workspace's watcher saw change while the turn ran (a shell command's deletions, a tool the
//! host does not read).

use racp_proto::limits::MAX_TURN_FILES;
use racp_proto::methods::workspace::{ChangeKind, FileChange};
use racp_proto::pi::event::FileTool;
use std::collections::{BTreeSet, HashMap};
use std::path::Path;

/// One running turn's record.
#[derive(Debug, Default)]
pub struct Record {
    /// In the order first changed.
    files: Vec<Entry>,
    /// Tool calls started and not yet ended: call id → (tool, path, lines a write writes).
    calls: HashMap<String, (&'static str, String, Option<u64>)>,
}

#[derive(Debug)]
struct Entry {
    path: String,
    /// What the watcher saw last, if it saw it.
    disk: Option<ChangeKind>,
    added: Option<u64>,
    removed: Option<u64>,
    by: BTreeSet<&'static str>,
}

impl Record {
    fn entry(&mut self, path: &str) -> Option<&mut Entry> {
        if let Some(at) = self.files.iter().position(|e| e.path == path) {
            return Some(&mut self.files[at]);
        }
        if self.files.len() >= MAX_TURN_FILES {
            return None;
        }
        self.files.push(Entry {
            path: path.to_string(),
            disk: None,
            added: None,
            removed: None,
            by: BTreeSet::new(),
        });
        self.files.last_mut()
    }

    /// A change the watcher saw while the turn ran.
    pub fn disk(&mut self, path: &str, kind: ChangeKind) {
        if let Some(entry) = self.entry(path) {
            entry.disk = Some(match (entry.disk, kind) {
                (Some(ChangeKind::Created), ChangeKind::Modified) => ChangeKind::Created,
                (_, kind) => kind,
            });
        }
    }

    /// A file tool's start or end (pi's event, read by `racp_proto::pi::event`).
    pub fn tool(&mut self, root: &Path, tool: FileTool) {
        match tool {
            FileTool::Write {
                call_id,
                path,
                lines,
            } => {
                self.calls
                    .insert(call_id, ("write", relative(root, &path), Some(lines)));
            }
            FileTool::Edit { call_id, path } => {
                self.calls
                    .insert(call_id, ("edit", relative(root, &path), None));
            }
            FileTool::End {
                call_id,
                failed,
                counts,
            } => {
                let Some((tool, path, lines)) = self.calls.remove(&call_id) else {
                    return;
                };
                if failed {
                    return;
                }
                let Some(entry) = self.entry(&path) else {
                    return;
                };
                entry.by.insert(tool);
                let (added, removed) = match (tool, counts) {
                    ("edit", Some((added, removed))) => (Some(added), Some(removed)),
                    _ => (lines, None),
                };
                entry.added = sum(entry.added, added);
                entry.removed = sum(entry.removed, removed);
            }
        }
    }

    /// The turn's files, as `turn.finished` names them.
    pub fn files(self) -> Vec<FileChange> {
        self.files
            .into_iter()
            .map(|entry| {
                let kind = entry.disk.unwrap_or(ChangeKind::Modified);
                let mut by: Vec<String> = entry.by.iter().map(|t| t.to_string()).collect();
                if by.is_empty() {
                    by.push("disk".into());
                }
                // A file the turn created had no lines to remove.
                let created = kind == ChangeKind::Created && !entry.by.is_empty();
                let removed = if created { Some(0) } else { entry.removed };
                let tools = !entry.by.is_empty();
                FileChange {
                    path: entry.path,
                    kind,
                    added: entry.added.filter(|_| tools),
                    removed: removed.filter(|_| tools),
                    by,
                }
            })
            .collect()
    }
}

fn sum(a: Option<u64>, b: Option<u64>) -> Option<u64> {
    match (a, b) {
        (Some(a), Some(b)) => Some(a + b),
        (a, b) => a.or(b),
    }
}

/// A tool's path as the watcher names it: relative to the workspace, `/`-separated; a path
/// outside it stays as the tool gave it.
fn relative(root: &Path, path: &str) -> String {
    let given = Path::new(path);
    let full = if given.is_absolute() {
        given.to_path_buf()
    } else {
        root.join(given)
    };
    let mut parts: Vec<String> = Vec::new();
    for component in full.components() {
        match component {
            std::path::Component::ParentDir => {
                parts.pop();
            }
            std::path::Component::CurDir => {}
            other => parts.push(other.as_os_str().to_string_lossy().into_owned()),
        }
    }
    let normal: std::path::PathBuf = parts.iter().collect();
    match normal.strip_prefix(root) {
        Ok(rest) => rest.to_string_lossy().into_owned(),
        Err(_) => path.to_string(),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn write(id: &str, path: &str, lines: u64) -> FileTool {
        FileTool::Write {
            call_id: id.into(),
            path: path.into(),
            lines,
        }
    }

    fn end(id: &str, counts: Option<(u64, u64)>) -> FileTool {
        FileTool::End {
            call_id: id.into(),
            failed: false,
            counts,
        }
    }

    #[test]
    fn tools_and_the_disk_make_one_list() {
        let root = Path::new("/w");
        let mut record = Record::default();
        record.tool(root, write("1", "/w/new.txt", 3));
        record.disk("new.txt", ChangeKind::Created);
        record.disk("new.txt", ChangeKind::Modified);
        record.tool(root, end("1", None));
        record.tool(
            root,
            FileTool::Edit {
                call_id: "2".into(),
                path: "./src/../a.rs".into(),
            },
        );
        record.tool(root, end("2", Some((2, 1))));
        record.tool(
            root,
            FileTool::Edit {
                call_id: "3".into(),
                path: "a.rs".into(),
            },
        );
        record.tool(root, end("3", Some((1, 4))));
        record.disk("gone.txt", ChangeKind::Removed);
        let files = record.files();
        assert_eq!(files.len(), 3);
        assert_eq!(
            (files[0].kind, files[0].added, files[0].removed),
            (ChangeKind::Created, Some(3), Some(0))
        );
        assert_eq!(files[1].path, "a.rs");
        assert_eq!((files[1].added, files[1].removed), (Some(3), Some(5)));
        assert_eq!(files[1].by, ["edit"]);
        assert_eq!((files[2].kind, files[2].added), (ChangeKind::Removed, None));
        assert_eq!(files[2].by, ["disk"]);
    }

    #[test]
    fn a_turn_names_at_most_its_bound_of_files() {
        let mut record = Record::default();
        for i in 0..=MAX_TURN_FILES {
            record.disk(&format!("f{i}"), ChangeKind::Created);
        }
        let files = record.files();
        assert_eq!(files.len(), MAX_TURN_FILES);
        assert_eq!(
            files[MAX_TURN_FILES - 1].path,
            format!("f{}", MAX_TURN_FILES - 1)
        );
    }
}
