//! One session's retained event log in memory (a host's log of its session; a gateway
//! replica's window of a host's stream): committed events only, pre-serialized, bounded by
//! count, bytes and age. Cursor checks are arithmetic on `seq`, never a lookup: a cursor is
//! valid exactly when `oldest_cursor <= seq <= head` in the same epoch.

use racp_proto::{AppError, Cursor, Epoch, Expired};
use std::collections::VecDeque;
use std::sync::Arc;

/// A committed event, serialized once and shared by every subscriber.
#[derive(Debug)]
pub struct LoggedEvent {
    pub seq: u64,
    pub at: u64,
    /// The event object as JSON text, exactly as it goes on the wire.
    pub json: Box<str>,
}

/// Bounds on what a session keeps for replay.
#[derive(Debug, Clone, Copy)]
pub struct Retention {
    pub max_events: usize,
    pub max_bytes: usize,
    pub max_age_ms: u64,
}

impl Default for Retention {
    fn default() -> Self {
        Retention {
            max_events: 200_000,
            max_bytes: 64 << 20,
            max_age_ms: 24 * 60 * 60 * 1000,
        }
    }
}

#[derive(Debug)]
pub struct EventLog {
    epoch: Epoch,
    events: VecDeque<Arc<LoggedEvent>>,
    bytes: usize,
    /// Seq of the last committed event (0 before the first).
    head: u64,
    retention: Retention,
}

impl EventLog {
    pub fn new(epoch: Epoch, head: u64, retention: Retention) -> Self {
        EventLog {
            epoch,
            events: VecDeque::new(),
            bytes: 0,
            head,
            retention,
        }
    }

    pub fn epoch(&self) -> Epoch {
        self.epoch
    }

    pub fn head(&self) -> u64 {
        self.head
    }

    pub fn head_cursor(&self) -> Cursor {
        Cursor::new(self.epoch, self.head)
    }

    /// The oldest cursor that can still be resumed: just before the first retained event.
    pub fn oldest_seq(&self) -> u64 {
        self.events.front().map_or(self.head, |e| e.seq - 1)
    }

    /// Appends committed events (in seq order, continuing the log) and applies retention.
    pub fn push(&mut self, event: Arc<LoggedEvent>, now: u64) {
        debug_assert_eq!(event.seq, self.head + 1, "events arrive in seq order");
        self.head = event.seq;
        self.bytes += event.json.len();
        self.events.push_back(event);
        self.prune(now);
    }

    pub fn prune(&mut self, now: u64) {
        let r = self.retention;
        while let Some(front) = self.events.front() {
            let too_many = self.events.len() > r.max_events;
            let too_big = self.bytes > r.max_bytes;
            let too_old = now.saturating_sub(front.at) > r.max_age_ms;
            // The newest event always stays, so the head can be described.
            if !(too_many || too_big || too_old) || self.events.len() == 1 {
                break;
            }
            self.bytes -= front.json.len();
            self.events.pop_front();
        }
    }

    /// The retained events up to and including `seq`, newest first.
    pub fn back_from(&self, seq: u64) -> impl Iterator<Item = &Arc<LoggedEvent>> {
        self.events.iter().rev().skip_while(move |e| e.seq > seq)
    }

    /// Checks that replay can start after `cursor`; CURSOR_EXPIRED otherwise.
    pub fn check_cursor(&self, cursor: Cursor) -> Result<(), AppError> {
        match Expired::check(cursor, self.epoch, self.oldest_seq(), self.head) {
            None => Ok(()),
            Some(reason) => Err(reason.error(self.epoch, self.oldest_seq(), self.head)),
        }
    }

    /// Up to `max_count` events after `after_seq` whose JSON fits in `max_bytes` (at least one
    /// event when any is available). `None` when `after_seq` has left the retained window.
    pub fn after(
        &self,
        after_seq: u64,
        max_count: usize,
        max_bytes: usize,
    ) -> Option<Vec<Arc<LoggedEvent>>> {
        if after_seq < self.oldest_seq() {
            return None;
        }
        let Some(first) = self.events.front() else {
            return Some(Vec::new());
        };
        let start = usize::try_from(after_seq + 1 - first.seq).ok()?;
        let mut out = Vec::with_capacity(self.events.len().saturating_sub(start).min(max_count));
        let mut bytes = 0;
        for event in self.events.iter().skip(start).take(max_count) {
            if !out.is_empty() && bytes + event.json.len() > max_bytes {
                break;
            }
            bytes += event.json.len();
            out.push(event.clone());
        }
        Some(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(seq: u64, at: u64, size: usize) -> Arc<LoggedEvent> {
        Arc::new(LoggedEvent {
            seq,
            at,
            json: "x".repeat(size).into_boxed_str(),
        })
    }

    fn log(retention: Retention, n: u64) -> EventLog {
        let mut log = EventLog::new(Epoch(7), 0, retention);
        for seq in 1..=n {
            log.push(event(seq, seq, 10), n);
        }
        log
    }

    #[test]
    fn cursor_validity_is_arithmetic() {
        let log = log(
            Retention {
                max_events: 5,
                ..Retention::default()
            },
            20,
        );
        assert_eq!(log.oldest_seq(), 15);
        assert!(log.check_cursor(Cursor::new(Epoch(7), 15)).is_ok());
        assert!(log.check_cursor(Cursor::new(Epoch(7), 20)).is_ok());
        let expired = |seq, epoch| {
            log.check_cursor(Cursor::new(Epoch(epoch), seq))
                .unwrap_err()
                .details()
                .unwrap()["reason"]
                .clone()
        };
        assert_eq!(expired(14, 7), "older_than_window");
        assert_eq!(expired(21, 7), "ahead_of_head");
        assert_eq!(expired(20, 8), "other_epoch");
    }

    #[test]
    fn a_cursor_at_head_is_valid_even_with_an_empty_log() {
        let log = EventLog::new(Epoch(1), 42, Retention::default());
        assert!(log.check_cursor(Cursor::new(Epoch(1), 42)).is_ok());
        assert_eq!(log.after(42, 10, 1000).unwrap().len(), 0);
    }

    #[test]
    fn replay_slices_respect_count_and_bytes() {
        let log = log(Retention::default(), 10);
        let slice = log.after(3, 4, 1000).unwrap();
        assert_eq!(
            slice.iter().map(|e| e.seq).collect::<Vec<_>>(),
            [4, 5, 6, 7]
        );
        let slice = log.after(3, 100, 25).unwrap();
        assert_eq!(slice.len(), 2);
        let slice = log.after(0, 100, 1).unwrap();
        assert_eq!(
            slice.len(),
            1,
            "one event even when it alone exceeds the budget"
        );
        assert!(log.after(10, 5, 100).unwrap().is_empty());
    }

    #[test]
    fn retention_by_bytes_and_age() {
        let by_bytes = log(
            Retention {
                max_bytes: 35,
                ..Retention::default()
            },
            10,
        );
        assert_eq!(by_bytes.oldest_seq(), 7);
        let mut by_age = EventLog::new(
            Epoch(1),
            0,
            Retention {
                max_age_ms: 100,
                ..Retention::default()
            },
        );
        by_age.push(event(1, 1000, 1), 1000);
        by_age.push(event(2, 1050, 1), 1050);
        by_age.push(event(3, 1200, 1), 1200);
        assert_eq!(by_age.oldest_seq(), 2);
    }
}
