//! Reading a host's JetStream stream (docs/protocol.md §15.3), for a session's feed (feed.rs)
//! and a catch-up (follow.rs) alike: where a cursor starts in it (binary search with direct
//! gets), the ordered consumer, its watchdog and the reader that makes it anew, and the checks
//! each message passes before it is spliced into a frame unread.

use async_nats::jetstream::{self, consumer, stream::DirectGetErrorKind};
use futures_util::{FutureExt, StreamExt};
use racp_proto::gateway::{CLOSED_HEADER, EPOCH_HEADER, SEQ_HEADER};
use racp_proto::{AppError, Epoch, ErrorCode, Expired};
use serde_json::json;
use std::time::Duration;

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

/// Whether a relayed event is its session's last, `session.closed` (`Racp-Closed`).
fn closes(headers: &async_nats::HeaderMap) -> bool {
    headers
        .get(CLOSED_HEADER)
        .is_some_and(|v| v.as_str() == "1")
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
        closed: closes(&last.headers),
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

/// How long making a consumer may take before it is given up and made again. NATS places a
/// one-replica consumer on any peer of the stream it still counts as up, and for a while after
/// a node dies that can be the dead node, which never answers: waiting out the client's
/// request timeout there (10 s, every time the dead node is drawn) stalled readers for tens of
/// seconds after a node loss.
const CONSUMER_CREATE: Duration = Duration::from_secs(2);
/// How long the watchdog waits for a consumer's state before counting the consumer lost.
const CONSUMER_CHECK: Duration = Duration::from_secs(2);

/// An ordered consumer's messages, and the consumer's name the watchdog asks after.
pub struct Messages {
    ordered: consumer::pull::Ordered,
    name: String,
}

impl Messages {
    /// The consumer's name in NATS (its info, its `num_pending`, are asked by it).
    pub fn name(&self) -> &str {
        &self.name
    }
}

/// An ordered consumer of one session's subject from a stream sequence.
pub async fn consume(stream: &Stream, subject: &str, from: u64) -> Result<Messages, AppError> {
    // Named here, so the watchdog can ask after it (the client keeps the name when it makes the
    // consumer anew itself).
    let name = consumer_name()?;
    let made = async {
        let consumer = stream
            .create_consumer(consumer::pull::OrderedConfig {
                name: Some(name.clone()),
                filter_subject: subject.to_string(),
                deliver_policy: consumer::DeliverPolicy::ByStartSequence {
                    start_sequence: from.max(1),
                },
                ..Default::default()
            })
            .await
            .map_err(|e| lookup_failed(&e))?;
        consumer.messages().await.map_err(|e| lookup_failed(&e))
    };
    let ordered = tokio::time::timeout(CONSUMER_CREATE, made)
        .await
        .map_err(|_| lookup_failed(&"no answer to making a consumer"))??;
    Ok(Messages { ordered, name })
}

/// A consumer name no other reader of any replica uses.
fn consumer_name() -> Result<String, AppError> {
    use ring::rand::SecureRandom;
    let mut id = [0u8; 12];
    ring::rand::SystemRandom::new()
        .fill(&mut id)
        .map_err(|_| crate::hosts::internal(&"the system random source failed"))?;
    Ok(id.iter().map(|b| format!("{b:02x}")).collect())
}

/// A new consumer from `from`, retried with doubling delays (50 ms to 2 s) until NATS makes it.
pub async fn consume_again(stream: &Stream, subject: &str, from: u64) -> Messages {
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

/// A session's subject read with an ordered consumer, for a feed or a catch-up. The consumer
/// recovers from most faults itself; when it ends or keeps failing (its NATS node died), a new
/// one starts after the last stream message read, so the reader neither stalls nor repeats.
pub struct Reader {
    stream: Stream,
    subject: String,
    epoch: Epoch,
    messages: Messages,
    quiet: Duration,
    pub at: Position,
    /// Whose consumer it is, for the log ("a feed's").
    whose: &'static str,
}

impl Reader {
    /// Reads `subject` of `epoch` with `messages`, a consumer positioned at `at`.
    pub fn new(
        stream: Stream,
        subject: String,
        epoch: Epoch,
        messages: Messages,
        at: Position,
        whose: &'static str,
    ) -> Self {
        Reader {
            stream,
            subject,
            epoch,
            messages,
            quiet: WATCHDOG,
            at,
            whose,
        }
    }

    /// The name of the consumer it reads with now (a new one when it is made anew).
    pub fn consumer(&self) -> &str {
        self.messages.name()
    }

    /// The events that arrived next (at least one message; more while they are already there,
    /// up to `max_events` and about `budget` bytes), checked as [`accept`] checks them, and
    /// the error that ends the reading. `None` when the consumer was gone and is made anew.
    pub async fn next_batch(
        &mut self,
        max_events: usize,
        budget: usize,
    ) -> Option<(Vec<(u64, bytes::Bytes)>, Option<AppError>)> {
        let at = &mut self.at;
        let next = next_message(&mut self.messages, &mut self.quiet, &self.stream);
        let Some(first) = next.await.filter(|_| !at.failing()) else {
            tracing::debug!(
                resume_at = at.resume_at,
                "{} consumer is gone; making a new one",
                self.whose
            );
            self.messages = consume_again(&self.stream, &self.subject, at.resume_at).await;
            at.errors = 0;
            return None;
        };
        let batch = with_arrived(&mut self.messages.ordered, first, max_events, budget);
        let batch = batch.into_iter().map(|read| read.map(Entry::read));
        Some(accept(batch, at, self.epoch, &self.subject))
    }
}

/// Errors in a row after which a consumer is made anew.
const CONSUMER_ERRORS: u32 = 3;
/// A subscription quiet this long asks NATS for its consumer's state; each answer that finds it
/// up with nothing pending doubles the wait, up to `WATCHDOG_MAX`, so idle sessions cost NATS
/// little, and a message brings it back to `WATCHDOG`.
const WATCHDOG: Duration = Duration::from_secs(3);
const WATCHDOG_MAX: Duration = Duration::from_secs(24);

/// The consumer's next message; `None` when the consumer ended, or is lost: quiet for `quiet`,
/// and NATS does not know it, does not answer for it (its node died without the consumer
/// noticing), or says it holds messages it has not delivered. Each quiet spell with the
/// consumer up and nothing pending doubles `quiet`; a message resets it.
async fn next_message(
    messages: &mut Messages,
    quiet: &mut Duration,
    stream: &Stream,
) -> Option<Read> {
    loop {
        match tokio::time::timeout(*quiet, messages.ordered.next()).await {
            Ok(next) => {
                *quiet = WATCHDOG;
                return next;
            }
            Err(_) if idle(stream, &messages.name).await => {
                *quiet = (*quiet * 2).min(WATCHDOG_MAX);
            }
            Err(_) => return None,
        }
    }
}

/// Whether NATS says the consumer is up with nothing left to deliver. Not asking the stream
/// whether it holds newer events: after a node dies, the host's publishes wait for the
/// stream's new leader, so a dead consumer looked idle and the wait kept doubling.
async fn idle(stream: &Stream, consumer: &str) -> bool {
    match tokio::time::timeout(CONSUMER_CHECK, stream.consumer_info(consumer)).await {
        Ok(Ok(info)) => info.num_pending == 0,
        Ok(Err(err)) => {
            tracing::debug!(error = %err, consumer, "a reader's consumer is not known");
            false
        }
        Err(_) => {
            tracing::debug!(consumer, "no answer for a reader's consumer");
            false
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
    /// The last event taken was `session.closed`: nothing follows.
    pub closed: bool,
}

impl Position {
    /// After RACP seq `last`, with the next message at stream sequence `resume_at`.
    pub fn after(last: u64, resume_at: u64) -> Self {
        Position {
            last,
            resume_at,
            errors: 0,
            closed: false,
        }
    }

    /// Enough failed reads in a row that the consumer is made anew.
    pub fn failing(&self) -> bool {
        self.errors >= CONSUMER_ERRORS
    }
}

/// A stream message as a reader takes it.
struct Entry {
    /// Its stream sequence: a new consumer starts after the last one read.
    stream_sequence: Option<u64>,
    /// Its session's epoch, from its header (none when the header is missing or unreadable).
    epoch: Option<Epoch>,
    /// Its RACP seq (0 when its header has none: such a message is skipped).
    seq: u64,
    /// It is `session.closed`, its session's last event.
    closes: bool,
    payload: bytes::Bytes,
}

impl Entry {
    fn read(message: jetstream::Message) -> Self {
        let headers = message.headers.as_ref();
        Entry {
            stream_sequence: message.info().ok().map(|info| info.stream_sequence),
            epoch: headers.and_then(epoch_header),
            seq: headers.and_then(seq_header).unwrap_or(0),
            closes: headers.is_some_and(closes),
            payload: message.payload.clone(),
        }
    }
}

/// Takes a batch's events in seq order, skipping those already sent. A gap (retention removed
/// events not read yet) or a message that is not a well-formed event (spliced into a frame as
/// it is, it would break or forge the frame) ends the batch: the events before it are taken,
/// so `at.last` is always the last event sent, and the error ends the subscription after them.
fn accept<E: std::fmt::Display>(
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
        if entry.closes {
            at.closed = true;
            break;
        }
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
fn with_arrived(
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

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::Value;

    type Read = Result<Entry, String>;

    fn entry(seq: u64, epoch: Option<Epoch>, payload: String) -> Read {
        Ok(Entry {
            stream_sequence: Some(100 + seq),
            epoch,
            seq,
            closes: false,
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
        Position::after(last, 0)
    }

    #[test]
    fn the_event_marked_closing_is_the_last_taken() {
        let mut closing = event(3).unwrap();
        closing.closes = true;
        let mut at = after(1);
        let (seqs, stop) = take(&mut at, vec![event(2), Ok(closing), event(4)]);
        assert_eq!(seqs, vec![2, 3]);
        assert!(stop.is_none() && at.closed && at.last == 3);
        // The text of an event never closes a session: only the host's header does.
        let mut at = after(1);
        let text = r#"{"seq":2,"type":"session.closed"}"#.to_string();
        let (seqs, _) = take(&mut at, vec![entry(2, Some(Epoch(7)), text)]);
        assert_eq!(seqs, vec![2]);
        assert!(!at.closed);
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
