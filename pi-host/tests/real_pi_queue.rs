//! Follow-ups, the agent's queue and compaction end to end with the REAL pi agent, offline
//! against the stub model (`tests::pi`). The stub holds its answers while a test needs a run to
//! keep going ([`Stub::hold`]), so a follow-up is queued while a turn runs, deterministically.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{Value, json};
use std::time::{Duration, Instant};
use tests::pi::{PNG, STUB_SUMMARY, Stub, pi_cli, pi_env, pi_host, pi_words, write_pi_config};
use tests::{Client, HostProcess};

/// How long any single wait may take: pi starts in about 2 s, but a loaded 2-core machine is slow.
const WAIT: Duration = Duration::from_secs(90);

async fn connect(host: &HostProcess, token: &str) -> Client {
    let mut client = Client::connect(&host.url(), token).await.unwrap();
    client.hello().await;
    client
}

/// Waits until the stub has received `n` requests.
async fn requests_reach(stub: &Stub, n: usize) {
    let began = Instant::now();
    while stub.requests.lock().unwrap().len() < n {
        assert!(
            began.elapsed() < WAIT,
            "the stub got no request #{n} in time"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn turn_finished(turn_id: &str) -> impl Fn(&Value) -> bool + '_ {
    move |e| e["type"] == "turn.finished" && e["turnId"] == turn_id
}

/// Starts a turn and waits for its end; returns its events.
async fn run_turn(client: &mut Client, session_id: &str, key: &str, text: &str) -> Vec<Value> {
    let started = client
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": key, "text": text}),
        )
        .await;
    let turn_id = started["result"]["turnId"]
        .as_str()
        .unwrap_or_else(|| panic!("turn/start failed: {started}"))
        .to_string();
    let events = client.events_until(WAIT, turn_finished(&turn_id)).await;
    let finished = events.last().unwrap();
    assert_eq!(finished["data"]["outcome"], "completed", "{finished}");
    events
}

/// The texts of the user messages of a request to the stub.
fn user_texts(request: &Value) -> Vec<String> {
    request["messages"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|m| m["role"] == "user")
        .map(|m| match &m["content"] {
            Value::String(text) => text.clone(),
            content => content.to_string(),
        })
        .collect()
}

async fn snapshot(client: &mut Client, session_id: &str) -> Value {
    let got = client
        .call("session/get", json!({"sessionId": session_id}))
        .await;
    got["result"]["snapshot"].clone()
}

/// Holds the stub's answers, starts a turn and waits for its first model request; returns the
/// turn's id.
async fn a_held_turn(stub: &Stub, client: &mut Client, session_id: &str) -> String {
    stub.hold();
    let first = client
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "k1", "text": "Run the check."}),
        )
        .await;
    let first_id = first["result"]["turnId"].as_str().unwrap().to_string();
    requests_reach(stub, 1).await;
    first_id
}

/// Queues a follow-up behind the running turn; returns its turn id.
async fn queue_follow_up(client: &mut Client, params: Value) -> String {
    let reply = client.call("turn/follow_up", params).await;
    assert_eq!(reply["result"]["queued"], true, "{reply}");
    reply["result"]["turnId"].as_str().unwrap().to_string()
}

/// [`a_held_turn`], then `texts` queued as follow-ups behind it (keys `f1`, `f2`, ...); returns
/// the turn's id and the follow-ups' turn ids.
async fn follow_ups_behind_a_held_turn(
    stub: &Stub,
    client: &mut Client,
    session_id: &str,
    texts: &[&str],
) -> (String, Vec<String>) {
    let first_id = a_held_turn(stub, client, session_id).await;
    let mut queued = Vec::new();
    for (i, text) in texts.iter().enumerate() {
        let key = format!("f{}", i + 1);
        let params = json!({"sessionId": session_id, "idempotencyKey": key, "text": text});
        queued.push(queue_follow_up(client, params).await);
    }
    (first_id, queued)
}

