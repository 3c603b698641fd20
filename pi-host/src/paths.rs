//! Confining client-supplied paths to the host's permitted roots, symlinks included.

use racp_proto::{AppError, ErrorCode};
use serde_json::json;
use std::path::{Component, Path, PathBuf};

/// Resolves `path` (absolute, symlinks followed) and checks it lies inside one of `roots`.
///
/// The lexical form is checked before touching the file system, so probing outside the roots
/// reveals nothing about what exists there; the canonical form is checked again afterwards, so
/// a symlink inside a root cannot lead out of it.
pub fn confine(path: &str, field: &str, roots: &[PathBuf]) -> Result<PathBuf, AppError> {
    let requested = Path::new(path);
    if !requested.is_absolute() {
        return Err(racp_proto::validate::invalid(
            field,
            "must be an absolute path",
        ));
    }
    let lexical = normalize(requested);
    let forbidden = || {
        AppError::new(
            ErrorCode::RemotePathForbidden,
            format!("{path} is outside the host's permitted roots"),
        )
        .with_details(json!({"path": path}))
    };
    let canonical_roots: Vec<PathBuf> = roots
        .iter()
        .filter_map(|r| std::fs::canonicalize(r).ok())
        .collect();
    let inside = |p: &Path| {
        roots
            .iter()
            .chain(canonical_roots.iter())
            .any(|r| p.starts_with(r))
    };
    if !inside(&lexical) {
        return Err(forbidden());
    }
    let canonical = std::fs::canonicalize(&lexical).map_err(|err| {
        if err.kind() == std::io::ErrorKind::NotFound {
            AppError::new(
                ErrorCode::RemotePathNotFound,
                format!("{path} does not exist"),
            )
            .with_details(json!({"path": path}))
        } else {
            forbidden()
        }
    })?;
    if !canonical_roots.iter().any(|r| canonical.starts_with(r)) {
        return Err(forbidden());
    }
    Ok(canonical)
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

    #[test]
    fn confines_to_roots_through_dots_and_symlinks() {
        let root = tempfile::tempdir().unwrap();
        let outside = tempfile::tempdir().unwrap();
        let inner = root.path().join("project");
        std::fs::create_dir(&inner).unwrap();
        std::os::unix::fs::symlink(outside.path(), root.path().join("escape")).unwrap();
        let roots = vec![root.path().to_path_buf()];
        let s = |p: &Path| p.to_str().unwrap().to_string();

        assert!(confine(&s(&inner), "workspace", &roots).is_ok());
        let code = |p: String| confine(&p, "workspace", &roots).unwrap_err().code();
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
        assert_eq!(code("relative/path".into()), ErrorCode::InvalidParams);
    }
}
