//! The one INTERNAL a server answers with when something it did not expect failed: the cause
//! goes to the log under a trace id, the caller gets the id and no detail of the cause.

use racp_proto::{AppError, ErrorCode};
use std::sync::atomic::{AtomicU64, Ordering};

static NEXT_TRACE: AtomicU64 = AtomicU64::new(1);

/// INTERNAL for `err`, logged with the trace id the reply carries. `server` names who failed
/// ("host", "gateway") in the message.
pub fn internal(server: &str, err: impl std::fmt::Display) -> AppError {
    let trace_id = format!(
        "t{:x}",
        crate::clock::now_ms() ^ NEXT_TRACE.fetch_add(1, Ordering::Relaxed)
    );
    tracing::error!(%trace_id, error = %err, "internal error");
    AppError::new(
        ErrorCode::Internal,
        format!("the {server} failed unexpectedly; see its log"),
    )
    .with_trace_id(trace_id)
}
