//! Sessions, their event logs and their turns' idempotency keys.
//!
//! Events are written by the group-commit writer (`sessions::writer`) on its own connection;
//! this file holds the reads and the small writes.

use super::{Store, StoreError};
use racp_proto::methods::session::SessionSettings;
use rusqlite::{Connection, OptionalExtension, Transaction};

#[derive(Debug, Clone)]
pub struct SessionRow {
    pub session_id: String,
    pub workspace: String,
    pub title: Option<String>,
    pub epoch: u64,
    pub created_at: u64,
    pub closed: bool,
    /// The model, thinking level and auto-compaction a client set (`session/configure`).
    pub settings: SessionSettings,
}

#[derive(Debug, Clone)]
pub struct EventRow {
    pub seq: u64,
    pub at: u64,
    pub json: String,
}

impl EventRow {
    /// The row as an event to write, borrowing its JSON.
    fn as_new(&self) -> NewEvent<'_> {
        NewEvent {
            seq: self.seq,
            at: self.at,
            json: &self.json,
            // A store moved from event rows gains its history after the move (history::create).
            history: false,
        }
    }
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
            "INSERT INTO sessions (session_id, workspace, title, epoch, created_at, settings)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            (
                &row.session_id,
                &row.workspace,
                &row.title,
                to_i64(row.epoch),
                to_i64(row.created_at),
                settings_json(&row.settings)?,
            ),
        )?;
        Ok(())
    }

    pub fn set_session_settings(
        &self,
        session_id: &str,
        settings: &SessionSettings,
    ) -> Result<(), StoreError> {
        let conn = self.conn()?;
        conn.execute(
            "UPDATE sessions SET settings = ?2 WHERE session_id = ?1",
            (session_id, settings_json(settings)?),
        )?;
        Ok(())
    }

    pub fn set_session_title(&self, session_id: &str, title: &str) -> Result<(), StoreError> {
        let conn = self.conn()?;
        conn.execute(
            "UPDATE sessions SET title = ?2 WHERE session_id = ?1",
            (session_id, title),
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
            "SELECT session_id, workspace, title, epoch, created_at, closed_at, settings
             FROM sessions ORDER BY created_at, session_id",
        )?;
        let rows = stmt
            .query_map([], |r| {
                Ok((
                    SessionRow {
                        session_id: r.get(0)?,
                        workspace: r.get(1)?,
                        title: r.get(2)?,
                        epoch: to_u64(r.get(3)?),
                        created_at: to_u64(r.get(4)?),
                        closed: r.get::<_, Option<i64>>(5)?.is_some(),
                        settings: SessionSettings::default(),
                    },
                    r.get::<_, Option<String>>(6)?,
                ))
            })?
            .collect::<Result<Vec<_>, _>>()?;
        rows.into_iter()
            .map(|(mut row, settings)| {
                if let Some(json) = settings {
                    row.settings = serde_json::from_str(&json).map_err(|e| {
                        StoreError::Corrupt(format!("settings of {}: {e}", row.session_id))
                    })?;
                }
                Ok(row)
            })
            .collect()
    }

    /// The newest `limit` events of a session, oldest first.
    pub fn event_tail(&self, session_id: &str, limit: usize) -> Result<Vec<EventRow>, StoreError> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare(
            "SELECT first_seq, body FROM event_chunks WHERE session_id = ?1 ORDER BY first_seq DESC",
        )?;
        let mut rows = stmt.query([session_id])?;
        // Newest chunk first, until the chunks hold `limit` events.
        let mut chunks = Vec::new();
        let mut count = 0;
        while count < limit {
            let Some(row) = rows.next()? else { break };
            let first_seq = to_u64(row.get(0)?);
            let body = row
                .get_ref(1)?
                .as_blob()
                .map_err(|e| StoreError::Corrupt(format!("event chunk: {e}")))?;
            let events = super::chunk::decode(body)?;
            count += events.len();
            chunks.push((first_seq, events));
        }
        let mut tail: Vec<EventRow> = chunks
            .into_iter()
            .rev()
            .flat_map(|(first_seq, events)| {
                events
                    .into_iter()
                    .zip(first_seq..)
                    .map(|((at, json), seq)| EventRow { seq, at, json })
            })
            .collect();
        tail.drain(..tail.len().saturating_sub(limit));
        Ok(tail)
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
            "SELECT MAX(last_seq) FROM event_chunks WHERE session_id = ?1",
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
    /// Whether it is kept in the session's history too (`store/history.rs`).
    pub history: bool,
}

