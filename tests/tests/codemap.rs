//! docs/architecture.md is a codemap that stays true: every source file of the crates, the
//! TypeScript client and the harness has a row (by its own name, or by a folder row that holds
//! it), and every file or folder a row names exists. The same for the mutation run's list
//! (docs/reliability.md §8): every mutant still applies to today's code, once.
//!
//! A row's first cell names what it is about in backticks: a path relative to its section's
//! folder (`### pi-host/src`: `sessions/`, `admin.rs`), or from the repository's root, with
//! `{a,b}` standing for each of a and b.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// The trees every source file of which the codemap must name.
const TREES: &[&str] = &[
    "racp-proto/src",
    "racp-server/src",
    "pi-host/src",
    "gateway/src",
    "bootstrap/src",
    "clients/ts/src",
    "tests/src",
    "bench/src",
];

const SOURCE: &[&str] = &["rs", "ts", "sh", "mjs"];

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn sources(dir: &Path, out: &mut Vec<String>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path
            .extension()
            .is_some_and(|e| SOURCE.contains(&e.to_str().unwrap_or("")))
            // Unit tests beside the code they test are not rooms of the map.
            && path.file_name().is_some_and(|n| n != "tests.rs")
        {
            let relative = path.strip_prefix(root()).unwrap();
            out.push(relative.to_str().unwrap().replace("/../", "/"));
        }
    }
}

/// `a/{b,c}.rs` → `a/b.rs`, `a/c.rs`.
fn expand(token: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (token.find('{'), token.find('}')) else {
        return vec![token.to_string()];
    };
    let (head, tail) = (&token[..open], &token[close + 1..]);
    token[open + 1..close]
        .split(',')
        .map(|part| format!("{head}{part}{tail}"))
        .collect()
}

/// Every path the first cells of the codemap's rows name, resolved against their sections.
fn named() -> BTreeSet<String> {
    let map = std::fs::read_to_string(root().join("docs/architecture.md")).unwrap();
    let mut section: Option<String> = None;
    let mut named = BTreeSet::new();
    for line in map.lines() {
        if let Some(heading) = line.strip_prefix("### ").or(line.strip_prefix("## ")) {
            let first = heading.split_whitespace().next().unwrap_or("");
            section = Path::new(&root().join(first))
                .is_dir()
                .then(|| first.trim_end_matches('/').to_string());
            continue;
        }
        let Some(row) = line.strip_prefix("| ") else {
            continue;
        };
        let first_cell = row.split(" | ").next().unwrap_or("");
        for token in first_cell.split('`').skip(1).step_by(2) {
            for path in expand(token) {
                let looks_like_a_path =
                    path.ends_with('/') || Path::new(&path).extension().is_some();
                if !looks_like_a_path {
                    continue;
                }
                let in_section = section.as_ref().map(|s| format!("{s}/{path}"));
                let resolved = in_section
                    .filter(|p| root().join(p).exists())
                    .unwrap_or(path.clone());
                named.insert(resolved);
            }
        }
    }
    named
}

#[test]
fn every_source_file_has_a_row_and_every_row_names_a_file_that_exists() {
    let named = named();
    let stale: Vec<&String> = named
        .iter()
        .filter(|path| !root().join(path.as_str()).exists())
        .collect();
    assert!(
        stale.is_empty(),
        "rows name files that do not exist: {stale:?}"
    );
    let mut files = Vec::new();
    for tree in TREES {
        sources(&root().join(tree), &mut files);
    }
    assert!(files.len() > 100, "found only {} source files", files.len());
    let unnamed: Vec<&String> = files
        .iter()
        .filter(|file| {
            !named.iter().any(|path| {
                path == *file || (path.ends_with('/') && file.starts_with(path.as_str()))
            })
        })
        .collect();
    assert!(
        unnamed.is_empty(),
        "docs/architecture.md has no row for: {unnamed:#?}"
    );
}

/// A mutant whose `from` no longer occurs tests nothing: moved or rewritten code would leave
/// the mutation run checking less than it says, silently.
#[test]
fn every_mutant_of_the_mutation_run_applies_to_todays_code() {
    let checked = std::process::Command::new("python3")
        .arg(root().join("scripts/mutants"))
        .arg("--check")
        .output()
        .expect("python3 runs scripts/mutants");
    let said = String::from_utf8_lossy(&checked.stdout).into_owned()
        + &String::from_utf8_lossy(&checked.stderr);
    assert!(checked.status.success(), "{said}");
    assert!(said.contains("mutants apply"), "{said}");
}
