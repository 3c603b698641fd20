//! One turn end to end with the REAL pi agent (`@mariozechner/pi-coding-agent`, installed by
//! `npm ci --prefix tests/pi`), fully offline: pi talks to a stub OpenAI-compatible model server
//! (`tests::pi`), which asks for one `bash` tool call and then answers with text. The extension
//! `tests/pi/confirm-tools.ts` makes pi ask for every tool call, which the host turns into an
//! RACP-WS approval; the client drops its connection while the approval is pending, reconnects,
//! resumes from its last cursor and allows it.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tests::pi::{
    PNG, Stub, fixture_dir, pi_cli, pi_config, pi_env, pi_host, pi_host_with, pi_words, start_stub,
};
use tests::{Client, HostProcess};

/// How long any single wait may take: pi starts in about 2 s, but a loaded 2-core machine is slow.
const WAIT: Duration = Duration::from_secs(60);

// ---------------------------------------------------------------------------------------------
// RACP-WS helpers.

async fn connect(host: &HostProcess, token: &str) -> Client {
    let mut client = Client::connect(&host.url(), token).await.unwrap();
    client.hello().await;
    client
}

async fn events_until(client: &mut Client, done: impl Fn(&Value) -> bool) -> Vec<Value> {
    client.events_until(WAIT, done).await
}

/// A short name per event: its type, and for `agent.message_update` the assistant event's type.
fn label(event: &Value) -> String {
    let kind = event["type"].as_str().unwrap_or("?");
    match event["data"]["assistantMessageEvent"]["type"].as_str() {
        Some(inner) if kind == "agent.message_update" => format!("{kind}:{inner}"),
        _ => kind.to_string(),
    }
}

/// The index of the first event at or after `from` whose label satisfies `is`.
fn find(labels: &[String], from: usize, what: &str, is: impl Fn(&str) -> bool) -> usize {
    labels[from..]
        .iter()
        .position(|l| is(l))
        .map(|i| from + i)
        .unwrap_or_else(|| panic!("no {what} after index {from} in {labels:#?}"))
}

#[tokio::test]
async fn a_real_pi_turn_with_a_tool_call_an_approval_and_a_reconnect() {
    let began = Instant::now();
    let extension = fixture_dir()
        .join("confirm-tools.ts")
        .canonicalize()
        .expect("tests/pi/confirm-tools.ts");
    let stub = Stub::default();
    let (host, _pi_dir) = pi_host(&stub, Some(&extension)).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let created = client
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let session = &created["result"]["session"];
    let session_id = session["sessionId"]
        .as_str()
        .expect("sessionId")
        .to_string();
    let sub = client
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": session["cursor"]}),
        )
        .await;
    assert!(sub.get("result").is_some(), "{sub}");
    let turn = client
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "k1", "text": "Run the check."}),
        )
        .await;
    let turn_id = turn["result"]["turnId"]
        .as_str()
        .unwrap_or_else(|| panic!("turn/start failed: {turn}"))
        .to_string();

    // Up to the approval on the first connection, then drop it while the approval is pending.
    let mut seen = events_until(&mut client, |e| e["type"] == "approval.requested").await;
    let requested = seen.last().unwrap().clone();
    let approval_id = requested["data"]["approvalId"].clone();
    assert_eq!(requested["data"]["kind"], "confirm", "{requested}");
    assert_eq!(requested["data"]["title"], "Allow bash?", "{requested}");
    assert!(
        requested["data"]["message"]
            .as_str()
            .is_some_and(|m| m.contains("echo real-pi-ok")),
        "{requested}"
    );
    let last_cursor = requested["cursor"].clone();
    drop(client);

    // A new connection with the same device token resumes exactly after the last event seen.
    let mut client = connect(&host, &token).await;
    let sub = client
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": last_cursor}),
        )
        .await;
    assert_eq!(sub["result"]["cursor"], last_cursor, "{sub}");
    let answer = client
        .call(
            "approval/respond",
            json!({"approvalId": approval_id, "decision": "allow"}),
        )
        .await;
    assert_eq!(answer["result"]["approval"]["state"], "allowed", "{answer}");
    seen.extend(events_until(&mut client, |e| e["type"] == "turn.finished").await);

    // Contiguous across both connections: no gap, no duplicate, all of this turn.
    for (i, event) in seen.iter().enumerate() {
        assert_eq!(event["seq"], 1 + i as u64, "gap or duplicate at index {i}");
        assert_eq!(event["turnId"], turn_id.as_str(), "{event}");
    }

    let labels: Vec<String> = seen.iter().map(label).collect();
    eprintln!("events: {labels:#?}");
    assert_eq!(labels[0], "turn.started");
    assert_eq!(seen[0]["data"]["text"], "Run the check.");
    let agent_start = find(&labels, 1, "agent_start", |l| l == "agent.agent_start");
    let text = find(&labels, agent_start, "text delta", |l| {
        l == "agent.message_update:text_delta"
    });
    let toolcall = find(&labels, text, "tool call update", |l| {
        l.starts_with("agent.message_update:toolcall_")
    });
    let toolcall_end = find(&labels, toolcall, "toolcall_end", |l| {
        l == "agent.message_update:toolcall_end"
    });
    // The tool call as rebuilt from the compact updates (docs/protocol.md §8.1).
    let mut stream = racp_proto::pi::stream::StreamState::default();
    for event in &seen[..=toolcall_end] {
        stream.apply(event["type"].as_str().unwrap(), &event["data"]);
    }
    let index = seen[toolcall_end]["data"]["assistantMessageEvent"]["contentIndex"]
        .as_u64()
        .unwrap() as usize;
    let tool_call = &stream.message().expect("the message in progress")["content"][index];
    assert_eq!(tool_call["name"], "bash", "{tool_call}");
    assert_eq!(
        tool_call["arguments"]["command"], "echo real-pi-ok",
        "{tool_call}"
    );
    let exec_start = find(&labels, toolcall_end, "tool_execution_start", |l| {
        l == "agent.tool_execution_start"
    });
    let requested_at = find(&labels, exec_start, "approval.requested", |l| {
        l == "approval.requested"
    });
    let settled_at = find(&labels, requested_at, "approval.settled", |l| {
        l == "approval.settled"
    });
    let settled = &seen[settled_at]["data"];
    assert_eq!(settled["approvalId"], approval_id);
    assert_eq!(settled["outcome"], "allowed", "{settled}");
    let exec_end = find(&labels, settled_at, "tool_execution_end", |l| {
        l == "agent.tool_execution_end"
    });
    let tool_end = &seen[exec_end]["data"];
    assert!(
        tool_end["result"].to_string().contains("real-pi-ok"),
        "{tool_end}"
    );
    assert_ne!(tool_end["isError"], true, "{tool_end}");
    let final_text = find(&labels, exec_end, "second text delta", |l| {
        l == "agent.message_update:text_delta"
    });
    assert_eq!(
        seen[final_text]["data"]["assistantMessageEvent"]["delta"],
        "done"
    );
    let agent_end = find(&labels, final_text, "agent_end", |l| l == "agent.agent_end");
    assert_eq!(
        agent_end + 2,
        labels.len(),
        "turn.finished follows agent_end"
    );
    let finished = seen.last().unwrap();
    assert_eq!(finished["type"], "turn.finished");
    assert_eq!(finished["data"]["outcome"], "completed", "{finished}");

    // The model saw the tool's output in its second call.
    let requests = stub.requests.lock().unwrap().clone();
    assert_eq!(requests.len(), 2, "two model calls: {requests:#?}");
    assert_eq!(requests[0]["stream"], true);
    assert!(
        requests[0]["tools"]
            .as_array()
            .is_some_and(|tools| tools.iter().any(|t| t["function"]["name"] == "bash")),
        "pi offers its bash tool: {}",
        requests[0]["tools"]
    );
    let tool_message = requests[1]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "tool")
        .cloned()
        .expect("a tool message in the second call");
    assert_eq!(
        tool_message["tool_call_id"], "call_stub_1",
        "{tool_message}"
    );
    assert!(
        tool_message["content"].to_string().contains("real-pi-ok"),
        "{tool_message}"
    );

    let got = client
        .call("session/get", json!({"sessionId": session_id}))
        .await;
    assert_eq!(got["result"]["snapshot"]["state"], "idle", "{got}");
    assert_eq!(got["result"]["snapshot"]["pendingApprovals"], json!([]));
    eprintln!("real pi test took {:?}", began.elapsed());
}

