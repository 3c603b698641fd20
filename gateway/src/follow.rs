//! Subscriptions through the gateway, served from the host's JetStream stream (docs/protocol.md
//! §15.3): where a cursor starts in the stream, reading it (the consumer, its watchdog, the
//! checks each message passes before it is spliced in), and the catch-up of a subscription whose
//! cursor is older than its session's feed (feed.rs): a task with a consumer of its own that
//! turns stream messages into `session/events` pushes, with the same framing, gap rules and
//! `subscription/ended` as a host, until the feed's window holds what comes next.

use crate::feed::Feed;
use async_nats::jetstream::{self, consumer, stream::DirectGetErrorKind};
use futures_util::{FutureExt, StreamExt};
use racp_proto::events::PushMethod;
use racp_proto::gateway::{EPOCH_HEADER, SEQ_HEADER};
use racp_proto::{AppError, Cursor, Epoch, ErrorCode, Expired};
use serde_json::{Value, json};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::mpsc;

pub type Stream = jetstream::stream::Stream<()>;

/// What the stream holds of one session.
pub enum Span {
    /// Nothing yet (a new session, or one the host has not published).
    Empty,
    Events {
        epoch: Epoch,
        /// RACP seq and stream sequence of the first and last event.
        first: (u64, u64),
        last: (u64, u64),
        /// The last event is `session.closed`: nothing follows it.
        closed: bool,
    },
}

fn position(message: &jetstream::message::StreamMessage) -> Option<(Epoch, u64)> {
    Some((
        epoch_header(&message.headers)?,
        seq_header(&message.headers)?,
    ))
}

/// The session's epoch a relayed event carries (`Racp-Epoch`, 16 hex digits).
fn epoch_header(headers: &async_nats::HeaderMap) -> Option<Epoch> {
    let hex = headers.get(EPOCH_HEADER)?.as_str();
    u64::from_str_radix(hex, 16).ok().map(Epoch)
}

/// The RACP seq a relayed event carries (`Racp-Seq`).
fn seq_header(headers: &async_nats::HeaderMap) -> Option<u64> {
    headers.get(SEQ_HEADER)?.as_str().parse().ok()
}

fn lookup_failed(err: &dyn std::fmt::Display) -> AppError {
    crate::hosts::nats_down(err)
}

pub async fn span(stream: &Stream, subject: &str) -> Result<Span, AppError> {
    let first = match stream.direct_get_next_for_subject(subject, None).await {
        Ok(first) => first,
        Err(err) if err.kind() == DirectGetErrorKind::NotFound => return Ok(Span::Empty),
        Err(err) => return Err(lookup_failed(&err)),
    };
    let last = stream
        .direct_get_last_for_subject(subject)
        .await
        .map_err(|e| lookup_failed(&e))?;
    let (Some((epoch, first_seq)), Some((_, last_seq))) = (position(&first), position(&last))
    else {
        return Err(crate::hosts::internal(
            &"an event in the stream has no position headers",
        ));
    };
    Ok(Span::Events {
        epoch,
        first: (first_seq, first.sequence),
        last: (last_seq, last.sequence),
        closed: std::str::from_utf8(&last.payload).is_ok_and(is_session_closed),
    })
}

/// The stream sequence of the session's first event after RACP seq `after`, within `span`
/// (`last.1 + 1` when there is none yet): a binary search with direct gets, O(log n) lookups.
pub async fn stream_start(
    stream: &Stream,
    subject: &str,
    after: u64,
    first: (u64, u64),
    last: (u64, u64),
) -> Result<u64, AppError> {
    if after < first.0 {
        return Ok(first.1);
    }
    if after >= last.0 {
        return Ok(last.1 + 1);
    }
    let (mut low, mut high) = (first.1, last.1);
    while low < high {
        let mid = low + (high - low) / 2;
        let message = stream
            .direct_get_next_for_subject(subject, Some(mid))
            .await
            .map_err(|e| lookup_failed(&e))?;
        let seq = position(&message).map_or(0, |(_, seq)| seq);
        if seq > after {
            high = message.sequence.min(high);
        } else {
            low = message.sequence + 1;
        }
    }
    Ok(low)
}

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
}

