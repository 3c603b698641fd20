//! pi's RPC mode on the wire: LF-framed lines, read with a bound on the line length, and turned
//! into [`AgentOutput`] values. What a line means is read by `racp_proto::pi`, the one reader
//! of pi's format; this module frames the lines, redacts them before anything reads them, and
//! compacts stream updates.

use super::{AgentEvent, AgentOutput};
use crate::redact::Redactor;
use racp_proto::pi::compact::Compactor;
use racp_proto::pi::line::head_names_agent_end;
use racp_proto::pi::{Kind, Line as PiLine, Response, RunEnd, RunSignal, UiRequest};
use serde_json::value::RawValue;
use serde_json::{Map, json};
use std::borrow::Cow;
use tokio::io::{AsyncBufRead, AsyncBufReadExt};

/// How much of a line that is not valid agent output is kept in the `invalid_output` event.
const INVALID_LINE_PREFIX: usize = 1024;

/// One record read from the agent's stdout.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Line {
    /// A complete line without its `\n` (and without a trailing `\r`).
    Text(Vec<u8>),
    /// A line longer than the bound; its bytes were dropped as they came, except its first
    /// [`HEAD_BYTES`] (enough to see its `type`).
    TooLong { bytes: usize, head: Vec<u8> },
}

/// How much of an over-long line is kept.
pub(super) const HEAD_BYTES: usize = 64;

fn head_of(first: &[u8], then: &[u8]) -> Vec<u8> {
    first.iter().chain(then).take(HEAD_BYTES).copied().collect()
}

/// Reads LF-terminated lines of at most `max` bytes. Only `\n` ends a record (pi's framing: JSON
/// strings may hold U+2028/U+2029). Cancel-safe: a partial line is kept in `self`, so the future
/// of [`LineReader::next_line`] may be dropped in a `select!` without losing data.
pub(super) struct LineReader<R> {
    inner: R,
    buf: Vec<u8>,
    /// Bytes seen of an over-long line that is being skipped, and its head.
    discarding: Option<(usize, Vec<u8>)>,
    max: usize,
}

impl<R: AsyncBufRead + Unpin> LineReader<R> {
    pub(super) fn new(inner: R, max: usize) -> Self {
        LineReader {
            inner,
            buf: Vec::new(),
            discarding: None,
            max,
        }
    }

    /// The next record, or `None` at end of stream.
    pub(super) async fn next_line(&mut self) -> std::io::Result<Option<Line>> {
        loop {
            let available = self.inner.fill_buf().await?;
            if available.is_empty() {
                if let Some((bytes, head)) = self.discarding.take() {
                    return Ok(Some(Line::TooLong { bytes, head }));
                }
                if self.buf.is_empty() {
                    return Ok(None);
                }
                return Ok(Some(self.finish_text()));
            }
            // memchr: a byte-wise search over pi's kilobyte lines was a tenth of the host's time.
            match memchr::memchr(b'\n', available) {
                Some(end) => {
                    let line = if let Some((seen, head)) = self.discarding.take() {
                        Line::TooLong {
                            bytes: seen + end,
                            head,
                        }
                    } else if self.buf.len() + end > self.max {
                        let bytes = self.buf.len() + end;
                        let head = head_of(&self.buf, &available[..end]);
                        self.buf = Vec::new();
                        Line::TooLong { bytes, head }
                    } else {
                        self.buf.extend_from_slice(&available[..end]);
                        self.finish_text()
                    };
                    self.inner.consume(end + 1);
                    return Ok(Some(line));
                }
                None => {
                    let n = available.len();
                    if let Some((seen, _)) = self.discarding.as_mut() {
                        *seen += n;
                    } else if self.buf.len() + n > self.max {
                        let head = head_of(&self.buf, available);
                        self.discarding = Some((self.buf.len() + n, head));
                        self.buf = Vec::new();
                    } else {
                        self.buf.extend_from_slice(available);
                    }
                    self.inner.consume(n);
                }
            }
        }
    }

    fn finish_text(&mut self) -> Line {
        let mut line = std::mem::take(&mut self.buf);
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        Line::Text(line)
    }
}

/// A command response, as handed to the caller that waits for it.
#[derive(Debug, Clone)]
pub(super) struct Reply {
    pub response: Response,
    /// The line as pi wrote it, relayed when nobody waits for the reply.
    pub raw: Box<RawValue>,
    /// The reply's line was this many bytes, over the line bound: nothing of it was read.
    pub too_long: Option<usize>,
}

/// What one stdout line means.
#[derive(Debug)]
pub(super) enum Parsed {
    /// A `response` carrying an `id` (maybe one a caller waits for).
    Reply {
        id: String,
        reply: Reply,
    },
    Output(AgentOutput),
}

/// An `invalid_output` event describing a line that is not agent output. A line whose head
/// names `agent_end` (pi repeats every message of the run there, so it can be too long to
/// read) still ends the run.
pub(super) fn invalid_output(error: &str, line: Option<&[u8]>, bytes: usize) -> AgentOutput {
    let mut payload = Map::new();
    payload.insert("type".into(), json!(Kind::InvalidOutput.as_str()));
    payload.insert("error".into(), json!(error));
    payload.insert("bytes".into(), json!(bytes));
    let mut ends_run = false;
    if let Some(line) = line {
        let prefix = &line[..line.len().min(INVALID_LINE_PREFIX)];
        let text = String::from_utf8_lossy(prefix);
        ends_run = head_names_agent_end(&text);
        payload.insert("line".into(), json!(text));
    }
    AgentOutput::Event(AgentEvent {
        kind: Kind::InvalidOutput,
        // A map of strings and a number always encodes; the fallback is never used.
        payload: serde_json::value::to_raw_value(&payload).unwrap_or_else(|_| raw_null()),
        run_end: ends_run.then(RunEnd::default),
        signal: None,
    })
}

