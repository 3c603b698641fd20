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

/// Every file and folder under `dir` with any group or other permission bit, with its mode.
fn open_to_others(dir: &Path) -> Vec<String> {
    use std::os::unix::fs::PermissionsExt;
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            let meta = std::fs::symlink_metadata(&path).unwrap();
            if meta.permissions().mode() & 0o077 != 0 {
                found.push(format!(
                    "{} {:o}",
                    path.display(),
                    meta.permissions().mode()
                ));
            }
            if meta.is_dir() {
                stack.push(path);
            }
        }
    }
    found
}

#[tokio::test]
async fn under_umask_000_no_file_the_host_writes_is_open_to_others() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    // The host as a service manager with a careless umask would start it.
    let wrapper = dir.path().join("pi-host-umask-000");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\numask 000\nexec '{}' \"$@\"\n", bin().display()),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let state_dir = tempfile::tempdir().unwrap();
    let path = state_dir.path().join("state.json");
    let host = HostProcess::start_with(&wrapper, &["--state-file", path.to_str().unwrap()]).await;

    // Make the host write what it keeps: a device (the store), a credential, a custom provider.
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = tests::Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let set = client
        .call(
            "credential/set",
            serde_json::json!({"provider": "openai", "apiKey": "sk-umask-test-0123456789abcdef"}),
        )
        .await;
    assert!(set.get("result").is_some(), "{set}");

    let mode = std::fs::metadata(&path).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "the state file is {mode:o}");
    assert!(
        std::fs::read_dir(host.data_dir.path()).unwrap().count() > 3,
        "the host wrote its files"
    );
    assert_eq!(open_to_others(host.data_dir.path()), Vec::<String>::new());
    assert_eq!(open_to_others(state_dir.path()), Vec::<String>::new());
}

#[tokio::test]
async fn a_second_serve_names_the_host_already_running_here() {
    let host = HostProcess::start(bin()).await;
    let listen = host.addr.to_string();
    let root = host.workspace("w");
    let (ok, _, stderr) = host
        .cli(&["serve", "--listen", &listen, "--root", &root])
        .await;
    assert!(!ok);
    let running = format!(
        "a host is already running with data directory {} (pid {}, listening on {listen})",
        host.data_dir.path().display(),
        host.pid()
    );
    assert!(stderr.contains(&running), "{stderr}");
    // On another port with the same data directory: refused too, before touching the admin
    // socket or the store, and the first host still answers.
    let args = ["serve", "--listen", "127.0.0.1:0", "--root", &root];
    let second = host.cli(&args);
    let (ok, _, stderr) = tokio::time::timeout(tests::PATIENCE, second)
        .await
        .expect("a second serve on the same data directory runs instead of refusing");
    assert!(!ok);
    assert!(stderr.contains(&running), "{stderr}");
    let (ok, status, stderr) = host.cli(&["status", "--json"]).await;
    assert!(ok, "{stderr}");
    assert!(
        status.contains(&format!("\"pid\":{}", host.pid())),
        "{status}"
    );
    // Another data directory on the same port: only the port is known.
    let other = tempfile::tempdir().unwrap();
    let output = tokio::process::Command::new(bin())
        .args(["serve", "--listen", &listen, "--root", &root, "--data-dir"])
        .arg(other.path())
        .output()
        .await
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(!output.status.success());
    assert!(
        stderr.contains(&format!(
            "port {} is taken by another process",
            host.addr.port()
        )),
        "{stderr}"
    );
}
