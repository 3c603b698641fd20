//! Where `pi-remote`'s output goes: data on stdout, notes and errors on stderr.

use crate::remote::Failure;
use crate::remote::view::View;
use racp_proto::events::Event;
use racp_proto::validate::printable;
use serde_json::{Value, json};
use std::io::Write;

/// Where output goes: data on stdout, notes on stderr. What a person reads passes through
/// `printable`: names, paths and agent text come from elsewhere and must not drive the terminal
/// (JSON output is escaped by the encoder).
pub struct Out {
    /// `--json`: stdout carries JSON only.
    pub json: bool,
}

impl Out {
    pub fn new(json: bool) -> Out {
        Out { json }
    }

    pub fn text(&self, text: &str) {
        if text.is_empty() {
            return;
        }
        let text = printable(text, true);
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(text.as_bytes());
        let _ = stdout.flush();
    }

    pub fn line(&self, text: &str) {
        self.text(&format!("{text}\n"));
    }

    pub fn json_value<T: serde::Serialize>(&self, value: &T) {
        match serde_json::to_string(value) {
            Ok(text) => self.line(&text),
            Err(e) => eprintln!("pi-remote: cannot encode output: {e}"),
        }
    }

    /// One event: a JSON line, or the human view.
    pub fn event(&self, view: &mut View, event: &Event) {
        if self.json {
            self.json_value(event);
        } else {
            self.text(&view.render(event));
        }
    }

    /// A note for a person, on stderr (also in JSON mode, where stdout carries only data).
    pub fn note(&self, text: &str) {
        eprintln!("{}", printable(text, true));
    }

    /// Why the command failed, on stderr: `{"error", "exitCode"}` with `--json`, else the line
    /// [`Failure::describe`] makes.
    pub fn failure(&self, failure: &Failure) {
        if !self.json {
            self.note(&failure.describe());
            return;
        }
        let error = match failure {
            Failure::App(error) => serde_json::to_value(error).unwrap_or(Value::Null),
            Failure::Local(message) | Failure::PairAgain(message) | Failure::Usage(message) => {
                json!({"message": message})
            }
            Failure::Turn(outcome) => json!({"message": format!("the turn ended {outcome}")}),
        };
        eprintln!(
            "{}",
            json!({"error": error, "exitCode": failure.exit() as u8})
        );
    }
}

/// A unit enum's wire name (`"idle"`, `"pending"`, ...), or `""`.
pub fn enum_name<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// A moment for a person, relative to `now_ms` with its UTC time (and date when it is not
/// today's): `in 10 min (16:40 UTC)`, `3 h ago (2026-12-01 13:02 UTC)`; pi-host's style.
pub fn moment(at_ms: u64, now_ms: u64) -> String {
    let relative = if at_ms >= now_ms {
        format!("in {}", span(at_ms - now_ms))
    } else {
        format!("{} ago", span(now_ms - at_ms))
    };
    let (date, time) = utc(at_ms);
    if utc(now_ms).0 == date {
        format!("{relative} ({time} UTC)")
    } else {
        format!("{relative} ({date} {time} UTC)")
    }
}

/// Now, in ms since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A duration rounded to the nearest of its largest unit: "40 s", "10 min", "3 h", "2 days".
fn span(ms: u64) -> String {
    let s = (ms + 500) / 1000;
    let nearest = |unit: u64| (s + unit / 2) / unit;
    match s {
        0..60 => format!("{s} s"),
        60..3570 => format!("{} min", nearest(60)),
        3570..84_600 => format!("{} h", nearest(3600)),
        _ => match nearest(86_400) {
            1 => "1 day".into(),
            days => format!("{days} days"),
        },
    }
}

/// The UTC date (`2026-12-02`) and time of day (`16:40`) of a moment.
fn utc(ms: u64) -> (String, String) {
    let secs = i64::try_from(ms / 1000).unwrap_or(i64::MAX);
    match time::OffsetDateTime::from_unix_timestamp(secs) {
        Ok(t) => (
            format!("{:04}-{:02}-{:02}", t.year(), u8::from(t.month()), t.day()),
            format!("{:02}:{:02}", t.hour(), t.minute()),
        ),
        Err(_) => ("?".into(), "?".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::moment;

    #[test]
    fn moments_read_as_relative_and_utc() {
        // 2026-12-02 16:30:00 UTC.
        let now = 1_796_229_000_000;
        assert_eq!(moment(now + 600_000, now), "in 10 min (16:40 UTC)");
        assert_eq!(moment(now - 180_000, now), "3 min ago (16:27 UTC)");
        assert_eq!(
            moment(now - 2 * 86_400_000, now),
            "2 days ago (2026-11-30 16:30 UTC)"
        );
    }
}
