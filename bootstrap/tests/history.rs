//! A session's conversation in `pi-remote`, against a real pi-host with the stand-in agent:
//! `history` prints every message oldest first, paging back with `session/history` even after
//! the events left the host's replay window, and says when the host's history bound dropped the
//! oldest; `attach` shows the conversation so far before it follows live, and after a resync
//! the messages it missed, each message once.

#![allow(clippy::expect_used, clippy::unwrap_used)]

mod common;

use common::Remote;
use serde_json::{Value, json};
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use tests::{HostProcess, PATIENCE};

/// A host with the stand-in agent; `extra` serve flags (e.g. a small replay window).
async fn host(extra: &[&str]) -> HostProcess {
    let agent = tests::stand_in_agent();
    let mut args = vec!["--agent", agent.to_str().unwrap(), "--heartbeat-ms", "200"];
    args.extend_from_slice(extra);
    HostProcess::start_with(&tests::pi_host_binary(), &args).await
}

/// A desktop paired with `host` through its pairing link.
async fn paired(host: &HostProcess) -> Remote {
    let remote = Remote::new();
    let minted = host.pairing_token(&[]).await;
    let url = minted["url"].as_str().unwrap();
    remote.ok_json(&["pair", url, "--json"]).await;
    remote
}

async fn new_session(remote: &Remote, host: &HostProcess) -> String {
    let workspace = host.workspace("w");
    let created = remote
        .ok_json(&["new", "--workspace", &workspace, "--json"])
        .await;
    created["sessionId"].as_str().unwrap().to_string()
}

/// Runs a turn to its end.
async fn turn(remote: &Remote, session: &str, text: &str) {
    remote.ok(&["prompt", session, text, "--wait"]).await;
}

