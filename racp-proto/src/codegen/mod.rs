//! Renders the documents generated from the protocol types. Each function is pure so that the
//! staleness tests can compare its output with the file on disk.

mod error_docs;
mod schema;
mod typescript;

pub use error_docs::render_error_codes_md;
pub use schema::{protocol_schema, render_schema_json};
pub use typescript::render_typescript;

/// One generated file: its path relative to the repository root, and its contents.
pub struct Artifact {
    pub path: &'static str,
    pub contents: String,
}

/// Every generated file.
pub fn artifacts() -> Vec<Artifact> {
    let schema = protocol_schema();
    vec![
        Artifact {
            path: "docs/error-codes.md",
            contents: render_error_codes_md(),
        },
        Artifact {
            path: "docs/schema/racp.v1.schema.json",
            contents: render_schema_json(&schema),
        },
        Artifact {
            path: "clients/ts/racp.ts",
            contents: render_typescript(&schema),
        },
    ]
}

/// The command that regenerates every artifact, quoted in their headers and in test failures.
pub const REGENERATE: &str = "cargo run -p racp-proto --bin racp-codegen";
