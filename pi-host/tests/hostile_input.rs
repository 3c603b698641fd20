//! Hostile input against a real host: a corpus of malformed and hostile frames (deep nesting,
//! huge numbers, invalid UTF-8, wrong types, unknown fields, oversized strings) built from the
//! protocol's own schema, WebSocket-level violations, and floods. Every frame gets an answer
//! with a registered code, the host stays up, and its memory stays bounded.
//!
//! Set `RACP_FIGURES_DIR` to also write the counts and memory figures as JSON there.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use racp_proto::ErrorCode;
use serde_json::{Map, Value, json};
use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};
use tests::raw::Raw;
use tests::{Client, HostProcess, PATIENCE, record_figures};
use tokio::io::AsyncWriteExt;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

/// Peak and current resident memory of a process, in KiB (VmHWM, VmRSS).
fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmHWM:"), field("VmRSS:"))
}

/// What a case must be answered with.
#[derive(Clone, Debug)]
enum Expect {
    /// An error reply with this code.
    Code(&'static str),
    /// INVALID_PARAMS whose `details.path` starts with this path.
    ParamsAt(String),
    /// A result: some odd forms are valid.
    Result,
}

impl Expect {
    /// The code (or `result`) this case adds to the per-code counts.
    fn name(&self) -> &str {
        match self {
            Expect::Code(name) => name,
            Expect::ParamsAt(_) => "INVALID_PARAMS",
            Expect::Result => "result",
        }
    }
}

/// Whether `token` is a number as JSON writes them (RFC 8259 §6), whatever its size.
fn is_json_number(token: &str) -> bool {
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let rest = token.strip_prefix('-').unwrap_or(token);
    let (mantissa, exponent) = match rest.find(['e', 'E']) {
        Some(at) => (&rest[..at], Some(&rest[at + 1..])),
        None => (rest, None),
    };
    let (int, frac) = match mantissa.split_once('.') {
        Some((int, frac)) => (int, Some(frac)),
        None => (mantissa, None),
    };
    let exponent_ok = exponent.is_none_or(|e| digits(e.strip_prefix(['+', '-']).unwrap_or(e)));
    digits(int) && (int == "0" || !int.starts_with('0')) && frac.is_none_or(digits) && exponent_ok
}

struct Case {
    category: &'static str,
    text: String,
    expect: Expect,
}

/// Checks that an error object is well-formed and its code registered; returns the code.
/// INTERNAL never answers hostile input: each frame has an expected, specific answer.
fn registered(error: &Value) -> ErrorCode {
    let name = error["code"].as_str().expect("an error code");
    let code = ErrorCode::from_name(name).unwrap_or_else(|| panic!("unregistered code {name}"));
    assert_ne!(
        code,
        ErrorCode::Internal,
        "INTERNAL for hostile input: {error}"
    );
    let spec = code.spec();
    assert_eq!(error["recovery"], spec.recovery.as_str(), "{error}");
    assert!(error["retriable"].is_boolean(), "{error}");
    assert!(error["message"].is_string(), "{error}");
    code
}

/// Sends one frame and returns the reply to it: the next frame with an `id` key (pushes are
/// skipped), or `None` when the host closed the connection instead.
async fn exchange(client: &mut Client, text: String) -> Option<Value> {
    client.try_send_text(text).await.ok()?;
    loop {
        let frame = client.next_frame().await?;
        if frame.get("id").is_some() {
            return Some(frame);
        }
        if frame.get("method").is_none() {
            // A connection error: the connection ends.
            registered(&frame["error"]);
            return None;
        }
    }
}

// ---- The corpus -----------------------------------------------------------------------------

/// A valid params object for each method (nothing here is ever sent unmodified).
fn baselines() -> Vec<(&'static str, Value)> {
    vec![
        (
            "hello",
            json!({"protocol": {"min": 1, "max": 1}, "client": {"name": "t", "version": "0"}, "maxFrameBytes": 65536}),
        ),
        ("pair", json!({"deviceName": "x"})),
        ("host/info", json!({})),
        ("device/list", json!({})),
        ("device/revoke", json!({"deviceId": "dev_x"})),
        (
            "pairing/create",
            json!({"roles": ["observer"], "ttlSeconds": 600}),
        ),
        ("fs/list", json!({"path": "/tmp"})),
        ("fs/stat", json!({"path": "/tmp"})),
        ("session/create", json!({"workspace": "/tmp", "title": "t"})),
        ("session/list", json!({})),
        ("session/get", json!({"sessionId": "ses_x"})),
        (
            "session/subscribe",
            json!({"sessionId": "ses_x", "cursor": "0000000000000001-0"}),
        ),
        ("session/unsubscribe", json!({"subscriptionId": "sub_x"})),
        ("session/close", json!({"sessionId": "ses_x"})),
        (
            "turn/start",
            json!({"sessionId": "s", "idempotencyKey": "k", "text": "t"}),
        ),
        (
            "turn/steer",
            json!({"sessionId": "s", "turnId": "t", "text": "x"}),
        ),
        ("turn/abort", json!({"sessionId": "s", "turnId": "t"})),
        (
            "approval/respond",
            json!({"approvalId": "a", "decision": "allow"}),
        ),
    ]
}

/// The protocol's JSON Schema, as generated from the code.
fn schema() -> Value {
    let artifact = racp_proto::codegen::artifacts()
        .into_iter()
        .find(|a| a.path.ends_with(".schema.json"))
        .expect("the schema artifact");
    serde_json::from_str(&artifact.contents).unwrap()
}

fn resolve<'a>(schema: &'a Value, node: &'a Value) -> &'a Value {
    match node["$ref"].as_str() {
        Some(reference) => {
            let name = reference.trim_start_matches("#/$defs/");
            resolve(schema, &schema["$defs"][name])
        }
        None => node,
    }
}

fn kinds(node: &Value) -> Vec<String> {
    match &node["type"] {
        Value::String(t) => vec![t.clone()],
        Value::Array(ts) => ts
            .iter()
            .filter_map(|t| t.as_str().map(str::to_string))
            .collect(),
        _ => Vec::new(),
    }
}

/// Values of the wrong JSON type for a field of schema `node`.
fn wrong_values(node: &Value, required: bool) -> Vec<Value> {
    let kinds = kinds(node);
    let mut values = Vec::new();
    if required && !kinds.iter().any(|k| k == "null") {
        values.push(Value::Null);
    }
    let big = serde_json::from_str::<Value>("18446744073709551616").unwrap();
    let huge = serde_json::from_str::<Value>("1e300").unwrap();
    if node.get("anyOf").is_some() || node.get("oneOf").is_some() {
        // Decision-like unions: none of these is any of the alternatives.
        return vec![
            json!(1),
            json!(true),
            json!([]),
            json!(["allow"]),
            json!({}),
            json!({"value": 1}),
            json!({"other": "x"}),
            json!("maybe"),
            json!(""),
        ];
    }
    if kinds.iter().any(|k| k == "string") || node.get("enum").is_some() {
        values.extend([
            json!(true),
            json!(0),
            json!(-1),
            json!(1.5),
            big.clone(),
            json!([]),
            json!(["x"]),
            json!({}),
            json!({"a": "b"}),
        ]);
        // Names (the name pattern) refuse only unprintable characters; enums and other
        // patterns refuse words too.
        let name_pattern = node["pattern"] == racp_proto::validate::NAME_PATTERN;
        if node.get("enum").is_some() || (node.get("pattern").is_some() && !name_pattern) {
            values.push(json!("NOT-A-VALID-VALUE"));
        }
        if node.get("enum").is_some() || node.get("pattern").is_some() {
            values.extend([json!("\u{0}"), json!("\u{1b}[2J"), json!("a\u{202e}b")]);
        }
    } else if kinds.iter().any(|k| k == "integer") {
        values.extend([
            json!("1"),
            json!(true),
            json!(-1),
            json!(1.5),
            json!(-0.5),
            huge,
            big,
            json!([]),
            json!([1]),
            json!({}),
        ]);
    } else if kinds.iter().any(|k| k == "array") {
        values.extend([
            json!("owner"),
            json!(1),
            json!({}),
            json!([1]),
            json!([null]),
            json!([[]]),
            json!([{}]),
        ]);
    } else if kinds.iter().any(|k| k == "object") {
        values.extend([json!("x"), json!(1), json!([]), json!([1, 1]), json!(true)]);
    }
    values
}

fn frame(id: u64, method: &str, params: &Value) -> String {
    json!({"id": id, "method": method, "params": params}).to_string()
}

/// Cases derived from every method's params schema: wrong types, missing and unknown fields,
/// strings past their bounds, integers past theirs.
fn params_cases(next_id: &mut impl FnMut() -> u64) -> Vec<(&'static str, Case)> {
    let schema = schema();
    let methods = &schema["x-racp-methods"];
    let mut cases = Vec::new();
    for (method, base) in baselines() {
        let params_node = resolve(&schema, &methods[method]["params"]);
        let mut push = |category: &'static str, params: Value, expect: Expect| {
            cases.push((
                method,
                Case {
                    category,
                    text: frame(next_id(), method, &params),
                    expect,
                },
            ));
        };
        // Params that are not an object at all.
        for wrong in [
            json!([]),
            json!(1),
            json!("x"),
            json!(true),
            json!([base.clone()]),
        ] {
            push("wrong_type", wrong, Expect::ParamsAt("params".into()));
        }
        push(
            "unknown_field",
            {
                let mut p = base.clone();
                p["zzUnknown"] = json!(1);
                p
            },
            Expect::Code("INVALID_PARAMS"),
        );
        // Walk the object's fields, and the fields of objects inside it.
        let mut stack: Vec<(Vec<String>, &Value)> = vec![(Vec::new(), params_node)];
        while let Some((prefix, node)) = stack.pop() {
            let node = resolve(&schema, node);
            let Some(properties) = node["properties"].as_object() else {
                continue;
            };
            let required: Vec<&str> = node["required"]
                .as_array()
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            if !prefix.is_empty() {
                let mut p = base.clone();
                set(&mut p, &prefix, |v| {
                    v["zzUnknown"] = json!(1);
                });
                push("unknown_field", p, Expect::Code("INVALID_PARAMS"));
            }
            for (name, field) in properties {
                let mut path = prefix.clone();
                path.push(name.clone());
                let dotted = format!("params.{}", path.join("."));
                let field_node = resolve(&schema, field);
                let is_required = required.contains(&name.as_str());
                for wrong in wrong_values(field_node, is_required) {
                    let mut p = base.clone();
                    set(&mut p, &path, |v| *v = wrong.clone());
                    push("wrong_type", p, Expect::ParamsAt(dotted.clone()));
                }
                if is_required {
                    let mut p = base.clone();
                    remove(&mut p, &path);
                    push("missing_field", p, Expect::ParamsAt(dotted.clone()));
                }
                if let Some(max) = field_node["maxLength"].as_u64() {
                    for unit in ["a", "é", "😀"] {
                        let mut p = base.clone();
                        let long = unit.repeat(max as usize + 1);
                        let expect = if long.len() > 1 << 20 {
                            Expect::Code("PAYLOAD_TOO_LARGE")
                        } else {
                            Expect::ParamsAt(dotted.clone())
                        };
                        set(&mut p, &path, |v| *v = json!(long));
                        push("oversized_string", p, expect);
                    }
                }
                if field_node["minLength"].as_u64() == Some(1) {
                    let mut p = base.clone();
                    set(&mut p, &path, |v| *v = json!(""));
                    push("empty_string", p, Expect::ParamsAt(dotted.clone()));
                }
                if let Some(min) = field_node["minimum"].as_u64()
                    && min > 0
                {
                    let mut p = base.clone();
                    set(&mut p, &path, |v| *v = json!(min - 1));
                    push("number_bounds", p, Expect::ParamsAt(dotted.clone()));
                }
                if let Some(max) = field_node["maximum"].as_u64() {
                    let mut p = base.clone();
                    set(&mut p, &path, |v| *v = json!(max + 1));
                    push("number_bounds", p, Expect::ParamsAt(dotted.clone()));
                }
                if kinds(field_node).iter().any(|k| k == "object")
                    || field_node.get("properties").is_some()
                {
                    stack.push((path, field));
                }
            }
        }
    }
    cases
}