/// Every way a provider fails, driven through the real pi and pi-host over RACP-WS: the terminal
/// `turn.finished` carries the code, retriable, recovery and details of docs/protocol.md §8.7.
/// One pi process serves every case (each is one turn in the same session), so the cost is one
/// pi start plus, for the failures pi could retry, the host's wait for pi's retry decision.
#[tokio::test]
async fn provider_failures_end_the_turn_with_the_local_codes() {
    let began = Instant::now();
    let stub = Stub::default();
    let (host, _pi_dir) = pi_host(&stub, None).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let created = client
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let session = &created["result"]["session"];
    let session_id = session["sessionId"].as_str().unwrap().to_string();
    let sub = client
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": session["cursor"]}),
        )
        .await;
    assert!(sub.get("result").is_some(), "{sub}");

    // (stub mode, code, retriable, recovery, providerStatus)
    let cases: &[(&str, &str, bool, &str, Option<u64>)] = &[
        (
            "401",
            "PROVIDER_UNAUTHORIZED",
            false,
            "stop_and_report",
            Some(401),
        ),
        (
            "429",
            "PROVIDER_RATE_LIMITED",
            true,
            "retry_after",
            Some(429),
        ),
        ("quota", "PROVIDER_ERROR", false, "retry", Some(429)),
        ("500", "PROVIDER_ERROR", true, "retry", Some(500)),
        ("502", "PROVIDER_ERROR", true, "retry", Some(502)),
        (
            "context",
            "CONTEXT_TOO_LARGE",
            false,
            "fix_arguments",
            Some(400),
        ),
        (
            "404",
            "MODEL_NOT_CONFIGURED",
            false,
            "stop_and_report",
            Some(404),
        ),
        ("cut", "STREAM_FAILED", true, "retry", None),
        ("empty", "EMPTY_MODEL_RESPONSE", true, "retry", None),
        ("drop", "NETWORK_ERROR", true, "retry", None),
    ];
    let mut report = Vec::new();
    for (i, (mode, code, retriable, recovery, status)) in cases.iter().enumerate() {
        *stub.failure.lock().unwrap() = Some(mode);
        let started = Instant::now();
        let turn = client
            .call(
                "turn/start",
                json!({"sessionId": session_id, "idempotencyKey": format!("k{i}"), "text": "Hello."}),
            )
            .await;
        let turn_id = turn["result"]["turnId"]
            .as_str()
            .unwrap_or_else(|| panic!("turn/start failed: {turn}"))
            .to_string();
        let seen = events_until(&mut client, |e| {
            e["type"] == "turn.finished" && e["turnId"] == turn_id.as_str()
        })
        .await;
        let finished = seen.last().unwrap();
        let error = &finished["data"]["error"];
        report.push(format!("{mode}: {error} in {:?}", started.elapsed()));
        assert_eq!(finished["data"]["outcome"], "failed", "{mode}: {finished}");
        assert_eq!(error["code"], *code, "{mode}: {error}");
        assert_eq!(error["retriable"], *retriable, "{mode}: {error}");
        assert_eq!(error["recovery"], *recovery, "{mode}: {error}");
        assert_eq!(error["source"], "agent", "{mode}: {error}");
        assert!(error["traceId"].is_string(), "{mode}: {error}");
        let details = &error["details"];
        assert_eq!(details["provider"], "stub", "{mode}: {error}");
        assert_eq!(details["model"], "stub-model", "{mode}: {error}");
        assert_eq!(
            details["providerStatus"].as_u64(),
            *status,
            "{mode}: {error}"
        );
        assert!(
            details["retryAttempt"].is_null(),
            "pi's retries are off: {error}"
        );
        if let Some(text) = details["providerMessage"].as_str() {
            assert!(text.chars().count() <= 601, "{mode}: capped");
            assert!(
                !text.contains("abcdefghijklmnopqrstuvwxyz"),
                "{mode}: redacted: {text}"
            );
        }
        match *mode {
            // The wait pi's message names; the `retry-after` header does not reach past pi-ai.
            "429" => assert_eq!(error["retryAfterMs"], 7000, "{error}"),
            "401" => assert!(
                details["providerMessage"]
                    .as_str()
                    .is_some_and(|m| m.contains("sk-[redacted]")),
                "{error}"
            ),
            _ => assert!(error["retryAfterMs"].is_null(), "{mode}: {error}"),
        }
        let got = client
            .call("session/get", json!({"sessionId": session_id}))
            .await;
        assert_eq!(got["result"]["snapshot"]["state"], "idle", "{mode}: {got}");
    }
    eprintln!("{}", report.join("\n"));
    // One request per failure: neither pi nor its provider SDK retried.
    assert_eq!(stub.requests.lock().unwrap().len(), cases.len());
    eprintln!("provider failure cases took {:?}", began.elapsed());
}

