//! `pi-remote use` and `pi-remote remotes` against a real pi-host (with the stand-in agent): the
//! default profile is chosen at run time, `--profile` and `PI_REMOTE_PROFILE` still win, and
//! `remotes` shows every profile with its host's state and when it was last reached.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use common::Remote;
use serde_json::Value;
use tests::HostProcess;

async fn host() -> HostProcess {
    let agent = tests::stand_in_agent();
    HostProcess::start_with(
        &tests::pi_host_binary(),
        &["--agent", agent.to_str().unwrap()],
    )
    .await
}

impl Remote {
    /// Pairs profile `name` with a fresh token.
    async fn pair_as(&self, host: &HostProcess, name: &str) -> Value {
        let minted = host.pairing_token(&[]).await;
        let url = minted["url"].as_str().unwrap();
        self.ok_json(&["--profile", name, "pair", url, "--json", "--name", name])
            .await
    }

    /// The device id `status` reports, for the profile the command line resolves to.
    async fn status_device(&self, args: &[&str]) -> (String, String) {
        let mut all = args.to_vec();
        all.extend(["status", "--json"]);
        let status = self.ok_json(&all).await;
        (
            status["profile"].as_str().unwrap().to_string(),
            status["deviceId"].as_str().unwrap().to_string(),
        )
    }
}

#[tokio::test]
async fn use_changes_the_default_and_profile_still_wins() {
    let host = host().await;
    let remote = Remote::new();
    let a = remote.pair_as(&host, "a").await;
    let b = remote.pair_as(&host, "b").await;
    let a_device = a["deviceId"].as_str().unwrap().to_string();
    let b_device = b["deviceId"].as_str().unwrap().to_string();

    // Nothing chosen: the built-in default, which is not stored.
    let missing = remote.run(&["status"]).await;
    assert_eq!(missing.status.code(), Some(1), "{missing:?}");
    assert!(String::from_utf8_lossy(&missing.stderr).contains("no profile \"default\""));

    // An unknown profile is refused, naming the known ones; nothing changes.
    let refused = remote.run(&["use", "c"]).await;
    assert_eq!(refused.status.code(), Some(1), "{refused:?}");
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("known profiles: a, b"), "{said}");

    remote.ok(&["use", "b"]).await;
    assert_eq!(
        remote.status_device(&[]).await,
        ("b".to_string(), b_device.clone())
    );
    assert_eq!(
        remote.status_device(&["--profile", "a"]).await,
        ("a".to_string(), a_device.clone())
    );
    let mut with_env = remote.command(&["status", "--json"]);
    with_env.env("PI_REMOTE_PROFILE", "a");
    let output = with_env.output().unwrap();
    let status: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(status["deviceId"], a_device.as_str());

    // `remotes` lists both, marks the default, and both hosts answered just now.
    let listed = remote.ok_json(&["remotes", "--json"]).await;
    assert_eq!(listed["default"], "b");
    let rows = listed["remotes"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "{listed}");
    for row in rows {
        assert_eq!(row["reachable"], true, "{row}");
        assert_eq!(row["hostVersion"], env!("CARGO_PKG_VERSION"), "{row}");
        assert_eq!(row["lastSeenAgo"], "now", "{row}");
        assert_eq!(row["default"], row["profile"] == "b", "{row}");
    }
    let table = remote.ok(&["remotes"]).await;
    let lines: Vec<&str> = table.lines().collect();
    assert!(lines[0].starts_with("PROFILE"), "{table}");
    assert!(lines[2].starts_with("b *"), "{table}");
    // Aligned: the host column starts at the same place on every line.
    let column = lines[0].find("HOST").unwrap();
    assert!(
        lines[1..]
            .iter()
            .all(|l| l[column..].starts_with("reachable")),
        "{table}"
    );

    // A host that is gone: unreachable, and its last-seen time stays what it was.
    drop(host);
    let listed = remote.ok_json(&["remotes", "--json"]).await;
    for row in listed["remotes"].as_array().unwrap() {
        assert_eq!(row["reachable"], false, "{row}");
        assert!(row["lastSeen"].as_u64().is_some(), "{row}");
    }
}
