//! Reading and writing frames, with the size bound checked before any parsing.
//!
//! The host side reads a request in two steps so that it can check access between them:
//! [`decode_request`] finds `id`, `method` and the raw `params`; [`crate::Call::decode`] then reads
//! the params as the method's type, reporting a bad field as INVALID_PARAMS with its JSON path.

pub mod params;
mod strict;

pub use params::decode_params;

use crate::error::{AppError, ErrorCode};
use crate::frame::{ErrorReply, RequestId, ServerFrame};
use crate::limits::MAX_ID_CHARS;
use crate::methods::Method;
use crate::trace::{MAX_TRACE_ID_CHARS, TraceId};
use serde::Deserialize;
use serde_json::json;
use serde_json::value::RawValue;

/// A request whose envelope is valid and whose method is known; params are not read yet.
#[derive(Debug)]
pub struct IncomingRequest<'a> {
    pub id: RequestId,
    pub method: Method,
    pub params: Option<&'a RawValue>,
    /// The trace id the client chose, checked (`crate::trace`); the server makes one if none.
    pub trace_id: Option<TraceId>,
}

/// A frame the host refuses, with the id to answer it under when one could be found.
#[derive(Debug, Clone, PartialEq)]
pub struct Rejected {
    pub id: Option<RequestId>,
    pub error: AppError,
}

impl Rejected {
    fn new(id: Option<RequestId>, error: AppError) -> Self {
        Rejected { id, error }
    }

    /// The error reply to send for this frame.
    pub fn into_reply(self) -> ErrorReply {
        ErrorReply {
            id: self.id,
            error: self.error,
        }
    }
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct Envelope<'a> {
    id: RequestId,
    #[serde(borrow)]
    method: std::borrow::Cow<'a, str>,
    #[serde(borrow, default)]
    params: Option<&'a RawValue>,
    #[serde(borrow, default, rename = "traceId")]
    trace_id: Option<std::borrow::Cow<'a, str>>,
}

/// Just the id, for answering a frame whose envelope is otherwise wrong.
#[derive(Deserialize)]
struct IdOnly {
    id: Option<RequestId>,
}

/// Checks the size bound, then reads a request envelope and looks its method up.
///
/// Order matters for hostile input: the size is checked before a single byte is parsed, and a
/// frame that is not a valid envelope is answered under its `id` whenever that can be found.
pub fn decode_request(text: &str, max_frame_bytes: usize) -> Result<IncomingRequest<'_>, Rejected> {
    if text.len() > max_frame_bytes {
        return Err(Rejected::new(
            None,
            payload_too_large(text.len(), max_frame_bytes),
        ));
    }
    let envelope: Envelope<'_> = match serde_json::from_str(text) {
        Ok(envelope) => envelope,
        Err(err) => return Err(reject_envelope(text, &err)),
    };
    if too_long(&envelope.id) {
        return Err(Rejected::new(
            None,
            AppError::new(
                ErrorCode::InvalidArgument,
                format!("id must have at most {MAX_ID_CHARS} characters"),
            )
            .with_details(json!({"path": "id", "reason": "too_long"})),
        ));
    }
    let Some(method) = Method::from_name(&envelope.method) else {
        return Err(Rejected::new(
            Some(envelope.id),
            AppError::new(
                ErrorCode::MethodNotFound,
                format!("unknown method {:?}", truncate(&envelope.method, 64)),
            )
            .with_details(json!({"method": truncate(&envelope.method, 64)})),
        ));
    };
    let trace_id = match envelope.trace_id.as_deref().map(TraceId::parse) {
        None => None,
        Some(Ok(trace_id)) => Some(trace_id),
        Some(Err(bad)) => {
            return Err(Rejected::new(
                Some(envelope.id),
                AppError::new(
                    ErrorCode::InvalidArgument,
                    format!(
                        "traceId must be 1 to {MAX_TRACE_ID_CHARS} characters of letters, \
                         digits, '.', '_' and '-'; send it so or leave it out"
                    ),
                )
                .with_details(json!({"path": "traceId", "reason": bad.reason()})),
            ));
        }
    };
    Ok(IncomingRequest {
        id: envelope.id,
        method,
        params: envelope.params,
        trace_id,
    })
}

/// A string id over [`MAX_ID_CHARS`] characters.
fn too_long(id: &RequestId) -> bool {
    matches!(id, RequestId::Text(text) if text.chars().count() as u64 > MAX_ID_CHARS)
}