/// A real pi reply of 1000 text deltas through the host: the client rebuilds pi's message
/// exactly across a cut, and the turn costs bytes linear in the reply on the wire and in the
/// store (docs/protocol.md §8.1, "Compact streams").
#[tokio::test]
async fn a_long_real_reply_is_relayed_in_linear_bytes_and_rebuilt_exactly() {
    use racp_proto::client::{RacpClient, SubscriptionItem};
    use racp_proto::methods::session::{SessionCreateParams, SessionSubscribeParams};
    use racp_proto::methods::turn::TurnStartParams;
    let stub = Stub::default();
    let (host, _pi_dir) = pi_host(&stub, None).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let proxy = tests::FaultProxy::start(host.addr).await;
    let mut options = tests::client_options(proxy.url(), &token);
    options.call_timeout = WAIT;
    options.max_backoff = Duration::from_millis(200);
    let client = RacpClient::connect(options).await.unwrap();
    let created = client
        .call::<racp_proto::calls::SessionCreate>(SessionCreateParams {
            workspace: host.workspace("w"),
            title: None,
            ..Default::default()
        })
        .await
        .unwrap();
    let session_id = created.session.session_id.clone();
    let mut sub = client
        .subscribe(SessionSubscribeParams {
            session_id: session_id.clone(),
            cursor: Some(created.session.cursor),
        })
        .await
        .unwrap();
    client
        .call::<racp_proto::calls::TurnStart>(TurnStartParams {
            session_id: session_id.clone(),
            idempotency_key: "long".into(),
            text: "Answer with LONG-REPLY:1000 please.".into(),
            images: Vec::new(),
        })
        .await
        .unwrap();
    let (mut events, mut wire, mut updates) = (0usize, 0usize, 0usize);
    let mut message_end = None;
    loop {
        let item = tokio::time::timeout(WAIT, sub.next())
            .await
            .unwrap()
            .unwrap();
        let SubscriptionItem::Event(event) = item else {
            panic!("unexpected {item:?}");
        };
        events += 1;
        wire += serde_json::to_string(&event).unwrap().len();
        let data = serde_json::to_value(&event.data).unwrap();
        if event.kind == "agent.message_update" {
            updates += 1;
            if updates == 400 {
                proxy.cut();
            }
        }
        if event.kind == "agent.message_end" && data["message"]["role"] == "assistant" {
            assert_eq!(
                sub.stream().finished_message(),
                Some(&data["message"]),
                "the rebuilt message is pi's own message_end"
            );
            message_end = Some(data["message"].clone());
        }
        if event.kind == "turn.finished" {
            break;
        }
    }
    let message = message_end.expect("pi's assistant message");
    let text: String = message["content"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|b| b["text"].as_str())
        .collect();
    assert_eq!(text.len(), 10_000, "{message}");
    assert!(updates >= 1000, "{updates} updates");
    let db = rusqlite::Connection::open(host.data_dir.path().join("pi-host.db")).unwrap();
    let stored: i64 = db
        .query_row(
            "SELECT SUM(LENGTH(body)) FROM event_chunks WHERE session_id = ?1",
            [&session_id],
            |r| r.get(0),
        )
        .unwrap();
    let stored = usize::try_from(stored).unwrap();
    // docs/protocol.md §8.1, "Bounds": 3x the text plus 320 bytes an event.
    let bound = 3 * text.len() + 320 * events;
    assert!(wire <= bound, "{wire} bytes on the wire, {events} events");
    assert!(stored <= bound, "{stored} bytes stored, {events} events");
    tests::record_figures(
        "real_pi_long_reply",
        &json!({"text": text.len(), "events": events, "wire": wire, "stored": stored}),
    );
}

async fn running_agents(client: &mut Client) -> u64 {
    let info = client.call("host/info", json!({})).await;
    info["result"]["agents"]["running"].as_u64().unwrap()
}

/// Starts a turn and returns the time from sending `turn/start` to the first text delta, and the
/// events up to `turn.finished`.
async fn time_to_first_delta(
    client: &mut Client,
    session_id: &str,
    key: &str,
) -> (Duration, Vec<Value>) {
    let sent = Instant::now();
    let turn = client
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": key, "text": "Say hello."}),
        )
        .await;
    assert!(turn.get("result").is_some(), "{turn}");
    let mut events = events_until(client, |e| {
        e["data"]["assistantMessageEvent"]["type"] == "text_delta"
    })
    .await;
    let first = sent.elapsed();
    events.extend(events_until(client, |e| e["type"] == "turn.finished").await);
    (first, events)
}

