//! The agent bundle made twice from the same pi version, lock, Node and architecture, each from
//! its own `npm ci` into its own cache directory, is the same bytes; what never runs on a remote
//! is not in it (docs/architecture.md, "The agent bundle"). npm works from this machine's cache
//! (scripts/test fills it), reaching no registry.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::Value;
use std::path::Path;

fn make_bundle(cache: &Path) -> Value {
    let output =
        std::process::Command::new(tests::workspace_binary("bootstrap", "pi-remote", None))
            .args(["--json", "bundle", "--arch", "x86_64", "--node"])
            .env("PI_REMOTE_CACHE_DIR", cache)
            .env("npm_config_offline", "true")
            .output()
            .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    serde_json::from_slice(&output.stdout).unwrap()
}

#[test]
fn two_bundles_made_apart_from_the_same_inputs_are_byte_identical() {
    let (one, two) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let first = make_bundle(one.path());
    let second = make_bundle(two.path());
    assert_ne!(first["path"], second["path"]);
    assert_eq!(first["sha256"], second["sha256"], "{first}\n{second}");
    assert_eq!(first["bytes"], second["bytes"]);
    assert_eq!(first["parts"], second["parts"]);
    assert!(
        first["parts"]["nodeBytes"].as_u64().unwrap() > 10_000_000,
        "{first}"
    );

    let listing = std::process::Command::new("tar")
        .arg("-tzf")
        .arg(first["path"].as_str().unwrap())
        .output()
        .unwrap();
    assert!(listing.status.success());
    let listing = String::from_utf8(listing.stdout).unwrap();
    let names: Vec<&str> = listing.lines().collect();
    assert_eq!(names.last(), Some(&"bin/node"), "Node goes last");
    assert!(names.contains(&"bin/pi"));
    let outside_pi = |name: &&&str| !name.starts_with("lib/node_modules/@mariozechner/");
    for never in [".map", ".d.ts", ".md"] {
        let shipped: Vec<&&str> = names
            .iter()
            .filter(outside_pi)
            .filter(|n| n.ends_with(never))
            .collect();
        assert!(
            shipped.is_empty(),
            "{never}: {:?}",
            &shipped[..shipped.len().min(5)]
        );
    }
    // pi's own docs ship: pi reads them at run time.
    assert!(names.contains(&"lib/node_modules/@mariozechner/pi-coding-agent/README.md"));
    let koffi: Vec<&&str> = names
        .iter()
        .filter(|n| n.contains("/koffi/build/koffi/") && n.ends_with(".node"))
        .collect();
    assert!(koffi.iter().all(|n| n.contains("/linux_x64/")), "{koffi:?}");
}
