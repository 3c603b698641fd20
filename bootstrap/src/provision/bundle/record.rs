//! The record kept beside a cached bundle (`NAME.tar.gz.json`): what the archive holds, for
//! the upload lines, which cannot be read back from the gzip without unpacking it. A bundle
//! without its record (an older layout, a write cut short) is made again.

use super::archive::Parts;
use super::{Bundle, failed};
use racp_proto::AppError;
use serde_json::json;
use std::path::{Path, PathBuf};

fn path_of(bundle: &Path) -> PathBuf {
    let mut name = bundle.as_os_str().to_owned();
    name.push(".json");
    PathBuf::from(name)
}

/// The record of the bundle at `bundle`, when both are there.
pub fn read(bundle: &Path) -> Option<Parts> {
    if !bundle.is_file() {
        return None;
    }
    let bytes = std::fs::read(path_of(bundle)).ok()?;
    let record: serde_json::Value = serde_json::from_slice(&bytes).ok()?;
    serde_json::from_value(record["parts"].clone()).ok()
}

/// Writes the record of `bundle` (after the bundle itself: a record never names a bundle
/// that is not whole).
pub fn write(bundle: &Bundle) -> Result<(), AppError> {
    let path = path_of(&bundle.path);
    let record = json!({
        "sha256": bundle.sha256,
        "bytes": bundle.len,
        "node": bundle.node,
        "parts": bundle.parts,
    });
    let partial = path.with_extension(format!("json.{}", super::super::nonce()));
    std::fs::write(&partial, record.to_string())
        .and_then(|()| std::fs::rename(&partial, &path))
        .map_err(|e| failed(format!("cannot write {}: {e}", path.display()), json!({})))
}
