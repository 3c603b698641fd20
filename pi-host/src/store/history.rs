//! A session's history: the events that hold its conversation (each message whole, each
//! compaction's summary, each shell command: `racp_proto::events::EventType::kept_in_history`), kept past the event log's
//! retention (docs/protocol.md §7.24). The group-commit writer inserts them in the same
//! transaction as the events themselves, so an entry is durable exactly when its event is, and
//! a history position is an event position.

use super::sessions::{EventRow, SessionBatch};
use super::{Store, StoreError};
use racp_proto::Cursor;
use racp_proto::events::Event;
use racp_proto::events::EventType;
use rusqlite::{Connection, OptionalExtension, Transaction};
use std::time::Duration;

const SCHEMA: &str = "
CREATE TABLE history (
    session_id TEXT NOT NULL,
    seq        INTEGER NOT NULL,
    at         INTEGER NOT NULL,
    json       TEXT NOT NULL,
    PRIMARY KEY (session_id, seq)
);";

/// What the host keeps of each session's history (docs/protocol.md §7.24, "Bounds"). The
/// default keeps everything, as pi keeps its own session file.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HistoryPolicy {
    /// Most bytes of entries per session.
    pub max_bytes: Option<u64>,
    /// Entries older than this go.
    pub max_age: Option<Duration>,
    pub at_bound: AtBound,
}

/// What happens to a session's history over `max_bytes`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Deserialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum AtBound {
    /// The oldest entries go, whole.
    #[default]
    DropOldest,
    /// The oldest entries over 4 KiB are cut to 4 KiB first (their largest strings, as in
    /// docs/protocol.md §8.6: every message keeps its place, its role and its small parts);
    /// entries go, oldest first, only when cutting is not enough.
    CutOldest,
}

/// An entry over this is cut to it by [`AtBound::CutOldest`].
const CUT_TO: usize = 4 << 10;

impl HistoryPolicy {
    fn is_unbounded(&self) -> bool {
        self.max_bytes.is_none() && self.max_age.is_none()
    }
}

/// Whether the stored event `json` belongs to the history.
pub fn holds(json: &str) -> bool {
    serde_json::from_str::<Event>(json)
        .ok()
        .is_some_and(|event| EventType::kept_in_history(&event.kind))
}

/// Creates the table; a store that had none gains the history its retained events hold.
pub fn create(conn: &mut Connection) -> Result<(), StoreError> {
    let exists = conn
        .prepare("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'history'")?
        .exists([])?;
    if exists {
        return Ok(());
    }
    let tx = conn.transaction()?;
    tx.execute_batch(SCHEMA)?;
    {
        let mut chunks =
            tx.prepare("SELECT session_id, first_seq, body FROM event_chunks ORDER BY rowid")?;
        let mut insert = tx.prepare(
            "INSERT OR IGNORE INTO history (session_id, seq, at, json) VALUES (?1, ?2, ?3, ?4)",
        )?;
        let mut rows = chunks.query([])?;
        while let Some(row) = rows.next()? {
            let session_id: String = row.get(0)?;
            let first_seq: i64 = row.get(1)?;
            let body = row
                .get_ref(2)?
                .as_blob()
                .map_err(|e| StoreError::Corrupt(format!("event chunk: {e}")))?;
            for ((at, json), seq) in super::chunk::decode(body)?.into_iter().zip(first_seq..) {
                if holds(&json) {
                    insert.execute((&session_id, seq, at as i64, &json))?;
                }
            }
        }
    }
    tx.commit()?;
    Ok(())
}

