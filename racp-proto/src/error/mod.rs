//! The error object every RACP-WS failure is reported with (the desktop's `AppError`).

mod registry;

pub use registry::{CodeSpec, ErrorCode, Recovery, Retriable};

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// Which component produced an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum ErrorSource {
    /// pi-host itself.
    Host,
    /// The agent process behind a session.
    Agent,
    /// The RACP client library, for failures it observes locally (e.g. `HOST_DISCONNECTED`).
    Client,
    /// The SSH bootstrapper.
    Bootstrap,
}

/// A failure, always carrying a registered error code.
// Built only through `AppError::new(code, ..)`, so `retriable` and `recovery` always come from
// the registry row and an unregistered code cannot be represented.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
#[serde(transparent)]
#[error("{}: {}", body.code, body.message)]
pub struct AppError {
    // Boxed so that `Result<_, AppError>` stays one pointer wide on the happy path.
    body: Box<Body>,
}

/// A failure, always carrying a registered error code.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
struct Body {
    code: ErrorCode,
    /// English text for people; clients switch on `code`, never on this.
    message: String,
    /// Whether this failure is transient. Whether the call may be *sent again* also depends on the
    /// method: see `safeToResend` in the method table.
    retriable: bool,
    /// What the client should do next.
    recovery: Recovery,
    /// Machine-readable specifics (e.g. `path` for INVALID_PARAMS, cursors for CURSOR_EXPIRED).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    details: Option<Value>,
    /// Which component produced it.
    // Named `origin` in Rust because thiserror reserves a field called `source`.
    #[serde(rename = "source")]
    origin: ErrorSource,
    /// A nested or transport-level code this error was mapped from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    cause_code: Option<String>,
    /// Correlates the error with the host's log.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    trace_id: Option<String>,
    /// How long to wait before retrying, when known.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    retry_after_ms: Option<u64>,
}

impl JsonSchema for AppError {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "AppError".into()
    }

    fn json_schema(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
        Body::json_schema(generator)
    }
}

impl AppError {
    /// Builds an error from its registry row. A `Maybe`-retriable code starts as not retriable;
    /// use [`AppError::with_retriable`] when the occurrence is known to be transient.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        let spec = code.spec();
        let body = Body {
            code,
            message: message.into(),
            retriable: spec.retriable == Retriable::Yes,
            recovery: spec.recovery,
            details: None,
            origin: ErrorSource::Host,
            cause_code: None,
            trace_id: None,
            retry_after_ms: None,
        };
        AppError {
            body: Box::new(body),
        }
    }

    pub fn with_details(mut self, details: Value) -> Self {
        self.body.details = Some(details);
        self
    }

    pub fn with_source(mut self, source: ErrorSource) -> Self {
        self.body.origin = source;
        self
    }

    pub fn with_cause_code(mut self, cause: impl Into<String>) -> Self {
        self.body.cause_code = Some(cause.into());
        self
    }

    pub fn with_trace_id(mut self, trace_id: impl Into<String>) -> Self {
        self.body.trace_id = Some(trace_id.into());
        self
    }

    pub fn with_retry_after_ms(mut self, ms: u64) -> Self {
        self.body.retry_after_ms = Some(ms);
        self
    }

    /// Sets `retriable` for a code the registry marks `maybe`. For a `yes` or `no` row the row's
    /// value is what the wire says, always: asking for the other value is a mistake at the call
    /// site (use a code whose row says the truth, or make the row `maybe`), caught by a debug
    /// assertion; release builds keep the row's value (docs/protocol.md §6.3).
    pub fn with_retriable(mut self, retriable: bool) -> Self {
        let row = self.body.code.spec().retriable;
        debug_assert!(
            row == Retriable::Maybe || retriable == (row == Retriable::Yes),
            "{} is retriable: {row:?} in the registry; it cannot be made {retriable}",
            self.body.code
        );
        if row == Retriable::Maybe {
            self.body.retriable = retriable;
        }
        self
    }

    pub fn code(&self) -> ErrorCode {
        self.body.code
    }

    pub fn message(&self) -> &str {
        &self.body.message
    }

    pub fn retriable(&self) -> bool {
        self.body.retriable
    }

    pub fn recovery(&self) -> Recovery {
        self.body.recovery
    }

    pub fn details(&self) -> Option<&Value> {
        self.body.details.as_ref()
    }

    /// Which component produced the error (the wire field `source`).
    pub fn origin(&self) -> ErrorSource {
        self.body.origin
    }

    pub fn cause_code(&self) -> Option<&str> {
        self.body.cause_code.as_deref()
    }

    pub fn trace_id(&self) -> Option<&str> {
        self.body.trace_id.as_deref()
    }

    pub fn retry_after_ms(&self) -> Option<u64> {
        self.body.retry_after_ms
    }

    /// The WebSocket close code to use when this error ends a connection.
    pub fn close_code(&self) -> u16 {
        self.body.code.spec().close_code
    }

    /// The HTTP status to use when this error refuses an upgrade.
    pub fn http_status(&self) -> u16 {
        self.body.code.spec().http_status
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn registry_drives_retriable_and_recovery() {
        let err = AppError::new(ErrorCode::ClientTooSlow, "slow");
        assert!(err.retriable());
        assert_eq!(err.recovery(), Recovery::ReconnectAndResume);
        let err = AppError::new(ErrorCode::CursorExpired, "old").with_retriable(false);
        assert!(!err.retriable(), "the row's own value is accepted");
        for answer in [true, false] {
            let err = AppError::new(ErrorCode::Internal, "x").with_retriable(answer);
            assert_eq!(
                err.retriable(),
                answer,
                "a `maybe` code takes the occurrence's answer"
            );
            let wire = serde_json::to_value(&err).unwrap();
            assert_eq!(wire["retriable"], answer, "{wire}");
        }
    }

    #[test]
    #[cfg(debug_assertions)]
    #[should_panic(expected = "cannot be made true")]
    fn overriding_a_fixed_row_is_caught() {
        let _ = AppError::new(ErrorCode::CursorExpired, "old").with_retriable(true);
    }

    /// REMOTE_CONNECTION_FAILED is `maybe`: a refused URL is not transient, a refused socket is;
    /// the wire says which.
    #[test]
    fn remote_connection_failed_carries_the_occurrence_on_the_wire() {
        assert_eq!(
            ErrorCode::RemoteConnectionFailed.spec().retriable,
            Retriable::Maybe
        );
        for answer in [false, true] {
            let err = AppError::new(ErrorCode::RemoteConnectionFailed, "x").with_retriable(answer);
            let wire = serde_json::to_value(&err).unwrap();
            assert_eq!(wire["retriable"], answer, "{wire}");
            let back = crate::codec::error_from_wire(wire);
            assert_eq!(back.retriable(), answer);
        }
    }

    #[test]
    fn wire_shape_is_camel_case_and_omits_empty_fields() {
        let err = AppError::new(ErrorCode::RateLimited, "slow down")
            .with_retry_after_ms(250)
            .with_details(json!({"budget": 10}));
        let value = serde_json::to_value(&err).unwrap();
        assert_eq!(
            value,
            json!({
                "code": "RATE_LIMITED",
                "message": "slow down",
                "retriable": true,
                "recovery": "retry_after",
                "details": {"budget": 10},
                "source": "host",
                "retryAfterMs": 250
            })
        );
        let back: AppError = serde_json::from_value(value).unwrap();
        assert_eq!(back, err);
    }
}
