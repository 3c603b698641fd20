//! The real pi agent for end-to-end tests (`@mariozechner/pi-coding-agent`, installed by
//! `npm ci --prefix tests/pi`), run fully offline against a stub OpenAI-compatible model server
//! that records every request pi sends (body and `Authorization` header).

use crate::HostProcess;
use axum::Router;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::post;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

pub const INSTALL: &str = "npm ci --prefix tests/pi --no-audit --no-fund --loglevel=error";

/// `tests/pi` in the repository.
pub fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("pi")
}

/// pi's entry point (the package's `bin.pi`), or a failure telling how to install it.
pub fn pi_cli() -> PathBuf {
    let package = fixture_dir().join("node_modules/@mariozechner/pi-coding-agent");
    let manifest = std::fs::read_to_string(package.join("package.json")).unwrap_or_else(|err| {
        panic!(
            "the real pi agent is not installed under {} ({err}); run `{INSTALL}` from the \
             repository root (scripts/test does)",
            fixture_dir().display()
        )
    });
    let manifest: Value = serde_json::from_str(&manifest).expect("pi's package.json");
    let version = manifest["version"].as_str().unwrap_or("");
    assert!(
        version.starts_with("0.73."),
        "tests/pi has pi {version}, expected 0.73.x; run `{INSTALL}`"
    );
    let entry = manifest["bin"]["pi"]
        .as_str()
        .expect("bin.pi in package.json");
    let cli = package.join(entry);
    assert!(
        cli.exists(),
        "{} is missing; run `{INSTALL}`",
        cli.display()
    );
    cli.canonicalize().expect("pi's cli path")
}

// ---------------------------------------------------------------------------------------------
// The stub model: an OpenAI-compatible `POST /v1/chat/completions` that streams SSE.

#[derive(Clone, Default)]
pub struct Stub {
    /// Every request body, in arrival order.
    pub requests: Arc<Mutex<Vec<Value>>>,
    /// When set, every request fails this way (see [`failure`]).
    pub failure: Arc<Mutex<Option<&'static str>>>,
    /// Every request's `Authorization` header, in arrival order (None when it had none).
    pub authorizations: Arc<Mutex<Vec<Option<String>>>>,
    /// The port it serves on, once started.
    port: Arc<Mutex<Option<u16>>>,
    /// While set, each request is recorded and then held until the test releases a permit
    /// ([`Stub::hold`], [`Stub::release`]): a run stays going for as long as the test needs.
    gate: Arc<Mutex<Option<Arc<tokio::sync::Semaphore>>>>,
    /// Tool calls to ask for, one per reply, before the default behaviour ([`Stub::script`]).
    script: Arc<Mutex<std::collections::VecDeque<(String, Value)>>>,
    /// How many scripted calls were asked for: each gets its own id, `call_script_N`.
    scripted: Arc<Mutex<usize>>,
}

/// A 1×1 PNG in base64: an image for a prompt.
pub const PNG: &str = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";

/// In a prompt, has the stub ask for pi's `edit` tool on `notes.txt` (`two\n` becomes
/// `TWO\nthree\n`: 2 lines added, 1 removed) instead of `bash`.
pub const EDIT_NOTES: &str = "EDIT-NOTES";

/// What the stub answers a compaction's summary request with (pi's summarization prompt).
pub const STUB_SUMMARY: &str = "STUB-SUMMARY: the user ran the check; it passed.";

impl Stub {
    /// From now on each request waits for a [`Stub::release`] before it is answered.
    pub fn hold(&self) {
        *self.gate.lock().unwrap() = Some(Arc::new(tokio::sync::Semaphore::new(0)));
    }

    /// Answers every held request and every later one at once.
    pub fn release(&self) {
        if let Some(gate) = self.gate.lock().unwrap().take() {
            gate.close();
        }
    }

    /// Waits, while [`Stub::hold`] holds, until [`Stub::release`].
    async fn pass_the_gate(&self) {
        let gate = self.gate.lock().unwrap().clone();
        if let Some(gate) = gate {
            // Closed by `release`: every waiter goes on.
            let _ = gate.acquire().await;
        }
    }

    /// Queues tool calls: each next reply asks for the next one (`name`, its arguments), with
    /// id `call_script_N` (N from 1); once they are spent, a reply after a tool result answers
    /// "done" as usual.
    pub fn script(&self, calls: &[(&str, Value)]) {
        let mut script = self.script.lock().unwrap();
        script.extend(
            calls
                .iter()
                .map(|(name, args)| (name.to_string(), args.clone())),
        );
    }