/// With the real pi: a new session's agent starts with the session, and its first turn runs on
/// that agent (docs/architecture.md, "Agent lifecycle").
#[tokio::test]
async fn a_new_sessions_first_turn_runs_on_the_agent_started_with_it() {
    let stub = Stub::default();
    let (host, _pi_dir) = pi_host(&stub, None).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let session_id = client.open_session(&host.workspace("w")).await;
    let deadline = Instant::now() + WAIT;
    while running_agents(&mut client).await != 1 {
        assert!(
            Instant::now() < deadline,
            "no agent started with the session"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let warm = host.agent_pids();
    // pi started with the host's preload extension; pi exits when an extension fails to load,
    // so the turn completing on this agent shows that it loaded.
    let preload = host
        .data_dir
        .path()
        .join("pi-extensions/pi-host-preload.ts");
    // From the host's log: pi renames its process ("pi") once loaded, over its command line.
    let log = host.log();
    let started = log
        .lines()
        .find(|l| l.contains("agent command line") && l.contains(&format!("pid={}", warm[0])))
        .unwrap_or_else(|| panic!("no command line logged for {}: {log}", warm[0]));
    assert!(
        started.contains(&format!("--extension {}", preload.display())),
        "{started}"
    );
    let (first, events) = time_to_first_delta(&mut client, &session_id, "k1").await;
    assert_eq!(events.last().unwrap()["data"]["outcome"], "completed");
    assert_eq!(
        host.agent_pids(),
        warm,
        "the first turn ran on the warm agent"
    );
    tests::record_figures(
        "real_pi_warm_first_delta",
        &json!({"first_delta_ms": first.as_millis() as u64}),
    );
}

/// The figures of docs/benchmarks.md, "First reply and idle agents" (not a CI check: timings
/// are measured, never asserted): time from the prompt to the first text delta, with pi run
/// directly (without and with pi-host's preload extension) and through pi-host (with the preload,
/// the default, and with `--disable-agent-preload`), on a new session (prompt at once, and five
/// sessions each prompted 3 s after `session/create`) and on a warm one; how long pi takes to
/// answer its first command; the agents' memory with 10 idle sessions, before and after the idle
/// stop. Run: `cargo nextest run -p pi-host --test real_pi --run-ignored only --no-capture
/// first_reply_figures`.
#[tokio::test]
#[ignore = "a measurement, run by hand for docs/benchmarks.md"]
async fn first_reply_figures() {
    let stub = Stub::default();
    let mut figures = json!({});

    // pi alone: spawn it, prompt at once (or 3 s later), then prompt again.
    let port = start_stub(stub.clone()).await;
    let pi_dir = pi_config(port);
    let preload = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/agent/extensions/preload.ts");
    for (name, extension) in [("pi_direct", None), ("pi_direct_preload", Some(&preload))] {
        let words = pi_words(&pi_cli(), extension.map(PathBuf::as_path));
        for wait in [0, 3] {
            let spawned = Instant::now();
            let mut pi = tokio::process::Command::new(&words[0])
                .args(&words[1..])
                .envs(pi_env(pi_dir.path()))
                .current_dir(pi_dir.path())
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .kill_on_drop(true)
                .spawn()
                .unwrap();
            let mut stdin = pi.stdin.take().unwrap();
            let mut lines = tokio::io::BufReader::new(pi.stdout.take().unwrap()).lines();
            use tokio::io::{AsyncBufReadExt, AsyncWriteExt};
            let mut ready_ms = None;
            if wait > 0 {
                // When pi answers its first command (what pi-host's warm start waits for).
                let state = json!({"id": "ready", "type": "get_state"});
                stdin
                    .write_all(format!("{state}\n").as_bytes())
                    .await
                    .unwrap();
                while let Some(line) = lines.next_line().await.unwrap() {
                    let event: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
                    if event["id"] == "ready" {
                        ready_ms = Some(spawned.elapsed().as_millis() as u64);
                        break;
                    }
                }
            }
            tokio::time::sleep_until((spawned + Duration::from_secs(wait)).into()).await;
            let mut direct = Vec::new();
            for id in ["1", "2", "3"] {
                let sent = Instant::now();
                let prompt = json!({"id": id, "type": "prompt", "message": "Say hello."});
                stdin
                    .write_all(format!("{prompt}\n").as_bytes())
                    .await
                    .unwrap();
                let mut first = None;
                while let Some(line) = lines.next_line().await.unwrap() {
                    let event: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
                    if first.is_none() && event["assistantMessageEvent"]["type"] == "text_delta" {
                        first = Some(sent.elapsed().as_millis() as u64);
                    }
                    if event["type"] == "agent_end" {
                        break;
                    }
                }
                direct.push(first.unwrap());
            }
            let key = if wait == 0 {
                name.to_string()
            } else {
                format!("{name}_prompt_after_3s")
            };
            figures[key] = json!({"new": direct[0], "warm": &direct[1..], "ready_ms": ready_ms});
            drop(pi);
        }
    }

    // Through pi-host, with the preload extension (the default) and without: two hosts, their
    // sessions taking turns so that both see the same load.
    let mut hosts = Vec::new();
    for (name, extra) in [
        ("pi_host_ms", &[][..]),
        (
            "pi_host_without_preload_ms",
            &["--disable-agent-preload"][..],
        ),
    ] {
        let (host, pi_dir) = pi_host_with(&stub, None, extra).await;
        let (_, token) = host.pair_device("laptop", &[]).await;
        let client = connect(&host, &token).await;
        hosts.push((name, host, pi_dir, client, Vec::new()));
    }
    for (name, host, _, client, _) in &mut hosts {
        // A new session prompted at once: the warm start has had no time.
        let at_once = client.open_session(&host.workspace("w")).await;
        let (new_at_once, _) = time_to_first_delta(client, &at_once, "a1").await;
        let (warm, _) = time_to_first_delta(client, &at_once, "a2").await;
        client
            .call("session/close", json!({"sessionId": at_once}))
            .await;
        figures[*name] = json!({
            "new_prompt_at_once": new_at_once.as_millis() as u64,
            "warm": warm.as_millis() as u64,
        });
    }
    for round in 0..5 {
        for (_, host, _, client, after_3s) in &mut hosts {
            // A new session prompted 3 s after it was created.
            let later = client.open_session(&host.workspace("w")).await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            let (first, _) = time_to_first_delta(client, &later, &format!("b{round}")).await;
            after_3s.push(first.as_millis() as u64);
            client
                .call("session/close", json!({"sessionId": later}))
                .await;
        }
    }
    for (name, _, _, _, after_3s) in hosts {
        let mut sorted = after_3s.clone();
        sorted.sort_unstable();
        figures[name]["new_prompt_after_3s"] = json!(after_3s);
        figures[name]["new_prompt_after_3s_median"] = json!(sorted[sorted.len() / 2]);
    }

    // Ten idle sessions on a fresh host: their agents' memory, then none after the idle time.
    for (name, extra) in [
        ("ten_sessions", &[][..]),
        (
            "ten_sessions_without_preload",
            &["--disable-agent-preload"][..],
        ),
    ] {
        let mut args = vec!["--agent-idle-ms", "8000"];
        args.extend_from_slice(extra);
        let (host, _pi_dir) = pi_host_with(&stub, None, &args).await;
        let (_, token) = host.pair_device("laptop", &[]).await;
        let mut client = connect(&host, &token).await;
        for _ in 0..10 {
            client
                .call("session/create", json!({"workspace": host.workspace("w")}))
                .await;
        }
        let deadline = Instant::now() + WAIT;
        while running_agents(&mut client).await != 10 {
            assert!(Instant::now() < deadline, "10 agents never ran");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Let each pi finish loading before reading its memory.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let info = client.call("host/info", json!({})).await;
        figures[format!("{name}_running")] = info["result"]["agents"].clone();
        drop(client);
        let mut client = connect(&host, &token).await;
        let deadline = Instant::now() + WAIT;
        while running_agents(&mut client).await != 0 {
            assert!(Instant::now() < deadline, "the idle agents did not stop");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let info = client.call("host/info", json!({})).await;
        figures[format!("{name}_after_idle")] = info["result"]["agents"].clone();
        figures[format!("{name}_host_rss_kib")] = json!(host.rss_kib());
    }
    tests::record_figures("first_reply", &figures);
}

/// The first reply of a host's first session (docs/benchmarks.md §7; a measurement, never
/// asserted): a fresh host each time, its session created as soon as the host listens (while
/// its first agent check still asks pi's `--version`), prompted 3 s later; then the host's
/// second session, prompted 3 s after its creation. With `FIRST_REPLY_BASELINE` naming another
/// pi-host binary, its hosts take turns with this build's, so both see the same load. Run:
/// `cargo nextest run -p pi-host --test real_pi --run-ignored only --no-capture
/// first_reply_on_a_fresh_host`.
#[tokio::test]
#[ignore = "a measurement, run by hand for docs/benchmarks.md"]
async fn first_reply_on_a_fresh_host_figures() {
    let stub = Stub::default();
    let port = start_stub(stub.clone()).await;
    let mut builds = vec![("this_build", tests::pi_host_binary())];
    if let Ok(baseline) = std::env::var("FIRST_REPLY_BASELINE") {
        builds.push(("baseline", PathBuf::from(baseline)));
    }
    let mut figures = json!({});
    let mut runs: Vec<(Vec<u64>, Vec<u64>)> = vec![Default::default(); builds.len()];
    for round in 0..5 {
        for ((_, bin), (firsts, seconds)) in builds.iter().zip(runs.iter_mut()) {
            let pi_dir = pi_config(port);
            let agent = shell_words::join(pi_words(&pi_cli(), None));
            let env = pi_env(pi_dir.path());
            let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
            let args = ["--agent", &agent, "--permission-mode", "auto"];
            let host = HostProcess::start_with_env(bin, &args, &env).await;
            let (_, token) = host.pair_device("laptop", &[]).await;
            let mut client = connect(&host, &token).await;
            for (i, figures) in [&mut *firsts, &mut *seconds].into_iter().enumerate() {
                let session_id = client.open_session(&host.workspace("w")).await;
                tokio::time::sleep(Duration::from_secs(3)).await;
                let key = format!("f{round}-{i}");
                let (first, _) = time_to_first_delta(&mut client, &session_id, &key).await;
                figures.push(first.as_millis() as u64);
            }
        }
    }
    let median = |figures: &[u64]| {
        let mut sorted = figures.to_vec();
        sorted.sort_unstable();
        sorted[sorted.len() / 2]
    };
    for ((name, _), (firsts, seconds)) in builds.iter().zip(&runs) {
        figures[*name] = json!({
            "first_session_ms": firsts, "first_session_median_ms": median(firsts),
            "second_session_ms": seconds, "second_session_median_ms": median(seconds),
        });
    }
    tests::record_figures("first_reply_on_a_fresh_host", &figures);
}

/// The conversation as a client that watched live holds it: each `agent.message_end` and
/// `agent.compaction_end` event, whole.
fn conversation_of(events: &[Value]) -> Vec<Value> {
    events
        .iter()
        .filter(|e| e["type"] == "agent.message_end" || e["type"] == "agent.compaction_end")
        .cloned()
        .collect()
}

/// The conversation as a client that arrives late rebuilds it (docs/protocol.md §8.4): the
/// snapshot's history, then `session/history` pages back from its `earlier`. Walking back from
/// the snapshot's cursor two entries a page must give the same entries.
async fn conversation_from_history(client: &mut Client, session_id: &str) -> (Vec<Value>, Value) {
    let got = client
        .call("session/get", json!({"sessionId": session_id}))
        .await;
    let history = &got["result"]["snapshot"]["history"];
    let cursor = got["result"]["cursor"].clone();
    let recent: Vec<Value> = history["entries"].as_array().expect("history").clone();
    let entries = [
        pages_back(client, session_id, &history["earlier"], 100).await,
        recent,
    ]
    .concat();
    let walked = pages_back(client, session_id, &cursor, 2).await;
    assert_eq!(walked, entries, "two entries a page, back from the cursor");
    (entries, cursor)
}

/// Every history entry at or before `up_to` (none when it is null), paging back `limit` at a
/// time; oldest first.
async fn pages_back(
    client: &mut Client,
    session_id: &str,
    up_to: &Value,
    limit: u64,
) -> Vec<Value> {
    let mut entries = Vec::new();
    let mut earlier = up_to.clone();
    while !earlier.is_null() {
        let page = client
            .call(
                "session/history",
                json!({"sessionId": session_id, "upTo": earlier, "limit": limit}),
            )
            .await;
        let page = &page["result"];
        let older = page["entries"].as_array().expect("a page").clone();
        assert!(!older.is_empty() && older.len() as u64 <= limit, "{page}");
        assert_ne!(page["truncated"], true, "{page}");
        entries.splice(0..0, older);
        earlier = page["earlier"].clone();
    }
    entries
}

/// Runs one turn with a tool call and returns its events up to `turn.finished`.
async fn turn_with_a_tool_call(client: &mut Client, session_id: &str, n: usize) -> Vec<Value> {
    let turn = client
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": format!("k{n}"), "text": format!("Run check {n}.")}),
        )
        .await;
    assert!(turn.get("result").is_some(), "{turn}");
    let events = events_until(client, |e| e["type"] == "turn.finished").await;
    assert_eq!(
        events.last().unwrap()["data"]["outcome"],
        "completed",
        "{:#?}",
        events.last()
    );
    events
}

/// Three turns with tool calls through the real pi, watched live by one device; an observer
/// that arrives after the whole log left the replay window (`--retain-events 50`) rebuilds the
/// same conversation from the history, and again after kill -9 of the host, after the agent's
/// idle stop (without starting it again), and after `session/close` (docs/protocol.md §7.24).
#[tokio::test]
async fn a_late_observer_rebuilds_the_conversation_after_the_window_a_kill_and_an_idle_stop() {
    let stub = Stub::default();
    let extra = ["--retain-events", "50", "--agent-idle-ms", "1500"];
    let (host, pi_dir) = pi_host_with(&stub, None, &extra).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let (_, observer_token) = host.pair_device("phone", &["--roles", "observer"]).await;
    let mut live = connect(&host, &token).await;
    let session_id = live.open_session(&host.workspace("w")).await;
    let mut watched = Vec::new();
    for n in 1..=3 {
        watched.extend(turn_with_a_tool_call(&mut live, &session_id, n).await);
    }
    let conversation = conversation_of(&watched);
    let roles: Vec<&str> = conversation
        .iter()
        .map(|e| e["data"]["message"]["role"].as_str().unwrap_or("?"))
        .collect();
    assert_eq!(
        roles,
        ["user", "assistant", "toolResult", "assistant"].repeat(3),
        "each turn: the prompt, a tool call, its result, the answer"
    );
    assert!(
        watched.len() > 50,
        "the log outgrew the window: {}",
        watched.len()
    );

    // The observer's cursor from the session's start has left the window.
    let mut observer = connect(&host, &observer_token).await;
    let sub = observer
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": watched[0]["cursor"]}),
        )
        .await;
    assert_eq!(sub["error"]["code"], "CURSOR_EXPIRED", "{sub}");
    let (rebuilt, cursor) = conversation_from_history(&mut observer, &session_id).await;
    assert_eq!(rebuilt, conversation, "the late observer's conversation");
    assert_eq!(cursor, watched.last().unwrap()["cursor"]);
    let texts: Vec<String> = rebuilt
        .iter()
        .filter(|e| e["data"]["message"]["role"] == "toolResult")
        .map(|e| e["data"]["message"]["content"].to_string())
        .collect();
    assert!(texts.iter().all(|t| t.contains("real-pi-ok")), "{texts:?}");

    // kill -9: the history is durable with its events.
    drop((live, observer));
    let agent = shell_words::join(pi_words(&pi_cli(), None));
    let mut args = vec!["--agent", agent.as_str(), "--permission-mode", "auto"];
    args.extend_from_slice(&extra);
    let host = host.restart(&args).await;
    let mut observer = connect(&host, &observer_token).await;
    let (rebuilt, _) = conversation_from_history(&mut observer, &session_id).await;
    assert_eq!(rebuilt, conversation, "after kill -9");

    // A fourth turn on a new agent, then its idle stop: the history is read with no agent.
    let mut live = connect(&host, &token).await;
    let head = live
        .call("session/get", json!({"sessionId": session_id}))
        .await["result"]["cursor"]
        .clone();
    let sub = live
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": head}),
        )
        .await;
    assert!(sub.get("result").is_some(), "{sub}");
    let fourth = turn_with_a_tool_call(&mut live, &session_id, 4).await;
    let conversation = [conversation, conversation_of(&fourth)].concat();
    drop(live);
    let deadline = Instant::now() + WAIT;
    while running_agents(&mut observer).await != 0 {
        assert!(Instant::now() < deadline, "the idle agent was not stopped");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (rebuilt, _) = conversation_from_history(&mut observer, &session_id).await;
    assert_eq!(rebuilt, conversation, "after the idle stop");
    assert_eq!(
        running_agents(&mut observer).await,
        0,
        "reading the history started no agent"
    );

    // Closed: still readable, and the same.
    let mut owner = connect(&host, &token).await;
    let closed = owner
        .call("session/close", json!({"sessionId": session_id}))
        .await;
    assert!(closed.get("result").is_some(), "{closed}");
    let (rebuilt, _) = conversation_from_history(&mut observer, &session_id).await;
    assert_eq!(rebuilt, conversation, "after session/close");
    drop(pi_dir);
}

/// An image sent with a prompt reaches the model as image content; the log names it in
/// `turn.started` and keeps its bytes once, in the prompt's own message; prompts with too many
/// images or another type are refused before anything is recorded (docs/protocol.md §7.15).
#[tokio::test]
async fn an_image_with_a_prompt_reaches_the_model() {
    let stub = Stub::default();
    let (host, _pi_dir) = pi_host(&stub, None).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let hello = client.hello().await;
    assert!(
        hello["capabilities"]
            .as_array()
            .is_some_and(|c| c.contains(&json!("attachments"))),
        "{hello}"
    );
    let session_id = client.open_session(&host.workspace("w")).await;
    let image = json!({"mimeType": "image/png", "data": PNG});

    let refused = [
        (
            json!(vec![image.clone(); 9]),
            "LIMIT_EXCEEDED",
            "params.images",
        ),
        (
            json!([{"mimeType": "image/tiff", "data": PNG}]),
            "INVALID_PARAMS",
            "params.images.0.mimeType",
        ),
        (
            json!([{"mimeType": "image/png", "data": "not base64!"}]),
            "INVALID_PARAMS",
            "params.images.0.data",
        ),
    ];
    for (images, code, path) in refused {
        let reply = client
            .call(
                "turn/start",
                json!({"sessionId": session_id, "idempotencyKey": "bad", "text": "see", "images": images}),
            )
            .await;
        assert_eq!(reply["error"]["code"], code, "{reply}");
        assert_eq!(reply["error"]["details"]["path"], path, "{reply}");
    }

    let turn = client
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "k1", "text": "What is in this image?", "images": [image]}),
        )
        .await;
    assert!(turn.get("result").is_some(), "{turn}");
    let events = events_until(&mut client, |e| e["type"] == "turn.finished").await;
    assert_eq!(
        events[0]["type"], "turn.started",
        "nothing was recorded for the refusals"
    );
    assert_eq!(
        events[0]["data"]["images"],
        json!([{"mimeType": "image/png", "bytes": 70}])
    );
    assert!(
        !events[0].to_string().contains(PNG),
        "turn.started names it only"
    );
    let prompt = events
        .iter()
        .find(|e| e["type"] == "agent.message_end" && e["data"]["message"]["role"] == "user")
        .expect("the prompt's message");
    let content = prompt["data"]["message"]["content"].to_string();
    assert!(
        content.contains(PNG),
        "the prompt's message holds the image: {content}"
    );
    let with_image = events
        .iter()
        .filter(|e| e.to_string().contains(PNG))
        .count();
    assert_eq!(with_image, 1, "the log holds the bytes once");

    let requests = stub.requests.lock().unwrap().clone();
    let user = requests[0]["messages"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["role"] == "user")
        .cloned()
        .expect("the prompt in the model request");
    let parts = user["content"].as_array().expect("text and image parts");
    assert!(
        parts.iter().any(|p| p["type"] == "image_url"
            && p["image_url"]["url"] == format!("data:image/png;base64,{PNG}")),
        "{user}"
    );
    assert!(
        parts.iter().any(|p| p["text"] == "What is in this image?"),
        "{user}"
    );
}

