//! Models and provider credentials from a client (docs/protocol.md §7.19-§7.22), with the REAL
//! pi agent talking to the stub model server (`tests::pi`), which records every request and its
//! `Authorization` header: a key set from a client reaches the provider and nothing else; the
//! catalogue shows which providers have a key; a session's model and thinking level reach the
//! request; a missing key or model is refused before a turn is spent. The role checks run
//! against the stand-in agent.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{Value, json};
use std::path::Path;
use std::time::Duration;
use tests::pi::{Stub, pi_host};
use tests::{Client, HostProcess};

const WAIT: Duration = Duration::from_secs(90);

async fn connect(host: &HostProcess, token: &str) -> Client {
    let mut client = Client::connect(&host.url(), token).await.unwrap();
    client.hello().await;
    client
}

fn result(reply: &Value) -> &Value {
    reply
        .get("result")
        .unwrap_or_else(|| panic!("the call failed: {reply}"))
}

fn code(reply: &Value) -> &str {
    reply["error"]["code"]
        .as_str()
        .unwrap_or_else(|| panic!("the call did not fail: {reply}"))
}

/// The stub, added from the client as a model server that wants a key.
fn desk_provider(stub_port: u16) -> Value {
    json!({
        "provider": "desk",
        "baseUrl": format!("http://127.0.0.1:{stub_port}/v1"),
        "api": "openai-completions",
        "requiresKey": true,
        "models": [
            {"id": "desk-model", "name": "Desk", "reasoning": true, "contextWindow": 64000},
            {"id": "desk-model-2", "maxTokens": 2048}
        ]
    })
}

fn provider_of<'a>(list: &'a Value, name: &str) -> &'a Value {
    list["providers"]
        .as_array()
        .unwrap()
        .iter()
        .find(|p| p["provider"] == name)
        .unwrap_or_else(|| panic!("no provider {name} in {list}"))
}

async fn run_turn(client: &mut Client, session_id: &str, key: &str, text: &str) -> Value {
    let started = client
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": key, "text": text}),
        )
        .await;
    let turn_id = result(&started)["turnId"].clone();
    let events = client
        .events_until(WAIT, |e| {
            e["type"] == "turn.finished" && e["turnId"] == turn_id
        })
        .await;
    events.last().unwrap()["data"].clone()
}

/// Every file under `dir` whose bytes hold `needle`, but `except`.
fn files_holding(dir: &Path, needle: &str, except: &Path) -> Vec<String> {
    let mut found = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).unwrap().flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else if path != except
                && std::fs::read(&path)
                    .is_ok_and(|bytes| bytes.windows(needle.len()).any(|w| w == needle.as_bytes()))
            {
                found.push(path.display().to_string());
            }
        }
    }
    found
}

