//! Branches: `session/fork` and `session/clone` (docs/protocol.md §7.31, §7.32), pi's own fork
//! and clone delivered as new RACP sessions.
//!
//! The new session gets a copy of the source's pi session file in its own agent directory, each
//! line redacted as the source's events were (docs/protocol.md §8.8), so the branch's agent
//! starts from the conversation the clients saw, never from a secret they were shown as
//! `[redacted]`. Its agent resumes that copy (`--continue`), and pi's `fork` or `clone` writes
//! the branch as a new file there and switches to it. The copy is then removed, so that a later `--continue`, which
//! takes the most recently modified file, can only find the branch. Its log starts with
//! `session.forked` and the source's history entries before the fork point, as its own events,
//! so its history alone is the whole conversation.

use super::{Driver, DriverHost, Drivers, Raised, closed};
use crate::agent::Agent;
use crate::auth::Caller;
use crate::redact::Redactor;
use crate::sessions::{HostEvent, Session};
use racp_proto::events::{Event, SessionClosedData, SessionForkedData};
use racp_proto::methods::session::{
    SessionCloneParams, SessionCreateResult, SessionForkParams, SessionForkResult,
};
use racp_proto::pi::reply::{self, Branched, ForkMessage};
use racp_proto::pi::{Command, Kind};
use racp_proto::{AppError, Cursor, ErrorCode};
use racp_server::clock::now_ms;
use serde_json::json;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// History entries copied into the new session per committed batch.
const COPY_BATCH: usize = 256;

/// Where a session's agent keeps pi's session files.
pub(super) fn agent_dir(host: &impl DriverHost, session_id: &str) -> PathBuf {
    host.config()
        .data_dir
        .join("agent-sessions")
        .join(session_id)
}

/// Whether `dir` holds a pi session file for the agent to resume.
pub(super) fn holds_session_file(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "jsonl"))
    })
}

/// The user message a fork is made at, as the source's history has it.
struct ForkPoint {
    seq: u64,
    text: String,
    /// User messages with text after it: pi's fork list ends where the history does, so the
    /// message is that many places from the list's end (even when the host's history bounds
    /// dropped older entries).
    later: usize,
}

impl Drivers {
    /// `session/fork`: a new session with the source's conversation before the user message at
    /// `params.from`, and that message's text.
    pub async fn fork(
        &self,
        host: &Arc<impl DriverHost>,
        caller: &Caller,
        params: SessionForkParams,
    ) -> Result<SessionForkResult, AppError> {
        let source = host.sessions().find(&params.session_id)?;
        let driver = self.driver(&source);
        let _held = branching(&driver)?;
        idle_source(&driver, &source).await?;
        let point = fork_point(host, &source, params.from)?;
        let agent = self.agent_for(host, &source).await?;
        let listed = reply::fork_messages(&agent.call(&Command::GetForkMessages).await?);
        let (index, message) = pi_message(&listed, &point)?;
        let file = session_file(&agent).await?;
        if index > 0 && file.is_none() {
            return Err(nothing_saved());
        }
        let from = Some(params.from);
        let target = new_branch(host, caller, &source, params.title, from, point.seq).await?;
        let mut text = message.text.clone();
        // Forked at pi's first message, the branch is an empty conversation: a new pi session.
        if index > 0
            && let Some(file) = file
        {
            let fork = Command::Fork {
                entry_id: &message.entry_id,
            };
            match self.branch_agent(host, &target, &file, &fork).await {
                Ok(branched) => text = branched.text.unwrap_or(text),
                Err(err) => return Err(self.abandon(host, &target, err).await),
            }
        }
        tracing::info!(from = %source.id, session_id = %target.id, "session forked");
        Ok(SessionForkResult {
            session: target.info(),
            text,
        })
    }

    /// `session/clone`: a new session with the source's whole conversation.
    pub async fn clone_session(
        &self,
        host: &Arc<impl DriverHost>,
        caller: &Caller,
        params: SessionCloneParams,
    ) -> Result<SessionCreateResult, AppError> {
        let source = host.sessions().find(&params.session_id)?;
        let driver = self.driver(&source);
        let _held = branching(&driver)?;
        idle_source(&driver, &source).await?;
        let agent = self.agent_for(host, &source).await?;
        let file = session_file(&agent).await?;
        let end = source.head_cursor().seq + 1;
        let target = new_branch(host, caller, &source, params.title, None, end).await?;
        // Without a file pi saved nothing yet (no reply so far): the clone's pi starts anew,
        // as the source's would after a restart.
        if let Some(file) = file
            && let Err(err) = self
                .branch_agent(host, &target, &file, &Command::Clone)
                .await
        {
            return Err(self.abandon(host, &target, err).await);
        }
        tracing::info!(from = %source.id, session_id = %target.id, "session cloned");
        Ok(SessionCreateResult {
            session: target.info(),
        })
    }

