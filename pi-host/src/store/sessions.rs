//! Sessions, their event logs and their turns' idempotency keys.
//!
//! Events are written by the group-commit writer (`sessions::writer`) on its own connection;
//! this file holds the reads and the small writes.

use super::{Store, StoreError};
use rusqlite::{Connection, OptionalExtension};

#[derive(Debug, Clone)]
pub struct SessionRow {
    pub session_id: String,
    pub workspace: String,
    pub title: Option<String>,
    pub epoch: u64,
    pub created_at: u64,
    pub closed: bool,
}

#[derive(Debug, Clone)]
pub struct EventRow {
    pub seq: u64,
    pub at: u64,
    pub json: String,
}

#[derive(Debug, Clone)]
pub struct TurnRow {
    pub turn_id: String,
    pub idempotency_key: String,
    pub text: String,
    pub started_at: u64,
}

// SQLite integers are i64; every value here is a timestamp, a seq or an epoch stored as its bit
// pattern, so the casts round-trip.
fn to_i64(v: u64) -> i64 {
    v as i64
}

fn to_u64(v: i64) -> u64 {
    v as u64
}

impl Store {
    pub fn insert_session(&self, row: &SessionRow) -> Result<(), StoreError> {
        let conn = self.conn()?;
        conn.execute(
            "INSERT INTO sessions (session_id, workspace, title, epoch, created_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            (
                &row.session_id,
                &row.workspace,
                &row.title,
                to_i64(row.epoch),
                to_i64(row.created_at),
            ),
        )?;
        Ok(())
    }

    pub fn mark_session_closed(&self, session_id: &str, now: u64) -> Result<(), StoreError> {
        let conn = self.conn()?;
        conn.execute(
            "UPDATE sessions SET closed_at = COALESCE(closed_at, ?2) WHERE session_id = ?1",
            (session_id, to_i64(now)),
        )?;
        Ok(())
    }

    pub fn sessions(&self) -> Result<Vec<SessionRow>, StoreError> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare(
            "SELECT session_id, workspace, title, epoch, created_at, closed_at
             FROM sessions ORDER BY created_at, session_id",
        )?;
        let rows = stmt
            .query_map([], |r| {
                Ok(SessionRow {
                    session_id: r.get(0)?,
                    workspace: r.get(1)?,
                    title: r.get(2)?,
                    epoch: to_u64(r.get(3)?),
                    created_at: to_u64(r.get(4)?),
                    closed: r.get::<_, Option<i64>>(5)?.is_some(),
                })
            })?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    /// The newest `limit` events of a session, oldest first.
    pub fn event_tail(&self, session_id: &str, limit: usize) -> Result<Vec<EventRow>, StoreError> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare(
            "SELECT seq, at, json FROM events WHERE session_id = ?1 ORDER BY seq DESC LIMIT ?2",
        )?;
        let mut rows = stmt
            .query_map(
                (session_id, i64::try_from(limit).unwrap_or(i64::MAX)),
                |r| {
                    Ok(EventRow {
                        seq: to_u64(r.get(0)?),
                        at: to_u64(r.get(1)?),
                        json: r.get(2)?,
                    })
                },
            )?
            .collect::<Result<Vec<_>, _>>()?;
        rows.reverse();
        Ok(rows)
    }

    /// The highest seq ever committed for a session (0 when none), even if pruned since.
    pub fn event_head(&self, session_id: &str) -> Result<u64, StoreError> {
        let conn = self.conn()?;
        let head: Option<i64> = conn
            .query_row(
                "SELECT value FROM meta WHERE key = 'head:' || ?1",
                [session_id],
                |r| r.get::<_, String>(0).map(|v| v.parse().unwrap_or(0)),
            )
            .optional()?;
        let stored: Option<i64> = conn.query_row(
            "SELECT MAX(seq) FROM events WHERE session_id = ?1",
            [session_id],
            |r| r.get(0),
        )?;
        Ok(to_u64(head.unwrap_or(0).max(stored.unwrap_or(0))))
    }

    pub fn turn_by_key(
        &self,
        session_id: &str,
        idempotency_key: &str,
    ) -> Result<Option<TurnRow>, StoreError> {
        let conn = self.conn()?;
        let row = conn
            .query_row(
                "SELECT turn_id, idempotency_key, text, started_at FROM turns
                 WHERE session_id = ?1 AND idempotency_key = ?2",
                (session_id, idempotency_key),
                |r| {
                    Ok(TurnRow {
                        turn_id: r.get(0)?,
                        idempotency_key: r.get(1)?,
                        text: r.get(2)?,
                        started_at: to_u64(r.get(3)?),
                    })
                },
            )
            .optional()?;
        Ok(row)
    }

    pub fn turn_exists(&self, session_id: &str, turn_id: &str) -> Result<bool, StoreError> {
        let conn = self.conn()?;
        let found: Option<i64> = conn
            .query_row(
                "SELECT 1 FROM turns WHERE session_id = ?1 AND turn_id = ?2",
                (session_id, turn_id),
                |r| r.get(0),
            )
            .optional()?;
        Ok(found.is_some())
    }

    pub fn insert_turn(&self, session_id: &str, turn: &TurnRow) -> Result<(), StoreError> {
        let conn = self.conn()?;
        conn.execute(
            "INSERT INTO turns (session_id, turn_id, idempotency_key, text, started_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            (
                session_id,
                &turn.turn_id,
                &turn.idempotency_key,
                &turn.text,
                to_i64(turn.started_at),
            ),
        )?;
        Ok(())
    }
}

/// An event to write, borrowed from the in-memory log (no copy of its JSON).
pub struct NewEvent<'a> {
    pub seq: u64,
    pub at: u64,
    pub json: &'a str,
}

/// One session's part of a group commit: its events, and the seq to prune below, if any.
pub struct SessionBatch<'a> {
    pub session_id: &'a str,
    pub events: Vec<NewEvent<'a>>,
    pub prune_below: Option<u64>,
}

/// Writes one batch of events for several sessions in one transaction (group commit), records
/// each session's head so it survives pruning, and prunes below each session's oldest kept seq.
pub fn commit_events(conn: &mut Connection, batch: &[SessionBatch<'_>]) -> Result<(), StoreError> {
    let tx = conn.transaction()?;
    {
        let mut insert = tx.prepare_cached(
            "INSERT INTO events (session_id, seq, at, json) VALUES (?1, ?2, ?3, ?4)",
        )?;
        let mut head = tx.prepare_cached(
            "INSERT INTO meta (key, value) VALUES ('head:' || ?1, ?2)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        )?;
        let mut prune =
            tx.prepare_cached("DELETE FROM events WHERE session_id = ?1 AND seq < ?2")?;
        for part in batch {
            for event in &part.events {
                insert.execute((
                    part.session_id,
                    to_i64(event.seq),
                    to_i64(event.at),
                    event.json,
                ))?;
            }
            if let Some(last) = part.events.last() {
                head.execute((part.session_id, last.seq.to_string()))?;
            }
            if let Some(below) = part.prune_below {
                prune.execute((part.session_id, to_i64(below)))?;
            }
        }
    }
    tx.commit()?;
    Ok(())
}
