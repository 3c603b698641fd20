//! Sessions: their state, their event logs, and how events get from a producer to subscribers.
//!
//! Producers call [`Sessions::append`]: seqs are assigned under the session's lock and the batch
//! goes to the group-commit writer in the same critical section, so the writer sees each
//! session's events in seq order. The writer commits, then [`Session::publish`]es: the events
//! enter the in-memory log, the session's snapshot state changes, and subscribed connections are
//! woken. Connections pull from the log at their own pace, so a slow subscriber never slows
//! the producer or anyone else (docs/architecture.md, "Decisions").

mod event;
pub mod history;
pub use racp_server::log;
mod view;
mod writer;

pub use event::HostEvent;

use crate::store::{SessionRow, Store, StoreError};
use dashmap::DashMap;
use log::{EventLog, LoggedEvent, Retention};
use racp_proto::events::{Event, EventType};
use racp_proto::methods::session::{SessionInfo, SessionSettings, SessionState, Snapshot};
use racp_proto::pi::stream::StreamState;
use racp_proto::{AppError, Cursor, Epoch, ErrorCode};
use racp_server::clock::now_ms;
use racp_server::fanout::{SharedLog, Slice};
use serde::Serialize;
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::sync::{Notify, mpsc, oneshot};
use view::View;

pub struct Session {
    pub id: String,
    pub workspace: String,
    pub created_at: u64,
    inner: Mutex<Inner>,
}

struct Inner {
    log: EventLog,
    /// Seq the next appended event gets (may run ahead of the committed head).
    next_seq: u64,
    /// True once `session.closed` is appended (committed or not): no event may follow it.
    closing: bool,
    /// The snapshot state as of the last published event.
    view: View,
    watchers: Vec<(u64, Arc<Notify>)>,
    /// Seq below which the stored log was last pruned.
    pruned_below: u64,
}

