//! A connection's subscriptions and their delivery.
//!
//! Delivery pulls from each session's shared log at the connection's own pace: the producer only
//! appends and wakes the connection, so it never waits on a subscriber. The "queue" of a
//! subscriber is the distance between its last delivered seq and the session's head; memory per
//! subscriber is one frame being written.

use crate::sessions::Session;
use racp_proto::events::{PushMethod, SubscriptionEndedParams, SubscriptionHead};
use racp_proto::methods::session::SessionSubscribeResult;
use racp_proto::{AppError, Cursor, ErrorCode};
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::fmt::Write;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::Notify;

static NEXT_WATCHER: AtomicU64 = AtomicU64::new(1);

struct Subscription {
    session: Arc<Session>,
    watcher: u64,
    /// Seq of the last event delivered (or where the subscription started).
    delivered: u64,
    /// Set once the subscription has reached the head: from then on lag counts as slowness.
    caught_up: bool,
    /// The start of every `session/events` push of this subscription, up to the events array.
    prefix: Box<str>,
}

/// What the connection should send next for its subscriptions.
pub enum Delivery {
    /// A frame to send; call again for more.
    Frame(String),
    /// The client fell too far behind: end the connection with this error.
    TooSlow(AppError),
}

pub struct Subscriptions {
    pub notify: Arc<Notify>,
    subs: BTreeMap<String, Subscription>,
    next_id: u64,
    max_lag_events: u64,
    max_events_per_frame: usize,
}

impl Subscriptions {
    pub fn new(max_lag_events: u64, max_events_per_frame: usize) -> Self {
        Subscriptions {
            notify: Arc::new(Notify::new()),
            subs: BTreeMap::new(),
            next_id: 1,
            max_lag_events,
            max_events_per_frame,
        }
    }

    /// Bounds each push to what the client asked for at `hello`.
    pub fn set_max_events_per_frame(&mut self, max: usize) {
        self.max_events_per_frame = max;
    }

    pub fn len(&self) -> usize {
        self.subs.len()
    }

    pub fn subscribe(
        &mut self,
        session: Arc<Session>,
        cursor: Option<Cursor>,
    ) -> Result<SessionSubscribeResult, AppError> {
        let start = match cursor {
            Some(cursor) => {
                session.check_cursor(cursor)?;
                cursor
            }
            None => session.head_cursor(),
        };
        let subscription_id = format!("sub_{}", self.next_id);
        self.next_id += 1;
        let watcher = NEXT_WATCHER.fetch_add(1, Ordering::Relaxed);
        session.watch(watcher, self.notify.clone());
        let mut prefix = String::new();
        let _ = write!(
            prefix,
            r#"{{"method":"{}","params":{{"subscriptionId":{},"sessionId":{},"events":["#,
            PushMethod::SessionEvents.as_str(),
            Value::from(subscription_id.as_str()),
            Value::from(session.id.as_str()),
        );
        self.subs.insert(
            subscription_id.clone(),
            Subscription {
                session,
                watcher,
                delivered: start.seq,
                caught_up: false,
                prefix: prefix.into_boxed_str(),
            },
        );
        // Events may have been published between reading the head and watching.
        self.notify.notify_one();
        Ok(SessionSubscribeResult {
            subscription_id,
            cursor: start,
        })
    }

    pub fn unsubscribe(&mut self, subscription_id: &str) -> Result<(), AppError> {
        let sub = self.subs.remove(subscription_id).ok_or_else(|| {
            AppError::new(
                ErrorCode::NotFound,
                "no such subscription on this connection",
            )
            .with_details(json!({"subscriptionId": subscription_id}))
        })?;
        sub.session.unwatch(sub.watcher);
        Ok(())
    }

    /// The next frame to send, taking one batch from the first subscription that has events.
    /// `None` when every subscription is at its session's head.
    pub fn next_delivery(&mut self, max_frame_bytes: usize) -> Option<Delivery> {
        enum Step {
            Slow(&'static str),
            Ended(String),
            Frame(String),
        }
        let mut step = None;
        for (id, sub) in self.subs.iter_mut() {
            // Room for the envelope around the events.
            let budget = max_frame_bytes.saturating_sub(256 + id.len() + sub.session.id.len());
            // Positions and events under one lock: every subscriber of a session takes it
            // after each commit.
            let slice = sub
                .session
                .next_after(sub.delivered, self.max_events_per_frame, budget);
            let (head, oldest, closed) = (slice.head, slice.oldest, slice.closed);
            if sub.delivered < oldest {
                step = Some(Step::Slow("fell out of the retained window"));
                break;
            }
            if sub.caught_up && head - sub.delivered > self.max_lag_events {
                step = Some(Step::Slow("fell too far behind the head"));
                break;
            }
            if sub.delivered >= head {
                sub.caught_up = true;
                if closed {
                    step = Some(Step::Ended(id.clone()));
                    break;
                }
                continue;
            }
            let Some(events) = slice.events else {
                step = Some(Step::Slow("fell out of the retained window"));
                break;
            };
            let Some(last) = events.last() else { continue };
            sub.delivered = last.seq;
            // Sized exactly: a fixed large capacity per frame costs more in the allocator
            // (glibc consolidates its heap when a 64 KiB block is freed) than the copy.
            let size =
                sub.prefix.len() + events.iter().map(|e| e.json.len() + 1).sum::<usize>() + 3;
            let mut frame = String::with_capacity(size);
            frame.push_str(&sub.prefix);
            for (i, event) in events.iter().enumerate() {
                if i > 0 {
                    frame.push(',');
                }
                if event.json.len() > budget {
                    // Only ever alone in its batch: cut to fit, with a marker (size policy).
                    let epoch = sub.session.head_cursor().epoch;
                    let from = Cursor::new(epoch, event.seq - 1);
                    frame.push_str(&super::elide::elide(
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
            step = Some(Step::Frame(frame));
            break;
        }
        match step? {
            Step::Frame(frame) => Some(Delivery::Frame(frame)),
            Step::Slow(why) => Some(Delivery::TooSlow(self.too_slow(why))),
            Step::Ended(id) => {
                let sub = self.subs.remove(&id)?;
                sub.session.unwatch(sub.watcher);
                let cursor = Cursor::new(sub.session.head_cursor().epoch, sub.delivered);
                Some(Delivery::Frame(racp_server::push::subscription_ended(
                    &SubscriptionEndedParams {
                        subscription_id: id,
                        session_id: sub.session.id.clone(),
                        cursor,
                        error: None,
                    },
                )))
            }
        }
    }

    /// CLIENT_TOO_SLOW with the last delivered cursor of every subscription.
    fn too_slow(&self, why: &str) -> AppError {
        let last = self.heads().into_iter();
        racp_server::push::too_slow(why, last.map(|head| (head.subscription_id, head.cursor)))
    }

    /// Every subscription's last delivered cursor.
    pub fn heads(&self) -> Vec<SubscriptionHead> {
        self.subs
            .iter()
            .map(|(id, sub)| SubscriptionHead {
                subscription_id: id.clone(),
                session_id: sub.session.id.clone(),
                cursor: Cursor::new(sub.session.head_cursor().epoch, sub.delivered),
            })
            .collect()
    }
}

impl Drop for Subscriptions {
    fn drop(&mut self) {
        for sub in self.subs.values() {
            sub.session.unwatch(sub.watcher);
        }
    }
}
