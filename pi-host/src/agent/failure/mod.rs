//! Why a run failed: the one place that reads pi's error wording and fields and turns them into
//! the terminal `AppError` of a turn (docs/protocol.md §8.7 "Why a turn failed").
//!
//! pi 0.73 hands a provider failure over as text: pi-ai catches the provider SDK's exception and
//! puts its `message` into the last assistant message's `errorMessage` (`stopReason: "error"`);
//! the SDKs format an HTTP failure as `"<status> <provider message>"` (or `"<status> status code
//! (no body)"`), so the status is the leading number. The message also carries `provider` and
//! `model`. Nothing else survives: no headers (so no `Retry-After`), no errno from the fetch cause
//! beyond what the SDK wrote into the text. pi's own retry decision (`_isRetryableError`) and its
//! context-overflow check (`isContextOverflow`) are regular expressions over the same text; they
//! are mirrored here so the terminal code agrees with what pi decided during the run.

use super::{RunEnd, StopReason};
use racp_proto::{AppError, ErrorCode, ErrorSource};
use serde_json::{Map, Value, json};
use std::sync::atomic::{AtomicU64, Ordering};

/// A trace id for an agent-originated error; the host logs it with the error, so the id in an
/// event finds the log line.
pub fn trace_id() -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64);
    format!(
        "a{:x}",
        now.rotate_left(20) ^ NEXT.fetch_add(1, Ordering::Relaxed)
    )
}

/// How much of the provider's message is kept in `details.providerMessage`.
pub const PROVIDER_MESSAGE_CAP: usize = 600;

/// What pi's automatic retries did during the run (`auto_retry_start` / `auto_retry_end`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct RetryTrail {
    /// The highest `attempt` of an `auto_retry_start`, or of an `auto_retry_end` that gave up.
    pub attempts: u32,
    /// An `auto_retry_end` with `success: false` was seen: pi stopped retrying.
    pub gave_up: bool,
}

pub use racp_proto::pi::RunSignal;

/// How a run ended, as far as the turn is concerned.
#[derive(Debug, Clone, PartialEq)]
pub enum Verdict {
    Completed,
    /// A structured abort, or one of the fixed abort phrases.
    Aborted(AppError),
    Failed(AppError),
    /// Failed, but pi may still retry it (its retry pattern or its overflow recovery matched):
    /// final only if no `auto_retry_start` / overflow compaction follows.
    FailedUnlessRetried(AppError),
}

/// The turn's verdict for a run that ended with `end`.
pub fn verdict(end: &RunEnd, trail: &RetryTrail, trace_id: &str) -> Verdict {
    match end.stop_reason {
        StopReason::Aborted => Verdict::Aborted(aborted(trace_id)),
        StopReason::Finished if end.empty => Verdict::Failed(
            AppError::new(
                ErrorCode::EmptyModelResponse,
                "the model ended its turn with no text and no tool call",
            )
            .with_source(ErrorSource::Agent)
            .with_details(base_details(end))
            .with_trace_id(trace_id),
        ),
        StopReason::Finished | StopReason::Unknown => Verdict::Completed,
        StopReason::Error => {
            let message = end.error_message.as_deref().unwrap_or("");
            if is_abort_phrase(message) {
                return Verdict::Aborted(aborted(trace_id));
            }
            let error = classify(end, trail, trace_id);
            if !trail.gave_up && (pi_retries(message) || is_context_overflow(message)) {
                Verdict::FailedUnlessRetried(error)
            } else {
                Verdict::Failed(error)
            }
        }
    }
}

fn aborted(trace_id: &str) -> AppError {
    AppError::new(ErrorCode::TurnAborted, "the turn was aborted")
        .with_source(ErrorSource::Agent)
        .with_trace_id(trace_id)
}