#[tokio::test]
async fn a_follow_up_queued_during_a_turn_runs_after_it_as_a_turn_of_its_own() {
    let stub = Stub::default();
    let (host, _pi_dir) = pi_host(&stub, None).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let session_id = client.open_session(&host.workspace("w")).await;

    let first_id = a_held_turn(&stub, &mut client, &session_id).await;
    // With a screenshot: held by the host until its turn, then sent with the prompt.
    let image = json!({"mimeType": "image/png", "data": PNG});
    let follow_up = json!({"sessionId": session_id, "idempotencyKey": "f1",
        "text": "Then say goodbye.", "images": [image]});
    let follow_id = queue_follow_up(&mut client, follow_up.clone()).await;
    assert_ne!(follow_id, first_id);
    let resent = client.call("turn/follow_up", follow_up).await;
    assert_eq!(
        resent["result"],
        json!({"turnId": follow_id, "queued": true}),
        "a resend queues nothing more"
    );
    let compact = client
        .call("session/compact", json!({"sessionId": session_id}))
        .await;
    assert_eq!(compact["error"]["code"], "AGENT_BUSY", "{compact}");

    // The queue, as the host holds it, in a snapshot and in one taken after the client
    // reconnects; pi holds nothing (the host sends it as the next prompt).
    let seen = client
        .events_until(WAIT, |e| {
            e["type"] == "turn.queued" && e["turnId"] == follow_id.as_str()
        })
        .await;
    let queued_event = &seen.last().unwrap()["data"];
    assert_eq!(queued_event["text"], "Then say goodbye.");
    let image_info = json!([{"mimeType": "image/png", "bytes": 70}]);
    assert_eq!(queued_event["images"], image_info, "named, not carried");
    let last_cursor = seen.last().unwrap()["cursor"].clone();
    let queued_texts = |snap: &Value| -> Vec<Value> {
        snap["queue"]["followUps"]
            .as_array()
            .map(|q| q.iter().map(|f| f["text"].clone()).collect())
            .unwrap_or_default()
    };
    let snap = snapshot(&mut client, &session_id).await;
    assert_eq!(queued_texts(&snap), [json!("Then say goodbye.")], "{snap}");
    assert_eq!(snap["queue"]["followUps"][0]["turnId"], follow_id.as_str());
    assert_eq!(snap["queue"]["steering"], json!([]), "{snap}");
    drop(client);
    let mut client = connect(&host, &token).await;
    let snap = snapshot(&mut client, &session_id).await;
    assert_eq!(queued_texts(&snap), [json!("Then say goodbye.")], "{snap}");
    assert_eq!(snap["turns"].as_array().unwrap().len(), 1, "{snap}");
    let sub = client
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": last_cursor}),
        )
        .await;
    assert!(sub.get("result").is_some(), "{sub}");

    stub.release();
    let events = client.events_until(WAIT, turn_finished(&follow_id)).await;
    let labels: Vec<String> = events
        .iter()
        .map(|e| format!("{} {}", e["type"].as_str().unwrap(), e["turnId"]))
        .collect();
    eprintln!("events: {labels:#?}");
    let first_end = events
        .iter()
        .position(|e| turn_finished(&first_id)(e))
        .expect("the first turn ends");
    assert_eq!(events[first_end]["data"]["outcome"], "completed");
    let started = &events[first_end + 1];
    assert_eq!(started["type"], "turn.started", "{started}");
    assert_eq!(started["turnId"], follow_id.as_str());
    assert_eq!(started["data"]["text"], "Then say goodbye.");
    assert_eq!(started["data"]["images"], image_info);
    let user_message = events
        .iter()
        .find(|e| {
            e["type"] == "agent.message_end"
                && e["data"]["message"]["role"] == "user"
                && e["data"]["message"]["content"][0]["text"] == "Then say goodbye."
        })
        .expect("the follow-up's user message");
    assert_eq!(user_message["turnId"], follow_id.as_str());
    // Each turn is one run of pi's: the first's `agent_end` ends it, the follow-up runs next.
    let agent_ends: Vec<&Value> = events
        .iter()
        .filter(|e| e["type"] == "agent.agent_end")
        .map(|e| &e["turnId"])
        .collect();
    assert_eq!(
        agent_ends,
        [&json!(first_id), &json!(follow_id)],
        "one run per turn"
    );
    assert_eq!(events.last().unwrap()["data"]["outcome"], "completed");

    // The stub got the follow-up as a later user message, after the first prompt's answer.
    let requests = stub.requests.lock().unwrap().clone();
    assert!(
        !user_texts(&requests[0])
            .iter()
            .any(|t| t.contains("goodbye"))
    );
    let later = requests
        .iter()
        .position(|r| user_texts(r).iter().any(|t| t.contains("goodbye")))
        .expect("a request with the follow-up");
    assert!(
        later >= 2,
        "after the first prompt's tool call was answered"
    );
    let with_follow_up = user_texts(&requests[later]);
    assert!(
        with_follow_up
            .last()
            .is_some_and(|t| t.contains("Then say goodbye.")),
        "the follow-up is the last user message: {with_follow_up:?}"
    );
    assert!(
        with_follow_up
            .last()
            .is_some_and(|t| t.contains(&format!("data:image/png;base64,{PNG}"))),
        "the image reached the model with the follow-up: {with_follow_up:?}"
    );

    let snap = snapshot(&mut client, &session_id).await;
    assert!(snap.get("queue").is_none(), "the queue is empty: {snap}");
    let turns: Vec<_> = snap["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| (t["text"].clone(), t["state"].clone()))
        .collect();
    assert_eq!(
        turns,
        [
            (json!("Run the check."), json!("completed")),
            (json!("Then say goodbye."), json!("completed"))
        ]
    );

    // While no turn runs, a follow-up is a turn at once.
    let now = client
        .call(
            "turn/follow_up",
            json!({"sessionId": session_id, "idempotencyKey": "f2", "text": "Once more."}),
        )
        .await;
    assert_eq!(now["result"]["queued"], false, "{now}");
    let now_id = now["result"]["turnId"].as_str().unwrap().to_string();
    let events = client.events_until(WAIT, turn_finished(&now_id)).await;
    assert_eq!(events.last().unwrap()["data"]["outcome"], "completed");
    assert!(
        events
            .iter()
            .any(|e| e["type"] == "turn.started" && e["data"]["text"] == "Once more.")
    );
}