fn reject_envelope(text: &str, err: &serde_json::Error) -> Rejected {
    use serde_json::error::Category;
    let (reason, id) = match err.classify() {
        Category::Syntax | Category::Eof | Category::Io => ("malformed_json", None),
        // The JSON is valid but the envelope is wrong: the id may still be readable.
        // An over-long string id is not echoed back (the reply would repeat it).
        Category::Data => (
            "invalid_envelope",
            serde_json::from_str::<IdOnly>(text)
                .ok()
                .and_then(|f| f.id)
                .filter(|id| !too_long(id)),
        ),
    };
    // serde's message may quote the frame (an unknown field's name): cut it.
    let detail = crate::validate::clip(&err.to_string(), crate::validate::MAX_ECHO_CHARS);
    let message = if reason == "malformed_json" {
        format!("frame is not valid JSON: {detail}")
    } else {
        format!("frame is not a valid request: {detail}")
    };
    Rejected::new(
        id,
        AppError::new(ErrorCode::InvalidArgument, message).with_details(json!({
            "reason": reason,
            "line": err.line(),
            "column": err.column(),
        })),
    )
}

/// PAYLOAD_TOO_LARGE for a frame of `size` bytes against a bound of `limit` bytes.
pub fn payload_too_large(size: usize, limit: usize) -> AppError {
    AppError::new(
        ErrorCode::PayloadTooLarge,
        format!("frame of {size} bytes exceeds the negotiated bound of {limit} bytes"),
    )
    .with_details(json!({"size": size, "limit": limit}))
}

fn truncate(text: &str, max_chars: usize) -> String {
    text.chars().take(max_chars).collect()
}

#[derive(Deserialize)]
struct RawServerFrame {
    /// Outer `None`: no `id` field (a push or connection error); `Some(None)`: `"id": null`.
    #[serde(default, deserialize_with = "present")]
    id: Option<Option<RequestId>>,
    #[serde(default)]
    method: Option<String>,
    #[serde(default)]
    params: Option<Box<RawValue>>,
    #[serde(default)]
    result: Option<Box<RawValue>>,
    #[serde(default)]
    error: Option<serde_json::Value>,
}

/// Reads an error object from a host, tolerating what a newer host may send: an unknown code
/// becomes INTERNAL with the original code in `causeCode`, and unknown fields are ignored.
pub fn error_from_wire(value: serde_json::Value) -> AppError {
    if let Ok(error) = serde_json::from_value::<AppError>(value.clone()) {
        return error;
    }
    let message = value["message"]
        .as_str()
        .unwrap_or("the host reported an error this client cannot read")
        .to_string();
    let known = value["code"].as_str().and_then(ErrorCode::from_name);
    let mut error = AppError::new(known.unwrap_or(ErrorCode::Internal), message);
    // Only a `maybe` row takes the sender's answer; a fixed row's value is the row's.
    if let Some(retriable) = value["retriable"].as_bool()
        && error.code().spec().retriable == crate::Retriable::Maybe
    {
        error = error.with_retriable(retriable);
    }
    if known.is_none()
        && let Some(code) = value["code"].as_str()
    {
        error = error.with_cause_code(code);
    }
    if let Some(ms) = value["retryAfterMs"].as_u64() {
        error = error.with_retry_after_ms(ms);
    }
    match value.get("details") {
        Some(details) => error.with_details(details.clone()),
        None => error,
    }
}