/// pi's automatic retry, waiting before its next attempt, is stopped by `turn/abort` (pi's
/// `abort` cancels the wait: `abort_retry` needs no method of its own), and the turn ends
/// aborted at once rather than staying open for a retry that will never come.
#[tokio::test]
async fn an_abort_during_pis_retry_wait_ends_the_turn() {
    let stub = Stub::default();
    let (host, pi_dir) = pi_host(&stub, None).await;
    // Retries on, with a wait far longer than the test would sit through.
    let settings = json!({
        "defaultProvider": "stub",
        "defaultModel": "stub-model",
        "quietStartup": true,
        "retry": {"enabled": true, "maxRetries": 3, "baseDelayMs": 600_000, "provider": {"maxRetries": 0}},
        "compaction": {"enabled": false},
    });
    std::fs::write(pi_dir.path().join("settings.json"), settings.to_string()).unwrap();
    *stub.failure.lock().unwrap() = Some("500");
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let session_id = client.open_session(&host.workspace("w")).await;
    let started = client
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "k1", "text": "Hello."}),
        )
        .await;
    let turn_id = started["result"]["turnId"].as_str().unwrap().to_string();
    let waiting = client
        .events_until(WAIT, |e| e["type"] == "agent.auto_retry_start")
        .await;
    assert_eq!(waiting.last().unwrap()["turnId"], turn_id.as_str());
    let aborted = client
        .call(
            "turn/abort",
            json!({"sessionId": session_id, "turnId": turn_id}),
        )
        .await;
    assert!(aborted.get("result").is_some(), "{aborted}");
    let events = client
        .events_until(WAIT, |e| {
            e["type"] == "turn.finished" && e["turnId"] == turn_id.as_str()
        })
        .await;
    let end = events.last().unwrap();
    assert_eq!(end["data"]["outcome"], "aborted", "{end}");
    assert_eq!(end["data"]["error"]["code"], "TURN_ABORTED", "{end}");
    assert_eq!(stub.requests.lock().unwrap().len(), 1, "no second attempt");
    // The session goes on.
    *stub.failure.lock().unwrap() = None;
    let next = client
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "k2", "text": "Again."}),
        )
        .await;
    let next_id = next["result"]["turnId"].as_str().unwrap().to_string();
    let events = client
        .events_until(WAIT, |e| {
            e["type"] == "turn.finished" && e["turnId"] == next_id.as_str()
        })
        .await;
    assert_eq!(events.last().unwrap()["data"]["outcome"], "completed");
}

