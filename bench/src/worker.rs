//! `pi-bench worker`: a load-generating client process for pi-host, driven by the orchestrator
//! with JSON lines on stdin/stdout exactly like the Socket.IO workers (bench/node/client.mjs).
//! One thread (a current-thread runtime), as a Node process has one.
//!
//! Modes:
//! - `fanout`: COUNT connections (or, with `--targets`, each target's count to its own URL,
//!   token and session), each `hello` + `session/subscribe` from the head; every
//!   `stream` delta received is tallied by tag (count, latency from its `t`, first and last
//!   receipt). `{"cmd":"await","tag","expect","timeout_ms"}` answers once every subscriber got
//!   `expect` deltas of that tag, or at the timeout.
//! - `idle`: COUNT connections that completed the upgrade and `hello`, doing nothing more.
//! - `resume`: `{"cmd":"resume","cursor","until_seq","timeout_ms"}` opens a connection,
//!   subscribes from `cursor` and answers when the event `until_seq` arrived: `{"ms",
//!   "received", "in_order"}`.
//!
//! Every mode prints `{"ready":true,"connected":N}` once its connections are up; `{"cmd":"quit"}`
//! or the end of stdin ends it.

use crate::hist::Histogram;
use crate::racp::{self, Ws};
use anyhow::{Context, Result, bail};
use futures_util::StreamExt;
use serde::Deserialize;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::io::AsyncBufReadExt;
use tokio_tungstenite::tungstenite::Message;

#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Mode {
    Fanout,
    Idle,
    Resume,
}

#[derive(Debug, clap::Args)]
pub struct WorkerArgs {
    #[arg(long, default_value = "")]
    pub url: String,
    #[arg(long, default_value = "")]
    pub token: String,
    #[arg(long)]
    pub session: Option<String>,
    #[arg(long, default_value_t = 1)]
    pub count: usize,
    #[arg(long, value_enum)]
    pub mode: Mode,
    /// Fan-out to several servers and sessions at once: a JSON array of `{"url", "token",
    /// "session", "count"}` (replaces the four options above).
    #[arg(long)]
    pub targets: Option<String>,
}

/// Where a group of a worker's subscribers connect.
#[derive(Debug, Clone, serde::Serialize, Deserialize)]
pub struct WorkerTarget {
    pub url: String,
    pub token: String,
    pub session: String,
    pub count: usize,
}

/// Connections opened at once, as in the Node worker: more would overflow the accept backlog.
const CONNECT_WINDOW: usize = 100;
/// Read buffer per client connection (tungstenite's default is 128 KiB).
const READ_BUFFER: usize = 16 << 10;

pub fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_micros() as u64)
        .unwrap_or(0)
}

fn say(value: Value) {
    println!("{value}");
}

#[derive(Default)]
struct TagStats {
    received: u64,
    first_us: u64,
    last_us: u64,
    hist: Histogram,
}

#[derive(Default)]
struct Tally {
    tags: HashMap<u64, TagStats>,
}

impl Tally {
    fn received(&self, tag: u64) -> u64 {
        self.tags.get(&tag).map_or(0, |s| s.received)
    }

    fn take(&mut self, tag: u64) -> Value {
        let s = self.tags.remove(&tag).unwrap_or_default();
        json!({
            "tag": tag, "received": s.received, "first_us": s.first_us, "last_us": s.last_us,
            "hist": s.hist.pairs(),
        })
    }
}

/// The parts of a `session/events` push the bench reads; serde skips the rest.
#[derive(Deserialize)]
struct Push {
    params: PushParams,
}

#[derive(Deserialize)]
struct PushParams {
    events: Vec<Event>,
}

#[derive(Deserialize)]
struct Event {
    seq: u64,
    #[serde(default)]
    data: Option<EventData>,
}

#[derive(Deserialize)]
struct EventData {
    #[serde(rename = "assistantMessageEvent")]
    delta: Option<Delta>,
}

#[derive(Deserialize)]
struct Delta {
    tag: Option<u64>,
    t: Option<u64>,
}

fn events_of(text: &str) -> Option<Vec<Event>> {
    // The host writes pushes with `method` first; replies and heartbeats are not events.
    if !text.starts_with(r#"{"method":"session/events""#) {
        return None;
    }
    serde_json::from_str::<Push>(text)
        .ok()
        .map(|push| push.params.events)
}

