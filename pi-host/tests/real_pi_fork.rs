//! `session/fork` and `session/clone` end to end with the REAL pi agent, its session files on,
//! offline against the stub model (`tests::pi`): what each new session's history holds, what
//! its agent sends the model, that the source is unchanged, and that a branch survives a
//! kill -9 of the host (docs/protocol.md §7.31, §7.32).

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{Value, json};
use std::time::Duration;
use tests::pi::{Stub, pi_host_saving};
use tests::{Client, HostProcess};

/// How long any single wait may take: pi starts in about 2 s, but a loaded 2-core machine is slow.
const WAIT: Duration = Duration::from_secs(120);

async fn connect(host: &HostProcess, token: &str) -> Client {
    let mut client = Client::connect(&host.url(), token).await.unwrap();
    client.hello().await;
    client
}

async fn subscribe(client: &mut Client, session_id: &str, cursor: &Value) {
    let sub = client
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": cursor}),
        )
        .await;
    assert!(sub.get("result").is_some(), "{sub}");
}

/// Runs a turn to its end (completed); returns the first model request it made.
async fn run_turn(client: &mut Client, stub: &Stub, session_id: &str, text: &str) -> Value {
    let asked = stub.requests.lock().unwrap().len();
    let started = client
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": text, "text": text}),
        )
        .await;
    let turn_id = started["result"]["turnId"]
        .as_str()
        .unwrap_or_else(|| panic!("turn/start failed: {started}"))
        .to_string();
    let events = client
        .events_until(WAIT, |e| {
            e["type"] == "turn.finished" && e["turnId"] == turn_id.as_str()
        })
        .await;
    let finished = events.last().unwrap();
    assert_eq!(finished["data"]["outcome"], "completed", "{finished}");
    stub.requests.lock().unwrap()[asked].clone()
}

/// The texts of the user messages of a model request, in order.
fn user_texts(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| match &m["content"] {
            Value::String(text) => text.clone(),
            Value::Array(parts) => parts.iter().filter_map(|p| p["text"].as_str()).collect(),
            other => other.to_string(),
        })
        .collect()
}

/// A session's whole history (one page holds it here).
async fn history(client: &mut Client, session_id: &str) -> Vec<Value> {
    let page = client
        .call(
            "session/history",
            json!({"sessionId": session_id, "limit": 1000}),
        )
        .await;
    assert!(page["result"].get("earlier").is_none(), "{page}");
    page["result"]["entries"].as_array().unwrap().clone()
}

/// What an entry says, whatever its session: its type and data.
fn said(entries: &[Value]) -> Vec<(Value, Value)> {
    entries
        .iter()
        .map(|e| (e["type"].clone(), e["data"].clone()))
        .collect()
}

fn is_user(entry: &Value) -> bool {
    entry["type"] == "agent.message_end" && entry["data"]["message"]["role"] == "user"
}

/// The cursor before a session's first event: subscribing from it replays its whole log.
fn start_of(cursor: &Value) -> Value {
    let cursor = cursor.as_str().unwrap();
    json!(format!("{}-0", cursor.split('-').next().unwrap()))
}

