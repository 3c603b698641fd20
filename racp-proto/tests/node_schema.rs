//! Runs tests/node/validate.mjs: ajv validates every sample frame against the generated JSON
//! Schema, and tsc type-checks the generated TypeScript declarations against the valid samples.
//! Needs `npm ci --prefix tests/node` (scripts/test does it).

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::path::PathBuf;
use std::process::Command;

#[test]
fn node_validates_samples_against_schema_and_types() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..");
    let node_dir = root.join("tests/node");
    assert!(
        node_dir.join("node_modules/ajv").is_dir(),
        "tests/node has no node_modules: run `npm ci --prefix tests/node` (scripts/test does)"
    );
    let output = Command::new("node")
        .arg(node_dir.join("validate.mjs"))
        .output()
        .expect("node must be installed to run the schema checks");
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        output.status.success(),
        "schema checks failed:\n{stdout}\n{stderr}"
    );
    assert!(
        stdout.contains(" passed, 0 failed"),
        "unexpected output: {stdout}"
    );
}
