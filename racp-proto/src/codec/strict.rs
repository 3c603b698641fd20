//! A deserializer over a parsed `serde_json::Value` that reads structs only from JSON objects.
//!
//! serde's derived structs also accept a JSON array of field values (`"protocol": [1, 1]`), which
//! the JSON Schema rightly calls invalid. Reading params through this type makes the host accept
//! exactly what the schema accepts. Requests are small, so parsing to a `Value` first costs
//! little; events never pass through here.

use serde::de::value::{MapDeserializer, SeqDeserializer};
use serde::de::{self, Deserializer, IntoDeserializer, Visitor};
use serde_json::{Map, Value};

pub struct Strict<'a>(pub &'a Value);

impl<'de, 'a> IntoDeserializer<'de, serde_json::Error> for Strict<'a> {
    type Deserializer = Self;
    fn into_deserializer(self) -> Self {
        self
    }
}

fn object<'a, 'de, V: Visitor<'de>>(
    map: &'a Map<String, Value>,
    visitor: V,
) -> Result<V::Value, serde_json::Error> {
    let entries = map.iter().map(|(k, v)| (k.as_str(), Strict(v)));
    let mut access = MapDeserializer::new(entries);
    let value = visitor.visit_map(&mut access)?;
    access.end()?;
    Ok(value)
}

impl<'de, 'a> Deserializer<'de> for Strict<'a> {
    type Error = serde_json::Error;

    fn deserialize_any<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Null => visitor.visit_unit(),
            Value::Bool(b) => visitor.visit_bool(*b),
            Value::Number(n) => {
                if let Some(u) = n.as_u64() {
                    visitor.visit_u64(u)
                } else if let Some(i) = n.as_i64() {
                    visitor.visit_i64(i)
                } else {
                    visitor.visit_f64(n.as_f64().unwrap_or(f64::NAN))
                }
            }
            Value::String(s) => visitor.visit_str(s),
            Value::Array(items) => {
                let mut access = SeqDeserializer::new(items.iter().map(Strict));
                let value = visitor.visit_seq(&mut access)?;
                access.end()?;
                Ok(value)
            }
            Value::Object(map) => object(map, visitor),
        }
    }

    fn deserialize_option<V: Visitor<'de>>(self, visitor: V) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Null => visitor.visit_none(),
            _ => visitor.visit_some(self),
        }
    }

    fn deserialize_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _fields: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        match self.0 {
            Value::Object(map) => object(map, visitor),
            other => Err(de::Error::invalid_type(unexpected(other), &visitor)),
        }
    }

    fn deserialize_enum<V: Visitor<'de>>(
        self,
        _name: &'static str,
        _variants: &'static [&'static str],
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        // The protocol's enums are plain strings (unit variants).
        match self.0 {
            Value::String(s) => visitor.visit_enum(s.as_str().into_deserializer()),
            other => Err(de::Error::invalid_type(unexpected(other), &visitor)),
        }
    }

    fn deserialize_newtype_struct<V: Visitor<'de>>(
        self,
        _name: &'static str,
        visitor: V,
    ) -> Result<V::Value, Self::Error> {
        visitor.visit_newtype_struct(self)
    }

    serde::forward_to_deserialize_any! {
        bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string
        bytes byte_buf unit unit_struct seq tuple tuple_struct map identifier ignored_any
    }
}

fn unexpected(value: &Value) -> de::Unexpected<'_> {
    match value {
        Value::Null => de::Unexpected::Unit,
        Value::Bool(b) => de::Unexpected::Bool(*b),
        Value::Number(_) => de::Unexpected::Other("number"),
        Value::String(s) => de::Unexpected::Str(s),
        Value::Array(_) => de::Unexpected::Seq,
        Value::Object(_) => de::Unexpected::Map,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;
    use serde_json::json;

    #[derive(Debug, Deserialize, PartialEq)]
    #[serde(deny_unknown_fields)]
    struct Inner {
        a: u32,
        b: Option<String>,
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Outer {
        inner: Inner,
        list: Vec<u8>,
    }

    #[test]
    fn structs_come_only_from_objects() {
        let ok = json!({"inner": {"a": 1, "b": null}, "list": [1, 2]});
        let outer = Outer::deserialize(Strict(&ok)).unwrap();
        assert_eq!(outer.inner, Inner { a: 1, b: None });
        assert_eq!(outer.list, vec![1, 2]);
        let bad = json!({"inner": [1, "x"], "list": []});
        assert!(Outer::deserialize(Strict(&bad)).is_err());
        let extra = json!({"inner": {"a": 1, "c": 2}, "list": []});
        assert!(Outer::deserialize(Strict(&extra)).is_err());
        let wrong = json!({"inner": {"a": -1}, "list": []});
        assert!(Outer::deserialize(Strict(&wrong)).is_err());
    }
}