impl Session {
    fn new(row: &SessionRow, log: EventLog, view: View) -> Arc<Session> {
        Arc::new(Session {
            id: row.session_id.clone(),
            workspace: row.workspace.clone(),
            created_at: row.created_at,
            inner: Mutex::new(Inner {
                pruned_below: log.oldest_seq() + 1,
                next_seq: log.head() + 1,
                log,
                closing: view.closed,
                view,
                watchers: Vec::new(),
            }),
        })
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A panic while holding this lock is a bug; the state is still consistent enough to
        // keep serving (every mutation is a push or an assignment), so recover the guard.
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn head_cursor(&self) -> Cursor {
        self.lock().log.head_cursor()
    }

    /// True once `session.closed` has been appended (committed or not).
    pub fn is_closing(&self) -> bool {
        self.lock().closing
    }

    /// Whether any turn ever started (so an agent may have left a session file to resume).
    pub fn has_turns(&self) -> bool {
        !self.lock().view.turns.is_empty()
    }

    /// The follow-ups waiting for their turn, as the log shows them.
    pub fn queued_follow_ups(&self) -> Vec<racp_proto::methods::session::QueuedFollowUp> {
        self.lock().view.queue.follow_ups.clone()
    }

    pub fn active_turn(&self) -> Option<String> {
        self.lock().view.active_turn.clone()
    }

    pub fn info(&self) -> SessionInfo {
        let inner = self.lock();
        self.info_locked(&inner)
    }

    fn info_locked(&self, inner: &Inner) -> SessionInfo {
        SessionInfo {
            session_id: self.id.clone(),
            workspace: self.workspace.clone(),
            title: inner.view.title.clone(),
            state: state_of(inner),
            created_at: self.created_at,
            cursor: inner.log.head_cursor(),
            active_turn_id: inner.view.active_turn.clone(),
            settings: inner.view.settings.clone(),
        }
    }

    /// The model, thinking level and auto-compaction a client set (absent: the agent's own).
    pub fn settings(&self) -> SessionSettings {
        self.lock().view.settings.clone()
    }

    /// The session, a snapshot of its state, and the cursor the snapshot was taken at, all read
    /// under one lock so that subscribing from the cursor continues exactly after the snapshot.
    /// Its `history` is left empty: the store holds it, read up to the cursor
    /// ([`history::page`]).
    pub fn snapshot(&self) -> (SessionInfo, Snapshot, Cursor) {
        let mut inner = self.lock();
        let stream = inner.view.stream();
        let (streaming_message, tool_outputs) =
            (stream.message().cloned(), stream.tool_outputs().clone());
        let snapshot = Snapshot {
            state: state_of(&inner),
            turns: inner.view.turns.clone(),
            pending_approvals: inner.view.pending_approvals.clone(),
            grants: inner.view.grants.clone(),
            queue: inner.view.queue.clone(),
            streaming_message,
            tool_outputs,
            history: Default::default(),
        };
        (self.info_locked(&inner), snapshot, inner.log.head_cursor())
    }

    /// What was streaming as of `cursor` (`session/stream`): rebuilt from the retained events of
    /// the turn running there, from its `turn.started` on. CURSOR_EXPIRED when the cursor is
    /// outside the window, or when that turn began before it (then only a snapshot can say).
    pub fn stream_at(&self, cursor: Cursor) -> Result<StreamState, AppError> {
        let mut inner = self.lock();
        inner.log.check_cursor(cursor)?;
        if cursor.seq == inner.log.head() {
            return Ok(inner.view.stream().clone());
        }
        let mut since_turn_start = Vec::new();
        let mut turn_start_seen = false;
        for logged in inner.log.back_from(cursor.seq) {
            let Ok(event) = serde_json::from_str::<Event>(&logged.json) else {
                continue;
            };
            if event.kind == EventType::TurnStarted.as_str() {
                turn_start_seen = true;
                break;
            }
            since_turn_start.push(event);
        }
        // Without a turn.started, the events up to the cursor are the whole story only when the
        // window still begins at the epoch's first event.
        if !turn_start_seen && inner.log.oldest_seq() > 0 {
            let log = &inner.log;
            return Err(racp_proto::Expired::StreamOlderThanWindow.error(
                log.head_cursor().epoch,
                log.oldest_seq(),
                log.head(),
            ));
        }
        let mut stream = StreamState::default();
        for event in since_turn_start.iter().rev() {
            stream.apply_event(event);
        }
        Ok(stream)
    }

    /// Checks that replay can start after `cursor`.
    pub fn check_cursor(&self, cursor: Cursor) -> Result<(), AppError> {
        self.lock().log.check_cursor(cursor)
    }

    /// True while a connection is subscribed to the session.
    pub fn has_watchers(&self) -> bool {
        !self.lock().watchers.is_empty()
    }

    /// True while an approval waits for an answer.
    pub fn pending_approval_count(&self) -> usize {
        self.lock().view.pending_approvals.len()
    }

    pub fn has_pending_approvals(&self) -> bool {
        !self.lock().view.pending_approvals.is_empty()
    }

    /// Makes committed events visible: the log, the snapshot state, then the watchers. Each
    /// event comes with the typed body it was encoded from, so nothing is parsed again here.
    fn publish(&self, events: Vec<(Arc<LoggedEvent>, HostEvent)>) -> Cursor {
        let now = now_ms();
        let mut inner = self.lock();
        for (logged, event) in events {
            let at = logged.at;
            inner.log.push(logged, now);
            inner.view.apply(&self.id, event, at);
        }
        for (_, notify) in &inner.watchers {
            notify.notify_one();
        }
        inner.log.head_cursor()
    }

    /// The seq to prune the stored log below, when it lags the memory window by `slack`.
    fn prune_below(&self, slack: u64) -> Option<u64> {
        let mut inner = self.lock();
        let oldest_event = inner.log.oldest_seq() + 1;
        if oldest_event > inner.pruned_below + slack {
            inner.pruned_below = oldest_event;
            Some(oldest_event)
        } else {
            None
        }
    }
}

/// Subscribers read the committed log (racp-server/src/fanout.rs).
impl SharedLog for Session {
    fn session_id(&self) -> &str {
        &self.id
    }

    fn epoch(&self) -> Epoch {
        self.lock().log.epoch()
    }

    fn next_after(&self, after_seq: u64, max_count: usize, max_bytes: usize) -> Slice {
        let inner = self.lock();
        Slice::of(
            &inner.log,
            after_seq,
            max_count,
            max_bytes,
            inner.view.closed,
            None,
        )
    }

    fn watch(&self, watcher: u64, notify: Arc<Notify>) {
        self.lock().watchers.push((watcher, notify));
    }

