//! The generated documents must match the code. On failure, run the command in the message.

use std::path::PathBuf;

#[test]
fn generated_files_are_fresh() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut stale = Vec::new();
    for artifact in racp_proto::codegen::artifacts() {
        let on_disk = std::fs::read_to_string(root.join(artifact.path)).unwrap_or_default();
        if on_disk != artifact.contents {
            stale.push(artifact.path);
        }
    }
    assert!(
        stale.is_empty(),
        "stale generated files {stale:?}: run `{}`",
        racp_proto::codegen::REGENERATE
    );
}
