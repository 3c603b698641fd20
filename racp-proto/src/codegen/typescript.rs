//! clients/ts/racp.ts: TypeScript declarations rendered from the protocol's JSON Schema.
//!
//! Written here rather than with a derive crate (ts-rs, specta) on purpose: rendering from the
//! very schema that validates frames means the declarations and the schema cannot disagree about
//! a field, an optional marker or a union, and it adds no second derive to every type. It covers
//! exactly the schema subset schemars emits for these types; anything else fails loudly (the
//! staleness test would catch it).

use crate::error::{ErrorCode, Retriable};
use crate::events::{EventType, PushMethod};
use crate::methods::Method;
use serde_json::{Map, Value};
use std::fmt::Write;

pub fn render_typescript(schema: &Value) -> String {
    let mut out = String::new();
    write_header(&mut out);
    if let Some(defs) = schema["$defs"].as_object() {
        for (name, def) in defs {
            write_doc(&mut out, def, "");
            let _ = writeln!(out, "export type {name} = {};\n", render(def, ""));
        }
    }
    write_method_types(&mut out, schema);
    write_push_types(&mut out, schema);
    write_event_data(&mut out, schema);
    write_method_specs(&mut out);
    write_error_codes(&mut out);
    out
}

/// The banner and the protocol's constants.
fn write_header(out: &mut String) {
    let _ = writeln!(
        out,
        "// RACP-WS v1 TypeScript declarations.\n// Generated from racp-proto by `{}`. Do not edit: a test fails when this file is stale.\n",
        super::REGENERATE
    );
    out.push_str("/* eslint-disable */\n\n");
    let _ = writeln!(
        out,
        "export const PROTOCOL_VERSION = {} as const;\nexport const SUBPROTOCOL = \"{}\" as const;\nexport const BEARER_SUBPROTOCOL_PREFIX = \"{}\" as const;\nexport const ENDPOINT_PATH = \"{}\" as const;\n",
        crate::PROTOCOL_VERSION,
        crate::SUBPROTOCOL,
        crate::BEARER_SUBPROTOCOL_PREFIX,
        crate::ENDPOINT_PATH
    );
}

/// `RacpMethods`: each method's params and result, from the method table.
fn write_method_types(out: &mut String, schema: &Value) {
    out.push_str(
        "/** Params and result type of every method. */\nexport interface RacpMethods {\n",
    );
    for method in Method::ALL {
        let entry = &schema["x-racp-methods"][method.as_str()];
        let _ = writeln!(
            out,
            "  \"{}\": {{ params: {}; result: {} }};",
            method.as_str(),
            render(&entry["params"], "  "),
            render(&entry["result"], "  ")
        );
    }
    out.push_str("}\n\nexport type RacpMethodName = keyof RacpMethods;\n\n");
}

/// `RacpPushes`: each push's params.
fn write_push_types(out: &mut String, schema: &Value) {
    out.push_str("/** Params type of every push. */\nexport interface RacpPushes {\n");
    for push in PushMethod::ALL {
        let entry = &schema["x-racp-pushes"][push.as_str()];
        let _ = writeln!(
            out,
            "  \"{}\": {};",
            push.as_str(),
            render(&entry["params"], "  ")
        );
    }
    out.push_str("}\n\n");
}

/// `RacpEventData`: each host event type's `data`, from the host event table.
fn write_event_data(out: &mut String, schema: &Value) {
    out.push_str(
        "/** `data` type of every event type the host emits; `agent.*` events carry the agent's payload. */\nexport interface RacpEventData {\n",
    );
    for event in EventType::ALL {
        let entry = &schema["x-racp-events"][event.as_str()];
        let _ = writeln!(
            out,
            "  \"{}\": {};",
            event.as_str(),
            render(&entry["data"], "  ")
        );
    }
    out.push_str("}\n\n");
}

/// `METHODS`: who may call each method and how it may be resent.
fn write_method_specs(out: &mut String) {
    out.push_str(
        "/** Who may call each method, whether it changes state, and whether it may be resent after a lost reply, and how long the host may take beyond a usual call (its own deadline, or null). */\nexport const METHODS = {\n",
    );
    for method in Method::ALL {
        let spec = method.spec();
        let _ = writeln!(
            out,
            "  \"{}\": {{ access: \"{}\", mutates: {}, safeToResend: {}, deadlineMs: {} }},",
            spec.name,
            spec.access.as_str(),
            spec.mutates,
            spec.safe_to_resend,
            spec.deadline_ms
                .map_or("null".to_string(), |ms| ms.to_string())
        );
    }
    out.push_str("} as const;\n\n");
}

/// `ERROR_CODES`: the error-code registry.
fn write_error_codes(out: &mut String) {
    out.push_str("/** The error-code registry. */\nexport const ERROR_CODES = {\n");
    for code in ErrorCode::ALL {
        let spec = code.spec();
        let retriable = match spec.retriable {
            Retriable::Yes => "\"yes\"",
            Retriable::No => "\"no\"",
            Retriable::Maybe => "\"maybe\"",
        };
        let _ = writeln!(
            out,
            "  {}: {{ retriable: {}, recovery: \"{}\", closeCode: {}, httpStatus: {}{} }},",
            spec.name,
            retriable,
            spec.recovery.as_str(),
            spec.close_code,
            spec.http_status,
            if spec.reserved {
                ", reserved: true"
            } else {
                ""
            }
        );
    }
    out.push_str("} as const satisfies Record<ErrorCode, unknown>;\n");
}

