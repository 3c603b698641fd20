//! `pi-remote` against a real pi-host (with the stand-in agent): pairing, profiles, status,
//! sessions, turns (steer, abort, close), approvals from a second process, from attach's stdin
//! and from a terminal under `prompt --wait`, devices, and exit codes (bad usage: 64 in every
//! binary).

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use assert_cmd::Command;
use common::Remote;
use serde_json::Value;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use tests::{HostProcess, PATIENCE};

fn pi_host() -> PathBuf {
    tests::pi_host_binary()
}

async fn host() -> HostProcess {
    let agent = tests::stand_in_agent();
    HostProcess::start_with(
        &pi_host(),
        &["--agent", agent.to_str().unwrap(), "--heartbeat-ms", "200"],
    )
    .await
}

impl Remote {
    /// Pairs with a fresh token from `pi-host pair`; returns the `pair --json` output.
    async fn pair(&self, host: &HostProcess, extra: &[&str]) -> Value {
        let minted = host.pairing_token(extra).await;
        let url = minted["url"].as_str().unwrap();
        self.ok_json(&["pair", url, "--json", "--name", "test-desktop"])
            .await
    }

    async fn new_session(&self, host: &HostProcess, name: &str) -> String {
        let created = self
            .ok_json(&[
                "new",
                "--workspace",
                &host.workspace(name),
                "--title",
                name,
                "--json",
            ])
            .await;
        created["sessionId"].as_str().unwrap().to_string()
    }

    /// Starts `pi-remote attach --json SESSION` with piped stdin and stdout.
    fn attach(&self, session: &str) -> Attached {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_pi-remote"))
            .args(["attach", session, "--json"])
            .env("PI_REMOTE_CONFIG_DIR", self.config.path())
            .env_remove("PI_REMOTE_PROFILE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                if tx.send(line).is_err() {
                    return;
                }
            }
        });
        Attached { child, lines }
    }
}

/// A running `attach --json`.
struct Attached {
    child: std::process::Child,
    lines: mpsc::Receiver<String>,
}

impl Attached {
    /// Reads JSON lines until one has `type` == `kind`.
    fn until(&self, kind: &str) -> Value {
        tokio::task::block_in_place(|| {
            let deadline = std::time::Instant::now() + PATIENCE;
            loop {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                let line = self
                    .lines
                    .recv_timeout(left)
                    .unwrap_or_else(|_| panic!("attach printed no {kind} in time"));
                let value: Value = serde_json::from_str(&line).expect("a JSON line");
                if value["type"] == kind {
                    return value;
                }
            }
        })
    }

    /// Closes stdin and waits for the exit status.
    fn finish(mut self) -> std::process::ExitStatus {
        drop(self.child.stdin.take());
        tokio::task::block_in_place(|| {
            let deadline = std::time::Instant::now() + PATIENCE;
            loop {
                if let Some(status) = self.child.try_wait().unwrap() {
                    return status;
                }
                if std::time::Instant::now() > deadline {
                    let _ = self.child.kill();
                    panic!("attach did not exit after stdin closed");
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        })
    }
}

impl Drop for Attached {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pair_stores_a_private_profile_and_never_prints_the_token() {
    let host = host().await;
    let remote = Remote::new();
    let minted = host.pairing_token(&[]).await;
    let url = minted["url"].as_str().unwrap();
    let output = remote
        .run(&["pair", url, "--json", "--name", "test-desktop"])
        .await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    let printed: Value = serde_json::from_slice(&output.stdout).unwrap();
    assert!(printed["deviceId"].as_str().unwrap().starts_with("dev_"));
    assert_eq!(printed["roles"], serde_json::json!(["owner"]));
    assert!(printed.get("deviceToken").is_none());

    let profile = remote.profile();
    let token = profile["deviceToken"].as_str().unwrap();
    assert!(!token.is_empty());
    assert_eq!(profile["deviceId"], printed["deviceId"]);
    assert_eq!(profile["url"], host.url());
    assert!(host.url().starts_with("wss://"));
    assert_eq!(profile["certSha256"], host.cert_sha256.unwrap().to_hex());
    assert_eq!(printed["certSha256"], profile["certSha256"]);
    for stream in [&output.stdout, &output.stderr] {
        assert!(
            !text(stream).contains(token),
            "the device token was printed"
        );
    }
    assert_eq!(mode(&remote.profile_path()), 0o600);
    assert_eq!(mode(&remote.config.path().join("profiles")), 0o700);

    // The stored credential works, and the human output does not show it either.
    let devices = remote.ok(&["devices"]).await;
    assert!(devices.contains("test-desktop"), "{devices}");
    assert!(!devices.contains(token));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reused_pairing_token_exits_4_with_pairing_failed() {
    let host = host().await;
    let minted = host.pairing_token(&[]).await;
    let url = minted["url"].as_str().unwrap();
    let first = Remote::new();
    first.ok(&["pair", url]).await;
    let second = Remote::new();
    let output = second.run(&["pair", url]).await;
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("PAIRING_FAILED"),
        "{}",
        text(&output.stderr)
    );
    assert!(!second.profile_path().exists());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bare_token_pairs_with_host_and_fingerprint_and_unpinned_links_are_refused() {
    let host = host().await;
    let minted = host.pairing_token(&[]).await;
    let token = minted["token"].as_str().unwrap();
    let cert = minted["certSha256"].as_str().unwrap();
    let remote = Remote::new();
    let output = remote.run(&["pair", token]).await;
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output.stderr).contains("--host"));
    let host_arg = host.addr.to_string();
    // A bare token needs the fingerprint too: the pairing token goes only to the pinned host.
    let output = remote
        .run_with_stdin(&["pair", "-", "--host", &host_arg], &format!("{token}\n"))
        .await;
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output.stderr).contains("--cert-sha256"));
    // Read from stdin, so the token stays out of argv.
    let output = remote
        .run_with_stdin(
            &[
                "pair",
                "-",
                "--host",
                &host_arg,
                "--cert-sha256",
                cert,
                "--profile",
                "lab",
            ],
            &format!("{token}\n"),
        )
        .await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(remote.config.path().join("profiles/lab.json").exists());
    remote.ok(&["sessions", "--profile", "lab"]).await;

