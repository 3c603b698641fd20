//! `stand-in-agent`: a stand-in for the pi coding agent in RPC mode (`pi --mode rpc`), for
//! deterministic tests. It is a test fixture, never the product default.
//!
//! It reads JSON command lines on stdin (LF-framed, like pi) and writes pi-shaped JSON lines on
//! stdout: a `response` to each command (carrying the command's `id`), and for `prompt` a scripted
//! agent run whose events mirror pi 0.73 (`agent_start`, `turn_start`, `message_start`,
//! `message_update`, `message_end`, `tool_execution_*`, `turn_end`, `agent_end`,
//! `extension_ui_request`, `queue_update`). Like pi it prints nothing until it gets a command, and
//! it exits 0 when its stdin closes. `stand-in-agent --version` prints the pi version it mirrors
//! (on stderr, as pi does) and exits, so a host's agent check finds it ready.
//!
//! # Commands
//! - `prompt` (`message`): answers `{"success": true}` and runs the script in the message. While a
//!   run is going on it answers `{"success": false, "error": "Agent is already processing. ..."}`
//!   as pi does, unless `streamingBehavior` is given (then the text is queued like a steer).
//! - `steer` / `follow_up` (`message`): queued, answered at once, and announced with a
//!   `queue_update` event. Queued messages are delivered when the scripted directives are done: a
//!   new pi turn with the user message(s) and an assistant reply `steered: <text>`.
//! - `abort`: ends the current run as aborted, the way pi does, and only then answers (pi answers
//!   `abort` once the agent is idle). During a dialog (`approve:`) the run ends only once the
//!   dialog is answered or times out, as in pi, whose extension is still waiting for it. A message being streamed gets `text_end` and `message_end`
//!   with `stopReason: "aborted"` and `errorMessage: "Request was aborted"`; between messages, a
//!   new pi turn holds an empty aborted assistant message (the next model call fails at once); an
//!   open tool ends with `isError: true`. Then `turn_end` and `agent_end`. Queued steering stays
//!   queued for the next run, as in pi.
//! - `get_state`: answers with a plausible `RpcSessionState`, with the model settings below.
//! - `get_available_models`: the stand-in's two models (provider `stand-in`, `stand-in-model`
//!   and `stand-in-model-2`); `set_model` takes one of them (else `Model not found`),
//!   `set_thinking_level` and `set_auto_compaction` are kept for `get_state`.
//! - `bash` (`command`): runs no shell; answers pi's `BashResult` with the output
//!   `stand-in ran: <command>` and exit code 0. `abort_bash`: answered at once.
//! - `get_commands`: one prompt template, `stand-in-template`. `export_html` (`outputPath`):
//!   writes a small page naming the number of messages there.
//! - `extension_ui_response` (`id`, `confirmed` | `value` | `cancelled`): answers a pending dialog;
//!   never acknowledged, and ignored when nothing waits for that id (as in pi).
//! - Anything else: `{"type": "response", "command": <type>, "success": false, "error": "Unknown
//!   command: <type>"}` without an `id` (pi omits it there too); a line that is not JSON gets a
//!   `command: "parse"` failure.
//!
//! # Directive language
//! The prompt text is split on whitespace and each word that is a directive runs in order inside
//! one agent run; other words are ignored (plain prose gets a one-line reply). Every run starts
//! with `agent_start`, `turn_start` and the user message (`message_start`/`message_end`), and ends
//! with `turn_end` and `agent_end`. Like pi, each pi turn holds one assistant message: a directive
//! that needs a new assistant message after one was already sent first closes the turn
//! (`turn_end`) and opens the next (`turn_start`). If the run would end right after a tool (or
//! without any assistant message), a final assistant message `done` is streamed first.
//!
//! | directive | effect |
//! |---|---|
//! | `deltas:N` | an assistant text message: `message_start`, `message_update` `text_start`, N `text_delta`s (`chunk0 `, `chunk1 `, ...), `text_end`, `message_end` (`stopReason: "stop"`) |
//! | `deltas:N:MS` | the same, pausing MS milliseconds before each delta (so a run can be aborted mid-message) |
//! | `echo` | an assistant text message whose single delta is the whole prompt text |
//! | `sayhex:HEX` | an assistant text message whose single delta is the text HEX encodes (UTF-8, two hex digits a byte) |
//! | `tool` | an assistant message with a `bash` tool call (`toolcall_start/delta/end`, `stopReason: "toolUse"`), then `tool_execution_start`, `tool_execution_update`, `tool_execution_end` and the `toolResult` message |
//! | `approve:KIND[:TIMEOUT_MS]` | like `tool`, but after `tool_execution_start` an `extension_ui_request` (KIND = `confirm`, `select`, `input` or `editor`, with a fresh UUID `id`) waits for the matching `extension_ui_response`. Allowed (`confirmed: true`, or a `value` other than `Block`): the tool runs and its result text says `stand-in tool ran (answer: X)`. Refused (`confirmed: false`, `cancelled`, `Block`, or TIMEOUT_MS passed): `tool_execution_end` with `isError: true` and `Blocked by user (answer: X)`, as pi reports a tool blocked by an extension |
//! | `fail` | ends the run as failed, like a provider error in pi: an assistant message with `stopReason: "error"` and `errorMessage`, `turn_end`, `agent_end`; later directives do not run |
//! | `fail:TEXT` | the same, with `errorMessage` TEXT (`_` read as a space), e.g. `fail:401_Incorrect_API_key_provided` |
//! | `failhex:HEX` | the same, with `errorMessage` the text HEX encodes (UTF-8, two hex digits a byte): any text, spaces and `_` included |
//! | `retry:N` | pi's automatic retry that succeeds: N times a failed run (`errorMessage` `503 Service Unavailable`, `turn_end`, `agent_end`) followed by `auto_retry_start` and a new `agent_start`/`turn_start`; then an assistant message `retried ok` and `auto_retry_end` (`success: true`) |
//! | `gaveup:N` | pi's automatic retry that gives up: N failed runs each followed by `auto_retry_start`, then a last failed run (`429 Rate limit reached …`) followed by `auto_retry_end` (`success: false`, `attempt: N`); later directives do not run |
//! | `oom` | writes node's V8 heap-limit banner (`FATAL ERROR: Reached heap limit Allocation failed - JavaScript heap out of memory`) to stderr and aborts (SIGABRT), as node does |
//! | `crash` | writes `stand-in-agent: scripted crash` to stderr and exits with status 3 at once |
//! | `crashhex:HEX` | the same with the text HEX encodes (UTF-8, two hex digits a byte) after `stand-in-agent: ` |
//! | `exit:CODE` | exits with status CODE at once |
//! | `sleep:MS` | pauses MS milliseconds (commands are still answered; `abort` ends the run as aborted) |
//! | `hang` | waits until aborted (or until stdin closes) |
//! | `settle:MS` | after the run's `agent_end`, stays busy MS milliseconds (a `prompt` meanwhile is refused as pi refuses one while it winds a run down: its listeners, an automatic compaction); an `abort` ends the wait |
//! | `spawn-child` | starts `sleep 1000` (stdio closed) and emits `{"type": "stand_in_child", "pid": N}` |
//! | `spawn-child:inherit` | the same, but the child inherits stdin/stdout/stderr (so it holds the pipes open) |
//! | `burst:N` | one assistant message with N `text_delta` updates as fast as possible; to stay O(N) their `message` and `partial` carry empty `content` |
//! | `stream:N[:RATE[:TAG]]` | for benchmarks: one assistant message with N `message_update` lines of exactly 200 bytes, `{"type":"message_update","assistantMessageEvent":{"type":"text_delta","delta":"xx..","tag":TAG,"i":I,"t":US}}` (`i` counts from 0, `t` is the wall clock in microseconds when the line was written), RATE lines per second (0 or absent: as fast as possible), all lines due in one write, at most one write per millisecond when paced |
//! | `stream:N:RATE:TAG:pi` | the same deltas in pi's own shape: messages of 100 deltas of 32 characters (`message_start`, the updates, `message_end`), each update carrying the whole message so far twice (`message` and the step's `partial`), with `contentIndex` and the step's `tag`, `i` and `t` |
//! | `output:BYTES` | a `bash` tool (`tool_execution_start`, updates, `tool_execution_end`, its `toolResult` message) that prints BYTES of numbered 64-byte lines, with an update after each 4 KiB as pi's bash tool sends them: `partialResult` is the whole output so far, cut to its last 2000 lines or 50 KiB (pi's limits) with `details.truncation` once cut |
//! | `big:BYTES` | one assistant message with a single `text_delta` of BYTES `x` characters |
//! | `numbers[:PAD]` | emits `{"type":"stand_in_numbers","values":[…],"pad":"xx…"}`: the numbers of `tests::EDGE_NUMBERS` written as that exact text (not through a parser), and PAD `x` characters (0 when absent), so a test can have the event cut to a frame bound |
//! | `write:NAME:LINES` | pi's `write` tool: `tool_execution_start` with `args` `{path: NAME, content}` (LINES lines `line N`), the file written in the working directory, `tool_execution_end` |
//! | `rm:NAME` | pi's `bash` tool running `rm NAME`: the file removed in the working directory, no file tool named |
//! | `notify` | a fire-and-forget `extension_ui_request` with `method: "notify"` |
//! | `garbage` | writes a line that is not JSON |
//! | `whoami` | emits `{"type": "stand_in_whoami", "args", "sessionDir", "cwd", "model", "thinkingLevel", "autoCompaction"}`: its arguments, `PI_CODING_AGENT_SESSION_DIR`, working directory and model settings |
//! | `stderr:BYTES` | writes BYTES bytes of text to stderr |

