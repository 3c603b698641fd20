//! A session's shell commands, totals, slash commands and export end to end with the REAL pi
//! agent and the stub model (docs/protocol.md §7.27-§7.30): a shell command's output joins the
//! history and the model's next request, the totals match the usage the stub reported, a
//! prompt template of the workspace is listed and expands in a turn, and the export holds the
//! conversation.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use base64::Engine;
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};
use tests::pi::{STUB_USAGE, Stub, pi_cli, pi_config, pi_env, pi_words, start_stub};
use tests::{Client, HostProcess};

/// How long any single wait may take: pi starts in about 2 s, but a loaded 2-core machine is slow.
const WAIT: Duration = Duration::from_secs(90);

/// A host whose real pi keeps its session file (an export needs one) and loads the workspace's
/// prompt templates: `pi_words` without `--no-session` and `--no-prompt-templates`.
async fn host(stub: &Stub) -> (HostProcess, tempfile::TempDir) {
    let port = start_stub(stub.clone()).await;
    let pi_dir = pi_config(port);
    let words: Vec<String> = pi_words(&pi_cli(), None)
        .into_iter()
        .filter(|w| w != "--no-session" && w != "--no-prompt-templates")
        .collect();
    let agent = shell_words::join(words);
    let env = pi_env(pi_dir.path());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    // The stub's bash call runs unasked (tests/permissions.rs tests the policy).
    let args = ["--agent", &agent, "--permission-mode", "auto"];
    let host = HostProcess::start_with_env(&tests::pi_host_binary(), &args, &env).await;
    (host, pi_dir)
}

async fn connect(host: &HostProcess, token: &str) -> Client {
    let mut client = Client::connect(&host.url(), token).await.unwrap();
    client.hello().await;
    client
}

async fn call_ok(client: &mut Client, method: &str, params: Value) -> Value {
    let reply = client.call(method, params).await;
    reply
        .get("result")
        .cloned()
        .unwrap_or_else(|| panic!("{method} failed: {reply}"))
}

/// Runs a turn and waits for its end; returns its events.
async fn turn(client: &mut Client, session_id: &str, key: &str, text: &str) -> Vec<Value> {
    call_ok(
        client,
        "turn/start",
        json!({"sessionId": session_id, "idempotencyKey": key, "text": text}),
    )
    .await;
    let events = client
        .events_until(WAIT, |e| e["type"] == "turn.finished")
        .await;
    assert_eq!(
        events.last().unwrap()["data"]["outcome"],
        "completed",
        "{events:#?}"
    );
    events
}

/// Every text of the request's messages, joined.
fn request_text(request: &Value) -> String {
    request["messages"].to_string()
}