async fn connect(url: &str, token: &str) -> Result<Ws> {
    let mut ws = racp::upgrade(url, token, READ_BUFFER).await?;
    racp::call_on(&mut ws, 1, "hello", racp::hello_params(), |_| {}).await?;
    Ok(ws)
}

async fn subscribe(ws: &mut Ws, session: &str, cursor: Option<&str>) -> Result<()> {
    let mut params = json!({"sessionId": session});
    if let Some(cursor) = cursor {
        params["cursor"] = json!(cursor);
    }
    racp::call_on(ws, 2, "session/subscribe", params, |_| {}).await?;
    Ok(())
}

/// Opens `count` connections, `CONNECT_WINDOW` at a time, each set up by `setup`.
async fn open_all<F, Fut>(count: usize, setup: F) -> Result<Vec<Ws>>
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<Ws>>,
{
    let mut opened = Vec::with_capacity(count);
    let mut pending =
        futures_util::stream::iter((0..count).map(|_| setup())).buffer_unordered(CONNECT_WINDOW);
    while let Some(ws) = pending.next().await {
        opened.push(ws?);
    }
    Ok(opened)
}

pub fn run(args: WorkerArgs) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let local = tokio::task::LocalSet::new();
    let outcome = local.block_on(&runtime, work(args));
    if let Err(err) = &outcome {
        say(json!({"error": format!("{err:#}")}));
    }
    outcome
}

