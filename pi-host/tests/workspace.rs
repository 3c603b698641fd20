//! The workspace from the desktop (docs/protocol.md §8.9, §7.34, §7.35): changes on disk as
//! `workspace.changed` events, live and on resume, coalesced and bounded, ignored paths left
//! out; what a turn changed on `turn.finished`; `workspace/status` and `workspace/diff` through
//! the remote's git. With the stand-in agent; the real pi is in real_pi.rs.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{Value, json};
use std::path::Path;
use std::process::Command;
use std::time::Instant;
use tests::{Client, HostProcess, PATIENCE};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

fn is_change(event: &Value) -> bool {
    event["type"] == "workspace.changed"
}

/// Whether a `workspace.changed` event names `path` with `kind`.
fn names(event: &Value, path: &str, kind: &str) -> bool {
    is_change(event)
        && event["data"]["changes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|c| c["path"] == path && c["kind"] == kind)
}

/// Every path the `workspace.changed` events among `events` name.
fn paths(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .filter(|e| is_change(e))
        .flat_map(|e| e["data"]["changes"].as_array().unwrap().clone())
        .map(|c| c["path"].as_str().unwrap().to_string())
        .collect()
}

async fn operator(host: &HostProcess) -> Client {
    let (_, token) = host.pair_device("desk", &["--roles", "operator"]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    client
}

async fn cursor_of(client: &mut Client, session: &str) -> Value {
    let got = client
        .call("session/get", json!({"sessionId": session}))
        .await;
    got["result"]["cursor"].clone()
}

fn git(dir: &str, args: &[&str]) {
    let status = Command::new("git")
        .args(["-c", "user.name=t", "-c", "user.email=t@example.com"])
        .args(args)
        .current_dir(dir)
        .output()
        .unwrap();
    assert!(status.status.success(), "git {args:?}: {status:?}");
}

#[tokio::test]
async fn changes_arrive_live_and_again_from_an_older_cursor() {
    let host = HostProcess::start(bin()).await;
    let mut client = operator(&host).await;
    let ws = host.workspace("project");
    let session = client.open_session(&ws).await;
    let before = cursor_of(&mut client, &session).await;

    std::fs::write(format!("{ws}/a.txt"), "one").unwrap();
    let mut live = client
        .events_until(PATIENCE, |e| names(e, "a.txt", "created"))
        .await;
    // A directory made now is watched too, and what was made in it meanwhile is named.
    std::fs::create_dir(format!("{ws}/sub")).unwrap();
    std::fs::write(format!("{ws}/sub/b.txt"), "two").unwrap();
    live.extend(
        client
            .events_until(PATIENCE, |e| names(e, "sub/b.txt", "created"))
            .await,
    );
    std::fs::write(format!("{ws}/sub/b.txt"), "three").unwrap();
    live.extend(
        client
            .events_until(PATIENCE, |e| names(e, "sub/b.txt", "modified"))
            .await,
    );
    std::fs::rename(format!("{ws}/a.txt"), format!("{ws}/c.txt")).unwrap();
    live.extend(
        client
            .events_until(PATIENCE, |e| names(e, "c.txt", "renamed"))
            .await,
    );
    let renamed = live.last().unwrap()["data"]["changes"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["path"] == "c.txt")
        .unwrap()
        .clone();
    assert_eq!(renamed["from"], "a.txt");
    std::fs::remove_file(format!("{ws}/sub/b.txt")).unwrap();
    live.extend(
        client
            .events_until(PATIENCE, |e| names(e, "sub/b.txt", "removed"))
            .await,
    );
    let live: Vec<Value> = live.into_iter().filter(is_change).collect();
    assert!(live.iter().all(|e| e.get("turnId").is_none()));

    // Another device, away until now, resumes from before the changes: the same events.
    let (_, token) = host.pair_device("laptop", &["--roles", "observer"]).await;
    let mut away = Client::connect(&host.url(), &token).await.unwrap();
    away.hello().await;
    let sub = away
        .call(
            "session/subscribe",
            json!({"sessionId": session, "cursor": before}),
        )
        .await;
    assert!(sub.get("result").is_some(), "{sub}");
    let last = live.last().unwrap()["cursor"].clone();
    let replayed = away.events_until(PATIENCE, |e| e["cursor"] == last).await;
    let replayed: Vec<Value> = replayed.into_iter().filter(is_change).collect();
    assert_eq!(replayed, live, "resumed from an older cursor, missing none");
}

#[tokio::test]
async fn ignored_paths_are_not_reported() {
    let host = HostProcess::start(bin()).await;
    let mut client = operator(&host).await;
    let ws = host.workspace("ignoring");
    std::fs::write(format!("{ws}/.gitignore"), "*.log\nbuild/\n/top.tmp\n").unwrap();
    for dir in ["node_modules/pkg", ".git/objects/ab", "build", "src"] {
        std::fs::create_dir_all(format!("{ws}/{dir}")).unwrap();
    }
    let session = client.open_session(&ws).await;

    for file in [
        "node_modules/pkg/index.js",
        ".git/objects/ab/cdef",
        ".git/index",
        "build/out.o",
        "debug.log",
        "src/deep.log",
        "top.tmp",
        "src/top.tmp",
        "src/main.rs",
    ] {
        std::fs::write(format!("{ws}/{file}"), "x").unwrap();
    }
    std::fs::create_dir_all(format!("{ws}/web/node_modules/left-pad")).unwrap();
    std::fs::write(format!("{ws}/web/node_modules/left-pad/i.js"), "x").unwrap();
    std::fs::write(format!("{ws}/done.txt"), "x").unwrap();
    let events = client
        .events_until(PATIENCE, |e| names(e, "done.txt", "created"))
        .await;
    let mut named = paths(&events);
    named.sort();
    assert_eq!(
        named,
        ["done.txt", "src/main.rs", "src/top.tmp", "web"],
        "only what git would show"
    );
    let _ = session;
}

#[tokio::test]
async fn the_hosts_own_writes_are_never_watched() {
    // A workspace holding the host's data directory: every event the host commits writes
    // there (its database), and none of it is reported.
    let parent = tempfile::tempdir().unwrap();
    let data_dir = tempfile::tempdir_in(parent.path()).unwrap();
    let data_name = data_dir
        .path()
        .file_name()
        .unwrap()
        .to_str()
        .unwrap()
        .to_string();
    let ws = parent.path().to_str().unwrap().to_string();
    let host = HostProcess::start_in(bin(), data_dir, &["--root", &ws]).await;
    let mut client = operator(&host).await;
    client.open_session(&ws).await;
    let mut events = Vec::new();
    for i in 0..5 {
        std::fs::write(format!("{ws}/file-{i}"), "x").unwrap();
        let name = format!("file-{i}");
        events.extend(
            client
                .events_until(PATIENCE, |e| names(e, &name, "created"))
                .await,
        );
    }
    std::fs::write(format!("{ws}/done.txt"), "x").unwrap();
    events.extend(
        client
            .events_until(PATIENCE, |e| names(e, "done.txt", "created"))
            .await,
    );
    let named = paths(&events);
    assert!(
        named.iter().all(|p| !p.starts_with(&data_name)),
        "the data directory {data_name} is the host's: {named:?}"
    );
}

#[tokio::test]
async fn ten_thousand_files_at_once_come_as_few_bounded_events() {
    let host = HostProcess::start(bin()).await;
    let mut client = operator(&host).await;
    let ws = host.workspace("busy");
    std::fs::create_dir(format!("{ws}/many")).unwrap();
    client.open_session(&ws).await;

    let started = Instant::now();
    for i in 0..10_000 {
        std::fs::write(format!("{ws}/many/f{i:05}"), "x").unwrap();
    }
    let written = started.elapsed();
    // A marker after the burst: named, or fallen past the bound of a window that says rescan
    // (then another marker, until one is named: nothing of the burst is pending after it).
    let mut events = Vec::new();
    for round in 0.. {
        let marker = format!("done-{round}");
        std::fs::write(format!("{ws}/{marker}"), "x").unwrap();
        let got = client
            .events_until(PATIENCE, |e| {
                names(e, &marker, "created") || (is_change(e) && e["data"]["rescan"] == true)
            })
            .await;
        let named = got.iter().any(|e| names(e, &marker, "created"));
        events.extend(got);
        if named {
            break;
        }
    }
    let elapsed = started.elapsed();
    let changes: Vec<&Value> = events.iter().filter(|e| is_change(e)).collect();
    for event in &changes {
        let count = event["data"]["changes"].as_array().unwrap().len();
        assert!(count <= 256, "one event names at most 256 paths: {count}");
    }
    let rescans = changes
        .iter()
        .filter(|e| e["data"]["rescan"] == true)
        .inspect(|e| assert_eq!(e["data"]["reason"], "too_many_changes", "{e}"))
        .count();
    let named: std::collections::HashSet<String> = paths(&events)
        .into_iter()
        .filter(|p| p.starts_with("many/"))
        .collect();
    assert!(
        rescans > 0 || named.len() == 10_000,
        "every file named, or a rescan said: {} named",
        named.len()
    );
    assert!(
        changes.len() < 500,
        "coalesced: {} events for 10 000 files",
        changes.len()
    );
    eprintln!(
        "10 000 files written in {written:?}: {} events ({rescans} rescans, {} paths named), all in {elapsed:?}",
        changes.len(),
        named.len()
    );
}

#[tokio::test]
async fn the_watched_directory_bound_holds_at_it_and_says_rescan_past_it() {
    let host = HostProcess::start_with(bin(), &["--max-watched-dirs", "3"]).await;
    let mut client = operator(&host).await;
    // Exactly the bound: the top, a and a/b are watched.
    let at = host.workspace("at-bound");
    std::fs::create_dir_all(format!("{at}/a/b")).unwrap();
    client.open_session(&at).await;
    std::fs::write(format!("{at}/a/b/f.txt"), "x").unwrap();
    let events = client
        .events_until(PATIENCE, |e| names(e, "a/b/f.txt", "created"))
        .await;
    assert!(
        events.iter().all(|e| e["data"]["rescan"] != true),
        "{events:?}"
    );

    // One past it: a/b/c is not watched, and the first event says so.
    let past = host.workspace("past-bound");
    std::fs::create_dir_all(format!("{past}/a/b/c")).unwrap();
    client.open_session(&past).await;
    let events = client
        .events_until(PATIENCE, |e| is_change(e) && e["data"]["rescan"] == true)
        .await;
    let rescan = &events.last().unwrap()["data"];
    assert_eq!(rescan["reason"], "too_many_directories");
    assert_eq!(rescan["rescanPath"], "a/b/c");
}

#[tokio::test]
async fn a_turn_names_the_files_its_tools_changed_and_its_diff_shows_them() {
    let agent = tests::stand_in_agent();
    let host = HostProcess::start_with(bin(), &["--agent", agent.to_str().unwrap()]).await;
    let mut client = operator(&host).await;
    let ws = host.workspace("turned");
    std::fs::write(format!("{ws}/old.txt"), "old\n").unwrap();
    git(&ws, &["init", "-q", "-b", "main"]);
    git(&ws, &["add", "."]);
    git(&ws, &["commit", "-q", "-m", "first"]);
    let session = client.open_session(&ws).await;

    let started = client
        .call(
            "turn/start",
            json!({"sessionId": session, "idempotencyKey": "k1", "text": "write:notes.txt:3 rm:old.txt"}),
        )
        .await;
    let turn_id = started["result"]["turnId"]
        .as_str()
        .unwrap_or_else(|| panic!("{started}"))
        .to_string();
    let events = client
        .events_until(PATIENCE, |e| e["type"] == "turn.finished")
        .await;
    let finished = &events.last().unwrap()["data"];
    assert_eq!(finished["outcome"], "completed", "{finished}");
    let files = finished["files"].as_array().unwrap();
    assert_eq!(
        files[0],
        json!({"path": "notes.txt", "kind": "created", "added": 3, "removed": 0, "by": ["write"]})
    );
    assert_eq!(
        files[1],
        json!({"path": "old.txt", "kind": "removed", "by": ["disk"]})
    );
    assert_eq!(files.len(), 2, "{files:?}");

    // The snapshot's turn keeps them, and the turn's diff covers them.
    let got = client
        .call("session/get", json!({"sessionId": session}))
        .await;
    let turn = &got["result"]["snapshot"]["turns"][0];
    assert_eq!(turn["files"], json!(files));
    let diff = client
        .call(
            "workspace/diff",
            json!({"sessionId": session, "turnId": turn_id}),
        )
        .await;
    let result = &diff["result"];
    assert_eq!(result["paths"], json!(["notes.txt", "old.txt"]));
    let text = result["diff"].as_str().unwrap();
    assert!(text.contains("deleted file mode"), "{text}");
    assert!(text.contains("-old"), "{text}");
    assert!(text.contains("+line 1\n+line 2\n+line 3\n"), "{text}");
    let unknown = client
        .call(
            "workspace/diff",
            json!({"sessionId": session, "turnId": "turn_nope"}),
        )
        .await;
    assert_eq!(unknown["error"]["code"], "TURN_NOT_FOUND");
}

/// A turn's files come from what the kernel queued before the turn ended, even when the
/// watcher's task has not run since (a busy runtime; here held by a test hook): the turn's end
/// reads the queue itself, and the changes still reach the log as `workspace.changed`.
#[tokio::test]
async fn a_turn_names_its_files_when_the_watcher_reads_late() {
    let agent = tests::stand_in_agent();
    let host = HostProcess::start_with_env(
        bin(),
        &["--agent", agent.to_str().unwrap()],
        &[("PI_HOST_TEST_WATCH_DELAY_MS", "3000")],
    )
    .await;
    let mut client = operator(&host).await;
    let ws = host.workspace("late");
    std::fs::write(format!("{ws}/old.txt"), "old\n").unwrap();
    let session = client.open_session(&ws).await;
    let started = client
        .call(
            "turn/start",
            json!({"sessionId": session, "idempotencyKey": "k1", "text": "write:notes.txt:2 rm:old.txt"}),
        )
        .await;
    assert!(started["result"]["turnId"].is_string(), "{started}");
    let events = client
        .events_until(PATIENCE, |e| e["type"] == "turn.finished")
        .await;
    let files = &events.last().unwrap()["data"]["files"];
    assert_eq!(
        files,
        &json!([
            {"path": "notes.txt", "kind": "created", "added": 2, "removed": 0, "by": ["write"]},
            {"path": "old.txt", "kind": "removed", "by": ["disk"]}
        ])
    );
    // What the turn's end read still reaches the log, from the watcher's task.
    let mut seen = events;
    if !seen.iter().any(|e| names(e, "old.txt", "removed")) {
        seen.extend(
            client
                .events_until(PATIENCE, |e| names(e, "old.txt", "removed"))
                .await,
        );
    }
    assert!(
        seen.iter().any(|e| names(e, "notes.txt", "created")),
        "{:?}",
        paths(&seen)
    );
}

#[tokio::test]
async fn status_and_diff_read_the_repository_with_its_own_git() {
    let host = HostProcess::start(bin()).await;
    let mut client = operator(&host).await;
    let ws = host.workspace("repo");
    std::fs::write(format!("{ws}/file.txt"), "one\n").unwrap();
    git(&ws, &["init", "-q", "-b", "main"]);
    git(&ws, &["add", "."]);
    git(&ws, &["commit", "-q", "-m", "first"]);
    // A hook that would leave a mark if git ran it.
    std::fs::write(
        format!("{ws}/.git/hooks/post-index-change"),
        "#!/bin/sh\ntouch hooked\n",
    )
    .unwrap();
    std::fs::write(format!("{ws}/file.txt"), "two\n").unwrap();
    std::fs::write(format!("{ws}/new.txt"), "fresh\n").unwrap();
    let session = client.open_session(&ws).await;

    let status = client
        .call("workspace/status", json!({"sessionId": session}))
        .await;
    let status = &status["result"];
    assert_eq!(status["branch"], "main");
    assert!(status["head"].as_str().unwrap().len() >= 40);
    assert_eq!(
        status["files"],
        json!([{"path": "file.txt", "status": ".M"}, {"path": "new.txt", "status": "??"}])
    );

    let whole = client
        .call("workspace/diff", json!({"sessionId": session}))
        .await;
    let text = whole["result"]["diff"].as_str().unwrap().to_string();
    assert!(text.contains("-one\n+two\n"), "{text}");
    assert!(
        text.contains("+fresh\n"),
        "an untracked file shows as new: {text}"
    );
    assert_eq!(whole["result"]["truncated"], false);

    let one = client
        .call(
            "workspace/diff",
            json!({"sessionId": session, "path": "file.txt"}),
        )
        .await;
    let one_text = one["result"]["diff"].as_str().unwrap();
    assert!(one_text.contains("+two") && !one_text.contains("fresh"));

    // The bound: the whole diff at exactly its size, then one byte short of it.
    let size = text.len();
    let exact = client
        .call(
            "workspace/diff",
            json!({"sessionId": session, "maxBytes": size}),
        )
        .await;
    assert_eq!(exact["result"]["truncated"], false);
    assert_eq!(exact["result"]["diff"], text);
    let short = client
        .call(
            "workspace/diff",
            json!({"sessionId": session, "maxBytes": size - 1}),
        )
        .await;
    assert_eq!(short["result"]["truncated"], true);
    let cut = short["result"]["diff"].as_str().unwrap();
    assert!(cut.len() < size && cut.ends_with('\n') && text.starts_with(cut));

    let outside = client
        .call(
            "workspace/diff",
            json!({"sessionId": session, "path": "../other"}),
        )
        .await;
    assert_eq!(outside["error"]["code"], "REMOTE_PATH_FORBIDDEN");
    let both = client
        .call(
            "workspace/diff",
            json!({"sessionId": session, "path": "file.txt", "turnId": "t"}),
        )
        .await;
    assert_eq!(both["error"]["code"], "INVALID_PARAMS");
    assert!(
        !Path::new(&format!("{ws}/hooked")).exists(),
        "no hook of the repository ran"
    );

    // An observer sees the status, never the lines.
    let (_, token) = host.pair_device("phone", &["--roles", "observer"]).await;
    let mut observer = Client::connect(&host.url(), &token).await.unwrap();
    observer.hello().await;
    let seen = observer
        .call("workspace/status", json!({"sessionId": session}))
        .await;
    assert!(seen.get("result").is_some(), "{seen}");
    let refused = observer
        .call("workspace/diff", json!({"sessionId": session}))
        .await;
    assert_eq!(refused["error"]["code"], "FORBIDDEN");

    // Not a repository.
    let plain = host.workspace("plain");
    let other = client.open_session(&plain).await;
    for method in ["workspace/status", "workspace/diff"] {
        let reply = client.call(method, json!({"sessionId": other})).await;
        assert_eq!(
            reply["error"]["code"], "WORKSPACE_NOT_A_REPOSITORY",
            "{reply}"
        );
    }
}

#[tokio::test]
async fn a_host_without_git_says_so() {
    let no_git = tempfile::tempdir().unwrap();
    let path = no_git.path().to_str().unwrap();
    let host = HostProcess::start_with_env(bin(), &[], &[("PATH", path)]).await;
    let mut client = operator(&host).await;
    let ws = host.workspace("repo");
    let session = client.open_session(&ws).await;
    for method in ["workspace/status", "workspace/diff"] {
        let reply = client.call(method, json!({"sessionId": session})).await;
        assert_eq!(reply["error"]["code"], "GIT_UNAVAILABLE", "{reply}");
        assert_eq!(reply["error"]["retriable"], false);
    }
}

#[tokio::test]
async fn sessions_of_one_workspace_share_its_watcher_each_in_its_own_log() {
    let host = HostProcess::start(bin()).await;
    let mut client = operator(&host).await;
    let ws = host.workspace("shared");
    let first = client.open_session(&ws).await;
    let second = client.open_session(&ws).await;
    std::fs::write(format!("{ws}/one.txt"), "x").unwrap();
    // Both sessions get the change, each in its own log.
    let seen = std::cell::RefCell::new(std::collections::HashSet::new());
    client
        .events_until(PATIENCE, |e| {
            names(e, "one.txt", "created") && {
                let epoch = e["cursor"].as_str().unwrap().split('-').next().unwrap();
                seen.borrow_mut().insert(epoch.to_string());
                seen.borrow().len() == 2
            }
        })
        .await;
    let closed = client
        .call("session/close", json!({"sessionId": first}))
        .await;
    assert!(closed.get("result").is_some());
    std::fs::write(format!("{ws}/two.txt"), "x").unwrap();
    let events = client
        .events_until(PATIENCE, |e| names(e, "two.txt", "created"))
        .await;
    let last = events.last().unwrap();
    assert_eq!(
        last["cursor"].as_str().unwrap().split('-').next(),
        cursor_of(&mut client, &second)
            .await
            .as_str()
            .unwrap()
            .split('-')
            .next(),
        "the open session still gets changes"
    );
}

#[tokio::test]
async fn a_git_that_does_not_answer_is_stopped_at_the_deadline() {
    // A `git` that never answers: the call ends with TIMEOUT at the host's deadline (15 s).
    let slow = tempfile::tempdir().unwrap();
    let git = slow.path().join("git");
    std::fs::write(&git, "#!/bin/sh\nexec /bin/sleep 120\n").unwrap();
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&git, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = slow.path().to_str().unwrap();
    let host = HostProcess::start_with_env(bin(), &[], &[("PATH", path)]).await;
    let mut client = operator(&host).await;
    let ws = host.workspace("repo");
    let session = client.open_session(&ws).await;
    let began = Instant::now();
    let reply = client
        .call("workspace/status", json!({"sessionId": session}))
        .await;
    let took = began.elapsed();
    assert_eq!(reply["error"]["code"], "TIMEOUT", "{reply}");
    assert!(
        took >= std::time::Duration::from_secs(15) && took < std::time::Duration::from_secs(25),
        "{took:?}"
    );
    // The git it started was stopped with the call.
    let sleeping = std::process::Command::new("pgrep")
        .args(["-f", "-P", &host.pid().to_string(), "sleep 120"])
        .output()
        .unwrap();
    assert!(sleeping.stdout.is_empty(), "git still runs");
}

#[tokio::test]
async fn after_a_restart_the_workspace_is_watched_again_and_the_gap_is_a_rescan() {
    let host = HostProcess::start(bin()).await;
    let (_, token) = host.pair_device("desk", &["--roles", "operator"]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let ws = host.workspace("kept");
    let session = client.open_session(&ws).await;
    let before = cursor_of(&mut client, &session).await;
    drop(client);
    let host = host.restart(&[]).await;
    // Written while the host was away: unknown to it, so the restart says rescan.
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    client
        .call(
            "session/subscribe",
            json!({"sessionId": session, "cursor": before}),
        )
        .await;
    let events = client
        .events_until(PATIENCE, |e| is_change(e) && e["data"]["rescan"] == true)
        .await;
    assert_eq!(events.last().unwrap()["data"]["reason"], "host_restarted");
    std::fs::write(format!("{ws}/after.txt"), "x").unwrap();
    client
        .events_until(PATIENCE, |e| names(e, "after.txt", "created"))
        .await;
}

#[tokio::test]
async fn a_repository_before_its_first_commit_diffs_against_nothing() {
    let host = HostProcess::start(bin()).await;
    let mut client = operator(&host).await;
    let ws = host.workspace("fresh");
    git(&ws, &["init", "-q", "-b", "main"]);
    std::fs::write(format!("{ws}/staged.txt"), "staged\n").unwrap();
    git(&ws, &["add", "staged.txt"]);
    std::fs::write(format!("{ws}/loose.txt"), "loose\n").unwrap();
    let session = client.open_session(&ws).await;
    let status = client
        .call("workspace/status", json!({"sessionId": session}))
        .await;
    assert_eq!(status["result"]["branch"], "main", "{status}");
    assert!(status["result"].get("head").is_none(), "{status}");
    let diff = client
        .call("workspace/diff", json!({"sessionId": session}))
        .await;
    let text = diff["result"]["diff"].as_str().unwrap_or_default();
    assert!(
        text.contains("+staged\n") && text.contains("+loose\n"),
        "{diff}"
    );
}
