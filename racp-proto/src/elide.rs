//! The size policy for events: an event whose JSON does not fit a connection's frame bound goes
//! out with its largest values cut, and an `elided` marker saying what was cut and where to read
//! the whole event (a connection with a larger bound, subscribed from `elided.from`).
//!
//! Cutting is rare (the default bound is 1 MiB; agent events are usually small), so it is done
//! per delivery, on a copy; the shared log keeps the event whole.
//!
//! Cutting works on the JSON text: the cut strings are replaced in place and every other byte of
//! `data` (numbers, key order, spacing) goes out as stored. Going through `serde_json::Value`
//! would round integers beyond 64 bits and respell other numbers (docs/protocol.md §1,
//! "Numbers"; §8.6).

use crate::events::{Elided, ElidedValue};
use crate::frame::{ErrorReply, RequestId};
use crate::{AppError, Cursor, ErrorCode};
use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value, json};
use std::collections::{BTreeMap, HashMap};

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
    let data_bytes = data.len() as u64;
    let Some(leaves) = largest_strings(data, "data") else {
        return without_data(event, data_bytes, marker, budget, from, limit);
    };

    // First choice: cut the largest strings of `data` to a prefix.
    let total = with(&event, data, &marker(Vec::new())).len();
    let mut slack = 256usize;
    for _ in 0..4 {
        let Some((count, cap)) = plan_cuts(&leaves, total, budget, slack, 2) else {
            break;
        };
        let (cut_data, cuts) = apply_cuts(data, &leaves, count, cap);
        let candidate = with(&event, &cut_data, &marker(cuts));
        if candidate.len() <= budget {
            return candidate;
        }
        slack = slack * 4 + (candidate.len() - budget);
    }
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
    let candidate = with(&event, "null", &marker(whole.clone()));
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
    let candidate = with(&event, "null", &marker(cuts));
    if candidate.len() <= budget {
        return candidate;
    }
    minimal(from, marker(Vec::new()).bytes, limit)
}

/// The event's other fields (the host's own: seq, cursor, type, at, turnId), and its `data` as
/// the stored text. When the event does not read as an object (a `data` nested deeper than the
/// parser allows), the text after the first `,"data":` is taken as `data`: the host writes
/// `data` last, and inside a JSON string every `"` is escaped.
fn split(json: &str) -> Option<(Map<String, Value>, &str)> {
    if let Ok(mut fields) = serde_json::from_str::<BTreeMap<String, &RawValue>>(json) {
        let data = fields.remove("data").map_or("null", |raw| raw.get());
        let mut head = Map::new();
        for (key, raw) in fields {
            if key != "elided" {
                head.insert(key, serde_json::from_str(raw.get()).ok()?);
            }
        }
        return Some((head, data));
    }
    let at = json.find(",\"data\":")?;
    if !json.ends_with('}') {
        return None;
    }
    let Ok(Value::Object(head)) = serde_json::from_str(&format!("{}}}", &json[..at])) else {
        return None;
    };
    Some((head, &json[at + 8..json.len() - 1]))
}

/// A reply's strings are never cut below this many bytes as JSON, so ids and cursors in it
/// stay whole.
const REPLY_MIN_KEPT: usize = 258;

/// The parts of a reply [`fit_reply`] reads; the result stays text.
#[derive(Deserialize)]
struct ReplyParts<'a> {
    #[serde(default)]
    id: Option<RequestId>,
    #[serde(default, borrow)]
    result: Option<&'a RawValue>,
}