use serde_json::{Map, Value, json};
use std::io::{BufRead, Write};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, Receiver, RecvTimeoutError, TryRecvError};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

const BUSY: &str = "Agent is already processing. Specify streamingBehavior ('steer' or 'followUp') to queue the message.";
const ABORTED: &str = "Request was aborted";
const FAILED: &str = "stand-in: scripted failure (fail directive)";
const RETRIED: &str = "503 Service Unavailable";
const RATE_LIMITED: &str = "429 Rate limit reached for requests. Please try again in 2s.";

enum Input {
    Line(String),
    Eof,
}

/// What a command line asks of the run loop.
enum Action {
    None,
    Prompt(Option<Value>, String),
    Abort(Option<Value>),
    Ui(String, Value),
}

/// The run was aborted by the `abort` command with this id.
struct Aborted(Option<Value>);

/// How the run ended early.
enum Stop {
    Aborted(Option<Value>),
    Failed,
}

impl From<Aborted> for Stop {
    fn from(aborted: Aborted) -> Stop {
        Stop::Aborted(aborted.0)
    }
}

#[derive(Clone, Copy)]
enum Wait<'a> {
    Poll,
    Until(Instant),
    Ui(&'a str, Option<Instant>),
    Forever,
}

/// State of one agent run (one prompt).
#[derive(Default)]
struct Run {
    new_messages: Vec<Value>,
    /// The assistant message of the current pi turn, once it ended.
    turn_assistant: Option<Value>,
    turn_tool_results: Vec<Value>,
    /// An assistant message that started but has not ended.
    open_message: Option<Value>,
    /// A tool that started but has not ended: (toolCallId, toolName, args).
    open_tool: Option<(String, String, Value)>,
    /// How long the run stays busy after its `agent_end` (`settle:MS`).
    settle: Option<Duration>,
}

struct StandIn {
    rx: Receiver<Input>,
    streaming: bool,
    message_count: usize,
    steering: Vec<String>,
    counter: u64,
    rng: u64,
    session_id: String,
    children: Vec<Child>,
    /// What `set_model`, `set_thinking_level` and `set_auto_compaction` set.
    settings: Settings,
}

/// The model settings, as `get_state` reports them.
struct Settings {
    model_id: String,
    thinking_level: String,
    auto_compaction: bool,
}

/// The models the stand-in "has": provider `stand-in`, each with a credential.
const MODELS: [&str; 2] = ["stand-in-model", "stand-in-model-2"];

fn model_json(id: &str) -> Value {
    json!({
        "id": id, "name": "Stand-in", "api": "openai-completions",
        "provider": "stand-in", "baseUrl": "http://127.0.0.1:9/v1",
        "reasoning": true, "input": ["text"], "contextWindow": 32000,
        "maxTokens": 4096,
        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0}
    })
}

/// What `--version` prints: the pi it stands in for (pi prints its version on stderr).
const STANDS_IN_FOR: &str = "0.73.1";

fn main() {
    if std::env::args().nth(1).as_deref() == Some("--version") {
        eprintln!("{STANDS_IN_FOR}");
        return;
    }
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut stdin = stdin.lock();
        let mut buf = Vec::new();
        loop {
            buf.clear();
            match stdin.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => {
                    let _ = tx.send(Input::Eof);
                    return;
                }
                Ok(_) => {
                    if buf.last() == Some(&b'\n') {
                        buf.pop();
                    }
                    if buf.last() == Some(&b'\r') {
                        buf.pop();
                    }
                    let line = String::from_utf8_lossy(&buf).into_owned();
                    if tx.send(Input::Line(line)).is_err() {
                        return;
                    }
                }
            }
        }
    });
    let seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(0x9e37_79b9_7f4a_7c15)
        ^ (u64::from(std::process::id()) << 32);
    let mut agent = StandIn {
        rx,
        streaming: false,
        message_count: 0,
        steering: Vec::new(),
        counter: 0,
        rng: seed | 1,
        session_id: format!("stand-in-{}", std::process::id()),
        children: Vec::new(),
        settings: Settings {
            model_id: MODELS[0].to_string(),
            thinking_level: "off".to_string(),
            auto_compaction: false,
        },
    };
    agent.idle_loop();
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn write_line(line: &str) {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if out.write_all(line.as_bytes()).is_err()
        || out.write_all(b"\n").is_err()
        || out.flush().is_err()
    {
        // Nobody listens any more.
        std::process::exit(1);
    }
}