#[tokio::test]
async fn compaction_shrinks_the_context_and_a_failed_one_says_why() {
    let stub = Stub::default();
    let (host, pi_dir) = pi_host(&stub, None).await;
    // Keep as little as pi can after a compaction, so that a short conversation shrinks.
    write_pi_config(pi_dir.path(), stub.port());
    let settings_file = pi_dir.path().join("settings.json");
    let mut settings: Value =
        serde_json::from_str(&std::fs::read_to_string(&settings_file).unwrap()).unwrap();
    settings["compaction"]["keepRecentTokens"] = json!(1);
    std::fs::write(&settings_file, settings.to_string()).unwrap();
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let session_id = client.open_session(&host.workspace("w")).await;

    for (key, text) in [
        ("k1", "Run the check."),
        ("k2", "Again."),
        ("k3", "Once more."),
    ] {
        run_turn(&mut client, &session_id, key, text).await;
    }
    let before = {
        let requests = stub.requests.lock().unwrap();
        requests.last().unwrap()["messages"]
            .as_array()
            .unwrap()
            .len()
    };

    let compacted = client
        .call(
            "session/compact",
            json!({"sessionId": session_id, "instructions": "Keep the commands."}),
        )
        .await;
    let result = &compacted["result"];
    assert!(
        result["summary"]
            .as_str()
            .unwrap_or("")
            .contains(STUB_SUMMARY),
        "{compacted}"
    );
    // pi estimates from the model's reported usage, which the stub does not send.
    assert!(result["tokensBefore"].is_u64(), "{compacted}");
    assert!(result["firstKeptEntryId"].is_string(), "{compacted}");
    let instructed = stub.requests.lock().unwrap().iter().any(|r| {
        let r = r.to_string();
        r.contains("context summarization assistant")
            && r.contains("Additional focus: Keep the commands.")
    });
    assert!(instructed, "the instructions reach the summary's request");
    let events = client
        .events_until(WAIT, |e| e["type"] == "agent.compaction_end")
        .await;
    assert!(events.iter().any(|e| e["type"] == "agent.compaction_start"));
    let end = events.last().unwrap();
    assert!(end.get("turnId").is_none());
    // The summary is part of the conversation: the history keeps the event as delivered.
    let history = client
        .call("session/history", json!({"sessionId": session_id}))
        .await;
    let entries = history["result"]["entries"].as_array().unwrap();
    assert!(entries.contains(end), "{history}");
    // Compacted just now: pi has nothing more to summarise.
    let again = client
        .call("session/compact", json!({"sessionId": session_id}))
        .await;
    assert_eq!(again["error"]["code"], "CONFLICT", "{again}");
    assert_eq!(again["error"]["retriable"], false, "{again}");

    let asked = stub.requests.lock().unwrap().len();
    run_turn(&mut client, &session_id, "k4", "And now?").await;
    let after = stub.requests.lock().unwrap()[asked].clone();
    let messages = after["messages"].as_array().unwrap();
    assert!(
        messages.len() < before,
        "{} messages after the compaction, {before} before: {after}",
        messages.len()
    );
    assert!(after.to_string().contains(STUB_SUMMARY), "{after}");

    // The summary's model request fails: the compaction fails with the provider's reason.
    *stub.failure.lock().unwrap() = Some("500");
    let failed = client
        .call("session/compact", json!({"sessionId": session_id}))
        .await;
    *stub.failure.lock().unwrap() = None;
    assert_eq!(failed["error"]["code"], "PROVIDER_ERROR", "{failed}");
    assert!(
        failed["error"]["message"]
            .as_str()
            .unwrap()
            .contains("ummarization failed: 500"),
        "{failed}"
    );
    let events = client
        .events_until(WAIT, |e| e["type"] == "agent.compaction_end")
        .await;
    let end = &events.last().unwrap()["data"];
    assert!(end["errorMessage"].is_string(), "{end}");
    // The session is usable afterwards.
    run_turn(&mut client, &session_id, "k5", "Still there?").await;
}