pub async fn follow(
    stream: &Stream,
    start: Start,
    out: mpsc::Sender<Outgoing>,
) -> Result<Follow, AppError> {
    // The first consumer is made here, so a subscribe that cannot read the stream fails.
    let messages = consume(stream, &start.subject, start.stream_sequence).await?;
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

/// An ordered consumer of one session's subject from a stream sequence.
async fn consume(
    stream: &Stream,
    subject: &str,
    from: u64,
) -> Result<consumer::pull::Ordered, AppError> {
    let consumer = stream
        .create_consumer(consumer::pull::OrderedConfig {
            filter_subject: subject.to_string(),
            deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                start_sequence: from.max(1),
            },
            ..Default::default()
        })
        .await
        .map_err(|e| lookup_failed(&e))?;
    consumer.messages().await.map_err(|e| lookup_failed(&e))
}

/// A new consumer from `from`, retried with doubling delays (50 ms to 2 s) until NATS makes it.
pub async fn consume_again(stream: &Stream, subject: &str, from: u64) -> consumer::pull::Ordered {
    let mut retry = Duration::from_millis(50);
    loop {
        match consume(stream, subject, from).await {
            Ok(messages) => return messages,
            Err(error) => {
                tracing::debug!(?error, "cannot make a subscription's consumer yet");
                tokio::time::sleep(retry).await;
                retry = (retry * 2).min(Duration::from_secs(2));
            }
        }
    }
}

/// Errors in a row after which a consumer is made anew.
const CONSUMER_ERRORS: u32 = 3;
/// A subscription quiet this long checks that its consumer still delivers (a direct get to
/// NATS); each check that finds nothing newer doubles the wait, up to `WATCHDOG_MAX`, so idle
/// sessions cost NATS little, and a message brings it back to `WATCHDOG`.
pub const WATCHDOG: Duration = Duration::from_secs(3);
const WATCHDOG_MAX: Duration = Duration::from_secs(24);

/// The consumer's next message; `None` when the consumer ended, or is lost: quiet for `quiet`,
/// yet the stream has an event after `last` (its node died without the consumer noticing).
/// Each quiet spell with nothing newer doubles `quiet`; a message resets it.
pub async fn next_message(
    messages: &mut consumer::pull::Ordered,
    quiet: &mut Duration,
    stream: &Stream,
    subject: &str,
    last: u64,
) -> Option<Read> {
    loop {
        match tokio::time::timeout(*quiet, messages.next()).await {
            Ok(next) => {
                *quiet = WATCHDOG;
                return next;
            }
            Err(_) if !newer_in_stream(stream, subject, last).await => {
                *quiet = (*quiet * 2).min(WATCHDOG_MAX);
            }
            Err(_) => return None,
        }
    }
}

/// Whether the stream holds an event of the session after RACP seq `last`.
async fn newer_in_stream(stream: &Stream, subject: &str, last: u64) -> bool {
    match stream.direct_get_last_for_subject(subject).await {
        Ok(message) => position(&message).is_some_and(|(_, seq)| seq > last),
        Err(_) => false,
    }
}