/// Why a host frame could not be read (client side).
#[derive(Debug, thiserror::Error)]
pub enum ServerFrameError {
    #[error("host frame is not valid JSON: {0}")]
    Json(#[from] serde_json::Error),
    #[error("host frame has an unknown shape")]
    Shape,
}

fn present<'de, D: serde::Deserializer<'de>>(
    deserializer: D,
) -> Result<Option<Option<RequestId>>, D::Error> {
    Option::<RequestId>::deserialize(deserializer).map(Some)
}

/// Reads any frame a host sends.
pub fn decode_server_frame(text: &str) -> Result<ServerFrame, ServerFrameError> {
    let raw: RawServerFrame = serde_json::from_str(text)?;
    let error = raw.error.map(error_from_wire);
    match (raw.id, raw.method, raw.params, raw.result, error) {
        (Some(Some(id)), None, None, Some(result), None) => Ok(ServerFrame::Result { id, result }),
        (Some(id), None, None, None, Some(error)) => Ok(ServerFrame::Error { id, error }),
        (None, Some(method), Some(params), None, None) => Ok(ServerFrame::Push { method, params }),
        (None, None, None, None, Some(error)) => Ok(ServerFrame::ConnectionError { error }),
        _ => Err(ServerFrameError::Shape),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::methods::Call;

    const MAX: usize = 1 << 16;

    fn reject(text: &str) -> Rejected {
        decode_request(text, MAX).unwrap_err()
    }

    #[test]
    fn reads_a_valid_envelope() {
        let req = decode_request(r#"{"id":7,"method":"session/list"}"#, MAX).unwrap();
        assert_eq!(req.id, RequestId::Number(7));
        assert_eq!(req.method, Method::SessionList);
        assert!(req.params.is_none());
    }

    #[test]
    fn a_trace_id_is_read_within_its_bound_and_refused_past_it() {
        let frame =
            |trace: &str| format!(r#"{{"id":7,"method":"session/list","traceId":"{trace}"}}"#);
        let at_bound = "f".repeat(crate::trace::MAX_TRACE_ID_CHARS);
        let text = frame(&at_bound);
        let req = decode_request(&text, MAX).unwrap();
        assert_eq!(req.trace_id.unwrap().as_str(), at_bound);
        let over = reject(&frame(&"f".repeat(crate::trace::MAX_TRACE_ID_CHARS + 1)));
        assert_eq!(over.id, Some(RequestId::Number(7)));
        assert_eq!(over.error.code(), ErrorCode::InvalidArgument);
        assert_eq!(over.error.details().unwrap()["path"], "traceId");
        assert_eq!(over.error.details().unwrap()["reason"], "too_long");
        let odd = reject(&frame("a b"));
        assert_eq!(odd.error.details().unwrap()["reason"], "invalid_character");
        let none = decode_request(r#"{"id":7,"method":"session/list"}"#, MAX).unwrap();
        assert!(none.trace_id.is_none());
    }

    #[test]
    fn size_is_checked_before_parsing() {
        let text = format!(
            "{{\"id\":1,\"method\":\"hello\",\"params\":\"{}\"",
            "x".repeat(100)
        );
        let err = decode_request(&text, 50).unwrap_err();
        assert_eq!(err.error.code(), ErrorCode::PayloadTooLarge);
        assert_eq!(err.error.details().unwrap()["limit"], 50);
    }

    #[test]
    fn malformed_json_is_invalid_argument_without_id() {
        let err = reject(r#"{"id":1,"method":"#);
        assert_eq!(err.error.code(), ErrorCode::InvalidArgument);
        assert_eq!(err.id, None);
        assert_eq!(err.error.details().unwrap()["reason"], "malformed_json");
    }

    #[test]
    fn bad_envelope_keeps_the_id_when_readable() {
        let err = reject(r#"{"id":"a","method":5}"#);
        assert_eq!(err.error.code(), ErrorCode::InvalidArgument);
        assert_eq!(err.id, Some(RequestId::Text("a".into())));
        let err = reject(r#"{"id":"a","method":"hello","extra":1}"#);
        assert_eq!(err.error.code(), ErrorCode::InvalidArgument);
        assert_eq!(err.id, Some(RequestId::Text("a".into())));
        let err = reject(r#"[1,2]"#);
        assert_eq!(err.error.code(), ErrorCode::InvalidArgument);
        let err = reject(r#"{"method":"hello"}"#);
        assert_eq!(err.error.code(), ErrorCode::InvalidArgument);
        let err = reject(r#"{"id":-1,"method":"hello"}"#);
        assert_eq!(err.error.code(), ErrorCode::InvalidArgument);
    }

    #[test]
    fn deep_nesting_is_refused_not_overflowed() {
        let depth = 100_000;
        let nested = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        // Nested params are skipped by the envelope and refused when read.
        let text = format!(r#"{{"id":1,"method":"hello","params":{nested}}}"#);
        let req = decode_request(&text, usize::MAX).unwrap();
        let err = Call::decode(req.method, req.params).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidParams);
        // Nesting in the envelope itself is refused by the parser's depth limit.
        let text = format!(r#"{{"id":{nested},"method":"hello"}}"#);
        let err = decode_request(&text, usize::MAX).unwrap_err();
        assert_eq!(err.error.code(), ErrorCode::InvalidArgument);
    }

    #[test]
    fn unknown_method_is_method_not_found() {
        let err = reject(r#"{"id":3,"method":"nope/never"}"#);
        assert_eq!(err.error.code(), ErrorCode::MethodNotFound);
        assert_eq!(err.id, Some(RequestId::Number(3)));
    }

    #[test]
    fn overlong_id_is_refused() {
        let text = format!(r#"{{"id":"{}","method":"hello"}}"#, "i".repeat(129));
        assert_eq!(reject(&text).error.code(), ErrorCode::InvalidArgument);
        // Nor an unknown field's name, however long.
        let text = format!(r#"{{"id":1,"{}":1,"method":"hello"}}"#, "f".repeat(100_000));
        let reply = serde_json::to_string(&reject(&text).into_reply()).unwrap();
        assert!(reply.len() < 2_000, "{}", reply.len());
        // Nor echoed when the envelope is wrong in another way too (found by fuzzing).
        let text = format!(r#"{{"id":"{}","methodX":"hello"}}"#, "i".repeat(129));
        let err = reject(&text);
        assert_eq!(err.error.code(), ErrorCode::InvalidArgument);
        assert_eq!(err.id, None);
    }

    #[test]
    fn bad_params_report_their_path() {
        let req = decode_request(
            r#"{"id":1,"method":"session/subscribe","params":{"sessionId":"s","cursor":"nope"}}"#,
            MAX,
        )
        .unwrap();
        let err = Call::decode(req.method, req.params).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidParams);
        assert_eq!(err.details().unwrap()["path"], "params.cursor");

        let req = decode_request(r#"{"id":1,"method":"turn/start","params":{}}"#, MAX).unwrap();
        let err = Call::decode(req.method, req.params).unwrap_err();
        assert_eq!(err.details().unwrap()["path"], "params.sessionId");

        let req = decode_request(
            r#"{"id":1,"method":"hello","params":{"protocol":{"min":1,"max":"x"},"client":{"name":"a","version":"1"}}}"#,
            MAX,
        )
        .unwrap();
        let err = Call::decode(req.method, req.params).unwrap_err();
        assert_eq!(err.details().unwrap()["path"], "params.protocol.max");

        // Array items by index, joined with dots as documented.
        let req = decode_request(
            r#"{"id":1,"method":"pairing/create","params":{"roles":["observer",1]}}"#,
            MAX,
        )
        .unwrap();
        let err = Call::decode(req.method, req.params).unwrap_err();
        assert_eq!(err.details().unwrap()["path"], "params.roles.1");
    }

    #[test]
    fn absent_and_null_params_mean_empty() {
        for text in [
            r#"{"id":1,"method":"session/list"}"#,
            r#"{"id":1,"method":"session/list","params":null}"#,
            r#"{"id":1,"method":"session/list","params":{}}"#,
        ] {
            let req = decode_request(text, MAX).unwrap();
            assert!(matches!(
                Call::decode(req.method, req.params),
                Ok(Call::SessionList(_))
            ));
        }
        let req =
            decode_request(r#"{"id":1,"method":"session/list","params":{"x":1}}"#, MAX).unwrap();
        let err = Call::decode(req.method, req.params).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidParams);
    }

    #[test]
    fn reads_every_host_frame_shape() {
        assert!(matches!(
            decode_server_frame(r#"{"id":1,"result":{}}"#).unwrap(),
            ServerFrame::Result { .. }
        ));
        let err = r#"{"code":"INTERNAL","message":"x","retriable":false,"recovery":"stop_and_report","source":"host"}"#;
        assert!(matches!(
            decode_server_frame(&format!(r#"{{"id":null,"error":{err}}}"#)).unwrap(),
            ServerFrame::Error { id: None, .. }
        ));
        assert!(matches!(
            decode_server_frame(&format!(r#"{{"id":"a","error":{err}}}"#)).unwrap(),
            ServerFrame::Error { id: Some(_), .. }
        ));
        assert!(matches!(
            decode_server_frame(&format!(r#"{{"error":{err}}}"#)).unwrap(),
            ServerFrame::ConnectionError { .. }
        ));
        assert!(matches!(
            decode_server_frame(r#"{"method":"heartbeat","params":{}}"#).unwrap(),
            ServerFrame::Push { .. }
        ));
        assert!(decode_server_frame(r#"{"id":1}"#).is_err());
        // A code from a newer host is still an error the client can act on.
        let newer = r#"{"id":1,"error":{"code":"SOMETHING_NEW","message":"m","retriable":true,"recovery":"retry","source":"host","extra":1}}"#;
        match decode_server_frame(newer).unwrap() {
            ServerFrame::Error { error, .. } => {
                assert_eq!(error.code(), ErrorCode::Internal);
                assert_eq!(error.cause_code(), Some("SOMETHING_NEW"));
                assert!(error.retriable());
            }
            other => panic!("{other:?}"),
        }
        assert!(decode_server_frame(r#"{"id":null,"result":{}}"#).is_err());
    }
}