/// Inserts the history entries of a group commit, then applies `policy` to each session that
/// gained one (inside the commit's transaction: the bound holds whenever an entry is visible).
pub(super) fn insert(
    tx: &Transaction<'_>,
    batch: &[SessionBatch<'_>],
    policy: &HistoryPolicy,
    now: u64,
) -> Result<(), StoreError> {
    let mut insert = tx.prepare_cached(
        "INSERT OR IGNORE INTO history (session_id, seq, at, json) VALUES (?1, ?2, ?3, ?4)",
    )?;
    for part in batch {
        let mut gained = false;
        for event in part.events.iter().filter(|e| e.history) {
            insert.execute((
                part.session_id,
                event.seq as i64,
                event.at as i64,
                event.json,
            ))?;
            gained = true;
        }
        if gained && !policy.is_unbounded() {
            enforce(tx, part.session_id, policy, now)?;
        }
    }
    Ok(())
}

/// Brings one session's history within `policy`'s bounds; what goes is recorded, so a page
/// that reaches the oldest entry left says the history was truncated.
fn enforce(
    tx: &Transaction<'_>,
    session_id: &str,
    policy: &HistoryPolicy,
    now: u64,
) -> Result<(), StoreError> {
    if let Some(age) = policy.max_age {
        let before = now.saturating_sub(age.as_millis() as u64);
        let dropped: Option<i64> = tx
            .query_row(
                "SELECT MAX(seq) FROM history WHERE session_id = ?1 AND at < ?2",
                (session_id, before as i64),
                |r| r.get(0),
            )
            .optional()?
            .flatten();
        if let Some(seq) = dropped {
            drop_through(tx, session_id, seq)?;
        }
    }
    let Some(max_bytes) = policy.max_bytes else {
        return Ok(());
    };
    let mut total = total_bytes(tx, session_id)?;
    if total <= max_bytes {
        return Ok(());
    }
    if policy.at_bound == AtBound::CutOldest {
        total = cut_oldest(tx, session_id, total, max_bytes)?;
    }
    if total > max_bytes {
        // Oldest first, until what is left fits.
        let mut rows = tx.prepare_cached(
            "SELECT seq, length(CAST(json AS BLOB)) FROM history WHERE session_id = ?1 ORDER BY seq",
        )?;
        let mut rows = rows.query([session_id])?;
        let mut through = None;
        while total > max_bytes {
            let Some(row) = rows.next()? else { break };
            total = total.saturating_sub(row.get::<_, i64>(1)? as u64);
            through = Some(row.get::<_, i64>(0)?);
        }
        drop(rows);
        if let Some(seq) = through {
            drop_through(tx, session_id, seq)?;
        }
    }
    Ok(())
}

fn total_bytes(tx: &Transaction<'_>, session_id: &str) -> Result<u64, StoreError> {
    let total: i64 = tx.query_row(
        "SELECT COALESCE(SUM(length(CAST(json AS BLOB))), 0) FROM history WHERE session_id = ?1",
        [session_id],
        |r| r.get(0),
    )?;
    Ok(total as u64)
}

/// Cuts the oldest entries over [`CUT_TO`] (not cut before) until the total fits; returns the
/// new total.
fn cut_oldest(
    tx: &Transaction<'_>,
    session_id: &str,
    mut total: u64,
    max_bytes: u64,
) -> Result<u64, StoreError> {
    let large: Vec<(i64, String)> = {
        let mut select = tx.prepare_cached(
            "SELECT seq, json FROM history WHERE session_id = ?1
             AND length(CAST(json AS BLOB)) > ?2 ORDER BY seq",
        )?;
        let rows = select.query_map((session_id, CUT_TO as i64), |r| Ok((r.get(0)?, r.get(1)?)))?;
        rows.collect::<Result<_, _>>()?
    };
    let mut update =
        tx.prepare_cached("UPDATE history SET json = ?3 WHERE session_id = ?1 AND seq = ?2")?;
    for (seq, json) in large {
        if total <= max_bytes {
            break;
        }
        let Ok(event) = serde_json::from_str::<Event>(&json) else {
            continue;
        };
        if event.elided.is_some() {
            continue;
        }
        let from = Cursor::new(event.cursor.epoch, event.seq.saturating_sub(1));
        let cut = racp_proto::elide::elide(&json, CUT_TO, CUT_TO, from);
        total = total.saturating_sub(json.len() as u64) + cut.len() as u64;
        update.execute((session_id, seq, &cut))?;
    }
    Ok(total)
}

/// Drops a session's entries up to and including `seq`, and records that it did.
fn drop_through(tx: &Transaction<'_>, session_id: &str, seq: i64) -> Result<(), StoreError> {
    tx.execute(
        "DELETE FROM history WHERE session_id = ?1 AND seq <= ?2",
        (session_id, seq),
    )?;
    tx.execute(
        "INSERT INTO meta (key, value) VALUES ('history-dropped:' || ?1, ?2)
         ON CONFLICT (key) DO UPDATE SET value = excluded.value",
        (session_id, seq.to_string()),
    )?;
    Ok(())
}

/// What reading a session's history back found beyond the entries taken.
pub struct Backwards {
    /// Whether an entry older than the last one taken is stored.
    pub more: bool,
    /// Whether the policy dropped entries older than every one stored.
    pub truncated: bool,
}

impl Store {
    /// Reads a session's history back from `up_to_seq`: `take` gets each entry, newest first,
    /// until it says it has enough.
    pub fn history_back(
        &self,
        session_id: &str,
        up_to_seq: u64,
        mut take: impl FnMut(EventRow) -> bool,
    ) -> Result<Backwards, StoreError> {
        let conn = self.conn()?;
        let mut select = conn.prepare_cached(
            "SELECT seq, at, json FROM history WHERE session_id = ?1 AND seq <= ?2
             ORDER BY seq DESC",
        )?;
        let mut rows = select.query((session_id, up_to_seq as i64))?;
        let mut more = false;
        while let Some(row) = rows.next()? {
            let entry = EventRow {
                seq: row.get::<_, i64>(0)? as u64,
                at: row.get::<_, i64>(1)? as u64,
                json: row.get(2)?,
            };
            if !take(entry) {
                more = true;
                break;
            }
        }
        drop(rows);
        let truncated = !more
            && conn
                .query_row(
                    "SELECT 1 FROM meta WHERE key = 'history-dropped:' || ?1",
                    [session_id],
                    |_| Ok(()),
                )
                .optional()?
                .is_some();
        Ok(Backwards { more, truncated })
    }
}

impl Store {
    /// At most `limit` entries of a session's history after `after_seq` and before
    /// `before_seq`, oldest first: a fork copies them in batches (turns/branch.rs).
    pub fn history_between(
        &self,
        session_id: &str,
        after_seq: u64,
        before_seq: u64,
        limit: usize,
    ) -> Result<Vec<EventRow>, StoreError> {
        let conn = self.conn()?;
        let mut select = conn.prepare_cached(
            "SELECT seq, at, json FROM history WHERE session_id = ?1 AND seq > ?2 AND seq < ?3
             ORDER BY seq LIMIT ?4",
        )?;
        let rows = select.query_map(
            (
                session_id,
                after_seq as i64,
                before_seq as i64,
                limit as i64,
            ),
            |row| {
                Ok(EventRow {
                    seq: row.get::<_, i64>(0)? as u64,
                    at: row.get::<_, i64>(1)? as u64,
                    json: row.get(2)?,
                })
            },
        )?;
        Ok(rows.collect::<Result<Vec<_>, _>>()?)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]
    use super::*;
    use crate::store::{NewEvent, commit_events};

    fn event(seq: u64, kind: &str, text: &str) -> String {
        serde_json::json!({
            "seq": seq, "cursor": format!("0000000000000007-{seq}"), "type": kind, "at": seq,
            "data": {"type": "message_end", "message": {"role": "user", "content": text}},
        })
        .to_string()
    }

    fn store() -> (tempfile::TempDir, Store, Connection) {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.db");
        let store = Store::open(&path).unwrap();
        let conn = crate::store::connect(&path).unwrap();
        (dir, store, conn)
    }

    /// Commits `texts` as events 1..: every other one a message (history), the rest updates.
    fn commit(conn: &mut Connection, texts: &[String], policy: &HistoryPolicy, first: u64) {
        let jsons: Vec<String> = texts
            .iter()
            .enumerate()
            .map(|(i, text)| {
                let kind = if i % 2 == 0 {
                    "agent.message_end"
                } else {
                    "agent.message_update"
                };
                event(first + i as u64, kind, text)
            })
            .collect();
        let events = jsons
            .iter()
            .enumerate()
            .map(|(i, json)| NewEvent {
                seq: first + i as u64,
                at: first + i as u64,
                json,
                history: holds(json),
            })
            .collect();
        let batch = [SessionBatch {
            session_id: "ses_1",
            events,
            prune_below: None,
        }];
        commit_events(conn, &batch, policy, 1000).unwrap();
    }

    fn read_back(store: &Store, up_to: u64) -> (Vec<u64>, Backwards) {
        let mut seqs = Vec::new();
        let back = store
            .history_back("ses_1", up_to, |row| {
                seqs.push(row.seq);
                true
            })
            .unwrap();
        (seqs, back)
    }

    #[test]
    fn messages_are_kept_with_their_event_positions_and_read_back_newest_first() {
        let (_dir, store, mut conn) = store();
        let texts: Vec<String> = (0..6).map(|i| format!("m{i}")).collect();
        commit(&mut conn, &texts, &HistoryPolicy::default(), 1);
        let (seqs, back) = read_back(&store, 6);
        assert_eq!(seqs, [5, 3, 1]);
        assert!(!back.more && !back.truncated);
        let (seqs, _) = read_back(&store, 4);
        assert_eq!(seqs, [3, 1]);
        let mut taken = 0;
        let back = store
            .history_back("ses_1", 6, |_| {
                taken += 1;
                taken < 2
            })
            .unwrap();
        assert!(back.more);
    }

    #[test]
    fn a_byte_bound_drops_or_cuts_the_oldest_entries() {
        let big = "x".repeat(10_000);
        let texts: Vec<String> = (0..8).map(|_| big.clone()).collect();

        let (_dir, store, mut conn) = store();
        let drop_oldest = HistoryPolicy {
            max_bytes: Some(25_000),
            ..HistoryPolicy::default()
        };
        commit(&mut conn, &texts, &drop_oldest, 1);
        let (seqs, back) = read_back(&store, 8);
        assert_eq!(seqs, [7, 5], "the two newest fit 25 000 bytes");
        assert!(back.truncated);

        let (_dir, store, mut conn) = self::store();
        let cut_oldest = HistoryPolicy {
            max_bytes: Some(25_000),
            at_bound: AtBound::CutOldest,
            ..HistoryPolicy::default()
        };
        commit(&mut conn, &texts, &cut_oldest, 1);
        let mut rows = Vec::new();
        let back = store
            .history_back("ses_1", 8, |row| {
                rows.push(row);
                true
            })
            .unwrap();
        let seqs: Vec<u64> = rows.iter().map(|r| r.seq).collect();
        assert_eq!(seqs, [7, 5, 3, 1], "every message keeps its place");
        assert!(!back.truncated);
        let cut: Vec<bool> = rows.iter().map(|r| r.json.contains("\"elided\"")).collect();
        assert_eq!(cut, [false, true, true, true], "the oldest are cut first");
        assert!(rows.iter().all(|r| r.json.contains("\"role\":\"user\"")));
    }

    #[test]
    fn an_age_bound_drops_old_entries() {
        let (_dir, store, mut conn) = store();
        let policy = HistoryPolicy {
            // `commit` writes at = seq and now = 1000: entries before 996 are too old.
            max_age: Some(Duration::from_millis(4)),
            ..HistoryPolicy::default()
        };
        let texts: Vec<String> = (0..4).map(|i| format!("m{i}")).collect();
        commit(&mut conn, &texts, &policy, 995);
        let (seqs, back) = read_back(&store, 2000);
        assert_eq!(seqs, [997]);
        assert!(back.truncated);
    }

    #[test]
    fn a_store_without_history_gains_it_from_its_retained_events() {
        let (dir, store, mut conn) = store();
        let texts: Vec<String> = (0..4).map(|i| format!("m{i}")).collect();
        commit(&mut conn, &texts, &HistoryPolicy::default(), 1);
        drop(store);
        conn.execute_batch("DROP TABLE history").unwrap();
        drop(conn);
        let store = Store::open(&dir.path().join("host.db")).unwrap();
        let (seqs, _) = read_back(&store, 4);
        assert_eq!(seqs, [3, 1]);
    }
}