/// Panics unless each of `needles` occurs in `text` after the previous one.
fn assert_in_order(text: &str, needles: &[&str]) {
    let mut from = 0;
    for needle in needles {
        match text[from..].find(needle) {
            Some(at) => from += at + needle.len(),
            None => panic!("{needle:?} missing (or out of order) in:\n{text}"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_prints_the_whole_conversation_after_the_replay_window_moved_on() {
    let host = host(&["--retain-events", "20"]).await;
    let remote = paired(&host).await;
    let session = new_session(&remote, &host).await;
    let first = remote
        .ok(&["prompt", &session, "echo one", "--wait", "--json"])
        .await;
    let first: Value = serde_json::from_str(first.lines().next().unwrap()).unwrap();
    // Seven results of 50 KB: more than a page of 256 KiB, so pi-remote pages back.
    turn(&remote, &session, &["output:50000"; 7].join(" ")).await;
    // Over a hundred messages in one turn: more than the snapshot's history holds.
    turn(&remote, &session, &["tool"; 55].join(" ")).await;
    turn(&remote, &session, "echo four").await;

    // The host no longer replays the first turn, and its history is more than a page of the
    // most entries pi-remote asks for.
    let token = remote.profile()["deviceToken"]
        .as_str()
        .unwrap()
        .to_string();
    let mut raw = tests::Client::connect(&host.url(), &token).await.unwrap();
    raw.hello().await;
    let cursor = &first["cursor"];
    let expired = raw
        .call(
            "session/subscribe",
            json!({"sessionId": session, "cursor": cursor}),
        )
        .await;
    assert_eq!(expired["error"]["code"], "CURSOR_EXPIRED", "{expired}");
    let head = raw
        .call(
            "session/history",
            json!({"sessionId": session, "limit": 1000}),
        )
        .await;
    assert!(head["result"]["earlier"].is_string(), "one page: {head}");

    let shown = remote.ok(&["history", &session]).await;
    assert_in_order(
        &shown,
        &[
            "you: echo one\n",
            "assistant: echo one\n",
            "you: output:50000",
            "← bash: 0000",
            " …\n",
            "assistant: done\n",
            "you: tool tool",
            "→ bash {\"command\":\"echo stand-in\"}\n← bash: stand-in tool ran\n",
            "assistant: done\n",
            "you: echo four\n",
            "assistant: echo four\n",
        ],
    );
    assert_eq!(shown.matches("you: ").count(), 4, "{shown}");
    assert_eq!(shown.matches("← bash: stand-in tool ran").count(), 55);
    assert_eq!(shown.matches("← bash: 0000").count(), 7);
    assert!(!shown.contains("dropped"), "{shown}");

    // --json: the events as delivered live, oldest first.
    let json = remote.ok(&["history", &session, "--json"]).await;
    let entries: Vec<Value> = json
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(entries.iter().all(|e| e["type"] == "agent.message_end"));
    let seqs: Vec<u64> = entries.iter().map(|e| e["seq"].as_u64().unwrap()).collect();
    assert!(seqs.windows(2).all(|w| w[0] < w[1]), "{seqs:?}");
    assert_eq!(
        entries[0]["data"]["message"]["content"][0]["text"],
        "echo one"
    );
    let last_text = &entries.last().unwrap()["data"]["message"]["content"][0]["text"];
    assert_eq!(last_text, "echo four");

    // --limit: the last messages, and a word on the rest.
    let last = remote.ok(&["history", &session, "--limit", "2"]).await;
    assert_in_order(
        &last,
        &[
            "earlier messages not shown",
            "you: echo four\n",
            "assistant: echo four\n",
        ],
    );
    assert!(!last.contains("echo one"), "{last}");

    // attach shows the most recent messages and says where the rest are.
    let attached = remote.ok(&["attach", &session]).await;
    assert_in_order(
        &attached,
        &[
            &format!("(earlier messages: `pi-remote history {session}`)"),
            "← bash: stand-in tool ran\n",
            "you: echo four\n",
            "assistant: echo four\n",
        ],
    );
    assert!(!attached.contains("echo one"), "{attached}");
}

/// A `pi-remote attach SESSION` (the human view) with stdin held open.
struct Attach {
    child: Child,
    stdout: mpsc::Receiver<String>,
    stderr: mpsc::Receiver<String>,
    /// Every stdout line read so far.
    seen: Vec<String>,
}

impl Attach {
    fn start(remote: &Remote, session: &str) -> Attach {
        let mut child = std::process::Command::new(env!("CARGO_BIN_EXE_pi-remote"))
            .args(["attach", session])
            .env("PI_REMOTE_CONFIG_DIR", remote.config.path())
            .env_remove("PI_REMOTE_PROFILE")
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stdout = lines_of(child.stdout.take().unwrap());
        let stderr = lines_of(child.stderr.take().unwrap());
        Attach {
            child,
            stdout,
            stderr,
            seen: Vec::new(),
        }
    }

    /// Reads stdout until a line contains `needle`.
    fn until(&mut self, needle: &str) {
        tokio::task::block_in_place(|| {
            let deadline = std::time::Instant::now() + PATIENCE;
            loop {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                let line = self.stdout.recv_timeout(left).unwrap_or_else(|_| {
                    panic!(
                        "attach printed no {needle:?} in time; so far: {:#?}",
                        self.seen
                    )
                });
                self.seen.push(line);
                if self.seen.last().unwrap().contains(needle) {
                    return;
                }
            }
        })
    }

    /// Reads stderr until a line contains `needle`.
    fn note(&mut self, needle: &str) {
        let mut notes = Vec::new();
        tokio::task::block_in_place(|| {
            let deadline = std::time::Instant::now() + PATIENCE;
            loop {
                let left = deadline.saturating_duration_since(std::time::Instant::now());
                let Ok(line) = self.stderr.recv_timeout(left) else {
                    self.seen.extend(self.stdout.try_iter());
                    panic!(
                        "attach noted no {needle:?} in time; stderr: {notes:#?}, stdout: {:#?}",
                        self.seen
                    );
                };
                if line.contains(needle) {
                    return;
                }
                notes.push(line);
            }
        })
    }

    fn text(&self) -> String {
        self.seen.iter().map(|l| format!("{l}\n")).collect()
    }

    /// Closes stdin: with nothing pending, attach exits 0.
    fn finish(mut self) {
        drop(self.child.stdin.take());
        tokio::task::block_in_place(|| {
            let deadline = std::time::Instant::now() + PATIENCE;
            loop {
                if let Some(status) = self.child.try_wait().unwrap() {
                    assert!(status.success(), "attach exited {status}");
                    return;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "attach did not exit after stdin closed"
                );
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        });
    }
}

impl Drop for Attach {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_shows_the_earlier_turns_then_follows_live() {
    let host = host(&[]).await;
    let remote = paired(&host).await;
    let session = new_session(&remote, &host).await;
    turn(&remote, &session, "echo one").await;
    turn(&remote, &session, "echo two").await;

    let mut attach = Attach::start(&remote, &session);
    attach.until("assistant: echo two");
    assert_in_order(
        &attach.text(),
        &[
            "attached to ",
            "\nyou: echo one\nassistant: echo one\nyou: echo two\nassistant: echo two\n",
        ],
    );
    assert!(!attach.text().contains("earlier messages"));
    // Live from the snapshot's cursor: the next turn as it happens, nothing shown again.
    remote.ok(&["prompt", &session, "echo three"]).await;
    attach.until(" completed");
    let text = attach.text();
    assert_in_order(
        &text,
        &[
            "assistant: echo two\n",
            ": echo three\n",
            "echo three",
            " completed",
        ],
    );
    assert_eq!(text.matches("echo one").count(), 2, "{text}");
    assert!(!text.contains("you: echo three"), "{text}");
    attach.finish();

    // --json: the snapshot's history is in the first line; events follow from its cursor.
    let output = remote.ok(&["attach", &session, "--json"]).await;
    let first: Value = serde_json::from_str(output.lines().next().unwrap()).unwrap();
    assert_eq!(first["type"], "client.attached");
    let entries = first["history"]["entries"].as_array().unwrap();
    let roles: Vec<&str> = entries
        .iter()
        .map(|e| e["data"]["message"]["role"].as_str().unwrap())
        .collect();
    assert_eq!(
        roles,
        [
            "user",
            "assistant",
            "user",
            "assistant",
            "user",
            "assistant"
        ]
    );
    assert!(first["history"].get("earlier").is_none(), "{first}");
    assert_eq!(output.lines().count(), 1, "{output}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn attach_shows_the_messages_missed_while_the_log_moved_on() {
    let host = host(&["--retain-events", "20"]).await;
    let proxy = tests::FaultProxy::start(host.addr).await;
    // This desktop reaches the host through the proxy (a bare token with the proxy's address);
    // the other drives the turns directly.
    let remote = Remote::new();
    let minted = host.pairing_token(&[]).await;
    let fingerprint = minted["certSha256"].as_str().unwrap();
    let token = format!("{}\n", minted["token"].as_str().unwrap());
    let proxy_addr = proxy.addr.to_string();
    let args = [
        "pair",
        "-",
        "--host",
        &proxy_addr,
        "--cert-sha256",
        fingerprint,
    ];
    let output = remote.run_with_stdin(&args, &token).await;
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let driver = paired(&host).await;
    let session = new_session(&driver, &host).await;

    let mut attach = Attach::start(&remote, &session);
    attach.until("attached to ");
    turn(&driver, &session, "echo before").await;
    attach.until(" completed");

    // The link goes down and stays down while three turns run: more events than the host
    // replays, so attach comes back through a snapshot.
    proxy.stall(true);
    proxy.cut();
    for text in ["echo r1", "echo r2", "echo r3"] {
        turn(&driver, &session, text).await;
    }
    proxy.stall(false);
    attach.note("resumed from a snapshot");
    attach.until("assistant: echo r3");
    let text = attach.text();
    assert_in_order(
        &text,
        &[
            "you: echo r1\nassistant: echo r1\n",
            "you: echo r2\nassistant: echo r2\n",
            "you: echo r3\nassistant: echo r3\n",
        ],
    );
    // What was shown live before the cut is not shown again.
    assert!(!text.contains("you: echo before"), "{text}");

    turn(&driver, &session, "echo after").await;
    attach.until(": echo after");
    attach.finish();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn history_says_when_the_hosts_bound_dropped_the_oldest_messages() {
    let host = host(&["--history-max-bytes", "4000"]).await;
    let remote = paired(&host).await;
    let session = new_session(&remote, &host).await;
    for text in [
        "echo one",
        "echo two",
        "echo three",
        "echo four",
        "echo five",
        "echo six",
    ] {
        turn(&remote, &session, text).await;
    }
    let shown = remote.ok(&["history", &session]).await;
    assert!(
        shown.starts_with("(earlier messages were dropped by the host's history bound)\n"),
        "{shown}"
    );
    assert!(
        shown.ends_with("you: echo six\nassistant: echo six\n"),
        "{shown}"
    );
    assert!(!shown.contains("echo one"), "{shown}");
    // With --json the entries alone are on stdout; the word on the dropped ones is a note.
    let output = remote.run(&["history", &session, "--json"]).await;
    assert!(output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("dropped by the host's history bound"),
        "{stderr}"
    );
    for line in String::from_utf8(output.stdout).unwrap().lines() {
        let entry: Value = serde_json::from_str(line).unwrap();
        assert_eq!(entry["type"], "agent.message_end");
    }
}
