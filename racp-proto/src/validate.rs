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

/// What a name (device name, session title) may not contain, as a JSON Schema pattern: control
/// characters (C0, DEL, C1), line and paragraph separators, and bidirectional overrides. A
/// name is printed by CLIs and shown in lists; these would let it rewrite a terminal or
/// disguise itself.
pub const NAME_PATTERN: &str =
    "^[^\\u0000-\\u001f\\u007f-\\u009f\\u200e\\u200f\\u2028-\\u202e\\u2066-\\u2069]*$";

/// True for the characters [`NAME_PATTERN`] refuses.
pub fn is_unprintable(c: char) -> bool {
    c.is_control()
        || matches!(c, '\u{200e}' | '\u{200f}' | '\u{2028}'..='\u{202e}' | '\u{2066}'..='\u{2069}')
}

/// Checks a name: `min..=max` characters, none of them unprintable ([`NAME_PATTERN`]).
pub fn name(path: &str, value: &str, min: u64, max: u64) -> Result<(), AppError> {
    length(path, value, min, max)?;
    if value.chars().any(is_unprintable) {
        return Err(invalid(
            path,
            "must not contain control characters, line separators or bidirectional overrides",
        ));
    }
    Ok(())
}

/// An identifier (a provider name): an ASCII letter or digit, then letters, digits, `.`, `_`
/// or `-`. Such names are file keys and command-line words on the host.
pub const IDENTIFIER_PATTERN: &str = "^[A-Za-z0-9][A-Za-z0-9._-]*$";

/// Checks an identifier ([`IDENTIFIER_PATTERN`]) of at most `max` characters.
pub fn identifier(path: &str, value: &str, max: u64) -> Result<(), AppError> {
    length(path, value, 1, max)?;
    let mut chars = value.chars();
    let first_ok = chars.next().is_some_and(|c| c.is_ascii_alphanumeric());
    if !first_ok || !chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '_' | '-')) {
        return Err(invalid(
            path,
            "must start with a letter or digit and hold only letters, digits, '.', '_' and '-'",
        ));
    }
    Ok(())
}

/// `text` with every unprintable character ([`is_unprintable`]) shown as a `\u{…}` escape, so
/// printing what a client or an agent sent cannot move the cursor, retitle the terminal or
/// reorder the line. Newlines and tabs stay when `multiline` (agent text), else they are
/// escaped too.
pub fn printable(text: &str, multiline: bool) -> std::borrow::Cow<'_, str> {
    let keep = |c: char| multiline && (c == '\n' || c == '\t');
    if !text.chars().any(|c| is_unprintable(c) && !keep(c)) {
        return std::borrow::Cow::Borrowed(text);
    }
    let mut out = String::with_capacity(text.len() + 8);
    for c in text.chars() {
        if is_unprintable(c) && !keep(c) {
            out.push_str(&format!("\\u{{{:x}}}", c as u32));
        } else {
            out.push(c);
        }
    }
    std::borrow::Cow::Owned(out)
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
    fn names_refuse_what_would_rewrite_a_terminal() {
        for bad in [
            "laptop\u{1b}[2K\r\u{1b}[1A\u{1b}]0;owned\u{7}",
            "a\nb",
            "tab\there",
            "del\u{7f}",
            "c1\u{9b}31m",
            "bidi\u{202e}txt.exe",
            "iso\u{2066}late",
            "line\u{2028}sep",
        ] {
            let err = name("deviceName", bad, 1, 64).unwrap_err();
            assert_eq!(err.code(), ErrorCode::InvalidParams, "{bad:?}");
        }
        assert!(name("deviceName", "Zoë's laptop ✓ 日本", 1, 64).is_ok());
    }

    #[test]
    fn printable_escapes_controls_and_keeps_text() {
        assert_eq!(printable("plain ✓", false), "plain ✓");
        assert_eq!(printable("x\u{1b}[2K\ry", false), "x\\u{1b}[2K\\u{d}y");
        assert_eq!(printable("a\n\tb\u{7}", true), "a\n\tb\\u{7}");
        assert_eq!(printable("a\nb", false), "a\\u{a}b");
        assert_eq!(printable("\u{202e}", true), "\\u{202e}");
    }

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
    fn identifiers_are_file_and_word_safe() {
        for ok in ["openai", "my-llm_2.local", "9x"] {
            assert!(identifier("p", ok, 64).is_ok(), "{ok}");
        }
        for bad in ["", "-x", ".x", "a/b", "a b", "ü", "a\n", &"a".repeat(65)] {
            assert!(identifier("p", bad, 64).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn range_is_inclusive() {
        assert!(range("t", 10, 10, 20).is_ok());
        assert!(range("t", 20, 10, 20).is_ok());
        assert!(range("t", 21, 10, 20).is_err());
        assert!(range("t", 9, 10, 20).is_err());
    }
}
