//! One redaction for everything that carries provider or agent text, applied before it is
//! stored, logged or sent (docs/protocol.md §8.7, "Redaction"): every line the agent writes
//! (so the `agent.*` payloads and what the host reads from them, `errorMessage` among it), the
//! `stderrTail` of an agent that died, and every line of the host's log.
//!
//! Two kinds of secret go: credential shapes (`shapes.rs`), and the exact values of the keys
//! the host itself hands its agent (`credentials.json`), wherever they appear, also
//! JSON-escaped. A key replaced or deleted stays scrubbed for the host's lifetime (the longest
//! an agent started with it can run; [`MAX_RETIRED`] at most). A [`Redactor`] is cheap to
//! clone; every clone sees the same values. pi's HTML export is redacted inside its embedded
//! session data too ([`Redactor::html_export`]).

pub mod shapes;

use serde_json::value::RawValue;
use std::borrow::Cow;
use std::sync::{Arc, PoisonError, RwLock};

/// What a secret is replaced with.
pub const REDACTED: &str = "[redacted]";

/// Exact values shorter than this are not scrubbed: they would eat ordinary words.
pub const MIN_EXACT_LEN: usize = 8;

/// Replaced or deleted keys kept scrubbed at most; past it the oldest goes first. An agent
/// holds the key it started with until it stops, and an owner replacing a key hundreds of
/// times while one agent runs is not a case worth unbounded memory.
pub const MAX_RETIRED: usize = 256;

#[derive(Clone, Default)]
pub struct Redactor {
    secrets: Arc<RwLock<Secrets>>,
}

#[derive(Default)]
struct Secrets {
    /// The values now set, as handed to [`Redactor::set_secrets`].
    current: Vec<String>,
    /// Values once set and since replaced or deleted, oldest first.
    retired: std::collections::VecDeque<String>,
    /// Both, in the order they are scrubbed.
    exact: Arc<Vec<Exact>>,
}

/// One exact value, as written and as it reads inside a JSON string.
struct Exact {
    plain: String,
    escaped: Option<String>,
}

impl Exact {
    fn forms(&self) -> impl Iterator<Item = &str> {
        std::iter::once(self.plain.as_str()).chain(self.escaped.as_deref())
    }
}

impl std::fmt::Debug for Redactor {
    /// Never the values.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Redactor")
            .field("exact_values", &self.current().len())
            .finish()
    }
}

impl Redactor {
    /// Replaces the exact values to scrub (the keys the host hands its agent). A value no
    /// longer among them stays scrubbed: an agent started before the change still holds it.
    pub fn set_secrets(&self, values: Vec<String>) {
        let mut secrets = self.secrets.write().unwrap_or_else(PoisonError::into_inner);
        let gone: Vec<String> = secrets
            .current
            .iter()
            .filter(|old| !values.contains(old))
            .cloned()
            .collect();
        for old in gone {
            secrets.retired.retain(|kept| *kept != old);
            secrets.retired.push_back(old);
        }
        while secrets.retired.len() > MAX_RETIRED {
            secrets.retired.pop_front();
        }
        secrets.retired.retain(|kept| !values.contains(kept));
        secrets.current = values;
        secrets.exact = Arc::new(exact_forms(
            secrets.current.iter().chain(secrets.retired.iter()),
        ));
    }

    fn current(&self) -> Arc<Vec<Exact>> {
        self.secrets
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .exact
            .clone()
    }

