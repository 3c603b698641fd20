//! The release deploy/release.sh ships for x86_64 Linux: it must run on glibc 2.17 and later
//! (no dynamic symbol of a newer GLIBC version), be stripped (its debug info beside it), and its
//! tarball must stay within 6 MB, so a cold connect uploads little (deploy/README.md, "The glibc
//! floor").
//!
//! Checking the real artifact needs a release build with zig, minutes on CI's two cores: that
//! test is ignored in a plain test run, and scripts/test runs it after building the release
//! (`deploy/release.sh --out target/release-check`, reusing the build cache). The checker itself
//! is tested here on made-up input.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::Value;
use std::path::{Path, PathBuf};
use std::process::Command;

/// The oldest glibc the release runs on.
const GLIBC_FLOOR: &str = "2.17";
/// The largest tarball allowed, in bytes.
const MAX_TARBALL: u64 = 6_000_000;

/// The highest `GLIBC_x.y[.z]` version named in `objdump -T` output.
fn highest_glibc(objdump: &str) -> Option<String> {
    objdump
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == '.'))
        .filter_map(|word| word.strip_prefix("GLIBC_"))
        .filter(|v| !v.is_empty() && v.chars().all(|c| c.is_ascii_digit() || c == '.'))
        .max_by(|a, b| version_cmp(a, b))
        .map(str::to_string)
}

fn version_cmp(a: &str, b: &str) -> std::cmp::Ordering {
    let parts = |v: &str| -> Vec<u64> { v.split('.').map(|p| p.parse().unwrap_or(0)).collect() };
    parts(a).cmp(&parts(b))
}

/// What is wrong with one artifact: its tarball's size, and the `objdump -T` and `readelf -S`
/// output of its binary.
fn problems(tarball_size: u64, objdump: &str, sections: &str) -> Vec<String> {
    let mut found = Vec::new();
    if tarball_size > MAX_TARBALL {
        found.push(format!(
            "the tarball is {tarball_size} bytes, above {MAX_TARBALL}"
        ));
    }
    match highest_glibc(objdump) {
        Some(v) if version_cmp(&v, GLIBC_FLOOR).is_gt() => found.push(format!(
            "the binary needs GLIBC_{v}, above the floor {GLIBC_FLOOR}"
        )),
        Some(_) => {}
        None => found.push("the binary names no GLIBC version (not a glibc build?)".into()),
    }
    if sections.contains(".debug_info") || sections.contains(".debug_line") {
        found.push("the binary carries debug info (it ships stripped)".into());
    }
    found
}

fn run(command: &mut Command) -> String {
    let output = command.output().expect("run a tool");
    assert!(
        output.status.success(),
        "{command:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Checks every x86_64 Linux artifact in a release directory.
fn check_release(dir: &Path) -> Vec<String> {
    let manifest: Value =
        serde_json::from_slice(&std::fs::read(dir.join("manifest.json")).unwrap()).unwrap();
    let mut found = Vec::new();
    let artifacts = manifest["artifacts"].as_array().unwrap();
    let linux: Vec<&Value> = artifacts
        .iter()
        .filter(|a| a["os"] == "linux" && a["arch"] == "x86_64")
        .collect();
    assert!(!linux.is_empty(), "no linux-x86_64 artifact in {manifest}");
    for artifact in linux {
        let file = artifact["file"].as_str().unwrap();
        assert_eq!(
            artifact["glibc"], GLIBC_FLOOR,
            "the manifest records the floor for {file}"
        );
        let tarball = dir.join(file);
        let unpacked = tempfile::tempdir().unwrap();
        run(Command::new("tar")
            .arg("-xzf")
            .arg(&tarball)
            .arg("-C")
            .arg(unpacked.path()));
        let binary = unpacked.path().join("bin/pi-host");
        let objdump = run(Command::new("objdump").arg("-T").arg(&binary));
        let sections = run(Command::new("readelf").arg("-S").arg(&binary));
        let debug = dir.join(file.replace(".tar.gz", ".debug"));
        if !debug.exists() {
            found.push(format!("{}: no debug info beside it", debug.display()));
        }
        let size = std::fs::metadata(&tarball).unwrap().len();
        found.extend(
            problems(size, &objdump, &sections)
                .into_iter()
                .map(|p| format!("{file}: {p}")),
        );
    }
    found
}

fn release_dir() -> PathBuf {
    match std::env::var_os("PI_HOST_RELEASE_DIR") {
        Some(dir) => PathBuf::from(dir),
        None => Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/release-check"),
    }
}

#[test]
#[ignore = "needs the zig release: deploy/release.sh --out target/release-check (scripts/test runs both)"]
fn the_shipped_release_runs_on_glibc_2_17_is_stripped_and_fits_in_6_mb() {
    let dir = release_dir();
    assert!(
        dir.join("manifest.json").exists(),
        "no release in {}: run deploy/release.sh --out {0}",
        dir.display()
    );
    let found = check_release(&dir);
    assert!(found.is_empty(), "{found:#?}");
}

#[test]
fn a_symbol_newer_than_the_floor_or_a_big_tarball_is_caught() {
    let objdump = |versions: &[&str]| -> String {
        versions
            .iter()
            .map(|v| format!("0000000000000000      DF *UND*\t0000000000000000 ({v}) memcpy\n"))
            .collect()
    };
    let sections = "  [27] .symtab           SYMTAB\n";
    assert!(
        problems(
            5_000_000,
            &objdump(&["GLIBC_2.2.5", "GLIBC_2.17"]),
            sections
        )
        .is_empty()
    );
    let newer = problems(5_000_000, &objdump(&["GLIBC_2.17", "GLIBC_2.34"]), sections);
    assert_eq!(newer.len(), 1, "{newer:?}");
    assert!(newer[0].contains("GLIBC_2.34"));
    // 2.9 is older than 2.17: compared as numbers, not text.
    assert!(problems(5_000_000, &objdump(&["GLIBC_2.9"]), sections).is_empty());
    let big = problems(MAX_TARBALL + 1, &objdump(&["GLIBC_2.17"]), sections);
    assert_eq!(big.len(), 1, "{big:?}");
    assert!(big[0].contains("tarball"));
    let unstripped = problems(
        5_000_000,
        &objdump(&["GLIBC_2.17"]),
        "  [30] .debug_info PROGBITS\n",
    );
    assert_eq!(unstripped.len(), 1, "{unstripped:?}");
    assert!(
        !problems(5_000_000, "", sections).is_empty(),
        "no glibc at all"
    );
}

/// The checker on a real binary: this machine's own build of pi-host needs the build machine's
/// glibc (well above 2.17), and the test build carries debug info.
#[test]
fn the_checker_reads_a_real_binary() {
    let binary = tests::pi_host_binary();
    let objdump = run(Command::new("objdump").arg("-T").arg(&binary));
    let highest = highest_glibc(&objdump).expect("a glibc build");
    assert!(version_cmp(&highest, "2.2.5").is_gt(), "{highest}");
}