fn set(value: &mut Value, path: &[String], f: impl FnOnce(&mut Value)) {
    let mut at = value;
    for key in path {
        if !at.is_object() {
            *at = Value::Object(Map::new());
        }
        at = at
            .as_object_mut()
            .unwrap()
            .entry(key.clone())
            .or_insert(Value::Null);
    }
    f(at);
}

fn remove(value: &mut Value, path: &[String]) {
    let (last, parents) = path.split_last().unwrap();
    let mut at = value;
    for key in parents {
        at = &mut at[key.as_str()];
    }
    at.as_object_mut().unwrap().remove(last);
}

/// Cases about the envelope and the JSON itself.
fn envelope_cases(next_id: &mut impl FnMut() -> u64) -> Vec<Case> {
    let mut cases = Vec::new();
    let mut push = |category: &'static str, text: String, expect: Expect| {
        cases.push(Case {
            category,
            text,
            expect,
        })
    };
    let bad_json = || Expect::Code("INVALID_ARGUMENT");
    // Deep nesting, in every position, past and around the parser's limit of 128.
    for depth in [127usize, 128, 129, 500, 5_000, 100_000] {
        let arrays = format!("{}{}", "[".repeat(depth), "]".repeat(depth));
        let objects = format!("{}1{}", "{\"a\":".repeat(depth), "}".repeat(depth));
        for nested in [&arrays, &objects] {
            // Params are parsed lazily, so the depth limit never meets them: they are refused
            // as the wrong shape.
            push(
                "deep_nesting",
                format!(
                    r#"{{"id":{},"method":"session/list","params":{nested}}}"#,
                    next_id()
                ),
                Expect::Code("INVALID_PARAMS"),
            );
            push(
                "deep_nesting",
                format!(r#"{{"id":{nested},"method":"session/list"}}"#),
                bad_json(),
            );
            push(
                "deep_nesting",
                format!(r#"{{"id":{},"method":{nested}}}"#, next_id()),
                bad_json(),
            );
            push("deep_nesting", nested.clone(), bad_json());
            push(
                "deep_nesting",
                format!(
                    r#"{{"id":{},"method":"turn/start","params":{{"sessionId":"s","idempotencyKey":"k","text":{nested}}}}}"#,
                    next_id()
                ),
                Expect::Code("INVALID_PARAMS"),
            );
        }
    }
    // Huge and odd numbers as ids and as params.
    for number in [
        "18446744073709551616",
        "18446744073709551615",
        "-1",
        "-0",
        "1.5",
        "1e400",
        "-1e400",
        "1e-400",
        "123456789012345678901234567890123456789012345678901234567890",
        "0.0000000000000000000000000000000001",
        "1E2",
        "00",
        "01",
        "NaN",
        "Infinity",
        "-Infinity",
        "0x10",
        "+1",
        ".5",
        "5.",
    ] {
        // Not JSON at all: the frame is not a request. As an id, only a u64 (written as an
        // integer) is one. As a param, each is out of its field's bounds or not an integer.
        let json = is_json_number(number);
        // A number past f64's range fails while the params are read, at `params`.
        let in_range = serde_json::from_str::<Value>(number).is_ok();
        let as_param = |path: &str| match (json, in_range) {
            (true, true) => Expect::ParamsAt(path.into()),
            (true, false) => Expect::ParamsAt("params".into()),
            (false, _) => bad_json(),
        };
        push(
            "huge_number",
            format!(r#"{{"id":{number},"method":"session/list"}}"#),
            match number.parse::<u64>() {
                Ok(_) if json => Expect::Result,
                _ => bad_json(),
            },
        );
        push(
            "huge_number",
            format!(
                r#"{{"id":{},"method":"pairing/create","params":{{"roles":["observer"],"ttlSeconds":{number}}}}}"#,
                next_id()
            ),
            as_param("params.ttlSeconds"),
        );
        push(
            "huge_number",
            format!(
                r#"{{"id":{},"method":"hello","params":{{"protocol":{{"min":1,"max":1}},"client":{{"name":"x","version":"1"}},"maxFrameBytes":{number}}}}}"#,
                next_id()
            ),
            as_param("params.maxFrameBytes"),
        );
    }
    // Invalid Unicode that valid UTF-8 text can still carry: escaped lone surrogates, and
    // control characters that JSON forbids raw.
    for bad in [
        r#"\ud800"#,
        r#"\udfff"#,
        r#"\udc00\ud800"#,
        r#"\ud800\u0041"#,
        r#"\ud83d"#,
        r#"\uDBFF\uDBFF"#,
        r#"\u12"#,
        r#"\uZZZZ"#,
        r#"\x41"#,
        r#"\'"#,
        "\u{0}",
        "\u{1f}",
        "\n",
        "\t",
    ] {
        // A well-formed `\uXXXX` escape is JSON (a lone surrogate then fails as a string);
        // the rest make the frame invalid JSON.
        let escape = bad
            .strip_prefix("\\u")
            .is_some_and(|hex| hex.len() >= 4 && hex[..4].bytes().all(|b| b.is_ascii_hexdigit()));
        for (method, field) in [
            ("fs/list", "path"),
            ("session/get", "sessionId"),
            ("pair", "deviceName"),
        ] {
            let expect = match (escape, method) {
                (false, _) => bad_json(),
                // A device's connection may not pair: refused before its params are read.
                (true, "pair") => Expect::Code("FORBIDDEN"),
                // The string cannot be read at all: reported at `params`.
                (true, _) => Expect::ParamsAt("params".into()),
            };
            push(
                "invalid_unicode",
                format!(
                    r#"{{"id":{},"method":"{method}","params":{{"{field}":"{bad}"}}}}"#,
                    next_id()
                ),
                expect,
            );
        }
        push(
            "invalid_unicode",
            format!(r#"{{"id":"{bad}","method":"session/list"}}"#),
            bad_json(),
        );
        push(
            "invalid_unicode",
            format!(r#"{{"id":{},"method":"session/{bad}"}}"#, next_id()),
            bad_json(),
        );
    }
    // Shapes that are not a request.
    for text in [
        "",
        " ",
        "\u{feff}{\"id\":1,\"method\":\"session/list\"}",
        "null",
        "true",
        "1",
        "\"session/list\"",
        "[]",
        "[{\"id\":1,\"method\":\"session/list\"}]",
        "{}",
        "{\"id\":1}",
        "{\"method\":\"session/list\"}",
        "{\"id\":null,\"method\":\"session/list\"}",
        "{\"id\":true,\"method\":\"session/list\"}",
        "{\"id\":[],\"method\":\"session/list\"}",
        "{\"id\":{},\"method\":\"session/list\"}",
        "{\"id\":1,\"method\":null}",
        "{\"id\":1,\"method\":5}",
        "{\"id\":1,\"method\":[\"session/list\"]}",
        "{\"id\":1,\"method\":\"session/list\",\"extra\":1}",
        "{\"id\":1,\"method\":\"session/list\",\"jsonrpc\":\"2.0\"}",
        "{\"id\":1,\"id\":2,\"method\":\"session/list\"}",
        "{\"id\":1,\"method\":\"session/list\",\"method\":\"hello\"}",
        "{\"id\":1,\"method\":\"session/list\",\"params\":{},\"params\":{}}",
        "{\"id\":1,\"method\":\"session/list\"} trailing",
        "{\"id\":1,\"method\":\"session/list\"}{\"id\":2,\"method\":\"session/list\"}",
        "{\"id\":1,\"method\":\"session/list\"",
        "{\"id\":1,\"method\":\"session/list\",}",
        "{'id':1,'method':'session/list'}",
        "{id:1,method:\"session/list\"}",
        "{\"id\":1,/*c*/\"method\":\"session/list\"}",
        "{\"id\":1,\"method\":\"session/list\"}\u{0}",
        "\u{0}",
    ] {
        push("not_a_request", text.to_string(), bad_json());
    }
    // Well-formed requests for methods that do not exist.
    for text in [
        "{\"id\":1,\"method\":\"\"}",
        "{\"id\":1,\"method\":\"SESSION/LIST\"}",
        "{\"id\":1,\"method\":\"session/list \"}",
        "{\"id\":1,\"method\":\"session//list\"}",
        "{\"id\":1,\"method\":\"../hello\"}",
        "{\"id\":1,\"method\":\"hello\\u0000\"}",
        "{\"id\":\"\",\"method\":\"nope\"}",
    ] {
        push(
            "not_a_request",
            text.to_string(),
            Expect::Code("METHOD_NOT_FOUND"),
        );
    }
    // Overlong strings in the envelope.
    push(
        "oversized_string",
        format!(r#"{{"id":"{}","method":"session/list"}}"#, "i".repeat(129)),
        Expect::Code("INVALID_ARGUMENT"),
    );
    push(
        "oversized_string",
        format!(r#"{{"id":"{}","method":"session/list"}}"#, "é".repeat(129)),
        Expect::Code("INVALID_ARGUMENT"),
    );
    push(
        "oversized_string",
        format!(
            r#"{{"id":{},"method":"{}"}}"#,
            next_id(),
            "m".repeat(100_000)
        ),
        Expect::Code("METHOD_NOT_FOUND"),
    );
    for size in [(1 << 20) + 1, 2 << 20, (4 << 20) - 64] {
        push(
            "oversized_frame",
            format!(
                r#"{{"id":{},"method":"turn/start","params":{{"sessionId":"s","idempotencyKey":"k","text":"{}"}}}}"#,
                next_id(),
                "t".repeat(size)
            ),
            Expect::Code("PAYLOAD_TOO_LARGE"),
        );
        push(
            "oversized_frame",
            " ".repeat(size),
            Expect::Code("PAYLOAD_TOO_LARGE"),
        );
    }
    // Huge names and values that error messages could quote back.
    let big = "q".repeat(200_000);
    for (text, expect) in [
        (
            format!(
                r#"{{"id":{},"method":"session/list","params":{{"{big}":1}}}}"#,
                next_id()
            ),
            Expect::ParamsAt("params".into()),
        ),
        (
            format!(
                r#"{{"id":{},"method":"hello","params":{{"protocol":{{"min":1,"max":1,"{big}":1}},"client":{{"name":"a","version":"1"}}}}}}"#,
                next_id()
            ),
            Expect::ParamsAt("params.protocol".into()),
        ),
        (
            format!(
                r#"{{"id":{},"method":"pairing/create","params":{{"roles":["{big}"]}}}}"#,
                next_id()
            ),
            Expect::ParamsAt("params.roles".into()),
        ),
        (
            format!(
                r#"{{"id":{},"method":"approval/respond","params":{{"approvalId":"a","decision":"{big}"}}}}"#,
                next_id()
            ),
            Expect::ParamsAt("params.decision".into()),
        ),
        (
            format!(
                r#"{{"id":{},"method":"session/subscribe","params":{{"sessionId":"s","cursor":"{big}"}}}}"#,
                next_id()
            ),
            Expect::ParamsAt("params.cursor".into()),
        ),
        (
            format!(
                r#"{{"id":{},"{big}":1,"method":"session/list"}}"#,
                next_id()
            ),
            bad_json(),
        ),
        (
            format!(
                r#"{{"id":{},"method":"session/list","params":{{"{big}"}}}}"#,
                next_id()
            ),
            bad_json(),
        ),
    ] {
        push("echo", text, expect);
    }
    // Unknown methods.
    for method in [
        "nope",
        "session/explode",
        "host/shutdown",
        "admin/exec",
        "hello/",
        "/",
    ] {
        push(
            "unknown_method",
            format!(r#"{{"id":{},"method":"{method}"}}"#, next_id()),
            Expect::Code("METHOD_NOT_FOUND"),
        );
    }
    cases
}

/// Checks a reply against its case; returns the error code (`None` for a result).
fn check(case: &Case, reply: &Value) -> Option<ErrorCode> {
    let Some(error) = reply.get("error") else {
        assert!(
            matches!(case.expect, Expect::Result) && reply.get("result").is_some(),
            "{}: not an error: {reply} for {:.200}",
            case.category,
            case.text
        );
        return None;
    };
    let code = registered(error);
    let what = format!("{}: {reply:.300} for {:.300}", case.category, case.text);
    // An answer never amplifies a hostile frame.
    let size = serde_json::to_string(reply).unwrap().len();
    assert!(size <= 4096, "a {size}-byte error reply: {what}");
    match &case.expect {
        Expect::Result => panic!("expected a result: {what}"),
        Expect::Code(name) => assert_eq!(error["code"], *name, "{what}"),
        Expect::ParamsAt(path) => {
            assert_eq!(error["code"], "INVALID_PARAMS", "{what}");
            let at = error["details"]["path"].as_str().unwrap_or("");
            assert!(
                at == path || at.starts_with(&format!("{path}.")),
                "expected the path {path}: {what}"
            );
        }
    }
    Some(code)
}

#[tokio::test]
async fn a_corpus_of_hostile_frames_gets_registered_codes_and_the_host_stays_up() {
    let host = HostProcess::start_with(
        bin(),
        &[
            "--requests-per-second",
            "1000000",
            "--request-burst",
            "1000000",
        ],
    )
    .await;
    let (_, token) = host.pair_device("owner", &[]).await;
    let pairing = host.pairing_token(&["--roles", "observer"]).await["token"]
        .as_str()
        .unwrap()
        .to_string();
    let mut next = 1000u64;
    let mut next_id = move || {
        next += 1;
        next
    };
    let mut device_cases = envelope_cases(&mut next_id);
    let mut pairing_cases = Vec::new();
    for (method, case) in params_cases(&mut next_id) {
        // `pair` is for pairing connections only (a device gets FORBIDDEN before its params
        // are read); everything else for the owner device.
        if method == "pair" {
            pairing_cases.push(case);
        } else {
            device_cases.push(case);
        }
    }
    let total = device_cases.len() + pairing_cases.len();
    assert!(total >= 500, "only {total} cases");

    let pid = host.pid();
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let (_, baseline_rss) = memory_kib(pid);
    let started = Instant::now();
    let mut by_category: BTreeMap<&str, u64> = BTreeMap::new();
    let mut by_code: BTreeMap<String, u64> = BTreeMap::new();
    let mut closed = 0;
    for (cases, credential) in [(&device_cases, &token), (&pairing_cases, &pairing)] {
        let mut client = Client::connect(&host.url(), credential).await.unwrap();
        client.hello().await;
        for case in cases.iter() {
            let reply = match exchange(&mut client, case.text.clone()).await {
                Some(reply) => reply,
                None => {
                    // Only a frame past the hard cap may end the connection.
                    assert!(
                        case.text.len() > 4 << 20,
                        "{} closed the connection",
                        case.category
                    );
                    closed += 1;
                    *by_code.entry("connection_ended".into()).or_default() += 1;
                    client = Client::connect(&host.url(), credential).await.unwrap();
                    client.hello().await;
                    continue;
                }
            };
            let code = check(case, &reply);
            *by_category.entry(case.category).or_default() += 1;
            let name = code.map_or("result", |c| c.spec().name);
            *by_code.entry(name.to_string()).or_default() += 1;
        }
    }
    let elapsed = started.elapsed();
    // The per-code counts are exactly those the cases expect: a frame past the hard cap ends
    // its connection, every other one gets its own answer (docs/reliability.md §2.4).
    let mut expected: BTreeMap<String, u64> = BTreeMap::new();
    for case in device_cases.iter().chain(&pairing_cases) {
        let name = match case.text.len() > 4 << 20 {
            true => "connection_ended",
            false => case.expect.name(),
        };
        *expected.entry(name.to_string()).or_default() += 1;
    }
    assert_eq!(by_code, expected, "answers by code");
    assert!(!by_code.contains_key("INTERNAL"));

    // The host is up, answers, and its memory is bounded.
    let info = client.call("host/info", json!({})).await;
    assert!(info.get("result").is_some(), "{info}");
    let (peak, rss) = memory_kib(pid);
    assert!(
        rss < baseline_rss + (128 << 10),
        "resident memory grew from {baseline_rss} to {rss} KiB"
    );
    record_figures(
        "hostile_input_corpus",
        &json!({
            "frames": total,
            "byCategory": by_category,
            "byCode": by_code,
            "connectionsEnded": closed,
            "seconds": elapsed.as_secs_f64(),
            "rssKibBefore": baseline_rss,
            "rssKibAfter": rss,
            "peakRssKib": peak,
        }),
    );
}

// ---- WebSocket-level violations, through a raw socket ---------------------------------------

#[tokio::test]
async fn websocket_violations_end_only_that_connection_with_a_registered_code() {
    let host = HostProcess::start(bin()).await;
    let (_, token) = host.pair_device("owner", &[]).await;
    let hello = br#"{"id":1,"method":"hello","params":{"protocol":{"min":1,"max":1},"client":{"name":"raw","version":"0"}}}"#;
    let mut figures = Map::new();

    // Invalid UTF-8 inside a text frame (a WebSocket violation, unlike a binary frame).
    let invalid_utf8: Vec<(&str, Vec<u8>)> = vec![
        (
            "lone continuation byte",
            b"{\"id\":2,\"method\":\"\x80\"}".to_vec(),
        ),
        (
            "overlong encoding",
            b"{\"id\":2,\"method\":\"\xc0\xaf\"}".to_vec(),
        ),
        (
            "encoded surrogate",
            b"{\"id\":2,\"method\":\"\xed\xa0\x80\"}".to_vec(),
        ),
        (
            "truncated sequence",
            b"{\"id\":2,\"method\":\"\xe2\x82\"}".to_vec(),
        ),
        (
            "beyond U+10FFFF",
            b"{\"id\":2,\"method\":\"\xf4\x90\x80\x80\"}".to_vec(),
        ),
        ("0xff byte", b"\xff\xfe{}".to_vec()),
    ];
    let violations: Vec<(&str, Vec<u8>)> = vec![
        // An unmasked client frame.
        ("unmasked frame", Raw::encode(0x81, hello, true)),
        // Reserved bits without an extension.
        ("RSV1 set", Raw::encode(0xC1, hello, false)),
        ("RSV3 set", Raw::encode(0x91, hello, false)),
        // Reserved opcodes.
        ("opcode 3", Raw::encode(0x83, b"x", false)),
        ("opcode 0xB", Raw::encode(0x8B, b"x", false)),
        // A control frame over 125 bytes, and a fragmented control frame.
        ("oversized ping", Raw::encode(0x89, &[b'p'; 200], false)),
        ("fragmented ping", Raw::encode(0x09, b"p", false)),
        // A continuation with nothing to continue.
        ("orphan continuation", Raw::encode(0x80, b"x", false)),
        // A new text frame while a fragmented one is open.
        (
            "interleaved data frames",
            [
                Raw::encode(0x01, b"{\"id\":", false),
                Raw::encode(0x81, b"{}", false),
            ]
            .concat(),
        ),
        // A frame claiming 2^63 bytes.
        ("absurd length", {
            let mut f = vec![0x81, 0xFF];
            f.extend_from_slice(&(1u64 << 63).to_be_bytes());
            f.extend_from_slice(&[1, 2, 3, 4]);
            f
        }),
        // A fragmented message growing past the hard cap (4 MiB) in 64 KiB pieces.
        ("fragments past the cap", {
            let piece = vec![b' '; 64 << 10];
            let mut f = Raw::encode(0x01, &piece, false);
            for _ in 0..70 {
                f.extend(Raw::encode(0x00, &piece, false));
            }
            f
        }),
    ];
    for (name, payload) in invalid_utf8 {
        let mut raw = Raw::connect(&host.url(), &token).await;
        let reply = raw.reply(hello).await;
        assert!(reply.get("result").is_some(), "{reply}");
        raw.text(&payload).await;
        let tests::raw::Ending {
            error: code, close, ..
        } = raw.until_close().await;
        assert_eq!(code.as_deref(), Some("INVALID_ARGUMENT"), "{name}");
        assert_eq!(close, Some(4004), "{name}");
        figures.insert(name.into(), json!({"code": code, "close": close}));
    }
    for (name, bytes) in violations {
        let mut raw = Raw::connect(&host.url(), &token).await;
        let reply = raw.reply(hello).await;
        assert!(reply.get("result").is_some(), "{reply}");
        raw.send(&bytes).await;
        let tests::raw::Ending {
            error: code, close, ..
        } = raw.until_close().await;
        let code = code.unwrap_or_else(|| panic!("{name}: no connection error (close {close:?})"));
        assert!(
            code == "INVALID_ARGUMENT" || code == "PAYLOAD_TOO_LARGE",
            "{name}: {code}"
        );
        let expected = ErrorCode::from_name(&code).unwrap().spec().close_code;
        if name == "fragments past the cap" {
            // The host stops reading with data still unread, so its kernel may reset the
            // socket and the close frame can be lost behind the connection error.
            assert!(
                close.is_none() || close == Some(expected),
                "{name}: {close:?}"
            );
        } else {
            assert_eq!(close, Some(expected), "{name}");
        }
        figures.insert(name.into(), json!({"code": code, "close": close}));
    }
    // A binary frame is an ordinary bad frame: answered, the connection stays.
    let mut raw = Raw::connect(&host.url(), &token).await;
    raw.reply(hello).await;
    raw.send(&Raw::encode(0x82, b"\xff\x00binary", false)).await;
    let (opcode, payload) = raw.frame().await.unwrap();
    assert_eq!(opcode, 1);
    let reply: Value = serde_json::from_slice(&payload).unwrap();
    assert_eq!(reply["error"]["details"]["reason"], "binary_frame");
    let again = raw.reply(br#"{"id":9,"method":"host/info"}"#).await;
    assert!(again.get("result").is_some(), "{again}");

    // The host is up.
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    record_figures("hostile_input_websocket", &Value::Object(figures));
}

// ---- Floods -----------------------------------------------------------------------------------

#[tokio::test]
async fn floods_are_answered_or_refused_with_registered_codes_in_bounded_memory() {
    let host = HostProcess::start(bin()).await;
    let (_, token) = host.pair_device("owner", &[]).await;
    let pid = host.pid();
    let (_, baseline_rss) = memory_kib(pid);
    let mut figures = Map::new();

    // 1. 20 000 calls pipelined on one connection, 1000 at a time before reading (a client
    //    that never reads is cut off as too slow): every one is answered, with a result,
    //    RATE_LIMITED or, for the malformed half, INVALID_ARGUMENT.
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let calls = 20_000u64;
    let started = Instant::now();
    let mut codes: BTreeMap<String, u64> = BTreeMap::new();
    for batch in 0..calls / 1000 {
        for id in batch * 1000..(batch + 1) * 1000 {
            let text = if id % 2 == 0 {
                json!({"id": id, "method": "session/list"}).to_string()
            } else {
                format!(r#"{{"id":{id},"method":"session/list","params":{{"x":"#)
            };
            client.send_text(text).await;
        }
        let mut answered = 0;
        while answered < 1000 {
            let frame = client
                .next_frame()
                .await
                .expect("the connection stays open");
            if frame.get("id").is_none() {
                continue;
            }
            answered += 1;
            let key = match frame.get("error") {
                Some(error) => registered(error).spec().name.to_string(),
                None => "result".to_string(),
            };
            *codes.entry(key).or_default() += 1;
        }
    }
    assert!(codes.contains_key("RATE_LIMITED"), "{codes:?}");
    // session/list is answered faster than frames arrive, so the in-flight bound may or may not
    // bite here; `calls_past_the_in_flight_bound_get_host_overloaded` makes it bite.
    for code in codes.keys() {
        assert!(
            [
                "result",
                "RATE_LIMITED",
                "INVALID_ARGUMENT",
                "HOST_OVERLOADED"
            ]
            .contains(&code.as_str()),
            "{codes:?}"
        );
    }
    figures.insert(
        "pipelined".into(),
        json!({"calls": calls, "seconds": started.elapsed().as_secs_f64(), "answers": codes}),
    );

    // 2. A ping flood: the connection stays usable.
    let mut raw = Raw::connect(&host.url(), &token).await;
    let pings: Vec<u8> = (0..10_000)
        .flat_map(|_| Raw::encode(0x89, b"ping", false))
        .collect();
    assert!(raw.send(&pings).await);
    let reply = raw
        .reply(br#"{"id":1,"method":"hello","params":{"protocol":{"min":1,"max":1},"client":{"name":"raw","version":"0"}}}"#)
        .await;
    assert!(reply.get("result").is_some(), "{reply}");

    // 3. 300 connections opened at once by one device, half of them never saying hello;
    //    then 300 TCP connections that never finish an HTTP request.
    let mut clients = Vec::new();
    for i in 0..300 {
        let mut c = Client::connect(&host.url(), &token).await.unwrap();
        if i % 2 == 0 {
            c.hello().await;
        }
        clients.push(c);
    }
    let mut idle = Vec::new();
    for _ in 0..300 {
        let mut s = host.stream().await;
        s.write_all(b"GET /racp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
            .await
            .unwrap();
        idle.push(s);
    }
    let mut fresh = Client::connect(&host.url(), &token).await.unwrap();
    fresh.hello().await;
    let answer = fresh.call("session/list", json!({})).await;
    assert!(
        answer.get("result").is_some() || answer["error"]["code"] == "RATE_LIMITED",
        "{answer}"
    );
    let (peak, rss) = memory_kib(pid);
    figures.insert(
        "connections".into(),
        json!({"websockets": clients.len(), "halfOpenHttp": idle.len(), "rssKib": rss}),
    );
    drop(clients);
    drop(idle);

    // 4. Every connection is gone again and the host still answers.
    let deadline = Instant::now() + PATIENCE;
    loop {
        let (ok, stdout, _) = host.cli(&["status", "--json"]).await;
        assert!(ok);
        let status: Value = serde_json::from_str(stdout.trim()).unwrap();
        // Three stay open: the pipelining, ping-flood and fresh connections.
        if status["connections"].as_u64().is_none_or(|n| n <= 3) {
            break;
        }
        assert!(Instant::now() < deadline, "connections linger: {status}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        peak < baseline_rss + (256 << 10),
        "peak memory {peak} KiB from {baseline_rss} KiB"
    );
    figures.insert(
        "memory".into(),
        json!({"rssKibBefore": baseline_rss, "peakRssKib": peak}),
    );
    record_figures("hostile_input_floods", &Value::Object(figures));
}

/// The per-connection in-flight bound (`limits.maxInFlight`, 64), made to bite: one `turn/start`
/// per session, each waiting for its agent's answer while holding its place; the agents start
/// only once the test opens a gate (a file appears), after every call past the bound was refused with
/// HOST_OVERLOADED, so which calls get a place does not depend on timing (docs/protocol.md §11,
/// docs/reliability.md §2.4).
#[tokio::test]
async fn calls_past_the_in_flight_bound_get_host_overloaded() {
    // The agents start once `go` exists; one gives up when the gate's directory is gone (the
    // test ended without opening it).
    let gate = tempfile::tempdir().unwrap();
    let go = gate.path().join("go");
    // The host asks its agent's version before any turn: that passes the gate.
    let gated = gate.path().join("gated-agent");
    std::fs::write(
        &gated,
        format!(
            "#!/bin/sh\n[ \"$1\" = --version ] && exec '{bin}' --version\n\
             while [ ! -e '{go}' ]; do [ -d '{dir}' ] || exit 1; sleep 0.1; done\n\
             exec '{bin}' \"$@\"\n",
            go = go.display(),
            dir = gate.path().display(),
            bin = tests::stand_in_agent().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&gated, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let agent = gated.display().to_string();
    let host = HostProcess::start_with(
        bin(),
        &[
            "--agent",
            &agent,
            "--requests-per-second",
            "1000000",
            "--request-burst",
            "1000000",
            // Room for an agent per call: the cap on running agents (HOST_OVERLOADED of its
            // own, tested in agents.rs) must not answer before the in-flight bound does.
            "--max-agents",
            "200",
        ],
    )
    .await;
    let (_, token) = host.pair_device("owner", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    let hello = client.hello().await;
    let bound = hello["limits"]["maxInFlight"].as_u64().unwrap();
    assert_eq!(bound, 64, "{hello}");
    let calls = bound + 8;
    let mut sessions = Vec::new();
    for _ in 0..calls {
        let created = client
            .call("session/create", json!({"workspace": host.workspace("w")}))
            .await;
        let session_id = created["result"]["session"]["sessionId"].clone();
        assert!(session_id.is_string(), "{created}");
        sessions.push(session_id);
    }
    for (i, session_id) in sessions.iter().enumerate() {
        client
            .send_text(
                json!({"id": i, "method": "turn/start", "params": {
                    "sessionId": session_id, "idempotencyKey": "k", "text": "hi"}})
                .to_string(),
            )
            .await;
    }
    let mut codes: BTreeMap<String, u64> = BTreeMap::new();
    let mut overloaded = Vec::new();
    let mut answered = 0;
    while answered < calls {
        let frame = tokio::time::timeout(PATIENCE, client.next_frame())
            .await
            .expect("every call is answered (the agents start once every refusal arrived)")
            .expect("the connection stays open");
        if frame.get("id").is_none() {
            continue;
        }
        answered += 1;
        let key = match frame.get("error") {
            Some(error) => {
                let code = registered(error);
                if code == ErrorCode::HostOverloaded {
                    assert_eq!(error["details"]["maxInFlight"], bound, "{error}");
                    assert!(error["retryAfterMs"].as_u64().is_some(), "{error}");
                    assert_eq!(error["retriable"], true, "{error}");
                    overloaded.push(frame["id"].as_u64().unwrap());
                    if overloaded.len() as u64 == calls - bound {
                        std::fs::write(&go, b"").unwrap();
                    }
                }
                code.spec().name.to_string()
            }
            None => "result".to_string(),
        };
        *codes.entry(key).or_default() += 1;
    }
    // The first `bound` calls wait for their agents and then run; the rest are refused before
    // they start.
    let expected = BTreeMap::from([
        ("result".to_string(), bound),
        ("HOST_OVERLOADED".to_string(), calls - bound),
    ]);
    assert_eq!(codes, expected);
    overloaded.sort_unstable();
    assert_eq!(overloaded, (bound..calls).collect::<Vec<_>>());
    record_figures(
        "hostile_input_in_flight",
        &json!({"maxInFlight": bound, "calls": calls, "answers": codes}),
    );
}
