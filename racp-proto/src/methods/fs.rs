//! `fs/list` and `fs/stat`: browsing the host's permitted roots (for a folder picker).

use crate::AppError;
use crate::limits::MAX_PATH_CHARS;
use crate::validate::{Validate, length};
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
