//! The bridge against the stand-in agent (`tests/src/bin/stand-in-agent.rs`), a real process that
//! speaks pi's RPC subset from a script in the prompt text; and the wire parsing on its own.

use super::protocol::{Line, LineReader, Parsed, parse_line};
use super::*;
use racp_proto::pi::{self, Kind};
use std::path::Path;
use tempfile::TempDir;
use tokio::io::BufReader;

/// Generous: a loaded 2-core machine is slow, not stuck.
const PATIENCE: Duration = Duration::from_secs(30);

fn stand_in_command() -> String {
    let path = ::tests::stand_in_agent();
    shell_words::quote(&path.to_string_lossy()).into_owned()
}

fn spec_in(dir: &Path, command: String) -> AgentSpec {
    AgentSpec {
        command,
        workspace: dir.to_path_buf(),
        env: vec![("STAND_IN_MARKER".into(), "1".into())],
        launch: None,
    }
}

async fn start_with(options: AgentOptions) -> (TempDir, Agent, mpsc::Receiver<AgentOutput>) {
    let dir = tempfile::tempdir().expect("temp dir");
    let spec = spec_in(dir.path(), stand_in_command());
    let (agent, rx) = Agent::spawn_with(&spec, options)
        .await
        .expect("spawn the stand-in agent");
    (dir, agent, rx)
}

async fn start() -> (TempDir, Agent, mpsc::Receiver<AgentOutput>) {
    start_with(AgentOptions::default()).await
}

async fn next(rx: &mut mpsc::Receiver<AgentOutput>) -> AgentOutput {
    tokio::time::timeout(PATIENCE, rx.recv())
        .await
        .expect("agent output in time")
        .expect("output channel open")
}

/// Everything up to and including the first output for which `done` holds.
async fn collect_until(
    rx: &mut mpsc::Receiver<AgentOutput>,
    done: impl Fn(&AgentOutput) -> bool,
) -> Vec<AgentOutput> {
    let mut seen = Vec::new();
    loop {
        let output = next(rx).await;
        let stop = done(&output);
        seen.push(output);
        if stop {
            return seen;
        }
        if let Some(AgentOutput::Exited { .. }) = seen.last() {
            panic!("agent exited early: {seen:#?}");
        }
    }
}

async fn until_kind(rx: &mut mpsc::Receiver<AgentOutput>, kind: &str) -> Vec<AgentOutput> {
    collect_until(rx, |output| output.kind() == kind).await
}

async fn until_exited(rx: &mut mpsc::Receiver<AgentOutput>) -> Vec<AgentOutput> {
    let mut seen = Vec::new();
    loop {
        let output = next(rx).await;
        let exited = matches!(output, AgentOutput::Exited { .. });
        seen.push(output);
        if exited {
            return seen;
        }
    }
}

fn kinds(outputs: &[AgentOutput]) -> Vec<&str> {
    outputs.iter().map(AgentOutput::kind).collect()
}

/// The payloads of the events of one kind, read as JSON.
fn payloads(outputs: &[AgentOutput], kind: &str) -> Vec<Value> {
    outputs
        .iter()
        .filter_map(|output| match output {
            AgentOutput::Event(event) if event.kind.as_str() == kind => Some(payload_of(event)),
            _ => None,
        })
        .collect()
}

fn payload_of(event: &super::AgentEvent) -> Value {
    serde_json::from_str(event.payload.get()).expect("a payload is JSON")
}

fn tool_result_text(end: &Value) -> String {
    end["result"]["content"][0]["text"]
        .as_str()
        .unwrap_or_default()
        .to_string()
}

/// Gone, or a zombie nobody reaped yet (it runs no more either way).
fn process_gone(pid: u32) -> bool {
    match std::fs::read_to_string(format!("/proc/{pid}/stat")) {
        Err(_) => true,
        Ok(stat) => stat
            .rsplit_once(')')
            .is_some_and(|(_, rest)| rest.trim_start().starts_with(['Z', 'X'])),
    }
}