    /// The next scripted tool call and its id, if any is left.
    fn next_scripted(&self) -> Option<(String, String, Value)> {
        let (name, args) = self.script.lock().unwrap().pop_front()?;
        let mut n = self.scripted.lock().unwrap();
        *n += 1;
        Some((format!("call_script_{n}"), name, args))
    }

    /// The port [`start_stub`] serves it on.
    pub fn port(&self) -> u16 {
        self.port.lock().unwrap().expect("the stub was started")
    }
}

/// An OpenAI-style error response.
pub fn api_error(status: u16, message: &str, kind: &str, code: &str) -> Response {
    let body = json!({"error": {"message": message, "type": kind, "param": null, "code": code}});
    let status = StatusCode::from_u16(status).unwrap();
    (
        status,
        [(header::CONTENT_TYPE, "application/json")],
        body.to_string(),
    )
        .into_response()
}

/// The stub's failure modes: what a real provider answers in each case.
pub fn failure(mode: &str) -> Response {
    match mode {
        "401" => api_error(
            401,
            "Incorrect API key provided: sk-test-abcdefghijklmnopqrstuvwxyz0123. You can find your API key at https://platform.openai.com/account/api-keys.",
            "invalid_request_error",
            "invalid_api_key",
        ),
        "429" => {
            let mut response = api_error(
                429,
                "Rate limit reached for stub-model on requests per min (RPM): Limit 3, Used 3, Requested 1. Please try again in 7s.",
                "requests",
                "rate_limit_exceeded",
            );
            response
                .headers_mut()
                .insert("retry-after", header::HeaderValue::from_static("7"));
            response
        }
        "quota" => api_error(
            429,
            "You exceeded your current quota, please check your plan and billing details.",
            "insufficient_quota",
            "insufficient_quota",
        ),
        "500" => api_error(
            500,
            "The server had an error while processing your request. Sorry about that!",
            "server_error",
            "server_error",
        ),
        "502" => (StatusCode::BAD_GATEWAY, "Bad Gateway").into_response(),
        "context" => api_error(
            400,
            "This model's maximum context length is 32000 tokens. However, your messages resulted in 40213 tokens. Please reduce the length of the messages.",
            "invalid_request_error",
            "context_length_exceeded",
        ),
        "404" => api_error(
            404,
            "The model `stub-model` does not exist or you do not have access to it.",
            "invalid_request_error",
            "model_not_found",
        ),
        "cut" => {
            // One chunk, then the connection drops without the stream's end.
            use futures_util::StreamExt;
            let first = chunk(json!({"role": "assistant", "content": "Half an ans"}), None);
            let parts: Vec<Result<String, std::io::Error>> =
                vec![Ok(first), Err(std::io::Error::other("cut"))];
            let body = futures_util::stream::iter(parts).then(|part| async move {
                tokio::time::sleep(Duration::from_millis(200)).await;
                part
            });
            (
                [(header::CONTENT_TYPE, "text/event-stream")],
                axum::body::Body::from_stream(body),
            )
                .into_response()
        }
        "empty" => {
            let mut sse = chunk(json!({"role": "assistant", "content": ""}), None);
            sse += &chunk(json!({}), Some("stop"));
            sse += "data: [DONE]\n\n";
            ([(header::CONTENT_TYPE, "text/event-stream")], sse).into_response()
        }
        "drop" => {
            // The connection closes with no response at all: unwinding ends the connection's
            // task (resume_unwind skips the panic hook, so nothing is printed).
            std::panic::resume_unwind(Box::new("the stub drops the connection"))
        }
        other => panic!("unknown stub failure {other}"),
    }
}

/// The failure mode in which the stub refuses the key it was sent and quotes it back, whole and
/// in several spellings, as some providers do: in its message, as a header echo, in a URL and
/// JSON-escaped inside a string.
pub const ECHO_KEY: &str = "echo-key";

fn echo_key(headers: &HeaderMap) -> Response {
    let sent = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let key = sent.strip_prefix("Bearer ").unwrap_or(sent);
    let nested = json!({ "received": key }).to_string();
    api_error(
        401,
        &format!(
            "Incorrect API key provided: {key}. You sent '{sent}' to \
             https://stub.example/v1?k={key} (echo {nested})."
        ),
        "invalid_request_error",
        "invalid_api_key",
    )
}

