//! `fs/list` and `fs/stat`: browsing the host's permitted roots (for a folder picker);
//! `fs/read`: a file's contents, a page at a time.

use crate::AppError;
use crate::limits::{MAX_PATH_CHARS, MAX_READ_BYTES};
use crate::validate::{Validate, invalid, length};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// What a directory entry is. Symlinks are reported as what they point to when the target is
/// inside the permitted roots, and as `symlink` otherwise.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum EntryKind {
    File,
    Dir,
    Symlink,
    Other,
}

/// A path on the host. Relative paths are refused; `~` is not expanded.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct PathParams {
    #[schemars(length(min = 1, max = MAX_PATH_CHARS))]
    pub path: String,
}

impl Validate for PathParams {
    fn validate(&self) -> Result<(), AppError> {
        length("path", &self.path, 1, MAX_PATH_CHARS)
    }
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FsEntry {
    pub name: String,
    pub kind: EntryKind,
    /// Size in bytes, for files.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    /// Last modification (ms since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified_at: Option<u64>,
}

/// A directory's entries, sorted by name.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FsListResult {
    /// The canonical path that was listed.
    pub path: String,
    pub entries: Vec<FsEntry>,
    /// True when the listing was cut at the host's entry bound.
    #[serde(default)]
    pub truncated: bool,
}

/// One path's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FsStatResult {
    /// The canonical path.
    pub path: String,
    pub kind: EntryKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub size: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified_at: Option<u64>,
}

/// How a page of a file is written in `fs/read`'s `data`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ReadEncoding {
    /// The bytes as text; only for a page that is valid UTF-8.
    Utf8,
    /// The bytes in standard base64, whatever they are.
    Base64,
}

/// `fs/read`'s params: a page of a file from `offset`, at most `length` bytes.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FsReadParams {
    #[schemars(length(min = 1, max = MAX_PATH_CHARS))]
    pub path: String,
    /// The first byte to read (0 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub offset: Option<u64>,
    /// Most bytes to read: 1 to 524 288 (262 144 when absent).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(range(min = 1, max = MAX_READ_BYTES))]
    pub length: Option<u64>,
    /// `base64` to have a binary page's bytes too (a text page is UTF-8 unless this asks
    /// otherwise); absent: text as UTF-8, a binary page flagged without its bytes.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<ReadEncoding>,
}

impl Validate for FsReadParams {
    fn validate(&self) -> Result<(), AppError> {
        length("path", &self.path, 1, MAX_PATH_CHARS)?;
        match self.length {
            Some(0) => Err(invalid("length", "must be at least 1")),
            Some(n) if n > MAX_READ_BYTES => Err(invalid(
                "length",
                format!("must be at most {MAX_READ_BYTES}: read a longer file in pages"),
            )),
            _ => Ok(()),
        }
    }
}

/// A page of a file, and what a client needs to cache it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct FsReadResult {
    /// The canonical path that was read.
    pub path: String,
    /// The whole file's size in bytes.
    pub size: u64,
    /// Last modification (ms since the Unix epoch).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub modified_at: Option<u64>,
    /// SHA-256 of the whole file, as 64 lowercase hex digits: unchanged means unchanged.
    pub sha256: String,
    /// Where the page starts.
    pub offset: u64,
    /// The page's length in bytes (a text page ends on a whole character, so it may be a few
    /// bytes shorter than asked).
    pub length: u64,
    /// True when the page reaches the end of the file; else read on from `offset + length`.
    pub eof: bool,
    /// True when the page is not UTF-8 text (it holds a NUL byte or invalid UTF-8).
    pub binary: bool,
    /// How `data` is written; absent with `data` for a binary page not asked as `base64`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub encoding: Option<ReadEncoding>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data: Option<String>,
}
