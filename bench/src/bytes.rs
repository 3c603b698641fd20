//! Bytes per reply (docs/benchmarks.md): what one streamed reply costs as the agent writes it
//! (the stand-in writes pi's own shapes: every `message_update` with the whole message so far,
//! every tool update with the whole output window), on the wire to one subscriber, and in the
//! host's store.

use crate::host::{PiHost, Tools, create_session, start_turn, wait_idle};
use crate::racp::{self, Control};
use anyhow::{Context, Result, bail};
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio_tungstenite::tungstenite::Message;

const TURN_TIMEOUT: Duration = Duration::from_secs(120);

/// The replies measured: (label, stand-in directive).
const CASES: &[(&str, &str)] = &[
    ("text, 100 deltas", "deltas:100"),
    ("text, 1 000 deltas", "deltas:1000"),
    ("text, 5 000 deltas", "deltas:5000"),
    ("tool output, 1 MB", "output:1000000"),
];

pub async fn bytes_per_reply(tools: &Tools, disk_dir: &Path) -> Result<Value> {
    let host = PiHost::start(tools, disk_dir, &[]).await?;
    let outcome = async {
        let token = host.pair_device().await?;
        let mut rows = Vec::new();
        for (label, directive) in CASES {
            let raw = agent_stdout(&tools.agent, directive).await?;
            let through = through_host(&host, &token, directive).await?;
            rows.push(json!({
                "case": label,
                "directive": directive,
                "reply_bytes": raw.reply,
                "agent_stdout": raw.stdout,
                "wire": through.wire,
                "stored": through.stored,
                "events": through.events,
            }));
        }
        Ok(json!({"cases": rows}))
    }
    .await;
    host.stop().await;
    outcome
}

struct Raw {
    stdout: u64,
    /// The reply's own bytes: the assistant text, or the tool's whole output.
    reply: u64,
}

/// Runs the stand-in alone and counts what it writes for one prompt, up to `agent_end`.
async fn agent_stdout(agent: &Path, directive: &str) -> Result<Raw> {
    let mut child = tokio::process::Command::new(agent)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("start {}", agent.display()))?;
    let mut stdin = child.stdin.take().context("agent stdin")?;
    let prompt = json!({"id": "1", "type": "prompt", "message": directive});
    stdin.write_all(format!("{prompt}\n").as_bytes()).await?;
    stdin.flush().await?;
    let mut lines = BufReader::new(child.stdout.take().context("agent stdout")?).lines();
    let (mut stdout, mut reply) = (0u64, 0u64);
    let read = async {
        while let Some(line) = lines.next_line().await? {
            stdout += line.len() as u64 + 1;
            let event: Value = serde_json::from_str(&line).unwrap_or(Value::Null);
            match event["type"].as_str() {
                Some("message_end") if event["message"]["role"] == "assistant" => {
                    reply += event["message"]["content"].as_array().map_or(0, |c| {
                        c.iter()
                            .filter_map(|b| b["text"].as_str())
                            .map(str::len)
                            .sum::<usize>()
                    }) as u64;
                }
                Some("tool_execution_start") => {
                    let command = event["args"]["command"].as_str().unwrap_or_default();
                    reply += command
                        .rsplit(' ')
                        .next()
                        .and_then(|n| n.parse::<u64>().ok())
                        .unwrap_or(0);
                }
                Some("agent_end") => return Ok::<_, anyhow::Error>(()),
                _ => {}
            }
        }
        bail!("the agent stopped before agent_end")
    };
    tokio::time::timeout(TURN_TIMEOUT, read)
        .await
        .context("the agent's reply did not end in time")??;
    let _ = child.kill().await;
    Ok(Raw { stdout, reply })
}

struct Through {
    wire: u64,
    stored: u64,
    events: u64,
}

/// One turn through pi-host: the bytes of the event frames a subscriber gets, and what the
/// store holds for the session afterwards.
async fn through_host(host: &PiHost, token: &str, directive: &str) -> Result<Through> {
    let mut control = Control::connect(&host.url, token).await?;
    let (session_id, cursor) = create_session(&mut control, host).await?;
    let mut ws = racp::upgrade(&host.url, token, 1 << 20).await?;
    racp::call_on(&mut ws, 1, "hello", racp::hello_params(), |_| {}).await?;
    racp::call_on(
        &mut ws,
        2,
        "session/subscribe",
        json!({"sessionId": session_id, "cursor": cursor}),
        |_| {},
    )
    .await?;
    start_turn(&mut control, &session_id, directive).await?;
    let (mut wire, mut events) = (0u64, 0u64);
    let read = async {
        while let Some(message) = ws.next().await {
            let Message::Text(text) = message? else {
                continue;
            };
            let frame: Value = serde_json::from_str(&text)?;
            if frame["method"] != "session/events" {
                continue;
            }
            wire += text.len() as u64;
            let batch = frame["params"]["events"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            events += batch.len() as u64;
            if batch.iter().any(|e| e["type"] == "turn.finished") {
                return Ok::<_, anyhow::Error>(());
            }
        }
        bail!("the subscription ended before turn.finished")
    };
    tokio::time::timeout(TURN_TIMEOUT, read)
        .await
        .context("the turn did not end in time")??;
    let _ = ws.close(None).await;
    wait_idle(&mut control, &session_id, TURN_TIMEOUT).await?;
    let stored = host.stored_event_bytes(&session_id)?;
    Ok(Through {
        wire,
        stored,
        events,
    })
}