/// The only wording that is an abort (docs/protocol.md §8.7): pi's own "Request was aborted"
/// (pi-ai throws it when the signal fired) and the fixed phrases the desktop treats as aborts.
/// "stream aborted" and "software caused connection abort" are not aborts.
fn is_abort_phrase(message: &str) -> bool {
    let m = message.trim().trim_end_matches('.').to_ascii_lowercase();
    matches!(
        m.as_str(),
        "request aborted" | "request was aborted" | "the operation was aborted" | "turn aborted"
    )
}

/// The HTTP status the provider SDK put in front of its message (`"429 ..."`).
fn leading_status(message: &str) -> Option<u16> {
    let digits: String = message.chars().take_while(char::is_ascii_digit).collect();
    let rest = &message[digits.len()..];
    if digits.len() != 3 || !(rest.is_empty() || rest.starts_with(' ')) {
        return None;
    }
    digits.parse().ok().filter(|s| (400..600).contains(s))
}

/// pi's `_isRetryableError` pattern (agent-session.js), applied by pi before it retries.
fn pi_retries(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    const WORDS: &[&str] = &[
        "overloaded",
        "too many requests",
        "429",
        "500",
        "502",
        "503",
        "504",
        "other side closed",
        "fetch failed",
        "reset before headers",
        "socket hang up",
        "ended without",
        "http2 request did not get a response",
        "timeout",
        "terminated",
        "retry delay",
    ];
    const PAIRS: &[(&str, &str)] = &[
        ("provider", "returned error"),
        ("rate", "limit"),
        ("service", "unavailable"),
        ("server", "error"),
        ("internal", "error"),
        ("network", "error"),
        ("connection", "error"),
        ("connection", "refused"),
        ("connection", "lost"),
        ("websocket", "closed"),
        ("websocket", "error"),
        ("upstream", "connect"),
        ("time", "out"),
        ("timed", "out"),
    ];
    !is_context_overflow(message)
        && (WORDS.iter().any(|w| m.contains(w)) || PAIRS.iter().any(|(a, b)| joined(&m, a, b)))
}

/// `a` and `b` joined by at most one character, as pi's `a.?b`.
fn joined(m: &str, a: &str, b: &str) -> bool {
    m.match_indices(a).any(|(i, _)| {
        let rest = &m[i + a.len()..];
        rest.starts_with(b)
            || rest
                .char_indices()
                .nth(1)
                .is_some_and(|(j, _)| rest[j..].starts_with(b))
    })
}

/// pi-ai's `isContextOverflow` for an error message (utils/overflow.js): the overflow patterns,
/// unless a rate-limit pattern matches too.
pub fn is_context_overflow(message: &str) -> bool {
    let m = message.to_ascii_lowercase();
    let non_overflow = m.starts_with("throttling error:")
        || m.starts_with("service unavailable:")
        || m.contains("rate limit")
        || m.contains("too many requests");
    if non_overflow {
        return false;
    }
    const WORDS: &[&str] = &[
        "prompt is too long",
        "request_too_large",
        "input is too long for requested model",
        "exceeds the context window",
        "reduce the length of the messages",
        "exceeds the available context size",
        "greater than the context length",
        "context window exceeds limit",
        "exceeded model token limit",
        "model_context_window_exceeded",
        "too many tokens",
        "token limit exceeded",
        "context_length_exceeded",
        "context length exceeded",
        "context_length exceeded",
        "context length_exceeded",
    ];
    if WORDS.iter().any(|w| m.contains(w)) {
        return true;
    }
    let number_after = |prefix: &str| {
        m.match_indices(prefix).any(|(i, _)| {
            m[i + prefix.len()..]
                .chars()
                .next()
                .is_some_and(|c| c.is_ascii_digit())
        })
    };
    if number_after("maximum prompt length is ")
        || number_after("exceeds the limit of ")
        || (number_after("maximum context length is ") && m.contains(" tokens"))
        || (m.contains("too large for model with ") && m.contains("maximum context length"))
        || (m.contains("input token count") && m.contains("exceeds the maximum"))
        || (m.contains("prompt too long; exceeded") && m.contains("context length"))
    {
        return true;
    }
    // Cerebras: "400 status code (no body)" / "413 (no body)".
    let rest = m.trim_start_matches("400").trim_start_matches("413");
    rest.len() < m.len()
        && rest
            .trim_start()
            .trim_start_matches("status code")
            .trim_start()
            .starts_with("(no body)")
}

