//! Every registered code is raised somewhere outside tests, or is marked reserved
//! (`reserved: true` in its registry row): a dead code is visible instead of documented as if a client could
//! meet it (docs/reliability.md §2.4).
//!
//! A textual scan of the workspace's source (`racp-proto`, `pi-host`, `bootstrap`): an
//! occurrence of `ErrorCode::Variant` outside `#[cfg(test)] mod … { }` blocks, `tests.rs` files
//! and the registry itself counts as raising the code.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use racp_proto::ErrorCode;
use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The source without its `#[cfg(test)] mod name { ... }` blocks.
fn without_test_modules(source: &str) -> String {
    let mut out = String::new();
    let mut rest = source;
    while let Some(at) = rest.find("#[cfg(test)]") {
        out.push_str(&rest[..at]);
        let after = &rest[at + "#[cfg(test)]".len()..];
        let trimmed = after.trim_start();
        let is_block = trimmed.starts_with("mod ")
            && trimmed
                .find(['{', ';'])
                .is_some_and(|i| trimmed.as_bytes()[i] == b'{');
        if !is_block {
            out.push_str("#[cfg(test)]");
            rest = after;
            continue;
        }
        let open = after.find('{').unwrap();
        let mut depth = 0usize;
        let mut end = after.len();
        for (i, c) in after[open..].char_indices() {
            match c {
                '{' => depth += 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = open + i + 1;
                        break;
                    }
                }
                _ => {}
            }
        }
        rest = &after[end..];
    }
    out.push_str(rest);
    out
}

#[test]
fn every_registered_code_is_raised_outside_tests_or_marked_reserved() {
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
    let mut files = Vec::new();
    for krate in [
        "racp-proto/src",
        "racp-server/src",
        "pi-host/src",
        "gateway/src",
        "bootstrap/src",
    ] {
        rust_files(&workspace.join(krate), &mut files);
    }
    assert!(files.len() > 50, "only {} source files found", files.len());
    let mut raised: BTreeMap<String, BTreeSet<PathBuf>> = BTreeMap::new();
    for file in &files {
        if file.ends_with("tests.rs") || file.ends_with("error/registry.rs") {
            continue;
        }
        let source = without_test_modules(&std::fs::read_to_string(file).unwrap());
        for (at, _) in source.match_indices("ErrorCode::") {
            let name: String = source[at + "ErrorCode::".len()..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            raised.entry(name).or_default().insert(file.clone());
        }
    }
    let mut dead = Vec::new();
    let mut listed_but_raised = Vec::new();
    for code in ErrorCode::ALL {
        let variant = format!("{code:?}");
        let reserved = code.spec().reserved;
        match (raised.get(&variant), reserved) {
            (None, false) => dead.push(code.as_str()),
            (Some(files), true) => {
                listed_but_raised.push(format!("{} in {files:?}", code.as_str()))
            }
            _ => {}
        }
    }
    assert!(
        dead.is_empty(),
        "registered but raised nowhere outside tests (raise them, or mark their rows `reserved: true`): {dead:?}"
    );
    assert!(
        listed_but_raised.is_empty(),
        "marked reserved but raised: {listed_but_raised:?}"
    );
}

#[test]
fn test_modules_are_cut_and_their_declarations_kept() {
    let source = "a ErrorCode::A\n#[cfg(test)]\nmod tests;\n#[cfg(test)]\nfn f() {}\n#[cfg(test)]\nmod tests {\n fn g() { ErrorCode::B } \n}\nz";
    let kept = without_test_modules(source);
    assert!(
        kept.contains("ErrorCode::A") && kept.contains("mod tests;") && kept.contains("fn f()")
    );
    assert!(!kept.contains("ErrorCode::B"), "{kept}");
    assert!(kept.ends_with('z'));
}
