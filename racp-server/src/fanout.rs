//! A connection's subscriptions and their delivery, for a host and a gateway alike.
//!
//! Delivery pulls from each session's shared log ([`SharedLog`]: a host's session, or a gateway
//! replica's window of the host's stream) at the connection's own pace: the producer only
//! appends and wakes the connection, so it never waits on a subscriber. The "queue" of a
//! subscriber is the distance between its last delivered seq and the session's head; memory per
//! subscriber is one frame being written.

use crate::log::{EventLog, LoggedEvent};
use crate::metrics::Metrics;
use racp_proto::events::{SubscriptionEndedParams, SubscriptionHead};
use racp_proto::{AppError, Cursor, Epoch, ErrorCode};
use serde_json::json;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::Notify;

static NEXT_WATCHER: AtomicU64 = AtomicU64::new(1);

/// Frames a connection sends for its subscriptions before it looks at other work again.
const DELIVERY_BURST: usize = 8;

/// A session's log as its subscribers read it.
pub trait SharedLog: Send + Sync + 'static {
    fn session_id(&self) -> &str;
    fn epoch(&self) -> Epoch;
    /// What a subscriber at `after_seq` may send next, read under one lock: the positions and
    /// up to `max_count` committed events after it within `max_bytes`.
    fn next_after(&self, after_seq: u64, max_count: usize, max_bytes: usize) -> Slice;
    /// `notify` is woken after each append.
    fn watch(&self, watcher: u64, notify: Arc<Notify>);
    fn unwatch(&self, watcher: u64);
}

/// What a subscriber may send next.
pub struct Slice {
    pub head: u64,
    pub oldest: u64,
    /// The last event is `session.closed`: nothing follows it.
    pub closed: bool,
    /// Nothing follows the head: the log ended with this error (a gateway's stream that holds
    /// a hole or a malformed event).
    pub failed: Option<AppError>,
    /// `None` when the subscriber's seq has left the retained window.
    pub events: Option<Vec<Arc<LoggedEvent>>>,
}

impl Slice {
    /// What `log` holds for a subscriber at `after_seq` (see [`SharedLog::next_after`]).
    pub fn of(
        log: &EventLog,
        after_seq: u64,
        max_count: usize,
        max_bytes: usize,
        closed: bool,
        failed: Option<AppError>,
    ) -> Slice {
        let (head, oldest) = (log.head(), log.oldest_seq());
        let events = if after_seq < head {
            log.after(after_seq, max_count, max_bytes)
        } else {
            Some(Vec::new())
        };
        Slice {
            head,
            oldest,
            closed,
            failed,
            events,
        }
    }
}

struct Subscription<L> {
    session: Arc<L>,
    watcher: u64,
    /// Seq of the last event delivered (or where the subscription started).
    delivered: u64,
    /// Set once the subscription has reached the head: from then on lag counts as slowness.
    caught_up: bool,
    /// The start of every `session/events` push of this subscription, up to the events array.
    prefix: Box<str>,
}

/// The limits one delivery works within.
struct Bounds {
    max_frame_bytes: usize,
    max_events_per_frame: usize,
    max_lag_events: u64,
}

/// What one subscription has to do next.
enum Step {
    /// The client is too slow, for this reason.
    Slow(&'static str),
    /// The session ended (closed, or failed with the error) and every event is delivered.
    Ended(String, Option<AppError>),
    /// A frame and the number of events it carries.
    Frame(String, usize),
}

impl<L: SharedLog> Subscription<L> {
    /// What subscription `id` does next; `None` when it is at its session's head.
    fn next_step(&mut self, id: &str, bounds: &Bounds) -> Option<Step> {
        // Room for the envelope around the events.
        let budget = bounds
            .max_frame_bytes
            .saturating_sub(256 + id.len() + self.session.session_id().len());
        // Positions and events under one lock: every subscriber of a session takes it after
        // each commit.
        let slice = self
            .session
            .next_after(self.delivered, bounds.max_events_per_frame, budget);
        let (head, oldest) = (slice.head, slice.oldest);
        if self.delivered < oldest {
            return Some(Step::Slow("fell out of the retained window"));
        }
        if self.caught_up && head.saturating_sub(self.delivered) > bounds.max_lag_events {
            return Some(Step::Slow("fell too far behind the head"));
        }
        if self.delivered >= head {
            self.caught_up = true;
            return (slice.closed || slice.failed.is_some())
                .then(|| Step::Ended(id.to_string(), slice.failed));
        }
        let Some(events) = slice.events else {
            return Some(Step::Slow("fell out of the retained window"));
        };
        let last = events.last()?;
        self.delivered = last.seq;
        let frame = self.frame(&events, budget, bounds.max_frame_bytes);
        Some(Step::Frame(frame, events.len()))
    }

