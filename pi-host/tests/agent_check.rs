//! The host knows its agent: `serve` checks it (found where, which version, which Node), and
//! `host/info` and `pi-host status` report `agent: {state, version, path, runtime, problem}`; a
//! turn on a host without a usable agent is AGENT_UNAVAILABLE, not retriable, with the fix in
//! its message. Real host processes with the stand-in agent, small scripts standing for broken
//! agents, and the real pi.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use tests::{Client, HostProcess};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

async fn connect(host: &HostProcess) -> Client {
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    client
}

async fn host_info_agent(client: &mut Client) -> Value {
    let reply = client.call("host/info", json!({})).await;
    reply["result"]["agent"].clone()
}

async fn status_agent(host: &HostProcess) -> Value {
    let (ok, stdout, stderr) = host.cli(&["status", "--json"]).await;
    assert!(ok, "status failed: {stdout} {stderr}");
    let status: Value = serde_json::from_str(stdout.trim()).unwrap();
    status["agent"].clone()
}

/// A turn in a new session: the reply to `turn/start`.
async fn turn(client: &mut Client, host: &HostProcess, key: &str) -> Value {
    let created = client
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let id = created["result"]["session"]["sessionId"].clone();
    assert!(id.is_string(), "{created}");
    client
        .call(
            "turn/start",
            json!({"sessionId": id, "idempotencyKey": key, "text": "deltas:1"}),
        )
        .await
}

fn executable(path: &Path, text: &str) {
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(path, text).unwrap();
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o755)).unwrap();
}

fn assert_unavailable_with_the_fix(reply: &Value, problem: &str) {
    let error = &reply["error"];
    assert_eq!(error["code"], "AGENT_UNAVAILABLE", "{reply}");
    assert_eq!(error["retriable"], false, "{reply}");
    assert_ne!(error["recovery"], "retry", "{reply}");
    let message = error["message"].as_str().unwrap();
    assert!(message.contains(problem), "{message}");
    assert!(
        message.contains("npm install -g @mariozechner/pi-coding-agent"),
        "the fix is in the message itself: {message}"
    );
    assert!(message.contains("Node.js >= 20.6"), "{message}");
    assert!(message.contains("--agent"), "{message}");
}

#[tokio::test]
async fn the_stand_in_is_ready_with_its_version_and_path() {
    let agent = tests::stand_in_agent();
    let host = HostProcess::start_with(bin(), &["--agent", agent.to_str().unwrap()]).await;
    let mut client = connect(&host).await;
    let info = host_info_agent(&mut client).await;
    assert_eq!(
        info,
        json!({"state": "ready", "version": "0.73.1", "path": agent.to_str().unwrap()}),
        "a native program has no runtime and no problem"
    );
    assert_eq!(status_agent(&host).await, info);
    let (ok, human, _) = host.cli(&["status"]).await;
    assert!(ok);
    assert!(
        human.contains(&format!("agent: ready, 0.73.1 at {}", agent.display())),
        "{human}"
    );
    let log = host.log();
    let ready = log.lines().filter(|l| l.contains("agent ready")).count();
    assert_eq!(ready, 1, "one line, once: {log}");
    assert!(log.contains("version=\"0.73.1\""), "{log}");
    // And it runs.
    let reply = turn(&mut client, &host, "k").await;
    assert!(reply.get("result").is_some(), "{reply}");
}

#[tokio::test]
async fn a_missing_agent_is_reported_and_a_turn_gets_the_fix() {
    let host = HostProcess::start_with(bin(), &["--agent", "/nonexistent/pi --mode rpc"]).await;
    let mut client = connect(&host).await;
    let info = host_info_agent(&mut client).await;
    assert_eq!(info["state"], "missing", "{info}");
    let problem = info["problem"].as_str().unwrap();
    assert!(problem.contains("/nonexistent/pi"), "{problem}");
    assert!(info.get("version").is_none() && info.get("path").is_none());
    assert_eq!(status_agent(&host).await, info);
    let (_, human, _) = host.cli(&["status"]).await;
    assert!(
        human.contains("agent: missing: pi-host could not find"),
        "{human}"
    );
    assert!(host.log().contains("agent missing"));

    let reply = turn(&mut client, &host, "k").await;
    assert_unavailable_with_the_fix(&reply, "could not find the agent /nonexistent/pi");
    assert!(
        reply["error"]["details"]["suggestion"]
            .as_str()
            .unwrap()
            .contains("npm install"),
        "{reply}"
    );
}