pub(super) fn raw_null() -> Box<RawValue> {
    RawValue::from_string("null".into()).unwrap_or_else(|_| unreachable_raw())
}

#[allow(clippy::unreachable)]
fn unreachable_raw() -> Box<RawValue> {
    unreachable!("`null` is JSON")
}

/// Reads the agent's lines in order: each is read once by `racp_proto::pi`, stream updates are
/// compacted (the compactor remembers what was sent), and everything is redacted before the
/// host reads it (docs/protocol.md §8.8).
pub(super) struct Reader {
    compactor: Compactor,
    redactor: Redactor,
}

impl Reader {
    pub(super) fn new(redactor: Redactor) -> Reader {
        Reader {
            compactor: Compactor::default(),
            redactor,
        }
    }

    /// What a complete stdout line means; `None` for a blank line.
    pub(super) fn read(&mut self, bytes: &[u8]) -> Option<Parsed> {
        if bytes.iter().all(u8::is_ascii_whitespace) {
            return None;
        }
        let parsed = std::str::from_utf8(bytes)
            .map_err(|err| format!("not JSON: {err}"))
            .and_then(|text| self.read_text(text));
        Some(parsed.unwrap_or_else(|error| Parsed::Output(self.invalid(&error, bytes))))
    }

    /// An `invalid_output` event for a line, its quote redacted as the string it now is (the
    /// redaction of a line's JSON strings may have missed part of a line that is not JSON).
    pub(super) fn invalid(&self, error: &str, line: &[u8]) -> AgentOutput {
        self.invalid_of(error, line, line.len())
    }

    /// [`Reader::invalid`] for a line of `bytes` of which `head` was kept.
    pub(super) fn invalid_of(&self, error: &str, head: &[u8], bytes: usize) -> AgentOutput {
        let mut output = invalid_output(error, Some(head), bytes);
        if let AgentOutput::Event(event) = &mut output
            && let Some(redacted) = self.redactor.raw_value(&event.payload)
        {
            event.payload = redacted;
        }
        output
    }

    fn read_text(&mut self, text: &str) -> Result<Parsed, String> {
        let line = PiLine::read(text).map_err(|err| err.to_string())?;
        if line.kind.is_stream_update() {
            // pi's stream updates repeat the whole message (or tool output) so far and nothing
            // is read from them: they are redacted once compacted, when only what is new is left.
            let payload = match self.compactor.compact(&line) {
                Some(compact) => compact,
                None => raw_line(text)?,
            };
            let payload = self.redactor.raw_value(&payload).unwrap_or(payload);
            return Ok(Parsed::Output(event(line.kind, payload, None, None)));
        }
        // Any other line is redacted before anything reads it: what the host relays, stores,
        // logs or classifies (pi's `errorMessage` among it) is the redacted line.
        match self.redactor.json(text.as_bytes()) {
            Cow::Borrowed(_) => self.classify(line, text),
            Cow::Owned(redacted) => {
                let redacted = String::from_utf8(redacted).map_err(|err| err.to_string())?;
                let line = PiLine::read(&redacted).map_err(|err| err.to_string())?;
                self.classify(line, &redacted)
            }
        }
    }

    /// A line that is not a stream update: a reply, a dialog or notice, or an event.
    fn classify(&mut self, line: PiLine<'_>, text: &str) -> Result<Parsed, String> {
        if let Some(response) = Response::of(&line) {
            let raw = raw_line(text)?;
            return Ok(match response.id.clone() {
                Some(id) => Parsed::Reply {
                    id,
                    reply: Reply {
                        response,
                        raw,
                        too_long: None,
                    },
                },
                None => Parsed::Output(AgentOutput::Response {
                    response,
                    payload: raw,
                }),
            });
        }
        if let Some(request) = UiRequest::of(&line) {
            return Ok(Parsed::Output(match request {
                UiRequest::Dialog(dialog) => AgentOutput::UiRequest(dialog),
                UiRequest::Notice { method } => AgentOutput::UiNotice {
                    method,
                    payload: raw_line(text)?,
                },
                UiRequest::Unanswerable => {
                    self.invalid("a dialog request without an id", text.as_bytes())
                }
            }));
        }
        let run_end = RunEnd::of(&line);
        let signal = RunSignal::of(&line);
        let payload = match self.compactor.compact(&line) {
            Some(compact) => compact,
            None => raw_line(text)?,
        };
        Ok(Parsed::Output(event(line.kind, payload, run_end, signal)))
    }
}

fn event(
    kind: Kind,
    payload: Box<RawValue>,
    run_end: Option<RunEnd>,
    signal: Option<RunSignal>,
) -> AgentOutput {
    AgentOutput::Event(AgentEvent {
        kind,
        payload,
        run_end,
        signal,
    })
}

/// The line as the payload relayed byte for byte.
fn raw_line(text: &str) -> Result<Box<RawValue>, String> {
    RawValue::from_string(text.to_owned()).map_err(|err| format!("not JSON: {err}"))
}

/// Classifies one line as a fresh reader would (tests).
#[cfg(test)]
pub(super) fn parse_line(line: &[u8]) -> Option<Parsed> {
    Reader::new(Redactor::default()).read(line)
}