/// `turn/abort` while pi waits on an extension's dialog (`tests/pi/confirm-tools.ts` asks
/// before every tool): pi ends an aborted run, and answers `abort`, only once the dialog
/// returns, so the host answers it (cancelled) first. The turn ends aborted at once, its
/// approval settled as cancelled, instead of when the dialog's deadline passes.
#[tokio::test]
async fn an_abort_during_a_real_dialog_ends_the_turn_at_once() {
    let extension = fixture_dir()
        .join("confirm-tools.ts")
        .canonicalize()
        .expect("tests/pi/confirm-tools.ts");
    let stub = Stub::default();
    let (host, _pi_dir) = pi_host(&stub, Some(&extension)).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let session_id = client.open_session(&host.workspace("w")).await;
    let started = client
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "k1", "text": "Run the check."}),
        )
        .await;
    let turn_id = started["result"]["turnId"].as_str().unwrap().to_string();
    let asked = events_until(&mut client, |e| e["type"] == "approval.requested").await;
    let approval_id = asked.last().unwrap()["data"]["approvalId"].clone();

    let began = Instant::now();
    let aborted = client
        .call(
            "turn/abort",
            json!({"sessionId": session_id, "turnId": turn_id}),
        )
        .await;
    assert!(aborted.get("result").is_some(), "{aborted}");
    let events = events_until(&mut client, |e| {
        e["type"] == "turn.finished" && e["turnId"] == turn_id.as_str()
    })
    .await;
    let took = began.elapsed();
    let end = events.last().unwrap();
    assert_eq!(end["data"]["outcome"], "aborted", "{end}");
    assert_eq!(end["data"]["error"]["code"], "TURN_ABORTED", "{end}");
    let settled = events
        .iter()
        .find(|e| e["type"] == "approval.settled")
        .expect("the approval settled");
    assert_eq!(settled["data"]["approvalId"], approval_id);
    assert_eq!(settled["data"]["outcome"], "cancelled", "{settled}");
    assert!(
        took < Duration::from_secs(2),
        "the turn ended {took:?} after the abort"
    );
    let got = client
        .call("session/get", json!({"sessionId": session_id}))
        .await;
    assert_eq!(got["result"]["snapshot"]["pendingApprovals"], json!([]));
    assert_eq!(got["result"]["snapshot"]["state"], "idle", "{got}");
}