    /// The `session/events` push of `events`, each cut to `budget` bytes when it is larger.
    fn frame(&self, events: &[Arc<LoggedEvent>], budget: usize, max_frame_bytes: usize) -> String {
        // Sized exactly: a fixed large capacity per frame costs more in the allocator (glibc
        // consolidates its heap when a 64 KiB block is freed) than the copy.
        let size = self.prefix.len() + events.iter().map(|e| e.json.len() + 1).sum::<usize>() + 3;
        let mut frame = String::with_capacity(size);
        frame.push_str(&self.prefix);
        for (i, event) in events.iter().enumerate() {
            if i > 0 {
                frame.push(',');
            }
            if event.json.len() > budget {
                // Only ever alone in its batch: cut to fit, with a marker (size policy).
                let from = Cursor::new(self.session.epoch(), event.seq - 1);
                frame.push_str(&racp_proto::elide::elide(
                    &event.json,
                    budget,
                    max_frame_bytes,
                    from,
                ));
            } else {
                frame.push_str(&event.json);
            }
        }
        frame.push_str("]}}");
        frame
    }
}

/// What the connection should send next for its subscriptions.
pub enum Delivery {
    /// A frame to send; call again for more.
    Frame(String),
    /// The client fell too far behind: end the connection with this error.
    TooSlow(AppError),
}

pub struct Subscriptions<L: SharedLog> {
    pub notify: Arc<Notify>,
    subs: BTreeMap<String, Subscription<L>>,
    next_id: u64,
    max_lag_events: u64,
    max_events_per_frame: usize,
    /// Where deliveries and open subscriptions are counted, under the caller's role.
    counted: Option<(Metrics, &'static str)>,
}

impl<L: SharedLog> Subscriptions<L> {
    pub fn new(max_lag_events: u64, max_events_per_frame: usize) -> Self {
        Subscriptions {
            notify: Arc::new(Notify::new()),
            subs: BTreeMap::new(),
            next_id: 1,
            max_lag_events,
            max_events_per_frame,
            counted: None,
        }
    }

    /// Counts the events delivered and the subscriptions open into `metrics`, the latter under
    /// `role` (the caller's strongest role: a closed set).
    pub fn counted_in(mut self, metrics: Metrics, role: &'static str) -> Self {
        self.counted = Some((metrics, role));
        self
    }

    fn count_open(&self, change: i64) {
        if let Some((metrics, role)) = &self.counted {
            metrics.subscriptions_changed(role, change);
        }
    }

    /// Bounds each push to what the client asked for at `hello`.
    pub fn set_max_events_per_frame(&mut self, max: usize) {
        self.max_events_per_frame = max;
    }

    pub fn len(&self) -> usize {
        self.subs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.subs.is_empty()
    }

    /// A new subscription's id, unique on the connection.
    pub fn new_id(&mut self) -> String {
        let id = format!("sub_{}", self.next_id);
        self.next_id += 1;
        id
    }

    /// Delivers `session`'s events after seq `delivered` as subscription `subscription_id`.
    pub fn insert(&mut self, subscription_id: String, session: Arc<L>, delivered: u64) {
        let watcher = NEXT_WATCHER.fetch_add(1, Ordering::Relaxed);
        session.watch(watcher, self.notify.clone());
        let prefix = crate::push::events_prefix(&subscription_id, session.session_id());
        self.subs.insert(
            subscription_id,
            Subscription {
                session,
                watcher,
                delivered,
                caught_up: false,
                prefix: prefix.into_boxed_str(),
            },
        );
        self.count_open(1);
        // Events may have been published between reading the head and watching.
        self.notify.notify_one();
    }