    /// `text` with the exact values and every credential shape redacted; borrowed when
    /// nothing matched.
    pub fn text<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let out = self.exact_values(text);
        match shapes::redact(&out) {
            Cow::Owned(redacted) => Cow::Owned(redacted),
            Cow::Borrowed(_) => out,
        }
    }

    /// `text` with the exact values redacted (not the shapes); borrowed when none was there.
    fn exact_values<'a>(&self, text: &'a str) -> Cow<'a, str> {
        let mut out = Cow::Borrowed(text);
        for exact in self.current().iter() {
            for form in exact.forms() {
                if out.contains(form) {
                    out = Cow::Owned(out.replace(form, REDACTED));
                }
            }
        }
        out
    }

    /// Whether `bytes` may hold something to redact (a quick scan, no allocation).
    fn may_match(&self, bytes: &[u8], exact: &[Exact]) -> bool {
        shapes::matches(bytes)
            || memchr::memmem::find(bytes, b"\\u").is_some()
            || exact.iter().any(|e| {
                e.forms()
                    .any(|f| memchr::memmem::find(bytes, f.as_bytes()).is_some())
            })
    }

    /// A JSON text with every string in it redacted (object keys included). Only the strings
    /// that changed are re-encoded and spliced in: every other byte, numbers above all, stays
    /// as written (docs/protocol.md §1, "Numbers"). Borrowed when nothing matched. Input that is
    /// not JSON comes back with those of its quoted strings that decode redacted.
    pub fn json<'a>(&self, raw: &'a [u8]) -> Cow<'a, [u8]> {
        let exact = self.current();
        if !self.may_match(raw, &exact) {
            return Cow::Borrowed(raw);
        }
        let mut out: Option<Vec<u8>> = None;
        let mut copied = 0;
        // The name of the member whose value may come next, and where that name ended.
        let mut member: Option<(Cow<'_, str>, usize)> = None;
        for (start, end) in string_literals(raw) {
            let is_value = member.as_ref().is_some_and(|(_, after)| {
                let between = &raw[*after..start];
                between.iter().filter(|b| !b.is_ascii_whitespace()).eq(b":")
            });
            let name = member.take().filter(|_| is_value).map(|(name, _)| name);
            let follows_colon = raw[end..]
                .iter()
                .find(|b| !b.is_ascii_whitespace())
                .is_some_and(|&b| b == b':');
            let checked = self.may_match(&raw[start + 1..end - 1], &exact);
            if !checked && name.is_none() && !follows_colon {
                continue;
            }
            let Ok(text) = serde_json::from_slice::<Cow<'_, str>>(&raw[start..end]) else {
                continue;
            };
            let redacted = match name.as_deref().and_then(|n| shapes::member_value(n, &text)) {
                Some(value) => Some(value),
                None if checked => match self.text(&text) {
                    Cow::Owned(value) => Some(value),
                    Cow::Borrowed(_) => None,
                },
                None => None,
            };
            if follows_colon {
                member = Some((text, end));
            }
            let Some(redacted) = redacted else {
                continue;
            };
            let Ok(encoded) = serde_json::to_vec(&redacted) else {
                continue;
            };
            let buf = out.get_or_insert_with(|| Vec::with_capacity(raw.len()));
            buf.extend_from_slice(&raw[copied..start]);
            buf.extend_from_slice(&encoded);
            copied = end;
        }
        match out {
            Some(mut buf) => {
                buf.extend_from_slice(&raw[copied..]);
                Cow::Owned(buf)
            }
            None => Cow::Borrowed(raw),
        }
    }

    /// [`Redactor::json`] for a parsed payload: `None` when nothing in it changed.
    pub fn raw_value(&self, raw: &RawValue) -> Option<Box<RawValue>> {
        match self.json(raw.get().as_bytes()) {
            Cow::Borrowed(_) => None,
            // Strings were swapped for strings: still JSON.
            Cow::Owned(bytes) => String::from_utf8(bytes)
                .ok()
                .and_then(|text| RawValue::from_string(text).ok()),
        }
    }

    /// pi's HTML export with every secret gone: the embedded session data (base64-encoded
    /// JSON, `racp_proto::pi::export`) decoded, redacted as JSON and encoded again. The rest of
    /// the page is pi's template (styles, its script, vendored libraries), where the shapes
    /// would rewrite code (`SIDEBAR_WIDTH_STORAGE_KEY = '…'` reads as a secret's name and
    /// value): it loses the exact values only. A page without embedded data is redacted as
    /// text. `None` when the embedded data does not decode: what cannot be read cannot be
    /// checked.
    pub fn html_export<'a>(&self, html: &'a str) -> Option<Cow<'a, str>> {
        use base64::Engine;
        let engine = base64::engine::general_purpose::STANDARD;
        let Some(range) = racp_proto::pi::export::session_data(html) else {
            return Some(self.text(html));
        };
        let data = engine.decode(html[range.clone()].trim()).ok()?;
        let data = match self.json(&data) {
            Cow::Borrowed(_) => None,
            Cow::Owned(redacted) => Some(engine.encode(redacted)),
        };
        let head = self.exact_values(&html[..range.start]);
        let tail = self.exact_values(&html[range.end..]);
        if data.is_none() && matches!((&head, &tail), (Cow::Borrowed(_), Cow::Borrowed(_))) {
            return Some(Cow::Borrowed(html));
        }
        let data = data.as_deref().unwrap_or(&html[range]);
        Some(Cow::Owned([&*head, data, &*tail].concat()))
    }
}