async fn wait_gone(pid: u32) {
    let deadline = Instant::now() + PATIENCE;
    while !process_gone(pid) {
        assert!(Instant::now() < deadline, "process {pid} still runs");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn child_pid(outputs: &[AgentOutput]) -> u32 {
    let event = payloads(outputs, "stand_in_child");
    let pid = event
        .first()
        .and_then(|e| e["pid"].as_u64())
        .expect("child pid");
    u32::try_from(pid).expect("pid fits")
}

#[tokio::test]
async fn deltas_turn_streams_pi_events_in_order() {
    let (_dir, agent, mut rx) = start().await;
    let state = agent.get_state().await.expect("get_state");
    assert_eq!(state["isStreaming"], false);
    assert_eq!(state["messageCount"], 0);

    agent
        .prompt("deltas:5", &[])
        .await
        .expect("prompt accepted");
    let outputs = until_kind(&mut rx, "agent_end").await;
    let mut expected = vec![
        "agent_start",
        "turn_start",
        "message_start",
        "message_end",
        "message_start",
    ];
    expected.extend(["message_update"; 7]);
    expected.extend(["message_end", "turn_end", "agent_end"]);
    assert_eq!(kinds(&outputs), expected);

    let updates = payloads(&outputs, "message_update");
    let stages: Vec<&str> = updates
        .iter()
        .map(|u| u["assistantMessageEvent"]["type"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(stages[0], "text_start");
    assert_eq!(stages[6], "text_end");
    let text: String = updates
        .iter()
        .filter(|u| u["assistantMessageEvent"]["type"] == "text_delta")
        .map(|u| u["assistantMessageEvent"]["delta"].as_str().unwrap_or(""))
        .collect();
    assert_eq!(text, "chunk0 chunk1 chunk2 chunk3 chunk4 ");
    let ends = payloads(&outputs, "message_end");
    assert_eq!(ends[0]["message"]["role"], "user");
    assert_eq!(ends[1]["message"]["role"], "assistant");
    assert_eq!(ends[1]["message"]["stopReason"], "stop");
    assert_eq!(ends[1]["message"]["content"][0]["text"], text.as_str());
    let end = payloads(&outputs, "agent_end");
    assert_eq!(end[0]["messages"].as_array().map(Vec::len), Some(2));

    let state = agent.get_state().await.expect("get_state");
    assert_eq!(state["isStreaming"], false);
    assert_eq!(state["messageCount"], 2);

    agent.shutdown().await;
    let rest = until_exited(&mut rx).await;
    assert_eq!(kinds(&rest), ["exited"]);
    assert!(agent.exit_status().is_some());
    assert!(matches!(
        agent.prompt("deltas:1", &[]).await,
        Err(AgentError::Exited)
    ));
}

#[tokio::test]
async fn approvals_round_trip_and_the_tool_result_reflects_the_answer() {
    let (_dir, agent, mut rx) = start().await;
    let cases = [
        ("confirm", UiAnswer::Confirmed(true), false, "answer: true"),
        ("confirm", UiAnswer::Confirmed(false), true, "answer: false"),
        (
            "select",
            UiAnswer::Value("Allow".into()),
            false,
            "answer: Allow",
        ),
        (
            "select",
            UiAnswer::Value("Block".into()),
            true,
            "answer: Block",
        ),
        ("input", UiAnswer::Cancelled, true, "answer: cancelled"),
        (
            "editor",
            UiAnswer::Value("edited".into()),
            false,
            "answer: edited",
        ),
    ];
    let mut ids = Vec::new();
    for (method, answer, blocked, mention) in cases {
        agent
            .prompt(&format!("approve:{method}"), &[])
            .await
            .expect("prompt accepted");
        let before = until_kind(&mut rx, "extension_ui_request").await;
        assert!(
            kinds(&before).contains(&"tool_execution_start"),
            "{before:#?}"
        );
        let Some(AgentOutput::UiRequest(pi::Dialog {
            id,
            method: asked,
            title,
            options,
            timeout_ms,
            ..
        })) = before.last().cloned()
        else {
            panic!("expected a dialog, got {before:#?}");
        };
        assert_eq!(asked.as_str(), method);
        assert!(!title.is_empty());
        assert_eq!(timeout_ms, None);
        assert!(!id.is_empty());
        if method == "select" {
            assert_eq!(
                options,
                Some(vec!["Allow".to_string(), "Block".to_string()])
            );
        }
        assert!(!ids.contains(&id), "dialog ids are fresh");
        ids.push(id.clone());

        agent.answer_ui(&id, answer).await.expect("answer");
        let after = until_kind(&mut rx, "agent_end").await;
        let end = payloads(&after, "tool_execution_end");
        assert_eq!(end.len(), 1, "{after:#?}");
        assert_eq!(end[0]["isError"], blocked, "{method}: {}", end[0]);
        let text = tool_result_text(&end[0]);
        assert!(text.contains(mention), "{method}: {text}");
        assert_eq!(
            text.starts_with("Blocked"),
            blocked,
            "{method}: the result says whether the tool was blocked: {text}"
        );
        assert_eq!(
            payloads(&after, "tool_execution_update").is_empty(),
            blocked,
            "a blocked tool does not run"
        );
    }
    agent.shutdown().await;
}

#[tokio::test]
async fn a_dialog_timeout_is_reported_and_resolves_by_itself() {
    let (_dir, agent, mut rx) = start().await;
    agent
        .prompt("approve:confirm:50", &[])
        .await
        .expect("prompt");
    let before = until_kind(&mut rx, "extension_ui_request").await;
    let Some(AgentOutput::UiRequest(pi::Dialog { timeout_ms, .. })) = before.last() else {
        panic!("expected a dialog");
    };
    assert_eq!(*timeout_ms, Some(50));
    let after = until_kind(&mut rx, "agent_end").await;
    let end = payloads(&after, "tool_execution_end");
    assert_eq!(end[0]["isError"], true);
    assert!(tool_result_text(&end[0]).contains("timeout"));
    agent.shutdown().await;
}

#[tokio::test]
async fn abort_during_sleep_ends_the_run_as_aborted() {
    let (_dir, agent, mut rx) = start().await;
    agent
        .prompt("deltas:1 sleep:600000", &[])
        .await
        .expect("prompt");
    // The first assistant message has ended: the stand-in is now sleeping.
    collect_until(&mut rx, |o| {
        matches!(o, AgentOutput::Event(e)
            if e.kind == Kind::MessageEnd && payload_of(e)["message"]["role"] == "assistant")
    })
    .await;

    let busy = agent.prompt("deltas:1", &[]).await.expect_err("busy");
    assert!(busy.is_busy(), "{busy}");
    assert_eq!(busy.to_app_error().code(), ErrorCode::AgentBusy);
    let state = agent.get_state().await.expect("state while running");
    assert_eq!(state["isStreaming"], true);

    agent.abort().await.expect("abort");
    // pi answers abort only once idle, so the whole run has been read by now.
    let outputs = until_kind(&mut rx, "agent_end").await;
    assert_eq!(
        kinds(&outputs),
        [
            "turn_end",
            "turn_start",
            "message_start",
            "message_end",
            "turn_end",
            "agent_end"
        ]
    );
    let ends = payloads(&outputs, "message_end");
    assert_eq!(ends[0]["message"]["stopReason"], "aborted");
    assert_eq!(ends[0]["message"]["errorMessage"], "Request was aborted");

    // Idle again: a new prompt runs.
    agent
        .prompt("deltas:2", &[])
        .await
        .expect("prompt after abort");
    until_kind(&mut rx, "agent_end").await;
    agent.shutdown().await;
}

#[tokio::test]
async fn abort_mid_message_closes_the_message_as_aborted() {
    let (_dir, agent, mut rx) = start().await;
    agent.prompt("deltas:1000:200", &[]).await.expect("prompt");
    collect_until(&mut rx, |o| {
        matches!(o, AgentOutput::Event(e)
            if e.kind == Kind::MessageUpdate
                && payload_of(e)["assistantMessageEvent"]["type"] == "text_delta")
    })
    .await;
    agent.abort().await.expect("abort");
    let outputs = until_kind(&mut rx, "agent_end").await;
    let tail = &kinds(&outputs)[outputs.len() - 4..];
    assert_eq!(
        tail,
        ["message_update", "message_end", "turn_end", "agent_end"]
    );
    let text_end = payloads(&outputs, "message_update")
        .pop()
        .expect("text_end")
        .clone();
    assert_eq!(text_end["assistantMessageEvent"]["type"], "text_end");
    assert_eq!(text_end["message"]["stopReason"], "aborted");
    let end = payloads(&outputs, "message_end")[0].clone();
    assert_eq!(end["message"]["stopReason"], "aborted");
    assert_eq!(end["message"]["errorMessage"], "Request was aborted");
    assert!(
        end["message"]["content"][0]["text"]
            .as_str()
            .is_some_and(|t| t.starts_with("chunk0 "))
    );
    agent.shutdown().await;
}

#[tokio::test]
async fn steering_during_a_run_is_acknowledged_and_delivered() {
    let (_dir, agent, mut rx) = start().await;
    agent.prompt("approve:confirm", &[]).await.expect("prompt");
    let before = until_kind(&mut rx, "extension_ui_request").await;
    let Some(AgentOutput::UiRequest(pi::Dialog { id, .. })) = before.last().cloned() else {
        panic!("expected a dialog");
    };
    agent.steer("look at the tests").await.expect("steer");
    let queued = until_kind(&mut rx, "queue_update").await;
    let queue = payloads(&queued, "queue_update");
    assert_eq!(queue[0]["steering"][0], "look at the tests");

    agent
        .answer_ui(&id, UiAnswer::Confirmed(true))
        .await
        .expect("answer");
    let after = until_kind(&mut rx, "agent_end").await;
    let users: Vec<Value> = payloads(&after, "message_end")
        .into_iter()
        .filter(|m| m["message"]["role"] == "user")
        .collect();
    assert_eq!(users.len(), 1);
    assert_eq!(
        users[0]["message"]["content"][0]["text"],
        "look at the tests"
    );
    let replies: Vec<String> = payloads(&after, "message_end")
        .into_iter()
        .filter_map(|m| {
            m["message"]["content"][0]["text"]
                .as_str()
                .map(str::to_owned)
        })
        .collect();
    assert!(
        replies.iter().any(|r| r == "steered: look at the tests"),
        "{replies:?}"
    );
    agent.shutdown().await;
}

#[tokio::test]
async fn a_failed_turn_is_reported_like_pi() {
    let (_dir, agent, mut rx) = start().await;
    agent
        .prompt("deltas:1 fail deltas:3", &[])
        .await
        .expect("prompt");
    let outputs = until_kind(&mut rx, "agent_end").await;
    let ends = payloads(&outputs, "message_end");
    let last = ends.last().expect("assistant message");
    assert_eq!(last["message"]["stopReason"], "error");
    assert!(last["message"]["errorMessage"].as_str().is_some());
    assert_eq!(
        payloads(&outputs, "turn_end")
            .last()
            .map(|t| &t["message"]["stopReason"]),
        Some(&json!("error"))
    );
    // Directives after `fail` do not run.
    let deltas = payloads(&outputs, "message_update")
        .iter()
        .filter(|u| u["assistantMessageEvent"]["type"] == "text_delta")
        .count();
    assert_eq!(deltas, 1);
    agent.shutdown().await;
}

#[tokio::test]
async fn a_crash_reports_exit_status_and_stderr_tail() {
    let (_dir, agent, mut rx) = start().await;
    agent.prompt("deltas:2 crash", &[]).await.expect("prompt");
    let outputs = until_exited(&mut rx).await;
    assert_eq!(kinds(&outputs)[0], "agent_start");
    assert!(!kinds(&outputs).contains(&"agent_end"));
    let Some(AgentOutput::Exited {
        status,
        signal,
        stderr_tail,
    }) = outputs.last()
    else {
        panic!("no exit");
    };
    assert_eq!(*status, Some(3));
    assert_eq!(*signal, None);
    assert!(
        stderr_tail.contains("stand-in-agent: scripted crash"),
        "{stderr_tail:?}"
    );
    assert_eq!(agent.exit_status().map(|e| e.code), Some(Some(3)));
    assert!(matches!(
        agent.prompt("deltas:1", &[]).await,
        Err(AgentError::Exited)
    ));
    assert!(matches!(agent.get_state().await, Err(AgentError::Exited)));
    assert_eq!(
        AgentError::Exited.to_app_error().code(),
        ErrorCode::AgentSidecarCrashed
    );
    // Shutting down an agent that is gone is fine.
    agent.shutdown().await;
}

fn hex(text: &str) -> String {
    text.bytes().map(|b| format!("{b:02x}")).collect()
}

/// What the bridge hands on is redacted: every payload, the `errorMessage` the turn's verdict
/// is read from, and the stderr tail.
#[tokio::test]
async fn what_the_agent_writes_is_redacted_before_it_is_read() {
    let redactor = crate::redact::Redactor::default();
    redactor.set_secrets(vec!["opaque.Value-7Kq2Xw".into()]);
    let options = AgentOptions {
        redactor,
        ..Default::default()
    };
    let (_dir, agent, mut rx) = start_with(options.clone()).await;
    let said = "401 key opaque.Value-7Kq2Xw via https://u:Pa55w0rd9@proxy:8080";
    let script = format!("sayhex:{} failhex:{}", hex(said), hex(said));
    agent.prompt(&script, &[]).await.expect("prompt");
    let outputs = collect_until(&mut rx, |o| o.kind() == "agent_end").await;
    let mut ends = 0;
    for output in &outputs {
        if let AgentOutput::Event(event) = output {
            let payload = event.payload.get();
            assert!(!payload.contains("opaque.Value"), "{payload}");
            assert!(!payload.contains("Pa55w0rd9"), "{payload}");
            if let Some(end) = &event.run_end {
                let message = end.error_message.as_deref().unwrap_or_default();
                assert_eq!(
                    message,
                    "401 key [redacted] via https://[redacted]@proxy:8080"
                );
                ends += 1;
            }
        }
    }
    assert_eq!(ends, 1);
    agent.shutdown().await;

    let (_dir, agent, mut rx) = start_with(options).await;
    agent
        .prompt(&format!("crashhex:{}", hex(said)), &[])
        .await
        .expect("prompt");
    let outputs = until_exited(&mut rx).await;
    let Some(AgentOutput::Exited { stderr_tail, .. }) = outputs.last() else {
        panic!("no exit");
    };
    assert_eq!(
        stderr_tail,
        "stand-in-agent: 401 key [redacted] via https://[redacted]@proxy:8080\n"
    );
}

#[test]
fn a_cut_stderr_tail_starts_at_a_line() {
    let mut tail = Tail::new(24);
    tail.push(b"Authorization: Bearer abcdef0123456789\nnext line\n");
    // The cut falls inside the token: its first half would not look like a credential.
    assert_eq!(tail.text(), "next line\n");
}

#[tokio::test]
async fn the_stderr_tail_is_bounded() {
    let (_dir, agent, mut rx) = start().await;
    agent
        .prompt("stderr:100000 crash", &[])
        .await
        .expect("prompt");
    let outputs = until_exited(&mut rx).await;
    let Some(AgentOutput::Exited { stderr_tail, .. }) = outputs.last() else {
        panic!("no exit");
    };
    assert!(
        stderr_tail.len() <= STDERR_TAIL_BYTES,
        "{}",
        stderr_tail.len()
    );
    assert!(stderr_tail.ends_with("stand-in-agent: scripted crash\n"));
    drop(agent);
}

#[tokio::test]
async fn a_missing_or_unusable_command_is_unavailable() {
    let dir = tempfile::tempdir().expect("temp dir");
    let not_executable = dir.path().join("agent.sh");
    std::fs::write(&not_executable, "#!/bin/sh\n").expect("write");
    let commands = [
        "definitely-not-an-agent-7f3a --mode rpc".to_string(),
        "/nonexistent/dir/pi --mode rpc".to_string(),
        shell_words::quote(&not_executable.to_string_lossy()).into_owned(),
        String::new(),
        "pi 'unterminated".to_string(),
    ];
    for command in commands {
        let spec = spec_in(dir.path(), command.clone());
        match Agent::spawn(&spec).await {
            Err(err @ AgentError::Unavailable { .. }) => {
                let AgentError::Unavailable {
                    reason, suggestion, ..
                } = &err
                else {
                    unreachable!()
                };
                assert!(!reason.is_empty() && !suggestion.is_empty());
                let app = err.to_app_error();
                assert_eq!(app.code(), ErrorCode::AgentUnavailable, "{command}");
                assert_eq!(app.origin(), ErrorSource::Agent);
            }
            Err(other) => panic!("{command:?}: {other}"),
            Ok(_) => panic!("{command:?} started"),
        }
    }
    let missing = AgentSpec {
        workspace: dir.path().join("no-such-workspace"),
        ..spec_in(dir.path(), stand_in_command())
    };
    assert!(matches!(
        Agent::spawn(&missing).await,
        Err(AgentError::Workspace { .. })
    ));
}

#[tokio::test]
async fn shutdown_ends_the_whole_process_tree() {
    let (_dir, agent, mut rx) = start().await;
    agent.prompt("spawn-child hang", &[]).await.expect("prompt");
    let outputs = until_kind(&mut rx, "stand_in_child").await;
    let child = child_pid(&outputs);
    assert!(!process_gone(child), "the child runs");
    let leader = agent.pid();

    agent.shutdown().await;
    assert!(agent.exit_status().is_some());
    wait_gone(child).await;
    wait_gone(leader).await;
    let rest = until_exited(&mut rx).await;
    assert!(matches!(rest.last(), Some(AgentOutput::Exited { .. })));
}

#[tokio::test]
async fn a_crash_with_a_child_holding_the_pipes_still_exits_cleanly() {
    let (_dir, agent, mut rx) = start().await;
    agent
        .prompt("spawn-child:inherit deltas:1 crash", &[])
        .await
        .expect("prompt");
    let outputs = until_exited(&mut rx).await;
    let child = child_pid(&outputs);
    let Some(AgentOutput::Exited { status, .. }) = outputs.last() else {
        panic!("no exit");
    };
    assert_eq!(*status, Some(3));
    wait_gone(child).await;
    drop(agent);
}

#[tokio::test]
async fn dropping_the_last_handle_kills_the_agent() {
    let (_dir, agent, mut rx) = start().await;
    agent.prompt("spawn-child hang", &[]).await.expect("prompt");
    let outputs = until_kind(&mut rx, "stand_in_child").await;
    let child = child_pid(&outputs);
    let leader = agent.pid();
    let clone = agent.clone();
    drop(agent);
    assert!(!process_gone(leader), "a clone keeps it alive");
    drop(clone);
    let rest = until_exited(&mut rx).await;
    let Some(AgentOutput::Exited { signal, .. }) = rest.last() else {
        panic!("no exit");
    };
    assert_eq!(*signal, Some(Signal::SIGKILL as i32));
    wait_gone(child).await;
}

#[tokio::test]
async fn bad_lines_are_reported_and_skipped() {
    let options = AgentOptions {
        max_line_bytes: 100_000,
        ..AgentOptions::default()
    };
    let (_dir, agent, mut rx) = start_with(options).await;
    // `big:40000`: its text_delta and text_end lines carry the text three times (delta or
    // content, `message`, `partial`), so they are over the bound; message_end, turn_end and
    // agent_end carry it once and are not.
    agent
        .prompt("garbage big:40000 notify deltas:1", &[])
        .await
        .expect("prompt");
    let outputs = until_kind(&mut rx, "agent_end").await;
    let invalid = payloads(&outputs, "invalid_output");
    assert_eq!(invalid.len(), 3, "{invalid:#?}");
    assert_eq!(invalid[0]["line"], "this is not JSON {");
    assert_eq!(invalid[0]["bytes"], "this is not JSON {".len());
    for too_long in &invalid[1..] {
        assert!(too_long["bytes"].as_u64().is_some_and(|b| b > 100_000));
        // Only the head of an over-long line is kept: enough to see its type.
        assert!(
            too_long["line"]
                .as_str()
                .is_some_and(|l| !l.is_empty() && l.len() <= 64)
        );
    }
    assert!(outputs.iter().any(|o| matches!(o,
        AgentOutput::UiNotice { method, .. } if method == "notify")));
    let big = payloads(&outputs, "message_end")
        .into_iter()
        .any(|m| m["message"]["content"][0]["text"].as_str().map(str::len) == Some(40_000));
    assert!(big, "the run went on after the dropped lines");
    agent.shutdown().await;
}

/// An answer longer than the line bound is dropped unread; its caller, named by the line's
/// head (pi writes a response's `id` first), fails at once rather than at its timeout, and the
/// answer just within the bound is read whole.
#[tokio::test]
async fn an_answer_over_the_line_bound_fails_its_caller_at_once() {
    let bound = 4096;
    let options = AgentOptions {
        max_line_bytes: bound,
        ..AgentOptions::default()
    };
    let (_dir, agent, _rx) = start_with(options).await;
    // The stand-in answers `bash` with `stand-in ran: COMMAND`: the line is the command plus
    // what surrounds it.
    let probe = agent
        .call(&PiCommand::Bash { command: "x" })
        .await
        .expect("a short answer");
    let around = serde_json::to_string(&json!({"id": "pi-host-1", "type": "response",
        "command": "bash", "success": true, "data": probe}))
    .unwrap()
    .len()
        - 1;
    let within = "x".repeat(bound - around);
    let answer = agent
        .call(&PiCommand::Bash { command: &within })
        .await
        .expect("an answer exactly at the bound");
    assert!(answer["output"].as_str().unwrap().contains(&within));
    let over = "x".repeat(bound - around + 1);
    let began = Instant::now();
    match agent
        .call_within(&PiCommand::Bash { command: &over }, PATIENCE * 2)
        .await
    {
        Err(AgentError::TooLong {
            command,
            bytes,
            bound: limit,
        }) => {
            assert_eq!((command.as_str(), bytes, limit), ("bash", bound + 1, bound));
        }
        other => panic!("{other:?}"),
    }
    assert!(began.elapsed() < PATIENCE, "failed at once");
    // The agent goes on.
    agent.get_state().await.expect("state after the cut answer");
    agent.shutdown().await;
}

#[tokio::test]
async fn a_slow_reader_loses_nothing() {
    let options = AgentOptions {
        output_capacity: 4,
        ..AgentOptions::default()
    };
    let (_dir, agent, mut rx) = start_with(options).await;
    agent.prompt("burst:3000", &[]).await.expect("prompt");
    // The agent is held back by the full channel; get_state waits behind the backlog and times
    // out only if nobody reads, so read everything first.
    let outputs = until_kind(&mut rx, "agent_end").await;
    let deltas: Vec<String> = payloads(&outputs, "message_update")
        .iter()
        .map(|u| {
            u["assistantMessageEvent"]["delta"]
                .as_str()
                .unwrap_or("")
                .to_string()
        })
        .collect();
    assert_eq!(deltas.len(), 3000);
    assert!(
        deltas
            .iter()
            .enumerate()
            .all(|(i, d)| *d == format!("b{i} "))
    );
    agent.get_state().await.expect("state after the burst");
    agent.shutdown().await;
}

#[tokio::test]
async fn a_silent_agent_times_out() {
    let dir = tempfile::tempdir().expect("temp dir");
    let options = AgentOptions {
        response_timeout: Duration::from_millis(200),
        ..AgentOptions::default()
    };
    let spec = spec_in(dir.path(), "sleep 1000".to_string());
    let (agent, mut rx) = Agent::spawn_with(&spec, options).await.expect("spawn");
    match agent.get_state().await {
        Err(AgentError::Timeout { command, .. }) => assert_eq!(command, "get_state"),
        other => panic!("{other:?}"),
    }
    let pid = agent.pid();
    agent.shutdown().await;
    wait_gone(pid).await;
    let rest = until_exited(&mut rx).await;
    let Some(AgentOutput::Exited { signal, .. }) = rest.last() else {
        panic!("no exit");
    };
    assert_eq!(*signal, Some(Signal::SIGTERM as i32));
}

#[tokio::test]
async fn line_reader_frames_on_lf_only_and_bounds_lines() {
    let input: &[u8] = b"{\"a\":\"x\xe2\x80\xa8y\"}\r\nshort\n0123456789abcdef\nok\nlast";
    // A tiny buffer makes every line span several reads.
    let mut reader = LineReader::new(BufReader::with_capacity(3, input), 10);
    let mut lines = Vec::new();
    while let Some(line) = reader.next_line().await.expect("read") {
        lines.push(line);
    }
    let shapes: Vec<(Option<usize>, Vec<u8>)> = lines
        .into_iter()
        .map(|line| match line {
            Line::TooLong { bytes, head } => (Some(bytes), head),
            Line::Text(text) => (None, text),
        })
        .collect();
    assert_eq!(
        shapes,
        [
            (Some(14), b"{\"a\":\"x\xe2\x80\xa8y\"}\r"[..12].to_vec()),
            (None, b"short".to_vec()),
            (Some(16), b"0123456789ab".to_vec()),
            (None, b"ok".to_vec()),
            (None, b"last".to_vec()),
        ]
    );
    let mut reader = LineReader::new(BufReader::with_capacity(4, input), 100);
    let Some(Line::Text(first)) = reader.next_line().await.expect("read") else {
        panic!("a line");
    };
    // U+2028 stays inside the record; the trailing CR goes.
    assert_eq!(first, "{\"a\":\"x\u{2028}y\"}".as_bytes());
}

#[test]
fn lines_are_classified_like_pi_means_them() {
    let parse = |line: &str| parse_line(line.as_bytes());
    assert!(parse("  ").is_none());
    match parse(
        r#"{"id":"pi-host-1","type":"response","command":"get_state","success":true,"data":{}}"#,
    ) {
        Some(Parsed::Reply { id, reply }) => {
            assert_eq!(id, "pi-host-1");
            assert!(reply.response.success);
        }
        other => panic!("{other:?}"),
    }
    match parse(
        r#"{"type":"response","command":"nope","success":false,"error":"Unknown command: nope"}"#,
    ) {
        Some(Parsed::Output(AgentOutput::Response { response, .. })) => {
            assert_eq!(response.command, "nope");
            assert!(!response.success);
            assert_eq!(response.error.as_deref(), Some("Unknown command: nope"));
        }
        other => panic!("{other:?}"),
    }
    match parse(
        r#"{"type":"extension_ui_request","id":"u1","method":"confirm","title":"T","message":"M","timeout":5000}"#,
    ) {
        Some(Parsed::Output(AgentOutput::UiRequest(pi::Dialog {
            id,
            method,
            title,
            message,
            timeout_ms,
            ..
        }))) => {
            assert_eq!(
                (
                    id.as_str(),
                    method,
                    title.as_str(),
                    message.as_deref(),
                    timeout_ms
                ),
                ("u1", UiMethod::Confirm, "T", Some("M"), Some(5000))
            );
        }
        other => panic!("{other:?}"),
    }
    // A select's choices that are not strings are kept as the agent wrote them.
    match parse(
        r#"{"type":"extension_ui_request","id":"u3","method":"select","title":"T","options":["a",18446744073709551616,1E5,{"k":[1,-0.0]}]}"#,
    ) {
        Some(Parsed::Output(AgentOutput::UiRequest(pi::Dialog { options, .. }))) => {
            assert_eq!(
                options.unwrap(),
                ["a", "18446744073709551616", "1E5", r#"{"k":[1,-0.0]}"#]
            );
        }
        other => panic!("{other:?}"),
    }
    match parse(r#"{"type":"extension_ui_request","id":"u2","method":"setStatus","statusKey":"k"}"#)
    {
        Some(Parsed::Output(AgentOutput::UiNotice { method, .. })) => {
            assert_eq!(method, "setStatus")
        }
        other => panic!("{other:?}"),
    }
    match parse(r#"{"type":"extension_ui_request","method":"confirm","title":"no id"}"#) {
        Some(Parsed::Output(output)) => assert_eq!(output.kind(), "invalid_output"),
        other => panic!("{other:?}"),
    }
    for bad in ["not json", "[1,2]", r#"{"no":"type"}"#, "\"str\""] {
        match parse(bad) {
            Some(Parsed::Output(output)) => assert_eq!(output.kind(), "invalid_output", "{bad}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
    match parse(r#"{"type":"auto_retry_start","attempt":1}"#) {
        Some(Parsed::Output(AgentOutput::Event(event))) => {
            assert_eq!(event.kind, Kind::AutoRetryStart);
            assert_eq!(
                event.payload.get(),
                r#"{"type":"auto_retry_start","attempt":1}"#
            );
            assert!(event.run_end.is_none());
        }
        other => panic!("{other:?}"),
    }
}

#[test]
fn the_stderr_tail_keeps_the_last_bytes_on_a_char_boundary() {
    let mut tail = Tail::new(8);
    for _ in 0..1000 {
        tail.push("é".as_bytes());
    }
    tail.push(b"end");
    let text = tail.text();
    assert!(text.ends_with("end"));
    assert!(text.len() <= 8);
    assert!(!text.contains('\u{fffd}'));
}

/// An agent that does not know a command (an older pi) gives CAPABILITY_UNAVAILABLE naming the
/// feature, so a client can hide it (docs/protocol.md §7.1).
#[test]
fn an_unknown_command_names_the_capability_it_serves() {
    for (command, capability) in [
        ("bash", Some("shell")),
        ("compact", Some("compaction")),
        ("frobnicate", None),
    ] {
        let error = AgentError::Rejected {
            command: command.into(),
            message: format!("Unknown command: {command}"),
        }
        .to_app_error();
        assert_eq!(error.code(), ErrorCode::CapabilityUnavailable);
        let details = error.details().unwrap();
        assert_eq!(details["command"], command);
        assert_eq!(details["capability"].as_str(), capability);
        if let Some(capability) = capability {
            assert!(error.message().contains(capability), "{error:?}");
        }
    }
}