    /// Ends a subscription; false when the connection holds none by that id.
    pub fn remove(&mut self, subscription_id: &str) -> bool {
        let Some(sub) = self.subs.remove(subscription_id) else {
            return false;
        };
        sub.session.unwatch(sub.watcher);
        self.count_open(-1);
        true
    }

    /// The next frame to send, taking one batch from the first subscription that has events.
    /// `None` when every subscription is at its session's head.
    pub fn next_delivery(&mut self, max_frame_bytes: usize) -> Option<Delivery> {
        let bounds = Bounds {
            max_frame_bytes,
            max_events_per_frame: self.max_events_per_frame,
            max_lag_events: self.max_lag_events,
        };
        let step = self
            .subs
            .iter_mut()
            .find_map(|(id, sub)| sub.next_step(id, &bounds))?;
        match step {
            Step::Frame(frame, events) => {
                if let Some((metrics, _)) = &self.counted {
                    metrics.delivered(events);
                }
                Some(Delivery::Frame(frame))
            }
            Step::Slow(why) => Some(Delivery::TooSlow(self.too_slow(why))),
            Step::Ended(id, error) => self.end(id, error).map(Delivery::Frame),
        }
    }

    /// Removes subscription `id`, whose session ended (closed, or failed with `error`), and
    /// gives the `subscription/ended` push that tells the client.
    fn end(&mut self, id: String, error: Option<AppError>) -> Option<String> {
        let sub = self.subs.remove(&id)?;
        sub.session.unwatch(sub.watcher);
        self.count_open(-1);
        let cursor = Cursor::new(sub.session.epoch(), sub.delivered);
        Some(crate::push::subscription_ended(&SubscriptionEndedParams {
            subscription_id: id,
            session_id: sub.session.session_id().to_string(),
            cursor,
            error,
        }))
    }

    /// Up to a burst of frames, and the error to end the connection with after them; the rest
    /// waits for the next wake-up (one is left pending when the burst is full), so requests get
    /// a turn.
    pub fn burst(&mut self, max_frame_bytes: usize) -> (Vec<String>, Option<AppError>) {
        let mut frames = Vec::new();
        while frames.len() < DELIVERY_BURST {
            match self.next_delivery(max_frame_bytes) {
                Some(Delivery::Frame(frame)) => frames.push(frame),
                Some(Delivery::TooSlow(error)) => return (frames, Some(error)),
                None => break,
            }
        }
        if frames.len() == DELIVERY_BURST {
            self.notify.notify_one();
        }
        (frames, None)
    }

    /// CLIENT_TOO_SLOW with the last delivered cursor of every subscription.
    fn too_slow(&self, why: &str) -> AppError {
        let last = self.heads().into_iter();
        crate::push::too_slow(why, last.map(|head| (head.subscription_id, head.cursor)))
    }

    /// Every subscription's last delivered cursor.
    pub fn heads(&self) -> Vec<SubscriptionHead> {
        self.subs
            .iter()
            .map(|(id, sub)| SubscriptionHead {
                subscription_id: id.clone(),
                session_id: sub.session.session_id().to_string(),
                cursor: Cursor::new(sub.session.epoch(), sub.delivered),
            })
            .collect()
    }
}

/// `session/unsubscribe` of a subscription the connection does not hold.
pub fn no_such_subscription(subscription_id: &str) -> AppError {
    AppError::new(
        ErrorCode::NotFound,
        "no such subscription on this connection",
    )
    .with_details(json!({"subscriptionId": subscription_id}))
}

impl<L: SharedLog> Drop for Subscriptions<L> {
    fn drop(&mut self) {
        for sub in self.subs.values() {
            sub.session.unwatch(sub.watcher);
        }
        self.count_open(-i64::try_from(self.subs.len()).unwrap_or(i64::MAX));
    }
}