fn write_doc(out: &mut String, schema: &Value, indent: &str) {
    if let Some(text) = schema.get("description").and_then(Value::as_str) {
        let text = text.replace("*/", "* /");
        let _ = writeln!(out, "{indent}/**");
        for line in text.lines() {
            let _ = writeln!(out, "{indent} * {line}");
        }
        let _ = writeln!(out, "{indent} */");
    }
}

/// Renders one schema as a TypeScript type expression.
fn render(schema: &Value, indent: &str) -> String {
    let Some(map) = schema.as_object() else {
        // `true` accepts anything.
        return "unknown".into();
    };
    if let Some(reference) = map.get("$ref").and_then(Value::as_str) {
        return reference.trim_start_matches("#/$defs/").to_string();
    }
    if let Some(constant) = map.get("const") {
        return constant.to_string();
    }
    if let Some(values) = map.get("enum").and_then(Value::as_array) {
        return union(values.iter().map(Value::to_string).collect());
    }
    for key in ["oneOf", "anyOf"] {
        if let Some(variants) = map.get(key).and_then(Value::as_array) {
            return union(variants.iter().map(|v| render(v, indent)).collect());
        }
    }
    if let Some(all) = map.get("allOf").and_then(Value::as_array) {
        return all
            .iter()
            .map(|v| wrap(render(v, indent)))
            .collect::<Vec<_>>()
            .join(" & ");
    }
    match map.get("type") {
        Some(Value::Array(types)) => union(
            types
                .iter()
                .map(|t| {
                    let mut single = map.clone();
                    single.insert("type".into(), t.clone());
                    render(&Value::Object(single), indent)
                })
                .collect(),
        ),
        Some(Value::String(kind)) => match kind.as_str() {
            "string" => "string".into(),
            "integer" | "number" => "number".into(),
            "boolean" => "boolean".into(),
            "null" => "null".into(),
            "array" => match map.get("items") {
                Some(items) => format!("{}[]", wrap(render(items, indent))),
                None => "unknown[]".into(),
            },
            "object" => render_object(map, indent),
            _ => "unknown".into(),
        },
        _ => "unknown".into(),
    }
}

fn render_object(map: &Map<String, Value>, indent: &str) -> String {
    let properties = map.get("properties").and_then(Value::as_object);
    let required: Vec<&str> = map
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let closed = map.get("additionalProperties") == Some(&Value::Bool(false));
    let Some(properties) = properties.filter(|p| !p.is_empty()) else {
        return if closed {
            "Record<string, never>".into()
        } else {
            "Record<string, unknown>".into()
        };
    };
    let inner = format!("{indent}  ");
    let mut out = String::from("{\n");
    for (name, property) in properties {
        write_doc(&mut out, property, &inner);
        let optional = if required.contains(&name.as_str()) {
            ""
        } else {
            "?"
        };
        let _ = writeln!(
            out,
            "{inner}{name}{optional}: {};",
            render(property, &inner)
        );
    }
    out.push_str(indent);
    out.push('}');
    out
}

fn union(mut parts: Vec<String>) -> String {
    parts.dedup();
    match parts.len() {
        0 => "never".into(),
        1 => parts.remove(0),
        // A union member needs parentheses only if it is an intersection.
        _ => parts
            .into_iter()
            .map(|p| {
                if p.contains(" & ") && !p.starts_with('{') {
                    format!("({p})")
                } else {
                    p
                }
            })
            .collect::<Vec<_>>()
            .join(" | "),
    }
}

/// Parenthesizes a union or intersection so it can be an array element or a union member.
fn wrap(ts: String) -> String {
    if (ts.contains(" | ") || ts.contains(" & ")) && !ts.starts_with('{') {
        format!("({ts})")
    } else {
        ts
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_the_schema_subset() {
        assert_eq!(render(&json!({"type": "string"}), ""), "string");
        assert_eq!(
            render(&json!({"type": ["string", "null"]}), ""),
            "string | null"
        );
        assert_eq!(render(&json!({"$ref": "#/$defs/Cursor"}), ""), "Cursor");
        assert_eq!(render(&json!({"enum": ["a", "b"]}), ""), "\"a\" | \"b\"");
        assert_eq!(
            render(
                &json!({"type": "array", "items": {"type": ["string", "null"]}}),
                ""
            ),
            "(string | null)[]"
        );
        assert_eq!(
            render(
                &json!({"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "boolean"}}, "required": ["a"]}),
                ""
            ),
            "{\n  a: number;\n  b?: boolean;\n}"
        );
        assert_eq!(
            render(
                &json!({"type": "object", "additionalProperties": false}),
                ""
            ),
            "Record<string, never>"
        );
        assert_eq!(render(&json!(true), ""), "unknown");
    }
}