async fn work(mut args: WorkerArgs) -> Result<()> {
    let targets: Vec<WorkerTarget> = match &args.targets {
        Some(json) => serde_json::from_str(json).context("bad --targets")?,
        None => Vec::new(),
    };
    if !targets.is_empty() {
        if args.mode != Mode::Fanout {
            bail!("--targets is for fanout only");
        }
        args.count = targets.iter().map(|t| t.count).sum();
    }
    let tally = Arc::new(Mutex::new(Tally::default()));
    let closed = Arc::new(AtomicUsize::new(0));
    let mut held = Vec::new();
    match args.mode {
        Mode::Fanout => {
            let targets = if targets.is_empty() {
                vec![WorkerTarget {
                    url: args.url.clone(),
                    token: args.token.clone(),
                    session: args.session.clone().context("fanout needs --session")?,
                    count: args.count,
                }]
            } else {
                targets
            };
            let each = targets.iter().flat_map(|t| std::iter::repeat_n(t, t.count));
            let mut opened = Vec::with_capacity(args.count);
            let mut pending = futures_util::stream::iter(each.map(|t| async move {
                let mut ws = connect(&t.url, &t.token).await?;
                subscribe(&mut ws, &t.session, None).await?;
                Ok::<_, anyhow::Error>(ws)
            }))
            .buffer_unordered(CONNECT_WINDOW);
            while let Some(ws) = pending.next().await {
                opened.push(ws?);
            }
            for ws in opened {
                tokio::task::spawn_local(read_deltas(ws, tally.clone(), closed.clone()));
            }
        }
        Mode::Idle => {
            let opened = open_all(args.count, || connect(&args.url, &args.token)).await?;
            for ws in opened {
                // Read (and drop) heartbeats so the connections stay healthy.
                held.push(tokio::task::spawn_local(async move {
                    let (_sink, mut stream) = ws.split();
                    while let Some(Ok(_)) = stream.next().await {}
                }));
            }
        }
        Mode::Resume => {}
    }
    let connected = if args.mode == Mode::Resume {
        0
    } else {
        args.count
    };
    say(json!({"ready": true, "connected": connected}));

    let mut stdin = tokio::io::BufReader::new(tokio::io::stdin()).lines();
    while let Some(line) = stdin.next_line().await? {
        let command: Value = match serde_json::from_str(&line) {
            Ok(command) => command,
            Err(err) => {
                say(json!({"error": format!("bad command: {err}")}));
                continue;
            }
        };
        match command["cmd"].as_str().unwrap_or("") {
            "await" => {
                let tag = command["tag"].as_u64().context("await needs tag")?;
                let expect = command["expect"].as_u64().context("await needs expect")?;
                let timeout =
                    Duration::from_millis(command["timeout_ms"].as_u64().unwrap_or(30_000));
                let want = expect * args.count as u64;
                let deadline = tokio::time::Instant::now() + timeout;
                loop {
                    let got = tally.lock().map(|t| t.received(tag)).unwrap_or(0);
                    if got >= want || tokio::time::Instant::now() >= deadline {
                        break;
                    }
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
                let mut report = match tally.lock() {
                    Ok(mut t) => t.take(tag),
                    Err(_) => bail!("tally lock poisoned"),
                };
                report["closed"] = json!(closed.load(Ordering::Relaxed));
                say(report);
            }
            "resume" => {
                let session = args.session.clone().context("resume needs --session")?;
                say(resume(&args.url, &args.token, &session, &command).await?);
            }
            "quit" => break,
            other => say(json!({"error": format!("unknown command {other}")})),
        }
    }
    Ok(())
}

async fn read_deltas(ws: Ws, tally: Arc<Mutex<Tally>>, closed: Arc<AtomicUsize>) {
    let (_sink, mut stream) = ws.split();
    while let Some(Ok(message)) = stream.next().await {
        let Message::Text(text) = message else {
            continue;
        };
        let Some(events) = events_of(text.as_str()) else {
            continue;
        };
        // Every event of a frame arrived at the same moment: one clock read per frame.
        let now = now_us();
        let Ok(mut tally) = tally.lock() else {
            break;
        };
        for event in events {
            if let Some(Delta {
                tag: Some(tag),
                t: Some(t),
            }) = event.data.and_then(|d| d.delta)
            {
                let stats = tally.tags.entry(tag).or_default();
                if stats.received == 0 {
                    stats.first_us = now;
                }
                stats.received += 1;
                stats.last_us = now;
                stats.hist.record(now.saturating_sub(t));
            }
        }
    }
    closed.fetch_add(1, Ordering::Relaxed);
}

/// Reconnects from a cursor and times the catch-up to `until_seq`.
async fn resume(url: &str, token: &str, session: &str, command: &Value) -> Result<Value> {
    let cursor = command["cursor"].as_str().context("resume needs cursor")?;
    let until = command["until_seq"]
        .as_u64()
        .context("resume needs until_seq")?;
    let timeout = Duration::from_millis(command["timeout_ms"].as_u64().unwrap_or(60_000));
    let mut expected = racp::cursor_seq(&json!(cursor))? + 1;
    let mut in_order = true;
    let mut received = 0u64;
    // Where the time goes: connecting, the subscribe reply, and this client's own parsing.
    let (mut hello_ms, mut subscribed_ms) = (0.0, 0.0);
    let (mut frames, mut bytes, mut parse) = (0u64, 0u64, Duration::ZERO);
    let start = std::time::Instant::now();
    let catch_up = async {
        let mut ws = connect(url, token).await?;
        hello_ms = start.elapsed().as_secs_f64() * 1000.0;
        // Events may arrive before the subscribe reply: count those too.
        let mut early = Vec::new();
        let params = json!({"sessionId": session, "cursor": cursor});
        racp::call_on(&mut ws, 2, "session/subscribe", params, |text| {
            early.push(text.to_string())
        })
        .await?;
        subscribed_ms = start.elapsed().as_secs_f64() * 1000.0;
        let mut count = |text: &str| -> bool {
            let parsing = std::time::Instant::now();
            let events = events_of(text);
            parse += parsing.elapsed();
            let Some(events) = events else {
                return false;
            };
            frames += 1;
            bytes += text.len() as u64;
            for event in events {
                in_order &= event.seq == expected;
                expected = event.seq + 1;
                received += 1;
                if event.seq >= until {
                    return true;
                }
            }
            false
        };
        for text in early {
            if count(&text) {
                return Ok(());
            }
        }
        while let Some(message) = ws.next().await {
            let Message::Text(text) = message? else {
                continue;
            };
            if count(text.as_str()) {
                return Ok(());
            }
        }
        bail!("the connection closed before the catch-up ended")
    };
    tokio::time::timeout(timeout, catch_up)
        .await
        .context("catch-up timed out")??;
    let ms = start.elapsed().as_secs_f64() * 1000.0;
    Ok(
        json!({"ms": ms, "received": received, "in_order": in_order, "hello_ms": hello_ms,
        "subscribed_ms": subscribed_ms, "frames": frames, "bytes": bytes,
        "client_parse_ms": parse.as_secs_f64() * 1000.0}),
    )
}