fn is_billing(m: &str) -> bool {
    const WORDS: &[&str] = &[
        "insufficient_quota",
        "exceeded your current quota",
        "credit_balance",
        "credit balance",
        "spend limit",
        "spending limit",
        "spend_limit",
        "billing",
        "payment required",
        "usage limit",
        "quota exceeded",
        "out of credits",
        "no space left on device",
    ];
    WORDS.iter().any(|w| m.contains(w))
}

fn is_throughput(m: &str) -> bool {
    m.contains("rate limit")
        || m.contains("rate_limit")
        || m.contains("ratelimit")
        || m.contains("too many requests")
        || m.contains("throttl")
        || m.contains("please wait before trying again")
}

fn is_unauthorized(m: &str) -> bool {
    const WORDS: &[&str] = &[
        "invalid api key",
        "incorrect api key",
        "invalid x-api-key",
        "invalid_api_key",
        "authentication_error",
        "authentication failed",
        "unauthorized",
        "no api key",
        "api key is required",
        "permission_denied",
        "invalid bearer token",
    ];
    WORDS.iter().any(|w| m.contains(w))
}

fn is_unknown_model(m: &str) -> bool {
    m.contains("model_not_found")
        || m.contains("no model selected")
        || m.contains("unknown model")
        || (m.contains("model") && (m.contains("does not exist") || m.contains("not found")))
}

/// A premature end of the response stream.
fn is_stream_cut(m: &str) -> bool {
    m.trim() == "terminated"
        || m.contains("premature close")
        || m.contains("stream aborted")
        || m.contains("stream ended")
        || m.contains("stream closed")
        || m.contains("ended without")
        || m.contains("other side closed")
        || m.contains("unexpected end of")
        || m.contains("incomplete chunked")
        || m.contains("http2 request did not get a response")
}

/// The errno-like code in a transport failure's text (`ECONNRESET`, `UND_ERR_SOCKET`, ...).
fn network_code(message: &str) -> Option<String> {
    message
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .find(|word| {
            (word.len() > 3
                && word.starts_with('E')
                && word.chars().all(|c| c.is_ascii_uppercase())
                && KNOWN_ERRNO.contains(word))
                || word.starts_with("UND_ERR_")
                || word.starts_with("ERR_TLS_")
                || word.starts_with("CERT_")
                || word.ends_with("_CERT")
                || word.starts_with("DEPTH_ZERO_SELF_SIGNED")
                || word.starts_with("SELF_SIGNED_CERT")
                || word.starts_with("UNABLE_TO_VERIFY_LEAF")
        })
        .map(str::to_string)
}

const KNOWN_ERRNO: &[&str] = &[
    "ENOTFOUND",
    "EAI_AGAIN",
    "ECONNRESET",
    "ECONNREFUSED",
    "ECONNABORTED",
    "ETIMEDOUT",
    "EPIPE",
    "EHOSTUNREACH",
    "ENETUNREACH",
    "ENETDOWN",
    "EHOSTDOWN",
    "EPROTO",
];

/// A certificate verification failure: retrying cannot help until the trust changes.
fn is_certificate(code: &str) -> bool {
    code.starts_with("CERT_")
        || code.ends_with("_CERT")
        || code.contains("SELF_SIGNED")
        || code.starts_with("UNABLE_TO_VERIFY")
        || code == "ERR_TLS_CERT_ALTNAME_INVALID"
}