#[tokio::test]
async fn a_key_set_from_a_client_reaches_the_provider_and_nowhere_else() {
    let stub = Stub::default();
    let (host, _pi_dir) = pi_host(&stub, None).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let workspace = host.workspace("w");

    // The stub as a model server the owner adds; it wants a key nobody has set yet.
    let port = stub.port();
    result(&client.call("provider/set", desk_provider(port)).await);
    let list = client.call("model/list", json!({})).await;
    let list = result(&list);
    let desk = provider_of(list, "desk");
    assert_eq!(desk["credential"], false, "{desk}");
    assert_eq!(desk["custom"], true, "{desk}");
    assert_eq!(
        provider_of(list, "stub")["credentialSource"],
        "agent",
        "{list}"
    );
    let model = list["models"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["provider"] == "desk" && m["id"] == "desk-model")
        .unwrap_or_else(|| panic!("no desk-model in {list}"));
    assert_eq!(model["reasoning"], true);
    assert_eq!(model["contextWindow"], 64000);
    assert_eq!(model["credential"], false);
    assert_eq!(
        list["defaultModel"],
        json!({"provider": "stub", "id": "stub-model"})
    );

    // Refused before anything runs: no key, and a model the agent does not know.
    let desk_model = json!({"provider": "desk", "id": "desk-model"});
    let refused = client
        .call(
            "session/create",
            json!({"workspace": workspace, "model": desk_model}),
        )
        .await;
    assert_eq!(code(&refused), "PROVIDER_SECRET_MISSING", "{refused}");
    assert!(
        refused["error"]["message"]
            .as_str()
            .unwrap()
            .contains("credential/set")
    );
    let unknown = client
        .call(
            "session/create",
            json!({"workspace": workspace, "model": {"provider": "desk", "id": "nope"}}),
        )
        .await;
    assert_eq!(code(&unknown), "MODEL_NOT_CONFIGURED", "{unknown}");
    assert_eq!(
        unknown["error"]["details"]["providerModels"],
        json!(["desk-model", "desk-model-2"])
    );
    assert!(
        stub.requests.lock().unwrap().is_empty(),
        "nothing reached the provider"
    );

    // The key: set once, listed by fingerprint only.
    let key = format!("sk-desk-{}", std::process::id()) + "-4f9c2a7d1e8b3c6a";
    let set = client
        .call("credential/set", json!({"provider": "desk", "apiKey": key}))
        .await;
    let fingerprint = result(&set)["credential"]["fingerprint"].clone();
    assert!(fingerprint.as_str().unwrap().starts_with("sha256:"));
    let listed = client.call("credential/list", json!({})).await;
    assert_eq!(
        result(&listed)["credentials"][0]["fingerprint"],
        fingerprint
    );
    let list = client.call("model/list", json!({})).await;
    let desk = provider_of(result(&list), "desk");
    assert_eq!(desk["credential"], true, "{desk}");
    assert_eq!(desk["credentialSource"], "host", "{desk}");

    // A session on it: the key reaches the provider, with the model and thinking level.
    let created = client
        .call(
            "session/create",
            json!({"workspace": workspace, "model": desk_model, "thinkingLevel": "high"}),
        )
        .await;
    let session = &result(&created)["session"];
    assert_eq!(session["model"], desk_model);
    assert_eq!(session["thinkingLevel"], "high");
    let session_id = session["sessionId"].as_str().unwrap().to_string();
    let sub = client
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": session["cursor"]}),
        )
        .await;
    result(&sub);
    let finished = run_turn(&mut client, &session_id, "k1", "LONG-REPLY:3").await;
    assert_eq!(finished["outcome"], "completed", "{finished}");
    {
        let requests = stub.requests.lock().unwrap();
        let last = requests.last().unwrap();
        assert_eq!(last["model"], "desk-model", "{last}");
        assert_eq!(last["reasoning_effort"], "high", "{last}");
        let auth = stub.authorizations.lock().unwrap();
        assert_eq!(
            auth.last().unwrap().as_deref(),
            Some(format!("Bearer {key}").as_str())
        );
    }

    // Another model and thinking level between turns: the next request carries them.
    let configured = client
        .call(
            "session/configure",
            json!({"sessionId": session_id, "model": {"provider": "desk", "id": "desk-model-2"},
                   "thinkingLevel": "low"}),
        )
        .await;
    assert_eq!(
        result(&configured)["session"]["model"]["id"],
        "desk-model-2"
    );
    let configured_event = client
        .events_until(WAIT, |e| e["type"] == "session.configured")
        .await;
    let data = &configured_event.last().unwrap()["data"];
    assert_eq!(data["settings"]["thinkingLevel"], "low", "{data}");
    assert_eq!(data["settings"]["model"]["id"], "desk-model-2", "{data}");
    let finished = run_turn(&mut client, &session_id, "k2", "LONG-REPLY:2").await;
    assert_eq!(finished["outcome"], "completed", "{finished}");
    let last = stub.requests.lock().unwrap().last().unwrap().clone();
    assert_eq!(last["model"], "desk-model-2", "{last}");
    // desk-model-2 does not reason: pi sends no effort for it.
    assert!(last.get("reasoning_effort").is_none(), "{last}");

    // The key exists in the credential file only: not in the store, pi's session files, any
    // other file of the data directory, or the host's log.
    let credentials = host.data_dir.path().join("credentials.json");
    let holding = files_holding(host.data_dir.path(), &key, &credentials);
    assert!(holding.is_empty(), "the key is in {holding:?}");
    assert!(!host.log().contains(&key), "the key is in the host's log");
    let mode = std::fs::metadata(&credentials).unwrap();
    assert_eq!(
        std::os::unix::fs::PermissionsExt::mode(&mode.permissions()) & 0o777,
        0o600
    );

    // Deleted: the next turn is refused before it is recorded, and nothing reaches the stub.
    let deleted = client
        .call("credential/delete", json!({"provider": "desk"}))
        .await;
    assert_eq!(result(&deleted)["deleted"], true);
    let before = stub.requests.lock().unwrap().len();
    let refused = client
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "k3", "text": "hello"}),
        )
        .await;
    assert_eq!(code(&refused), "PROVIDER_SECRET_MISSING", "{refused}");
    assert_eq!(stub.requests.lock().unwrap().len(), before);
    let got = client
        .call("session/get", json!({"sessionId": session_id}))
        .await;
    assert_eq!(
        result(&got)["snapshot"]["turns"].as_array().unwrap().len(),
        2
    );
}

