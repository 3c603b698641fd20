//! The JSON Schema (draft 2020-12) of every frame, method, event and push.
//!
//! Types come from schemars; the frame unions and the method table are assembled here because
//! they are defined by the method table rather than by one Rust type.

use crate::error::{AppError, ErrorCode, Recovery};
use crate::events::{Event, EventType, PushMethod};
use crate::frame::{ConnectionError, ErrorReply, RequestId};
use crate::methods::{Empty, Method, MethodSpec};
use crate::{Cursor, PROTOCOL_VERSION, Role, SUBPROTOCOL};
use schemars::SchemaGenerator;
use schemars::generate::SchemaSettings;
use serde_json::{Map, Value, json};

/// Builds the whole protocol schema as a JSON value.
pub fn protocol_schema() -> Value {
    let mut generator = SchemaSettings::draft2020_12().into_generator();
    let mut defs = Map::new();
    let (methods, request_refs) = method_schemas(&mut generator, &mut defs);
    let (pushes, push_refs) = push_schemas(&mut generator, &mut defs);
    let events = event_schemas(&mut generator);
    define_building_blocks(&mut generator);
    define_frames(&mut defs, request_refs, push_refs);
    for (name, schema) in generator.take_definitions(true) {
        defs.insert(name, schema);
    }
    let defs: Map<String, Value> = sort_map(defs);

    json!({
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$id": "racp.v1.schema.json",
        "title": "RACP-WS v1",
        "description": format!(
            "Frames of the RACP-WS protocol, version {PROTOCOL_VERSION} (WebSocket subprotocol `{SUBPROTOCOL}`). Generated from the racp-proto crate by `{}`; do not edit.",
            super::REGENERATE
        ),
        "anyOf": [{"$ref": "#/$defs/ClientFrame"}, {"$ref": "#/$defs/HostFrame"}],
        "x-racp-methods": methods,
        "x-racp-pushes": pushes,
        "x-racp-events": events,
        "$defs": defs,
    })
}

/// The method table: `x-racp-methods`, and one request definition per method (added to `defs`)
/// with the refs the `ClientFrame` union takes.
fn method_schemas(
    generator: &mut SchemaGenerator,
    defs: &mut Map<String, Value>,
) -> (Map<String, Value>, Vec<Value>) {
    let empty_ref = generator.subschema_for::<Empty>().to_value();
    let mut methods = Map::new();
    let mut request_refs = Vec::new();
    for method in Method::ALL {
        let spec = method.spec();
        let params = method.params_schema(generator).to_value();
        let result = method.result_schema(generator).to_value();
        let request_name = format!("{}Request", type_name(spec.name));
        defs.insert(
            request_name.clone(),
            request_schema(spec, params.clone(), params == empty_ref),
        );
        request_refs.push(json!({"$ref": format!("#/$defs/{request_name}")}));
        methods.insert(
            spec.name.to_string(),
            json!({
                "summary": spec.summary(),
                "access": spec.access.as_str(),
                "mutates": spec.mutates,
                "safeToResend": spec.safe_to_resend,
                "deadlineMs": spec.deadline_ms,
                "params": params,
                "result": result,
            }),
        );
    }
    (methods, request_refs)
}

/// A request frame of one method; `params` may be absent (or null) when they are `{}`.
fn request_schema(spec: &MethodSpec, params: Value, params_optional: bool) -> Value {
    let params_schema = if params_optional {
        json!({"anyOf": [params, {"type": "null"}]})
    } else {
        params
    };
    let mut required = vec!["id", "method"];
    if !params_optional {
        required.push("params");
    }
    json!({
        "description": format!("`{}`: {}", spec.name, spec.summary()),
        "type": "object",
        "properties": {
            "id": {"$ref": "#/$defs/RequestId"},
            "method": {"const": spec.name},
            "params": params_schema,
            "traceId": crate::trace::schema(),
        },
        "required": required,
        "additionalProperties": false,
    })
}

/// The pushes: `x-racp-pushes`, and one push definition each (added to `defs`) with the refs
/// the `HostPush` union takes.
fn push_schemas(
    generator: &mut SchemaGenerator,
    defs: &mut Map<String, Value>,
) -> (Map<String, Value>, Vec<Value>) {
    let mut pushes = Map::new();
    let mut push_refs = Vec::new();
    for push in PushMethod::ALL {
        let params = push.params_schema(generator).to_value();
        let name = format!("{}Push", type_name(push.as_str()));
        defs.insert(
            name.clone(),
            json!({
                "description": format!("`{}`: {}", push.as_str(), push.summary()),
                "type": "object",
                "properties": {
                    "method": {"const": push.as_str()},
                    "params": params.clone(),
                },
                "required": ["method", "params"],
                "additionalProperties": false,
            }),
        );
        push_refs.push(json!({"$ref": format!("#/$defs/{name}")}));
        pushes.insert(
            push.as_str().to_string(),
            json!({"summary": push.summary(), "params": params}),
        );
    }
    (pushes, push_refs)
}

