//! A session's workspace as the desktop sees it (docs/protocol.md §8.9, §7.34, §7.35): one
//! watcher per distinct workspace of the open sessions (`watch.rs`), shared by its sessions,
//! started at the host's start and at `session/create`, stopped when its last session closes;
//! what a running turn's workspace saw change (for `turn.finished`'s `files`, `turn.rs`); and
//! the workspace's git (`git.rs`).

pub mod git;
mod ignore;
pub mod turn;
mod watch;

pub use ignore::Ignore;

use crate::models::ModelHost;
use crate::sessions::{HostEvent, Session};
use racp_proto::methods::workspace::{ChangeKind, FileChange, WorkspaceChangedData};
use racp_proto::pi::Kind;
use racp_proto::pi::event::FileTool;
use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};

/// What the watchers need of the host (state.rs implements it), so that the host owns its
/// workspaces without the watchers knowing the host's state: its sessions (to record what
/// changed) and, through [`ModelHost`], its configuration.
pub trait WatchHost: ModelHost {
    fn sessions(&self) -> &crate::sessions::Sessions;
    /// The workspaces' watchers and what each running turn changed.
    fn workspaces(&self) -> &Workspaces;
}

/// A shared host is a host.
impl<T: WatchHost> WatchHost for Arc<T> {
    fn sessions(&self) -> &crate::sessions::Sessions {
        (**self).sessions()
    }
    fn workspaces(&self) -> &Workspaces {
        (**self).workspaces()
    }
}

/// Running turns' records, by turn id.
type Records = Arc<Mutex<TurnRecords>>;

/// How many ended turns are remembered as ended: a change the watcher reads between a turn's
/// end and its `turn.finished` being applied must not start a record nobody takes.
const ENDED_TURNS: usize = 64;

#[derive(Default)]
struct TurnRecords {
    open: HashMap<String, turn::Record>,
    ended: VecDeque<String>,
}

impl TurnRecords {
    /// The running turn's record (`None` for a turn that ended).
    fn of(&mut self, turn_id: &str) -> Option<&mut turn::Record> {
        if self.ended.iter().any(|t| t == turn_id) {
            return None;
        }
        Some(self.open.entry(turn_id.to_string()).or_default())
    }

    fn take(&mut self, turn_id: &str) -> Option<turn::Record> {
        if self.ended.len() >= ENDED_TURNS {
            self.ended.pop_front();
        }
        self.ended.push_back(turn_id.to_string());
        self.open.remove(turn_id)
    }
}

/// The watched workspaces of the host, by canonical path, and what each running turn changed.
#[derive(Default)]
pub struct Workspaces {
    watched: Mutex<HashMap<PathBuf, Watched>>,
    records: Records,
}

struct Watched {
    shared: Arc<Shared>,
    watcher: watch::Watcher,
}

/// What a workspace's watcher shares with the host: the sessions it reports to, and what it
/// saw change during each one's running turn.
pub(crate) struct Shared {
    sessions: Mutex<Vec<Arc<Session>>>,
    records: Records,
}

fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(|p| p.into_inner())
}

impl Shared {
    fn sessions(&self) -> Vec<Arc<Session>> {
        lock(&self.sessions).clone()
    }

    /// True when one of the workspace's sessions runs the turn `turn_id`.
    fn runs(&self, turn_id: &str) -> bool {
        lock(&self.sessions)
            .iter()
            .any(|session| session.active_turn().as_deref() == Some(turn_id))
    }

    /// A change seen as the kernel reported it, before any window: a turn that ends right
    /// after a write still counts it.
    fn record(&self, path: &str, kind: ChangeKind) {
        let turns: Vec<String> = lock(&self.sessions)
            .iter()
            .filter_map(|session| session.active_turn())
            .collect();
        let mut records = lock(&self.records);
        for turn_id in turns {
            if let Some(record) = records.of(&turn_id) {
                record.disk(path, kind);
            }
        }
    }
}

impl Workspaces {
    /// Watches `session`'s workspace for it (a no-op for a closed session, or one already
    /// watched): once it returns, a change is seen. Blocking (the first session of a
    /// workspace walks its tree) and in the runtime (the watcher is a task): run it on the
    /// blocking pool ([`Workspaces::watch_from`]).
    pub fn watch<H: WatchHost>(&self, host: &Arc<H>, session: &Arc<Session>) {
        if session.is_closing() {
            return;
        }
        let root = PathBuf::from(&session.workspace);
        let mut watched = lock(&self.watched);
        if let Some(entry) = watched.get(&root) {
            let mut sessions = lock(&entry.shared.sessions);
            if !sessions.iter().any(|s| s.id == session.id) {
                sessions.push(session.clone());
            }
            return;
        }
        let shared = Arc::new(Shared {
            sessions: Mutex::new(vec![session.clone()]),
            records: self.records.clone(),
        });
        let watcher = watch::start(host.clone(), root.clone(), shared.clone());
        watched.insert(root, Watched { shared, watcher });
    }

