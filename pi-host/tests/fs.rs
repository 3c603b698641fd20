//! `fs/list` and `fs/stat` stay inside the permitted roots, symlinks and `..` included.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::json;
use std::path::Path;
use tests::{Client, HostProcess};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

#[tokio::test]
async fn listing_and_stat_are_confined_to_the_roots() {
    let host = HostProcess::start(bin()).await;
    let (_, token) = host.pair_device("phone", &["--roles", "observer"]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    let hello = client.hello().await;
    assert!(
        hello["capabilities"]
            .as_array()
            .unwrap()
            .contains(&json!("fs"))
    );

    let root = host.root.path();
    let project = host.workspace("project");
    std::fs::write(root.join("notes.md"), "hello").unwrap();
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("secret.txt"), "x").unwrap();
    std::os::unix::fs::symlink(outside.path(), root.join("escape")).unwrap();
    std::os::unix::fs::symlink(&project, root.join("shortcut")).unwrap();

    let listed = client.call("fs/list", json!({"path": root})).await;
    let entries = listed["result"]["entries"].as_array().unwrap();
    let names: Vec<&str> = entries
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert_eq!(
        names,
        ["escape", "notes.md", "project", "shortcut"],
        "sorted by name"
    );
    let kind = |name: &str| entries.iter().find(|e| e["name"] == name).unwrap()["kind"].clone();
    assert_eq!(kind("project"), "dir");
    assert_eq!(kind("notes.md"), "file");
    assert_eq!(
        kind("shortcut"),
        "dir",
        "a link inside the roots shows its target"
    );
    assert_eq!(
        kind("escape"),
        "symlink",
        "a link out of the roots stays a link"
    );
    let notes = entries.iter().find(|e| e["name"] == "notes.md").unwrap();
    assert_eq!(notes["size"], 5);

    let stat = client
        .call(
            "fs/stat",
            json!({"path": format!("{}/notes.md", root.display())}),
        )
        .await;
    assert_eq!(stat["result"]["kind"], "file");

    let code = |reply: serde_json::Value| reply["error"]["code"].clone();
    let escape = format!("{}/escape", root.display());
    assert_eq!(
        code(client.call("fs/list", json!({"path": escape})).await),
        "REMOTE_PATH_FORBIDDEN"
    );
    let through = format!("{}/escape/secret.txt", root.display());
    assert_eq!(
        code(client.call("fs/stat", json!({"path": through})).await),
        "REMOTE_PATH_FORBIDDEN"
    );
    let dotdot = format!("{}/project/../..", root.display());
    assert_eq!(
        code(client.call("fs/list", json!({"path": dotdot})).await),
        "REMOTE_PATH_FORBIDDEN"
    );
    assert_eq!(
        code(client.call("fs/list", json!({"path": "/etc"})).await),
        "REMOTE_PATH_FORBIDDEN"
    );
    let missing = format!("{}/missing", root.display());
    assert_eq!(
        code(client.call("fs/stat", json!({"path": missing})).await),
        "REMOTE_PATH_NOT_FOUND"
    );
    let file = format!("{}/notes.md", root.display());
    assert_eq!(
        code(client.call("fs/list", json!({"path": file})).await),
        "INVALID_PARAMS"
    );
    assert_eq!(
        code(client.call("fs/list", json!({"path": "relative"})).await),
        "INVALID_PARAMS"
    );
}

#[tokio::test]
async fn with_fs_off_the_capability_is_gone_and_calls_say_so() {
    let host = HostProcess::start_with(bin(), &["--disable-fs"]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    let hello = client.hello().await;
    let capabilities = hello["capabilities"].as_array().unwrap();
    assert!(!capabilities.contains(&json!("fs")));
    assert!(capabilities.contains(&json!("sessions")));
    let reply = client
        .call("fs/list", json!({"path": host.root.path()}))
        .await;
    assert_eq!(reply["error"]["code"], "CAPABILITY_UNAVAILABLE");
    assert_eq!(reply["error"]["details"]["capability"], "fs");
    let info = client.call("host/info", json!({})).await;
    assert_eq!(info["result"]["capabilities"], hello["capabilities"]);
}