/// A key with no shape a redaction could know, set from a client: the provider refuses it and
/// quotes it back (`tests::pi::ECHO_KEY`), so pi's `errorMessage` holds it; the host scrubs
/// its exact value from every event (an observer's too), the reply, the log and every file but
/// `credentials.json`.
#[tokio::test]
async fn a_key_the_provider_echoes_reaches_no_event_log_or_file() {
    let stub = Stub::default();
    *stub.failure.lock().unwrap() = Some(tests::pi::ECHO_KEY);
    let (host, _pi_dir) = pi_host(&stub, None).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let (_, watcher) = host.pair_device("watcher", &["--roles", "observer"]).await;
    let mut client = connect(&host, &token).await;
    result(
        &client
            .call("provider/set", desk_provider(stub.port()))
            .await,
    );
    let key = format!("desk.{}.Q7vTxLmRbNwPz", std::process::id());
    let set = client
        .call("credential/set", json!({"provider": "desk", "apiKey": key}))
        .await;
    result(&set);
    let created = client
        .call(
            "session/create",
            json!({"workspace": host.workspace("w"),
                   "model": {"provider": "desk", "id": "desk-model"}}),
        )
        .await;
    let session = result(&created)["session"].clone();
    let session_id = session["sessionId"].as_str().unwrap().to_string();
    let subscribe = json!({"sessionId": session_id, "cursor": session["cursor"]});
    result(&client.call("session/subscribe", subscribe.clone()).await);
    let mut observer = connect(&host, &watcher).await;
    result(&observer.call("session/subscribe", subscribe).await);

    let started = client
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "e1", "text": "hello"}),
        )
        .await;
    let turn_id = result(&started)["turnId"].clone();
    let finished = |e: &Value| e["type"] == "turn.finished" && e["turnId"] == turn_id;
    let events = client.events_until(WAIT, finished).await;
    let seen = observer.events_until(WAIT, finished).await;

    // The provider did get the key and quote it, so the test can fail.
    assert_eq!(
        stub.authorizations
            .lock()
            .unwrap()
            .last()
            .cloned()
            .flatten(),
        Some(format!("Bearer {key}"))
    );
    let error = &events.last().unwrap()["data"]["error"];
    assert_eq!(error["code"], "PROVIDER_UNAUTHORIZED", "{error}");
    let shown = error["details"]["providerMessage"].as_str().unwrap();
    assert!(shown.contains("provided: [redacted]."), "{shown}");
    let agent_events: Vec<_> = events
        .iter()
        .filter(|e| e["type"].as_str().is_some_and(|t| t.starts_with("agent.")))
        .collect();
    assert!(
        agent_events.iter().any(|e| e
            .to_string()
            .contains("Incorrect API key provided: [redacted]")),
        "pi's errorMessage is relayed, redacted: {agent_events:#?}"
    );
    for event in events.iter().chain(&seen) {
        assert!(!event.to_string().contains(&key), "the key is in {event}");
    }
    let got = client
        .call("session/get", json!({"sessionId": session_id}))
        .await;
    assert!(!got.to_string().contains(&key), "the key is in {got}");

    let credentials = host.data_dir.path().join("credentials.json");
    let holding = files_holding(host.data_dir.path(), &key, &credentials);
    assert!(holding.is_empty(), "the key is in {holding:?}");
    assert!(
        files_holding(host.data_dir.path(), &key, Path::new(""))
            .contains(&credentials.display().to_string()),
        "the key is kept where it belongs"
    );
    assert!(!host.log().contains(&key), "the key is in the host's log");
}

// ---------------------------------------------------------------------------------------------
// With the stand-in agent: roles, the stored settings, and what the agent is told.

async fn stand_in_host() -> HostProcess {
    HostProcess::start_with(Path::new(env!("CARGO_BIN_EXE_pi-host")), &stand_in_args()).await
}

fn stand_in_args() -> [&'static str; 2] {
    let agent = tests::stand_in_agent().to_str().unwrap().to_string();
    ["--agent", Box::leak(agent.into_boxed_str())]
}

#[tokio::test]
async fn credentials_are_for_owners_and_settings_for_operators() {
    let host = stand_in_host().await;
    let (_, owner) = host.pair_device("owner", &[]).await;
    let (_, operator) = host.pair_device("op", &["--roles", "operator"]).await;
    let (_, observer) = host.pair_device("obs", &["--roles", "observer"]).await;
    let mut owner = connect(&host, &owner).await;
    let created = owner
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let session_id = result(&created)["session"]["sessionId"].clone();
    let owner_only = [
        (
            "credential/set",
            json!({"provider": "openai", "apiKey": "sk-abcdefghijklmnop"}),
        ),
        ("credential/list", json!({})),
        ("credential/delete", json!({"provider": "openai"})),
        (
            "provider/set",
            json!({"provider": "x", "baseUrl": "http://127.0.0.1:1/v1",
                   "api": "openai-completions", "models": [{"id": "m"}]}),
        ),
        ("provider/delete", json!({"provider": "x"})),
    ];
    for token in [&operator, &observer] {
        let mut client = connect(&host, token).await;
        for (method, params) in &owner_only {
            let reply = client.call(method, params.clone()).await;
            assert_eq!(code(&reply), "FORBIDDEN", "{method}: {reply}");
        }
    }
    let mut client = connect(&host, &observer).await;
    let reply = client
        .call(
            "session/configure",
            json!({"sessionId": session_id, "thinkingLevel": "high"}),
        )
        .await;
    assert_eq!(code(&reply), "FORBIDDEN", "{reply}");
    let mut client = connect(&host, &operator).await;
    let reply = client
        .call(
            "session/configure",
            json!({"sessionId": session_id, "thinkingLevel": "high"}),
        )
        .await;
    assert_eq!(result(&reply)["session"]["thinkingLevel"], "high");
    for (method, params) in &owner_only {
        let reply = owner.call(method, params.clone()).await;
        result(&reply);
    }
}

