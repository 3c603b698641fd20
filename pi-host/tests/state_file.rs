//! `serve --state-file`: the SSH bootstrapper learns the host's port from this file.
#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::Value;
use std::path::Path;
use tests::HostProcess;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

#[tokio::test]
async fn the_state_file_names_the_listening_port_and_goes_away_on_a_clean_exit() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    let path_arg = path.to_str().unwrap();
    let mut host = HostProcess::start_with(bin(), &["--state-file", path_arg]).await;

    // The file is written before the "listening" line the harness waits for.
    let state: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(state["listen"], host.addr.to_string());
    assert_eq!(state["pid"], host.pid());
    assert_eq!(state["url"], host.url());
    assert_eq!(state["version"], env!("CARGO_PKG_VERSION"));
    assert!(state["startedAt"].as_u64().unwrap() > 0);
    assert!(state["dataDir"].as_str().unwrap().len() > 1);
    // No temporary file is left beside it.
    let names: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(names, vec!["state.json"]);

    assert!(host.terminate().await, "the host exits cleanly on SIGTERM");
    assert!(!path.exists(), "a clean exit removes the state file");
}

#[tokio::test]
async fn a_killed_host_leaves_a_state_file_that_a_new_host_replaces() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("state.json");
    let path_arg = path.to_str().unwrap();
    let mut host = HostProcess::start_with(bin(), &["--state-file", path_arg]).await;
    let first_pid = host.pid();
    host.kill().await;
    assert!(path.exists(), "a killed host cannot clean up");
    let host = host.restart(&["--state-file", path_arg]).await;
    let state: Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    assert_eq!(state["pid"], host.pid());
    assert_ne!(state["pid"], first_pid);
}
