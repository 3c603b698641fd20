//! The size policy for events: an event whose JSON does not fit a connection's frame bound goes
//! out with its largest values cut, and an `elided` marker saying what was cut and where to read
//! the whole event (a connection with a larger bound, subscribed from `elided.from`).
//!
//! Cutting is rare (the default bound is 1 MiB; agent events are usually small), so it is done
//! per delivery, on a copy; the shared log keeps the event whole.

use racp_proto::events::{Elided, ElidedValue};
use racp_proto::frame::{ErrorReply, RequestId};
use racp_proto::{AppError, Cursor, ErrorCode};
use serde_json::{Map, Value, json};

/// At most this many values are cut one by one; past that `data` is replaced as a whole.
const MAX_CUTS: usize = 64;
/// Longest path reported for a cut value (characters).
const MAX_PATH_CHARS: usize = 256;
/// Longest `type` kept when even an event without `data` does not fit (characters).
const MAX_TYPE_CHARS: usize = 128;

/// The event `json` (the stored form of the event at `seq`, in `epoch`) cut down to at most
/// `budget` bytes, for a connection whose frame bound is `limit`.
pub fn elide(json: &str, budget: usize, limit: usize, from: Cursor) -> String {
    let bytes = json.len() as u64;
    let marker = |cut: Vec<ElidedValue>| Elided {
        bytes,
        limit: limit as u64,
        from,
        cut,
    };
    let Some((event, data)) = split(json) else {
        // Not readable at all (never the case for events the host wrote): keep the position.
        return minimal(from, bytes, limit);
    };
    let data = match data {
        Ok(data) => data,
        Err(data_bytes) => return without_data(event, data_bytes, marker, budget, from, limit),
    };

    // First choice: cut the largest strings of `data` to a prefix.
    let mut leaves = Vec::new();
    collect_strings(&data, &mut Vec::new(), &mut leaves);
    leaves.sort_by_key(|leaf| std::cmp::Reverse(leaf.encoded));
    let total = with(&event, data.clone(), &marker(Vec::new())).len();
    let mut slack = 256usize;
    for _ in 0..4 {
        let Some((count, cap)) = plan_cuts(&leaves, total, budget, slack, 2, "data") else {
            break;
        };
        let (cut_data, cuts) = apply_cuts(&data, &leaves, count, cap, "data");
        let candidate = with(&event, cut_data, &marker(cuts));
        if candidate.len() <= budget {
            return candidate;
        }
        slack = slack * 4 + (candidate.len() - budget);
    }

    let data_bytes = encoded_len(&data) as u64;
    without_data(event, data_bytes, marker, budget, from, limit)
}

/// The event with `data` replaced by `null` (and an over-long `type` cut) when that fits.
fn without_data(
    mut event: Map<String, Value>,
    data_bytes: u64,
    marker: impl Fn(Vec<ElidedValue>) -> Elided,
    budget: usize,
    from: Cursor,
    limit: usize,
) -> String {
    let whole = vec![ElidedValue {
        path: "data".into(),
        bytes: data_bytes,
        kept: None,
    }];
    let candidate = with(&event, Value::Null, &marker(whole.clone()));
    if candidate.len() <= budget {
        return candidate;
    }
    // A `type` (or another top-level string) so long that the bare event does not fit.
    let mut cuts = whole;
    for (key, value) in event.iter_mut() {
        if let Value::String(text) = value
            && text.chars().count() > MAX_TYPE_CHARS
        {
            let original = encoded_len(&Value::String(text.clone())) as u64;
            *text = text.chars().take(MAX_TYPE_CHARS).collect();
            cuts.push(ElidedValue {
                path: key.clone(),
                bytes: original,
                kept: Some(MAX_TYPE_CHARS as u64),
            });
        }
    }
    let candidate = with(&event, Value::Null, &marker(cuts));
    if candidate.len() <= budget {
        return candidate;
    }
    minimal(from, marker(Vec::new()).bytes, limit)
}

