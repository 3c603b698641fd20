//! One workspace's watcher: inotify on its directories (bounded, none the ignore rules leave
//! out, none of the host's own), the kernel's events gathered over a short window into one
//! `workspace.changed` event per window, appended to the log of every session of the
//! workspace (docs/protocol.md §8.9).

use super::Shared;
use super::WatchHost;
use super::ignore::Ignore;
use crate::models::ModelHost;
use crate::sessions::HostEvent;
use futures_util::StreamExt;
use inotify::{EventMask, Inotify, WatchMask, Watches};
use racp_proto::limits::MAX_CHANGES_PER_EVENT;
use racp_proto::methods::workspace::{ChangeKind, PathChange, WorkspaceChangedData};
use std::collections::HashMap;
use std::io;
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::task::{Context, Poll, Waker};
use std::time::Duration;
use tokio::sync::Notify;
use tokio::time::Instant;

/// How long changes gather before they are one event: a burst (a build, a checkout, an agent
/// writing ten files) becomes one event, and a change still reaches a client within it.
pub const WINDOW: Duration = Duration::from_millis(150);

/// The kernel's queue is read through a buffer of this many bytes at a time.
const READ_BUFFER: usize = 64 << 10;

const MASK: WatchMask = WatchMask::CREATE
    .union(WatchMask::DELETE)
    .union(WatchMask::MODIFY)
    .union(WatchMask::CLOSE_WRITE)
    .union(WatchMask::MOVED_FROM)
    .union(WatchMask::MOVED_TO)
    .union(WatchMask::ATTRIB)
    .union(WatchMask::DONT_FOLLOW)
    .union(WatchMask::ONLYDIR)
    .union(WatchMask::EXCL_UNLINK);

/// The watched tree: each watch's directory (relative, `""` the top), and the rules.
struct Tree {
    root: PathBuf,
    watches: Watches,
    dirs: HashMap<i32, String>,
    ignore: Ignore,
    /// The host's own directories and files: never watched, never reported.
    protected: Vec<PathBuf>,
    max_dirs: usize,
    /// The directory bound was reached: some directories are not watched.
    full: bool,
}

/// Changes of the current window, in the order first seen, each path once.
#[derive(Default)]
struct Window {
    changes: Vec<PathChange>,
    index: HashMap<String, usize>,
    /// A `MOVED_FROM` waiting for its `MOVED_TO` (same cookie).
    moved_from: HashMap<u32, (String, bool)>,
    rescan: Option<(&'static str, String)>,
    /// More paths than one event names changed in this window.
    overfull: bool,
    /// Entries created and removed again within the window: nothing to show.
    vanished: std::collections::HashSet<usize>,
}

/// The kernel's queue as a stream of events (inotify's own, under tokio's reactor).
type Reader = inotify::EventStream<Vec<u8>>;

/// A running watcher as the host holds it: its task, and what the task reads from, so that a
/// turn's end can read what the kernel queued before it ([`Watcher::catch_up`]).
pub(super) struct Watcher {
    task: tokio::task::JoinHandle<()>,
    /// `None` when inotify could not start (the sessions were told with a rescan).
    reading: Option<Arc<Reading>>,
}

/// The watcher's state, read from by its task when the kernel's queue is ready and by a
/// turn's end, whichever comes first: every change the kernel queued before a turn ended is
/// in that turn's record, however busy the runtime (docs/protocol.md §8.9).
struct Reading {
    state: Mutex<Follower>,
    /// Wakes the task after a read from outside: that read took the queue's wake-up, and may
    /// have started a window the task must flush.
    woken: Notify,
}

struct Follower {
    reader: Reader,
    tree: Tree,
    window: Window,
    /// When the window's first change was read: it is flushed `WINDOW` later.
    since: Option<Instant>,
}

fn lock(state: &Mutex<Follower>) -> MutexGuard<'_, Follower> {
    state.lock().unwrap_or_else(|p| p.into_inner())
}