fn is_network(m: &str) -> bool {
    const WORDS: &[&str] = &[
        "fetch failed",
        "connection error",
        "connection refused",
        "connection reset",
        "connection lost",
        "connection abort",
        "socket hang up",
        "network error",
        "getaddrinfo",
        "websocket closed",
        "websocket error",
        "upstream connect",
        "reset before headers",
        "certificate",
    ];
    WORDS.iter().any(|w| m.contains(w))
}

fn is_timeout(m: &str) -> bool {
    m.contains("timed out") || m.contains("timeout") || m.contains("time out")
}

fn is_gateway(m: &str) -> bool {
    m.contains("overloaded")
        || m.contains("service unavailable")
        || m.contains("bad gateway")
        || m.contains("gateway timeout")
        || m.contains("internal server error")
        || m.contains("server_error")
        || m.contains("server error")
}

/// The provider's own error code, when its JSON body survived in the message
/// (`"code": "insufficient_quota"`, `"type": "rate_limit_error"`).
fn provider_code(message: &str) -> Option<String> {
    let start = message.find('{')?;
    let body: Value = serde_json::from_str(message.get(start..)?.trim()).ok()?;
    let error = body.get("error").unwrap_or(&body);
    ["code", "type"]
        .iter()
        .filter_map(|k| error.get(*k))
        .find_map(|v| match v {
            Value::String(s) if !s.is_empty() => Some(s.clone()),
            Value::Number(n) => Some(n.to_string()),
            _ => None,
        })
}

/// A wait the provider asked for in its message ("retry after 20 seconds", "try again in 1.5s",
/// "Please retry in 12.3s"): pi keeps no response headers, so the text is all there is.
fn retry_after_ms(message: &str) -> Option<u64> {
    let m = message.to_ascii_lowercase();
    for prefix in [
        "retry after ",
        "retry-after: ",
        "retry in ",
        "try again in ",
        "retry_after\":",
    ] {
        for (i, _) in m.match_indices(prefix) {
            let rest = m[i + prefix.len()..].trim_start();
            let number: String = rest
                .chars()
                .take_while(|c| c.is_ascii_digit() || *c == '.')
                .collect();
            let Ok(value) = number.parse::<f64>() else {
                continue;
            };
            let unit = rest[number.len()..].trim_start();
            let ms = if unit.starts_with("ms") || unit.starts_with("millisecond") {
                value
            } else if unit.starts_with('m') && !unit.starts_with("ms") {
                value * 60_000.0
            } else {
                value * 1000.0
            };
            if ms.is_finite() && ms >= 0.0 {
                return Some(ms.ceil() as u64);
            }
        }
    }
    None
}

/// The provider's message for people: at most [`PROVIDER_MESSAGE_CAP`] characters, credential
/// shapes redacted (again: the agent's line it came from was redacted as a whole, exact key
/// values included, before it was read; see `crate::redact`).
pub fn redact(message: &str) -> String {
    cap(
        &crate::redact::shapes::redact(message),
        PROVIDER_MESSAGE_CAP,
    )
}

