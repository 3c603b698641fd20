//! One JetStream consumer per followed session on this replica (docs/protocol.md §15.3): its
//! events kept in a window (racp-server's `EventLog`) that every subscriber of the session on
//! this replica reads at its own pace, as a host's subscribers read its log
//! (racp-server/src/fanout.rs): one read from NATS per event, however many desktops watch.
//! A subscriber whose cursor is older than the window catches up on a consumer of its own
//! (follow.rs), then joins.

use crate::stream::{self, Position, Reader, Stream};
use dashmap::DashMap;
use racp_proto::{AppError, Epoch};
use racp_server::fanout::{SharedLog, Slice};
use racp_server::log::{EventLog, LoggedEvent, Retention};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use tokio::sync::Notify;

/// The window a feed keeps: enough for a subscriber within the lag bound to stay in it, as on
/// a host, within a byte bound (past it, a subscriber that falls out is CLIENT_TOO_SLOW).
const WINDOW_BYTES: usize = 16 << 20;

/// Most events one append adds: a subscriber that keeps up is at most this far behind the head
/// when it wakes, as after a host's group commit, so it stays well inside the lag bound.
const APPEND_EVENTS: usize = 256;

/// The feeds of this replica, by subject.
#[derive(Default)]
pub struct Feeds {
    open: Arc<DashMap<String, Weak<Feed>>>,
}

/// Where a feed starts: after RACP seq `after`, read from stream sequence `from`.
pub struct Start<'a> {
    pub stream: &'a Stream,
    /// The host whose stream it is (the lag gauge's label, metrics.rs).
    pub host: &'a str,
    pub subject: &'a str,
    pub session_id: &'a str,
    pub epoch: Epoch,
    pub after: u64,
    pub from: u64,
    /// The session is closed and `after` is its last event: nothing will follow.
    pub closed: bool,
    /// Events in the window (the lag bound plus a frame's worth).
    pub window_events: usize,
}

impl Feeds {
    /// The session's feed on this replica, started at `start` when there is none (or the one
    /// there ended with an error, or follows another epoch).
    pub fn join(&self, start: Start<'_>) -> Arc<Feed> {
        // No lock is held while a feed may drop: its drop takes the map's.
        let existing = self.open.get(start.subject).and_then(|feed| feed.upgrade());
        if let Some(feed) = &existing
            && feed.epoch == start.epoch
            && feed.lock().failed.is_none()
        {
            return feed.clone();
        }
        let retention = Retention {
            max_events: start.window_events,
            max_bytes: WINDOW_BYTES,
            max_age_ms: u64::MAX,
        };
        let feed = Arc::new(Feed {
            host: start.host.to_string(),
            stream: start.stream.clone(),
            consumer: Mutex::new(None),
            session_id: start.session_id.to_string(),
            subject: start.subject.to_string(),
            epoch: start.epoch,
            window: Mutex::new(Window {
                log: EventLog::new(start.epoch, start.after, retention),
                closed: start.closed,
                failed: None,
                watchers: Vec::new(),
            }),
            feeds: Arc::downgrade(&self.open),
            pump: Mutex::new(None),
        });
        self.open
            .insert(start.subject.to_string(), Arc::downgrade(&feed));
        drop(existing);
        if !start.closed {
            let task = tokio::spawn(pump(
                start.stream.clone(),
                Arc::downgrade(&feed),
                start.after,
                start.from,
            ));
            *feed.pump.lock().unwrap_or_else(|e| e.into_inner()) = Some(task.abort_handle());
        }
        feed
    }

    /// The consumers this replica's feeds read with now, at most `max`: each with its host
    /// and stream, for the lag gauge (metrics.rs).
    pub fn consumers(&self, max: usize) -> Vec<(String, Stream, String)> {
        // The weak handles are taken first: a feed upgraded here may drop, and its drop takes
        // the map's lock.
        let feeds: Vec<Weak<Feed>> = self.open.iter().map(|f| f.value().clone()).collect();
        feeds
            .iter()
            .filter_map(Weak::upgrade)
            .filter_map(|feed| {
                let name = feed
                    .consumer
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .clone()?;
                Some((feed.host.clone(), feed.stream.clone(), name))
            })
            .take(max)
            .collect()
    }
}

