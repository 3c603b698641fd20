//! The group-commit writer: one thread, one SQLite connection. It takes every batch of events
//! waiting in its queue, commits them in one transaction, and only then publishes them to the
//! sessions' in-memory logs. So an event is visible only once it is durable (docs/architecture.md, "Durable before visible"), and
//! many events share one fsync when producers are busy.

use super::{Session, log::LoggedEvent};
use crate::store::{self, HistoryPolicy, NewEvent, SessionBatch};
use racp_proto::Cursor;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot};

/// Events of one session waiting to be committed, in seq order.
pub struct QueuedBatch {
    pub session: Arc<Session>,
    pub events: Vec<(Arc<LoggedEvent>, super::HostEvent)>,
    /// Told the cursor of the last event once it is committed and published.
    pub done: Option<oneshot::Sender<Cursor>>,
}

/// Most pending batches taken into one transaction.
const MAX_GROUP: usize = 4096;
/// Prune the stored log of a session only when it is this far behind the memory window.
const PRUNE_SLACK: u64 = 1024;

pub fn spawn(
    mut conn: rusqlite::Connection,
    mut queue: mpsc::UnboundedReceiver<QueuedBatch>,
    committed: Arc<tokio::sync::Notify>,
    history: HistoryPolicy,
    commits: crate::metrics::Commits,
) -> std::io::Result<std::thread::JoinHandle<()>> {
    std::thread::Builder::new()
        .name("pi-host-writer".into())
        .spawn(move || {
            while let Some(first) = queue.blocking_recv() {
                let mut group = vec![first];
                while group.len() < MAX_GROUP {
                    match queue.try_recv() {
                        Ok(next) => group.push(next),
                        Err(_) => break,
                    }
                }
                let started = std::time::Instant::now();
                commit_until_done(&mut conn, &group, &history);
                commits.seconds.observe(started.elapsed().as_secs_f64());
                for pending in group {
                    count(&commits, &pending.events);
                    let cursor = pending.session.publish(pending.events);
                    if let Some(done) = pending.done {
                        let _ = done.send(cursor);
                    }
                }
                committed.notify_one();
            }
        })
}

/// Counts committed events, and the approvals they settle by outcome.
fn count(commits: &crate::metrics::Commits, events: &[(Arc<LoggedEvent>, super::HostEvent)]) {
    commits.appended.inc_by(events.len() as u64);
    for (_, event) in events {
        if let Some(outcome) = event.settled_outcome() {
            commits.settled(outcome);
        }
    }
}

/// Commits a group, retrying while the disk refuses: events already have their seqs, so
/// giving up would leave a gap. Producers wait meanwhile; nothing is published uncommitted.
fn commit_until_done(
    conn: &mut rusqlite::Connection,
    group: &[QueuedBatch],
    history: &HistoryPolicy,
) {
    // One part per session, so each session writes one chunk per commit: a session's batches
    // are queued in seq order, so appending them in queue order keeps each part consecutive.
    let mut batch: Vec<SessionBatch<'_>> = Vec::new();
    for queued in group {
        let id = queued.session.id.as_str();
        let index = match batch.iter().position(|part| part.session_id == id) {
            Some(index) => index,
            None => {
                batch.push(SessionBatch {
                    session_id: id,
                    events: Vec::new(),
                    prune_below: queued.session.prune_below(PRUNE_SLACK),
                });
                batch.len() - 1
            }
        };
        batch[index]
            .events
            .extend(queued.events.iter().map(|(e, event)| NewEvent {
                seq: e.seq,
                at: e.at,
                json: &e.json,
                history: event.in_history(),
            }));
    }
    let mut delay = Duration::from_millis(10);
    loop {
        match store::commit_events(conn, &batch, history, racp_server::clock::now_ms()) {
            Ok(()) => return,
            Err(err) => {
                tracing::error!(error = %err, "cannot commit events; retrying");
                std::thread::sleep(delay);
                delay = (delay * 2).min(Duration::from_secs(2));
            }
        }
    }
}
