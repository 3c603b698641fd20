//! `pi-remote` against a gateway with two hosts behind it (a real nats-server with TLS, the
//! stand-in agent): pairing with the gateway's link, `hosts`, `--host`, the default host of
//! `hosts --use`, and the usage errors of a call without a host and of `--host` on a profile
//! of a single host.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use common::Remote;
use serde_json::Value;
use std::time::Duration;
use tests::PATIENCE;
use tests::gateway::Fleet;

impl Remote {
    /// `hosts --json` until every id in `ids` is listed online.
    async fn until_online(&self, ids: &[&str]) -> Value {
        let deadline = tokio::time::Instant::now() + PATIENCE * 2;
        loop {
            let listed = self.ok_json(&["hosts", "--json"]).await;
            let online = |id: &str| {
                listed["hosts"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .any(|h| h["host"]["id"] == id && h["status"] == "online")
            };
            if ids.iter().all(|id| online(id)) {
                return listed;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "hosts never came online: {listed}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn session_ids(listed: &Value) -> Vec<String> {
    listed["sessions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["sessionId"].as_str().unwrap().to_string())
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pi_remote_lists_and_chooses_hosts_behind_a_gateway() {
    if !tests::nats::available() {
        panic!("nats-server is not installed: scripts/test installs it");
    }
    let mut fleet = Fleet::new(1, 1, 2, 3600).await;
    let gateway = fleet.gateway().await;
    let (host_a, a_id) = fleet.host(&[]).await;
    let (host_b, b_id) = fleet.host(&[]).await;

    // The gateway's pairing link, as `pi-gateway pair` gives it to a person.
    let (ok, out, err) = gateway.cli(&["pair", "--json", "--roles", "owner"]).await;
    assert!(ok, "pi-gateway pair failed: {err}");
    let minted: Value = serde_json::from_str(out.trim()).unwrap();
    let link = format!(
        "racps://{}/pair?cert=sha256:{}#{}",
        gateway.addr,
        gateway.cert_sha256.to_hex(),
        minted["token"].as_str().unwrap()
    );
    let remote = Remote::new();
    let paired = remote.ok_json(&["pair", &link, "--json"]).await;
    assert_eq!(paired["gateway"], true, "{paired}");
    assert_eq!(remote.profile()["gateway"], true);

    // Both hosts, with what a person needs to choose one.
    let listed = remote.until_online(&[&a_id, &b_id]).await;
    assert_eq!(listed["defaultHost"], Value::Null);
    for entry in listed["hosts"].as_array().unwrap() {
        assert_eq!(entry["host"]["version"], env!("CARGO_PKG_VERSION"));
        assert!(entry["lastSeenAt"].as_u64().is_some(), "{entry}");
    }
    let table = remote.ok(&["hosts"]).await;
    let header = table.lines().next().unwrap();
    assert!(
        header.contains("HOST") && header.contains("STATUS") && header.contains("LAST HEARD"),
        "{table}"
    );
    for id in [&a_id, &b_id] {
        let row = table.lines().find(|l| l.contains(id.as_str())).unwrap();
        assert!(row.contains("online") && row.contains(" ago ("), "{table}");
    }

    // A host call without a host: a usage error that says how to choose one.
    let output = remote.run(&["sessions"]).await;
    assert_eq!(output.status.code(), Some(64), "{}", text(&output.stderr));
    let said = text(&output.stderr);
    assert!(
        said.contains("pi-remote hosts") && said.contains("--host"),
        "{said}"
    );

    let status = remote.ok(&["status"]).await;
    assert!(status.contains("no host chosen"), "{status}");
    let status = remote.ok(&["--host", &b_id, "status"]).await;
    assert!(status.contains(&format!("id {b_id}")), "{status}");

    // --host A: a session and a turn on host A, not on B.
    let workspace = host_a.workspace("w");
    let created = remote
        .ok_json(&["--host", &a_id, "new", "--workspace", &workspace, "--json"])
        .await;
    let session = created["sessionId"].as_str().unwrap().to_string();
    let stdout = remote
        .ok(&["--host", &a_id, "prompt", &session, "deltas:3", "--wait"])
        .await;
    assert!(stdout.contains("chunk0 chunk1 chunk2"), "{stdout}");
    assert!(stdout.contains("completed"), "{stdout}");
    let on_a = remote
        .ok_json(&["--host", &a_id, "sessions", "--json"])
        .await;
    assert_eq!(session_ids(&on_a), vec![session.clone()]);
    let on_b = remote
        .ok_json(&["--host", &b_id, "sessions", "--json"])
        .await;
    assert!(session_ids(&on_b).is_empty(), "{on_b}");

    // A default host: commands without --host go to it; --host still wins.
    let output = remote.run(&["hosts", "--use", "host_nope"]).await;
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains(a_id.as_str()));
    remote.ok(&["hosts", "--use", &a_id]).await;
    assert_eq!(remote.profile()["host"], a_id.as_str());
    let listed = remote.ok_json(&["hosts", "--json"]).await;
    assert_eq!(listed["defaultHost"], a_id.as_str());
    let on_default = remote.ok_json(&["sessions", "--json"]).await;
    assert_eq!(session_ids(&on_default), vec![session.clone()]);
    let stdout = remote.ok(&["prompt", &session, "deltas:2", "--wait"]).await;
    assert!(stdout.contains("completed"), "{stdout}");
    let on_b = remote
        .ok_json(&["--host", &b_id, "sessions", "--json"])
        .await;
    assert!(session_ids(&on_b).is_empty(), "{on_b}");
    let status = remote.ok(&["status"]).await;
    assert!(status.contains(&format!("host {a_id}")), "{status}");

    // Devices are the gateway's own: reached whatever host is chosen.
    let devices = remote.ok_json(&["devices", "--json"]).await;
    assert_eq!(devices["devices"].as_array().unwrap().len(), 1, "{devices}");
    drop(host_b);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn host_is_refused_for_a_profile_of_a_single_host() {
    let agent = tests::stand_in_agent();
    let host = tests::HostProcess::start_with(
        &tests::pi_host_binary(),
        &["--agent", agent.to_str().unwrap()],
    )
    .await;
    let minted = host.pairing_token(&[]).await;
    let remote = Remote::new();
    let paired = remote
        .ok_json(&["pair", minted["url"].as_str().unwrap(), "--json"])
        .await;
    assert_eq!(paired["gateway"], false, "{paired}");
    assert!(remote.profile().get("gateway").is_none());
    let output = remote.run(&["--host", "host_x", "sessions"]).await;
    assert_eq!(output.status.code(), Some(64), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("single host"));
    // host/list is a gateway's: the host says so.
    let output = remote.run(&["hosts"]).await;
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("gateway"));
    remote.ok(&["sessions"]).await;
}