/// Turns stream messages into frames for the connection until the feed's window holds what
/// comes next. The ordered consumer recovers from most faults itself; when it ends or keeps
/// failing (its NATS node died), a new one starts after the last stream message read, so the
/// subscription neither stalls nor repeats.
async fn pump(
    stream: Stream,
    mut messages: consumer::pull::Ordered,
    start: Start,
    delivered: Arc<AtomicU64>,
    out: mpsc::Sender<Outgoing>,
) {
    let prefix = format!(
        r#"{{"method":"{}","params":{{"subscriptionId":{},"sessionId":{},"events":["#,
        PushMethod::SessionEvents.as_str(),
        Value::from(start.subscription_id.as_str()),
        Value::from(start.session_id.as_str()),
    );
    let budget = start
        .max_frame_bytes
        .saturating_sub(256 + start.subscription_id.len() + start.session_id.len());
    let mut at = Position::after(start.after, start.stream_sequence);
    let mut quiet = WATCHDOG;
    loop {
        if start.feed.takes_over_at(at.last) {
            let subscription_id = start.subscription_id.clone();
            let _ = out
                .send(Outgoing::Live {
                    subscription_id,
                    last: at.last,
                })
                .await;
            return;
        }
        let next = next_message(&mut messages, &mut quiet, &stream, &start.subject, at.last).await;
        let Some(first) = next.filter(|_| !at.failing()) else {
            tracing::debug!(
                resume_at = at.resume_at,
                "a subscription's consumer is gone; making a new one"
            );
            messages = consume_again(&stream, &start.subject, at.resume_at).await;
            at.errors = 0;
            continue;
        };
        let batch = with_arrived(&mut messages, first, start.max_events_per_frame, budget);
        let batch = batch.into_iter().map(|read| read.map(Entry::read));
        let (events, stop) = accept(batch, &mut at, start.epoch, &start.subject);
        let mut closed = false;
        for chunk in frames(&events, budget) {
            let (frame, ends) = events_frame(&prefix, chunk, budget, &start);
            closed |= ends;
            if out.send(Outgoing::Frame(frame)).await.is_err() {
                return;
            }
            if let Some((seq, _)) = chunk.last() {
                delivered.store(*seq, Ordering::Relaxed);
            }
        }
        if closed {
            end(&out, &start, at.last, None).await;
            return;
        }
        if let Some(error) = stop {
            end(&out, &start, at.last, Some(error)).await;
            return;
        }
    }
}

/// Where a reader stands in its stream.
pub struct Position {
    /// The last RACP seq taken.
    pub last: u64,
    /// Where a new consumer would start: after the last stream message read.
    pub resume_at: u64,
    /// Consecutive failed reads.
    pub errors: u32,
}

impl Position {
    /// After RACP seq `last`, with the next message at stream sequence `resume_at`.
    pub fn after(last: u64, resume_at: u64) -> Self {
        Position {
            last,
            resume_at,
            errors: 0,
        }
    }

    /// Enough failed reads in a row that the consumer is made anew.
    pub fn failing(&self) -> bool {
        self.errors >= CONSUMER_ERRORS
    }
}

/// A stream message as a reader takes it.
pub struct Entry {
    /// Its stream sequence: a new consumer starts after the last one read.
    stream_sequence: Option<u64>,
    /// Its session's epoch, from its header (none when the header is missing or unreadable).
    epoch: Option<Epoch>,
    /// Its RACP seq (0 when its header has none: such a message is skipped).
    seq: u64,
    payload: bytes::Bytes,
}

impl Entry {
    pub fn read(message: jetstream::Message) -> Self {
        let headers = message.headers.as_ref();
        Entry {
            stream_sequence: message.info().ok().map(|info| info.stream_sequence),
            epoch: headers.and_then(epoch_header),
            seq: headers.and_then(seq_header).unwrap_or(0),
            payload: message.payload.clone(),
        }
    }
}

/// Takes a batch's events in seq order, skipping those already sent. A gap (retention removed
/// events not read yet) or a message that is not a well-formed event (spliced into a frame as
/// it is, it would break or forge the frame) ends the batch: the events before it are taken,
/// so `at.last` is always the last event sent, and the error ends the subscription after them.
pub fn accept<E: std::fmt::Display>(
    batch: impl IntoIterator<Item = Result<Entry, E>>,
    at: &mut Position,
    epoch: Epoch,
    subject: &str,
) -> (Vec<(u64, bytes::Bytes)>, Option<AppError>) {
    let mut events = Vec::new();
    for entry in batch {
        let entry = match entry {
            Ok(entry) => {
                at.errors = 0;
                entry
            }
            Err(err) => {
                at.errors += 1;
                tracing::warn!(error = %err, "a subscription's stream read failed");
                continue;
            }
        };
        if let Some(stream_sequence) = entry.stream_sequence {
            at.resume_at = stream_sequence + 1;
        }
        let seq = entry.seq;
        if seq == 0 {
            continue;
        }
        if entry.epoch != Some(epoch) {
            // Delivered under the subscription's epoch, its cursor would name another log.
            let error = Expired::OtherEpoch.error(epoch, at.last, at.last);
            return (events, Some(error));
        }
        if seq <= at.last {
            continue;
        }
        if seq != at.last + 1 {
            let error = Expired::OlderThanWindow.error(epoch, seq - 1, seq);
            return (events, Some(error));
        }
        if !well_formed(&entry.payload, seq) {
            tracing::warn!(subject, seq, "the host's stream holds a malformed event");
            return (events, Some(malformed(seq)));
        }
        at.last = seq;
        events.push((seq, entry.payload));
    }
    (events, None)
}

