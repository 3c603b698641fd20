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
    let outside = client.call("fs/list", json!({"path": "/etc"})).await;
    assert_eq!(code(outside.clone()), "REMOTE_PATH_FORBIDDEN");
    // The refusal names where paths may be.
    let root_text = root.display().to_string();
    assert!(
        outside["error"]["message"]
            .as_str()
            .unwrap()
            .contains(&root_text),
        "{outside}"
    );
    assert!(
        outside["error"]["details"]["roots"]
            .as_array()
            .unwrap()
            .iter()
            .any(|r| r == &json!(root_text)),
        "{outside}"
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

/// A root that holds the host's data directory (as `$HOME` does by default) still keeps it out
/// of reach: no listing, stat or workspace inside it, and it is not shown in its parent.
#[tokio::test]
async fn the_data_directory_is_out_of_reach_whatever_the_roots() {
    let temp = std::env::temp_dir().canonicalize().unwrap();
    let host = HostProcess::start_with(bin(), &["--root", temp.to_str().unwrap()]).await;
    let (_, token) = host.pair_device("laptop", &["--roles", "operator"]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let data = host.data_dir.path().canonicalize().unwrap();
    assert!(data.starts_with(&temp), "the data dir lies inside the root");

    let code = |reply: serde_json::Value| reply["error"]["code"].as_str().unwrap_or("").to_string();
    for path in [
        data.clone(),
        data.join("host.key"),
        data.join("pi-host.db"),
        data.join("no-such-file"),
        data.join("../").join(data.file_name().unwrap()),
    ] {
        for method in ["fs/list", "fs/stat"] {
            let reply = client.call(method, json!({"path": path})).await;
            assert_eq!(
                code(reply),
                "REMOTE_PATH_FORBIDDEN",
                "{method} {}",
                path.display()
            );
        }
    }
    let created = client
        .call("session/create", json!({"workspace": data}))
        .await;
    assert_eq!(code(created), "REMOTE_PATH_FORBIDDEN");
    // A symlink to it from inside the root leads nowhere either.
    let link = host.root.path().join("data-link");
    std::os::unix::fs::symlink(&data, &link).unwrap();
    let reply = client
        .call("fs/stat", json!({"path": link.join("host.key")}))
        .await;
    assert_eq!(code(reply), "REMOTE_PATH_FORBIDDEN");

    let parent = client
        .call("fs/list", json!({"path": data.parent().unwrap()}))
        .await;
    let names: Vec<&str> = parent["result"]["entries"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["name"].as_str().unwrap())
        .collect();
    assert!(!names.is_empty());
    let data_name = data.file_name().unwrap().to_str().unwrap();
    assert!(
        !names.contains(&data_name),
        "the data dir is listed: {names:?}"
    );
}

/// Outside the roots, a path that exists and one that does not answer the same way.
#[tokio::test]
async fn paths_outside_the_roots_do_not_reveal_whether_they_exist() {
    let host = HostProcess::start(bin()).await;
    let (_, token) = host.pair_device("phone", &["--roles", "observer"]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let outside = tempfile::tempdir().unwrap();
    std::fs::write(outside.path().join("shadow"), "secret").unwrap();
    let root = host.root.path();
    std::os::unix::fs::symlink(outside.path(), root.join("etc")).unwrap();
    std::os::unix::fs::symlink(outside.path().join("gone"), root.join("dangling")).unwrap();

    let mut answers = Vec::new();
    for path in [
        root.join("etc/shadow"),
        root.join("etc/no-such-file"),
        root.join("etc/no/such/dir"),
        root.join("dangling"),
        outside.path().join("shadow"),
        outside.path().join("no-such-file"),
    ] {
        let reply = client.call("fs/stat", json!({"path": path})).await;
        answers.push((path, reply["error"]["code"].clone()));
    }
    for (path, code) in &answers {
        assert_eq!(code, "REMOTE_PATH_FORBIDDEN", "{}", path.display());
    }
    let missing = client
        .call("fs/stat", json!({"path": root.join("no-such-file")}))
        .await;
    assert_eq!(missing["error"]["code"], "REMOTE_PATH_NOT_FOUND");
}
