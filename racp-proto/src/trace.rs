//! A call's trace id (docs/protocol.md §3.3): chosen by the client in the request's optional
//! `traceId`, or made by the first server the call reaches; carried to a host in a routed
//! call's header and back in every error's `traceId`, and named by every log line about the
//! call. It is for logs only: nothing is decided by it.

/// Longest trace id, in bytes (a W3C `traceparent` is 55).
pub const MAX_TRACE_ID_CHARS: usize = 64;

/// A trace id of 1 to [`MAX_TRACE_ID_CHARS`] characters of `[A-Za-z0-9._-]`: safe in a log
/// line, a NATS header and a JSON string without escaping.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TraceId(String);

/// Why a presented trace id was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadTraceId {
    Empty,
    TooLong,
    Character,
}

impl BadTraceId {
    /// The `reason` a refusal's details carry.
    pub fn reason(self) -> &'static str {
        match self {
            BadTraceId::Empty => "empty",
            BadTraceId::TooLong => "too_long",
            BadTraceId::Character => "invalid_character",
        }
    }
}

impl TraceId {
    /// A presented trace id, checked.
    pub fn parse(text: &str) -> Result<TraceId, BadTraceId> {
        if text.is_empty() {
            return Err(BadTraceId::Empty);
        }
        if text.len() > MAX_TRACE_ID_CHARS {
            return Err(BadTraceId::TooLong);
        }
        let allowed = |b: u8| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-');
        if !text.bytes().all(allowed) {
            return Err(BadTraceId::Character);
        }
        Ok(TraceId(text.to_string()))
    }

    /// A trace id from 16 random bytes, as 32 lowercase hex digits (a W3C trace-id's shape).
    pub fn from_bytes(bytes: [u8; 16]) -> TraceId {
        TraceId(bytes.iter().map(|b| format!("{b:02x}")).collect())
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TraceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The JSON Schema of a request's `traceId`.
pub fn schema() -> serde_json::Value {
    serde_json::json!({
        "description": "The call's trace id, for logs (protocol.md §3.3); made by the server when absent.",
        "type": "string",
        "minLength": 1,
        "maxLength": MAX_TRACE_ID_CHARS,
        "pattern": "^[A-Za-z0-9._-]+$",
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_trace_id_is_bounded_and_plain() {
        let at_bound = "a".repeat(MAX_TRACE_ID_CHARS);
        assert!(TraceId::parse(&at_bound).is_ok());
        let over = "a".repeat(MAX_TRACE_ID_CHARS + 1);
        assert_eq!(TraceId::parse(&over), Err(BadTraceId::TooLong));
        assert_eq!(TraceId::parse(""), Err(BadTraceId::Empty));
        assert_eq!(TraceId::parse("a b"), Err(BadTraceId::Character));
        assert_eq!(TraceId::parse("a\nb"), Err(BadTraceId::Character));
        let traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(TraceId::parse(traceparent).unwrap().as_str(), traceparent);
        assert_eq!(TraceId::from_bytes([0xab; 16]).as_str(), "ab".repeat(16));
    }
}
