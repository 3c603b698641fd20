//! A method's params read as its type: absent and `null` mean `{}`, structs only from JSON
//! objects (`strict.rs`), a bad field reported as INVALID_PARAMS with its dotted JSON path.

use super::strict;
use crate::error::AppError;
use serde::de::DeserializeOwned;
use serde_json::value::RawValue;

/// Reads a method's params. Absent and `null` params mean `{}`.
pub fn decode_params<T: DeserializeOwned + crate::validate::Validate>(
    params: Option<&RawValue>,
) -> Result<T, AppError> {
    let text = match params {
        Some(raw) if raw.get() != "null" => raw.get(),
        _ => "{}",
    };
    let parsed: serde_json::Value = serde_json::from_str(text)
        .map_err(|err| crate::validate::invalid("", strip_position(&err.to_string())))?;
    if !parsed.is_object() {
        return Err(crate::validate::invalid("", "params must be a JSON object"));
    }
    let value: T = serde_path_to_error::deserialize(strict::Strict(&parsed)).map_err(|err| {
        let inner = err.inner();
        let mut path = dotted(err.path());
        let reason = strip_position(&inner.to_string());
        // serde reports a missing field at its parent; point at the field itself.
        if let Some(field) = missing_field(&reason) {
            path = if path == "." {
                field.to_string()
            } else {
                format!("{path}.{field}")
            };
        }
        let path = if path == "." { String::new() } else { path };
        crate::validate::invalid(&path, reason)
    })?;
    value.validate()?;
    Ok(value)
}

/// The path as documented: fields and array indexes joined by dots (`roles.1`, not
/// serde_path_to_error's `roles[1]`); `.` for the params object itself.
fn dotted(path: &serde_path_to_error::Path) -> String {
    use serde_path_to_error::Segment;
    let segments: Vec<String> = path
        .iter()
        .map(|segment| match segment {
            Segment::Seq { index } => index.to_string(),
            Segment::Map { key } => key.clone(),
            Segment::Enum { variant } => variant.clone(),
            Segment::Unknown => "?".to_string(),
        })
        .collect();
    if segments.is_empty() {
        ".".to_string()
    } else {
        segments.join(".")
    }
}

fn strip_position(message: &str) -> String {
    match message.rfind(" at line ") {
        Some(at) => message[..at].to_string(),
        None => message.to_string(),
    }
}

fn missing_field(reason: &str) -> Option<&str> {
    reason.strip_prefix("missing field `")?.strip_suffix('`')
}