/// `session/bash`'s `truncated` is true whenever the output was cut (docs/protocol.md §7.27):
/// an output with no newline well over pi's 50 KB (pi keeps its last 100 KB in chunks and drops
/// the oldest without a word: here 60 000 bytes, then 50 000 read apart, end as one chunk
/// within pi's bound, and pi said `truncated: false`), one of 20 MB, and both sides of pi's
/// bound (51 200 bytes whole, 51 201 cut).
#[tokio::test]
async fn a_shell_output_cut_anywhere_says_truncated() {
    let stub = Stub::default();
    let (host, _pi_dir) = pi_host(&stub, None).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let session_id = client.open_session(&host.workspace("w")).await;
    let cases = [
        (
            "head -c 60000 /dev/zero | tr '\\0' a > a.txt; head -c 50000 /dev/zero | tr '\\0' b \
             > b.txt; cat a.txt; sleep 0.5; cat b.txt",
            true,
            'b',
        ),
        ("head -c 20000000 /dev/zero | tr '\\0' a", true, 'a'),
        ("head -c 51200 /dev/zero | tr '\\0' a", false, 'a'),
        ("head -c 51201 /dev/zero | tr '\\0' a", true, 'a'),
    ];
    for (command, cut, last) in cases {
        let reply = client
            .call(
                "session/bash",
                json!({"sessionId": session_id, "command": command}),
            )
            .await;
        let result = &reply["result"];
        let output = result["output"]
            .as_str()
            .unwrap_or_else(|| panic!("{reply}\n{}", host.log()));
        let summary = format!("{command}: {} bytes, {}", output.len(), result["truncated"]);
        assert_eq!(result["truncated"], cut, "{summary}");
        assert_eq!(result["exitCode"], 0, "{summary}");
        assert!(output.ends_with(last), "{summary}");
        assert!(
            output.len() <= racp_proto::limits::MAX_SHELL_OUTPUT_BYTES,
            "{summary}"
        );
        if !cut {
            assert_eq!(output.len(), 51200, "{summary}");
        }
    }
}

/// Every file of `dir` whose name ends `.jsonl` (pi's session files), read whole.
fn session_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
                .map(|e| std::fs::read_to_string(e.path()).unwrap())
                .collect()
        })
        .unwrap_or_default()
}