pub fn chunk(delta: Value, finish_reason: Option<&str>) -> String {
    let chunk = json!({
        "id": "chatcmpl-stub",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "stub-model",
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish_reason}],
    });
    format!("data: {chunk}\n\n")
}

async fn completions(State(stub): State<Stub>, headers: HeaderMap, body: String) -> Response {
    let authorization = headers
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    stub.authorizations.lock().unwrap().push(authorization);
    let failing = *stub.failure.lock().unwrap();
    if let Some(mode) = failing {
        stub.requests
            .lock()
            .unwrap()
            .push(serde_json::from_str(&body).unwrap_or(Value::Null));
        if mode == ECHO_KEY {
            return echo_key(&headers);
        }
        return failure(mode);
    }
    let request: Value = serde_json::from_str(&body).unwrap_or(Value::Null);
    if body.contains("context summarization assistant") {
        stub.requests.lock().unwrap().push(request);
        stub.pass_the_gate().await;
        let mut sse = chunk(json!({"role": "assistant", "content": STUB_SUMMARY}), None);
        sse += &chunk(json!({}), Some("stop"));
        sse += "data: [DONE]\n\n";
        return ([(header::CONTENT_TYPE, "text/event-stream")], sse).into_response();
    }
    // pi asks for usage in the stream unless its model says the provider cannot send it.
    let wants_usage = request["stream_options"]["include_usage"] == true;
    // A tool result last: the tool ran, so answer; anything else (a new prompt, in a new
    // conversation or after earlier turns) asks for the tool.
    let has_tool_result = request["messages"]
        .as_array()
        .and_then(|messages| messages.last())
        .is_some_and(|last| last["role"] == "tool");
    stub.requests.lock().unwrap().push(request);
    stub.pass_the_gate().await;
    let mut sse = String::new();
    if let Some((id, name, args)) = stub.next_scripted() {
        sse += &chunk(
            json!({"role": "assistant", "content": "Calling a tool."}),
            None,
        );
        let call = json!({"index": 0, "id": id, "type": "function",
            "function": {"name": name, "arguments": args.to_string()}});
        sse += &chunk(json!({"tool_calls": [call]}), None);
        sse += &chunk(json!({}), Some("tool_calls"));
    } else if let Some(chunks) = long_reply(&body) {
        // `LONG-REPLY:N` in the prompt: N text chunks of 10 characters.
        sse += &chunk(json!({"role": "assistant", "content": ""}), None);
        for i in 0..chunks {
            sse += &chunk(json!({"content": format!("word{i:05} ")}), None);
        }
        sse += &chunk(json!({}), Some("stop"));
    } else if body.contains(EDIT_NOTES) && !has_tool_result {
        // `EDIT-NOTES` in the prompt: pi's edit tool on `notes.txt`, `two` becoming two lines.
        sse += &chunk(json!({"role": "assistant", "content": "Editing."}), None);
        let arguments = json!({"path": "notes.txt", "edits": [{"oldText": "two\n", "newText": "TWO\nthree\n"}]});
        let call = json!({"index": 0, "id": "call_stub_edit", "type": "function",
            "function": {"name": "edit", "arguments": arguments.to_string()}});
        sse += &chunk(json!({"tool_calls": [call]}), None);
        sse += &chunk(json!({}), Some("tool_calls"));
    } else if has_tool_result {
        sse += &chunk(json!({"role": "assistant", "content": "done"}), None);
        sse += &chunk(json!({"content": ", the check passed."}), None);
        sse += &chunk(json!({}), Some("stop"));
    } else {
        sse += &chunk(json!({"role": "assistant", "content": "Let me "}), None);
        sse += &chunk(json!({"content": "run the check."}), None);
        let call = |function: Value, first: bool| {
            let mut call = json!({"index": 0, "function": function});
            if first {
                call["id"] = json!("call_stub_1");
                call["type"] = json!("function");
            }
            json!({"tool_calls": [call]})
        };
        sse += &chunk(
            call(json!({"name": "bash", "arguments": "{\"command\": "}), true),
            None,
        );
        sse += &chunk(
            call(json!({"arguments": "\"echo real-pi-ok\"}"}), false),
            None,
        );
        sse += &chunk(json!({}), Some("tool_calls"));
    }
    if wants_usage {
        sse += &usage_chunk();
    }
    sse += "data: [DONE]\n\n";
    (
        [
            (header::CONTENT_TYPE, "text/event-stream"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        sse,
    )
        .into_response()
}

/// The usage the stub reports for every reply it streams, as OpenAI names it: 1 200 prompt
/// tokens of which 200 were cached, and 34 completion tokens. pi reads it as `input` 1 000,
/// `cacheRead` 200, `output` 34 (see [`STUB_USAGE`]).
pub const STUB_PROMPT_TOKENS: u64 = 1200;
pub const STUB_CACHED_TOKENS: u64 = 200;
pub const STUB_COMPLETION_TOKENS: u64 = 34;

/// What pi makes of one stub reply's usage: `input`, `output`, `cacheRead`, `cacheWrite`, and
/// its cost in dollars at the stub model's prices (per million tokens: input 3, output 15,
/// cache read 0.3).
pub const STUB_USAGE: (u64, u64, u64, u64, f64) = (
    STUB_PROMPT_TOKENS - STUB_CACHED_TOKENS,
    STUB_COMPLETION_TOKENS,
    STUB_CACHED_TOKENS,
    0,
    ((STUB_PROMPT_TOKENS - STUB_CACHED_TOKENS) as f64 * 3.0
        + STUB_COMPLETION_TOKENS as f64 * 15.0
        + STUB_CACHED_TOKENS as f64 * 0.3)
        / 1e6,
);

/// The last chunk OpenAI streams when asked: no choices, the request's usage.
fn usage_chunk() -> String {
    let chunk = json!({
        "id": "chatcmpl-stub",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": "stub-model",
        "choices": [],
        "usage": {
            "prompt_tokens": STUB_PROMPT_TOKENS,
            "completion_tokens": STUB_COMPLETION_TOKENS,
            "total_tokens": STUB_PROMPT_TOKENS + STUB_COMPLETION_TOKENS,
            "prompt_tokens_details": {"cached_tokens": STUB_CACHED_TOKENS},
        },
    });
    format!("data: {chunk}\n\n")
}

/// N when the request's prompt asks for `LONG-REPLY:N`.
fn long_reply(body: &str) -> Option<usize> {
    let rest = &body[body.find("LONG-REPLY:")? + "LONG-REPLY:".len()..];
    let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
    digits.parse().ok()
}

/// Serves the stub on 127.0.0.1 with an OS-chosen port; returns the port.
pub async fn start_stub(stub: Stub) -> u16 {
    let app = Router::new()
        .route("/v1/chat/completions", post(completions))
        .with_state(stub.clone());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind stub model");
    let port = listener.local_addr().unwrap().port();
    *stub.port.lock().unwrap() = Some(port);
    tokio::spawn(async move { axum::serve(listener, app).await });
    port
}

/// pi's config dir (`PI_CODING_AGENT_DIR`): the stub provider as default model, retries off:
/// `retry.enabled: false` stops pi's own retries (agent-session's `auto_retry`), and
/// `retry.provider.maxRetries: 0` the provider SDK's (the OpenAI SDK retries a 429 or 5xx twice
/// by default, waiting for `retry-after`); `compaction.enabled: false` keeps a context overflow
/// from starting a summary request. Each failure then costs one request.
pub fn pi_config(port: u16) -> tempfile::TempDir {
    let dir = tempfile::tempdir().expect("temp dir");
    write_pi_config(dir.path(), port);
    dir
}

/// Writes [`pi_config`]'s files into `dir` (created if need be): pi's own config directory of a
/// remote user (`~/.pi/agent`), say.
pub fn write_pi_config(dir: &Path, port: u16) {
    std::fs::create_dir_all(dir).expect("pi's config dir");
    let models = json!({"providers": {"stub": {
        "baseUrl": format!("http://127.0.0.1:{port}/v1"),
        "api": "openai-completions",
        "apiKey": "any-non-empty",
        "compat": {"supportsDeveloperRole": false, "supportsReasoningEffort": false},
        "models": [{
            "id": "stub-model", "name": "Stub", "reasoning": false, "input": ["text", "image"],
            "contextWindow": 32000, "maxTokens": 4096,
            "cost": {"input": 3, "output": 15, "cacheRead": 0.3, "cacheWrite": 0},
        }],
    }}});
    let settings = json!({
        "defaultProvider": "stub",
        "defaultModel": "stub-model",
        "quietStartup": true,
        "retry": {"enabled": false, "provider": {"maxRetries": 0}},
        "compaction": {"enabled": false},
    });
    std::fs::write(dir.join("models.json"), models.to_string()).unwrap();
    std::fs::write(dir.join("settings.json"), settings.to_string()).unwrap();
}

/// A host whose agent is the real pi, talking to `stub`; `extension` is loaded with `-e`. The
/// returned directory is pi's config, to keep until the host stops.
pub async fn pi_host(stub: &Stub, extension: Option<&Path>) -> (HostProcess, tempfile::TempDir) {
    pi_host_with(stub, extension, &[]).await
}

/// The words of the command that runs the real pi offline (`extension` loaded with `-e`).
pub fn pi_words(cli: &Path, extension: Option<&Path>) -> Vec<String> {
    let mut words: Vec<String> = [
        "node",
        cli.to_str().unwrap(),
        "--mode",
        "rpc",
        "--offline",
        "--no-session",
        "--thinking",
        "off",
        "--no-skills",
        "--no-prompt-templates",
        "--no-context-files",
    ]
    .map(String::from)
    .to_vec();
    if let Some(extension) = extension {
        words.extend(["-e".to_string(), extension.to_str().unwrap().to_string()]);
    }
    words
}

/// [`pi_words`] with pi's session files on: pi then saves each session in the directory the
/// host names (`PI_CODING_AGENT_SESSION_DIR`) and resumes it (`--continue`), as in production.
pub fn pi_words_saving(cli: &Path) -> Vec<String> {
    pi_words(cli, None)
        .into_iter()
        .filter(|word| word != "--no-session")
        .collect()
}

/// A host whose agent is the real pi with its session files on ([`pi_words_saving`]); also
/// returns the `--agent` command, to start the host again with it.
pub async fn pi_host_saving(stub: &Stub) -> (HostProcess, tempfile::TempDir, String) {
    let port = start_stub(stub.clone()).await;
    let pi_dir = pi_config(port);
    let agent = shell_words::join(pi_words_saving(&pi_cli()));
    let env = pi_env(pi_dir.path());
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    let args = ["--agent", &agent, "--permission-mode", "auto"];
    let host = HostProcess::start_with_env(&crate::pi_host_binary(), &args, &env).await;
    (host, pi_dir, agent)
}

/// The environment pi runs with: its own config dir, offline.
pub fn pi_env(pi_dir: &Path) -> [(&'static str, String); 4] {
    [
        ("PI_CODING_AGENT_DIR", pi_dir.to_str().unwrap().to_string()),
        ("PI_OFFLINE", "1".to_string()),
        ("PI_SKIP_VERSION_CHECK", "1".to_string()),
        ("PI_TELEMETRY", "0".to_string()),
    ]
}

/// [`pi_host`] with extra `serve` arguments.
pub async fn pi_host_with(
    stub: &Stub,
    extension: Option<&Path>,
    extra: &[&str],
) -> (HostProcess, tempfile::TempDir) {
    pi_host_env(stub, extension, extra, &[]).await
}

/// [`pi_host_with`] with extra environment variables for the host (a `HOME`, say). Unless
/// `extra` names a `--permission-mode`, the host runs its sessions in `auto`, so that a test
/// of something else meets no permission approval for the stub's `bash` call in the
/// workspace (tests/permissions.rs tests the policy).
pub async fn pi_host_env(
    stub: &Stub,
    extension: Option<&Path>,
    extra: &[&str],
    extra_env: &[(&str, &str)],
) -> (HostProcess, tempfile::TempDir) {
    let port = start_stub(stub.clone()).await;
    let pi_dir = pi_config(port);
    let agent = shell_words::join(pi_words(&pi_cli(), extension));
    let mut args = vec!["--agent", agent.as_str()];
    if !extra.contains(&"--permission-mode") {
        args.extend(["--permission-mode", "auto"]);
    }
    args.extend_from_slice(extra);
    let env = pi_env(pi_dir.path());
    let mut env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    env.extend_from_slice(extra_env);
    let host = HostProcess::start_with_env(&crate::pi_host_binary(), &args, &env).await;
    (host, pi_dir)
}