/// The event's other fields, and its `data` (or the size of a `data` too deeply nested to read).
/// The host writes `data` last, so the first `,"data":` in the text is the key: inside a JSON
/// string every `"` is escaped.
fn split(json: &str) -> Option<(Map<String, Value>, Result<Value, u64>)> {
    if let Some(at) = json.find(",\"data\":")
        && json.ends_with('}')
        && let Ok(Value::Object(head)) =
            serde_json::from_str::<Value>(&format!("{}}}", &json[..at]))
    {
        let text = &json[at + 8..json.len() - 1];
        match serde_json::from_str(text) {
            Ok(data) => return Some((head, Ok(data))),
            // Only a `data` nested past the parser's limit is given up on; anything else means
            // `data` was not the last field after all.
            Err(err) if err.to_string().starts_with("recursion limit exceeded") => {
                return Some((head, Err(text.len() as u64)));
            }
            Err(_) => {}
        }
    }
    match serde_json::from_str::<Value>(json) {
        Ok(Value::Object(mut event)) => {
            let data = event.remove("data").unwrap_or(Value::Null);
            Some((event, Ok(data)))
        }
        _ => None,
    }
}

/// A reply's strings are never cut below this many bytes as JSON, so ids and cursors in it
/// stay whole.
const REPLY_MIN_KEPT: usize = 258;

/// A reply that fits the connection's frame bound: `frame` itself when it fits; else the same
/// reply with the largest strings of its `result` cut to a prefix and
/// `result.elided` = `{bytes, limit, cut}`; else, when that cannot be enough (a listing of
/// very many small entries), a PAYLOAD_TOO_LARGE error reply under the same id.
pub fn fit_reply(frame: String, bound: usize) -> String {
    if frame.len() <= bound {
        return frame;
    }
    let size = frame.len();
    let Ok(Value::Object(mut reply)) = serde_json::from_str::<Value>(&frame) else {
        return too_large(None, size, bound);
    };
    let id = reply
        .get("id")
        .and_then(|id| serde_json::from_value::<RequestId>(id.clone()).ok());
    if let Some(result @ Value::Object(_)) = reply.remove("result") {
        let mut leaves = Vec::new();
        collect_strings(&result, &mut Vec::new(), &mut leaves);
        leaves.sort_by_key(|leaf| std::cmp::Reverse(leaf.encoded));
        let mut slack = 256usize;
        for _ in 0..4 {
            let Some((count, cap)) =
                plan_cuts(&leaves, size, bound, slack, REPLY_MIN_KEPT, "result")
            else {
                break;
            };
            let (Value::Object(mut cut), cuts) = apply_cuts(&result, &leaves, count, cap, "result")
            else {
                break;
            };
            cut.insert(
                "elided".into(),
                json!({"bytes": size, "limit": bound, "cut": cuts}),
            );
            let candidate = json!({"id": id, "result": cut}).to_string();
            if candidate.len() <= bound {
                return candidate;
            }
            slack = slack * 4 + (candidate.len() - bound);
        }
    }
    too_large(id, size, bound)
}

fn too_large(id: Option<RequestId>, size: usize, bound: usize) -> String {
    let error = AppError::new(
        ErrorCode::PayloadTooLarge,
        format!(
            "the reply of {size} bytes does not fit the frame bound of {bound} bytes; \
             ask for a larger maxFrameBytes in hello"
        ),
    )
    .with_details(json!({"size": size, "limit": bound, "reason": "reply_too_large"}));
    crate::wire::encode(&ErrorReply { id, error })
}

/// An event reduced to its position: `seq`, `cursor`, no `data`, and the marker.
fn minimal(from: Cursor, bytes: u64, limit: usize) -> String {
    let seq = from.seq + 1;
    json!({
        "seq": seq,
        "cursor": Cursor::new(from.epoch, seq),
        "type": "",
        "at": 0,
        "data": null,
        "elided": Elided {
            bytes,
            limit: limit as u64,
            from,
            cut: vec![ElidedValue { path: "".into(), bytes, kept: None }],
        },
    })
    .to_string()
}