/// The values to scrub, each as written and JSON-escaped, longest first.
fn exact_forms<'a>(values: impl Iterator<Item = &'a String>) -> Vec<Exact> {
    let mut exact: Vec<Exact> = values
        .filter(|v| v.len() >= MIN_EXACT_LEN)
        .map(|plain| {
            let escaped = serde_json::to_string(plain)
                .ok()
                .map(|s| s[1..s.len() - 1].to_string())
                .filter(|e| e != plain);
            Exact {
                plain: plain.clone(),
                escaped,
            }
        })
        .collect();
    // A value inside a longer one must not leave the longer one's rest behind.
    exact.sort_by(|a, b| (b.plain.len(), &a.plain).cmp(&(a.plain.len(), &b.plain)));
    exact.dedup_by(|a, b| a.plain == b.plain);
    exact
}

/// The byte spans of the string literals of a JSON text, quotes included. On text that is not
/// JSON the spans are whatever its quotes delimit; decoding them tells.
fn string_literals(raw: &[u8]) -> impl Iterator<Item = (usize, usize)> + '_ {
    let mut i = 0;
    std::iter::from_fn(move || {
        let start = i + raw.get(i..)?.iter().position(|&b| b == b'"')?;
        let mut j = start + 1;
        while j < raw.len() {
            match raw[j] {
                b'\\' => j += 2,
                b'"' => {
                    i = j + 1;
                    return Some((start, j + 1));
                }
                _ => j += 1,
            }
        }
        i = raw.len();
        None
    })
}

/// The host's log writer: each formatted line is redacted before it is written, so a warning
/// that quotes the agent's text (or anything else) cannot carry a credential into the log.
#[derive(Clone)]
pub struct LogWriter<M> {
    redactor: Redactor,
    inner: M,
}

impl<M> LogWriter<M> {
    pub fn new(redactor: Redactor, inner: M) -> Self {
        LogWriter { redactor, inner }
    }
}

/// One log event: buffered, redacted and written as a whole when dropped.
pub struct LogLine<W: std::io::Write> {
    redactor: Redactor,
    inner: W,
    buf: Vec<u8>,
}

