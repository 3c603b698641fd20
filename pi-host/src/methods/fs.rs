//! `fs/list` and `fs/stat`: browsing inside the permitted roots, for the desktop's folder
//! picker; `fs/read`: a file's contents a page at a time. All need the `fs` capability, which
//! the host's owner may switch off.

use crate::fence::Fence;
use crate::state::HostState;
use racp_proto::Capability;
use racp_proto::limits::DEFAULT_READ_BYTES;
use racp_proto::methods::fs::{EntryKind, FsEntry, FsListResult, FsStatResult};
use racp_proto::methods::fs::{FsReadParams, FsReadResult, PathParams, ReadEncoding};
use racp_proto::{AppError, ErrorCode};
use racp_server::wire::to_raw;
use serde_json::json;
use serde_json::value::RawValue;
use std::fs::File;
use std::fs::Metadata;
use std::io::Read;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
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

/// `fs/read`: a page of a file from `offset`, with the whole file's size, time and SHA-256
/// (docs/protocol.md §7.8). What the page and its result hold is charged to the host's byte
/// budget until the result is written.
pub fn read(state: &HostState, params: FsReadParams) -> Result<Box<RawValue>, AppError> {
    super::host::require(state, Capability::Fs, "fs/read")?;
    let target = Fence::of(&state.config).confine(&params.path, "path")?;
    denied(state, &target)?;
    let length = params.length.unwrap_or(DEFAULT_READ_BYTES);
    // The page, its base64 and the JSON written from it.
    let _held = state.budget.charge(length as usize * 4)?;
    let file = open_file(&target)?;
    let meta = file.metadata().map_err(|e| io_error(&target, &e))?;
    let sha256 = hash_of(&file, &meta).map_err(|e| io_error(&target, &e))?;
    let offset = params.offset.unwrap_or(0);
    let bytes = read_at(&file, offset, length).map_err(|e| io_error(&target, &e))?;
    let page = Page::of(bytes, offset, meta.len());
    let (length, binary) = (page.bytes.len() as u64, !page.text);
    let encoding = page.encoding(params.encoding);
    to_raw(&FsReadResult {
        path: target.display().to_string(),
        size: meta.len(),
        modified_at: modified_ms(&meta),
        sha256,
        offset,
        length,
        eof: offset.saturating_add(length) >= meta.len(),
        binary,
        encoding,
        data: page.into_data(encoding),
    })
}

/// The permission policy's always-on denylist holds for devices too: no role reads a private
/// key, an `.env` file or a credential bundle through the host (docs/protocol.md §10.1).
fn denied(state: &HostState, target: &Path) -> Result<(), AppError> {
    let home = std::env::var_os("HOME").map(std::path::PathBuf::from);
    let home = home.map(|h| std::fs::canonicalize(&h).unwrap_or(h));
    let denylist = crate::policy::denylist::Denylist::for_host(&state.config, home.as_deref());
    let Some(what) = denylist.hit(target, false) else {
        return Ok(());
    };
    let display = target.display().to_string();
    Err(AppError::new(
        ErrorCode::WorkspacePathDenied,
        format!(
            "{display} is on the always-on denylist ({what}): no device reads it through the host"
        ),
    )
    .with_details(json!({"path": display})))
}

/// Opens a regular file without following a link put in the path's place since it was
/// resolved, and without blocking on a FIFO or a device.
fn open_file(path: &Path) -> Result<File, AppError> {
    let flags = nix::fcntl::OFlag::O_NOFOLLOW | nix::fcntl::OFlag::O_NONBLOCK;
    let file = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(flags.bits())
        .open(path)
        .map_err(|e| io_error(path, &e))?;
    let meta = file.metadata().map_err(|e| io_error(path, &e))?;
    let display = path.display().to_string();
    if meta.is_dir() {
        return Err(AppError::new(
            ErrorCode::ReadPathIsDirectory,
            format!("{display} is a directory: list it with fs/list"),
        )
        .with_details(json!({"path": display})));
    }
    if !meta.is_file() {
        return Err(racp_proto::validate::invalid(
            "path",
            "is not a regular file (a FIFO, socket or device cannot be read)",
        ));
    }
    Ok(file)
}