/// Whether a stream message is an event the gateway may splice into a frame unread: one JSON
/// object (valid UTF-8) whose `seq` is the one its header names. Only the head is read into a
/// struct; the rest is checked for syntax, never re-encoded.
fn well_formed(payload: &[u8], seq: u64) -> bool {
    #[derive(serde::Deserialize)]
    struct Head {
        seq: u64,
    }
    serde_json::from_slice::<Head>(payload).is_ok_and(|head| head.seq == seq)
}

fn malformed(seq: u64) -> AppError {
    AppError::new(
        ErrorCode::Internal,
        "the host relayed an event that is not a well-formed RACP event; the subscription ended before it",
    )
    .with_details(json!({"reason": "malformed_event", "seq": seq}))
}

type Read = Result<jetstream::Message, consumer::pull::OrderedError>;

/// `first` and whatever else has already arrived, up to `max_events` or `budget` bytes: they
/// are taken together.
pub fn with_arrived(
    messages: &mut consumer::pull::Ordered,
    first: Read,
    max_events: usize,
    budget: usize,
) -> Vec<Read> {
    let mut batch = vec![first];
    let mut size = 0;
    while batch.len() < max_events && size < budget {
        match messages.next().now_or_never() {
            Some(Some(next)) => {
                size += next.as_ref().map_or(0, |m| m.payload.len());
                batch.push(next);
            }
            _ => break,
        }
    }
    batch
}

