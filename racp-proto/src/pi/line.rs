//! One line of pi's stdout, read in one pass: its `type` and its fields as pi wrote them, with
//! `message` and `assistantMessageEvent` (the two parts of a stream update that compaction cuts)
//! read one level deeper in the same pass. Nothing is re-encoded: every value stays a slice of
//! the line.

use super::Kind;
use serde::de::{DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;
use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

/// An object read one level deep: each field's value kept as pi wrote it.
pub type RawFields<'a> = BTreeMap<Cow<'a, str>, &'a RawValue>;

/// A field read one level deep.
#[derive(Debug, Default)]
pub enum Nested<'a> {
    #[default]
    Absent,
    Object(RawFields<'a>),
    /// A string (an `extension_ui_request`'s `message` is one).
    Text(Cow<'a, str>),
    /// Present but neither (then there is nothing to cut).
    NotObject,
}

impl<'a> Nested<'a> {
    pub fn object(&self) -> Option<&RawFields<'a>> {
        match self {
            Nested::Object(fields) => Some(fields),
            Nested::Absent | Nested::Text(_) | Nested::NotObject => None,
        }
    }

    pub fn is_absent(&self) -> bool {
        matches!(self, Nested::Absent)
    }
}

/// The fields of a line that are read one level deeper.
const MESSAGE: &str = "message";
const STEP: &str = "assistantMessageEvent";

/// A line of pi's output.
#[derive(Debug)]
pub struct Line<'a> {
    pub kind: Kind,
    /// Every top-level field (`type` too) but `message` and `assistantMessageEvent`.
    pub fields: RawFields<'a>,
    /// `message` (message_start, message_update, message_end, turn_end).
    pub message: Nested<'a>,
    /// `assistantMessageEvent`, a `message_update`'s step.
    pub step: Nested<'a>,
}

/// Why a line is not agent output.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LineError {
    #[error("not JSON: {0}")]
    NotJson(String),
    #[error("not a JSON object with a string `type`")]
    NoType,
}

impl<'a> Line<'a> {
    /// Reads one complete line (without its `\n`).
    pub fn read(text: &'a str) -> Result<Line<'a>, LineError> {
        let mut de = serde_json::Deserializer::from_str(text);
        let read = de
            .deserialize_any(LineVisitor)
            .and_then(|read| de.end().map(|()| read))
            .map_err(|err| LineError::NotJson(err.to_string()))?;
        read.ok_or(LineError::NoType)
    }

    /// A `message` that is a string (an extension dialog's text).
    pub fn message_text(&self) -> Option<String> {
        match &self.message {
            Nested::Text(text) => Some(text.to_string()),
            _ => None,
        }
    }

    /// A top-level field read as `T` (`None` when absent or of another shape).
    pub fn field<T: serde::Deserialize<'a>>(&self, name: &str) -> Option<T> {
        let raw: &'a RawValue = self.fields.get(name)?;
        serde_json::from_str(raw.get()).ok()
    }
}

/// A JSON string as text, borrowed from the line unless it holds escapes (serde's own `Cow<str>`
/// always copies: a copy per key and per delta was a fifth of the host's time on pi's stream).
pub fn text(raw: &RawValue) -> Option<Cow<'_, str>> {
    let mut de = serde_json::Deserializer::from_str(raw.get());
    TextSeed.deserialize(&mut de).ok()
}

/// Deserializes a string borrowed when it can be.
struct TextSeed;

impl<'de> DeserializeSeed<'de> for TextSeed {
    type Value = Cow<'de, str>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Cow<'de, str>, D::Error> {
        deserializer.deserialize_str(TextVisitor)
    }
}

struct TextVisitor;

impl<'de> Visitor<'de> for TextVisitor {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a string")
    }

    fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(text))
    }

    fn visit_str<E>(self, text: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(text.to_owned()))
    }
}

/// Reads the top level; `None` for a value that is not an object with a string `type`.
struct LineVisitor;

