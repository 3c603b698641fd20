//! Publishes every committed event to the host's JetStream stream, one subject per session, so
//! a gateway replays and follows sessions without asking the host (docs/protocol.md §15.3).
//!
//! Only committed events are published (they come from the sessions' logs, which hold nothing
//! uncommitted), in seq order per session. Publishes are pipelined, and each carries the id of
//! the one before it as `Nats-Expected-Last-Msg-Id`: when a link dies with messages in flight,
//! JetStream refuses everything after the first one lost instead of storing a stream with a
//! hole (the relay publishes one session at a time, so the stream's last message is always the
//! relay's previous one). Where to resume is read from the stream itself (the
//! last message on the session's subject), so a restart publishes nothing twice; a message that
//! is published again anyway (a lost ack) carries the same `Nats-Msg-Id` and is dropped by
//! JetStream's duplicate window.

use super::Retry;
use crate::sessions::Session;
use crate::state::HostState;
use async_nats::jetstream::{self, stream::Stream};
use racp_proto::gateway::{CLOSED_HEADER, EPOCH_HEADER, SEQ_HEADER, events_stream, events_subject};
use racp_server::fanout::SharedLog;
use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

/// Events published before their acks are awaited.
const BATCH_EVENTS: usize = 256;
const BATCH_BYTES: usize = 1 << 20;
/// Look at every session this often even without a commit (a missed wake-up costs no more).
const SWEEP: Duration = Duration::from_secs(5);
/// How long reading a session's last event in the stream may take before it is asked again: a
/// read that went to a NATS node as it died is never answered, and waiting out the client's
/// request timeout (10 s) held every event back that long after a node loss.
const MARK_READ: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
enum RelayError {
    #[error("cannot read the stream's last event of session {session}: {reason}")]
    Mark { session: String, reason: String },
    #[error("JetStream did not take an event: {0}")]
    Publish(String),
}

pub async fn run(state: Arc<HostState>, client: async_nats::Client) {
    let jetstream = jetstream::new(client);
    let stream = jetstream
        .get_stream_no_info(events_stream(&state.host_id))
        .await;
    let stream = match stream {
        Ok(stream) => stream,
        Err(err) => {
            tracing::error!(error = %err, "cannot address the host's events stream");
            return;
        }
    };
    let committed = state.sessions.committed();
    // Seq of the last event JetStream holds, per session (learnt from the stream at first).
    let mut marks: HashMap<String, u64> = HashMap::new();
    // The message id of the relay's last publish, when it is known to be the stream's last.
    let mut last_id: Option<String> = None;
    let mut retry = Retry::new();
    let mut warned = false;
    loop {
        let mut failed = None;
        for session in state.sessions.list() {
            let relayed = relay_session(
                &jetstream,
                &stream,
                &state.host_id,
                &session,
                &mut marks,
                &mut last_id,
            );
            if let Err(error) = relayed.await {
                failed = Some(error);
                break;
            }
        }
        match failed {
            None => {
                retry.reset();
                warned = false;
                let _ = tokio::time::timeout(SWEEP, committed.notified()).await;
            }
            Some(error) => {
                tracing::debug!(%error, "relay retry");
                if !warned {
                    tracing::warn!(%error, "cannot publish events to the gateway; retrying");
                    warned = true;
                }
                // The mark of a failed session is learnt again: some of its events may have
                // landed before the failure (a prefix: see the module comment).
                marks.clear();
                last_id = None;
                retry.wait().await;
            }
        }
    }
}

/// Publishes what the session has committed beyond its mark.
async fn relay_session(
    jetstream: &jetstream::Context,
    stream: &Stream<()>,
    host_id: &str,
    session: &Session,
    marks: &mut HashMap<String, u64>,
    last_id: &mut Option<String>,
) -> Result<(), RelayError> {
    let subject = events_subject(host_id, &session.id);
    let mut mark = match marks.get(&session.id) {
        Some(mark) => *mark,
        None => last_published(stream, &subject, &session.id).await?,
    };
    let epoch = session.head_cursor().epoch;
    loop {
        let slice = session.next_after(mark, BATCH_EVENTS, BATCH_BYTES);
        let Some(events) = slice.events else {
            // Older events left the host's window before they could be published; the
            // gateway answers CURSOR_EXPIRED for cursors in the gap.
            tracing::warn!(session_id = %session.id, from = mark, to = slice.oldest,
                "events left the host's log before reaching the gateway");
            mark = slice.oldest;
            continue;
        };
        if events.is_empty() {
            break;
        }
        let mut acks = Vec::with_capacity(events.len());
        for event in &events {
            let mut headers = async_nats::HeaderMap::new();
            headers.insert(SEQ_HEADER, event.seq.to_string());
            headers.insert(EPOCH_HEADER, format!("{:016x}", epoch.0));
            // A closed session's head is its `session.closed`: nothing follows it.
            if slice.closed && event.seq == slice.head {
                headers.insert(CLOSED_HEADER, "1");
            }
            let id = format!("{}:{:016x}:{}", session.id, epoch.0, event.seq);
            if let Some(previous) = last_id.take() {
                headers.insert(async_nats::header::NATS_EXPECTED_LAST_MESSAGE_ID, previous);
            }
            headers.insert(async_nats::header::NATS_MESSAGE_ID, id.clone());
            *last_id = Some(id);
            let body = bytes::Bytes::copy_from_slice(event.json.as_bytes());
            let ack = jetstream
                .publish_with_headers(subject.clone(), headers, body)
                .await
                .map_err(|e| RelayError::Publish(e.to_string()))?;
            acks.push(ack);
        }
        for ack in acks {
            ack.await.map_err(|e| RelayError::Publish(e.to_string()))?;
        }
        if let Some(last) = events.last() {
            mark = last.seq;
        }
        marks.insert(session.id.clone(), mark);
    }
    marks.insert(session.id.clone(), mark);
    Ok(())
}

/// The seq of the session's last event in the stream, 0 when it has none.
async fn last_published(
    stream: &Stream<()>,
    subject: &str,
    session_id: &str,
) -> Result<u64, RelayError> {
    let read = tokio::time::timeout(MARK_READ, stream.direct_get_last_for_subject(subject));
    let read = read.await.map_err(|_| RelayError::Mark {
        session: session_id.to_string(),
        reason: format!("no answer within {MARK_READ:?}"),
    })?;
    match read {
        Ok(message) => Ok(message
            .headers
            .get(SEQ_HEADER)
            .and_then(|seq| seq.as_str().parse().ok())
            .unwrap_or(0)),
        Err(err) if err.kind() == jetstream::stream::DirectGetErrorKind::NotFound => Ok(0),
        Err(err) => Err(RelayError::Mark {
            session: session_id.to_string(),
            reason: err.to_string(),
        }),
    }
}
