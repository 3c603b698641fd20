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
            Failure::Local(message)
            | Failure::PairAgain(message)
            | Failure::Usage(message)
            | Failure::Checks(message) => json!({"message": message}),
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

/// Now, in ms since the Unix epoch.
pub fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A header and rows as aligned columns, two spaces apart, each line without trailing blanks
/// (every table pi-remote prints: `hosts`, `models`, `credentials list`).
pub fn aligned<const N: usize>(header: [&str; N], rows: &[[String; N]]) -> Vec<String> {
    let header = header.map(String::from);
    let mut widths = [0usize; N];
    for row in std::iter::once(&header).chain(rows) {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    std::iter::once(&header)
        .chain(rows)
        .map(|row| {
            let cells: Vec<String> = row
                .iter()
                .zip(widths)
                .map(|(cell, width)| format!("{cell:<width$}"))
                .collect();
            cells.join("  ").trim_end().to_string()
        })
        .collect()
}