/// `x-racp-events`: the `data` schema of every row of the host event table.
fn event_schemas(generator: &mut SchemaGenerator) -> Map<String, Value> {
    let mut events = Map::new();
    for event in EventType::ALL {
        events.insert(
            event.as_str().to_string(),
            json!({"data": event.data_schema(generator).to_value()}),
        );
    }
    events
}

/// The shared building blocks are defined even where no method names them directly.
fn define_building_blocks(generator: &mut SchemaGenerator) {
    generator.subschema_for::<RequestId>();
    generator.subschema_for::<AppError>();
    generator.subschema_for::<ErrorCode>();
    generator.subschema_for::<Recovery>();
    generator.subschema_for::<Cursor>();
    generator.subschema_for::<Role>();
    generator.subschema_for::<Event>();
    generator.subschema_for::<ErrorReply>();
    generator.subschema_for::<ConnectionError>();
}

/// The frame unions, which the method table and the pushes define rather than one Rust type.
fn define_frames(defs: &mut Map<String, Value>, request_refs: Vec<Value>, push_refs: Vec<Value>) {
    defs.insert(
        "ResultReply".into(),
        json!({
            "description": "A successful reply; `result` has the type of the request's method (see x-racp-methods). Clients ignore result fields they do not know.",
            "type": "object",
            "properties": {
                "id": {"$ref": "#/$defs/RequestId"},
                "result": {"type": "object"},
            },
            "required": ["id", "result"],
            "additionalProperties": false,
        }),
    );
    defs.insert(
        "ClientFrame".into(),
        json!({"description": "Any frame a client sends: a request.", "oneOf": request_refs}),
    );
    defs.insert(
        "HostPush".into(),
        json!({"description": "Any push a host sends.", "oneOf": push_refs}),
    );
    defs.insert(
        "HostFrame".into(),
        json!({
            "description": "Any frame a host sends.",
            "oneOf": [
                {"$ref": "#/$defs/ResultReply"},
                {"$ref": "#/$defs/ErrorReply"},
                {"$ref": "#/$defs/HostPush"},
                {"$ref": "#/$defs/ConnectionError"},
            ],
        }),
    );
}

/// Pretty JSON with a trailing newline.
pub fn render_schema_json(schema: &Value) -> String {
    let mut text = serde_json::to_string_pretty(schema).unwrap_or_default();
    text.push('\n');
    text
}

/// `session/subscribe` → `SessionSubscribe`.
pub(crate) fn type_name(method: &str) -> String {
    method
        .split(['/', '.', '_'])
        .map(|part| {
            let mut chars = part.chars();
            match chars.next() {
                Some(first) => first.to_ascii_uppercase().to_string() + chars.as_str(),
                None => String::new(),
            }
        })
        .collect()
}

fn sort_map(map: Map<String, Value>) -> Map<String, Value> {
    let mut entries: Vec<_> = map.into_iter().collect();
    entries.sort_by(|a, b| a.0.cmp(&b.0));
    entries.into_iter().collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn type_names() {
        assert_eq!(type_name("session/subscribe"), "SessionSubscribe");
        assert_eq!(type_name("hello"), "Hello");
        assert_eq!(type_name("subscription/ended"), "SubscriptionEnded");
    }

    #[test]
    fn every_ref_resolves() {
        let schema = protocol_schema();
        let defs = schema["$defs"].as_object().unwrap();
        let mut refs = Vec::new();
        collect_refs(&schema, &mut refs);
        assert!(!refs.is_empty());
        for r in refs {
            let name = r
                .strip_prefix("#/$defs/")
                .unwrap_or_else(|| panic!("odd ref {r}"));
            assert!(defs.contains_key(name), "dangling ref {r}");
        }
    }

    #[test]
    fn required_params_are_never_empty_objects() {
        // The host reads absent params as `{}`; the schema requires params exactly for the
        // methods whose params type has a required field, so both agree.
        let schema = protocol_schema();
        for method in Method::ALL {
            let name = format!("{}Request", type_name(method.as_str()));
            let request = &schema["$defs"][&name];
            let params_required = request["required"]
                .as_array()
                .unwrap()
                .iter()
                .any(|v| v == "params");
            if params_required {
                let reference = request["properties"]["params"]["$ref"].as_str().unwrap();
                let def = &schema["$defs"][reference.trim_start_matches("#/$defs/")];
                let required = def["required"].as_array().map(Vec::len).unwrap_or(0);
                assert!(required > 0, "{name} requires params that may be empty");
            }
        }
    }

    fn collect_refs(value: &Value, out: &mut Vec<String>) {
        match value {
            Value::Object(map) => {
                for (key, v) in map {
                    if key == "$ref" {
                        if let Some(s) = v.as_str() {
                            out.push(s.to_string());
                        }
                    } else {
                        collect_refs(v, out);
                    }
                }
            }
            Value::Array(items) => items.iter().for_each(|v| collect_refs(v, out)),
            _ => {}
        }
    }
}