fn with(event: &Map<String, Value>, data: Value, elided: &Elided) -> String {
    let mut event = event.clone();
    event.insert("data".into(), data);
    event.insert("elided".into(), json!(elided));
    Value::Object(event).to_string()
}

fn encoded_len(value: &Value) -> usize {
    serde_json::to_string(value).map_or(0, |s| s.len())
}

/// One step from a value to a value inside it.
#[derive(Clone)]
enum Step {
    Key(String),
    Index(usize),
}

/// A string inside `data`: where it is and its size as JSON (quotes and escapes included).
struct Leaf {
    steps: Vec<Step>,
    encoded: usize,
}

impl Leaf {
    /// `data.message.content.0.text` (for `root` = `data`)
    fn path(&self, root: &str) -> String {
        let mut path = String::from(root);
        for step in &self.steps {
            path.push('.');
            match step {
                Step::Key(key) => path.push_str(key),
                Step::Index(i) => path.push_str(&i.to_string()),
            }
            if path.len() > MAX_PATH_CHARS * 4 {
                break;
            }
        }
        path.chars().take(MAX_PATH_CHARS).collect()
    }
}

fn collect_strings(value: &Value, steps: &mut Vec<Step>, out: &mut Vec<Leaf>) {
    match value {
        Value::String(text) => out.push(Leaf {
            steps: steps.clone(),
            encoded: text.chars().map(escaped_len).sum::<usize>() + 2,
        }),
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                steps.push(Step::Index(i));
                collect_strings(item, steps, out);
                steps.pop();
            }
        }
        Value::Object(map) => {
            for (key, item) in map {
                steps.push(Step::Key(key.clone()));
                collect_strings(item, steps, out);
                steps.pop();
            }
        }
        _ => {}
    }
}