    fn unwatch(&self, watcher: u64) {
        self.lock().watchers.retain(|(w, _)| *w != watcher);
    }
}

fn state_of(inner: &Inner) -> SessionState {
    if inner.view.closed {
        SessionState::Closed
    } else if inner.view.active_turn.is_some() {
        SessionState::Running
    } else {
        SessionState::Idle
    }
}

#[derive(Debug, thiserror::Error)]
pub enum SessionsError {
    #[error(transparent)]
    Store(#[from] StoreError),
    #[error("cannot start the event writer: {0}")]
    Writer(std::io::Error),
}

/// Every session of the host.
pub struct Sessions {
    map: DashMap<String, Arc<Session>>,
    writer: Mutex<Option<mpsc::UnboundedSender<writer::QueuedBatch>>>,
    writer_thread: Mutex<Option<std::thread::JoinHandle<()>>>,
    retention: Retention,
    /// Woken after each group of events is published: the gateway relay (src/uplink/relay.rs)
    /// follows every session without being a subscriber of any.
    committed: Arc<Notify>,
}

impl Sessions {
    /// Loads every session and its retained log tail, and starts the writer.
    pub fn open(
        store: &Store,
        db_path: &std::path::Path,
        retention: Retention,
        history: crate::store::HistoryPolicy,
        commits: crate::metrics::Commits,
    ) -> Result<Sessions, SessionsError> {
        let map = DashMap::new();
        for row in store.sessions()? {
            let session = restore(store, &row, retention)?;
            map.insert(row.session_id, session);
        }
        let (tx, rx) = mpsc::unbounded_channel();
        let conn = crate::store::connect(db_path)?;
        let committed = Arc::new(Notify::new());
        let thread = writer::spawn(conn, rx, committed.clone(), history, commits)
            .map_err(SessionsError::Writer)?;
        Ok(Sessions {
            map,
            writer: Mutex::new(Some(tx)),
            writer_thread: Mutex::new(Some(thread)),
            retention,
            committed,
        })
    }

    /// Notified after every published group of events (one stored wake-up when nobody waits).
    pub fn committed(&self) -> Arc<Notify> {
        self.committed.clone()
    }

    pub fn get(&self, session_id: &str) -> Option<Arc<Session>> {
        self.map.get(session_id).map(|s| s.value().clone())
    }

    /// The session, or SESSION_NOT_FOUND.
    pub fn find(&self, session_id: &str) -> Result<Arc<Session>, AppError> {
        self.get(session_id).ok_or_else(|| {
            AppError::new(ErrorCode::SessionNotFound, "no such session")
                .with_details(serde_json::json!({"sessionId": session_id}))
        })
    }

    pub fn list(&self) -> Vec<Arc<Session>> {
        let mut sessions: Vec<_> = self.map.iter().map(|s| s.value().clone()).collect();
        sessions.sort_by(|a, b| (a.created_at, &a.id).cmp(&(b.created_at, &b.id)));
        sessions
    }

    pub fn create(&self, store: &Store, row: SessionRow) -> Result<Arc<Session>, StoreError> {
        store.insert_session(&row)?;
        let log = EventLog::new(Epoch(row.epoch), 0, self.retention);
        let session = Session::new(&row, log, View::of_new(&row));
        self.map.insert(row.session_id, session.clone());
        Ok(session)
    }

    /// Appends events and waits until they are committed and published; returns the cursor
    /// after the last one.
    pub async fn commit(
        &self,
        session: &Arc<Session>,
        events: Vec<HostEvent>,
    ) -> Result<Cursor, AppError> {
        self.append(session, events)?
            .await
            .map_err(|_| shutting_down())
    }

