//! Sessions over a real host: creation inside the permitted roots, snapshots, subscriptions,
//! cursor checks and durability across kill -9.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{Value, json};
use std::path::Path;
use tests::{Client, HostProcess};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

async fn owner(host: &HostProcess) -> Client {
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    client
}

async fn create(client: &mut Client, workspace: &str) -> Value {
    let reply = client
        .call(
            "session/create",
            json!({"workspace": workspace, "title": "t"}),
        )
        .await;
    assert!(reply.get("result").is_some(), "{reply}");
    reply["result"]["session"].clone()
}

/// Reads pushes until `subscription/ended`; returns the events delivered before it.
async fn events_until_ended(client: &mut Client) -> Vec<Value> {
    let mut events = Vec::new();
    loop {
        let frame = client.next_frame().await.expect("connection open");
        match frame["method"].as_str() {
            Some("session/events") => {
                events.extend(frame["params"]["events"].as_array().unwrap().clone())
            }
            Some("subscription/ended") => return events,
            _ => {}
        }
    }
}

#[tokio::test]
async fn workspaces_must_be_directories_inside_the_roots() {
    let host = HostProcess::start(bin()).await;
    let mut client = owner(&host).await;
    let ok = create(&mut client, &host.workspace("app")).await;
    assert_eq!(ok["state"], "idle");
    assert!(ok["workspace"].as_str().unwrap().ends_with("/app"));

    let outside = tempfile::tempdir().unwrap();
    let cases = [
        (
            outside.path().to_str().unwrap().to_string(),
            "REMOTE_PATH_FORBIDDEN",
        ),
        (
            format!("{}/app/../../..", host.root.path().display()),
            "REMOTE_PATH_FORBIDDEN",
        ),
        (
            format!("{}/missing", host.root.path().display()),
            "REMOTE_PATH_NOT_FOUND",
        ),
        ("relative/dir".to_string(), "INVALID_PARAMS"),
    ];
    for (workspace, code) in cases {
        let reply = client
            .call("session/create", json!({"workspace": workspace}))
            .await;
        assert_eq!(reply["error"]["code"], code, "{workspace}: {reply}");
    }
    std::os::unix::fs::symlink(outside.path(), host.root.path().join("escape")).unwrap();
    let escape = format!("{}/escape", host.root.path().display());
    let reply = client
        .call("session/create", json!({"workspace": escape}))
        .await;
    assert_eq!(reply["error"]["code"], "REMOTE_PATH_FORBIDDEN");
    std::fs::write(host.root.path().join("file.txt"), "x").unwrap();
    let file = format!("{}/file.txt", host.root.path().display());
    let reply = client
        .call("session/create", json!({"workspace": file}))
        .await;
    assert_eq!(reply["error"]["code"], "INVALID_PARAMS");
}

#[tokio::test]
async fn subscribers_see_close_and_the_subscription_ends() {
    let host = HostProcess::start(bin()).await;
    let mut client = owner(&host).await;
    let session = create(&mut client, &host.workspace("a")).await;
    let id = session["sessionId"].as_str().unwrap();
    let listed = client.call("session/list", json!({})).await;
    assert_eq!(listed["result"]["sessions"][0]["sessionId"], id);

    let got = client.call("session/get", json!({"sessionId": id})).await;
    assert_eq!(got["result"]["snapshot"]["state"], "idle");
    let start = got["result"]["cursor"].clone();
    let sub = client
        .call(
            "session/subscribe",
            json!({"sessionId": id, "cursor": start}),
        )
        .await;
    assert_eq!(sub["result"]["cursor"], start);

    let closed = client.call("session/close", json!({"sessionId": id})).await;
    assert!(closed.get("result").is_some(), "{closed}");
    let again = client.call("session/close", json!({"sessionId": id})).await;
    assert!(
        again.get("result").is_some(),
        "closing twice is fine: {again}"
    );
    let events = events_until_ended(&mut client).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "session.closed");
    assert_eq!(events[0]["seq"], 1);

    let got = client.call("session/get", json!({"sessionId": id})).await;
    assert_eq!(got["result"]["session"]["state"], "closed");
    assert_eq!(got["result"]["cursor"], events[0]["cursor"]);
    let missing = client
        .call("session/get", json!({"sessionId": "ses_nope"}))
        .await;
    assert_eq!(missing["error"]["code"], "SESSION_NOT_FOUND");
}