/// One `session/events` frame of `chunk`, an event over `budget` cut to fit as a host cuts it;
/// and whether the chunk holds `session.closed`.
fn events_frame(
    prefix: &str,
    chunk: &[(u64, bytes::Bytes)],
    budget: usize,
    start: &Start,
) -> (String, bool) {
    let mut closed = false;
    let mut frame = String::with_capacity(prefix.len() + budget.min(1 << 16));
    frame.push_str(prefix);
    for (i, (seq, payload)) in chunk.iter().enumerate() {
        let json = String::from_utf8_lossy(payload);
        closed |= is_session_closed(&json);
        if i > 0 {
            frame.push(',');
        }
        if json.len() > budget {
            let from = Cursor::new(start.epoch, seq - 1);
            frame.push_str(&racp_server::elide::elide(
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
    (frame, closed)
}

/// Ends the subscription: its `subscription/ended` push, then word to the connection.
async fn end(out: &mpsc::Sender<Outgoing>, start: &Start, last: u64, error: Option<AppError>) {
    let _ = out.send(ended(start, last, error)).await;
    let _ = out
        .send(Outgoing::Ended(start.subscription_id.clone()))
        .await;
}

/// Whether an event is `session.closed`: a host writes `type` before `data`, so the first
/// `"type":` in the text is the event's own.
pub fn is_session_closed(json: &str) -> bool {
    json.find("\"type\":")
        .is_some_and(|at| json[at + 7..].starts_with("\"session.closed\""))
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

#[cfg(test)]
mod tests {
    use super::*;

    type Read = Result<Entry, String>;

    fn entry(seq: u64, epoch: Option<Epoch>, payload: String) -> Read {
        Ok(Entry {
            stream_sequence: Some(100 + seq),
            epoch,
            seq,
            payload: payload.into(),
        })
    }

    fn event(seq: u64) -> Read {
        entry(
            seq,
            Some(Epoch(7)),
            format!(r#"{{"seq":{seq},"type":"turn.delta"}}"#),
        )
    }

    /// A batch taken by a subscription of epoch 7 that has sent up to `at.last`: the seqs taken
    /// and the error that ends it, if any.
    fn take(at: &mut Position, batch: Vec<Read>) -> (Vec<u64>, Option<AppError>) {
        let (events, stop) = accept(batch, at, Epoch(7), "racp.ev.h.s");
        (events.iter().map(|(seq, _)| *seq).collect(), stop)
    }

    fn after(last: u64) -> Position {
        Position {
            last,
            resume_at: 0,
            errors: 0,
        }
    }

    fn detail(error: &AppError, key: &str) -> Value {
        error.details().map(|d| d[key].clone()).unwrap_or_default()
    }

    #[test]
    fn a_batch_skips_what_was_sent_and_resumes_after_the_last_message_read() {
        let mut at = after(2);
        let (taken, stop) = take(&mut at, vec![event(1), event(2), event(3), event(4)]);
        assert_eq!(taken, [3, 4]);
        assert!(stop.is_none());
        assert_eq!((at.last, at.resume_at), (4, 105));
    }

    #[test]
    fn a_gap_mid_batch_sends_the_events_before_it_then_ends_with_cursor_expired() {
        let mut at = after(0);
        let (taken, stop) = take(&mut at, vec![event(1), event(2), event(5), event(6)]);
        assert_eq!(taken, [1, 2]);
        assert_eq!(
            at.last, 2,
            "the subscription's last seq is the last event it sends"
        );
        let error = stop.expect("a gap ends the subscription");
        assert_eq!(error.code(), ErrorCode::CursorExpired);
        assert_eq!(detail(&error, "reason"), "older_than_window");
    }

    #[test]
    fn a_malformed_event_mid_batch_ends_after_the_events_before_it() {
        let forged = entry(3, Some(Epoch(7)), r#"{}]},"id":7,"result":{"#.into());
        let mut at = after(0);
        let (taken, stop) = take(&mut at, vec![event(1), event(2), forged, event(4)]);
        assert_eq!(taken, [1, 2]);
        assert_eq!(at.last, 2);
        let error = stop.expect("a malformed event ends the subscription");
        assert_eq!(error.code(), ErrorCode::Internal);
        assert_eq!(detail(&error, "seq"), 3);
    }

    #[test]
    fn an_event_of_another_epoch_ends_the_subscription_even_below_its_seq() {
        for epoch in [Some(Epoch(8)), None] {
            let other = entry(1, epoch, r#"{"seq":1}"#.into());
            let mut at = after(2);
            let (taken, stop) = take(&mut at, vec![event(3), other, event(4)]);
            assert_eq!(taken, [3]);
            let error = stop.expect("another epoch ends the subscription");
            assert_eq!(error.code(), ErrorCode::CursorExpired);
            assert_eq!(detail(&error, "reason"), "other_epoch");
        }
    }

    #[test]
    fn an_event_whose_body_names_another_seq_is_malformed() {
        assert!(well_formed(br#"{"seq":3,"data":{}}"#, 3));
        assert!(!well_formed(br#"{"seq":4,"data":{}}"#, 3));
        assert!(!well_formed(br#"[{"seq":3}]"#, 3));
        assert!(!well_formed(br#"{"seq":3,"data":{}"#, 3));
    }

    #[test]
    fn failed_reads_are_counted_until_a_message_arrives() {
        let lost = || Err("lost".to_string());
        let mut at = after(0);
        let (taken, stop) = take(&mut at, vec![lost(), lost()]);
        assert!(taken.is_empty() && stop.is_none());
        assert_eq!(at.errors, 2);
        let (taken, _) = take(&mut at, vec![lost(), event(1)]);
        assert_eq!(taken, [1]);
        assert_eq!(at.errors, 0);
    }
}
