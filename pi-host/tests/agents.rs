//! When a session's agent runs (docs/architecture.md, "Agent lifecycle"), with the stand-in
//! agent: started with the session, stopped when idle and resumed by the next turn, at most
//! `--max-agents` at once, and turns that race an idle stop.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};
use tests::{Client, HostProcess, PATIENCE};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

async fn host(extra: &[&str]) -> HostProcess {
    let agent = tests::stand_in_agent();
    let mut args = vec!["--agent", agent.to_str().unwrap()];
    args.extend_from_slice(extra);
    HostProcess::start_with(bin(), &args).await
}

async fn connect(host: &HostProcess, token: &str) -> Client {
    let mut client = Client::connect(&host.url(), token).await.unwrap();
    client.hello().await;
    client
}

async fn create_session(client: &mut Client, host: &HostProcess) -> (String, Value) {
    let created = client
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let session = &created["result"]["session"];
    (
        session["sessionId"].as_str().unwrap().to_string(),
        session["cursor"].clone(),
    )
}

async fn agents(client: &mut Client) -> Value {
    client.call("host/info", json!({})).await["result"]["agents"].clone()
}

/// Polls `host/info` until `agents.running` is `want`.
async fn until_running(client: &mut Client, want: u64) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let agents = agents(client).await;
        if agents["running"] == want {
            return agents;
        }
        assert!(
            Instant::now() < deadline,
            "{want} agents never ran: {agents}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn start_turn(client: &mut Client, session_id: &str, text: &str) -> Value {
    static KEY: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    let key = KEY.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    client
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": format!("k{key}"), "text": text}),
        )
        .await
}