/// How many of the largest strings to cut and the common cap (in encoded bytes) they are cut
/// to, so that the event loses enough bytes to fit `budget` with room for the marker. `None`
/// when cutting strings cannot be enough (or would take more than [`MAX_CUTS`] cuts).
fn plan_cuts(
    leaves: &[Leaf],
    total: usize,
    budget: usize,
    slack: usize,
    min_cap: usize,
    root: &str,
) -> Option<(usize, usize)> {
    // The marker: fixed fields plus one entry per cut (path and sizes).
    let fixed = 160;
    let per_cut = MAX_PATH_CHARS.min(64) + 64;
    let outcome = |cap: usize| -> Option<(usize, usize)> {
        let mut saved = 0;
        let mut count = 0;
        for leaf in leaves.iter().take_while(|l| l.encoded > cap) {
            saved += leaf.encoded - cap;
            count += 1;
            if count > MAX_CUTS {
                return None;
            }
        }
        let marker = fixed
            + leaves[..count]
                .iter()
                .map(|l| l.path(root).len() + per_cut)
                .sum::<usize>();
        (total + marker + slack <= budget + saved).then_some((count, cap))
    };
    // The largest cap that fits: a binary search over [min_cap, largest string].
    let largest = leaves.first()?.encoded;
    outcome(min_cap)?;
    let (mut lo, mut hi) = (min_cap, largest.max(min_cap));
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if outcome(mid).is_some() {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    outcome(lo)
}

/// Cuts each of the first `count` leaves to the longest prefix whose JSON form fits `cap`.
fn apply_cuts(
    data: &Value,
    leaves: &[Leaf],
    count: usize,
    cap: usize,
    root: &str,
) -> (Value, Vec<ElidedValue>) {
    let mut data = data.clone();
    let mut cuts = Vec::with_capacity(count);
    for leaf in &leaves[..count] {
        let Some(Value::String(text)) = at_mut(&mut data, &leaf.steps) else {
            continue;
        };
        let mut used = 2; // the quotes
        let mut end = 0;
        let mut kept = 0u64;
        for (at, ch) in text.char_indices() {
            let cost = escaped_len(ch);
            if used + cost > cap {
                break;
            }
            used += cost;
            end = at + ch.len_utf8();
            kept += 1;
        }
        text.truncate(end);
        cuts.push(ElidedValue {
            path: leaf.path(root),
            bytes: leaf.encoded as u64,
            kept: Some(kept),
        });
    }
    (data, cuts)
}

/// Bytes `ch` takes inside a JSON string as serde_json writes it.
fn escaped_len(ch: char) -> usize {
    match ch {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

fn at_mut<'a>(mut value: &'a mut Value, steps: &[Step]) -> Option<&'a mut Value> {
    for step in steps {
        value = match (value, step) {
            (Value::Object(map), Step::Key(key)) => map.get_mut(key)?,
            (Value::Array(items), Step::Index(i)) => items.get_mut(*i)?,
            _ => return None,
        };
    }
    Some(value)
}

#[cfg(test)]
mod tests {
    use super::*;
    use racp_proto::Epoch;
    use racp_proto::events::Event;

    /// An event as the host stores it (fields in the struct's order, `data` last).
    fn event(data: Value) -> String {
        serde_json::to_string(&Event {
            seq: 8,
            cursor: Cursor::new(Epoch(0xaa), 8),
            kind: "agent.message_update".into(),
            at: 5,
            turn_id: Some("turn_1".into()),
            data,
            elided: None,
        })
        .unwrap()
    }

    fn from() -> Cursor {
        Cursor::new(Epoch(0xaa), 7)
    }

    fn read(text: &str) -> Event {
        serde_json::from_str(text).expect("an event")
    }

    #[test]
    fn the_largest_strings_are_cut_to_a_prefix() {
        let original = event(json!({"assistantMessageEvent": {
            "type": "text_delta", "delta": "x".repeat(100_000)},
            "small": "keep me", "other": "y".repeat(20_000)}));
        let out = elide(&original, 4000, 4096, from());
        assert!(out.len() <= 4000, "{}", out.len());
        let event = read(&out);
        assert_eq!(event.seq, 8);
        assert_eq!(event.kind, "agent.message_update");
        assert_eq!(event.turn_id.as_deref(), Some("turn_1"));
        assert_eq!(event.data["small"], "keep me");
        assert_eq!(event.data["assistantMessageEvent"]["type"], "text_delta");
        let delta = event.data["assistantMessageEvent"]["delta"]
            .as_str()
            .unwrap();
        assert!(!delta.is_empty() && delta.chars().all(|c| c == 'x'));
        let elided = event.elided.unwrap();
        assert_eq!(elided.bytes, original.len() as u64);
        assert_eq!(elided.limit, 4096);
        assert_eq!(elided.from, from());
        let paths: Vec<_> = elided.cut.iter().map(|c| c.path.as_str()).collect();
        assert!(
            paths.contains(&"data.assistantMessageEvent.delta"),
            "{paths:?}"
        );
        let cut = &elided.cut[0];
        assert_eq!(cut.kept, Some(delta.chars().count() as u64));
        assert_eq!(cut.bytes, 100_002);
    }

    #[test]
    fn escapes_and_multibyte_characters_are_counted_as_sent() {
        let text: String = "\"é\n\u{1}😀".repeat(20_000);
        let original = event(json!({"text": text, "k.e.y": {"a": [1, "z".repeat(9000)]}}));
        let out = elide(&original, 5000, 8192, from());
        assert!(out.len() <= 5000, "{}", out.len());
        let event = read(&out);
        let kept = event.data["text"].as_str().unwrap();
        assert!(text.starts_with(kept));
        let elided = event.elided.unwrap();
        let by_path = |p: &str| elided.cut.iter().find(|c| c.path == p);
        assert_eq!(
            by_path("data.text").unwrap().kept,
            Some(kept.chars().count() as u64)
        );
        if let Some(cut) = by_path("data.k.e.y.a.1") {
            let z = event.data["k.e.y"]["a"][1].as_str().unwrap();
            assert_eq!(cut.kept, Some(z.len() as u64));
        }
    }

    #[test]
    fn many_small_values_replace_data_as_a_whole() {
        let items: Vec<Value> = (0..20_000)
            .map(|i| json!({"n": i, "s": "abcdefgh"}))
            .collect();
        let original = event(json!({"items": items}));
        let out = elide(&original, 4000, 4096, from());
        assert!(out.len() <= 4000);
        let event = read(&out);
        assert_eq!(event.data, Value::Null);
        let elided = event.elided.unwrap();
        assert_eq!(elided.cut.len(), 1);
        assert_eq!(elided.cut[0].path, "data");
        assert_eq!(elided.cut[0].kept, None);
    }

    #[test]
    fn an_enormous_type_is_cut_too() {
        let original = event(json!({})).replace(
            "agent.message_update",
            &format!("agent.{}", "t".repeat(50_000)),
        );
        let out = elide(&original, 3800, 4096, from());
        assert!(out.len() <= 3800);
        let event = read(&out);
        assert_eq!(event.kind.chars().count(), MAX_TYPE_CHARS);
        assert!(event.elided.unwrap().cut.iter().any(|c| c.path == "type"));
    }

    #[test]
    fn fields_in_any_order_are_read() {
        let original = json!({"seq": 8, "cursor": "00000000000000aa-8", "type": "agent.x",
            "at": 5, "data": {"s": "q".repeat(10_000)}})
        .to_string();
        assert!(
            !original.ends_with("}}"),
            "serde_json sorts keys: data is not last"
        );
        let event = read(&elide(&original, 3800, 4096, from()));
        assert_eq!(event.seq, 8);
        assert!(event.data["s"].as_str().unwrap().len() > 1000);
    }

    #[test]
    fn a_reply_over_the_bound_is_cut_or_refused() {
        let small = json!({"id": 3, "result": {"x": 1}}).to_string();
        assert_eq!(fit_reply(small.clone(), 4096), small);
        // Long prompts in a snapshot: cut, ids kept whole.
        let turns: Vec<Value> = (0..4)
            .map(|i| json!({"turnId": format!("turn_{i}"), "text": "p".repeat(30_000)}))
            .collect();
        let big = json!({"id": "a", "result": {"session": {"sessionId": "s".repeat(128)},
            "snapshot": {"turns": turns}, "cursor": "00000000000000aa-9"}})
        .to_string();
        let out: Value = serde_json::from_str(&fit_reply(big.clone(), 16_384)).unwrap();
        assert!(out.to_string().len() <= 16_384);
        assert_eq!(out["id"], "a");
        let result = &out["result"];
        assert_eq!(result["session"]["sessionId"], "s".repeat(128));
        assert_eq!(result["cursor"], "00000000000000aa-9");
        assert_eq!(result["elided"]["bytes"], big.len());
        assert_eq!(result["elided"]["cut"].as_array().unwrap().len(), 4);
        assert_eq!(
            result["elided"]["cut"][0]["path"],
            "result.snapshot.turns.0.text"
        );
        // Very many small entries cannot be cut: PAYLOAD_TOO_LARGE under the same id.
        let entries: Vec<Value> = (0..2000)
            .map(|i| json!({"name": format!("f{i}")}))
            .collect();
        let listing = json!({"id": 7, "result": {"entries": entries}}).to_string();
        let out: Value = serde_json::from_str(&fit_reply(listing, 4096)).unwrap();
        assert_eq!(out["id"], 7);
        assert_eq!(out["error"]["code"], "PAYLOAD_TOO_LARGE");
        assert_eq!(out["error"]["details"]["reason"], "reply_too_large");
    }

    #[test]
    fn data_too_deep_to_read_is_replaced_and_the_rest_kept() {
        let deep = format!(
            r#"{{"seq":8,"cursor":"00000000000000aa-8","type":"agent.x","at":5,"data":{}{}}}"#,
            "[".repeat(500),
            "]".repeat(500)
        );
        let out = elide(&deep, 3800, 4096, from());
        let event = read(&out);
        assert_eq!(event.seq, 8);
        assert_eq!(event.kind, "agent.x");
        assert_eq!(event.data, Value::Null);
        assert_eq!(event.elided.unwrap().cut[0].bytes, 1000);
    }
}