#[tokio::test]
async fn cursors_from_another_epoch_or_malformed_are_refused() {
    let host = HostProcess::start(bin()).await;
    let mut client = owner(&host).await;
    let a = create(&mut client, &host.workspace("a")).await;
    let b = create(&mut client, &host.workspace("b")).await;
    let reply = client
        .call(
            "session/subscribe",
            json!({"sessionId": a["sessionId"], "cursor": b["cursor"]}),
        )
        .await;
    assert_eq!(reply["error"]["code"], "CURSOR_EXPIRED", "{reply}");
    assert_eq!(reply["error"]["details"]["reason"], "other_epoch");
    assert_eq!(reply["error"]["details"]["head"], a["cursor"]);
    assert_eq!(reply["error"]["recovery"], "resnapshot");
    let reply = client
        .call(
            "session/subscribe",
            json!({"sessionId": a["sessionId"], "cursor": "not-a-cursor"}),
        )
        .await;
    assert_eq!(reply["error"]["code"], "INVALID_PARAMS");
    assert_eq!(reply["error"]["details"]["path"], "params.cursor");
}

#[tokio::test]
async fn observers_read_but_do_not_drive() {
    let host = HostProcess::start(bin()).await;
    let mut client = owner(&host).await;
    let session = create(&mut client, &host.workspace("a")).await;
    let (_, token) = host.pair_device("phone", &["--roles", "observer"]).await;
    let mut observer = Client::connect(&host.url(), &token).await.unwrap();
    observer.hello().await;
    let reply = observer
        .call("session/create", json!({"workspace": host.workspace("b")}))
        .await;
    assert_eq!(reply["error"]["code"], "FORBIDDEN");
    let reply = observer
        .call("session/close", json!({"sessionId": session["sessionId"]}))
        .await;
    assert_eq!(reply["error"]["code"], "FORBIDDEN");
    // Driving calls with valid params: refused for the role, never run.
    let id = session["sessionId"].clone();
    for (method, params) in [
        (
            "turn/start",
            json!({"sessionId": id, "idempotencyKey": "k1", "text": "echo hi"}),
        ),
        (
            "turn/steer",
            json!({"sessionId": id, "turnId": "turn_1", "text": "stop"}),
        ),
        ("turn/abort", json!({"sessionId": id, "turnId": "turn_1"})),
        (
            "approval/respond",
            json!({"approvalId": "appr_1", "decision": "allow"}),
        ),
        (
            "session/configure",
            json!({"sessionId": id, "autoCompaction": false}),
        ),
    ] {
        let reply = observer.call(method, params).await;
        assert_eq!(reply["error"]["code"], "FORBIDDEN", "{method}: {reply}");
    }
    let got = observer.call("session/get", json!({"sessionId": id})).await;
    assert_eq!(
        got["result"]["snapshot"]["turns"],
        json!([]),
        "no turn started: {got}"
    );
    let reply = observer.call("session/list", json!({})).await;
    assert_eq!(reply["result"]["sessions"].as_array().unwrap().len(), 1);
    let reply = observer
        .call(
            "session/subscribe",
            json!({"sessionId": session["sessionId"]}),
        )
        .await;
    assert!(reply.get("result").is_some(), "{reply}");
}

#[tokio::test]
async fn sessions_and_their_logs_survive_kill_9() {
    let host = HostProcess::start(bin()).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let session = create(&mut client, &host.workspace("a")).await;
    let id = session["sessionId"].as_str().unwrap().to_string();
    let before = session["cursor"].clone();
    let reply = client.call("session/close", json!({"sessionId": id})).await;
    assert!(reply.get("result").is_some());
    let got = client.call("session/get", json!({"sessionId": id})).await;
    let head = got["result"]["cursor"].clone();
    drop(client);

    let host = host.restart(&[]).await;
    let mut client = Client::connect(&host.url(), &token)
        .await
        .expect("device survives");
    client.hello().await;
    let got = client.call("session/get", json!({"sessionId": id})).await;
    assert_eq!(
        got["result"]["cursor"], head,
        "same epoch and head after restart"
    );
    assert_eq!(got["result"]["session"]["state"], "closed");
    let sub = client
        .call(
            "session/subscribe",
            json!({"sessionId": id, "cursor": before}),
        )
        .await;
    assert!(sub.get("result").is_some(), "{sub}");
    let events = events_until_ended(&mut client).await;
    assert_eq!(events.len(), 1);
    assert_eq!(events[0]["type"], "session.closed");
    assert_eq!(events[0]["cursor"], head);
}