    for (link, why) in [
        ("racps://192.0.2.1:7878/pair#ppt_x", "fingerprint"),
        ("racp://127.0.0.1:7878/pair#ppt_x", "--plain"),
    ] {
        let output = remote.run(&["pair", link]).await;
        assert_eq!(output.status.code(), Some(1));
        assert!(
            text(&output.stderr).contains(why),
            "{}",
            text(&output.stderr)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_plain_host_pairs_only_with_the_explicit_opt_in() {
    let agent = tests::stand_in_agent();
    let host =
        HostProcess::start_with(&pi_host(), &["--plain", "--agent", agent.to_str().unwrap()]).await;
    let minted = host.pairing_token(&[]).await;
    let link = minted["url"].as_str().unwrap();
    assert!(link.starts_with("racp://"));
    let remote = Remote::new();
    let output = remote.run(&["pair", link]).await;
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    remote.ok(&["pair", link, "--plain"]).await;
    assert_eq!(remote.profile()["plain"], true);
    remote.ok(&["sessions"]).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn usage_errors_exit_64_and_an_unreachable_host_exits_3() {
    let remote = Remote::new();
    assert_eq!(remote.run(&[]).await.status.code(), Some(64));
    assert_eq!(remote.run(&["frobnicate"]).await.status.code(), Some(64));
    assert_eq!(remote.run(&["abort"]).await.status.code(), Some(64));
    assert_eq!(remote.run(&["--help"]).await.status.code(), Some(0));
    let output = remote.run(&["sessions"]).await;
    assert_eq!(output.status.code(), Some(1));
    assert!(text(&output.stderr).contains("pair first"));
    let output = remote.run(&["sessions", "--profile", "../x"]).await;
    assert_eq!(output.status.code(), Some(64), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("invalid profile name"));

    let mut host = host().await;
    remote.pair(&host, &[]).await;
    host.kill().await;
    let output = remote.run(&["sessions"]).await;
    assert_eq!(output.status.code(), Some(3), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("REMOTE_CONNECTION_FAILED"));
}

/// pi-host, pi-gateway and pi-remote agree: bad usage exits 64 (EX_USAGE), help exits 0.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_usage_exits_64_in_every_binary() {
    let binaries = [
        pi_host(),
        tests::workspace_binary("gateway", "pi-gateway", None),
        PathBuf::from(env!("CARGO_BIN_EXE_pi-remote")),
    ];
    for binary in &binaries {
        for (args, code) in [
            (&["frobnicate"][..], 64),
            (&["--no-such-option"][..], 64),
            (&[][..], 64),
            (&["--help"][..], 0),
        ] {
            let mut command = Command::new(binary);
            command.args(args).timeout(PATIENCE);
            let output = tokio::task::spawn_blocking(move || command.output().unwrap())
                .await
                .unwrap();
            assert_eq!(
                output.status.code(),
                Some(code),
                "{} {args:?}: {}",
                binary.display(),
                text(&output.stderr)
            );
            if code == 64 {
                assert!(
                    text(&output.stderr).contains("Usage"),
                    "{}",
                    text(&output.stderr)
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_creates_a_session_that_sessions_lists() {
    let host = host().await;
    let remote = Remote::new();
    remote.pair(&host, &[]).await;
    let session = remote.new_session(&host, "app").await;
    let listed = remote.ok_json(&["sessions", "--json"]).await;
    let sessions = listed["sessions"].as_array().unwrap();
    assert_eq!(sessions.len(), 1);
    assert_eq!(sessions[0]["sessionId"], session);
    assert_eq!(sessions[0]["title"], "app");
    assert_eq!(sessions[0]["state"], "idle");
    let human = remote.ok(&["sessions"]).await;
    assert!(
        human.contains(&session) && human.contains("idle"),
        "{human}"
    );

    // rename: the new title in the list.
    let renamed = remote
        .ok_json(&["rename", &session, "login fix", "--json"])
        .await;
    assert_eq!(renamed["title"], "login fix");
    let listed = remote.ok_json(&["sessions", "--json"]).await;
    assert_eq!(listed["sessions"][0]["title"], "login fix");

    // A workspace outside the host's roots: the host refuses (exit 2, code printed).
    let output = remote.run(&["new", "--workspace", "/"]).await;
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("REMOTE_PATH_FORBIDDEN"));
}

/// `~` is the remote user's home: quoted, the host resolves it; unquoted, the shell here made it
/// this machine's home, and the refusal says to quote it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn new_takes_tilde_as_the_remote_home_and_hints_when_the_local_shell_expanded_it() {
    let remote_home = tempfile::tempdir().unwrap();
    let remote_home = remote_home.path().canonicalize().unwrap();
    std::fs::create_dir_all(remote_home.join("x")).unwrap();
    let home = remote_home.to_str().unwrap();
    let agent = tests::stand_in_agent();
    let host = HostProcess::start_with_env(
        &pi_host(),
        &["--agent", agent.to_str().unwrap(), "--root", home],
        &[("HOME", home)],
    )
    .await;
    let remote = Remote::new();
    remote.pair(&host, &[]).await;
    let created = remote
        .ok_json(&["new", "--workspace", "~/x", "--json"])
        .await;
    assert_eq!(created["workspace"], format!("{home}/x"));

    // What `--workspace ~/x` becomes in this machine's shell: a path under its home.
    let local_home = tempfile::tempdir().unwrap();
    let local_home = local_home.path().to_str().unwrap();
    let expanded = format!("{local_home}/x");
    let mut command = remote.command(&["new", "--workspace", &expanded]);
    command.env("HOME", local_home);
    let output = tokio::task::spawn_blocking(move || command.output().unwrap())
        .await
        .unwrap();
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    let stderr = text(&output.stderr);
    assert!(stderr.contains("REMOTE_PATH_FORBIDDEN"), "{stderr}");
    assert!(
        stderr.contains("under this machine's home") && stderr.contains("--workspace '~/x'"),
        "{stderr}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_wait_prints_the_deltas_and_exits_on_the_outcome() {
    let host = host().await;
    let remote = Remote::new();
    remote.pair(&host, &[]).await;
    let session = remote.new_session(&host, "w").await;
    let stdout = remote.ok(&["prompt", &session, "deltas:3", "--wait"]).await;
    assert!(stdout.contains("chunk0 chunk1 chunk2"), "{stdout}");
    assert!(stdout.contains("completed"), "{stdout}");

    // --json: one event per line, ending with turn.finished.
    let stdout = remote
        .ok(&["prompt", &session, "deltas:2", "--wait", "--json"])
        .await;
    let events: Vec<Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(events.last().unwrap()["type"], "turn.finished");
    assert_eq!(events.last().unwrap()["data"]["outcome"], "completed");
    assert!(events.iter().any(|e| e["type"] == "agent.message_update"));

    let output = remote.run(&["prompt", &session, "fail", "--wait"]).await;
    assert_eq!(output.status.code(), Some(5), "{}", text(&output.stderr));

    // Without --wait: the turn id.
    let started = remote
        .ok_json(&["prompt", &session, "deltas:1", "--json"])
        .await;
    assert!(started["turnId"].as_str().unwrap().starts_with("turn_"));

    // --image: the file goes with the prompt (docs/protocol.md §7.15); another kind is usage.
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("shot.png");
    std::fs::write(&png, b"\x89PNG\r\n\x1a\n").unwrap();
    let png = png.to_str().unwrap();
    let stdout = remote
        .ok(&[
            "prompt", &session, "deltas:1", "--image", png, "--wait", "--json",
        ])
        .await;
    let started = stdout
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .find(|e| e["type"] == "turn.started")
        .expect("turn.started");
    assert_eq!(
        started["data"]["images"],
        serde_json::json!([{"mimeType": "image/png", "bytes": 8}])
    );
    let tiff = dir.path().join("shot.tiff");
    std::fs::write(&tiff, b"II*").unwrap();
    let output = remote
        .run(&[
            "prompt",
            &session,
            "deltas:1",
            "--image",
            tiff.to_str().unwrap(),
        ])
        .await;
    assert_eq!(output.status.code(), Some(64), "{}", text(&output.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_approval_is_answered_from_a_second_process() {
    let host = host().await;
    let remote = Remote::new();
    remote.pair(&host, &[]).await;
    let session = remote.new_session(&host, "w").await;
    let attached = remote.attach(&session);
    attached.until("client.attached");
    remote.ok(&["prompt", &session, "approve:confirm"]).await;
    let requested = attached.until("approval.requested");
    let approval = requested["data"]["approvalId"].as_str().unwrap();
    assert_eq!(requested["data"]["kind"], "confirm");

    let answered = remote.ok_json(&["approve", approval, "--json"]).await;
    assert_eq!(answered["state"], "allowed");
    let settled = attached.until("approval.settled");
    assert_eq!(settled["data"]["outcome"], "allowed");
    let tool = attached.until("agent.tool_execution_end");
    assert_eq!(tool["data"]["isError"], false);
    let finished = attached.until("turn.finished");
    assert_eq!(finished["data"]["outcome"], "completed");

    // Answering again is stale: the host refuses (exit 2).
    let output = remote.run(&["deny", approval]).await;
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("APPROVAL_STALE"));

    // Nothing pending and stdin closed: attach ends cleanly.
    assert!(attached.finish().success());
}

/// An abort while the turn's agent waits on a dialog: the agent's run ends only once the dialog
/// returns (the stand-in holds the abort as pi does), so the host answers the dialog first and
/// `pi-remote abort` answers at once, not at the client's call timeout.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_during_an_approval_answers_at_once() {
    let host = host().await;
    let remote = Remote::new();
    remote.pair(&host, &[]).await;
    let session = remote.new_session(&host, "w").await;
    let attached = remote.attach(&session);
    attached.until("client.attached");
    remote.ok(&["prompt", &session, "approve:confirm"]).await;
    let requested = attached.until("approval.requested");
    let began = std::time::Instant::now();
    let aborted = remote.ok_json(&["abort", &session, "--json"]).await;
    let took = began.elapsed();
    assert_eq!(aborted["aborted"], true, "{aborted}");
    let settled = attached.until("approval.settled");
    assert_eq!(
        settled["data"]["approvalId"],
        requested["data"]["approvalId"]
    );
    assert_eq!(settled["data"]["outcome"], "cancelled", "{settled}");
    let finished = attached.until("turn.finished");
    assert_eq!(finished["data"]["outcome"], "aborted", "{finished}");
    // A pi-remote process starts, connects and calls within this even on a loaded machine; the
    // dialog's own deadline (the host's approval timeout) is minutes.
    assert!(
        took < std::time::Duration::from_secs(10),
        "abort took {took:?}"
    );
    assert!(attached.finish().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_answers_an_approval_from_stdin() {
    let host = host().await;
    let remote = Remote::new();
    // An operator, who may not list the host's devices: the events name who answered.
    remote.pair(&host, &["--roles", "operator"]).await;
    let session = remote.new_session(&host, "w").await;
    // attach reads `y` at once and holds it until an approval is pending (from its snapshot or
    // from an event), so the order of the two processes does not matter.
    let attach = {
        let mut command = remote.command(&["attach", &session, "--json"]);
        command.write_stdin("y\n");
        tokio::task::spawn_blocking(move || command.output().unwrap())
    };
    remote.ok(&["prompt", &session, "approve:confirm"]).await;
    let output = attach.await.unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let lines: Vec<Value> = text(&output.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines[0]["type"], "client.attached");
    let settled = lines
        .iter()
        .find(|l| l["type"] == "approval.settled")
        .expect("approval.settled printed");
    assert_eq!(settled["data"]["outcome"], "allowed");
    let device_id = settled["data"]["deviceId"].as_str().unwrap().to_string();

    // For a person, who answered is the device's name (from the event), not its id.
    let attach = {
        let mut command = remote.command(&["attach", &session]);
        command.write_stdin("y\n");
        tokio::task::spawn_blocking(move || command.output().unwrap())
    };
    remote.ok(&["prompt", &session, "approve:confirm"]).await;
    let output = attach.await.unwrap();
    assert!(output.status.success(), "{}", text(&output.stderr));
    let printed = text(&output.stdout);
    assert!(printed.contains("] allowed by test-desktop"), "{printed}");
    assert!(!printed.contains(&format!("by {device_id}")), "{printed}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn devices_lists_and_revoke_locks_a_device_out() {
    let host = host().await;
    let owner = Remote::new();
    let me = owner.pair(&host, &[]).await;
    let other = Remote::new();
    let paired = other.pair(&host, &["--roles", "observer"]).await;
    assert_eq!(paired["roles"], serde_json::json!(["observer"]));
    let other_id = paired["deviceId"].as_str().unwrap();

    let listed = owner.ok_json(&["devices", "--json"]).await;
    let devices = listed["devices"].as_array().unwrap();
    assert_eq!(devices.len(), 2);
    let current: Vec<&Value> = devices.iter().filter(|d| d["current"] == true).collect();
    assert_eq!(current.len(), 1);
    assert_eq!(current[0]["deviceId"], me["deviceId"]);

    // An observer may not list devices: the host refuses.
    let output = other.run(&["devices"]).await;
    assert_eq!(output.status.code(), Some(2));
    assert!(text(&output.stderr).contains("FORBIDDEN"));

    let revoked = owner.ok_json(&["revoke", other_id, "--json"]).await;
    assert_eq!(revoked["revoked"], true);
    let output = other.run(&["sessions"]).await;
    assert_eq!(output.status.code(), Some(4), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("pair again"));
}

#[test]
fn help_documents_the_exit_codes() {
    let output = Command::new(env!("CARGO_BIN_EXE_pi-remote"))
        .arg("--help")
        .output()
        .unwrap();
    let help = text(&output.stdout);
    for line in [
        "3  the host cannot be reached",
        "4  the host refused the credential",
        "64 bad usage",
    ] {
        assert!(help.contains(line), "{help}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_survives_a_cut_link_without_losing_events() {
    let host = host().await;
    let proxy = tests::FaultProxy::start(host.addr).await;
    let remote = Remote::new();
    // Pair through the proxy with a bare token, so the profile points at the proxy.
    let minted = host.pairing_token(&[]).await;
    let proxy_addr = proxy.addr.to_string();
    let output = remote
        .run_with_stdin(
            &[
                "pair",
                "-",
                "--host",
                &proxy_addr,
                "--cert-sha256",
                minted["certSha256"].as_str().unwrap(),
            ],
            &format!("{}\n", minted["token"].as_str().unwrap()),
        )
        .await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    let session = remote.new_session(&host, "w").await;
    let attached = remote.attach(&session);
    let start = attached.until("client.attached");
    proxy.cut();
    remote.ok(&["prompt", &session, "deltas:20"]).await;
    let mut seqs = vec![
        start["cursor"]
            .as_str()
            .unwrap()
            .rsplit_once('-')
            .unwrap()
            .1
            .parse::<u64>()
            .unwrap(),
    ];
    tokio::task::block_in_place(|| {
        loop {
            let line = attached
                .lines
                .recv_timeout(PATIENCE)
                .expect("events in time");
            let value: Value = serde_json::from_str(&line).unwrap();
            if let Some(seq) = value["seq"].as_u64() {
                seqs.push(seq);
            }
            if value["type"] == "turn.finished" {
                break;
            }
        }
    });
    for pair in seqs.windows(2) {
        assert_eq!(pair[1], pair[0] + 1, "gap or duplicate in {seqs:?}");
    }
    assert!(attached.finish().success());
}

/// What a client or an agent sends cannot drive the terminal that prints it: names with control
/// characters are refused by the host, and paths and agent text are printed escaped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn printed_names_paths_and_agent_text_cannot_drive_the_terminal() {
    const RAW: &[u8] = &[0x1b, 0x07, b'\r'];
    let unescaped = |bytes: &[u8]| bytes.iter().any(|b| RAW.contains(b));
    let host = host().await;
    let remote = Remote::new();

    // The device name the review used is refused at pairing; nothing raw reaches stderr.
    let minted = host.pairing_token(&[]).await;
    let url = minted["url"].as_str().unwrap();
    let evil = "laptop\u{1b}[2K\r\u{1b}[1A\u{1b}]0;owned\u{7}";
    let output = remote.run(&["pair", url, "--name", evil]).await;
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("INVALID_PARAMS"));
    assert!(!unescaped(&output.stderr), "{:?}", text(&output.stderr));

    remote.pair(&host, &[]).await;
    let output = remote
        .run(&[
            "new",
            "--workspace",
            &host.workspace("plain"),
            "--title",
            "a\u{1b}[31mb",
        ])
        .await;
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));

    // A workspace whose name holds escapes (legal on Linux) is listed escaped, on one line.
    let workspace = host.workspace("proj\u{1b}]0;owned\u{7}\nnext");
    let session = remote.ok(&["new", "--workspace", &workspace]).await;
    let listed = remote.run(&["sessions"]).await;
    assert!(listed.status.success());
    assert!(!unescaped(&listed.stdout), "{:?}", text(&listed.stdout));
    assert_eq!(
        text(&listed.stdout).lines().count(),
        1,
        "{}",
        text(&listed.stdout)
    );
    assert!(text(&listed.stdout).contains("proj\\u{1b}]0;owned\\u{7}\\u{a}next"));

    // The agent's text (the stand-in echoes the prompt) keeps its newlines, not its escapes.
    let prompt = "echo \u{1b}[2J\u{1b}]0;owned\u{7}\rline\nsecond";
    let output = remote
        .run(&["prompt", session.trim(), prompt, "--wait"])
        .await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    assert!(!unescaped(&output.stdout), "{:?}", text(&output.stdout));
    assert!(
        text(&output.stdout).contains("\\u{1b}[2J"),
        "{}",
        text(&output.stdout)
    );
}

/// A racps:// link without its `cert=` (cut off when pasted, say) pairs with the fingerprint
/// given as `--cert`, in the link's `sha256:HEX` form or openssl's `AB:CD:…`; a `--cert` that
/// contradicts the link's is refused before anything is sent.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_racps_link_is_pinned_with_cert_and_a_contradicting_cert_is_refused() {
    let host = host().await;
    let remote = Remote::new();
    let minted = host.pairing_token(&[]).await;
    let cert = minted["certSha256"].as_str().unwrap().to_string();
    let token = minted["token"].as_str().unwrap();
    let other = "ab".repeat(32);
    let contradicting = format!("racps://{}/pair?cert=sha256:{other}#{token}", host.addr);
    let output = remote
        .run_with_stdin(
            &["pair", "-", "--cert", &cert],
            &format!("{contradicting}\n"),
        )
        .await;
    assert_eq!(output.status.code(), Some(1));
    assert!(
        text(&output.stderr).contains(&other),
        "{}",
        text(&output.stderr)
    );

    let bare_link = format!("racps://{}/pair#{token}", host.addr);
    let output = remote
        .run_with_stdin(
            &["pair", "-", "--cert", &format!("sha256:{cert}")],
            &format!("{bare_link}\n"),
        )
        .await;
    assert!(output.status.success(), "{}", text(&output.stderr));
    let profile: serde_json::Value = serde_json::from_slice(
        &std::fs::read(remote.config.path().join("profiles/default.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(profile["certSha256"], cert);

    let minted = host.pairing_token(&[]).await;
    let token = minted["token"].as_str().unwrap();
    let colons: Vec<String> = cert
        .as_bytes()
        .chunks(2)
        .map(|pair| String::from_utf8_lossy(pair).to_uppercase())
        .collect();
    let output = remote
        .run_with_stdin(
            &[
                "pair",
                "-",
                "--cert",
                &colons.join(":"),
                "--profile",
                "second",
            ],
            &format!("racps://{}/pair#{token}\n", host.addr),
        )
        .await;
    assert!(output.status.success(), "{}", text(&output.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn credentials_are_set_from_stdin_listed_by_fingerprint_and_sessions_configured() {
    let host = host().await;
    let remote = Remote::new();
    remote.pair(&host, &[]).await;
    let key = "sk-remote-test-5b8d0e3f9a7c1246";
    let set = remote
        .run_with_stdin(
            &["credentials", "set", "openai", "--json"],
            &format!("{key}\n"),
        )
        .await;
    assert!(set.status.success(), "{}", text(&set.stderr));
    let set: Value = serde_json::from_slice(&set.stdout).unwrap();
    assert_eq!(set["provider"], "openai");
    let listed = remote.ok(&["credentials", "list"]).await;
    assert!(listed.contains("openai") && listed.contains(set["fingerprint"].as_str().unwrap()));
    assert!(!listed.contains(key), "{listed}");
    // When, for a person: "1 s ago (HH:MM UTC)", not epoch milliseconds.
    assert!(
        listed.contains(" s ago (") || listed.contains("in 0 s ("),
        "{listed}"
    );
    assert!(listed.contains(" UTC)"), "{listed}");
    assert!(
        !listed
            .split_whitespace()
            .any(|w| w.len() >= 13 && w.chars().all(|c| c.is_ascii_digit())),
        "{listed}"
    );
    // Nothing on stdin: refused locally, nothing sent.
    let empty = remote.run(&["credentials", "set", "anthropic"]).await;
    assert_eq!(empty.status.code(), Some(1), "{}", text(&empty.stderr));
    let deleted = remote.ok(&["credentials", "delete", "openai"]).await;
    assert!(deleted.contains("deleted openai"), "{deleted}");

    let session = remote.new_session(&host, "app").await;
    let configured = remote
        .ok(&[
            "configure",
            &session,
            "--thinking",
            "high",
            "--auto-compaction",
            "off",
            "--follow-up-mode",
            "all",
        ])
        .await;
    assert!(
        configured.contains("thinking=high")
            && configured.contains("auto-compaction=off")
            && configured.contains("follow-up=all")
            && configured.contains("steering=default"),
        "{configured}"
    );
    let bad = remote
        .run(&["configure", &session, "--steering-mode", "some"])
        .await;
    assert_eq!(bad.status.code(), Some(64), "{}", text(&bad.stderr));
    let bad = remote
        .run(&["configure", &session, "--thinking", "max"])
        .await;
    assert_eq!(bad.status.code(), Some(64), "{}", text(&bad.stderr));
    let bad = remote
        .run(&["new", "--workspace", &host.workspace("b"), "--model", "gpt"])
        .await;
    assert!(
        text(&bad.stderr).contains("PROVIDER/MODEL"),
        "{}",
        text(&bad.stderr)
    );

    // An operator cannot touch keys: the host refuses (exit 2, FORBIDDEN).
    let operator = Remote::new();
    operator.pair(&host, &["--roles", "operator"]).await;
    let refused = operator
        .run_with_stdin(&["credentials", "set", "openai"], "sk-x-1234567890abcdef\n")
        .await;
    assert_eq!(refused.status.code(), Some(2), "{}", text(&refused.stderr));
    assert!(text(&refused.stderr).contains("FORBIDDEN"));
}

impl Remote {
    /// Starts pi-remote in the background with stdin, stdout and stderr piped.
    fn spawn(&self, args: &[&str]) -> Running {
        Running(
            std::process::Command::new(env!("CARGO_BIN_EXE_pi-remote"))
                .args(args)
                .env("PI_REMOTE_CONFIG_DIR", self.config.path())
                .env_remove("PI_REMOTE_PROFILE")
                .stdin(Stdio::piped())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap(),
        )
    }

    /// Polls `sessions --json` until `session` has a running turn; returns its id.
    async fn running_turn(&self, session: &str) -> String {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            let listed = self.ok_json(&["sessions", "--json"]).await;
            let turn = listed["sessions"]
                .as_array()
                .unwrap()
                .iter()
                .find(|s| s["sessionId"] == session)
                .and_then(|s| s["activeTurnId"].as_str().map(str::to_string));
            if let Some(turn) = turn {
                return turn;
            }
            assert!(
                std::time::Instant::now() < deadline,
                "no turn started in {session}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }
}

/// A background process, killed if the test ends first.
struct Running(std::process::Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Lines of a child's pipe, read on a thread.
fn lines_of(pipe: impl std::io::Read + Send + 'static) -> mpsc::Receiver<String> {
    let (tx, lines) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(pipe).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    lines
}

/// Reads lines until one contains `needle`; returns it.
fn line_containing(lines: &mpsc::Receiver<String>, needle: &str) -> String {
    tokio::task::block_in_place(|| {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            let line = lines
                .recv_timeout(left)
                .unwrap_or_else(|_| panic!("no line with {needle:?} in time"));
            if line.contains(needle) {
                return line;
            }
        }
    })
}

/// Waits for a child's exit status.
fn exit_of(mut child: Running) -> std::process::ExitStatus {
    tokio::task::block_in_place(|| {
        let deadline = std::time::Instant::now() + PATIENCE;
        loop {
            if let Some(status) = child.0.try_wait().unwrap() {
                return status;
            }
            if std::time::Instant::now() > deadline {
                panic!("pi-remote did not exit in time");
            }
            std::thread::sleep(std::time::Duration::from_millis(20));
        }
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn abort_ends_a_hanging_turn() {
    let host = host().await;
    let remote = Remote::new();
    remote.pair(&host, &[]).await;
    let session = remote.new_session(&host, "w").await;
    // Nothing runs yet: nothing to abort, and that is not an error.
    let idle = remote.ok(&["abort", &session]).await;
    assert!(idle.contains("no turn is running"), "{idle}");

    let mut waiting = remote.spawn(&["prompt", &session, "hang", "--wait"]);
    let stderr = lines_of(waiting.0.stderr.take().unwrap());
    let turn = remote.running_turn(&session).await;
    // Another prompt meanwhile is refused, with the ways out.
    let busy = remote.run(&["prompt", &session, "deltas:1"]).await;
    assert_eq!(busy.status.code(), Some(2), "{}", text(&busy.stderr));
    let said = text(&busy.stderr);
    assert!(
        said.contains("AGENT_BUSY") && said.contains("pi-remote abort"),
        "{said}"
    );
    let aborted = remote.ok_json(&["abort", &session, "--json"]).await;
    assert_eq!(aborted["turnId"], turn);
    assert_eq!(aborted["aborted"], true);
    // The turn the other process follows ends aborted: it exits 5 and says so.
    line_containing(&stderr, "the turn ended aborted");
    assert_eq!(exit_of(waiting).code(), Some(5));
    assert_eq!(
        remote.ok_json(&["sessions", "--json"]).await["sessions"][0]["activeTurnId"],
        Value::Null
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn steer_reaches_the_running_turns_agent() {
    let host = host().await;
    let remote = Remote::new();
    remote.pair(&host, &[]).await;
    let session = remote.new_session(&host, "w").await;
    let output = remote.run(&["steer", &session, "go left"]).await;
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("nothing to steer"),
        "{}",
        text(&output.stderr)
    );

    let attached = remote.attach(&session);
    attached.until("client.attached");
    remote.ok(&["prompt", &session, "hang"]).await;
    let turn = remote.running_turn(&session).await;
    let steered = remote.ok(&["steer", &session, "try the other door"]).await;
    assert!(steered.contains(&turn), "{steered}");
    // The agent queued it: its queue_update carries the text.
    let queued = attached.until("agent.queue_update");
    assert_eq!(queued["turnId"], turn);
    assert_eq!(queued["data"]["steering"][0], "try the other door");
    // A follow-up while the turn runs is queued for after it, under a turn id of its own.
    let follow_up = remote.ok(&["follow-up", &session, "then the window"]).await;
    assert!(
        follow_up.contains("queued") && !follow_up.contains(&turn),
        "{follow_up}"
    );
    let follow_turn = follow_up.split_whitespace().next().unwrap().to_string();
    let queued = attached.until("turn.queued");
    assert_eq!(queued["turnId"], follow_turn);
    // One who attaches now sees it waiting.
    let late = remote.attach(&session);
    let header = late.until("client.attached");
    assert_eq!(header["queue"]["followUps"][0]["turnId"], follow_turn);
    assert_eq!(header["queue"]["followUps"][0]["text"], "then the window");
    assert!(late.finish().success());
    // Withdrawn before it runs: its text comes back.
    let cleared = remote.ok(&["clear-queue", &session]).await;
    assert_eq!(
        cleared.trim(),
        format!("withdrew {follow_turn}: then the window")
    );
    let withdrawn = attached.until("turn.withdrawn");
    assert_eq!(withdrawn["data"]["reason"], "cleared");
    let again = remote.ok(&["clear-queue", &session]).await;
    assert_eq!(again.trim(), "nothing queued");
    remote.ok(&["abort", &session]).await;
    let finished = attached.until("turn.finished");
    assert_eq!(finished["data"]["outcome"], "aborted");
    assert!(attached.finish().success());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn close_closes_a_session() {
    let host = host().await;
    let remote = Remote::new();
    remote.pair(&host, &[]).await;
    let session = remote.new_session(&host, "w").await;
    let closed = remote.ok(&["close", &session]).await;
    assert_eq!(closed.trim(), format!("closed {session}"));
    let listed = remote.ok_json(&["sessions", "--json"]).await;
    assert_eq!(listed["sessions"][0]["state"], "closed");
    // Closing again succeeds; a prompt into it is refused by the host.
    let again = remote.ok_json(&["close", &session, "--json"]).await;
    assert_eq!(again["closed"], true);
    let output = remote.run(&["prompt", &session, "deltas:1"]).await;
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    let output = remote.run(&["close", "ses_nonexistent"]).await;
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(text(&output.stderr).contains("SESSION_NOT_FOUND"));
}

/// `clone` makes a session whose history is the source's; `fork --from` takes a history
/// entry's cursor (the stand-in agent has no pi fork, so the host's refusal is printed).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn clone_copies_a_conversation_and_fork_takes_a_cursor() {
    let host = host().await;
    let remote = Remote::new();
    remote.pair(&host, &[]).await;
    let session = remote.new_session(&host, "w").await;
    remote.ok(&["prompt", &session, "deltas:2", "--wait"]).await;
    let entries = |out: String| -> Vec<Value> {
        out.lines()
            .map(|line| serde_json::from_str(line).unwrap())
            .collect()
    };
    let source = entries(remote.ok(&["history", &session, "--json"]).await);
    assert!(source.len() >= 2, "{source:?}");
    let said =
        |entries: &[Value]| -> Vec<Value> { entries.iter().map(|e| e["data"].clone()).collect() };

    let cloned = remote.ok(&["clone", &session, "--title", "copy"]).await;
    let copy = cloned.trim().to_string();
    assert!(copy.starts_with("ses_") && copy != session, "{cloned}");
    let copied = entries(remote.ok(&["history", &copy, "--json"]).await);
    assert_eq!(said(&copied), said(&source));
    let listed = remote.ok_json(&["sessions", "--json"]).await;
    assert_eq!(listed["sessions"].as_array().unwrap().len(), 2, "{listed}");

    let user = source
        .iter()
        .find(|e| e["data"]["message"]["role"] == "user")
        .unwrap();
    let cursor = user["cursor"].as_str().unwrap();
    let output = remote.run(&["fork", &session, "--from", cursor]).await;
    assert_eq!(output.status.code(), Some(2), "{}", text(&output.stderr));
    assert!(
        text(&output.stderr).contains("get_fork_messages"),
        "{}",
        text(&output.stderr)
    );
    let output = remote.run(&["fork", &session, "--from", "nope"]).await;
    assert_eq!(output.status.code(), Some(64), "{}", text(&output.stderr));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_prints_the_profiles_facts_and_the_hosts_version() {
    let mut host = host().await;
    let remote = Remote::new();
    let paired = remote.pair(&host, &[]).await;
    let status = remote.ok_json(&["status", "--json"]).await;
    assert_eq!(status["profile"], "default");
    assert_eq!(status["url"], host.url());
    assert_eq!(status["certSha256"], host.cert_sha256.unwrap().to_hex());
    assert_eq!(status["deviceId"], paired["deviceId"]);
    assert_eq!(status["deviceName"], "test-desktop");
    assert_eq!(status["roles"], serde_json::json!(["owner"]));
    assert_eq!(status["host"]["version"], env!("CARGO_PKG_VERSION"));
    assert!(status.get("deviceToken").is_none());
    let token = remote.profile()["deviceToken"]
        .as_str()
        .unwrap()
        .to_string();

    let human = remote.ok(&["status"]).await;
    for fact in [
        host.url(),
        paired["deviceId"].as_str().unwrap().to_string(),
        "test-desktop".into(),
        "owner".into(),
        format!("pi-host {}", env!("CARGO_PKG_VERSION")),
    ] {
        assert!(human.contains(&fact), "{fact} missing in {human}");
    }
    assert!(!human.contains(&token));

    // An observer's profile: its own name and role (device/list is not its to call).
    let observer = Remote::new();
    observer.pair(&host, &["--roles", "observer"]).await;
    let status = observer.ok_json(&["status", "--json"]).await;
    assert_eq!(status["roles"], serde_json::json!(["observer"]));
    assert_eq!(status["deviceName"], "test-desktop");

    // The host gone: the profile's part is still printed, and it exits 3.
    host.kill().await;
    let output = remote.run(&["status"]).await;
    assert_eq!(output.status.code(), Some(3), "{}", text(&output.stderr));
    assert!(text(&output.stdout).contains(&host.url()));
    assert!(text(&output.stdout).contains("not reached"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn pair_into_a_used_profile_refuses_without_force_and_keeps_the_owner_credential() {
    let host = host().await;
    let remote = Remote::new();
    let owner = remote.pair(&host, &[]).await;
    let minted = host.pairing_token(&["--roles", "operator"]).await;
    let url = minted["url"].as_str().unwrap();
    let output = remote.run(&["pair", url]).await;
    assert_eq!(output.status.code(), Some(1), "{}", text(&output.stderr));
    let said = text(&output.stderr);
    for fact in [
        "\"default\"",
        owner["deviceId"].as_str().unwrap(),
        "role: owner",
        &host.url(),
        "--force",
    ] {
        assert!(said.contains(fact), "{fact} missing in {said}");
    }
    // The owner credential is untouched and still lists devices.
    assert_eq!(remote.profile()["roles"], serde_json::json!(["owner"]));
    let listed = remote.ok_json(&["devices", "--json"]).await;
    assert_eq!(listed["devices"].as_array().unwrap().len(), 1);

    // Refused before the token was spent: it pairs into another profile, or with --force.
    remote
        .ok(&["pair", url, "--profile", "ops", "--name", "ops-desktop"])
        .await;
    let minted = host.pairing_token(&["--roles", "operator"]).await;
    remote
        .ok(&["pair", minted["url"].as_str().unwrap(), "--force"])
        .await;
    assert_eq!(remote.profile()["roles"], serde_json::json!(["operator"]));
}

/// Under `prompt --wait`, stdin that is not a terminal is never read: a note says how to answer
/// from elsewhere, and an answer from a second process ends the wait.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_wait_without_a_terminal_says_how_to_answer() {
    let host = host().await;
    let remote = Remote::new();
    remote.pair(&host, &[]).await;
    let session = remote.new_session(&host, "w").await;
    let mut waiting = remote.spawn(&["prompt", &session, "approve:select", "--wait"]);
    let stdout = lines_of(waiting.0.stdout.take().unwrap());
    let stderr = lines_of(waiting.0.stderr.take().unwrap());
    let question = line_containing(&stdout, "[approval ");
    assert!(question.contains("1. Allow, 2. Block"), "{question}");
    let note = line_containing(&stderr, "answer with: pi-remote approve ");
    let id = note
        .split_whitespace()
        .nth(4)
        .expect("the approval id in the note");
    assert!(note.contains("--value OPTION"), "{note}");
    remote.ok(&["approve", id, "--value", "Allow"]).await;
    assert!(exit_of(waiting).success());
}

/// At a terminal (a pty from `script`), `prompt --wait` reads the answer: a number for a
/// select; a number out of range is refused with a note and asked again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prompt_wait_at_a_terminal_reads_the_answer() {
    let host = host().await;
    let remote = Remote::new();
    remote.pair(&host, &[]).await;
    let session = remote.new_session(&host, "w").await;
    let command = format!(
        "'{}' prompt {session} approve:select --wait",
        env!("CARGO_BIN_EXE_pi-remote")
    );
    // Killing `script` on a failure hangs its pty up, which ends pi-remote too.
    let mut child = Running(
        std::process::Command::new("script")
            .args(["-q", "-e", "-c", &command, "/dev/null"])
            .env("PI_REMOTE_CONFIG_DIR", remote.config.path())
            .env_remove("PI_REMOTE_PROFILE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let mut stdin = child.0.stdin.take().unwrap();
    let terminal = lines_of(child.0.stdout.take().unwrap());
    line_containing(&terminal, "type a number from 1 to 2");
    use std::io::Write;
    stdin.write_all(b"3\n").unwrap();
    line_containing(&terminal, "answer with a number from 1 to 2");
    stdin.write_all(b"1\n").unwrap();
    let settled = line_containing(&terminal, "] answered");
    assert!(settled.contains(": Allow"), "{settled}");
    line_containing(&terminal, "stand-in tool ran (answer: Allow)");
    let status = exit_of(child);
    drop(stdin);
    assert!(status.success(), "{status:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cat_writes_a_file_as_it_is_across_pages() {
    let host = host().await;
    let remote = Remote::new();
    remote.pair(&host, &[]).await;
    let root = host.root.path();
    // Binary, and longer than two of fs/read's largest pages.
    let bytes: Vec<u8> = (0..1_200_000u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(root.join("blob.bin"), &bytes).unwrap();
    std::fs::write(root.join("notes.md"), "héllo\n").unwrap();

    let blob = remote
        .run(&["cat", root.join("blob.bin").to_str().unwrap()])
        .await;
    assert!(blob.status.success(), "{}", text(&blob.stderr));
    assert!(
        blob.stdout == bytes,
        "{} bytes came back",
        blob.stdout.len()
    );
    let notes = remote
        .ok(&["cat", root.join("notes.md").to_str().unwrap()])
        .await;
    assert_eq!(notes, "héllo\n");

    let dir = remote.run(&["cat", root.to_str().unwrap()]).await;
    assert_eq!(dir.status.code(), Some(2), "{}", text(&dir.stderr));
    assert!(
        text(&dir.stderr).contains("READ_PATH_IS_DIRECTORY"),
        "{}",
        text(&dir.stderr)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changes_and_diff_show_what_a_turn_changed() {
    let host = host().await;
    let remote = Remote::new();
    remote.pair(&host, &[]).await;
    let workspace = host.workspace("repo");
    std::fs::write(format!("{workspace}/old.txt"), "old\n").unwrap();
    for args in [
        &["init", "-q", "-b", "main"][..],
        &["add", "."],
        &[
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@example.com",
            "commit",
            "-q",
            "-m",
            "first",
        ],
    ] {
        let done = std::process::Command::new("git")
            .args(args)
            .current_dir(&workspace)
            .status()
            .unwrap();
        assert!(done.success());
    }
    let created = remote
        .ok_json(&["new", "--workspace", &workspace, "--json"])
        .await;
    let session = created["sessionId"].as_str().unwrap().to_string();
    // The turn's end, with its files, as `prompt --wait --json` prints it.
    let waited = remote
        .ok(&[
            "prompt",
            &session,
            "write:notes.txt:2 rm:old.txt",
            "--wait",
            "--json",
        ])
        .await;
    let finished: Value = waited
        .lines()
        .filter_map(|line| serde_json::from_str::<Value>(line).ok())
        .find(|e| e["type"] == "turn.finished")
        .unwrap_or_else(|| panic!("{waited}"));
    let turn = finished["turnId"].as_str().unwrap().to_string();
    let files = &finished["data"]["files"];
    assert_eq!(files[0]["path"], "notes.txt", "{files}");
    assert_eq!(files[0]["added"], 2, "{files}");

    let changes = remote.ok(&["changes", &session]).await;
    assert!(changes.starts_with("on main\n"), "{changes}");
    assert!(changes.contains(".D old.txt\n"), "{changes}");
    assert!(changes.contains("?? notes.txt\n"), "{changes}");
    let diff = remote.ok(&["diff", &session, "--turn", &turn]).await;
    assert!(diff.contains("+line 1\n+line 2\n"), "{diff}");
    assert!(diff.contains("-old\n"), "{diff}");
    let one = remote.ok(&["diff", &session, "--path", "old.txt"]).await;
    assert!(one.contains("-old\n") && !one.contains("line 1"), "{one}");
    let human = remote
        .ok(&["prompt", &session, "write:more.txt:1", "--wait"])
        .await;
    assert!(human.contains("created more.txt +1 -0"), "{human}");
    let both = remote
        .run(&["diff", &session, "--turn", &turn, "--path", "x"])
        .await;
    assert_eq!(both.status.code(), Some(64), "{}", text(&both.stderr));
}