fn cap(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

fn base_details(end: &RunEnd) -> Value {
    let mut details = Map::new();
    if let Some(provider) = &end.provider {
        details.insert("provider".into(), json!(provider));
    }
    if let Some(model) = &end.model {
        details.insert("model".into(), json!(model));
    }
    Value::Object(details)
}

/// The code (and whether this occurrence is transient) for a failed run's message, with the
/// rules of docs/protocol.md §8.7 in order: billing before throughput (a 429 may be either),
/// overflow before the other 400s, a cut stream before generic transport wording.
fn code_for(message: &str) -> (ErrorCode, bool) {
    let m = message.to_ascii_lowercase();
    let status = leading_status(message);
    if is_billing(&m) || status == Some(402) {
        return (ErrorCode::ProviderError, false);
    }
    if status == Some(413) || is_context_overflow(message) {
        return (ErrorCode::ContextTooLarge, false);
    }
    if matches!(status, Some(401 | 403)) || is_unauthorized(&m) {
        return (ErrorCode::ProviderUnauthorized, false);
    }
    if status == Some(404) || is_unknown_model(&m) {
        return (ErrorCode::ModelNotConfigured, false);
    }
    if status == Some(429) || is_throughput(&m) {
        return (ErrorCode::ProviderRateLimited, true);
    }
    if matches!(status, Some(400 | 422)) {
        return (ErrorCode::ProviderError, false);
    }
    if status.is_some_and(|s| s >= 500) || is_gateway(&m) {
        return (ErrorCode::ProviderError, true);
    }
    if status.is_some() {
        // Another 4xx: the request itself was refused.
        return (ErrorCode::ProviderError, false);
    }
    if is_stream_cut(&m) {
        return (ErrorCode::StreamFailed, true);
    }
    if let Some(code) = network_code(message) {
        return (ErrorCode::NetworkError, !is_certificate(&code));
    }
    if is_network(&m) {
        return (ErrorCode::NetworkError, !m.contains("certificate"));
    }
    if is_timeout(&m) {
        return (ErrorCode::Timeout, true);
    }
    // Unrecognised wording: a provider failure, transient exactly when pi itself would retry it.
    (ErrorCode::ProviderError, pi_retries(message))
}

fn summary(code: ErrorCode) -> &'static str {
    match code {
        ErrorCode::ProviderUnauthorized => "the model provider refused the credentials",
        ErrorCode::ProviderRateLimited => "the model provider is rate limiting requests",
        ErrorCode::ContextTooLarge => "the conversation no longer fits the model's context window",
        ErrorCode::ModelNotConfigured => "the model provider does not know the selected model",
        ErrorCode::StreamFailed => "the model's response stream ended before it was complete",
        ErrorCode::NetworkError => "the model provider could not be reached",
        ErrorCode::Timeout => "the model provider did not answer in time",
        _ => "the model provider reported an error",
    }
}

/// The terminal error of a run that ended with `stopReason: "error"`.
fn classify(end: &RunEnd, trail: &RetryTrail, trace_id: &str) -> AppError {
    let message = end.error_message.as_deref().unwrap_or("");
    let (code, retriable) = code_for(message);
    let mut details = base_details(end);
    if let Value::Object(map) = &mut details {
        if let Some(status) = leading_status(message) {
            map.insert("providerStatus".into(), json!(status));
        }
        let network = (code == ErrorCode::NetworkError)
            .then(|| network_code(message))
            .flatten();
        let provider_code = provider_code(message).filter(|c| Some(c) != network.as_ref());
        if let Some(provider_code) = &provider_code {
            map.insert("providerCode".into(), json!(provider_code));
        }
        if let Some(network) = &network {
            map.insert("networkCode".into(), json!(network));
        }
        if trail.attempts > 0 {
            map.insert("retryAttempt".into(), json!(trail.attempts));
        }
        if !message.is_empty() {
            map.insert("providerMessage".into(), json!(redact(message)));
        }
    }
    let mut error = AppError::new(code, summary(code))
        .with_retriable(retriable)
        .with_source(ErrorSource::Agent)
        .with_details(details)
        .with_trace_id(trace_id);
    let cause = network_code(message)
        .filter(|_| code == ErrorCode::NetworkError)
        .or_else(|| provider_code(message))
        .or_else(|| leading_status(message).map(|s| s.to_string()));
    if let Some(cause) = cause {
        error = error.with_cause_code(cause);
    }
    if let Some(ms) = retry_after_ms(message)
        && retriable
    {
        error = error.with_retry_after_ms(ms);
    }
    error
}

/// The agent process died of V8's heap limit: its stderr tail carries node's fatal-error banner
/// (AGENT_SIDECAR_OOM rather than a plain crash).
pub fn is_heap_exhausted(stderr_tail: &str) -> bool {
    stderr_tail.contains("JavaScript heap out of memory")
        || stderr_tail.contains("Reached heap limit")
}

#[cfg(test)]
mod tests;