/// `session/rename` (pi's `set_session_name`): the title is stored, `session.renamed` is in the
/// log, the same title again appends nothing, it survives a restart, and a closed session keeps
/// its name (docs/protocol.md §7.33).
#[tokio::test]
async fn a_session_is_renamed_and_keeps_its_title_across_a_restart() {
    let host = HostProcess::start(bin()).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let session = create(&mut client, &host.workspace("a")).await;
    let id = session["sessionId"].as_str().unwrap().to_string();
    let sub = client
        .call(
            "session/subscribe",
            json!({"sessionId": id, "cursor": session["cursor"]}),
        )
        .await;
    assert!(sub.get("result").is_some(), "{sub}");
    for _ in 0..2 {
        let renamed = client
            .call(
                "session/rename",
                json!({"sessionId": id, "title": "login fix"}),
            )
            .await;
        assert_eq!(
            renamed["result"]["session"]["title"], "login fix",
            "{renamed}"
        );
    }
    let events = client
        .events_until(tests::PATIENCE, |e| e["type"] == "session.renamed")
        .await;
    assert_eq!(events.last().unwrap()["data"]["title"], "login fix");
    let bad = client
        .call(
            "session/rename",
            json!({"sessionId": id, "title": "a\u{7}b"}),
        )
        .await;
    assert_eq!(bad["error"]["code"], "INVALID_PARAMS", "{bad}");
    let closed = client.call("session/close", json!({"sessionId": id})).await;
    assert!(closed.get("result").is_some(), "{closed}");
    let ended = events_until_ended(&mut client).await;
    let renames = ended
        .iter()
        .filter(|e| e["type"] == "session.renamed")
        .count();
    assert_eq!(
        renames, 0,
        "the same title again appended nothing: {ended:?}"
    );
    let refused = client
        .call("session/rename", json!({"sessionId": id, "title": "other"}))
        .await;
    assert_eq!(refused["error"]["code"], "CONFLICT", "{refused}");
    drop(client);

    let host = host.restart(&[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let listed = client.call("session/list", json!({})).await;
    assert_eq!(
        listed["result"]["sessions"][0]["title"], "login fix",
        "{listed}"
    );
}

/// A title given at `session/create` has no event of its own: after a kill -9 the host reads it
/// from the session's row, as it does a renamed title whose `session.renamed` has left the
/// retained log (here one event is retained).
#[tokio::test]
async fn titles_from_create_and_from_a_pruned_rename_survive_kill_9() {
    let host = HostProcess::start_with(bin(), &["--retain-events", "1"]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let created = create(&mut client, &host.workspace("a")).await;
    let named_at_create = created["sessionId"].as_str().unwrap().to_string();
    assert_eq!(created["title"], "t", "{created}");
    let other = create(&mut client, &host.workspace("b")).await;
    let renamed = other["sessionId"].as_str().unwrap().to_string();
    let reply = client
        .call(
            "session/rename",
            json!({"sessionId": renamed, "title": "login fix"}),
        )
        .await;
    assert_eq!(reply["result"]["session"]["title"], "login fix", "{reply}");
    // Pushes the rename out of the one event retained.
    let closed = client
        .call("session/close", json!({"sessionId": renamed}))
        .await;
    assert!(closed.get("result").is_some(), "{closed}");
    drop(client);

    let host = host.restart(&["--retain-events", "1"]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    for (id, title) in [(&named_at_create, "t"), (&renamed, "login fix")] {
        let got = client.call("session/get", json!({"sessionId": id})).await;
        assert_eq!(got["result"]["session"]["title"], title, "{got}");
    }
    let listed = client.call("session/list", json!({})).await;
    let titles: Vec<&Value> = listed["result"]["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| &s["title"])
        .collect();
    assert_eq!(titles, [&json!("t"), &json!("login fix")], "{listed}");
}

#[tokio::test]
async fn a_workspace_under_tilde_is_the_host_user_s_home() {
    let home_root = tempfile::tempdir().unwrap();
    let home = home_root.path().canonicalize().unwrap().join("remote home");
    std::fs::create_dir_all(home.join("src/app")).unwrap();
    let home_text = home.to_str().unwrap();
    let root = home_root.path().to_str().unwrap();
    let host = HostProcess::start_with_env(bin(), &["--root", root], &[("HOME", home_text)]).await;
    let mut client = owner(&host).await;
    let session = create(&mut client, "~/src/app").await;
    assert_eq!(session["workspace"], format!("{home_text}/src/app"));
    let session = create(&mut client, "~").await;
    assert_eq!(session["workspace"], home_text);
    // Only the host user's own home: `~user` and a relative path stay refused.
    for workspace in ["~root/x", "src/app", "~src"] {
        let reply = client
            .call("session/create", json!({"workspace": workspace}))
            .await;
        assert_eq!(
            reply["error"]["code"], "INVALID_PARAMS",
            "{workspace}: {reply}"
        );
    }
    // `~/` outside the roots is refused as any path outside them is.
    let host = HostProcess::start_with_env(bin(), &[], &[("HOME", home_text)]).await;
    let mut client = owner(&host).await;
    let reply = client
        .call("session/create", json!({"workspace": "~/src/app"}))
        .await;
    assert_eq!(reply["error"]["code"], "REMOTE_PATH_FORBIDDEN", "{reply}");
}