/// docs/reliability.md §4.17: a provider key set with `credential/set` and an Anthropic key a
/// command printed reach pi's own session file; the events show them `[redacted]`, and so do
/// the export (inside pi's base64-encoded session data, the page still pi's, its script whole)
/// and the session file a clone's agent starts from.
#[tokio::test]
async fn an_export_and_a_clone_hold_no_secret_the_events_redact() {
    let stub = Stub::default();
    let (host, _pi_dir, _agent) = tests::pi::pi_host_saving(&stub).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let provider_key = "zq9-Stub.Provider_Key_7f3b";
    let anthropic_key = "sk-ant-api03-Xy7kQ2mN9pR4sT6vW8zA1bC3dE5fG7hJ";
    let set = client
        .call(
            "credential/set",
            json!({"provider": "stub", "apiKey": provider_key}),
        )
        .await;
    assert!(set["result"]["credential"].is_object(), "{set}");
    let session_id = client.open_session(&host.workspace("w")).await;
    let mut events = turn_with_a_tool_call(&mut client, &session_id, 1).await;
    // Printed by a command, never typed whole: the secrets are in its output only.
    let command = "printf '%s%s\\n' zq9-Stub.Provider _Key_7f3b; \
                   printf 'ANTHROPIC_API_KEY=%s%s%s\\n' sk-ant-api03- Xy7kQ2mN9pR4 sT6vW8zA1bC3dE5fG7hJ";
    let ran = client
        .call(
            "session/bash",
            json!({"sessionId": session_id, "command": command}),
        )
        .await;
    assert_eq!(ran["result"]["exitCode"], 0, "{ran}");
    events.extend(
        client
            .events_until(WAIT, |e| e["type"] == "session.bash")
            .await,
    );
    let shown = json!(events).to_string();
    assert!(shown.contains("[redacted]"), "{shown}");
    let source_dir = host
        .data_dir
        .path()
        .join("agent-sessions")
        .join(&session_id);
    let raw = session_files(&source_dir).concat();
    assert!(
        raw.contains(provider_key) && raw.contains(anthropic_key),
        "pi's own file holds both (what the export and a clone are made from)"
    );
    for secret in [
        provider_key,
        anthropic_key,
        "Xy7kQ2mN9pR4sT6vW8zA1bC3dE5fG7hJ",
    ] {
        assert!(!shown.contains(secret), "an event carries {secret}");
    }

    let export = client
        .call(
            "session/export",
            json!({"sessionId": session_id, "maxBytes": 4 << 20}),
        )
        .await;
    let html = export["result"]["html"]
        .as_str()
        .unwrap_or_else(|| panic!("{export}"));
    assert_eq!(export["result"]["bytes"], html.len() as u64);
    let range = racp_proto::pi::export::session_data(html).expect("pi's session data");
    let bytes = base64::Engine::decode(
        &base64::engine::general_purpose::STANDARD,
        html[range].trim(),
    )
    .expect("still base64");
    let data: Value = serde_json::from_slice(&bytes).expect("still JSON");
    let data_text = data.to_string();
    assert!(
        data["entries"].as_array().is_some_and(|e| e.len() > 3),
        "{data_text}"
    );
    assert!(data_text.contains("real-pi-ok") && data_text.contains("[redacted]"));
    // pi's page around it is whole: its own script, as its template has it (pi puts it in
    // with JavaScript's String.replace, which writes the template's `$$` as `$`).
    let template = fixture_dir()
        .join("node_modules/@mariozechner/pi-coding-agent/dist/core/export-html/template.js");
    let script = std::fs::read_to_string(template)
        .unwrap()
        .replace("$$", "$");
    assert!(html.contains(script.trim()), "pi's script was changed");

    let cloned = client
        .call("session/clone", json!({"sessionId": session_id}))
        .await;
    let clone_id = cloned["result"]["session"]["sessionId"]
        .as_str()
        .unwrap_or_else(|| panic!("{cloned}"));
    let clone_files = session_files(&host.data_dir.path().join("agent-sessions").join(clone_id));
    assert!(
        !clone_files.is_empty(),
        "the clone's agent saved its branch"
    );
    let clone_text = clone_files.concat();
    assert!(clone_text.contains("real-pi-ok") && clone_text.contains("[redacted]"));
    for secret in [
        provider_key,
        anthropic_key,
        "Xy7kQ2mN9pR4sT6vW8zA1bC3dE5fG7hJ",
    ] {
        assert!(!html.contains(secret), "the export's page carries {secret}");
        assert!(
            !data_text.contains(secret),
            "the export's data carries {secret}"
        );
        assert!(
            !clone_text.contains(secret),
            "the clone's session file carries {secret}"
        );
    }
}

/// pi's edit tool changes a file of a git workspace (docs/protocol.md §8.9): the change on disk
/// arrives live as `workspace.changed` and again on resume from an older cursor, the turn's
/// `turn.finished` names the file with the edit's line counts, `workspace/diff` of the turn
/// shows the hunk, and `fs/read` the new content.
#[tokio::test]
async fn a_real_pi_edit_is_named_with_its_counts_and_its_diff_shows_the_hunk() {
    let stub = Stub::default();
    let (host, _pi_dir) = pi_host(&stub, None).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let ws = host.workspace("edited");
    std::fs::write(format!("{ws}/notes.txt"), "one\ntwo\n").unwrap();
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
            "1",
        ],
    ] {
        let git = std::process::Command::new("git")
            .args(args)
            .current_dir(&ws)
            .status()
            .unwrap();
        assert!(git.success());
    }
    let created = client
        .call("session/create", json!({"workspace": ws}))
        .await;
    let session = created["result"]["session"].clone();
    let session_id = session["sessionId"].as_str().unwrap().to_string();
    let start = session["cursor"].clone();
    let sub = client
        .call(
            "session/subscribe",
            json!({"sessionId": session_id, "cursor": start}),
        )
        .await;
    assert!(sub.get("result").is_some(), "{sub}");
    let turn = client
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "edit-1",
                   "text": format!("{} please", tests::pi::EDIT_NOTES)}),
        )
        .await;
    let turn_id = turn["result"]["turnId"]
        .as_str()
        .expect("turnId")
        .to_string();
    let changed = |e: &Value| {
        e["type"] == "workspace.changed"
            && e["data"]["changes"]
                .as_array()
                .is_some_and(|c| c.iter().any(|c| c["path"] == "notes.txt"))
    };
    let mut seen = events_until(&mut client, |e| e["type"] == "turn.finished").await;
    if !seen.iter().any(changed) {
        seen.extend(events_until(&mut client, changed).await);
    }
    let finished = seen.iter().find(|e| e["type"] == "turn.finished").unwrap();
    assert_eq!(finished["data"]["outcome"], "completed", "{finished}");
    let tool_end = seen
        .iter()
        .find(|e| e["type"] == "agent.tool_execution_end")
        .expect("the edit ran");
    assert_ne!(tool_end["data"]["isError"], true, "{tool_end}");
    assert_eq!(
        finished["data"]["files"],
        json!([{"path": "notes.txt", "kind": "modified", "added": 2, "removed": 1, "by": ["edit"]}])
    );
    let live: Vec<&Value> = seen.iter().filter(|e| changed(e)).collect();

    let diff = client
        .call(
            "workspace/diff",
            json!({"sessionId": session_id, "turnId": turn_id}),
        )
        .await;
    let text = diff["result"]["diff"].as_str().unwrap_or_default();
    assert!(text.contains("-two\n+TWO\n+three\n"), "{diff}");
    let read = client
        .call("fs/read", json!({"path": format!("{ws}/notes.txt")}))
        .await;
    assert_eq!(read["result"]["data"], "one\nTWO\nthree\n", "{read}");

    // Away during all of it: the same change on resume from the session's start.
    let mut away = connect(&host, &token).await;
    away.call(
        "session/subscribe",
        json!({"sessionId": session_id, "cursor": start}),
    )
    .await;
    let last = live.last().unwrap()["cursor"].clone();
    let replayed = events_until(&mut away, |e| e["cursor"] == last).await;
    let again: Vec<&Value> = replayed.iter().filter(|e| changed(e)).collect();
    assert_eq!(again, live);
}
