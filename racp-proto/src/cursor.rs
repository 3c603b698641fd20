//! Cursors: a position `(epoch, seq)` in one session's event log.
//!
//! On the wire a cursor is an opaque string. Clients only ever send back a cursor the host gave
//! them. The form is `<epoch as 16 hex digits>-<seq in decimal>`, e.g. `0f3a9c2e11d04b7a-1042`.
//! `seq` counts events from 1; a cursor with `seq` 0 is "before the first event".

use crate::error::{AppError, ErrorCode};
use schemars::JsonSchema;
use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::fmt;
use std::str::FromStr;

/// Identifies one incarnation of a session's event log. A new epoch means the history behind
/// older cursors is gone, so cursors from another epoch are CURSOR_EXPIRED.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Epoch(pub u64);

/// A position in a session's event log: every event with a greater `seq` comes after it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Cursor {
    pub epoch: Epoch,
    pub seq: u64,
}

impl Cursor {
    pub fn new(epoch: Epoch, seq: u64) -> Self {
        Cursor { epoch, seq }
    }

    /// Longest valid string form: 16 hex digits, a dash, and up to 20 decimal digits.
    pub const MAX_LEN: usize = 16 + 1 + 20;
}

impl fmt::Display for Cursor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:016x}-{}", self.epoch.0, self.seq)
    }
}

/// Why a cursor string could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("malformed cursor: expected <16 hex digits>-<decimal seq>")]
pub struct CursorParseError;

impl FromStr for Cursor {
    type Err = CursorParseError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (epoch, seq) = s.split_once('-').ok_or(CursorParseError)?;
        let hex_ok = epoch.len() == 16
            && epoch
                .bytes()
                .all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
        let dec_ok = !seq.is_empty() && seq.len() <= 20 && seq.bytes().all(|b| b.is_ascii_digit());
        if !hex_ok || !dec_ok {
            return Err(CursorParseError);
        }
        let epoch = u64::from_str_radix(epoch, 16).map_err(|_| CursorParseError)?;
        let seq = seq.parse::<u64>().map_err(|_| CursorParseError)?;
        Ok(Cursor::new(Epoch(epoch), seq))
    }
}

impl From<CursorParseError> for AppError {
    fn from(err: CursorParseError) -> Self {
        AppError::new(ErrorCode::InvalidParams, err.to_string())
            .with_details(serde_json::json!({"path": "params.cursor"}))
    }
}

impl Serialize for Cursor {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cursor {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

impl JsonSchema for Cursor {
    fn schema_name() -> std::borrow::Cow<'static, str> {
        "Cursor".into()
    }

    fn json_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
        schemars::json_schema!({
            "type": "string",
            "description": "An opaque position in a session's event log. Send back only cursors the host gave you.",
            "pattern": "^[0-9a-f]{16}-[0-9]{1,20}$",
            "maxLength": Cursor::MAX_LEN,
        })
    }
}

/// Why a cursor cannot be resumed: CURSOR_EXPIRED's `details.reason`, one list for a host and a
/// gateway (docs/protocol.md §8.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expired {
    /// The cursor names another incarnation of the log.
    OtherEpoch,
    /// The cursor is past the last event (a host never gave it out).
    AheadOfHead,
    /// The events after the cursor are no longer retained.
    OlderThanWindow,
    /// What was streaming at the cursor began before the retained events.
    StreamOlderThanWindow,
}

impl Expired {
    pub fn as_str(self) -> &'static str {
        match self {
            Expired::OtherEpoch => "other_epoch",
            Expired::AheadOfHead => "ahead_of_head",
            Expired::OlderThanWindow => "older_than_window",
            Expired::StreamOlderThanWindow => "stream_older_than_window",
        }
    }

    /// Where `cursor` stands against a log of `epoch` that can resume any cursor from `oldest`
    /// to `head`: `None` when it resumes.
    pub fn check(cursor: Cursor, epoch: Epoch, oldest: u64, head: u64) -> Option<Expired> {
        if cursor.epoch != epoch {
            Some(Expired::OtherEpoch)
        } else if cursor.seq > head {
            Some(Expired::AheadOfHead)
        } else if cursor.seq < oldest {
            Some(Expired::OlderThanWindow)
        } else {
            None
        }
    }

    /// CURSOR_EXPIRED for this reason, with the positions that do resume (`oldest` to `head`)
    /// and where to recover from.
    pub fn error(self, epoch: Epoch, oldest: u64, head: u64) -> AppError {
        let message = match self {
            Expired::StreamOlderThanWindow => {
                "what was streaming at this cursor began before the retained events: call \
                 session/get and continue from its snapshot"
            }
            _ => "the cursor cannot be resumed: call session/get and continue from its cursor",
        };
        AppError::new(ErrorCode::CursorExpired, message).with_details(serde_json::json!({
            "reason": self.as_str(),
            "oldest": Cursor::new(epoch, oldest),
            "head": Cursor::new(epoch, head),
            "snapshot": "session/get",
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cursor_resumes_from_oldest_to_head_of_its_epoch_only() {
        let (epoch, oldest, head) = (Epoch(7), 10, 20);
        let at = |e: u64, seq: u64| Expired::check(Cursor::new(Epoch(e), seq), epoch, oldest, head);
        assert_eq!(at(7, 10), None);
        assert_eq!(at(7, 20), None);
        assert_eq!(at(7, 9), Some(Expired::OlderThanWindow));
        assert_eq!(at(7, 21), Some(Expired::AheadOfHead));
        // Another epoch is named first, whatever its seq.
        assert_eq!(at(8, 15), Some(Expired::OtherEpoch));
        let error = Expired::OlderThanWindow.error(epoch, oldest, head);
        assert_eq!(error.code(), ErrorCode::CursorExpired);
        let details = error.details().unwrap();
        assert_eq!(details["reason"], "older_than_window");
        assert_eq!(details["oldest"], Cursor::new(epoch, oldest).to_string());
        assert_eq!(details["head"], Cursor::new(epoch, head).to_string());
        assert!(error.message().contains("session/get"));
        let stream = Expired::StreamOlderThanWindow.error(epoch, oldest, head);
        assert!(
            stream.message().contains("snapshot"),
            "{}",
            stream.message()
        );
    }

    #[test]
    fn round_trips_through_its_string_form() {
        for cursor in [
            Cursor::new(Epoch(0), 0),
            Cursor::new(Epoch(0x0f3a_9c2e_11d0_4b7a), 1042),
            Cursor::new(Epoch(u64::MAX), u64::MAX),
        ] {
            let text = cursor.to_string();
            assert!(text.len() <= Cursor::MAX_LEN);
            assert_eq!(text.parse::<Cursor>().unwrap(), cursor);
            let json = serde_json::to_string(&cursor).unwrap();
            assert_eq!(serde_json::from_str::<Cursor>(&json).unwrap(), cursor);
        }
    }

    #[test]
    fn rejects_malformed_strings() {
        for bad in [
            "",
            "-",
            "12-3",
            "0f3a9c2e11d04b7a-",
            "0f3a9c2e11d04b7a-x",
            "0f3a9c2e11d04b7a--1",
            "0f3a9c2e11d04b7g-1",
            "0f3a9c2e11d04b7a-99999999999999999999",
            "+f3a9c2e11d04b7a-1",
            "0f3a9c2e11d04b7a-1-2",
            "0F3A9C2E11D04B7A-1",
        ] {
            assert!(bad.parse::<Cursor>().is_err(), "{bad:?} parsed");
        }
    }
}