#[tokio::test]
async fn an_agent_installed_later_is_found_by_the_next_turn() {
    // A bare name, looked up on PATH and then in the user's places (~/.local/bin first).
    let home = tempfile::tempdir().unwrap();
    let host = HostProcess::start_with_env(
        bin(),
        &["--agent", "pi-host-test-agent --mode rpc"],
        &[("HOME", home.path().to_str().unwrap())],
    )
    .await;
    let mut client = connect(&host).await;
    let info = host_info_agent(&mut client).await;
    assert_eq!(info["state"], "missing", "{info}");
    let looked_in = home.path().join(".local/bin");
    let problem = info["problem"].as_str().unwrap();
    assert!(
        problem.contains("`pi-host-test-agent` (looked in ")
            && problem.contains(looked_in.to_str().unwrap())
            && problem.contains(".npm-global/bin")
            && problem.contains("agent/current/bin"),
        "{problem}"
    );
    let reply = turn(&mut client, &host, "k1").await;
    assert_unavailable_with_the_fix(&reply, "`pi-host-test-agent`");

    let installed = looked_in.join("pi-host-test-agent");
    std::fs::create_dir_all(&looked_in).unwrap();
    std::os::unix::fs::symlink(tests::stand_in_agent(), &installed).unwrap();
    let reply = turn(&mut client, &host, "k2").await;
    assert!(reply.get("result").is_some(), "no restart needed: {reply}");
    let info = host_info_agent(&mut client).await;
    assert_eq!(info["state"], "ready", "{info}");
    assert_eq!(info["path"], installed.to_str().unwrap());
    assert!(host.log().contains("agent ready"));

    // And one removed is missing again.
    std::fs::remove_file(&installed).unwrap();
    let reply = turn(&mut client, &host, "k3").await;
    assert_unavailable_with_the_fix(&reply, "`pi-host-test-agent`");
    assert_eq!(host_info_agent(&mut client).await["state"], "missing");
}

#[tokio::test]
async fn an_agent_whose_version_fails_or_is_too_old_is_incompatible() {
    let dir = tempfile::tempdir().unwrap();
    let failing = dir.path().join("failing-pi");
    executable(&failing, "#!/bin/sh\necho 'no such option' >&2\nexit 3\n");
    let old = dir.path().join("old-pi");
    executable(&old, "#!/bin/sh\necho 0.50.2 >&2\n");
    let cases = [
        (&failing, "failed (exit status: 3): no such option"),
        (&old, "is version 0.50.2; pi-host needs pi 0.73.0 or newer"),
    ];
    for (agent, problem) in cases {
        let host = HostProcess::start_with(bin(), &["--agent", agent.to_str().unwrap()]).await;
        let mut client = connect(&host).await;
        let info = host_info_agent(&mut client).await;
        assert_eq!(info["state"], "incompatible", "{info}");
        assert_eq!(info["path"], agent.to_str().unwrap());
        assert!(
            info["problem"].as_str().unwrap().contains(problem),
            "{info}"
        );
        assert_eq!(status_agent(&host).await, info);
        assert!(host.log().contains("agent incompatible"));
        let reply = turn(&mut client, &host, "k").await;
        assert_unavailable_with_the_fix(&reply, problem);
    }
}

#[tokio::test]
async fn a_node_agent_on_an_old_node_is_incompatible() {
    // pi as npm installs it (`#!/usr/bin/env node`), with a Node 18 beside it.
    let dir = tempfile::tempdir().unwrap();
    let pi = dir.path().join("bin/pi");
    executable(&pi, "#!/usr/bin/env node\nconsole.log('0.73.1')\n");
    let node = dir.path().join("bin/node");
    executable(&node, "#!/bin/sh\necho v18.19.0\n");
    let host = HostProcess::start_with(bin(), &["--agent", pi.to_str().unwrap()]).await;
    let mut client = connect(&host).await;
    let info = host_info_agent(&mut client).await;
    assert_eq!(info["state"], "incompatible", "{info}");
    assert_eq!(
        info["runtime"],
        json!({"name": "node", "path": node.to_str().unwrap(), "version": "18.19.0"})
    );
    assert!(
        info["problem"]
            .as_str()
            .unwrap()
            .contains("is 18.19.0; pi needs Node.js >= 20.6.0"),
        "{info}"
    );
    let reply = turn(&mut client, &host, "k").await;
    assert_unavailable_with_the_fix(&reply, "18.19.0");
}