/// Writes lines that already end in LF, in one write.
/// The lines of the `stream` directive.
#[derive(Clone, Copy)]
enum StreamShape {
    /// 200 bytes each, without `message` or `partial`.
    Fixed,
    /// pi's own: the whole message so far in `message` and `partial`.
    Pi,
}

/// Deltas per message of a pi-shaped stream, and their size.
const PI_MESSAGE_DELTAS: u64 = 100;
const PI_DELTA: &str = "abcdefghijklmnopqrstuvwxyz012345";

/// Appends update `i` of a pi-shaped stream to `buf`, preceded by `message_start` (and the last
/// message's `message_end`) at a message boundary. Written by hand: this is the benchmark's
/// producer, and serializing a growing message with serde would cost more than the host does.
fn pi_shaped_update(buf: &mut String, i: u64, tag: u64, t: u64) {
    use std::fmt::Write as _;
    let index = i % PI_MESSAGE_DELTAS;
    let message = |buf: &mut String, deltas: u64| {
        buf.push_str(r#"{"role":"assistant","content":[{"type":"text","text":""#);
        for _ in 0..deltas {
            buf.push_str(PI_DELTA);
        }
        buf.push_str(r#""}],"api":"openai-completions","provider":"stand-in","model":"stand-in-model","stopReason":"stop","timestamp":1764528000000}"#);
    };
    if index == 0 {
        if i > 0 {
            buf.push_str(r#"{"type":"message_end","message":"#);
            message(buf, PI_MESSAGE_DELTAS);
            buf.push_str("}\n");
        }
        buf.push_str(r#"{"type":"message_start","message":"#);
        message(buf, 0);
        buf.push_str("}\n");
    }
    buf.push_str(r#"{"type":"message_update","message":"#);
    message(buf, index + 1);
    let _ = write!(
        buf,
        r#","assistantMessageEvent":{{"type":"text_delta","contentIndex":0,"delta":"{PI_DELTA}","tag":{tag},"i":{i},"t":{t},"partial":"#
    );
    message(buf, index + 1);
    buf.push_str("}}");
}

fn write_raw(lines: &str) {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    if out.write_all(lines.as_bytes()).is_err() || out.flush().is_err() {
        std::process::exit(1);
    }
}

/// Writes an event with `type` as its first key, as pi's JSON does (serde_json sorts keys), so
/// the start of a line tells its type even when the line is too long to read whole.
fn emit(value: &Value) {
    match value {
        Value::Object(map) if map.contains_key("type") => {
            let mut rest = map.clone();
            let kind = rest.remove("type").unwrap_or(Value::Null);
            // pi writes a response's `id` first (`{"id":…,"type":"response",…}`).
            let first = match rest.remove("id") {
                Some(id) if kind == "response" => format!("\"id\":{id},\"type\":{kind}"),
                Some(id) => {
                    rest.insert("id".into(), id);
                    format!("\"type\":{kind}")
                }
                None => format!("\"type\":{kind}"),
            };
            let body = Value::Object(rest).to_string();
            let line = match body.strip_prefix('{').filter(|b| *b != "}") {
                Some(fields) => format!("{{{first},{fields}"),
                None => format!("{{{first}}}"),
            };
            write_line(&line);
        }
        _ => write_line(&value.to_string()),
    }
}

fn usage() -> Value {
    json!({
        "input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "totalTokens": 0,
        "cost": {"input": 0, "output": 0, "cacheRead": 0, "cacheWrite": 0, "total": 0}
    })
}

fn assistant(content: Value, stop_reason: &str) -> Value {
    json!({
        "role": "assistant",
        "content": content,
        "api": "openai-completions",
        "provider": "stand-in",
        "model": "stand-in-model",
        "usage": usage(),
        "stopReason": stop_reason,
        "timestamp": now_ms(),
    })
}

fn user_message(text: &str) -> Value {
    json!({"role": "user", "content": [{"type": "text", "text": text}], "timestamp": now_ms()})
}

fn text_of(value: &Value) -> String {
    match value {
        Value::String(s) => s.clone(),
        Value::Null => String::new(),
        other => other.to_string(),
    }
}

impl StandIn {
    fn idle_loop(&mut self) -> ! {
        loop {
            let input = self.rx.recv().unwrap_or(Input::Eof);
            match input {
                Input::Eof => std::process::exit(0),
                Input::Line(line) => match self.handle_line(&line) {
                    Action::Prompt(id, text) => self.run_prompt(id, &text),
                    Action::Abort(id) => respond(id, "abort", None),
                    Action::None | Action::Ui(..) => {}
                },
            }
        }
    }

    /// Answers what can be answered at once; returns what the run loop must act on.
    fn handle_line(&mut self, line: &str) -> Action {
        if line.trim().is_empty() {
            return Action::None;
        }
        let command: Value = match serde_json::from_str(line) {
            Ok(value) => value,
            Err(err) => {
                respond_error(None, "parse", &format!("Failed to parse command: {err}"));
                return Action::None;
            }
        };
        let id = command.get("id").cloned();
        let kind = command.get("type").and_then(Value::as_str).unwrap_or("");
        let message = || text_of(command.get("message").unwrap_or(&Value::Null));
        match kind {
            "extension_ui_response" => {
                let ui_id = text_of(command.get("id").unwrap_or(&Value::Null));
                Action::Ui(ui_id, command)
            }
            "prompt" => {
                if !self.streaming {
                    return Action::Prompt(id, message());
                }
                if command
                    .get("streamingBehavior")
                    .and_then(Value::as_str)
                    .is_some()
                {
                    self.queue_steer(message());
                    respond(id, "prompt", None);
                } else {
                    respond_error(id, "prompt", BUSY);
                }
                Action::None
            }
            "steer" | "follow_up" => {
                self.queue_steer(message());
                respond(id, kind, None);
                Action::None
            }
            "abort" => Action::Abort(id),
            "get_available_models" => {
                let models: Vec<Value> = MODELS.iter().map(|id| model_json(id)).collect();
                respond(id, kind, Some(json!({ "models": models })));
                Action::None
            }
            "set_model" => {
                let provider = command.get("provider").and_then(Value::as_str);
                let model = command.get("modelId").and_then(Value::as_str).unwrap_or("");
                if provider == Some("stand-in") && MODELS.contains(&model) {
                    self.settings.model_id = model.to_string();
                    respond(id, kind, Some(model_json(model)));
                } else {
                    let provider = provider.unwrap_or("");
                    respond_error(id, kind, &format!("Model not found: {provider}/{model}"));
                }
                Action::None
            }
            "set_thinking_level" => {
                let level = command
                    .get("level")
                    .and_then(Value::as_str)
                    .unwrap_or("off");
                self.settings.thinking_level = level.to_string();
                respond(id, kind, None);
                Action::None
            }
            "set_steering_mode" | "set_follow_up_mode" => {
                respond(id, kind, None);
                Action::None
            }
            "set_auto_compaction" => {
                let enabled = command.get("enabled").and_then(Value::as_bool);
                self.settings.auto_compaction = enabled.unwrap_or(false);
                respond(id, kind, None);
                Action::None
            }
            "get_state" => {
                let state = json!({
                    "model": model_json(&self.settings.model_id),
                    "thinkingLevel": self.settings.thinking_level,
                    "isStreaming": self.streaming,
                    "isCompacting": false,
                    "steeringMode": "one-at-a-time",
                    "followUpMode": "one-at-a-time",
                    "sessionId": self.session_id,
                    "autoCompactionEnabled": self.settings.auto_compaction,
                    "messageCount": self.message_count,
                    "pendingMessageCount": self.steering.len(),
                });
                respond(id, "get_state", Some(state));
                Action::None
            }
            "bash" => {
                // No shell: the command is echoed back, so a test knows what reached the agent.
                let line = command.get("command").and_then(Value::as_str).unwrap_or("");
                let result = json!({"output": format!("stand-in ran: {line}\n"), "exitCode": 0,
                    "cancelled": false, "truncated": false});
                respond(id, kind, Some(result));
                Action::None
            }
            "abort_bash" => {
                respond(id, kind, None);
                Action::None
            }
            "get_commands" => {
                let template = json!({"name": "stand-in-template", "description": "A template",
                    "source": "prompt", "sourceInfo": {"scope": "project"}});
                respond(id, kind, Some(json!({"commands": [template]})));
                Action::None
            }
            "export_html" => {
                // A page naming the messages so far, where pi would write its own.
                let path = command
                    .get("outputPath")
                    .and_then(Value::as_str)
                    .unwrap_or("");
                let page = format!(
                    "<!DOCTYPE html><p>stand-in export: {} messages</p>\n",
                    self.message_count
                );
                match std::fs::write(path, page) {
                    Ok(()) => respond(id, kind, Some(json!({"path": path}))),
                    Err(err) => respond_error(id, kind, &err.to_string()),
                }
                Action::None
            }
            other => {
                respond_error(None, other, &format!("Unknown command: {other}"));
                Action::None
            }
        }
    }

    fn queue_steer(&mut self, text: String) {
        self.steering.push(text);
        emit(&json!({"type": "queue_update", "steering": self.steering, "followUp": []}));
    }

    /// Handles incoming commands while a run goes on, for as long as `wait` says. An abort
    /// during a dialog waits for the dialog's answer (or its timeout), as in pi: pi's run, and
    /// so its answer to `abort`, ends only once the extension's dialog returns.
    fn pump(&mut self, wait: Wait<'_>) -> Result<Option<Value>, Aborted> {
        let mut held_abort = None;
        let ended = |answer: Option<Value>, held: Option<Option<Value>>| match held {
            Some(id) => Err(Aborted(id)),
            None => Ok(answer),
        };
        loop {
            let input = match wait {
                Wait::Poll => match self.rx.try_recv() {
                    Ok(input) => input,
                    Err(TryRecvError::Empty) => return Ok(None),
                    Err(TryRecvError::Disconnected) => Input::Eof,
                },
                Wait::Until(deadline) | Wait::Ui(_, Some(deadline)) => {
                    let now = Instant::now();
                    if now >= deadline {
                        return ended(None, held_abort);
                    }
                    match self.rx.recv_timeout(deadline - now) {
                        Ok(input) => input,
                        Err(RecvTimeoutError::Timeout) => return ended(None, held_abort),
                        Err(RecvTimeoutError::Disconnected) => Input::Eof,
                    }
                }
                Wait::Forever | Wait::Ui(_, None) => self.rx.recv().unwrap_or(Input::Eof),
            };
            let line = match input {
                Input::Eof => std::process::exit(0),
                Input::Line(line) => line,
            };
            match (self.handle_line(&line), wait) {
                (Action::Abort(id), Wait::Ui(..)) => held_abort = Some(id),
                (Action::Abort(id), _) => return Err(Aborted(id)),
                (Action::Ui(ui_id, answer), Wait::Ui(waiting_for, _)) if waiting_for == ui_id => {
                    return ended(Some(answer), held_abort);
                }
                _ => {}
            }
        }
    }

    fn uuid(&mut self) -> String {
        let mut next = || {
            // xorshift64*
            self.rng ^= self.rng >> 12;
            self.rng ^= self.rng << 25;
            self.rng ^= self.rng >> 27;
            self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d)
        };
        let (a, b) = (next(), next());
        format!(
            "{:08x}-{:04x}-4{:03x}-{:04x}-{:012x}",
            a >> 32,
            (a >> 16) & 0xffff,
            a & 0x0fff,
            0x8000 | ((b >> 48) & 0x3fff),
            b & 0xffff_ffff_ffff
        )
    }

    fn run_prompt(&mut self, id: Option<Value>, text: &str) {
        respond(id, "prompt", None);
        self.streaming = true;
        let mut run = Run::default();
        emit(&json!({"type": "agent_start"}));
        emit(&json!({"type": "turn_start"}));
        let user = user_message(text);
        emit(&json!({"type": "message_start", "message": user}));
        emit(&json!({"type": "message_end", "message": user}));
        run.new_messages.push(user);
        let outcome = self
            .run_directives(&mut run, text)
            .and_then(|()| self.finish(&mut run));
        match outcome {
            Ok(()) => {
                if let Some(settle) = run.settle
                    && let Err(Aborted(abort_id)) = self.pump(Wait::Until(Instant::now() + settle))
                {
                    // Nothing runs any more: the abort only ends the wait.
                    self.message_count += run.new_messages.len();
                    self.streaming = false;
                    respond(abort_id, "abort", None);
                    return;
                }
            }
            Err(Stop::Failed) => {}
            Err(Stop::Aborted(abort_id)) => {
                self.end_aborted(&mut run);
                self.message_count += run.new_messages.len();
                self.streaming = false;
                respond(abort_id, "abort", None);
                return;
            }
        }
        self.message_count += run.new_messages.len();
        self.streaming = false;
    }

    fn run_directives(&mut self, run: &mut Run, text: &str) -> Result<(), Stop> {
        for word in text.split_whitespace() {
            let (name, arg) = match word.split_once(':') {
                Some((name, arg)) => (name, Some(arg)),
                None => (word, None),
            };
            let number = arg.and_then(|a| a.parse::<u64>().ok());
            match (name, number) {
                ("deltas", _) => {
                    // `deltas:N` or `deltas:N:MS` (a pause of MS before each delta).
                    let mut parts = arg.unwrap_or("").split(':').map(|p| p.parse::<u64>().ok());
                    let (Some(Some(n)), pause) = (parts.next(), parts.next().flatten()) else {
                        continue;
                    };
                    let deltas: Vec<String> = (0..n).map(|i| format!("chunk{i} ")).collect();
                    self.stream_text_paced(run, &deltas, pause.map(Duration::from_millis))?;
                }
                ("echo", _) => self.stream_text(run, &[text.to_string()])?,
                ("sayhex", _) => self.stream_text(run, &[unhex(arg)])?,
                ("big", Some(n)) => {
                    let delta = "x".repeat(usize::try_from(n).unwrap_or(0));
                    self.stream_text(run, &[delta])?;
                }
                ("burst", Some(n)) => self.burst(run, n)?,
                ("output", Some(bytes)) => self.tool_output(run, bytes)?,
                ("stream", _) => {
                    // `stream:N[:RATE[:TAG[:pi]]]`
                    let words: Vec<&str> = arg.unwrap_or("").split(':').collect();
                    let number = |i: usize| words.get(i).and_then(|w| w.parse::<u64>().ok());
                    let Some(n) = number(0) else {
                        continue;
                    };
                    let shape = if words.get(3) == Some(&"pi") {
                        StreamShape::Pi
                    } else {
                        StreamShape::Fixed
                    };
                    self.stream(
                        run,
                        n,
                        number(1).unwrap_or(0),
                        number(2).unwrap_or(0),
                        shape,
                    )?;
                }
                ("tool", _) => self.tool(run, None)?,
                ("write", _) if arg.is_some() => {
                    let spec = arg.unwrap_or_default();
                    let (path, lines) = spec.split_once(':').unwrap_or((spec, "1"));
                    let lines = lines.parse::<usize>().unwrap_or(1);
                    let content: String = (1..=lines).map(|n| format!("line {n}\n")).collect();
                    let args = json!({"path": path, "content": content});
                    let _ = std::fs::write(path, &content);
                    self.file_tool(run, "write", args);
                }
                ("rm", _) if arg.is_some() => {
                    let path = arg.unwrap_or_default();
                    let _ = std::fs::remove_file(path);
                    self.file_tool(run, "bash", json!({"command": format!("rm {path}")}));
                }
                ("approve", _) => {
                    let spec = arg.unwrap_or("confirm");
                    let (kind, timeout) = match spec.split_once(':') {
                        Some((kind, ms)) => (kind, ms.parse::<u64>().ok()),
                        None => (spec, None),
                    };
                    if matches!(kind, "confirm" | "select" | "input" | "editor") {
                        self.tool(run, Some((kind, timeout)))?;
                    }
                }
                ("fail" | "failhex", _) => {
                    self.new_turn_if_needed(run);
                    // `fail:TEXT`: the errorMessage is TEXT with `_` as spaces (a provider's
                    // wording, e.g. `fail:429_Too_many_requests`); `failhex:HEX` any text.
                    let error = match (name, arg) {
                        ("failhex", _) => unhex(arg),
                        (_, Some(text)) => text.replace('_', " "),
                        (_, None) => FAILED.to_string(),
                    };
                    let message = with_error(assistant(json!([]), "error"), &error);
                    emit(&json!({"type": "message_start", "message": message}));
                    emit(&json!({"type": "message_end", "message": message}));
                    run.new_messages.push(message.clone());
                    emit(&json!({"type": "turn_end", "message": message, "toolResults": []}));
                    emit(&json!({"type": "agent_end", "messages": run.new_messages}));
                    return Err(Stop::Failed);
                }
                ("retry", Some(n)) => {
                    // pi's automatic retry: N failed runs, each followed by `auto_retry_start`,
                    // then the request succeeds (`auto_retry_end` with `success: true`).
                    for attempt in 1..=n {
                        self.failed_attempt(run, RETRIED);
                        emit(&json!({
                            "type": "auto_retry_start", "attempt": attempt, "maxAttempts": n,
                            "delayMs": 1, "errorMessage": RETRIED,
                        }));
                        emit(&json!({"type": "agent_start"}));
                        emit(&json!({"type": "turn_start"}));
                    }
                    self.stream_text(run, &["retried ok".to_string()])?;
                    emit(&json!({"type": "auto_retry_end", "success": true, "attempt": n}));
                }
                ("gaveup", Some(n)) => {
                    // pi retried N times and gave up: the last failed run's `agent_end` is
                    // followed by `auto_retry_end` with `success: false`.
                    for attempt in 1..=n {
                        self.failed_attempt(run, RATE_LIMITED);
                        emit(&json!({
                            "type": "auto_retry_start", "attempt": attempt, "maxAttempts": n,
                            "delayMs": 1, "errorMessage": RATE_LIMITED,
                        }));
                        emit(&json!({"type": "agent_start"}));
                        emit(&json!({"type": "turn_start"}));
                    }
                    self.failed_attempt(run, RATE_LIMITED);
                    emit(&json!({
                        "type": "auto_retry_end", "success": false, "attempt": n,
                        "finalError": RATE_LIMITED,
                    }));
                    return Err(Stop::Failed);
                }
                ("crash", _) => {
                    eprintln!("stand-in-agent: scripted crash");
                    std::process::exit(3);
                }
                ("crashhex", _) => {
                    eprintln!("stand-in-agent: {}", unhex(arg));
                    std::process::exit(3);
                }
                ("oom", _) => {
                    // What node prints when V8 hits its heap limit, then it aborts (SIGABRT).
                    eprintln!(
                        "\n<--- Last few GCs --->\n\n[4242:0x5e0c000]    12345 ms: Mark-Compact                          4040.1 (4130.3) -> 4031.9 (4133.1) MB, 1500.2 / 0.0 ms  (average mu =                          0.101, current mu = 0.012) allocation failure; scavenge might not succeed\n\n                         <--- JS stacktrace --->\n\nFATAL ERROR: Reached heap limit Allocation                          failed - JavaScript heap out of memory\n 1: 0xb7a940 node::Abort() [node]"
                    );
                    std::process::abort();
                }
                ("exit", Some(code)) => {
                    std::process::exit(i32::try_from(code).unwrap_or(1));
                }
                ("settle", Some(ms)) => run.settle = Some(Duration::from_millis(ms)),
                ("sleep", Some(ms)) => {
                    self.pump(Wait::Until(Instant::now() + Duration::from_millis(ms)))?;
                }
                ("hang", _) => {
                    self.pump(Wait::Forever)?;
                }
                ("spawn-child", _) => self.spawn_child(arg == Some("inherit")),
                ("numbers", _) => {
                    // Written by hand: encoding through `Value` would change the very numbers
                    // under test.
                    let pad = "x".repeat(usize::try_from(number.unwrap_or(0)).unwrap_or(0));
                    write_line(&format!(
                        r#"{{"type":"stand_in_numbers","values":[{}],"pad":"{pad}"}}"#,
                        tests::EDGE_NUMBERS.join(",")
                    ));
                }
                ("notify", _) => {
                    let id = self.uuid();
                    emit(&json!({
                        "type": "extension_ui_request", "id": id, "method": "notify",
                        "message": "stand-in notice", "notifyType": "info"
                    }));
                }
                ("garbage", _) => write_line("this is not JSON {"),
                ("whoami", _) => {
                    let args: Vec<String> = std::env::args().skip(1).collect();
                    emit(&json!({
                        "type": "stand_in_whoami",
                        "args": args,
                        "sessionDir": std::env::var("PI_CODING_AGENT_SESSION_DIR").ok(),
                        // systemd's socket is the host's alone (racp-server's notify.rs).
                        "notifySocket": std::env::var("NOTIFY_SOCKET").ok(),
                        "cwd": std::env::current_dir().ok().map(|d| d.display().to_string()),
                        "model": self.settings.model_id,
                        "thinkingLevel": self.settings.thinking_level,
                        "autoCompaction": self.settings.auto_compaction,
                    }));
                }
                ("stderr", Some(n)) => {
                    let mut err = std::io::stderr().lock();
                    let line = "stand-in stderr line\n";
                    let mut left = usize::try_from(n).unwrap_or(0);
                    while left > 0 {
                        let take = left.min(line.len());
                        let _ = err.write_all(&line.as_bytes()[..take]);
                        left -= take;
                    }
                    let _ = err.flush();
                }
                _ => {}
            }
            self.pump(Wait::Poll)?;
        }
        Ok(())
    }

    /// One failed model call ending its run, as pi reports it: the error message, `turn_end`,
    /// `agent_end`; the next run starts afresh.
    fn failed_attempt(&mut self, run: &mut Run, error: &str) {
        self.new_turn_if_needed(run);
        let message = with_error(assistant(json!([]), "error"), error);
        emit(&json!({"type": "message_start", "message": message}));
        emit(&json!({"type": "message_end", "message": message}));
        run.new_messages.push(message.clone());
        emit(&json!({"type": "turn_end", "message": message, "toolResults": []}));
        emit(&json!({"type": "agent_end", "messages": std::mem::take(&mut run.new_messages)}));
    }

    /// Closes the current pi turn and opens the next when it already has its assistant message.
    fn new_turn_if_needed(&mut self, run: &mut Run) {
        if let Some(message) = run.turn_assistant.take() {
            let results = std::mem::take(&mut run.turn_tool_results);
            emit(&json!({"type": "turn_end", "message": message, "toolResults": results}));
            emit(&json!({"type": "turn_start"}));
        }
    }

    fn stream_text(&mut self, run: &mut Run, deltas: &[String]) -> Result<(), Aborted> {
        self.stream_text_paced(run, deltas, None)
    }

    fn stream_text_paced(
        &mut self,
        run: &mut Run,
        deltas: &[String],
        pause: Option<Duration>,
    ) -> Result<(), Aborted> {
        self.new_turn_if_needed(run);
        let mut message = assistant(json!([]), "stop");
        emit(&json!({"type": "message_start", "message": message}));
        message["content"] = json!([{"type": "text", "text": ""}]);
        run.open_message = Some(message.clone());
        emit(&json!({
            "type": "message_update", "message": message,
            "assistantMessageEvent": {"type": "text_start", "contentIndex": 0, "partial": message}
        }));
        let mut text = String::new();
        for delta in deltas {
            match pause {
                Some(pause) => self.pump(Wait::Until(Instant::now() + pause))?,
                None => self.pump(Wait::Poll)?,
            };
            text.push_str(delta);
            message["content"][0]["text"] = json!(text);
            run.open_message = Some(message.clone());
            emit(&json!({
                "type": "message_update", "message": message,
                "assistantMessageEvent": {
                    "type": "text_delta", "contentIndex": 0, "delta": delta, "partial": message
                }
            }));
        }
        emit(&json!({
            "type": "message_update", "message": message,
            "assistantMessageEvent": {
                "type": "text_end", "contentIndex": 0, "content": text, "partial": message
            }
        }));
        self.end_message(run, message);
        Ok(())
    }

    fn end_message(&mut self, run: &mut Run, message: Value) {
        run.open_message = None;
        emit(&json!({"type": "message_end", "message": message}));
        run.new_messages.push(message.clone());
        run.turn_assistant = Some(message);
    }

    fn burst(&mut self, run: &mut Run, n: u64) -> Result<(), Aborted> {
        self.new_turn_if_needed(run);
        let stub = assistant(json!([]), "stop");
        emit(&json!({"type": "message_start", "message": stub}));
        run.open_message = Some(stub.clone());
        for i in 0..n {
            self.pump(Wait::Poll)?;
            emit(&json!({
                "type": "message_update", "message": stub,
                "assistantMessageEvent": {
                    "type": "text_delta", "contentIndex": 0, "delta": format!("b{i} "),
                    "partial": stub
                }
            }));
        }
        let mut message = stub;
        message["content"] = json!([{"type": "text", "text": format!("burst of {n}")}]);
        self.end_message(run, message);
        Ok(())
    }

    /// The `stream` directive: timestamped deltas at a steady rate. Every line due goes out in
    /// one write, so the agent side costs little next to the host it measures.
    fn stream(
        &mut self,
        run: &mut Run,
        n: u64,
        rate: u64,
        tag: u64,
        shape: StreamShape,
    ) -> Result<(), Aborted> {
        const LINE_BYTES: usize = 200;
        // Lines per write when there is no rate to keep (well under a 64 KiB pipe buffer).
        const CHUNK: u64 = 256;
        self.new_turn_if_needed(run);
        let stub = assistant(json!([]), "stop");
        emit(&json!({"type": "message_start", "message": stub}));
        run.open_message = Some(stub.clone());
        let start = Instant::now();
        let pad = "x".repeat(LINE_BYTES);
        let mut buf = String::new();
        let mut sent = 0;
        while sent < n {
            self.pump(Wait::Poll)?;
            let due = if rate == 0 {
                (sent + CHUNK).min(n)
            } else {
                let elapsed = start.elapsed().as_secs_f64();
                ((elapsed * rate as f64) as u64 + 1).min(n)
            };
            if due <= sent {
                // At most one write per millisecond, like a timer-driven producer.
                let at = start + Duration::from_secs_f64(sent as f64 / rate as f64);
                self.pump(Wait::Until(
                    at.max(Instant::now() + Duration::from_millis(1)),
                ))?;
                continue;
            }
            let t = SystemTime::now()
                .duration_since(UNIX_EPOCH)
                .map(|d| d.as_micros() as u64)
                .unwrap_or(0);
            buf.clear();
            for i in sent..due {
                match shape {
                    StreamShape::Fixed => {
                        let head = r#"{"type":"message_update","assistantMessageEvent":{"type":"text_delta","delta":""#;
                        let tail = format!(r#"","tag":{tag},"i":{i},"t":{t}}}}}"#);
                        let fill = LINE_BYTES.saturating_sub(head.len() + tail.len());
                        buf.push_str(head);
                        buf.push_str(&pad[..fill]);
                        buf.push_str(&tail);
                    }
                    StreamShape::Pi => pi_shaped_update(&mut buf, i, tag, t),
                }
                buf.push('\n');
            }
            write_raw(&buf);
            sent = due;
        }
        let mut message = stub;
        message["content"] = json!([{"type": "text", "text": format!("stream of {n}")}]);
        self.end_message(run, message);
        Ok(())
    }

    /// A tool call that ran at once (what it does is done by the caller): its assistant
    /// message, `tool_execution_start`, `tool_execution_end`, its result.
    fn file_tool(&mut self, run: &mut Run, name: &str, args: Value) {
        self.new_turn_if_needed(run);
        self.counter += 1;
        let call_id = format!("call_{}", self.counter);
        let call = json!({"type": "toolCall", "id": call_id, "name": name, "arguments": args});
        let mut message = assistant(json!([call]), "toolUse");
        message["stopReason"] = json!("toolUse");
        emit(&json!({"type": "message_start", "message": message}));
        self.end_message(run, message);
        emit(&json!({
            "type": "tool_execution_start", "toolCallId": call_id, "toolName": name, "args": args
        }));
        run.open_tool = Some((call_id, name.to_string(), args));
        self.end_tool(run, "done", false);
    }

    /// A tool call, optionally gated by an extension dialog of `kind` with a timeout.
    fn tool(
        &mut self,
        run: &mut Run,
        approval: Option<(&str, Option<u64>)>,
    ) -> Result<(), Aborted> {
        self.new_turn_if_needed(run);
        self.counter += 1;
        let call_id = format!("call_{}", self.counter);
        let name = "bash";
        let args = json!({"command": "echo stand-in"});
        let args_text = args.to_string();
        let call = json!({"type": "toolCall", "id": call_id, "name": name, "arguments": args});
        let mut message = assistant(json!([]), "stop");
        emit(&json!({"type": "message_start", "message": message}));
        message["content"] =
            json!([{"type": "toolCall", "id": call_id, "name": name, "arguments": {}}]);
        run.open_message = Some(message.clone());
        emit(&json!({
            "type": "message_update", "message": message,
            "assistantMessageEvent": {"type": "toolcall_start", "contentIndex": 0, "partial": message}
        }));
        self.pump(Wait::Poll)?;
        message["content"] = json!([call]);
        emit(&json!({
            "type": "message_update", "message": message,
            "assistantMessageEvent": {
                "type": "toolcall_delta", "contentIndex": 0, "delta": args_text, "partial": message
            }
        }));
        emit(&json!({
            "type": "message_update", "message": message,
            "assistantMessageEvent": {
                "type": "toolcall_end", "contentIndex": 0, "toolCall": call, "partial": message
            }
        }));
        message["stopReason"] = json!("toolUse");
        self.end_message(run, message);

        emit(&json!({
            "type": "tool_execution_start", "toolCallId": call_id, "toolName": name, "args": args
        }));
        run.open_tool = Some((call_id.clone(), name.to_string(), args.clone()));
        let verdict = match approval {
            None => Ok("none".to_string()),
            Some((kind, timeout)) => self.ask(kind, timeout)?,
        };
        match verdict {
            Ok(answer) => {
                self.pump(Wait::Poll)?;
                let partial = if approval.is_some() {
                    format!("running (answer: {answer})")
                } else {
                    "running".to_string()
                };
                emit(&json!({
                    "type": "tool_execution_update", "toolCallId": call_id, "toolName": name,
                    "args": args,
                    "partialResult": {"content": [{"type": "text", "text": partial}], "details": {}}
                }));
                self.pump(Wait::Poll)?;
                let text = if approval.is_some() {
                    format!("stand-in tool ran (answer: {answer})")
                } else {
                    "stand-in tool ran".to_string()
                };
                self.end_tool(run, &text, false);
            }
            Err(answer) => self.end_tool(run, &format!("Blocked by user (answer: {answer})"), true),
        }
        Ok(())
    }

    /// Emits a dialog request and waits for its answer: Ok(answer) allows, Err(answer) refuses.
    fn ask(&mut self, kind: &str, timeout: Option<u64>) -> Result<Result<String, String>, Aborted> {
        let id = self.uuid();
        let mut request = Map::new();
        request.insert("type".into(), json!("extension_ui_request"));
        request.insert("id".into(), json!(id));
        request.insert("method".into(), json!(kind));
        match kind {
            "confirm" => {
                request.insert("title".into(), json!("Allow bash?"));
                request.insert(
                    "message".into(),
                    json!("The agent wants to run: echo stand-in"),
                );
            }
            "select" => {
                request.insert("title".into(), json!("Allow bash: echo stand-in?"));
                request.insert("options".into(), json!(["Allow", "Block"]));
            }
            "input" => {
                request.insert("title".into(), json!("Why should bash run?"));
                request.insert("placeholder".into(), json!("a reason"));
            }
            _ => {
                request.insert("title".into(), json!("Edit the command"));
                request.insert("prefill".into(), json!("echo stand-in"));
            }
        }
        // pi sends `timeout` for every dialog but the editor, and only when the extension gave one.
        if let (Some(ms), false) = (timeout, kind == "editor") {
            request.insert("timeout".into(), json!(ms));
        }
        emit(&Value::Object(request));
        let deadline = timeout.map(|ms| Instant::now() + Duration::from_millis(ms));
        let Some(answer) = self.pump(Wait::Ui(&id, deadline))? else {
            return Ok(Err("timeout".to_string()));
        };
        if answer.get("cancelled").and_then(Value::as_bool) == Some(true) {
            return Ok(Err("cancelled".to_string()));
        }
        if kind == "confirm" {
            return Ok(match answer.get("confirmed").and_then(Value::as_bool) {
                Some(true) => Ok("true".to_string()),
                _ => Err("false".to_string()),
            });
        }
        Ok(match answer.get("value") {
            Some(Value::String(value)) if kind == "select" && value == "Block" => {
                Err(value.clone())
            }
            Some(Value::String(value)) => Ok(value.clone()),
            _ => Err("cancelled".to_string()),
        })
    }

    /// The `output` directive: a tool whose output streams as pi's bash tool reports it.
    fn tool_output(&mut self, run: &mut Run, bytes: u64) -> Result<(), Aborted> {
        const MAX_LINES: usize = 2000;
        const MAX_BYTES: usize = 50 * 1024;
        const UPDATE_BYTES: u64 = 4096;
        self.new_turn_if_needed(run);
        self.counter += 1;
        let call_id = format!("call_{}", self.counter);
        let args = json!({"command": format!("seq-lines {bytes}")});
        emit(&json!({
            "type": "tool_execution_start", "toolCallId": call_id, "toolName": "bash", "args": args
        }));
        run.open_tool = Some((call_id.clone(), "bash".to_string(), args.clone()));
        let mut lines: std::collections::VecDeque<String> = std::collections::VecDeque::new();
        let (mut kept_bytes, mut written, mut total_lines) = (0usize, 0u64, 0u64);
        while written < bytes {
            self.pump(Wait::Poll)?;
            let goal = (written + UPDATE_BYTES).min(bytes);
            while written < goal {
                let line = format!("{:0>63}\n", total_lines);
                written += line.len() as u64;
                total_lines += 1;
                kept_bytes += line.len();
                lines.push_back(line);
                while lines.len() > MAX_LINES || kept_bytes > MAX_BYTES {
                    kept_bytes -= lines.pop_front().map_or(0, |l| l.len());
                }
            }
            let text: String = lines.iter().map(String::as_str).collect();
            let details = if total_lines as usize > lines.len() {
                json!({"truncation": {"truncated": true, "truncatedBy": "bytes",
                       "totalLines": total_lines, "totalBytes": written,
                       "outputLines": lines.len(), "outputBytes": kept_bytes}})
            } else {
                json!({})
            };
            emit(&json!({
                "type": "tool_execution_update", "toolCallId": call_id, "toolName": "bash",
                "args": args,
                "partialResult": {"content": [{"type": "text", "text": text}], "details": details}
            }));
        }
        let text: String = lines.iter().map(String::as_str).collect();
        self.end_tool(run, &text, false);
        Ok(())
    }

    fn end_tool(&mut self, run: &mut Run, text: &str, is_error: bool) {
        let Some((call_id, name, _args)) = run.open_tool.take() else {
            return;
        };
        let result = json!({"content": [{"type": "text", "text": text}], "details": {}});
        emit(&json!({
            "type": "tool_execution_end", "toolCallId": call_id, "toolName": name,
            "result": result, "isError": is_error
        }));
        let message = json!({
            "role": "toolResult", "toolCallId": call_id, "toolName": name,
            "content": result["content"], "details": {}, "isError": is_error,
            "timestamp": now_ms()
        });
        emit(&json!({"type": "message_start", "message": message}));
        emit(&json!({"type": "message_end", "message": message}));
        run.new_messages.push(message.clone());
        run.turn_tool_results.push(message);
    }

    fn spawn_child(&mut self, inherit: bool) {
        let mut command = Command::new("sleep");
        command.arg("1000");
        if !inherit {
            command
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null());
        }
        match command.spawn() {
            Ok(child) => {
                emit(
                    &json!({"type": "stand_in_child", "pid": child.id(), "inheritsPipes": inherit}),
                );
                self.children.push(child);
            }
            Err(err) => emit(&json!({"type": "stand_in_child", "error": err.to_string()})),
        }
    }

    /// Delivers queued steering, makes sure the last turn has a final answer, and ends the run.
    fn finish(&mut self, run: &mut Run) -> Result<(), Stop> {
        let final_needed = match &run.turn_assistant {
            None => true,
            Some(message) => message["stopReason"] == "toolUse",
        };
        if final_needed {
            self.stream_text(run, &["done".to_string()])?;
        }
        while !self.steering.is_empty() {
            let steering = std::mem::take(&mut self.steering);
            self.new_turn_if_needed(run);
            for text in &steering {
                let user = user_message(text);
                emit(&json!({"type": "message_start", "message": user}));
                emit(&json!({"type": "message_end", "message": user}));
                run.new_messages.push(user);
            }
            emit(&json!({"type": "queue_update", "steering": [], "followUp": []}));
            let reply = format!("steered: {}", steering.join(" | "));
            self.stream_text(run, &[reply])?;
        }
        let message = run.turn_assistant.take().unwrap_or(Value::Null);
        let results = std::mem::take(&mut run.turn_tool_results);
        emit(&json!({"type": "turn_end", "message": message, "toolResults": results}));
        emit(&json!({"type": "agent_end", "messages": run.new_messages}));
        Ok(())
    }

    /// Ends a run that was aborted, the way pi does.
    fn end_aborted(&mut self, run: &mut Run) {
        if run.open_tool.is_some() {
            self.end_tool(run, "Tool execution was aborted", true);
        }
        let message = match run.open_message.take() {
            Some(partial) => {
                let mut partial = with_error(partial, ABORTED);
                partial["stopReason"] = json!("aborted");
                // pi closes the open text block first, already marked as aborted.
                if partial["content"][0]["type"] == "text" {
                    let text = partial["content"][0]["text"].clone();
                    emit(&json!({
                        "type": "message_update", "message": partial,
                        "assistantMessageEvent": {
                            "type": "text_end", "contentIndex": 0, "content": text,
                            "partial": partial
                        }
                    }));
                }
                partial
            }
            None => {
                // The next model call fails at once: a new turn when this one already answered.
                self.new_turn_if_needed(run);
                let message = with_error(assistant(json!([]), "aborted"), ABORTED);
                emit(&json!({"type": "message_start", "message": message}));
                message
            }
        };
        let mut message = message;
        message["stopReason"] = json!("aborted");
        emit(&json!({"type": "message_end", "message": message}));
        run.new_messages.push(message.clone());
        let results = std::mem::take(&mut run.turn_tool_results);
        emit(&json!({"type": "turn_end", "message": message, "toolResults": results}));
        emit(&json!({"type": "agent_end", "messages": run.new_messages}));
    }
}

fn with_error(mut message: Value, error: &str) -> Value {
    message["errorMessage"] = json!(error);
    message
}

fn respond(id: Option<Value>, command: &str, data: Option<Value>) {
    let mut response = Map::new();
    if let Some(id) = id {
        response.insert("id".into(), id);
    }
    response.insert("type".into(), json!("response"));
    response.insert("command".into(), json!(command));
    response.insert("success".into(), json!(true));
    if let Some(data) = data {
        response.insert("data".into(), data);
    }
    emit(&Value::Object(response));
}

fn respond_error(id: Option<Value>, command: &str, error: &str) {
    let mut response = Map::new();
    if let Some(id) = id {
        response.insert("id".into(), id);
    }
    response.insert("type".into(), json!("response"));
    response.insert("command".into(), json!(command));
    response.insert("success".into(), json!(false));
    response.insert("error".into(), json!(error));
    emit(&Value::Object(response));
}

/// The text of a directive's hex argument (two digits a byte, UTF-8); what does not decode is
/// left out.
fn unhex(arg: Option<&str>) -> String {
    let digits = arg.unwrap_or("").as_bytes();
    let bytes: Vec<u8> = digits
        .chunks(2)
        .filter_map(|pair| u8::from_str_radix(std::str::from_utf8(pair).ok()?, 16).ok())
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