    /// [`Workspaces::watch`] from a task, on the blocking pool; returns once it watches.
    pub async fn watch_from<H: WatchHost>(host: &Arc<H>, session_id: &str) {
        let Some(session) = host.sessions().get(session_id) else {
            return;
        };
        let host = host.clone();
        let watching =
            tokio::task::spawn_blocking(move || host.workspaces().watch(&host, &session));
        if let Err(err) = watching.await {
            tracing::warn!(error = %err, "the workspace's watcher did not start");
        }
    }

    /// Every open session's workspace, at the host's start, before it listens; each open
    /// session is told with a `rescan` (`host_restarted`) that what changed while no host
    /// watched is not in its log.
    pub async fn watch_open<H: WatchHost>(host: &Arc<H>) {
        let host = host.clone();
        let watching = tokio::task::spawn_blocking(move || {
            for session in host.sessions().list() {
                if session.is_closing() {
                    continue;
                }
                host.workspaces().watch(&host, &session);
                let unseen = HostEvent::of_session(WorkspaceChangedData {
                    changes: Vec::new(),
                    rescan: true,
                    reason: Some("host_restarted".into()),
                    rescan_path: Some(String::new()),
                });
                if let Err(err) = host.sessions().append(&session, vec![unseen]) {
                    tracing::warn!(session_id = %session.id, error = %err, "the restart's rescan not recorded");
                }
            }
        });
        if let Err(err) = watching.await {
            tracing::warn!(error = %err, "the workspaces' watchers did not start");
        }
    }

    /// Stops reporting to `session`; the watcher stops with its last session.
    pub fn unwatch(&self, session: &Session) {
        let mut watched = lock(&self.watched);
        let root = PathBuf::from(&session.workspace);
        let Some(entry) = watched.get(&root) else {
            return;
        };
        if let Some(turn_id) = session.active_turn() {
            lock(&self.records).take(&turn_id);
        }
        let empty = {
            let mut sessions = lock(&entry.shared.sessions);
            sessions.retain(|s| s.id != session.id);
            sessions.is_empty()
        };
        if empty && let Some(entry) = watched.remove(&root) {
            entry.watcher.stop();
        }
    }

    /// How many workspaces are watched (for tests and `status`).
    pub fn count(&self) -> usize {
        lock(&self.watched).len()
    }

    /// A `tool_execution_start` or `_end` of the turn `turn_id` (the driver's pump).
    pub fn tool_event(&self, session: &Session, turn_id: &str, kind: &Kind, payload: &str) {
        if !matches!(kind, Kind::ToolExecutionStart | Kind::ToolExecutionEnd) {
            return;
        }
        let Some(tool) = FileTool::read(kind, payload) else {
            return;
        };
        let root = PathBuf::from(&session.workspace);
        if let Some(record) = lock(&self.records).of(turn_id) {
            record.tool(&root, tool);
        }
    }

    /// The files the turn `turn_id` changed, and the end of its record. What the kernel
    /// queued before now is read first: a tool's write right before the turn's end is the
    /// turn's, even when the watcher's task has not run since.
    pub fn take_turn(&self, turn_id: &str) -> Vec<FileChange> {
        for entry in lock(&self.watched).values() {
            if entry.shared.runs(turn_id) {
                entry.watcher.catch_up(&entry.shared);
            }
        }
        lock(&self.records)
            .take(turn_id)
            .map(turn::Record::files)
            .unwrap_or_default()
    }
}

/// The host's own files, canonical where they exist: never watched.
fn protected(host: &impl WatchHost) -> Vec<PathBuf> {
    let mut paths = host.config().protected_paths();
    let canonical: Vec<PathBuf> = paths
        .iter()
        .filter_map(|p| std::fs::canonicalize(p).ok())
        .collect();
    paths.extend(canonical);
    paths
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_change_after_a_turns_end_starts_no_record() {
        let mut records = TurnRecords::default();
        assert!(records.of("turn_1").is_some());
        assert!(records.take("turn_1").is_some());
        assert!(records.of("turn_1").is_none(), "ended: no new record");
        assert!(records.open.is_empty());
        // The memory of ended turns is bounded.
        for i in 0..ENDED_TURNS + 1 {
            records.take(&format!("t{i}"));
        }
        assert_eq!(records.ended.len(), ENDED_TURNS);
    }
}
