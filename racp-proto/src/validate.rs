//! Field checks that serde's types cannot express (lengths, ranges). Every bound here is also
//! declared on the field for the JSON Schema, from the same constant in [`crate::limits`].

use crate::error::{AppError, ErrorCode};
use serde_json::json;

/// Checks a decoded params value; the error's `details.path` names the bad field.
pub trait Validate {
    fn validate(&self) -> Result<(), AppError> {
        Ok(())
    }
}

/// Longest `path` and `reason` an error repeats from the request (characters): serde's
/// messages quote unknown field names and variants, which a hostile request makes huge.
pub const MAX_ECHO_CHARS: usize = 256;

/// `text` cut to `max` characters, with `…` when something was cut.
pub fn clip(text: &str, max: usize) -> String {
    match text.char_indices().nth(max) {
        Some((at, _)) => format!("{}…", &text[..at]),
        None => text.to_string(),
    }
}

/// An INVALID_PARAMS error for the field at `path` (relative to `params`). Both `path` and
/// `reason` are cut at [`MAX_ECHO_CHARS`], so an error is never much larger than a request.
pub fn invalid(path: &str, reason: impl Into<String>) -> AppError {
    let reason = clip(&reason.into(), MAX_ECHO_CHARS);
    let path = if path.is_empty() {
        "params".to_string()
    } else {
        clip(&format!("params.{path}"), MAX_ECHO_CHARS)
    };
    AppError::new(ErrorCode::InvalidParams, format!("{path}: {reason}"))
        .with_details(json!({"path": path, "reason": reason}))
}

/// Checks that `value` has between `min` and `max` characters.
pub fn length(path: &str, value: &str, min: u64, max: u64) -> Result<(), AppError> {
    // Byte length bounds the char count from above, so most strings skip the count.
    let chars = if (value.len() as u64) <= max {
        value.chars().count() as u64
    } else {
        value.chars().take(max as usize + 1).count() as u64
    };
    if chars < min {
        return Err(invalid(
            path,
            format!("must have at least {min} characters"),
        ));
    }
    if chars > max {
        return Err(invalid(path, format!("must have at most {max} characters")));
    }
    Ok(())
}

/// Checks that `value` lies in `min..=max`.
pub fn range(path: &str, value: u64, min: u64, max: u64) -> Result<(), AppError> {
    if value < min || value > max {
        return Err(invalid(path, format!("must be between {min} and {max}")));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn length_counts_characters_not_bytes() {
        assert!(length("x", "ééé", 1, 3).is_ok());
        let err = length("x", "éééé", 1, 3).unwrap_err();
        assert_eq!(err.code(), ErrorCode::InvalidParams);
        assert_eq!(err.details().unwrap()["path"], "params.x");
        assert!(length("x", "", 1, 3).is_err());
    }

    #[test]
    fn errors_do_not_echo_huge_input() {
        let big = "k".repeat(100_000);
        let err = invalid(&big, format!("unknown field `{big}`"));
        let encoded = serde_json::to_string(&err).unwrap();
        assert!(encoded.len() < 2_000, "{}", encoded.len());
        assert!(
            err.details().unwrap()["path"]
                .as_str()
                .unwrap()
                .ends_with('…')
        );
        assert_eq!(clip("ééé", 2), "éé…");
        assert_eq!(clip("ééé", 3), "ééé");
    }

    #[test]
    fn range_is_inclusive() {
        assert!(range("t", 10, 10, 20).is_ok());
        assert!(range("t", 20, 10, 20).is_ok());
        assert!(range("t", 21, 10, 20).is_err());
        assert!(range("t", 9, 10, 20).is_err());
    }
}