/// Polls `session/get` until no turn runs; returns the last turn.
async fn until_turn_ends(client: &mut Client, session_id: &str) -> Value {
    let deadline = Instant::now() + PATIENCE;
    loop {
        let got = client
            .call("session/get", json!({"sessionId": session_id}))
            .await;
        let snapshot = &got["result"]["snapshot"];
        if snapshot["state"] != "running" {
            return snapshot["turns"]
                .as_array()
                .unwrap()
                .last()
                .unwrap()
                .clone();
        }
        assert!(Instant::now() < deadline, "the turn never ended: {got}");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Every event of a session so far, read by a fresh subscription from its first cursor.
async fn events_of(
    host: &HostProcess,
    token: &str,
    session_id: &str,
    cursor: &Value,
    done: impl Fn(&Value) -> bool,
) -> Vec<Value> {
    let mut client = connect(host, token).await;
    let sub = client
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": cursor}),
        )
        .await;
    assert!(sub.get("result").is_some(), "{sub}");
    client.events_until(PATIENCE, done).await
}

#[tokio::test]
async fn a_new_session_starts_its_agent_before_the_first_prompt() {
    let host = host(&[]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    assert_eq!(agents(&mut client).await["running"], 0);
    let (session_id, _) = create_session(&mut client, &host).await;
    let running = until_running(&mut client, 1).await;
    assert!(running["rssBytes"].as_u64().unwrap() > 0, "{running}");
    let warm = host.agent_pids();
    assert_eq!(warm.len(), 1, "{warm:?}");
    let (ok, status, _) = host.cli(&["status"]).await;
    assert!(ok && status.contains("agents: 1 running"), "{status}");

    start_turn(&mut client, &session_id, "deltas:2").await;
    let turn = until_turn_ends(&mut client, &session_id).await;
    assert_eq!(turn["state"], "completed", "{turn}");
    assert_eq!(
        host.agent_pids(),
        warm,
        "the first turn ran on the warm agent"
    );
}

/// Where the host writes its preload extension (`pi-host/src/agent/preload.ts`).
fn preload_path(host: &HostProcess) -> std::path::PathBuf {
    host.data_dir
        .path()
        .join("pi-extensions/pi-host-preload.ts")
}

fn settings_path(host: &HostProcess) -> std::path::PathBuf {
    host.data_dir
        .path()
        .join("pi-extensions/pi-host-settings.ts")
}

fn permissions_path(host: &HostProcess) -> std::path::PathBuf {
    host.data_dir
        .path()
        .join("pi-extensions/pi-host-permissions.ts")
}

/// The arguments the session's agent was started with (the stand-in's `whoami`).
async fn agent_args(client: &mut Client, host: &HostProcess, token: &str) -> Value {
    let (session_id, cursor) = create_session(client, host).await;
    until_running(client, 1).await;
    start_turn(client, &session_id, "whoami").await;
    assert_eq!(
        until_turn_ends(client, &session_id).await["state"],
        "completed"
    );
    let events = events_of(host, token, &session_id, &cursor, |e| {
        e["type"] == "agent.stand_in_whoami"
    })
    .await;
    events.last().unwrap()["data"]["args"].clone()
}

#[tokio::test]
async fn agents_start_with_the_preload_extension_unless_it_is_turned_off() {
    let host = host(&[]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let preload = preload_path(&host);
    let settings = settings_path(&host);
    let permissions = permissions_path(&host);
    assert_eq!(
        agent_args(&mut client, &host, &token).await,
        json!([
            "--extension",
            preload.to_str().unwrap(),
            "--extension",
            settings.to_str().unwrap(),
            "--extension",
            permissions.to_str().unwrap()
        ])
    );
    assert_eq!(
        std::fs::read_to_string(&preload).unwrap(),
        include_str!("../src/agent/extensions/preload.ts"),
        "the extension this build ships"
    );
    assert_eq!(
        std::fs::read_to_string(&settings).unwrap(),
        include_str!("../src/agent/extensions/settings.ts"),
    );

    let host = tests::HostProcess::start_with(
        bin(),
        &[
            "--agent",
            tests::stand_in_agent().to_str().unwrap(),
            "--disable-agent-preload",
        ],
    )
    .await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    // The settings and permissions extensions stay: they carry what a desktop set (keys,
    // model servers) and the permission policy.
    assert_eq!(
        agent_args(&mut client, &host, &token).await,
        json!([
            "--extension",
            settings_path(&host).to_str().unwrap(),
            "--extension",
            permissions_path(&host).to_str().unwrap()
        ])
    );
    assert!(!preload_path(&host).exists());
}

#[tokio::test]
async fn an_idle_agent_stops_and_the_next_turn_resumes_it() {
    let host = host(&["--agent-idle-ms", "300"]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let (session_id, first_cursor) = create_session(&mut client, &host).await;
    start_turn(&mut client, &session_id, "deltas:1").await;
    assert_eq!(
        until_turn_ends(&mut client, &session_id).await["state"],
        "completed"
    );
    // No subscriber and no turn: the agent goes after the idle time.
    until_running(&mut client, 0).await;
    assert!(host.agent_pids().is_empty());
    let events = events_of(&host, &token, &session_id, &first_cursor, |e| {
        e["type"] == "session.agent_stopped"
    })
    .await;
    let stopped = events.last().unwrap();
    assert_eq!(stopped["data"]["reason"], "idle", "{stopped}");
    assert!(
        stopped["data"]["idleMs"].as_u64().unwrap() >= 300,
        "{stopped}"
    );

    // The next turn starts it again with the resume arguments.
    let cursor = stopped["cursor"].clone();
    start_turn(&mut client, &session_id, "whoami").await;
    assert_eq!(
        until_turn_ends(&mut client, &session_id).await["state"],
        "completed"
    );
    let events = events_of(&host, &token, &session_id, &cursor, |e| {
        e["type"] == "agent.stand_in_whoami"
    })
    .await;
    let args = &events.last().unwrap()["data"]["args"];
    let (preload, settings) = (preload_path(&host), settings_path(&host));
    assert_eq!(
        args,
        &json!([
            "--extension",
            preload.to_str().unwrap(),
            "--extension",
            settings.to_str().unwrap(),
            "--extension",
            permissions_path(&host).to_str().unwrap(),
            "--continue"
        ]),
        "resumed: {args}"
    );
}

#[tokio::test]
async fn a_subscribed_session_keeps_its_agent() {
    let host = host(&["--agent-idle-ms", "100"]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let (session_id, cursor) = create_session(&mut client, &host).await;
    let mut watcher = connect(&host, &token).await;
    let sub = watcher
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": cursor}),
        )
        .await;
    assert!(sub.get("result").is_some(), "{sub}");
    until_running(&mut client, 1).await;
    // Many idle periods pass (nothing to wait for: the check is that nothing happens).
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert_eq!(agents(&mut client).await["running"], 1);
    drop(watcher);
    until_running(&mut client, 0).await;
}

#[tokio::test]
async fn the_cap_stops_the_least_recently_used_idle_agent_then_refuses_when_all_are_busy() {
    let host = host(&["--max-agents", "2"]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let (first, first_cursor) = create_session(&mut client, &host).await;
    until_running(&mut client, 1).await;
    // An agent that ran a turn: its stop is recorded (one that never did goes quietly).
    start_turn(&mut client, &first, "deltas:1").await;
    until_turn_ends(&mut client, &first).await;
    let (second, _) = create_session(&mut client, &host).await;
    until_running(&mut client, 2).await;
    let (third, _) = create_session(&mut client, &host).await;
    // The third session's agent takes the slot of the first, the least recently used.
    let events = events_of(&host, &token, &first, &first_cursor, |e| {
        e["type"] == "session.agent_stopped"
    })
    .await;
    assert_eq!(events.last().unwrap()["data"]["reason"], "capacity");
    let agents = until_running(&mut client, 2).await;
    assert_eq!(agents["max"], 2);

    // Both running agents busy: a turn on the first session is refused, retriable.
    for session in [&second, &third] {
        let started = start_turn(&mut client, session, "hang").await;
        assert!(started.get("result").is_some(), "{started}");
    }
    let refused = start_turn(&mut client, &first, "deltas:1").await;
    let error = &refused["error"];
    assert_eq!(error["code"], "HOST_OVERLOADED", "{refused}");
    assert_eq!(error["retriable"], true, "{refused}");
    assert!(error["retryAfterMs"].as_u64().unwrap() > 0, "{refused}");
    assert_eq!(error["details"]["maxAgents"], 2, "{refused}");
}

#[tokio::test]
async fn turns_racing_idle_stops_all_complete() {
    let host = host(&["--agent-idle-ms", "15"]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let (session_id, cursor) = create_session(&mut client, &host).await;
    for round in 0..20u64 {
        // Land each turn at a different point around the idle stop.
        tokio::time::sleep(Duration::from_millis(round * 3 % 40)).await;
        let started = start_turn(&mut client, &session_id, "deltas:1").await;
        assert!(started.get("result").is_some(), "round {round}: {started}");
        let turn = until_turn_ends(&mut client, &session_id).await;
        assert_eq!(turn["state"], "completed", "round {round}: {turn}");
    }
    let finished = std::cell::Cell::new(0);
    let events = events_of(&host, &token, &session_id, &cursor, |e| {
        if e["type"] == "turn.finished" {
            finished.set(finished.get() + 1);
        }
        finished.get() == 20
    })
    .await;
    let stops = events
        .iter()
        .filter(|e| e["type"] == "session.agent_stopped")
        .count();
    assert!(stops > 0, "some turns came after an idle stop");
}

#[tokio::test]
async fn an_observer_never_starts_an_agent_and_unused_agents_stop_quietly() {
    let host = host(&["--max-agents", "2", "--agent-idle-ms", "100"]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let (_, observer_token) = host.pair_device("phone", &["--roles", "observer"]).await;
    let mut client = connect(&host, &token).await;
    let mut sessions = Vec::new();
    for _ in 0..3 {
        sessions.push(create_session(&mut client, &host).await);
    }
    // Started with their sessions (in the background: wait for each start, else one could
    // come during the rounds below and be taken for the observer's), never prompted, stopped
    // when idle.
    let deadline = Instant::now() + PATIENCE;
    while host.log().matches("agent started").count() < sessions.len() {
        assert!(Instant::now() < deadline, "the warm starts never came");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    until_running(&mut client, 0).await;

    let mut observer = connect(&host, &observer_token).await;
    for round in 0..30 {
        let (session_id, cursor) = &sessions[round % sessions.len()];
        let sub = observer
            .call(
                "session/subscribe",
                json!({"sessionId": session_id, "cursor": cursor}),
            )
            .await;
        let subscription_id = sub["result"]["subscriptionId"].clone();
        assert!(subscription_id.is_string(), "{sub}");
        let unsub = observer
            .call(
                "session/unsubscribe",
                json!({"subscriptionId": subscription_id}),
            )
            .await;
        assert!(unsub.get("result").is_some(), "{unsub}");
        assert_eq!(agents(&mut client).await["running"], 0, "round {round}");
    }
    assert!(host.agent_pids().is_empty());
    let starts = host.log().matches("agent started").count();
    assert_eq!(starts, sessions.len(), "only the warm starts ran an agent");

    // The log of each session, up to a turn of its own, holds no agent_stopped: neither the
    // capacity and idle stops of agents that never ran a turn nor anything the observer did.
    for (session_id, cursor) in &sessions {
        start_turn(&mut client, session_id, "deltas:1").await;
        let mut reader = connect(&host, &observer_token).await;
        let sub = reader
            .call(
                "session/subscribe",
                json!({"sessionId": session_id, "cursor": cursor}),
            )
            .await;
        assert!(sub.get("result").is_some(), "{sub}");
        let events = reader
            .events_until(PATIENCE, |e| e["type"] == "turn.finished")
            .await;
        let stops: Vec<_> = events
            .iter()
            .filter(|e| e["type"] == "session.agent_stopped")
            .collect();
        assert!(stops.is_empty(), "{stops:?}");
    }
}
