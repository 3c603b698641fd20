//! Writes the generated documents (docs/error-codes.md, docs/schema/, clients/ts/).
//!
//! `racp-codegen` rewrites them; `racp-codegen --check` exits 1 if any is stale.

use std::path::PathBuf;
use std::process::ExitCode;

fn main() -> ExitCode {
    let check = std::env::args().any(|arg| arg == "--check");
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut stale = 0;
    for artifact in racp_proto::codegen::artifacts() {
        let path = root.join(artifact.path);
        let current = std::fs::read_to_string(&path).unwrap_or_default();
        if current == artifact.contents {
            continue;
        }
        if check {
            eprintln!("stale: {}", artifact.path);
            stale += 1;
            continue;
        }
        if let Some(parent) = path.parent()
            && let Err(err) = std::fs::create_dir_all(parent)
        {
            eprintln!("cannot create {}: {err}", parent.display());
            return ExitCode::FAILURE;
        }
        if let Err(err) = std::fs::write(&path, &artifact.contents) {
            eprintln!("cannot write {}: {err}", path.display());
            return ExitCode::FAILURE;
        }
        println!("wrote {}", artifact.path);
    }
    if stale > 0 {
        eprintln!("run `{}` to regenerate", racp_proto::codegen::REGENERATE);
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