pub struct Feed {
    host: String,
    stream: Stream,
    /// The consumer its pump reads with now, while it reads (metrics.rs asks for its lag).
    consumer: Mutex<Option<String>>,
    session_id: String,
    subject: String,
    epoch: Epoch,
    window: Mutex<Window>,
    feeds: Weak<DashMap<String, Weak<Feed>>>,
    pump: Mutex<Option<tokio::task::AbortHandle>>,
}

struct Window {
    log: EventLog,
    closed: bool,
    failed: Option<AppError>,
    watchers: Vec<(u64, Arc<Notify>)>,
}

impl Feed {
    fn lock(&self) -> MutexGuard<'_, Window> {
        self.window.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Its pump reads with consumer `name` now (`None`: it stopped reading).
    fn reads_with(&self, name: Option<&str>) {
        let mut consumer = self.consumer.lock().unwrap_or_else(|e| e.into_inner());
        if consumer.as_deref() != name {
            *consumer = name.map(str::to_string);
        }
    }

    /// Whether a subscriber that has sent up to RACP seq `last` can read on from the window.
    pub fn takes_over_at(&self, last: u64) -> bool {
        let window = self.lock();
        window.failed.is_none() && last >= window.log.oldest_seq()
    }

    /// Appends the events a batch took, in seq order, and wakes the subscribers.
    /// `closed`: the last of them is `session.closed`.
    fn append(
        &self,
        events: Vec<(u64, bytes::Bytes)>,
        closed: bool,
        failed: Option<AppError>,
    ) -> bool {
        let now = racp_server::clock::now_ms();
        let mut window = self.lock();
        for (seq, payload) in events {
            // Checked to be one JSON object before it was accepted, so it is UTF-8.
            let Ok(json) = std::str::from_utf8(&payload) else {
                continue;
            };
            let event = LoggedEvent {
                seq,
                at: now,
                json: json.into(),
            };
            window.log.push(Arc::new(event), now);
        }
        window.closed |= closed;
        window.failed = failed;
        for (_, notify) in &window.watchers {
            notify.notify_one();
        }
        window.closed || window.failed.is_some()
    }
}

impl SharedLog for Feed {
    fn session_id(&self) -> &str {
        &self.session_id
    }

    fn epoch(&self) -> Epoch {
        self.epoch
    }

    fn next_after(&self, after_seq: u64, max_count: usize, max_bytes: usize) -> Slice {
        let window = self.lock();
        let (closed, failed) = (window.closed, window.failed.clone());
        Slice::of(&window.log, after_seq, max_count, max_bytes, closed, failed)
    }

    fn watch(&self, watcher: u64, notify: Arc<Notify>) {
        self.lock().watchers.push((watcher, notify));
    }

    fn unwatch(&self, watcher: u64) {
        self.lock().watchers.retain(|(w, _)| *w != watcher);
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        if let Some(pump) = self.pump.lock().unwrap_or_else(|e| e.into_inner()).take() {
            pump.abort();
        }
        if let Some(feeds) = self.feeds.upgrade() {
            feeds.remove_if(&self.subject, |_, feed| feed.strong_count() == 0);
        }
    }
}

/// Reads the session's subject from stream sequence `from` into the feed's window while anyone
/// holds the feed.
async fn pump(stream: Stream, feed: Weak<Feed>, after: u64, from: u64) {
    let Some((subject, epoch)) = feed.upgrade().map(|f| (f.subject.clone(), f.epoch)) else {
        return;
    };
    let messages = stream::consume_again(&stream, &subject, from).await;
    let at = Position::after(after, from);
    let mut reader = Reader::new(stream, subject, epoch, messages, at, "a feed's");
    loop {
        // Not held over the read: a feed no one holds any more drops while its pump waits.
        let Some(held) = feed.upgrade() else {
            return;
        };
        held.reads_with(Some(reader.consumer()));
        drop(held);
        let Some((events, stop)) = reader.next_batch(APPEND_EVENTS, WINDOW_BYTES / 16).await else {
            continue;
        };
        let Some(feed) = feed.upgrade() else {
            return;
        };
        if feed.append(events, reader.at.closed, stop) {
            feed.reads_with(None);
            return;
        }
    }
}