impl<'de> Visitor<'de> for LineVisitor {
    type Value = Option<Line<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut kind = None;
        let mut line = Line {
            kind: Kind::Other("".into()),
            fields: RawFields::new(),
            message: Nested::Absent,
            step: Nested::Absent,
        };
        while let Some(key) = map.next_key_seed(TextSeed)? {
            match key.as_ref() {
                // A `type` that is not a string is no type: read it raw, then as a string.
                "type" => {
                    let raw = map.next_value::<&'de RawValue>()?;
                    kind = text(raw);
                    line.fields.insert(key, raw);
                }
                MESSAGE => line.message = map.next_value_seed(NestedSeed)?,
                STEP => line.step = map.next_value_seed(NestedSeed)?,
                _ => {
                    let value = map.next_value::<&'de RawValue>()?;
                    line.fields.insert(key, value);
                }
            }
        }
        Ok(kind.map(|kind| Line {
            kind: kind.into(),
            ..line
        }))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(None)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// Reads a field one level deep when it is an object, in the same pass as the line.
struct NestedSeed;

impl<'de> DeserializeSeed<'de> for NestedSeed {
    type Value = Nested<'de>;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Nested<'de>, D::Error> {
        deserializer.deserialize_any(NestedVisitor)
    }
}

struct NestedVisitor;

impl<'de> Visitor<'de> for NestedVisitor {
    type Value = Nested<'de>;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Nested<'de>, A::Error> {
        let mut fields = RawFields::new();
        while let Some(key) = map.next_key_seed(TextSeed)? {
            fields.insert(key, map.next_value::<&'de RawValue>()?);
        }
        Ok(Nested::Object(fields))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Nested<'de>, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Nested::NotObject)
    }

    fn visit_bool<E>(self, _: bool) -> Result<Nested<'de>, E> {
        Ok(Nested::NotObject)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Nested<'de>, E> {
        Ok(Nested::NotObject)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Nested<'de>, E> {
        Ok(Nested::NotObject)
    }
    fn visit_f64<E>(self, _: f64) -> Result<Nested<'de>, E> {
        Ok(Nested::NotObject)
    }
    fn visit_borrowed_str<E>(self, text: &'de str) -> Result<Nested<'de>, E> {
        Ok(Nested::Text(Cow::Borrowed(text)))
    }
    fn visit_str<E>(self, text: &str) -> Result<Nested<'de>, E> {
        Ok(Nested::Text(Cow::Owned(text.to_owned())))
    }
    fn visit_unit<E>(self) -> Result<Nested<'de>, E> {
        Ok(Nested::NotObject)
    }
}

/// Whether the head of a line too long to read names `agent_end` (pi repeats every message of
/// the run there, so its end can be too long to read and must still end the run).
pub fn head_names_agent_end(head: &str) -> bool {
    head.contains(&format!(r#""type":"{}""#, Kind::AgentEnd.as_str()))
}

/// The id of the reply whose line is too long to read, when its head names both (pi writes a
/// response's `id` first: `{"id":"…","type":"response",…`), so that its caller can fail at
/// once instead of waiting for an answer that was dropped.
pub fn head_names_reply(head: &str) -> Option<&str> {
    if !head.contains(&format!(r#""type":"{}""#, Kind::Response.as_str())) {
        return None;
    }
    let start = head.find(r#""id":""#)? + r#""id":""#.len();
    let len = head[start..].find('"')?;
    let id = &head[start..start + len];
    (!id.is_empty() && !id.contains('\\')).then_some(id)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn a_line_is_read_with_its_message_and_step_one_level_deep() {
        let text = r#"{"type":"message_update","message":{"role":"assistant","content":[1]},"assistantMessageEvent":{"type":"text_delta","delta":"hi"},"n":12345678901234567890123}"#;
        let line = Line::read(text).unwrap();
        assert_eq!(line.kind, Kind::MessageUpdate);
        assert_eq!(line.message.object().unwrap()["content"].get(), "[1]");
        assert_eq!(line.step.object().unwrap()["delta"].get(), r#""hi""#);
        // A number no u64 holds stays as written.
        assert_eq!(line.fields["n"].get(), "12345678901234567890123");
        assert_eq!(line.fields["type"].get(), r#""message_update""#);
    }

    #[test]
    fn what_is_not_an_object_with_a_type_is_refused_with_its_reason() {
        for (text, error) in [
            ("[1, {\"type\": \"x\"}]", LineError::NoType),
            ("{\"type\": 3}", LineError::NoType),
            ("{\"kind\": \"x\"}", LineError::NoType),
            ("\"message_end\"", LineError::NoType),
            ("{\"type\": \"x\"} 1", LineError::NotJson(String::new())),
            ("{\"type\": \"x\"", LineError::NotJson(String::new())),
        ] {
            let got = Line::read(text).unwrap_err();
            match error {
                LineError::NotJson(_) => assert!(matches!(got, LineError::NotJson(_)), "{text}"),
                LineError::NoType => assert_eq!(got, LineError::NoType, "{text}"),
            }
        }
        let odd =
            Line::read(r#"{"type":"message_update","message":"x","assistantMessageEvent":[1]}"#)
                .unwrap();
        assert!(matches!(&odd.message, Nested::Text(text) if text == "x"));
        assert!(matches!(odd.step, Nested::NotObject));
    }

    #[test]
    fn the_head_of_a_cut_reply_names_its_id() {
        let head = r#"{"id":"pi-host-7","type":"response","command":"bash","success":t"#;
        assert_eq!(head_names_reply(head), Some("pi-host-7"));
        assert_eq!(
            head_names_reply(r#"{"id":"pi-host-7","type":"agent_end""#),
            None
        );
        assert_eq!(
            head_names_reply(r#"{"type":"response","command":"x","id":"pi-ho"#),
            None
        );
    }
}