    /// Gives `target`'s agent the source's pi session file and has it branch (`command`); the
    /// copy is removed once pi switched to its branch.
    async fn branch_agent(
        &self,
        host: &Arc<impl DriverHost>,
        target: &Arc<Session>,
        file: &Path,
        command: &Command<'_>,
    ) -> Result<Branched, AppError> {
        // An agent started before the copy (a subscriber's warm start) would not resume it.
        self.stop_session(host, target).await;
        let dir = agent_dir(host, &target.id);
        racp_server::private_file::create_private_dir(&dir).map_err(crate::internal)?;
        let name = file
            .file_name()
            .ok_or_else(|| crate::internal("pi's session file has no name"))?;
        let copy = dir.join(name);
        let (from, to, redactor) = (
            file.to_path_buf(),
            copy.clone(),
            host.agent_options().redactor,
        );
        tokio::task::spawn_blocking(racp_server::trace::blocking(move || {
            copy_redacted(&from, &to, &redactor)
        }))
        .await
        .map_err(crate::internal)?
        .map_err(crate::internal)?;
        let agent = self.agent_for(host, target).await?;
        let branched = Branched::of(&agent.call(command).await?);
        if branched.cancelled {
            return Err(AppError::new(
                ErrorCode::Conflict,
                format!("an extension of the agent cancelled the {}", command.name()),
            )
            .with_retriable(false)
            .with_details(json!({"reason": "cancelled"})));
        }
        if let Err(err) = std::fs::remove_file(&copy) {
            tracing::warn!(error = %err, "cannot remove the copied pi session file");
        }
        // pi's branch is a new runtime: the session's settings again.
        let settings = target.settings();
        if !settings.is_empty() {
            agent.configure(&settings).await?;
        }
        Ok(branched)
    }

    /// A branch whose agent could not branch is closed, so it is not taken for a good copy;
    /// returns `err`.
    async fn abandon(
        &self,
        host: &Arc<impl DriverHost>,
        target: &Arc<Session>,
        err: AppError,
    ) -> AppError {
        self.stop_session(host, target).await;
        let closed = HostEvent::of_session(SessionClosedData {
            device_id: None,
            device_name: None,
        });
        if host.sessions().commit(target, vec![closed]).await.is_ok()
            && let Err(store_err) = host.store().mark_session_closed(&target.id, now_ms())
        {
            tracing::warn!(error = %store_err, "cannot mark an abandoned branch closed");
        }
        tracing::warn!(session_id = %target.id, error = %err, "a branch was abandoned");
        err
    }
}

/// Copies pi's session file (JSON lines) with every line redacted; the copy is private.
fn copy_redacted(from: &Path, to: &Path, redactor: &Redactor) -> std::io::Result<()> {
    use std::io::{BufRead, Write};
    use std::os::unix::fs::OpenOptionsExt;
    let reader = std::io::BufReader::new(std::fs::File::open(from)?);
    let file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(to)?;
    let mut writer = std::io::BufWriter::new(file);
    for line in reader.split(b'\n') {
        writer.write_all(&redactor.json(&line?))?;
        writer.write_all(b"\n")?;
    }
    writer.flush()
}

/// AGENT_BUSY while the source runs a turn or compacts, CONFLICT once it is closed.
async fn idle_source(driver: &Driver, source: &Session) -> Result<(), AppError> {
    if source.is_closing() {
        return Err(closed(source));
    }
    if let Some(active) = &driver.state.lock().await.active {
        return Err(AppError::new(
            ErrorCode::AgentBusy,
            "a turn is running: fork or clone the session once it has finished (or abort it)",
        )
        .with_details(json!({"turnId": active.turn_id})));
    }
    if driver.compacting.load(Ordering::Acquire) {
        return Err(AppError::new(
            ErrorCode::AgentBusy,
            "the session is compacting its conversation: fork or clone it once that has finished",
        ));
    }
    Ok(())
}

/// The history entry at `from`, which must be a user message with text, and how many user
/// messages with text came after it.
fn fork_point(
    host: &impl DriverHost,
    source: &Session,
    from: Cursor,
) -> Result<ForkPoint, AppError> {
    let head = source.history_position(None)?;
    source.history_position(Some(from))?;
    let mut later = 0;
    let mut found = None;
    host.store()
        .history_back(&source.id, head.seq, |row| {
            if row.seq < from.seq {
                return false;
            }
            let message = user_message(&row.json);
            if row.seq == from.seq {
                found = Some(message);
                return false;
            }
            later += usize::from(message.is_some_and(|text| !text.is_empty()));
            true
        })
        .map_err(crate::internal)?;
    let Some(Some(text)) = found else {
        return Err(not_a_user_message());
    };
    if text.is_empty() {
        return Err(racp_proto::validate::invalid(
            "from",
            "is a message without text, which the agent cannot fork at",
        ));
    }
    Ok(ForkPoint {
        seq: from.seq,
        text,
        later,
    })
}

