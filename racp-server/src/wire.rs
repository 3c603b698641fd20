//! Encoding what the host sends and stores. Serializing the host's plain data types cannot fail
//! in practice; where it does, this is the one way it is handled: logged, and answered as
//! INTERNAL in place of what could not be encoded (never an empty body or an empty object).

use racp_proto::frame::ErrorReply;
use racp_proto::{AppError, ErrorCode};
use serde::Serialize;
use serde_json::Value;

/// The last resort when even an INTERNAL error frame cannot be encoded.
const INTERNAL_FRAME: &str = r#"{"id":null,"error":{"code":"INTERNAL","message":"the host could not encode a frame","retriable":false,"recovery":"stop_and_report","source":"host"}}"#;

/// The error that stands in for something that could not be encoded.
pub fn unencodable(what: &str, err: impl std::fmt::Display) -> AppError {
    tracing::error!(error = %err, what, "cannot encode");
    AppError::new(
        ErrorCode::Internal,
        format!("the host could not encode {what}"),
    )
}

/// A frame as JSON text; an INTERNAL error frame in its place when it cannot be encoded.
pub fn encode<T: Serialize>(frame: &T) -> String {
    serde_json::to_string(frame).unwrap_or_else(|err| {
        let error = unencodable("a frame", err);
        serde_json::to_string(&ErrorReply { id: None, error })
            .unwrap_or_else(|_| INTERNAL_FRAME.to_string())
    })
}

/// A result as the JSON text a reply splices in, or INTERNAL.
pub fn to_raw<T: Serialize>(result: &T) -> Result<Box<serde_json::value::RawValue>, AppError> {
    serde_json::value::to_raw_value(result).map_err(|err| unencodable("a result", err))
}

/// A handler's result as a JSON value, or INTERNAL.
pub fn to_value<T: Serialize>(result: &T) -> Result<Value, AppError> {
    serde_json::to_value(result).map_err(|err| unencodable("a result", err))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A value serde refuses: a map whose keys are not strings.
    fn unencodable_value() -> std::collections::HashMap<Vec<u8>, u8> {
        std::collections::HashMap::from([(vec![1u8], 1u8)])
    }

    #[test]
    fn what_cannot_be_encoded_becomes_an_internal_error() {
        let frame: Value = serde_json::from_str(&encode(&unencodable_value())).unwrap();
        assert_eq!(frame["error"]["code"], "INTERNAL");
        assert_eq!(
            to_value(&unencodable_value()).unwrap_err().code(),
            ErrorCode::Internal
        );
        let fallback: Value = serde_json::from_str(INTERNAL_FRAME).unwrap();
        assert_eq!(fallback["error"]["code"], "INTERNAL");
    }
}