/// Watches `root`'s tree now (so a change made once this returns is seen), then follows it on
/// a task until the task is stopped (its last session closed) or inotify fails. Blocking: the
/// walk reads every directory of the tree, within the bound.
pub(super) fn start<H: WatchHost>(host: Arc<H>, root: PathBuf, shared: Arc<Shared>) -> Watcher {
    let mut window = Window::default();
    let reader = Inotify::init().and_then(|inotify| {
        let watches = inotify.watches();
        Ok((watches, inotify.into_event_stream(vec![0u8; READ_BUFFER])?))
    });
    let (watches, reader) = match reader {
        Ok(started) => started,
        Err(err) => {
            tracing::warn!(workspace = %root.display(), error = %err, "cannot watch the workspace");
            window.rescan("watch_failed", "");
            report(&host, &shared, window.take());
            return Watcher {
                task: tokio::spawn(async {}),
                reading: None,
            };
        }
    };
    let mut tree = Tree {
        ignore: Ignore::of(&root),
        protected: super::protected(&host),
        root,
        watches,
        dirs: HashMap::new(),
        max_dirs: host.config().max_watched_dirs,
        full: false,
    };
    tree.add_tree("", &mut window, false);
    if window.rescan.is_some() {
        report(&host, &shared, window.take());
    }
    let reading = Arc::new(Reading {
        state: Mutex::new(Follower {
            reader,
            tree,
            window,
            since: None,
        }),
        woken: Notify::new(),
    });
    let task = tokio::spawn(follow(host, reading.clone(), shared));
    Watcher {
        task,
        reading: Some(reading),
    }
}

impl Watcher {
    /// Reads what the kernel has queued, now, into the running turns' records and the window.
    pub(super) fn catch_up(&self, shared: &Shared) {
        let Some(reading) = &self.reading else {
            return;
        };
        let mut context = Context::from_waker(Waker::noop());
        // A failed read is the task's to report: it reads on when woken.
        let _ = lock(&reading.state).poll_read(&mut context, shared);
        // That poll left the queue's wake-up with the no-op waker: the task polls again, with
        // its own, and flushes the window this read may have started.
        reading.woken.notify_one();
    }

    pub(super) fn stop(&self) {
        self.task.abort();
    }
}

impl Follower {
    /// Reads the kernel's queue until it is empty: ready once it read something (or failed),
    /// pending (woken by `context`) when there was nothing.
    fn poll_read(&mut self, context: &mut Context<'_>, shared: &Shared) -> Poll<io::Result<()>> {
        let mut read = false;
        loop {
            match self.reader.poll_next_unpin(context) {
                Poll::Ready(Some(Ok(event))) => {
                    self.tree.apply(&event, &mut self.window, shared);
                    self.since.get_or_insert_with(Instant::now);
                    read = true;
                }
                Poll::Ready(Some(Err(err))) => return Poll::Ready(Err(err)),
                Poll::Ready(None) => {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::UnexpectedEof,
                        "the kernel's event queue ended",
                    )));
                }
                Poll::Pending if read => return Poll::Ready(Ok(())),
                Poll::Pending => return Poll::Pending,
            }
        }
    }

    /// The window as one event, and a fresh window.
    fn take(&mut self) -> Option<WorkspaceChangedData> {
        self.since = None;
        self.window.take()
    }
}

/// Reads the kernel's events as they come, one window at a time.
async fn follow<H: WatchHost>(host: Arc<H>, reading: Arc<Reading>, shared: Arc<Shared>) {
    loop {
        #[cfg(debug_assertions)]
        crate::test_hooks::before_watch_read().await;
        let due = lock(&reading.state).since.map(|since| since + WINDOW);
        tokio::select! {
            read = std::future::poll_fn(|context| lock(&reading.state).poll_read(context, &shared)) => {
                if let Err(err) = read {
                    return failed(&host, &shared, &reading, &err);
                }
            }
            () = sleep_until_some(due) => {
                let data = lock(&reading.state).take();
                report(&host, &shared, data);
            }
            () = reading.woken.notified() => {}
        }
    }
}