/// The conversation pi's HTML page carries: its `session-data` script, base64-encoded JSON.
fn exported_session(html: &str) -> String {
    let start = html
        .find(r#"<script id="session-data" type="application/json">"#)
        .expect("the session-data script");
    let rest = &html[start..];
    let data = &rest[rest.find('>').unwrap() + 1..rest.find("</script>").unwrap()];
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(data.trim())
        .expect("base64 session data");
    String::from_utf8(bytes).expect("UTF-8 session data")
}

/// Waits until `path` exists: the shell command got that far.
async fn until_exists(path: &Path) {
    let began = Instant::now();
    while !path.exists() {
        assert!(began.elapsed() < WAIT, "{} never appeared", path.display());
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_shell_command_joins_the_history_the_context_the_stats_and_the_export() {
    let stub = Stub::default();
    let (host, _pi_dir) = host(&stub).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let (_, observer_token) = host.pair_device("phone", &["--roles", "observer"]).await;
    let mut client = connect(&host, &token).await;
    let workspace = host.workspace("w");
    let session_id = client.open_session(&workspace).await;

    // The shell command's result, its event, and its history entry.
    let ran = call_ok(
        &mut client,
        "session/bash",
        json!({"sessionId": session_id, "command": "echo shell-marker-42; exit 3"}),
    )
    .await;
    assert_eq!(ran["output"], "shell-marker-42\n", "{ran}");
    assert_eq!(ran["exitCode"], 3, "{ran}");
    assert_eq!(
        (ran["cancelled"].clone(), ran["truncated"].clone()),
        (json!(false), json!(false))
    );
    // Committed before the call answered: read to the head, where it must be.
    let events = client.events_to_head(&session_id, None).await;
    let event = events
        .iter()
        .rev()
        .find(|e| e["type"] == "session.bash")
        .unwrap_or_else(|| panic!("no session.bash: {events:#?}"));
    assert_eq!(event["data"]["role"], "bashExecution", "{event}");
    assert_eq!(event["data"]["command"], "echo shell-marker-42; exit 3");
    assert_eq!(event["data"]["output"], "shell-marker-42\n");
    let history = call_ok(
        &mut client,
        "session/history",
        json!({"sessionId": session_id}),
    )
    .await;
    assert_eq!(history["entries"].as_array().unwrap().len(), 1, "{history}");
    assert_eq!(
        history["entries"][0], *event,
        "the entry is the event as delivered"
    );

    // The model sees it with the next prompt (pi adds it to the context).
    turn(&mut client, &session_id, "k1", "Run the check.").await;
    let first = stub.requests.lock().unwrap()[0].clone();
    assert!(
        request_text(&first).contains("shell-marker-42"),
        "the model's request: {first}"
    );

    // The totals match the usage the stub reported, once per reply (a tool call, an answer).
    let (input, output, cache_read, cache_write, cost) = STUB_USAGE;
    let replies = stub.requests.lock().unwrap().len() as u64;
    assert_eq!(replies, 2);
    let mut observer = connect(&host, &observer_token).await;
    let stats = call_ok(
        &mut observer,
        "session/stats",
        json!({"sessionId": session_id}),
    )
    .await;
    let tokens = &stats["tokens"];
    assert_eq!(tokens["input"], input * replies, "{stats}");
    assert_eq!(tokens["output"], output * replies, "{stats}");
    assert_eq!(tokens["cacheRead"], cache_read * replies, "{stats}");
    assert_eq!(tokens["cacheWrite"], cache_write * replies, "{stats}");
    assert_eq!(
        tokens["total"],
        (input + output + cache_read + cache_write) * replies
    );
    let total_cost = stats["cost"].as_f64().unwrap();
    assert!((total_cost - cost * replies as f64).abs() < 1e-9, "{stats}");
    let counts = [
        "userMessages",
        "assistantMessages",
        "toolCalls",
        "toolResults",
        "shellCommands",
        "totalMessages",
    ]
    .map(|k| stats[k].as_u64().unwrap());
    assert_eq!(counts, [1, 2, 1, 1, 1, 5], "{stats}");
    assert_eq!(
        stats["contextUsage"]["contextWindow"], 32000,
        "the agent runs: {stats}"
    );

    // The export holds the conversation: the prompt, the reply and the shell command.
    let export = call_ok(
        &mut observer,
        "session/export",
        json!({"sessionId": session_id}),
    )
    .await;
    let html = export["html"].as_str().unwrap();
    assert_eq!(export["bytes"], html.len() as u64);
    assert!(html.starts_with("<!DOCTYPE html>"), "{}", &html[..100]);
    let conversation = exported_session(html);
    for text in ["Run the check.", "the check passed.", "shell-marker-42"] {
        assert!(conversation.contains(text), "{text} not in the export");
    }
    // Each session's agent writes its export in a folder of its own, emptied after.
    let exports = host.data_dir.path().join("exports").join(&session_id);
    let left = std::fs::read_dir(&exports).map_or(0, |d| d.count());
    assert_eq!(left, 0, "the export file is deleted");
    let small = observer
        .call(
            "session/export",
            json!({"sessionId": session_id, "maxBytes": 4096}),
        )
        .await;
    assert_eq!(small["error"]["code"], "PAYLOAD_TOO_LARGE", "{small}");
    assert_eq!(small["error"]["details"]["reason"], "export_too_large");

    // One shell command at a time; an abort ends the running one as cancelled.
    let marker = Path::new(&workspace).join("started");
    let mut runner = connect(&host, &token).await;
    let session = session_id.clone();
    let long = tokio::spawn(async move {
        runner
            .call(
                "session/bash",
                json!({"sessionId": session, "command": "touch started; sleep 120"}),
            )
            .await
    });
    until_exists(&marker).await;
    let busy = client
        .call(
            "session/bash",
            json!({"sessionId": session_id, "command": "true"}),
        )
        .await;
    assert_eq!(busy["error"]["code"], "AGENT_BUSY", "{busy}");
    call_ok(
        &mut client,
        "session/bash_abort",
        json!({"sessionId": session_id}),
    )
    .await;
    let aborted = long.await.unwrap();
    assert_eq!(aborted["result"]["cancelled"], true, "{aborted}");
    let nothing = call_ok(
        &mut client,
        "session/bash_abort",
        json!({"sessionId": session_id}),
    )
    .await;
    assert_eq!(nothing, json!({}));

    // A closed session refuses a shell command, and still has its totals, without an agent.
    call_ok(
        &mut client,
        "session/close",
        json!({"sessionId": session_id}),
    )
    .await;
    let refused = client
        .call(
            "session/bash",
            json!({"sessionId": session_id, "command": "true"}),
        )
        .await;
    assert_eq!(refused["error"]["code"], "CONFLICT", "{refused}");
    let closed = call_ok(
        &mut observer,
        "session/stats",
        json!({"sessionId": session_id}),
    )
    .await;
    assert_eq!(closed["shellCommands"], 2, "{closed}");
    assert_eq!(closed["tokens"], stats["tokens"]);
    assert!(closed.get("contextUsage").is_none(), "{closed}");
}

#[tokio::test]
async fn a_workspace_prompt_template_is_listed_and_expands_in_a_turn() {
    let stub = Stub::default();
    let (host, _pi_dir) = host(&stub).await;
    let workspace = host.workspace("w");
    let prompts = Path::new(&workspace).join(".pi").join("prompts");
    std::fs::create_dir_all(&prompts).unwrap();
    std::fs::write(
        prompts.join("greet.md"),
        "---\ndescription: Greet someone\n---\nSay hello to $1 with the code word TEMPLATE-EXPANDED.\n",
    )
    .unwrap();
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = connect(&host, &token).await;
    let session_id = client.open_session(&workspace).await;

    // An operator's call: it starts the agent if the warm start has not yet (an observer's
    // would use only a running one, docs/protocol.md §6.1).
    let listed = call_ok(
        &mut client,
        "session/commands",
        json!({"sessionId": session_id}),
    )
    .await;
    let commands = listed["commands"].as_array().unwrap();
    let greet = commands
        .iter()
        .find(|c| c["name"] == "greet")
        .unwrap_or_else(|| panic!("no greet in {listed}"));
    assert_eq!(greet["source"], "prompt", "{greet}");
    assert_eq!(greet["description"], "Greet someone", "{greet}");
    assert_eq!(greet["location"], "project", "{greet}");

    // Nothing said yet: pi has no session file to export.
    let empty = client
        .call("session/export", json!({"sessionId": session_id}))
        .await;
    assert_eq!(empty["error"]["code"], "CONFLICT", "{empty}");

    let events = turn(&mut client, &session_id, "k1", "/greet Ada").await;
    let started = events.iter().find(|e| e["type"] == "turn.started").unwrap();
    assert_eq!(started["data"]["text"], "/greet Ada", "the prompt as typed");
    let first = stub.requests.lock().unwrap()[0].clone();
    let text = request_text(&first);
    assert!(
        text.contains("Say hello to Ada with the code word TEMPLATE-EXPANDED."),
        "the model's request: {first}"
    );
    assert!(!text.contains("/greet Ada"), "expanded: {first}");
}
