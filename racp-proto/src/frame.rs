//! The five frame shapes of RACP-WS v1, all UTF-8 JSON text frames:
//!
//! | frame | shape | direction |
//! |---|---|---|
//! | request | `{"id", "method", "params"}` | client → host |
//! | result reply | `{"id", "result"}` | host → client |
//! | error reply | `{"id", "error"}` (`id` is `null` when the request could not be read far enough to find it) | host → client |
//! | push | `{"method", "params"}` | host → client |
//! | connection error | `{"error"}`, then a WebSocket close with the code's close code | host → client |

use crate::error::AppError;
use crate::limits::MAX_ID_CHARS;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// A request id, chosen by the client and echoed in the reply: a non-negative integer or a string
/// of at most 128 characters.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(untagged)]
pub enum RequestId {
    Number(u64),
    Text(String),
}

impl std::fmt::Display for RequestId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RequestId::Number(n) => write!(f, "{n}"),
            RequestId::Text(s) => f.write_str(s),
        }
    }
}

impl From<u64> for RequestId {
    fn from(n: u64) -> Self {
        RequestId::Number(n)
    }
}

impl JsonSchema for RequestId {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "RequestId".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "description": "Chosen by the client, echoed in the reply.",
            "anyOf": [
                {"type": "integer", "minimum": 0, "maximum": u64::MAX},
                {"type": "string", "maxLength": MAX_ID_CHARS}
            ]
        })
    }
}

/// A request as a client sends it. `P` is the method's params type.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Request<P> {
    pub id: RequestId,
    pub method: String,
    pub params: P,
    /// The call's trace id (`crate::trace`), when the client chooses it.
    #[serde(rename = "traceId", default, skip_serializing_if = "Option::is_none")]
    pub trace_id: Option<String>,
}

/// A successful reply.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ResultReply<R> {
    pub id: RequestId,
    pub result: R,
}

/// A failed reply. `id` is `null` when the request could not be read far enough to find it.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ErrorReply {
    #[schemars(required, schema_with = "nullable_request_id")]
    pub id: Option<RequestId>,
    pub error: AppError,
}

/// `RequestId | null`, always present: the field tells an error reply from a connection error.
fn nullable_request_id(generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
    let id = generator.subschema_for::<RequestId>();
    schemars::json_schema!({"anyOf": [id, {"type": "null"}]})
}

/// A message from the host that answers no request.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Push<P> {
    pub method: String,
    pub params: P,
}

/// A failure of the whole connection; a WebSocket close follows.
#[derive(Debug, Clone, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ConnectionError {
    pub error: AppError,
}

/// Any frame a host sends, as a client reads it. Results and push params stay raw until the
/// caller knows which type to read them as.
#[derive(Debug)]
pub enum ServerFrame {
    Result {
        id: RequestId,
        result: Box<RawValue>,
    },
    Error {
        id: Option<RequestId>,
        error: AppError,
    },
    Push {
        method: String,
        params: Box<RawValue>,
    },
    ConnectionError {
        error: AppError,
    },
}
