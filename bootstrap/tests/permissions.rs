//! `pi-remote` and the permission policy (docs/protocol.md, "Permissions") with the REAL pi and
//! a stub model that scripts its tool calls: `new --mode`, `configure --mode`, and `attach`
//! showing each question with its tool and command and taking always / deny with a note.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use common::Remote;
use serde_json::{Value, json};
use std::path::Path;
use tests::pi::{Stub, pi_host_with};
use tests::{Client, PATIENCE};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_remote_sets_the_mode_and_answers_permission_questions() {
    let stub = Stub::default();
    let (host, _pi_dir) = pi_host_with(&stub, None, &["--permission-mode", "ask"]).await;
    let remote = Remote::new();
    let minted = host.pairing_token(&[]).await;
    let url = minted["url"].as_str().unwrap();
    remote.ok(&["pair", url, "--name", "desk"]).await;
    // The models of the real pi's registry, as aligned columns; a filter and --provider keep
    // only the stub's.
    let all = remote.ok(&["models"]).await;
    assert!(all.starts_with("MODEL ") && !all.contains('\t'), "{all}");
    assert!(all.lines().count() > 10, "{all}");
    let stub_only = remote
        .ok(&["models", "STUB-MOD", "--provider", "stub"])
        .await;
    let lines: Vec<&str> = stub_only.lines().collect();
    assert_eq!(lines.len(), 2, "{stub_only}");
    assert!(lines[1].starts_with("stub/stub-model "), "{stub_only}");
    let none = remote.ok(&["models", "no-such-model-anywhere"]).await;
    assert!(none.is_empty(), "{none}");

    let workspace = host.workspace("w");
    let created = remote
        .ok_json(&["new", "--workspace", &workspace, "--mode", "plan", "--json"])
        .await;
    assert_eq!(created["permissionMode"], "plan", "{created}");
    let session = created["sessionId"].as_str().unwrap().to_string();
    let configured = remote.ok(&["configure", &session, "--mode", "ask"]).await;
    assert!(configured.contains("mode=ask"), "{configured}");
    let bad = remote.run(&["configure", &session, "--mode", "yolo"]).await;
    assert_eq!(bad.status.code(), Some(64));

    // A client of the test's own follows the session to its turn's end.
    let (_, token) = host.pair_device("observer", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let got = client
        .call("session/get", json!({"sessionId": session}))
        .await;
    let sub = client
        .call(
            "session/subscribe",
            json!({"sessionId": session, "cursor": got["result"]["cursor"]}),
        )
        .await;
    assert!(sub.get("result").is_some(), "{sub}");

    stub.script(&[
        ("bash", json!({"command": "touch ok.txt"})),
        ("bash", json!({"command": "mkdir nope"})),
    ]);
    // attach holds the typed lines until a question waits, and answers them in order.
    let attach = {
        let mut command = remote.command(&["attach", &session]);
        command.write_stdin("always\ndeny: not that one\n");
        tokio::task::spawn_blocking(move || command.output().unwrap())
    };
    remote.ok(&["prompt", &session, "Go."]).await;
    client
        .events_until(PATIENCE, |e| e["type"] == "turn.finished")
        .await;
    let output = attach.await.unwrap();
    let printed = String::from_utf8_lossy(&output.stdout).into_owned();
    assert!(
        printed.contains("permission: Allow bash? - touch ok.txt")
            && printed.contains("[always = bash command-prefix touch]")
            && printed.contains("permission: Allow bash? - mkdir nope"),
        "{printed}"
    );
    // Each decision is a line too (attach may end, its stdin spent, before the last one).
    assert!(
        printed.contains("[permission] bash touch ok.txt: allowed (person desk)"),
        "{printed}"
    );
    let ws = Path::new(&workspace);
    assert!(ws.join("ok.txt").exists());
    assert!(!ws.join("nope").exists());
    let last = stub.requests.lock().unwrap().last().cloned().unwrap();
    let results: Vec<&Value> = last["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "tool")
        .collect();
    let refused = results.last().unwrap()["content"].to_string();
    assert!(
        refused.contains("TOOL_DENIED") && refused.contains("not that one"),
        "{refused}"
    );
    let got = client
        .call("session/get", json!({"sessionId": session}))
        .await;
    assert_eq!(
        got["result"]["snapshot"]["grants"],
        json!([{"tool": "bash", "scope": "command-prefix", "value": "touch"}]),
        "{got}"
    );
}