/// The queue modes set with `session/configure` before the session's agent runs: the agent
/// started for the turn takes the steering mode, and the host delivers both follow-ups together
/// (mode `all`) as one turn, the first one's.
#[tokio::test]
async fn queue_modes_set_for_a_session_reach_its_agent() {
    let stub = Stub::default();
    let (host, _pi_dir) = pi_host(&stub, None).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let session_id = client.open_session(&host.workspace("w")).await;
    let configured = client
        .call(
            "session/configure",
            json!({"sessionId": session_id, "steeringMode": "all", "followUpMode": "all"}),
        )
        .await;
    let info = &configured["result"]["session"];
    assert_eq!(info["followUpMode"], "all", "{configured}");
    assert_eq!(info["steeringMode"], "all", "{configured}");

    let texts = ["First extra.", "Second extra."];
    let (_, queued) = follow_ups_behind_a_held_turn(&stub, &mut client, &session_id, &texts).await;
    client
        .events_until(WAIT, |e| {
            e["type"] == "turn.queued" && e["turnId"] == queued[1].as_str()
        })
        .await;
    stub.release();
    let events = client.events_until(WAIT, turn_finished(&queued[0])).await;
    assert!(
        !events
            .iter()
            .any(|e| e["type"] == "turn.started" && e["turnId"] == queued[1].as_str()),
        "the second follow-up is part of the first one's turn"
    );
    let joined = events
        .iter()
        .find(|e| e["type"] == "turn.withdrawn" && e["turnId"] == queued[1].as_str())
        .expect("the second follow-up joined the first");
    assert_eq!(joined["data"]["reason"], "joined", "{joined}");
    assert_eq!(joined["data"]["joinedTurnId"], queued[0].as_str());
    let requests = stub.requests.lock().unwrap().clone();
    let first_with_extra = requests
        .iter()
        .find(|r| user_texts(r).iter().any(|t| t.contains("extra")))
        .expect("a request with the follow-ups");
    let texts = user_texts(first_with_extra).join(" ");
    assert!(
        texts.contains("First extra.") && texts.contains("Second extra."),
        "delivered together: {texts}"
    );
    let snap = snapshot(&mut client, &session_id).await;
    let turns: Vec<_> = snap["turns"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["text"].clone())
        .collect();
    assert_eq!(
        turns,
        [
            json!("Run the check."),
            json!("First extra.\n\nSecond extra.")
        ]
    );
}

/// A follow-up withdrawn before it runs never reaches the model; one left behind a turn that
/// is aborted is withdrawn with it, its text given back; the session goes on.
#[tokio::test]
async fn withdrawn_follow_ups_never_reach_the_model() {
    let stub = Stub::default();
    let (host, _pi_dir) = pi_host(&stub, None).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let session_id = client.open_session(&host.workspace("w")).await;

    let texts = ["Cleared extra.", "Left extra."];
    let (first_id, queued) =
        follow_ups_behind_a_held_turn(&stub, &mut client, &session_id, &texts).await;
    let cleared = client
        .call(
            "session/clear_queue",
            json!({"sessionId": session_id, "turnId": queued[0]}),
        )
        .await;
    assert_eq!(
        cleared["result"]["withdrawn"][0]["text"], "Cleared extra.",
        "{cleared}"
    );
    let aborted = client
        .call(
            "turn/abort",
            json!({"sessionId": session_id, "turnId": first_id}),
        )
        .await;
    assert!(aborted.get("result").is_some(), "{aborted}");
    stub.release();
    // The withdrawal is committed with the turn's end: read to the head after it.
    let mut events = client.events_until(WAIT, turn_finished(&first_id)).await;
    let end = events.last().unwrap().clone();
    let rest = client
        .events_to_head(&session_id, Some(&end["cursor"]))
        .await;
    events.extend(rest);
    assert_eq!(end["data"]["outcome"], "aborted", "{end}");
    let left = events
        .iter()
        .find(|e| e["type"] == "turn.withdrawn" && e["turnId"] == queued[1].as_str())
        .unwrap_or_else(|| panic!("the follow-up left behind is withdrawn: {events:#?}"));
    assert_eq!(left["data"]["reason"], "turn_ended", "{left}");
    assert_eq!(left["data"]["text"], "Left extra.");

    run_turn(&mut client, &session_id, "k2", "Still there?").await;
    let requests = stub.requests.lock().unwrap().clone();
    for request in &requests {
        let texts = user_texts(request).join(" ");
        assert!(
            !texts.contains("extra"),
            "a withdrawn follow-up ran: {texts}"
        );
    }
    assert!(
        user_texts(requests.last().unwrap())
            .iter()
            .any(|t| t.contains("Still there?"))
    );
    let snap = snapshot(&mut client, &session_id).await;
    assert!(snap.get("queue").is_none(), "the queue is empty: {snap}");
}