/// One session's part of a group commit: its events, consecutive in seq, and the seq to prune
/// below, if any.
pub struct SessionBatch<'a> {
    pub session_id: &'a str,
    pub events: Vec<NewEvent<'a>>,
    pub prune_below: Option<u64>,
}

/// One chunk row per session part, each session's head recorded so it survives pruning, and
/// the chunks wholly below each session's oldest kept seq dropped (part of a group commit,
/// `store::commit_events`).
pub(super) fn insert_chunks(
    tx: &Transaction<'_>,
    batch: &[SessionBatch<'_>],
) -> Result<(), StoreError> {
    {
        let mut insert = tx.prepare_cached(
            "INSERT INTO event_chunks (session_id, first_seq, last_seq, body)
             VALUES (?1, ?2, ?3, ?4)",
        )?;
        let mut head = tx.prepare_cached(
            "INSERT INTO meta (key, value) VALUES ('head:' || ?1, ?2)
             ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        )?;
        let mut prune = tx.prepare_cached(
            "DELETE FROM event_chunks WHERE session_id = ?1 AND first_seq < ?2 AND last_seq < ?2",
        )?;
        let mut body = Vec::new();
        for part in batch {
            if let (Some(first), Some(last)) = (part.events.first(), part.events.last()) {
                debug_assert_eq!(
                    last.seq - first.seq + 1,
                    part.events.len() as u64,
                    "a chunk holds consecutive events"
                );
                body.clear();
                for event in &part.events {
                    super::chunk::push(&mut body, event.at, event.json)?;
                }
                insert.execute((part.session_id, to_i64(first.seq), to_i64(last.seq), &body))?;
            }
            if let Some(below) = part.prune_below {
                // Pruning never removes the chunk holding the head (the in-memory log always
                // keeps the newest event), so `MAX(last_seq)` is the head; the meta row, a second
                // record of it, is written only here rather than once per commit.
                if let Some(last) = part.events.last() {
                    head.execute((part.session_id, last.seq.to_string()))?;
                }
                prune.execute((part.session_id, to_i64(below)))?;
            }
        }
    }
    Ok(())
}

/// Moves a database written before event chunks (one `events` row per event) to chunks, in one
/// transaction: each run of consecutive seqs of a session becomes chunks of at most
/// `MIGRATED_CHUNK` events.
/// Stored settings: NULL when none is set, so rows written before the column read the same.
fn settings_json(settings: &SessionSettings) -> Result<Option<String>, StoreError> {
    if settings.is_empty() {
        return Ok(None);
    }
    serde_json::to_string(settings)
        .map(Some)
        .map_err(|e| StoreError::Corrupt(format!("settings: {e}")))
}

/// Stores made before sessions had settings gain the column (NULL: none set).
pub fn add_settings_column(conn: &Connection) -> Result<(), StoreError> {
    let has: bool = conn
        .prepare("SELECT 1 FROM pragma_table_info('sessions') WHERE name = 'settings'")?
        .exists([])?;
    if !has {
        conn.execute_batch("ALTER TABLE sessions ADD COLUMN settings TEXT;")?;
    }
    Ok(())
}

pub fn migrate_event_rows(conn: &mut Connection) -> Result<(), StoreError> {
    const MIGRATED_CHUNK: usize = 1024;
    let exists: Option<i64> = conn
        .query_row(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'events'",
            [],
            |r| r.get(0),
        )
        .optional()?;
    if exists.is_none() {
        return Ok(());
    }
    let tx = conn.transaction()?;
    {
        let mut select =
            tx.prepare("SELECT session_id, seq, at, json FROM events ORDER BY session_id, seq")?;
        let mut rows = select.query([])?;
        let mut parts: Vec<(String, Vec<EventRow>)> = Vec::new();
        while let Some(row) = rows.next()? {
            let session_id: String = row.get(0)?;
            let event = EventRow {
                seq: to_u64(row.get(1)?),
                at: to_u64(row.get(2)?),
                json: row.get(3)?,
            };
            let continues = parts.last().is_some_and(|(id, events)| {
                *id == session_id
                    && events.len() < MIGRATED_CHUNK
                    && events.last().is_some_and(|e| e.seq + 1 == event.seq)
            });
            match parts.last_mut() {
                Some((_, events)) if continues => events.push(event),
                _ => parts.push((session_id, vec![event])),
            }
        }
        let batch: Vec<SessionBatch<'_>> = parts
            .iter()
            .map(|(session_id, events)| SessionBatch {
                session_id,
                events: events.iter().map(EventRow::as_new).collect(),
                prune_below: None,
            })
            .collect();
        insert_chunks(&tx, &batch)?;
    }
    tx.execute_batch("DROP TABLE events")?;
    tx.commit()?;
    tracing::info!("event rows moved into chunks");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events(first: u64, n: u64) -> Vec<EventRow> {
        (first..first + n)
            .map(|seq| EventRow {
                seq,
                at: 1000 + seq,
                json: format!(r#"{{"seq":{seq}}}"#),
            })
            .collect()
    }

    fn commit(store: &Store, session_id: &str, rows: &[EventRow], prune_below: Option<u64>) {
        let batch = [SessionBatch {
            session_id,
            events: rows.iter().map(EventRow::as_new).collect(),
            prune_below,
        }];
        super::super::commit_events(
            &mut store.conn().unwrap(),
            &batch,
            &super::super::HistoryPolicy::default(),
            0,
        )
        .unwrap();
    }

    fn seqs(rows: &[EventRow]) -> Vec<u64> {
        rows.iter().map(|e| e.seq).collect()
    }

    #[test]
    fn the_tail_spans_chunks_and_pruning_keeps_the_head() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("host.db")).unwrap();
        commit(&store, "a", &events(1, 3), None);
        commit(&store, "b", &events(1, 2), None);
        commit(&store, "a", &events(4, 4), None);
        commit(&store, "a", &events(8, 2), None);
        let tail = store.event_tail("a", 5).unwrap();
        assert_eq!(seqs(&tail), [5, 6, 7, 8, 9]);
        assert_eq!(tail[0].at, 1005);
        assert_eq!(tail[0].json, r#"{"seq":5}"#);
        assert_eq!(
            seqs(&store.event_tail("a", 100).unwrap()),
            (1..=9).collect::<Vec<_>>()
        );
        assert_eq!(seqs(&store.event_tail("b", 100).unwrap()), [1, 2]);
        // Pruning drops whole chunks below the seq only: 4..=7 holds 5, so it stays.
        commit(&store, "a", &events(10, 1), Some(5));
        assert_eq!(
            seqs(&store.event_tail("a", 100).unwrap()),
            (4..=10).collect::<Vec<_>>()
        );
        commit(&store, "a", &[], Some(11));
        assert!(store.event_tail("a", 100).unwrap().is_empty());
        assert_eq!(
            store.event_head("a").unwrap(),
            10,
            "the head outlives its events"
        );
    }

    #[test]
    fn a_database_with_one_row_per_event_is_moved_into_chunks() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.db");
        {
            let conn = Connection::open(&path).unwrap();
            conn.execute_batch(
                "CREATE TABLE events (session_id TEXT NOT NULL, seq INTEGER NOT NULL,
                    at INTEGER NOT NULL, json TEXT NOT NULL, PRIMARY KEY (session_id, seq))
                    WITHOUT ROWID;",
            )
            .unwrap();
            // Session a was pruned below 3 and has a gap after 5; b has one event.
            for (session, seq) in [("a", 3), ("a", 4), ("a", 5), ("a", 9), ("b", 1)] {
                conn.execute(
                    "INSERT INTO events (session_id, seq, at, json) VALUES (?1, ?2, ?3, ?4)",
                    (
                        session,
                        seq,
                        100 + seq,
                        format!("{{\"s\":\"{session}{seq}\"}}"),
                    ),
                )
                .unwrap();
            }
        }
        let store = Store::open(&path).unwrap();
        let a = store.event_tail("a", 100).unwrap();
        assert_eq!(seqs(&a), [3, 4, 5, 9]);
        assert_eq!((a[3].at, a[3].json.as_str()), (109, r#"{"s":"a9"}"#));
        assert_eq!(seqs(&store.event_tail("b", 100).unwrap()), [1]);
        assert_eq!(store.event_head("a").unwrap(), 9);
        let old: Option<i64> = store
            .conn()
            .unwrap()
            .query_row(
                "SELECT 1 FROM sqlite_master WHERE name = 'events'",
                [],
                |r| r.get(0),
            )
            .optional()
            .unwrap();
        assert!(old.is_none(), "the old table is gone");
        drop(store);
        // Opening again finds nothing to move.
        assert_eq!(
            seqs(&Store::open(&path).unwrap().event_tail("a", 2).unwrap()),
            [5, 9]
        );
    }
}
