//! `fs/list` and `fs/stat`: browsing inside the permitted roots, for the desktop's folder
//! picker; both need the `fs` capability, which the host's owner may switch off.

use crate::fence::Fence;
use crate::state::HostState;
use racp_proto::Capability;
use racp_proto::methods::fs::PathParams;
use racp_proto::methods::fs::{EntryKind, FsEntry, FsListResult, FsStatResult};
use racp_proto::{AppError, ErrorCode};
use serde_json::json;
use std::fs::Metadata;
use std::path::Path;

/// Most entries one `fs/list` returns; the rest is reported as `truncated`.
pub const MAX_ENTRIES: usize = 10_000;

fn modified_ms(meta: &Metadata) -> Option<u64> {
    let since = meta
        .modified()
        .ok()?
        .duration_since(std::time::UNIX_EPOCH)
        .ok()?;
    u64::try_from(since.as_millis()).ok()
}

fn kind_of(meta: &Metadata) -> EntryKind {
    if meta.is_dir() {
        EntryKind::Dir
    } else if meta.is_file() {
        EntryKind::File
    } else if meta.file_type().is_symlink() {
        EntryKind::Symlink
    } else {
        EntryKind::Other
    }
}

fn io_error(path: &Path, err: &std::io::Error) -> AppError {
    let display = path.display().to_string();
    match err.kind() {
        std::io::ErrorKind::NotFound => AppError::new(
            ErrorCode::RemotePathNotFound,
            format!("{display} does not exist"),
        )
        .with_details(json!({"path": display})),
        _ => AppError::new(
            ErrorCode::RemotePathForbidden,
            format!("{display} cannot be read: {err}"),
        )
        .with_details(json!({"path": display})),
    }
}

/// One entry as the client sees it: a symlink shows its target's kind when the target lies
/// inside the roots, and stays `symlink` (with no size) when it leads out.
fn describe(path: &Path, fence: &Fence) -> Option<(EntryKind, Option<u64>, Option<u64>)> {
    let link = std::fs::symlink_metadata(path).ok()?;
    let meta = if link.file_type().is_symlink() {
        let inside = std::fs::canonicalize(path)
            .ok()
            .is_some_and(|target| fence.allows(&target));
        if !inside {
            return Some((EntryKind::Symlink, None, modified_ms(&link)));
        }
        std::fs::metadata(path).ok()?
    } else {
        link
    };
    let kind = kind_of(&meta);
    let size = (kind == EntryKind::File).then_some(meta.len());
    Some((kind, size, modified_ms(&meta)))
}

/// `fs/list`: a directory's entries, sorted by name, at most [`MAX_ENTRIES`].
pub fn list(state: &HostState, params: PathParams) -> Result<FsListResult, AppError> {
    super::host::require(state, Capability::Fs, "fs/list")?;
    list_in(&params.path, &Fence::of(&state.config))
}

/// `fs/stat`: one path described.
pub fn stat(state: &HostState, params: PathParams) -> Result<FsStatResult, AppError> {
    super::host::require(state, Capability::Fs, "fs/stat")?;
    stat_in(&params.path, &Fence::of(&state.config))
}

fn list_in(path: &str, fence: &Fence) -> Result<FsListResult, AppError> {
    let dir = fence.confine(path, "path")?;
    if !dir.is_dir() {
        return Err(racp_proto::validate::invalid("path", "must be a directory"));
    }
    let reader = std::fs::read_dir(&dir).map_err(|e| io_error(&dir, &e))?;
    let mut entries = Vec::new();
    let mut truncated = false;
    for entry in reader.flatten() {
        if entries.len() == MAX_ENTRIES {
            truncated = true;
            break;
        }
        let name = entry.file_name().to_string_lossy().into_owned();
        // The host's own files are not shown, as they cannot be opened (a symlink to them is
        // shown as a symlink leading out).
        if !fence.allows(&entry.path()) {
            continue;
        }
        if let Some((kind, size, modified_at)) = describe(&entry.path(), fence) {
            entries.push(FsEntry {
                name,
                kind,
                size,
                modified_at,
            });
        }
    }
    entries.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(FsListResult {
        path: dir.display().to_string(),
        entries,
        truncated,
    })
}

fn stat_in(path: &str, fence: &Fence) -> Result<FsStatResult, AppError> {
    let target = fence.confine(path, "path")?;
    let meta = std::fs::metadata(&target).map_err(|e| io_error(&target, &e))?;
    let kind = kind_of(&meta);
    Ok(FsStatResult {
        path: target.display().to_string(),
        kind,
        size: (kind == EntryKind::File).then_some(meta.len()),
        modified_at: modified_ms(&meta),
    })
}