/// A follow-up sent while the conversation is being compacted waits for the compaction, as a
/// local pi keeps what is typed meanwhile, then runs on the compacted context.
#[tokio::test]
async fn a_follow_up_during_a_compaction_runs_after_it() {
    let stub = Stub::default();
    let (host, pi_dir) = pi_host(&stub, None).await;
    let settings_file = pi_dir.path().join("settings.json");
    let mut settings: Value =
        serde_json::from_str(&std::fs::read_to_string(&settings_file).unwrap()).unwrap();
    settings["compaction"]["keepRecentTokens"] = json!(1);
    std::fs::write(&settings_file, settings.to_string()).unwrap();
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let session_id = client.open_session(&host.workspace("w")).await;
    for (key, text) in [("k1", "Run the check."), ("k2", "Again.")] {
        run_turn(&mut client, &session_id, key, text).await;
    }

    let asked = stub.requests.lock().unwrap().len();
    stub.hold();
    let mut compactor = connect(&host, &token).await;
    let compact = json!({"sessionId": session_id});
    let compaction = tokio::spawn(async move { compactor.call("session/compact", compact).await });
    requests_reach(&stub, asked + 1).await;
    let params =
        json!({"sessionId": session_id, "idempotencyKey": "f1", "text": "After the summary."});
    let follow_id = queue_follow_up(&mut client, params).await;
    stub.release();
    let compacted = compaction.await.unwrap();
    assert!(compacted.get("result").is_some(), "{compacted}");
    let events = client.events_until(WAIT, turn_finished(&follow_id)).await;
    let labels: Vec<&str> = events.iter().map(|e| e["type"].as_str().unwrap()).collect();
    let compacted_at = labels
        .iter()
        .position(|l| *l == "agent.compaction_end")
        .expect("the compaction's end");
    let started_at = labels
        .iter()
        .position(|l| *l == "turn.started")
        .expect("the follow-up's start");
    assert!(compacted_at < started_at, "{labels:?}");
    assert_eq!(events.last().unwrap()["data"]["outcome"], "completed");
    let requests = stub.requests.lock().unwrap().clone();
    let last = requests.last().unwrap().to_string();
    assert!(last.contains("After the summary."), "{last}");
    assert!(
        last.contains(STUB_SUMMARY),
        "it ran on the compacted context: {last}"
    );
}

/// pi run directly in RPC mode (no pi-host), to compare pi-host's answers with pi's own.
struct DirectPi {
    child: tokio::process::Child,
    stdin: tokio::process::ChildStdin,
    lines: tokio::io::Lines<tokio::io::BufReader<tokio::process::ChildStdout>>,
    next_id: u64,
}

impl DirectPi {
    fn start(pi_dir: &std::path::Path, workspace: &std::path::Path) -> DirectPi {
        let words = pi_words(&pi_cli(), None);
        let mut child = tokio::process::Command::new(&words[0])
            .args(&words[1..])
            .envs(pi_env(pi_dir))
            .current_dir(workspace)
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        let stdin = child.stdin.take().unwrap();
        let stdout = child.stdout.take().unwrap();
        use tokio::io::AsyncBufReadExt;
        let lines = tokio::io::BufReader::new(stdout).lines();
        DirectPi {
            child,
            stdin,
            lines,
            next_id: 0,
        }
    }