/// A reply that fits the connection's frame bound: `frame` itself when it fits; else the same
/// reply with the largest strings of its `result` cut to a prefix and
/// `result.elided` = `{bytes, limit, cut}`; else, when that cannot be enough (a listing of
/// very many small entries), a PAYLOAD_TOO_LARGE error reply under the same id.
pub fn fit_reply(frame: String, bound: usize) -> String {
    if frame.len() <= bound {
        return frame;
    }
    let size = frame.len();
    let Ok(reply) = serde_json::from_str::<ReplyParts>(&frame) else {
        return too_large(None, size, bound);
    };
    let id = reply.id;
    let Some(result) = reply
        .result
        .map(RawValue::get)
        .filter(|r| r.starts_with('{'))
    else {
        return too_large(id, size, bound);
    };
    let Some(leaves) = largest_strings(result, "result") else {
        return too_large(id, size, bound);
    };
    let id_json = serde_json::to_string(&id).unwrap_or_else(|_| "null".into());
    let mut slack = 256usize;
    for _ in 0..4 {
        let Some((count, cap)) = plan_cuts(&leaves, size, bound, slack, REPLY_MIN_KEPT) else {
            break;
        };
        let (mut cut, cuts) = apply_cuts(result, &leaves, count, cap);
        // The result is an object whose last byte is `}`: the marker goes in before it.
        cut.pop();
        let marker = json!({"bytes": size, "limit": bound, "cut": cuts});
        let candidate = format!(r#"{{"id":{id_json},"result":{cut},"elided":{marker}}}}}"#);
        if candidate.len() <= bound {
            return candidate;
        }
        slack = slack * 4 + (candidate.len() - bound);
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
    // An error reply of a code, a message and numbers always encodes; the fallback keeps the
    // signature total.
    serde_json::to_string(&ErrorReply { id, error }).unwrap_or_else(|_| {
        r#"{"id":null,"error":{"code":"PAYLOAD_TOO_LARGE","message":"the reply does not fit the frame bound","retriable":false}}"#.to_string()
    })
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

/// The event: its host fields, then `data` spliced in as text, then the marker.
fn with(event: &Map<String, Value>, data: &str, elided: &Elided) -> String {
    let mut out = Value::Object(event.clone()).to_string();
    out.pop();
    if !event.is_empty() {
        out.push(',');
    }
    out.push_str("\"data\":");
    out.push_str(data);
    out.push_str(",\"elided\":");
    out.push_str(&json!(elided).to_string());
    out.push('}');
    out
}

fn encoded_len(value: &Value) -> usize {
    serde_json::to_string(value).map_or(0, |s| s.len())
}

/// A string value inside `data` (or a reply's `result`): where its JSON text is, and the path
/// reported when it is cut (filled in only for the largest strings, the only ones ever cut).
struct Leaf {
    start: usize,
    end: usize,
    path: String,
}

impl Leaf {
    /// Its size as JSON text, quotes and escapes included.
    fn encoded(&self) -> usize {
        self.end - self.start
    }
}

/// The string values of the JSON `text`, largest first, with paths under `root` for the first
/// [`MAX_CUTS`] + 1; `None` when `text` is not readable JSON.
fn largest_strings(text: &str, root: &str) -> Option<Vec<Leaf>> {
    let mut leaves = Vec::new();
    scan(text, None, &mut |start, end, _| {
        leaves.push(Leaf {
            start,
            end,
            path: String::new(),
        })
    })?;
    leaves.sort_by_key(|leaf| std::cmp::Reverse(leaf.encoded()));
    let named: HashMap<usize, usize> = leaves
        .iter()
        .take(MAX_CUTS + 1)
        .enumerate()
        .map(|(i, leaf)| (leaf.start, i))
        .collect();
    scan(text, Some(root), &mut |start, _, path| {
        if let Some(&i) = named.get(&start) {
            leaves[i].path = path.chars().take(MAX_PATH_CHARS).collect();
        }
    })?;
    Some(leaves)
}

/// Paths are built only this far (bytes); the reported path is cut shorter anyway.
const PATH_BUILT_BYTES: usize = MAX_PATH_CHARS * 4;

/// Appends `.step` to a path being built, unless it is already long enough to report.
fn push_step(path: &mut String, step: &str) {
    if path.len() < PATH_BUILT_BYTES {
        path.push('.');
        path.push_str(step);
    }
}

/// The end (exclusive) of the JSON string starting at `at` (its opening quote).
fn string_end(bytes: &[u8], at: usize) -> Option<usize> {
    let mut i = at + 1;
    loop {
        match bytes.get(i)? {
            b'"' => return Some(i + 1),
            b'\\' => i += 2,
            _ => i += 1,
        }
    }
}

fn skip_space(bytes: &[u8], i: &mut usize) {
    while bytes.get(*i).is_some_and(|b| b.is_ascii_whitespace()) {
        *i += 1;
    }
}

/// Walks the JSON `text` without building it, calling `on_string(start, end, path)` for every
/// string value (not key). Iterative, so no nesting depth is too deep. With `root`, `path` is
/// the value's dotted path under it (keys decoded, array items by index); without, it is empty
/// and keys are not decoded. Numbers and literals are skipped, not checked: the text is JSON
/// the host stored. `None` when the structure is not JSON.
fn scan(
    text: &str,
    root: Option<&str>,
    on_string: &mut dyn FnMut(usize, usize, &str),
) -> Option<()> {
    let mut walk = Walk {
        text,
        bytes: text.as_bytes(),
        named: root.is_some(),
        i: 0,
        stack: Vec::new(),
        path: root.unwrap_or_default().to_string(),
        path_at: Vec::new(),
    };
    loop {
        match walk.value(on_string)? {
            // Its first key is read: its first value starts next.
            Read::Opened => continue,
            Read::Ended => {
                if !walk.next_value()? {
                    return Some(());
                }
            }
        }
    }
}

/// A container [`scan`] is inside.
enum Open {
    Object,
    /// The index of the item being read.
    Array(usize),
}

/// What reading a value did.
enum Read {
    /// It opened a non-empty container.
    Opened,
    /// It was read whole.
    Ended,
}

/// [`scan`]'s place in the text: the position, the containers open around it and the path.
struct Walk<'t> {
    text: &'t str,
    bytes: &'t [u8],
    /// Paths are built (a root was given).
    named: bool,
    i: usize,
    stack: Vec<Open>,
    path: String,
    /// The path's length when each open container was entered.
    path_at: Vec<usize>,
}

impl Walk<'_> {
    /// Reads the value starting at the position: a string or a literal whole, a container up to
    /// its first value.
    fn value(&mut self, on_string: &mut dyn FnMut(usize, usize, &str)) -> Option<Read> {
        skip_space(self.bytes, &mut self.i);
        match *self.bytes.get(self.i)? {
            b'{' => self.open(Open::Object),
            b'[' => self.open(Open::Array(0)),
            b'"' => {
                let end = string_end(self.bytes, self.i)?;
                on_string(self.i, end, &self.path);
                self.i = end;
                Some(Read::Ended)
            }
            _ => {
                let start = self.i;
                while self
                    .bytes
                    .get(self.i)
                    .is_some_and(|b| !matches!(b, b',' | b']' | b'}') && !b.is_ascii_whitespace())
                {
                    self.i += 1;
                }
                (self.i != start).then_some(Read::Ended)
            }
        }
    }

    /// Enters the container whose opening byte is at the position; an empty one is read whole.
    fn open(&mut self, open: Open) -> Option<Read> {
        let close = match open {
            Open::Object => b'}',
            Open::Array(_) => b']',
        };
        self.i += 1;
        skip_space(self.bytes, &mut self.i);
        if self.bytes.get(self.i) == Some(&close) {
            self.i += 1;
            return Some(Read::Ended);
        }
        self.path_at.push(self.path.len());
        match open {
            Open::Object => self.key()?,
            Open::Array(_) if self.named => push_step(&mut self.path, "0"),
            Open::Array(_) => {}
        }
        self.stack.push(open);
        Some(Read::Opened)
    }

    /// After a value: closes containers until one continues with another value (`true`), or
    /// the text ends (`false`).
    fn next_value(&mut self) -> Option<bool> {
        loop {
            skip_space(self.bytes, &mut self.i);
            let Some(open) = self.stack.last_mut() else {
                return (self.i == self.bytes.len()).then_some(false);
            };
            let entered = self.path_at.last().copied().unwrap_or(0);
            match (open, *self.bytes.get(self.i)?) {
                (Open::Object, b',') => {
                    self.i += 1;
                    self.path.truncate(entered);
                    self.key()?;
                    return Some(true);
                }
                (Open::Array(index), b',') => {
                    self.i += 1;
                    *index += 1;
                    self.path.truncate(entered);
                    if self.named {
                        push_step(&mut self.path, &index.to_string());
                    }
                    return Some(true);
                }
                (Open::Object, b'}') | (Open::Array(_), b']') => {
                    self.i += 1;
                    self.stack.pop();
                    self.path_at.pop();
                    self.path.truncate(entered);
                }
                _ => return None,
            }
        }
    }

    /// Reads an object key at the position (after `{` or `,`) and the `:` after it.
    fn key(&mut self) -> Option<()> {
        let bytes = self.bytes;
        skip_space(bytes, &mut self.i);
        if bytes.get(self.i) != Some(&b'"') {
            return None;
        }
        let end = string_end(bytes, self.i)?;
        if self.named && self.path.len() < PATH_BUILT_BYTES {
            let name: String = serde_json::from_str(&self.text[self.i..end]).ok()?;
            push_step(&mut self.path, &name);
        }
        self.i = end;
        skip_space(bytes, &mut self.i);
        (bytes.get(self.i) == Some(&b':')).then(|| self.i += 1)
    }
}

/// How many of the largest strings to cut and the common cap (in encoded bytes) they are cut
/// to, so that the text loses enough bytes to fit `budget` with room for the marker. `None`
/// when cutting strings cannot be enough (or would take more than [`MAX_CUTS`] cuts).
fn plan_cuts(
    leaves: &[Leaf],
    total: usize,
    budget: usize,
    slack: usize,
    min_cap: usize,
) -> Option<(usize, usize)> {
    // The marker: fixed fields plus one entry per cut (path and sizes).
    let fixed = 160;
    let per_cut = MAX_PATH_CHARS.min(64) + 64;
    let outcome = |cap: usize| -> Option<(usize, usize)> {
        let mut saved = 0;
        let mut count = 0;
        for leaf in leaves.iter().take_while(|l| l.encoded() > cap) {
            saved += leaf.encoded() - cap;
            count += 1;
            if count > MAX_CUTS {
                return None;
            }
        }
        let marker = fixed
            + leaves[..count]
                .iter()
                .map(|l| l.path.len() + per_cut)
                .sum::<usize>();
        (total + marker + slack <= budget + saved).then_some((count, cap))
    };
    // The largest cap that fits: a binary search over [min_cap, largest string].
    let largest = leaves.first()?.encoded();
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

/// `text` with each of the first `count` leaves cut to the longest prefix whose JSON form fits
/// `cap`; every other byte is kept.
fn apply_cuts(text: &str, leaves: &[Leaf], count: usize, cap: usize) -> (String, Vec<ElidedValue>) {
    let mut chosen: Vec<&Leaf> = leaves[..count].iter().collect();
    chosen.sort_by_key(|leaf| leaf.start);
    let mut out = String::with_capacity(text.len());
    let mut cuts = Vec::with_capacity(count);
    let mut copied = 0;
    for leaf in chosen {
        let Ok(mut string) = serde_json::from_str::<String>(&text[leaf.start..leaf.end]) else {
            continue;
        };
        let mut used = 2; // the quotes
        let mut end = 0;
        let mut kept = 0u64;
        for (at, ch) in string.char_indices() {
            let cost = escaped_len(ch);
            if used + cost > cap {
                break;
            }
            used += cost;
            end = at + ch.len_utf8();
            kept += 1;
        }
        string.truncate(end);
        out.push_str(&text[copied..leaf.start]);
        out.push_str(&Value::String(string).to_string());
        copied = leaf.end;
        cuts.push(ElidedValue {
            path: leaf.path.clone(),
            bytes: leaf.encoded() as u64,
            kept: Some(kept),
        });
    }
    out.push_str(&text[copied..]);
    // Reported largest first, as they were chosen.
    cuts.sort_by_key(|cut| std::cmp::Reverse(cut.bytes));
    (out, cuts)
}

/// Bytes `ch` takes inside a JSON string as serde_json writes it.
fn escaped_len(ch: char) -> usize {
    match ch {
        '"' | '\\' | '\n' | '\r' | '\t' | '\u{8}' | '\u{c}' => 2,
        c if (c as u32) < 0x20 => 6,
        c => c.len_utf8(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Epoch;
    use crate::events::{Event, EventData};

    /// An event as the host stores it (fields in the struct's order, `data` last).
    fn event(data: Value) -> String {
        serde_json::to_string(&Event {
            seq: 8,
            cursor: Cursor::new(Epoch(0xaa), 8),
            kind: "agent.message_update".into(),
            at: 5,
            turn_id: Some("turn_1".into()),
            data: EventData::encode(&data).unwrap(),
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

    fn data(event: &Event) -> Value {
        event.data.to_value().expect("data a Value holds")
    }

    #[test]
    fn the_largest_strings_are_cut_to_a_prefix() {
        let original = event(json!({"assistantMessageEvent": {
            "type": "text_delta", "delta": "x".repeat(100_000)},
            "small": "keep me", "other": "y".repeat(20_000)}));
        let out = elide(&original, 4000, 4096, from());
        assert!(out.len() <= 4000, "{}", out.len());
        let event = read(&out);
        let d = data(&event);
        assert_eq!(event.seq, 8);
        assert_eq!(event.kind, "agent.message_update");
        assert_eq!(event.turn_id.as_deref(), Some("turn_1"));
        assert_eq!(d["small"], "keep me");
        assert_eq!(d["assistantMessageEvent"]["type"], "text_delta");
        let delta = d["assistantMessageEvent"]["delta"].as_str().unwrap();
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
        let d = data(&event);
        let kept = d["text"].as_str().unwrap();
        assert!(text.starts_with(kept));
        let elided = event.elided.unwrap();
        let by_path = |p: &str| elided.cut.iter().find(|c| c.path == p);
        assert_eq!(
            by_path("data.text").unwrap().kept,
            Some(kept.chars().count() as u64)
        );
        if let Some(cut) = by_path("data.k.e.y.a.1") {
            let z = d["k.e.y"]["a"][1].as_str().unwrap();
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
        assert_eq!(data(&event), Value::Null);
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
        let d = data(&event);
        assert_eq!(event.seq, 8);
        assert!(d["s"].as_str().unwrap().len() > 1000);
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
        assert_eq!(data(&event), Value::Null);
        assert_eq!(event.elided.unwrap().cut[0].bytes, 1000);
    }

    /// Numbers that `serde_json::Value` would round or respell, and keys out of sorted order.
    const NUMBERS: &str = r#""z":18446744073709551616,"n":[9007199254740993,1e308,5e-324,-0.0,1E5,0.10],"big":176452877777777777777777777777777777777777777777777777777733333333333333333333333333333333333333333333333333333333333333777777777777777777777777777777777777000041"#;

    #[test]
    fn cutting_strings_keeps_every_other_byte_of_data() {
        let original = format!(
            r#"{{"seq":8,"cursor":"00000000000000aa-8","type":"agent.x","at":5,"data":{{{NUMBERS}, "s" : "{}", "t":"\u0041"}}}}"#,
            "q".repeat(10_000)
        );
        let out = elide(&original, 3800, 4096, from());
        assert!(out.len() <= 3800, "{}", out.len());
        let event = read(&out);
        let data = event.data.get();
        assert!(
            data.starts_with(&format!("{{{NUMBERS}, \"s\" : \"qqq")),
            "{data}"
        );
        assert!(data.ends_with(r#"", "t":"\u0041"}"#), "{data}");
        assert_eq!(event.elided.unwrap().cut[0].path, "data.s");
    }

    #[test]
    fn replacing_data_keeps_the_host_fields() {
        let items = vec![r#"{"n":18446744073709551616,"s":"abcdefgh"}"#; 2000].join(",");
        let original = format!(
            r#"{{"seq":8,"cursor":"00000000000000aa-8","type":"agent.x","at":5,"turnId":"t","data":[{items}]}}"#
        );
        let event = read(&elide(&original, 4000, 4096, from()));
        assert_eq!(event.data.get(), "null");
        assert_eq!((event.seq, event.at), (8, 5));
        assert_eq!(event.turn_id.as_deref(), Some("t"));
        let elided = event.elided.unwrap();
        assert_eq!(elided.cut[0].bytes, items.len() as u64 + 2);
    }

    #[test]
    fn a_cut_reply_keeps_its_numbers() {
        let big = format!(
            r#"{{"id":4,"result":{{{NUMBERS},"text":"{}"}}}}"#,
            "p".repeat(20_000)
        );
        let out = fit_reply(big, 4096);
        assert!(out.len() <= 4096);
        assert!(
            out.starts_with(&format!(r#"{{"id":4,"result":{{{NUMBERS},"text":"ppp"#)),
            "{out}"
        );
        let reply: Value = serde_json::from_str(&out).unwrap();
        assert_eq!(reply["result"]["elided"]["cut"][0]["path"], "result.text");
    }

    #[test]
    fn paths_follow_nesting_escaped_keys_and_array_items() {
        let text = r#"{"a":[1,{"b\u0041":["x","yy"]}],"c":"zzz","d":{}}"#;
        let leaves = largest_strings(text, "data").unwrap();
        let paths: Vec<_> = leaves.iter().map(|l| l.path.as_str()).collect();
        assert_eq!(paths, ["data.c", "data.a.1.bA.1", "data.a.1.bA.0"]);
        for bad in ["{\"a\":", "[1,]x", "{\"a\" 1}", "\"open"] {
            assert!(largest_strings(bad, "data").is_none(), "{bad}");
        }
        let deep = format!("{}\"s\"{}", "[".repeat(100_000), "]".repeat(100_000));
        let leaves = largest_strings(&deep, "data").unwrap();
        assert_eq!(leaves[0].path.chars().count(), MAX_PATH_CHARS);
    }
}
