//! The durable store: SQLite in WAL mode (bundled), one connection behind a mutex.
//!
//! Calls are short and run on the caller's thread; the event log adds a group-commit
//! writer on its own thread so producers never wait on fsync one by one.

mod approvals;
mod call_ids;
mod chunk;
mod devices;
mod grants;
mod history;
mod sessions;

pub use devices::{DeviceRow, PairingOutcome};
pub use history::{AtBound, HistoryPolicy};
pub use sessions::{EventRow, NewEvent, SessionBatch, SessionRow, TurnRow};

use rusqlite::{Connection, OptionalExtension};
use std::path::Path;
use std::sync::{Mutex, MutexGuard};

#[derive(Debug, thiserror::Error)]
pub enum StoreError {
    #[error("database error: {0}")]
    Sql(#[from] rusqlite::Error),
    #[error("the store's lock was poisoned by a panic")]
    Poisoned,
    #[error("cannot create the database file: {0}")]
    Io(#[from] std::io::Error),
    #[error("the database holds data the host cannot read: {0}")]
    Corrupt(String),
}

pub struct Store {
    conn: Mutex<Connection>,
}

const SCHEMA: &str = r#"
CREATE TABLE IF NOT EXISTS meta (
    key   TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS devices (
    device_id    TEXT PRIMARY KEY,
    name         TEXT NOT NULL,
    roles        TEXT NOT NULL,
    token_tag    BLOB NOT NULL,
    created_at   INTEGER NOT NULL,
    last_seen_at INTEGER,
    revoked_at   INTEGER
);
CREATE TABLE IF NOT EXISTS pairing_tokens (
    token_id        TEXT PRIMARY KEY,
    token_tag       BLOB NOT NULL,
    roles           TEXT NOT NULL,
    created_at      INTEGER NOT NULL,
    expires_at      INTEGER NOT NULL,
    consumed_at     INTEGER,
    failed_attempts INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE IF NOT EXISTS sessions (
    session_id TEXT PRIMARY KEY,
    workspace  TEXT NOT NULL,
    title      TEXT,
    epoch      INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    closed_at  INTEGER
);
-- A session's events in chunks: one row per session per group commit, holding consecutive
-- events from first_seq to last_seq (the encoding is `store::chunk`). One row per event cost
-- SQLite more than everything else the host does per event (docs/benchmarks.md, "Events in
-- chunks").
CREATE TABLE IF NOT EXISTS event_chunks (
    session_id TEXT NOT NULL,
    first_seq  INTEGER NOT NULL,
    last_seq   INTEGER NOT NULL,
    body       BLOB NOT NULL,
    PRIMARY KEY (session_id, first_seq)
);
CREATE TABLE IF NOT EXISTS approvals (
    approval_id TEXT PRIMARY KEY,
    session_id  TEXT NOT NULL,
    pending     INTEGER NOT NULL,
    json        TEXT NOT NULL
);
-- The ids of routed calls, kept for the signature's time window (store::call_ids).
CREATE TABLE IF NOT EXISTS call_ids (
    call_id   TEXT PRIMARY KEY,
    signed_at INTEGER NOT NULL
);
-- Permission grants given with "always", per session (store::grants; docs/protocol.md,
-- "Permissions").
CREATE TABLE IF NOT EXISTS grants (
    session_id TEXT NOT NULL,
    tool       TEXT NOT NULL,
    scope      TEXT NOT NULL,
    value      TEXT NOT NULL,
    granted_at INTEGER NOT NULL,
    PRIMARY KEY (session_id, tool, scope, value)
);
CREATE TABLE IF NOT EXISTS turns (
    session_id      TEXT NOT NULL,
    turn_id         TEXT NOT NULL,
    idempotency_key TEXT NOT NULL,
    text            TEXT NOT NULL,
    started_at      INTEGER NOT NULL,
    PRIMARY KEY (session_id, turn_id),
    UNIQUE (session_id, idempotency_key)
);
"#;

/// Opens a connection with the settings every connection to the store uses.
pub fn connect(path: &Path) -> Result<Connection, StoreError> {
    let conn = Connection::open(path)?;
    conn.pragma_update(None, "journal_mode", "WAL")?;
    // FULL: a commit is on disk before it returns, so a committed event survives power loss.
    conn.pragma_update(None, "synchronous", "FULL")?;
    conn.busy_timeout(std::time::Duration::from_secs(10))?;
    Ok(conn)
}

impl Store {
    pub fn open(path: &Path) -> Result<Self, StoreError> {
        // Create the file 0600 first: SQLite gives its -wal and -shm files the same mode.
        if !path.exists() {
            racp_server::private_file::write_private(path, b"")?;
        }
        let mut conn = connect(path)?;
        conn.execute_batch(SCHEMA)?;
        sessions::migrate_event_rows(&mut conn)?;
        sessions::add_settings_column(&conn)?;
        history::create(&mut conn)?;
        Ok(Store {
            conn: Mutex::new(conn),
        })
    }

    /// One small write through the store's connection (the host's `/readyz`, metrics.rs).
    pub fn probe_write(&self) -> Result<(), StoreError> {
        self.conn()?.execute(
            "INSERT OR REPLACE INTO meta (key, value) VALUES ('ready_probe', ?1)",
            [racp_server::clock::now_ms().to_string()],
        )?;
        Ok(())
    }

    fn conn(&self) -> Result<MutexGuard<'_, Connection>, StoreError> {
        self.conn.lock().map_err(|_| StoreError::Poisoned)
    }

    /// Reads a meta value, or stores `init()` under `key` when there is none yet.
    pub fn meta_or_init(
        &self,
        key: &str,
        init: impl FnOnce() -> String,
    ) -> Result<String, StoreError> {
        let conn = self.conn()?;
        let found: Option<String> = conn
            .query_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()?;
        if let Some(value) = found {
            return Ok(value);
        }
        let value = init();
        conn.execute(
            "INSERT INTO meta (key, value) VALUES (?1, ?2)",
            (key, &value),
        )?;
        Ok(value)
    }
}

/// Writes one batch of events for several sessions in one transaction (group commit): one
/// chunk row per session part (`sessions.rs`), and the events that hold the conversation into
/// its history (`history.rs`), kept within `policy` as of `now`.
pub fn commit_events(
    conn: &mut Connection,
    batch: &[SessionBatch<'_>],
    policy: &HistoryPolicy,
    now: u64,
) -> Result<(), StoreError> {
    let tx = conn.transaction()?;
    sessions::insert_chunks(&tx, batch)?;
    history::insert(&tx, batch, policy, now)?;
    tx.commit()?;
    Ok(())
}