/// Files hashed lately, by inode, with what would change if their content did (size, and the
/// change time, which any write moves): a file read in pages is hashed once, not once a page.
static HASHES: std::sync::LazyLock<dashmap::DashMap<(u64, u64), (Stamp, String)>> =
    std::sync::LazyLock::new(dashmap::DashMap::new);
/// Most files whose hash is kept; past it the cache starts over.
const MAX_HASHES: usize = 256;

type Stamp = (u64, i64, i64);

fn stamp(meta: &Metadata) -> Stamp {
    use std::os::unix::fs::MetadataExt;
    (meta.size(), meta.ctime(), meta.ctime_nsec())
}

/// The whole file's SHA-256, from the cache while the file's stamp is unchanged; a file that
/// changed while it was hashed is not kept.
fn hash_of(file: &File, meta: &Metadata) -> std::io::Result<String> {
    use std::os::unix::fs::MetadataExt;
    let key = (meta.dev(), meta.ino());
    if let Some(known) = HASHES.get(&key)
        && known.0 == stamp(meta)
    {
        return Ok(known.1.clone());
    }
    let sha256 = sha256_of(file)?;
    if stamp(&file.metadata()?) == stamp(meta) {
        if HASHES.len() >= MAX_HASHES {
            HASHES.clear();
        }
        HASHES.insert(key, (stamp(meta), sha256.clone()));
    }
    Ok(sha256)
}

/// The whole file's SHA-256, read in blocks, as lowercase hex.
fn sha256_of(file: &File) -> std::io::Result<String> {
    let mut context = ring::digest::Context::new(&ring::digest::SHA256);
    let mut reader = file;
    let mut block = vec![0u8; 64 << 10];
    loop {
        let n = reader.read(&mut block)?;
        if n == 0 {
            break;
        }
        context.update(&block[..n]);
    }
    let digest = context.finish();
    Ok(digest.as_ref().iter().map(|b| format!("{b:02x}")).collect())
}

/// Up to `length` bytes from `offset` (fewer at the end of the file).
fn read_at(file: &File, offset: u64, length: u64) -> std::io::Result<Vec<u8>> {
    let available = file.metadata()?.len().saturating_sub(offset);
    let mut bytes = vec![0u8; length.min(available) as usize];
    let mut filled = 0;
    while filled < bytes.len() {
        let n = file.read_at(&mut bytes[filled..], offset + filled as u64)?;
        if n == 0 {
            break;
        }
        filled += n;
    }
    bytes.truncate(filled);
    Ok(bytes)
}

/// A page as read, told text or binary.
struct Page {
    bytes: Vec<u8>,
    text: bool,
}

impl Page {
    /// Text is UTF-8 without a NUL byte. A character cut by the page's end is left to the next
    /// page; a page too short to hold its first character whole is binary.
    fn of(mut bytes: Vec<u8>, offset: u64, size: u64) -> Page {
        if memchr::memchr(0, &bytes).is_some() {
            return Page { bytes, text: false };
        }
        let at_end = offset.saturating_add(bytes.len() as u64) >= size;
        let text = match std::str::from_utf8(&bytes) {
            Ok(_) => true,
            Err(cut) if cut.error_len().is_none() && !at_end && cut.valid_up_to() > 0 => {
                bytes.truncate(cut.valid_up_to());
                true
            }
            Err(_) => false,
        };
        Page { bytes, text }
    }

    fn encoding(&self, asked: Option<ReadEncoding>) -> Option<ReadEncoding> {
        match (asked, self.text) {
            (Some(ReadEncoding::Base64), _) => Some(ReadEncoding::Base64),
            (_, true) => Some(ReadEncoding::Utf8),
            (_, false) => None,
        }
    }

    fn into_data(self, encoding: Option<ReadEncoding>) -> Option<String> {
        use base64::Engine;
        match encoding? {
            ReadEncoding::Base64 => {
                Some(base64::engine::general_purpose::STANDARD.encode(&self.bytes))
            }
            ReadEncoding::Utf8 => String::from_utf8(self.bytes).ok(),
        }
    }
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
