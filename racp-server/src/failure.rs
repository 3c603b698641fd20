//! The one INTERNAL a server answers with when something it did not expect failed: the cause
//! goes to the log under a trace id, the caller gets the id and no detail of the cause. Within
//! a call it is the call's trace id (`trace.rs`), so the call's other log lines find it too.

use racp_proto::{AppError, ErrorCode};

/// INTERNAL for `err`, logged with the trace id the reply carries. `server` names who failed
/// ("host", "gateway") in the message.
pub fn internal(server: &str, err: impl std::fmt::Display) -> AppError {
    let trace_id = crate::trace::current().unwrap_or_else(crate::trace::mint);
    tracing::error!(%trace_id, error = %err, "internal error");
    AppError::new(
        ErrorCode::Internal,
        format!("the {server} failed unexpectedly; see its log"),
    )
    .with_trace_id(trace_id.as_str())
}