#[tokio::test]
async fn the_real_pi_is_ready_with_its_version_and_node() {
    let stub = tests::pi::Stub::default();
    let (host, _pi_dir) = tests::pi::pi_host(&stub, None).await;
    let mut client = connect(&host).await;
    let info = host_info_agent(&mut client).await;
    assert_eq!(info["state"], "ready", "{info}");
    assert!(
        info["version"].as_str().unwrap().starts_with("0.73."),
        "{info}"
    );
    assert_eq!(info["path"], tests::pi::pi_cli().to_str().unwrap());
    assert_eq!(info["runtime"]["name"], "node");
    let node_version = info["runtime"]["version"].as_str().unwrap();
    let major: u64 = node_version.split('.').next().unwrap().parse().unwrap();
    assert!(major >= 20, "{info}");
    assert!(info.get("problem").is_none(), "{info}");
}

/// An agent whose `--version` waits until `gate` exists (as if pi took that long to load), then
/// prints `version`; started in RPC mode, it writes its pid into `started` and is the stand-in.
fn gated_agent(dir: &Path, version: &str) -> std::path::PathBuf {
    let agent = dir.join("slow-version-pi");
    let (gate, started) = (dir.join("gate"), dir.join("started"));
    let stand_in = tests::stand_in_agent();
    executable(
        &agent,
        &format!(
            "#!/bin/sh\n\
             if [ \"$1\" = --version ]; then\n\
             i=0; while [ ! -e '{gate}' ] && [ $i -lt 600 ]; do sleep 0.05; i=$((i+1)); done\n\
             echo {version} >&2; exit 0\n\
             fi\n\
             echo $$ > '{started}.part' && mv '{started}.part' '{started}'\n\
             exec '{stand_in}' \"$@\"\n",
            gate = gate.display(),
            started = started.display(),
            stand_in = stand_in.display(),
        ),
    );
    agent
}

/// Waits (bounded) for the gated agent's RPC start; returns its pid.
async fn agent_started(dir: &Path) -> i32 {
    let started = dir.join("started");
    let began = std::time::Instant::now();
    loop {
        if let Ok(pid) = std::fs::read_to_string(&started) {
            return pid.trim().parse().unwrap();
        }
        assert!(
            !dir.join("gate").exists() && began.elapsed() < tests::PATIENCE,
            "the agent did not start while its version was being asked"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}

/// A check runs beside a start, never in front of it (docs/architecture.md, "The agent check"):
/// a new session's agent starts while the first check still waits for `--version`, and its turn
/// runs once the check says the agent is ready.
#[tokio::test]
async fn the_agent_starts_while_its_version_is_asked() {
    let dir = tempfile::tempdir().unwrap();
    let agent = gated_agent(dir.path(), "0.73.1");
    let host = HostProcess::start_with(bin(), &["--agent", agent.to_str().unwrap()]).await;
    let mut client = connect(&host).await;
    let created = client
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let id = created["result"]["session"]["sessionId"].clone();
    agent_started(dir.path()).await;
    std::fs::write(dir.path().join("gate"), "").unwrap();
    let reply = client
        .call(
            "turn/start",
            json!({"sessionId": id, "idempotencyKey": "k", "text": "deltas:1"}),
        )
        .await;
    assert!(reply.get("result").is_some(), "{reply}");
    assert_eq!(host_info_agent(&mut client).await["state"], "ready");
}

/// The same start, when the check then finds the agent too old: the agent started beside the
/// check is stopped and the turn gets AGENT_UNAVAILABLE with the fix.
#[tokio::test]
async fn an_agent_started_beside_a_check_that_fails_is_stopped() {
    let dir = tempfile::tempdir().unwrap();
    let agent = gated_agent(dir.path(), "0.50.2");
    let host = HostProcess::start_with(bin(), &["--agent", agent.to_str().unwrap()]).await;
    let mut client = connect(&host).await;
    let created = client
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let id = created["result"]["session"]["sessionId"].clone();
    let pid = agent_started(dir.path()).await;
    std::fs::write(dir.path().join("gate"), "").unwrap();
    let reply = client
        .call(
            "turn/start",
            json!({"sessionId": id, "idempotencyKey": "k", "text": "deltas:1"}),
        )
        .await;
    assert_unavailable_with_the_fix(&reply, "is version 0.50.2");
    let pid = nix::unistd::Pid::from_raw(pid);
    let began = std::time::Instant::now();
    while nix::sys::signal::kill(pid, None).is_ok() {
        assert!(
            began.elapsed() < tests::PATIENCE,
            "the unusable agent still runs"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
}