    /// The next line pi writes that satisfies `done`.
    async fn until(&mut self, done: impl Fn(&Value) -> bool) -> Value {
        let read = async {
            while let Some(line) = self.lines.next_line().await.unwrap() {
                let value: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
                if done(&value) {
                    return value;
                }
            }
            panic!("pi exited: {:?}", self.child.try_wait());
        };
        tokio::time::timeout(WAIT, read)
            .await
            .expect("pi answered in time")
    }

    /// Sends a command; returns pi's response to it.
    async fn call(&mut self, mut command: Value) -> Value {
        use tokio::io::AsyncWriteExt;
        self.next_id += 1;
        let id = format!("direct-{}", self.next_id);
        command["id"] = json!(id);
        let line = format!("{command}\n");
        self.stdin.write_all(line.as_bytes()).await.unwrap();
        self.until(|v| v["type"] == "response" && v["id"] == id.as_str())
            .await
    }

    /// A prompt and its run, to `agent_end`; a prompt pi refuses while it winds the last run
    /// down is sent again.
    async fn run(&mut self, text: &str) {
        let began = Instant::now();
        loop {
            let reply = self.call(json!({"type": "prompt", "message": text})).await;
            if reply["success"] == true {
                break;
            }
            assert!(began.elapsed() < WAIT, "pi refused the prompt: {reply}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        self.until(|v| v["type"] == "agent_end").await;
    }
}

/// After a compaction the session's totals (the whole history) and what pi's context holds
/// differ: `session/stats` gives both, the second exactly as pi's own `get_session_stats`
/// answers it, checked against a pi run directly through the same conversation.
#[tokio::test]
async fn stats_after_a_compaction_give_the_session_and_the_context_as_pi_counts_it() {
    let stub = Stub::default();
    let (host, pi_dir) = pi_host(&stub, None).await;
    write_pi_config(pi_dir.path(), stub.port());
    let settings_file = pi_dir.path().join("settings.json");
    let mut settings: Value =
        serde_json::from_str(&std::fs::read_to_string(&settings_file).unwrap()).unwrap();
    settings["compaction"]["keepRecentTokens"] = json!(1);
    std::fs::write(&settings_file, settings.to_string()).unwrap();
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let session_id = client.open_session(&host.workspace("w")).await;
    let texts = ["Run the check.", "Again.", "Once more."];
    for (i, text) in texts.iter().enumerate() {
        run_turn(&mut client, &session_id, &format!("k{i}"), text).await;
    }
    let compacted = client
        .call("session/compact", json!({"sessionId": session_id}))
        .await;
    assert!(compacted.get("result").is_some(), "{compacted}");
    run_turn(&mut client, &session_id, "k9", "And now?").await;
    let stats = client
        .call("session/stats", json!({"sessionId": session_id}))
        .await;
    let stats = &stats["result"];

    let workspace = tempfile::tempdir().unwrap();
    let mut pi = DirectPi::start(pi_dir.path(), workspace.path());
    for text in texts {
        pi.run(text).await;
    }
    let direct_compact = pi.call(json!({"type": "compact"})).await;
    assert_eq!(direct_compact["success"], true, "{direct_compact}");
    pi.run("And now?").await;
    let own = pi.call(json!({"type": "get_session_stats"})).await;
    let own = &own["data"];

    let context = &stats["context"];
    for key in [
        "userMessages",
        "assistantMessages",
        "toolCalls",
        "toolResults",
        "totalMessages",
    ] {
        assert_eq!(context[key], own[key], "{key}: {stats} against pi's {own}");
    }
    for key in ["input", "output", "cacheRead", "cacheWrite", "total"] {
        assert_eq!(context["tokens"][key], own["tokens"][key], "{key}: {stats}");
    }
    let cost = |v: &Value| v["cost"].as_f64().unwrap();
    assert!((cost(context) - cost(own)).abs() < 1e-9, "{stats} {own}");
    // The whole session: four prompts, each with a tool call, its result and two replies.
    let whole = [
        "userMessages",
        "assistantMessages",
        "toolCalls",
        "toolResults",
    ]
    .map(|k| stats[k].as_u64().unwrap());
    assert_eq!(whole, [4, 8, 4, 4], "{stats}");
    assert!(
        context["userMessages"].as_u64().unwrap() < 4,
        "the compaction took messages out of the context: {stats}"
    );
    assert!(
        stats["tokens"]["total"].as_u64() > context["tokens"]["total"].as_u64(),
        "{stats}"
    );
}