impl<W: std::io::Write> std::io::Write for LogLine<W> {
    fn write(&mut self, bytes: &[u8]) -> std::io::Result<usize> {
        self.buf.extend_from_slice(bytes);
        Ok(bytes.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        if self.buf.is_empty() {
            return Ok(());
        }
        let text = String::from_utf8_lossy(&self.buf);
        let redacted = self.redactor.text(&text);
        self.inner.write_all(redacted.as_bytes())?;
        self.buf.clear();
        self.inner.flush()
    }
}

impl<W: std::io::Write> Drop for LogLine<W> {
    fn drop(&mut self) {
        let _ = std::io::Write::flush(self);
    }
}

impl<'a, M: tracing_subscriber::fmt::MakeWriter<'a>> tracing_subscriber::fmt::MakeWriter<'a>
    for LogWriter<M>
{
    type Writer = LogLine<M::Writer>;

    fn make_writer(&'a self) -> Self::Writer {
        LogLine {
            redactor: self.redactor.clone(),
            inner: self.inner.make_writer(),
            buf: Vec::new(),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn redactor() -> Redactor {
        let r = Redactor::default();
        r.set_secrets(vec![
            "zq9-Custom.Key_7f3b".into(),
            "short".into(),
            "with\"quote\\back".into(),
        ]);
        r
    }

    #[test]
    fn exact_values_go_wherever_they_appear() {
        let r = redactor();
        assert_eq!(r.text("k=zq9-Custom.Key_7f3b!"), "k=[redacted]!");
        assert_eq!(r.text("xzq9-Custom.Key_7f3bx"), "x[redacted]x");
        // Too short to scrub without eating words.
        assert_eq!(r.text("a short word"), "a short word");
        let raw = br#"{"e":"got with\"quote\\back and zq9-Custom.Key_7f3b"}"#;
        assert_eq!(
            &*r.json(raw),
            br#"{"e":"got [redacted] and [redacted]"}"#.as_slice()
        );
        assert!(!format!("{r:?}").contains("zq9"));
    }

    #[test]
    fn a_replaced_or_deleted_value_stays_scrubbed_up_to_the_bound() {
        let r = redactor();
        // Replaced: an agent started before the change still holds the old value.
        r.set_secrets(vec!["new-value-0000000".into()]);
        assert_eq!(r.text("zq9-Custom.Key_7f3b"), "[redacted]");
        assert_eq!(r.text("new-value-0000000"), "[redacted]");
        r.set_secrets(Vec::new());
        assert_eq!(
            r.text("new-value-0000000 zq9-Custom.Key_7f3b"),
            "[redacted] [redacted]"
        );
        // Set again, then replaced again: kept once.
        r.set_secrets(vec!["zq9-Custom.Key_7f3b".into()]);
        r.set_secrets(Vec::new());
        // Exactly MAX_RETIRED values retired: the oldest is still kept...
        let r = Redactor::default();
        let value = |i: usize| format!("retired-value-{i:05}");
        for i in 0..=MAX_RETIRED {
            r.set_secrets(vec![value(i)]);
        }
        assert_eq!(r.text(&value(0)), "[redacted]");
        assert_eq!(r.current().len(), MAX_RETIRED + 1);
        // ...and one more retired drops it.
        r.set_secrets(Vec::new());
        assert_eq!(r.text(&value(0)), value(0));
        assert_eq!(r.text(&value(1)), "[redacted]");
        assert_eq!(r.text(&value(MAX_RETIRED)), "[redacted]");
        assert_eq!(r.current().len(), MAX_RETIRED);
    }

    #[test]
    fn an_export_is_redacted_inside_its_embedded_data() {
        use base64::Engine;
        let engine = base64::engine::general_purpose::STANDARD;
        let r = redactor();
        let data = r#"{"entries":[{"text":"key zq9-Custom.Key_7f3b"},
            {"output":"ANTHROPIC_API_KEY=sk-ant-api03-abcdefghijklmnopqrstuvwx"}],"n":1.50}"#;
        let page = |data: &str| {
            format!(
                "<title>zq9-Custom.Key_7f3b</title><script id=\"session-data\" \
                 type=\"application/json\">{data}</script><script>let a = 1;</script>"
            )
        };
        let html =
            page(&engine.encode(data)).replace("let a = 1;", "const A_KEY = 'abc123def456';");
        let out = r.html_export(&html).unwrap();
        let range = racp_proto::pi::export::session_data(&out).unwrap();
        let decoded = String::from_utf8(engine.decode(&out[range]).unwrap()).unwrap();
        let parsed: serde_json::Value = serde_json::from_str(&decoded).unwrap();
        assert_eq!(parsed["entries"][0]["text"], "key [redacted]");
        assert_eq!(
            parsed["entries"][1]["output"],
            "ANTHROPIC_API_KEY=[redacted]"
        );
        assert!(decoded.contains("\"n\":1.50"), "{decoded}");
        assert!(out.starts_with("<title>[redacted]</title>"), "{out}");
        // pi's own script keeps its code, however secret-like.
        assert!(
            out.ends_with("<script>const A_KEY = 'abc123def456';</script>"),
            "{out}"
        );
        // Nothing to redact: the same text; data that does not decode is not handed out.
        let clean = page(&engine.encode("{\"a\":\"hello\"}")).replace("zq9-Custom.Key_7f3b", "x");
        assert!(matches!(r.html_export(&clean), Some(Cow::Borrowed(_))));
        assert!(r.html_export(&page("not base64!")).is_none());
        assert_eq!(
            r.html_export("<p>zq9-Custom.Key_7f3b</p>").unwrap(),
            "<p>[redacted]</p>"
        );
    }

    #[test]
    fn json_keeps_every_other_byte() {
        let r = redactor();
        let raw =
            br#"{"n":18446744073709551616.50,"f":1e308, "m":"Bearer abcdef0123456789","s":"ok\n"}"#;
        let out = r.json(raw);
        assert_eq!(
            std::str::from_utf8(&out).unwrap(),
            r#"{"n":18446744073709551616.50,"f":1e308, "m":"Bearer [redacted]","s":"ok\n"}"#
        );
        // Nothing to redact: the same bytes, not a copy.
        let clean = br#"{"type":"message_update","delta":"hello\nworld","n":1.0}"#;
        assert!(matches!(r.json(clean), Cow::Borrowed(_)));
        // Escapes are decoded before the shapes are looked for.
        let hidden = br#"{"m":"\u0073k-proj-abcdefghijklmnop"}"#;
        assert_eq!(&*r.json(hidden), br#"{"m":"sk-[redacted]"}"#.as_slice());
        // A JSON text in a string of JSON.
        let nested = br#"{"m":"400 {\"error\":{\"x-api-key\":\"v\"}}"}"#;
        assert_eq!(
            &*r.json(nested),
            br#"{"m":"400 {\"error\":{\"x-api-key\":\"[redacted]\"}}"}"#.as_slice()
        );
        // An object member whose name says secret, as JSON rather than as text.
        let member =
            br#"{"arguments":{"api_key" : "v\n1", "key":"sessionName", "key":"abc123def456"}}"#;
        assert_eq!(
            &*r.json(member),
            br#"{"arguments":{"api_key" : "[redacted]", "key":"sessionName", "key":"[redacted]"}}"#
                .as_slice()
        );
        let header = br#"{"headers":{"Authorization":"Bearer opaque"}}"#;
        assert_eq!(
            &*r.json(header),
            br#"{"headers":{"Authorization":"Bearer [redacted]"}}"#.as_slice()
        );
        let value = RawValue::from_string(String::from_utf8(nested.to_vec()).unwrap()).unwrap();
        assert!(r.raw_value(&value).is_some());
    }

    #[test]
    fn not_json_does_not_panic() {
        let r = redactor();
        for raw in [
            &b"\"unterminated sk-proj-abcdefghijklmnop"[..],
            b"\"\\",
            b"\"\\u12\"",
            b"\xff\"\xfe\"",
        ] {
            let _ = r.json(raw);
        }
    }

    #[test]
    fn the_log_writer_redacts_each_line() {
        use std::io::Write;
        #[derive(Clone, Default)]
        struct Sink(Arc<std::sync::Mutex<Vec<u8>>>);
        impl Write for Sink {
            fn write(&mut self, b: &[u8]) -> std::io::Result<usize> {
                self.0.lock().unwrap().extend_from_slice(b);
                Ok(b.len())
            }
            fn flush(&mut self) -> std::io::Result<()> {
                Ok(())
            }
        }
        let sink = Sink::default();
        let seen = sink.clone();
        let writer = LogWriter::new(redactor(), move || sink.clone());
        {
            use tracing_subscriber::fmt::MakeWriter;
            let mut line = writer.make_writer();
            line.write_all(b"WARN failed: x-api-key: ").unwrap();
            line.write_all(b"zq9-Custom.Key_7f3b\n").unwrap();
        }
        let text = String::from_utf8(seen.0.lock().unwrap().clone()).unwrap();
        assert_eq!(text, "WARN failed: x-api-key: [redacted]\n");
    }
}