/// Sleeps until `at`, or forever without it.
async fn sleep_until_some(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// The kernel's queue failed or ended: the sessions are told to rescan.
fn failed<H: WatchHost>(host: &Arc<H>, shared: &Shared, reading: &Reading, err: &io::Error) {
    let data = {
        let mut follower = lock(&reading.state);
        tracing::warn!(workspace = %follower.tree.root.display(), error = %err, "the workspace's watcher failed");
        follower.window.rescan("watch_failed", "");
        follower.take()
    };
    report(host, shared, data);
}

impl Tree {
    /// Watches `dir` (relative) and the directories under it, breadth first, within the
    /// bound; with `report`, names what it finds as created (a directory that appeared: what
    /// was made in it before its watch existed would be missed otherwise).
    fn add_tree(&mut self, dir: &str, window: &mut Window, report: bool) {
        let mut queue = std::collections::VecDeque::from([dir.to_string()]);
        while let Some(dir) = queue.pop_front() {
            if self.dirs.len() >= self.max_dirs {
                self.full = true;
                window.rescan("too_many_directories", &dir);
                return;
            }
            let path = self.root.join(&dir);
            match self.watches.add(&path, MASK) {
                Ok(wd) => {
                    self.dirs.insert(wd.get_watch_descriptor_id(), dir.clone());
                }
                Err(err) if err.raw_os_error() == Some(nix::libc::ENOSPC) => {
                    // The user's inotify watches are used up (fs.inotify.max_user_watches).
                    self.full = true;
                    window.rescan("too_many_directories", &dir);
                    return;
                }
                Err(_) => continue,
            }
            let Ok(entries) = std::fs::read_dir(&path) else {
                continue;
            };
            for entry in entries.flatten() {
                let is_dir = entry.file_type().is_ok_and(|t| t.is_dir());
                let name = entry.file_name().to_string_lossy().into_owned();
                let relative = join(&dir, &name);
                if self.leaves_out(&relative, is_dir) {
                    continue;
                }
                if report {
                    window.note(&relative, ChangeKind::Created, is_dir, None);
                }
                if is_dir {
                    queue.push_back(relative);
                }
            }
        }
    }

    /// True for a path not watched and not reported: ignored, or the host's own.
    fn leaves_out(&self, relative: &str, dir: bool) -> bool {
        if self.ignore.ignores(relative, dir) {
            return true;
        }
        let full = self.root.join(relative);
        self.protected.iter().any(|p| full.starts_with(p))
    }

    /// One kernel event into the window (and into the running turns' records).
    fn apply(&mut self, event: &inotify::EventOwned, window: &mut Window, shared: &Shared) {
        if event.mask.contains(EventMask::Q_OVERFLOW) {
            window.rescan("overflow", "");
            return;
        }
        let wd = event.wd.get_watch_descriptor_id();
        if event.mask.contains(EventMask::IGNORED) {
            self.dirs.remove(&wd);
            return;
        }
        let (Some(dir), Some(name)) = (self.dirs.get(&wd), event.name.as_ref()) else {
            return;
        };
        let relative = join(dir, &name.to_string_lossy());
        let is_dir = event.mask.contains(EventMask::ISDIR);
        if self.leaves_out(&relative, is_dir) {
            return;
        }
        if relative == ".gitignore" {
            self.ignore = Ignore::of(&self.root);
        }
        let Some(kind) = self.kind_of(event, &relative, is_dir, window) else {
            return;
        };
        if !is_dir {
            shared.record(&relative, kind);
        }
        if is_dir && matches!(kind, ChangeKind::Created | ChangeKind::Renamed) && !self.full {
            self.add_tree(&relative, window, true);
        }
    }

    /// What the event did to `relative`, noted in the window; `None` for what waits for its
    /// pair (a move's first half) or changes nothing a client shows.
    fn kind_of(
        &self,
        event: &inotify::EventOwned,
        relative: &str,
        is_dir: bool,
        window: &mut Window,
    ) -> Option<ChangeKind> {
        let mask = event.mask;
        if mask.contains(EventMask::MOVED_FROM) {
            window
                .moved_from
                .insert(event.cookie, (relative.to_string(), is_dir));
            return None;
        }
        let (kind, from) = if mask.contains(EventMask::MOVED_TO) {
            let from = window
                .moved_from
                .remove(&event.cookie)
                .map(|(from, _)| from);
            (ChangeKind::Renamed, from)
        } else if mask.contains(EventMask::CREATE) {
            (ChangeKind::Created, None)
        } else if mask.contains(EventMask::DELETE) {
            (ChangeKind::Removed, None)
        } else if mask.intersects(EventMask::MODIFY | EventMask::CLOSE_WRITE | EventMask::ATTRIB)
            && !is_dir
        {
            (ChangeKind::Modified, None)
        } else {
            return None;
        };
        window.note(relative, kind, is_dir, from);
        Some(kind)
    }
}

impl Window {
    /// A path's change: a created path stays created whatever follows in the window; created
    /// then removed is no change at all.
    fn note(&mut self, path: &str, kind: ChangeKind, dir: bool, from: Option<String>) {
        if let Some(&at) = self.index.get(path) {
            let earlier = &mut self.changes[at];
            match (earlier.kind, kind) {
                (ChangeKind::Created, ChangeKind::Modified) => {}
                (ChangeKind::Created, ChangeKind::Removed) => {
                    self.vanished.insert(at);
                }
                (_, kind) => {
                    earlier.kind = kind;
                    self.vanished.remove(&at);
                }
            }
            if from.is_some() {
                earlier.from = from;
            }
            return;
        }
        if self.changes.len() >= MAX_CHANGES_PER_EVENT {
            self.overfull = true;
            return;
        }
        self.index.insert(path.to_string(), self.changes.len());
        self.changes.push(PathChange {
            path: path.to_string(),
            kind,
            from,
            dir,
        });
    }

    fn rescan(&mut self, reason: &'static str, dir: &str) {
        // The first reason stands; a second directory widens the rescan to the whole tree.
        match &mut self.rescan {
            Some((_, at)) if at != dir => at.clear(),
            Some(_) => {}
            None => self.rescan = Some((reason, dir.to_string())),
        }
    }

    /// The window as one event, and a fresh window.
    fn take(&mut self) -> Option<WorkspaceChangedData> {
        // A move whose other half never came left the tree.
        for (_, (path, dir)) in std::mem::take(&mut self.moved_from) {
            self.note(&path, ChangeKind::Removed, dir, None);
        }
        if self.overfull {
            self.rescan("too_many_changes", "");
        }
        let window = std::mem::take(self);
        let changes: Vec<PathChange> = window
            .changes
            .into_iter()
            .enumerate()
            .filter(|(at, _)| !window.vanished.contains(at))
            .map(|(_, change)| change)
            .collect();
        if changes.is_empty() && window.rescan.is_none() {
            return None;
        }
        let (reason, rescan_path) = match window.rescan {
            Some((reason, path)) => (Some(reason.to_string()), Some(path)),
            None => (None, None),
        };
        Some(WorkspaceChangedData {
            changes,
            rescan: reason.is_some(),
            reason,
            rescan_path,
        })
    }
}

/// Appends the window's event to every session of the workspace.
fn report(host: &impl WatchHost, shared: &Shared, data: Option<WorkspaceChangedData>) {
    let Some(data) = data else {
        return;
    };
    tracing::debug!(
        changes = data.changes.len(),
        rescan = data.rescan,
        "workspace changed"
    );
    for session in shared.sessions() {
        let event = HostEvent::of_session(data.clone());
        // Not waited for: the next window's event comes after it in the same log anyway.
        if let Err(err) = host.sessions().append(&session, vec![event]) {
            tracing::debug!(session_id = %session.id, error = %err, "workspace change not recorded");
        }
    }
}

fn join(dir: &str, name: &str) -> String {
    if dir.is_empty() {
        name.to_string()
    } else {
        format!("{dir}/{name}")
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn window_of(count: usize) -> Window {
        let mut window = Window::default();
        for i in 0..count {
            window.note(&format!("f{i}"), ChangeKind::Created, false, None);
        }
        window
    }

    #[test]
    fn one_event_names_its_bound_of_paths_and_says_rescan_past_it() {
        let at = window_of(MAX_CHANGES_PER_EVENT).take().unwrap();
        assert_eq!(at.changes.len(), MAX_CHANGES_PER_EVENT);
        assert!(!at.rescan);
        let past = window_of(MAX_CHANGES_PER_EVENT + 1).take().unwrap();
        assert_eq!(past.changes.len(), MAX_CHANGES_PER_EVENT);
        assert!(past.rescan);
        assert_eq!(past.reason.as_deref(), Some("too_many_changes"));
        assert_eq!(past.rescan_path.as_deref(), Some(""));
    }

    #[test]
    fn a_path_is_named_once_with_what_it_ended_as() {
        let mut window = Window::default();
        window.note("a", ChangeKind::Created, false, None);
        window.note("a", ChangeKind::Modified, false, None);
        window.note("gone", ChangeKind::Created, false, None);
        window.note("gone", ChangeKind::Removed, false, None);
        window.note("b", ChangeKind::Modified, false, None);
        window.note("b", ChangeKind::Removed, false, None);
        window.moved_from.insert(7, ("left".to_string(), false));
        let data = window.take().unwrap();
        let seen: Vec<(&str, ChangeKind)> = data
            .changes
            .iter()
            .map(|c| (c.path.as_str(), c.kind))
            .collect();
        assert_eq!(
            seen,
            [
                ("a", ChangeKind::Created),
                ("b", ChangeKind::Removed),
                ("left", ChangeKind::Removed)
            ]
        );
        assert!(Window::default().take().is_none(), "nothing, no event");
    }

    #[test]
    fn an_overflow_or_a_full_tree_is_one_rescan() {
        let mut window = Window::default();
        window.rescan("overflow", "");
        window.rescan("too_many_directories", "a/b");
        let data = window.take().unwrap();
        assert!(data.rescan && data.changes.is_empty());
        assert_eq!(data.reason.as_deref(), Some("overflow"));
        assert_eq!(
            data.rescan_path.as_deref(),
            Some(""),
            "widened to the whole tree"
        );
    }
}