/// The stand-in's report of what it runs with (its `whoami` directive).
async fn whoami(client: &mut Client, session_id: &str, key: &str) -> Value {
    let started = client
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": key, "text": "whoami"}),
        )
        .await;
    result(&started);
    let events = client
        .events_until(WAIT, |e| e["type"] == "agent.stand_in_whoami")
        .await;
    let report = events.last().unwrap()["data"].clone();
    client
        .events_until(WAIT, |e| e["type"] == "turn.finished")
        .await;
    report
}

#[tokio::test]
async fn a_sessions_settings_reach_each_of_its_agents_and_survive_a_restart() {
    let host = stand_in_host().await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let created = client
        .call(
            "session/create",
            json!({"workspace": host.workspace("w"), "thinkingLevel": "medium",
                   "model": {"provider": "stand-in", "id": "stand-in-model-2"}}),
        )
        .await;
    let code_of_create = created["error"]["code"].clone();
    // The stand-in does not list models the way pi's extension does: a model is refused
    // there, and the settings without one are taken.
    assert_eq!(code_of_create, "CAPABILITY_UNAVAILABLE", "{created}");
    let created = client
        .call(
            "session/create",
            json!({"workspace": host.workspace("w"), "thinkingLevel": "medium"}),
        )
        .await;
    let session = result(&created)["session"].clone();
    let session_id = session["sessionId"].as_str().unwrap().to_string();
    let first_cursor = session["cursor"].clone();
    result(
        &client
            .call(
                "session/subscribe",
                json!({"sessionId": session_id, "cursor": first_cursor}),
            )
            .await,
    );
    let report = whoami(&mut client, &session_id, "k1").await;
    assert_eq!(report["thinkingLevel"], "medium", "{report}");
    assert_eq!(report["autoCompaction"], false, "{report}");
    // Changed while the agent runs: it takes the change at once.
    let reply = client
        .call(
            "session/configure",
            json!({"sessionId": session_id, "autoCompaction": true}),
        )
        .await;
    assert_eq!(result(&reply)["session"]["autoCompaction"], true);
    assert_eq!(result(&reply)["session"]["thinkingLevel"], "medium");
    // The same again changes nothing.
    result(
        &client
            .call(
                "session/configure",
                json!({"sessionId": session_id, "autoCompaction": true}),
            )
            .await,
    );
    let report = whoami(&mut client, &session_id, "k2").await;
    assert_eq!(report["autoCompaction"], true, "{report}");
    drop(client);

    // After a restart the stored settings come back, and the new agent starts with them.
    let host = host.restart(&stand_in_args()).await;
    let mut client = connect(&host, &token).await;
    let got = client
        .call("session/get", json!({"sessionId": session_id}))
        .await;
    let got = result(&got);
    assert_eq!(got["session"]["thinkingLevel"], "medium", "{got}");
    assert_eq!(got["session"]["autoCompaction"], true, "{got}");
    result(
        &client
            .call(
                "session/subscribe",
                json!({"sessionId": session_id, "cursor": got["cursor"]}),
            )
            .await,
    );
    let report = whoami(&mut client, &session_id, "k3").await;
    assert_eq!(report["thinkingLevel"], "medium", "{report}");
    assert_eq!(report["autoCompaction"], true, "{report}");
    let sent = client
        .call("session/get", json!({"sessionId": session_id}))
        .await;
    let head = result(&sent)["cursor"].clone();
    // One session.configured in the whole log: the repeat recorded nothing.
    let mut replay = connect(&host, &token).await;
    result(
        &replay
            .call(
                "session/subscribe",
                json!({"sessionId": session_id, "cursor": first_cursor}),
            )
            .await,
    );
    let events = replay.events_until(WAIT, |e| e["cursor"] == head).await;
    let configured: Vec<_> = events
        .iter()
        .filter(|e| e["type"] == "session.configured")
        .collect();
    assert_eq!(configured.len(), 1, "{configured:?}");
    assert_eq!(configured[0]["data"]["settings"]["autoCompaction"], true);
}