    /// Queues events for commit; the receiver yields the cursor after the last one once it is
    /// committed and published. Refused once the session is closing, and as a whole when an
    /// event cannot be encoded (nothing of the batch is stored).
    pub fn append(
        &self,
        session: &Arc<Session>,
        events: Vec<HostEvent>,
    ) -> Result<oneshot::Receiver<Cursor>, AppError> {
        let (done, committed) = oneshot::channel();
        let writer = self
            .writer
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
            .ok_or_else(shutting_down)?;
        let mut inner = session.lock();
        if inner.closing {
            return Err(
                AppError::new(racp_proto::ErrorCode::Conflict, "the session is closed")
                    .with_details(serde_json::json!({"sessionId": session.id})),
            );
        }
        let epoch = inner.log.epoch();
        let at = now_ms();
        let mut logged = Vec::with_capacity(events.len());
        // One buffer for the batch: each event then costs one allocation of its exact size
        // instead of a growing String and a shrink.
        let mut buf = Vec::with_capacity(1 << 10);
        let first_seq = inner.next_seq;
        for (offset, event) in events.into_iter().enumerate() {
            let seq = first_seq + offset as u64;
            buf.clear();
            encode(&event, seq, Cursor::new(epoch, seq), at, &mut buf)?;
            let json: Box<str> = std::str::from_utf8(&buf)
                .map_err(|e| unencodable(&event, e))?
                .into();
            logged.push((Arc::new(LoggedEvent { seq, at, json }), event));
        }
        inner.next_seq = first_seq + logged.len() as u64;
        inner.closing |= logged.iter().any(|(_, event)| event.closes_session());
        writer
            .send(writer::QueuedBatch {
                session: session.clone(),
                events: logged,
                done: Some(done),
            })
            .map_err(|_| shutting_down())?;
        Ok(committed)
    }

    /// Stops taking events, commits what is queued, and waits for the writer to finish.
    pub fn flush_and_stop(&self) {
        self.writer.lock().unwrap_or_else(|p| p.into_inner()).take();
        let thread = self
            .writer_thread
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        if let Some(thread) = thread {
            let _ = thread.join();
        }
    }
}

fn shutting_down() -> AppError {
    AppError::new(
        racp_proto::ErrorCode::HostShuttingDown,
        "the host is shutting down; the call was not started",
    )
}

/// An event as it goes on the wire, with its `data` spliced in as JSON text.
#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct WireEvent<'a> {
    seq: u64,
    cursor: Cursor,
    #[serde(rename = "type")]
    kind: event::EventTypeName<'a>,
    at: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    turn_id: Option<&'a str>,
    data: event::WireData<'a>,
}

fn encode(
    event: &HostEvent,
    seq: u64,
    cursor: Cursor,
    at: u64,
    buf: &mut Vec<u8>,
) -> Result<(), AppError> {
    let wire = WireEvent {
        seq,
        cursor,
        kind: event.kind(),
        at,
        turn_id: event.turn_id(),
        data: event.data(),
    };
    serde_json::to_writer(buf, &wire).map_err(|e| unencodable(event, e))
}

/// An event that cannot be encoded: nothing of its batch is stored.
fn unencodable(event: &HostEvent, err: impl std::fmt::Display) -> AppError {
    racp_server::wire::unencodable(&format!("a {} event", event.kind()), err)
}

/// A session as it was before a restart: its retained log, and the snapshot state rebuilt by
/// applying each stored event as it was once published, then corrected by the store.
fn restore(
    store: &Store,
    row: &SessionRow,
    retention: Retention,
) -> Result<Arc<Session>, StoreError> {
    let head = store.event_head(&row.session_id)?;
    let tail = store.event_tail(&row.session_id, retention.max_events)?;
    let now = now_ms();
    // Older events may have been pruned: the log starts just before the first kept one.
    let start = tail.first().map_or(head, |e| e.seq - 1);
    let mut log = EventLog::new(Epoch(row.epoch), start, retention);
    // What the row holds (its title, its settings) before the log says anything: a title given
    // at `session/create` has no event of its own.
    let mut view = View::of_new(row);
    for event in tail {
        if let Some(stored) = serde_json::from_str::<Event>(&event.json)
            .ok()
            .and_then(HostEvent::from_stored)
        {
            view.apply(&row.session_id, stored, event.at);
        }
        log.push(
            Arc::new(LoggedEvent {
                seq: event.seq,
                at: event.at,
                json: event.json.into_boxed_str(),
            }),
            now,
        );
    }
    let still_pending = store
        .pending_approvals(&row.session_id)
        .unwrap_or_else(|err| {
            tracing::warn!(session_id = %row.session_id, error = %err, "cannot read the approvals left pending");
            Vec::new()
        });
    let grants = store.grants(&row.session_id).unwrap_or_else(|err| {
        tracing::warn!(session_id = %row.session_id, error = %err, "cannot read the session's grants");
        Vec::new()
    });
    view.reconcile(row, &still_pending, grants);
    if view.closed && !row.closed {
        // The host stopped between committing `session.closed` and marking the row.
        store.mark_session_closed(&row.session_id, now)?;
    }
    Ok(Session::new(row, log, view))
}
