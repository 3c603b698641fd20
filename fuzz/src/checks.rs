//! Properties of the codec that must hold for any input. Each function panics (a fuzz crash)
//! when one does not. Used by the fuzz targets and, by path, by
//! `racp-proto/tests/fuzz_regressions.rs`, so every crash found stays a regression test.

use racp_proto::codec::{Rejected, decode_request, decode_server_frame};
use racp_proto::events::{Event, PushMethod};
use racp_proto::frame::{RequestId, ServerFrame};
use racp_proto::limits::MAX_ID_CHARS;
use racp_proto::{AppError, Call, Cursor, ErrorCode, Method};
use serde_json::Value;
use serde_json::value::RawValue;

/// The frame bounds a host may be reading with: the smallest negotiable, the pre-hello bound,
/// and no bound.
const BOUNDS: [usize; 3] = [4 << 10, 64 << 10, usize::MAX];

/// A client frame through the host's whole decoding path.
pub fn client_frame(data: &[u8]) {
    // A WebSocket text frame is valid UTF-8 by the time the codec sees it.
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    for bound in BOUNDS {
        match decode_request(text, bound) {
            Err(rejected) => {
                if text.len() > bound {
                    assert_eq!(rejected.error.code(), ErrorCode::PayloadTooLarge);
                    assert_eq!(rejected.id, None);
                }
                check_rejected(rejected);
            }
            Ok(request) => {
                assert!(text.len() <= bound, "a frame over the bound was read");
                assert_eq!(
                    Method::from_name(request.method.as_str()),
                    Some(request.method)
                );
                check_id(&request.id);
                if bound == usize::MAX {
                    check_params(request.method, request.params);
                }
            }
        }
    }
}

/// One method's params: the first byte picks the method, the rest is the params JSON.
pub fn method_params(data: &[u8]) {
    let Some((&pick, rest)) = data.split_first() else {
        return;
    };
    let method = Method::ALL[pick as usize % Method::ALL.len()];
    let Ok(text) = std::str::from_utf8(rest) else {
        return;
    };
    // The host only reaches params through a request that is valid JSON.
    let Ok(raw) = serde_json::from_str::<&RawValue>(text) else {
        return;
    };
    check_params(method, Some(raw));
    check_params(method, None);
}

/// A frame a host sends, as a client reads it; and cursors and events in isolation.
pub fn host_frame(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(frame) = decode_server_frame(text) {
        match frame {
            ServerFrame::Push { method, params } => {
                if let Some(push) = PushMethod::from_name(&method) {
                    let _ = push.check_params(params.get());
                }
            }
            ServerFrame::Error { error, .. } | ServerFrame::ConnectionError { error } => {
                check_error(&error);
            }
            ServerFrame::Result { .. } => {}
        }
    }
    if let Ok(cursor) = text.parse::<Cursor>() {
        let again: Cursor = cursor
            .to_string()
            .parse()
            .expect("a cursor's own form parses");
        assert_eq!(again, cursor);
    }
    if let Ok(event) = serde_json::from_str::<Event>(text) {
        let encoded = serde_json::to_string(&event).expect("an event encodes");
        let again: Event = serde_json::from_str(&encoded).expect("an encoded event decodes");
        assert_eq!(again, event);
        // `data` is relayed as text: whatever numbers it holds arrive as written
        // (docs/protocol.md §1, "Numbers").
        assert!(encoded.contains(again.data.get()));
        if let Ok(value) = event.data.to_value() {
            numbers_round_trip(&value);
        }
    }
    if let Ok(value) = serde_json::from_str::<Value>(text) {
        numbers_round_trip(&value);
    }
}

/// Where the codec does parse numbers it parses them to the nearest double, so encoding a
/// parsed value and parsing it again gives the same value (serde_json's `float_roundtrip`).
fn numbers_round_trip(value: &Value) {
    let encoded = value.to_string();
    let again: Value = serde_json::from_str(&encoded).expect("an encoded value decodes");
    assert_eq!(&again, value, "{encoded} changes when parsed again");
}

fn check_rejected(rejected: Rejected) {
    let code = rejected.error.code();
    assert!(
        matches!(
            code,
            ErrorCode::InvalidArgument | ErrorCode::PayloadTooLarge | ErrorCode::MethodNotFound
        ),
        "decode_request answered {code:?}"
    );
    if let Some(id) = &rejected.id {
        check_id(id);
    }
    check_input_error(&rejected.error);
    // The reply goes on the wire and a client reads it back as the same error.
    let reply = serde_json::to_string(&rejected.clone().into_reply()).expect("a reply encodes");
    match decode_server_frame(&reply).expect("a client reads the reply") {
        ServerFrame::Error { id, error } => {
            assert_eq!(id, rejected.id);
            assert_eq!(error.code(), code);
        }
        other => panic!("the reply reads as {other:?}"),
    }
}

fn check_id(id: &RequestId) {
    if let RequestId::Text(text) = id {
        assert!(
            text.chars().count() as u64 <= MAX_ID_CHARS,
            "an over-long id was read"
        );
    }
}

/// Largest error the codec may produce, whatever the input: errors quote at most a few
/// hundred characters of a request, so a hostile frame cannot be amplified.
const MAX_ERROR_BYTES: usize = 4096;

fn check_error(error: &AppError) {
    let spec = error.code().spec();
    assert_eq!(ErrorCode::from_name(spec.name), Some(error.code()));
    let encoded = serde_json::to_value(error).expect("an error encodes");
    assert_eq!(encoded["code"], spec.name);
    assert!(encoded["retriable"].is_boolean());
}

/// An error produced from client input: also bounded in size.
fn check_input_error(error: &AppError) {
    check_error(error);
    let size = serde_json::to_string(error)
        .expect("an error encodes")
        .len();
    assert!(size <= MAX_ERROR_BYTES, "an error of {size} bytes");
}

/// Decoding params either succeeds, and then the params encode and decode back to the same
/// call, or fails with INVALID_PARAMS naming a path under `params`.
fn check_params(method: Method, params: Option<&RawValue>) {
    match Call::decode(method, params) {
        Ok(call) => {
            assert_eq!(call.method(), method);
            let encoded = params_json(&call);
            let raw = serde_json::from_str::<&RawValue>(&encoded).expect("params encode to JSON");
            let again = Call::decode(method, Some(raw)).unwrap_or_else(|err| {
                panic!(
                    "{} params {encoded} do not decode again: {err}",
                    method.as_str()
                )
            });
            assert_eq!(
                again,
                call,
                "{} params change in a round trip",
                method.as_str()
            );
        }
        Err(error) => {
            assert_eq!(error.code(), ErrorCode::InvalidParams, "{error}");
            check_input_error(&error);
            let path = error
                .details()
                .and_then(|d| d["path"].as_str())
                .expect("INVALID_PARAMS names a path");
            assert!(
                path == "params" || path.starts_with("params."),
                "path {path:?}"
            );
        }
    }
}

fn params_json(call: &Call) -> String {
    let value = call.params_value();
    value.expect("params encode").to_string()
}
