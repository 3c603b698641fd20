//! The catch-up of a subscription whose cursor is older than its session's feed (feed.rs):
//! a task with a consumer of its own (stream.rs) that turns stream messages into
//! `session/events` pushes, with the same framing, gap rules and `subscription/ended` as a host,
//! until the feed's window holds what comes next.

use crate::feed::Feed;
use crate::stream::{Messages, Position, Reader, Stream, consume};
use racp_proto::{AppError, Cursor, Epoch};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use tokio::sync::mpsc;

/// What a catch-up task hands its connection.
pub enum Outgoing {
    Frame(String),
    /// The subscription is over (its `subscription/ended` push was the frame before).
    Ended(String),
    /// The subscription has sent up to RACP seq `last`, which its feed's window holds: it reads
    /// on from the feed.
    Live {
        subscription_id: String,
        last: u64,
    },
}

pub struct Follow {
    pub session_id: String,
    pub epoch: Epoch,
    /// The feed the subscription joins once caught up.
    pub feed: Arc<Feed>,
    /// RACP seq of the last event handed to the connection.
    pub delivered: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl Follow {
    pub fn cursor(&self) -> Cursor {
        Cursor::new(self.epoch, self.delivered.load(Ordering::Relaxed))
    }
}

impl Drop for Follow {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub struct Start {
    pub subscription_id: String,
    pub session_id: String,
    pub subject: String,
    pub epoch: Epoch,
    /// Events at or below this RACP seq are not delivered.
    pub after: u64,
    pub stream_sequence: u64,
    pub max_frame_bytes: usize,
    pub max_events_per_frame: usize,
    /// The feed it joins once it has caught up.
    pub feed: Arc<Feed>,
    /// Where the events it sends are counted, as a feed's are (racp-server's fanout.rs).
    pub metrics: racp_server::metrics::Metrics,
}

impl Start {
    /// The bytes a push's events may take: the frame bound less room for the envelope.
    fn budget(&self) -> usize {
        self.max_frame_bytes
            .saturating_sub(256 + self.subscription_id.len() + self.session_id.len())
    }
}

pub async fn follow(
    stream: &Stream,
    start: Start,
    out: mpsc::Sender<Outgoing>,
) -> Result<Follow, AppError> {
    // The first consumer is made here, so a subscribe that cannot read the stream fails.
    let messages = consume(stream, &start.subject, start.stream_sequence).await?;
    tracing::debug!(
        subscription_id = %start.subscription_id,
        after = start.after,
        "a subscription older than its feed's window catches up on a consumer of its own"
    );
    let delivered = Arc::new(AtomicU64::new(start.after));
    let session_id = start.session_id.clone();
    let epoch = start.epoch;
    let feed = start.feed.clone();
    let task = tokio::spawn(pump(
        stream.clone(),
        messages,
        start,
        delivered.clone(),
        out,
    ));
    Ok(Follow {
        session_id,
        epoch,
        feed,
        delivered,
        task,
    })
}

/// Turns stream messages into frames for the connection until the feed's window holds what
/// comes next.
async fn pump(
    stream: Stream,
    messages: Messages,
    start: Start,
    delivered: Arc<AtomicU64>,
    out: mpsc::Sender<Outgoing>,
) {
    let prefix = racp_server::push::events_prefix(&start.subscription_id, &start.session_id);
    let budget = start.budget();
    let at = Position::after(start.after, start.stream_sequence);
    let subject = start.subject.clone();
    let mut reader = Reader::new(
        stream,
        subject,
        start.epoch,
        messages,
        at,
        "a subscription's",
    );
    loop {
        let last = reader.at.last;
        if start.feed.takes_over_at(last) {
            let subscription_id = start.subscription_id.clone();
            tracing::debug!(%subscription_id, last, "a caught-up subscription reads on from its feed");
            let _ = out
                .send(Outgoing::Live {
                    subscription_id,
                    last,
                })
                .await;
            return;
        }
        let Some((events, stop)) = reader.next_batch(start.max_events_per_frame, budget).await
        else {
            continue;
        };
        for chunk in frames(&events, budget) {
            let frame = events_frame(&prefix, chunk, budget, &start);
            // Counted as handed out, before the client can have read it, as fanout.rs counts.
            start.metrics.delivered(chunk.len());
            if out.send(Outgoing::Frame(frame)).await.is_err() {
                return;
            }
            if let Some((seq, _)) = chunk.last() {
                delivered.store(*seq, Ordering::Relaxed);
            }
        }
        let last = reader.at.last;
        if reader.at.closed {
            end(&out, &start, last, None).await;
            return;
        }
        if let Some(error) = stop {
            end(&out, &start, last, Some(error)).await;
            return;
        }
    }
}

/// One `session/events` frame of `chunk`, an event over `budget` cut to fit as a host cuts it.
fn events_frame(
    prefix: &str,
    chunk: &[(u64, bytes::Bytes)],
    budget: usize,
    start: &Start,
) -> String {
    let mut frame = String::with_capacity(prefix.len() + budget.min(1 << 16));
    frame.push_str(prefix);
    for (i, (seq, payload)) in chunk.iter().enumerate() {
        let json = String::from_utf8_lossy(payload);
        if i > 0 {
            frame.push(',');
        }
        if json.len() > budget {
            let from = Cursor::new(start.epoch, seq - 1);
            frame.push_str(&racp_proto::elide::elide(
                &json,
                budget,
                start.max_frame_bytes,
                from,
            ));
        } else {
            frame.push_str(&json);
        }
    }
    frame.push_str("]}}");
    frame
}

/// Ends the subscription: its `subscription/ended` push, then word to the connection.
async fn end(out: &mpsc::Sender<Outgoing>, start: &Start, last: u64, error: Option<AppError>) {
    let _ = out.send(ended(start, last, error)).await;
    let _ = out
        .send(Outgoing::Ended(start.subscription_id.clone()))
        .await;
}

/// Splits events into frames of at most `budget` bytes each (an oversized event alone).
fn frames(events: &[(u64, bytes::Bytes)], budget: usize) -> Vec<&[(u64, bytes::Bytes)]> {
    let mut out = Vec::new();
    let (mut start, mut size) = (0, 0);
    for (i, (_, payload)) in events.iter().enumerate() {
        if i > start && size + payload.len() + 1 > budget {
            out.push(&events[start..i]);
            (start, size) = (i, 0);
        }
        size += payload.len() + 1;
    }
    if start < events.len() {
        out.push(&events[start..]);
    }
    out
}

fn ended(start: &Start, last: u64, error: Option<AppError>) -> Outgoing {
    Outgoing::Frame(racp_server::push::subscription_ended(
        &racp_proto::events::SubscriptionEndedParams {
            subscription_id: start.subscription_id.clone(),
            session_id: start.session_id.clone(),
            cursor: Cursor::new(start.epoch, last),
            error,
        },
    ))
}