#[tokio::test]
async fn forks_and_clones_are_sessions_of_their_own_that_continue_their_branch() {
    let stub = Stub::default();
    let (host, _pi_dir, agent) = pi_host_saving(&stub).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let created = client
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let a = created["result"]["session"]["sessionId"]
        .as_str()
        .unwrap()
        .to_string();
    subscribe(&mut client, &a, &created["result"]["session"]["cursor"]).await;
    run_turn(&mut client, &stub, &a, "First prompt.").await;
    let first_turn = history(&mut client, &a).await;
    run_turn(&mut client, &stub, &a, "Second prompt.").await;
    let a_history = history(&mut client, &a).await;
    let users: Vec<&Value> = a_history.iter().filter(|e| is_user(e)).collect();
    assert_eq!(users.len(), 2, "{a_history:?}");
    let second = users[1]["cursor"].clone();

    // Not at an entry that is not a user message, nor while a turn runs.
    let reply = a_history.iter().find(|e| !is_user(e)).unwrap();
    let refused = client
        .call(
            "session/fork",
            json!({"sessionId": a, "from": reply["cursor"]}),
        )
        .await;
    assert_eq!(refused["error"]["code"], "INVALID_PARAMS", "{refused}");
    stub.hold();
    let started = client
        .call(
            "turn/start",
            json!({"sessionId": a, "idempotencyKey": "held", "text": "Held prompt."}),
        )
        .await;
    let held = started["result"]["turnId"].as_str().unwrap().to_string();
    let busy = client
        .call("session/fork", json!({"sessionId": a, "from": second}))
        .await;
    assert_eq!(busy["error"]["code"], "AGENT_BUSY", "{busy}");
    let busy = client.call("session/clone", json!({"sessionId": a})).await;
    assert_eq!(busy["error"]["code"], "AGENT_BUSY", "{busy}");
    client
        .call("turn/abort", json!({"sessionId": a, "turnId": held}))
        .await;
    stub.release();
    client
        .events_until(WAIT, |e| {
            e["type"] == "turn.finished" && e["turnId"] == held.as_str()
        })
        .await;
    let a_history = history(&mut client, &a).await;

    // Fork A at its second prompt: B holds the first turn, and answers the prompt's text.
    let forked = client
        .call(
            "session/fork",
            json!({"sessionId": a, "from": second, "title": "Fork"}),
        )
        .await;
    assert_eq!(forked["result"]["text"], "Second prompt.", "{forked}");
    let b_info = forked["result"]["session"].clone();
    let b = b_info["sessionId"].as_str().unwrap().to_string();
    assert_ne!(b, a);
    assert_eq!(b_info["title"], "Fork");
    assert_eq!(
        b_info["workspace"],
        created["result"]["session"]["workspace"]
    );
    let b_history = history(&mut client, &b).await;
    assert_eq!(said(&b_history), said(&first_turn));
    assert!(b_history.iter().all(|e| e.get("turnId").is_none()));
    // Its log: where it came from, then the conversation it starts with.
    subscribe(&mut client, &b, &start_of(&b_info["cursor"])).await;
    let b_log = client
        .events_until(WAIT, |e| e["cursor"] == b_info["cursor"])
        .await;
    assert_eq!(b_log[0]["type"], "session.forked", "{b_log:?}");
    assert_eq!(b_log[0]["data"]["fromSessionId"], a.as_str());
    assert_eq!(b_log[0]["data"]["from"], second);
    assert_eq!(said(&b_log[1..]), said(&first_turn));
    let a_cursor = a_history.last().unwrap()["cursor"].as_str().unwrap();
    let b_cursor = b_info["cursor"].as_str().unwrap();
    assert_ne!(
        a_cursor.split('-').next(),
        b_cursor.split('-').next(),
        "each session has its own log"
    );

    let request = run_turn(&mut client, &stub, &b, "Third prompt.").await;
    assert_eq!(user_texts(&request), ["First prompt.", "Third prompt."]);

    // Forked at its first message, the branch starts empty, and so does its agent's session.
    let at_first = client
        .call(
            "session/fork",
            json!({"sessionId": a, "from": users[0]["cursor"]}),
        )
        .await;
    assert_eq!(at_first["result"]["text"], "First prompt.", "{at_first}");
    let d_info = at_first["result"]["session"].clone();
    let d = d_info["sessionId"].as_str().unwrap().to_string();
    assert!(history(&mut client, &d).await.is_empty());
    subscribe(&mut client, &d, &d_info["cursor"]).await;
    let request = run_turn(&mut client, &stub, &d, "Seventh prompt.").await;
    assert_eq!(user_texts(&request), ["Seventh prompt."]);

    // Clone A: C holds all of it, and its agent sends all of it.
    let cloned = client.call("session/clone", json!({"sessionId": a})).await;
    let c_info = cloned["result"]["session"].clone();
    let c = c_info["sessionId"].as_str().expect("clone").to_string();
    assert_eq!(said(&history(&mut client, &c).await), said(&a_history));
    subscribe(&mut client, &c, &c_info["cursor"]).await;
    assert_ne!(
        c_info["cursor"].as_str().unwrap().split('-').next(),
        a_cursor.split('-').next()
    );
    // Every prompt A's conversation holds (the aborted one too), then C's own.
    let a_prompts: Vec<String> = a_history
        .iter()
        .filter(|e| is_user(e))
        .map(|e| {
            e["data"]["message"]["content"][0]["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(a_prompts[..2], ["First prompt.", "Second prompt."]);
    let request = run_turn(&mut client, &stub, &c, "Fourth prompt.").await;
    assert_eq!(
        user_texts(&request),
        [&a_prompts[..], &["Fourth prompt.".to_string()]].concat()
    );

    // A is unchanged: its history, and its next turn's conversation.
    assert_eq!(history(&mut client, &a).await, a_history);
    let request = run_turn(&mut client, &stub, &a, "Fifth prompt.").await;
    assert_eq!(
        user_texts(&request),
        [&a_prompts[..], &["Fifth prompt.".to_string()]].concat()
    );

    // kill -9: B's agent resumes B's branch, not the copy of A's file it was made from.
    let b_dir = host.data_dir.path().join("agent-sessions").join(&b);
    let files: Vec<_> = std::fs::read_dir(&b_dir)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(
        files.len(),
        1,
        "only B's branch is left to resume: {files:?}"
    );
    drop(client);
    let host = host
        .restart(&["--agent", &agent, "--permission-mode", "auto"])
        .await;
    let mut client = connect(&host, &token).await;
    let got = client.call("session/get", json!({"sessionId": b})).await;
    subscribe(&mut client, &b, &got["result"]["cursor"]).await;
    let request = run_turn(&mut client, &stub, &b, "Sixth prompt.").await;
    assert_eq!(
        user_texts(&request),
        ["First prompt.", "Third prompt.", "Sixth prompt."]
    );
}