/// The text of a stored history entry that is a user message; `None` for any other entry.
fn user_message(json: &str) -> Option<String> {
    let event = serde_json::from_str::<Event>(json).ok()?;
    if Kind::of_event_type(&event.kind) != Some(Kind::MessageEnd) {
        return None;
    }
    racp_proto::pi::event::user_message_text(event.data.get())
}

/// pi's fork message for `point`, and its place in pi's list; CONFLICT when pi's conversation
/// is not the host's there.
fn pi_message<'a>(
    listed: &'a [ForkMessage],
    point: &ForkPoint,
) -> Result<(usize, &'a ForkMessage), AppError> {
    listed
        .len()
        .checked_sub(point.later + 1)
        .and_then(|index| Some((index, listed.get(index)?)))
        .filter(|(_, message)| message.text == point.text)
        .ok_or_else(|| {
            AppError::new(
                ErrorCode::Conflict,
                "the agent's conversation does not hold this message where the session's \
                 history does (its session file was lost or replaced): it cannot be forked there",
            )
            .with_retriable(false)
            .with_details(json!({"reason": "history_differs"}))
        })
}

/// The source agent's pi session file, when pi saved one.
async fn session_file(agent: &Agent) -> Result<Option<PathBuf>, AppError> {
    let state = agent.get_state().await?;
    Ok(reply::session_file(&state)
        .map(PathBuf::from)
        .filter(|file| file.is_file()))
}

/// Creates the new session (the source's workspace and settings) and commits its first
/// events: `session.forked`, then the source's history entries before `before_seq`.
async fn new_branch(
    host: &Arc<impl DriverHost>,
    caller: &Caller,
    source: &Session,
    title: Option<String>,
    from: Option<Cursor>,
    before_seq: u64,
) -> Result<Arc<Session>, AppError> {
    let row = crate::store::SessionRow {
        session_id: host.secrets().new_id("ses_").map_err(crate::internal)?,
        workspace: source.workspace.clone(),
        title,
        epoch: host.secrets().random_u64().map_err(crate::internal)?,
        created_at: now_ms(),
        closed: false,
        settings: source.settings(),
    };
    let target = host
        .sessions()
        .create(host.store(), row)
        .map_err(crate::internal)?;
    let mut events = vec![HostEvent::of_session(SessionForkedData {
        from_session_id: source.id.clone(),
        from,
        device_id: caller.device_id().map(str::to_string),
        device_name: caller.device_name().map(str::to_string),
    })];
    let mut after = 0;
    loop {
        let rows = host
            .store()
            .history_between(&source.id, after, before_seq, COPY_BATCH)
            .map_err(crate::internal)?;
        let Some(last) = rows.last() else { break };
        after = last.seq;
        events.extend(rows.iter().filter_map(|row| copied(&row.json)));
        host.sessions()
            .commit(&target, std::mem::take(&mut events))
            .await?;
    }
    if !events.is_empty() {
        host.sessions().commit(&target, events).await?;
    }
    Ok(target)
}

/// A history entry of the source (a message, a compaction's summary, a shell command) as an
/// event of the new session: its type and `data`, without its `turnId`, which names a turn of
/// the other session.
fn copied(json: &str) -> Option<HostEvent> {
    let mut event = serde_json::from_str::<Event>(json).ok()?;
    event.turn_id = None;
    HostEvent::from_stored(event)
}

/// The source's branching flag, raised while it is forked or cloned.
fn branching(driver: &Arc<Driver>) -> Result<Raised, AppError> {
    Raised::raise(
        driver,
        |d| &d.branching,
        "the session is already being forked or cloned",
    )
}

fn not_a_user_message() -> AppError {
    racp_proto::validate::invalid(
        "from",
        "must be the cursor of a history entry of the session that is a user message \
         (agent.message_end with data.message.role \"user\")",
    )
}

fn nothing_saved() -> AppError {
    AppError::new(
        ErrorCode::Conflict,
        "the agent saved no conversation for this session yet (no reply so far), so it cannot \
         fork it after its first message",
    )
    .with_retriable(false)
    .with_details(json!({"reason": "nothing_saved"}))
}
