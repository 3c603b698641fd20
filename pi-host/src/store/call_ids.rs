//! The ids of the calls a gateway routed here, each kept until no call signed that long ago
//! can pass the time check (`CALL_MAX_SKEW_MS`), so a call captured before a restart cannot be
//! run once more after it (docs/protocol.md §15.5, "Signed calls").

use super::{Store, StoreError};
use rusqlite::OptionalExtension;

impl Store {
    /// Records a routed call's id, signed at `signed_at`, and forgets the ids signed before
    /// `horizon`, in one transaction; false when the id was recorded already (a replay).
    pub fn record_call_id(
        &self,
        call_id: &str,
        signed_at: u64,
        horizon: u64,
    ) -> Result<bool, StoreError> {
        let (signed_at, horizon) = (as_sql(signed_at)?, as_sql(horizon)?);
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        tx.execute("DELETE FROM call_ids WHERE signed_at < ?1", [horizon])?;
        let seen: Option<i64> = tx
            .query_row(
                "SELECT signed_at FROM call_ids WHERE call_id = ?1",
                [call_id],
                |r| r.get(0),
            )
            .optional()?;
        if seen.is_some() {
            return Ok(false);
        }
        tx.execute(
            "INSERT INTO call_ids (call_id, signed_at) VALUES (?1, ?2)",
            (call_id, signed_at),
        )?;
        tx.commit()?;
        Ok(true)
    }
}

fn as_sql(ms: u64) -> Result<i64, StoreError> {
    i64::try_from(ms).map_err(|_| StoreError::Corrupt(format!("a time of {ms} ms")))
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    #[test]
    fn an_id_is_refused_again_until_its_window_passed_and_across_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("pi-host.db");
        let store = Store::open(&path).unwrap();
        assert!(store.record_call_id("c1", 1_000, 0).unwrap());
        assert!(!store.record_call_id("c1", 1_000, 0).unwrap());
        drop(store);
        let store = Store::open(&path).unwrap();
        // Signed exactly at the horizon: still kept.
        assert!(!store.record_call_id("c1", 1_000, 1_000).unwrap());
        // One past it: forgotten, as no call signed then passes the time check any more.
        assert!(store.record_call_id("c1", 1_000, 1_001).unwrap());
    }

    /// What keeping an id costs a routed call (docs/reliability.md §4.17): one transaction,
    /// on disk before it returns. A figure, not a check: `--run-ignored only --no-capture`.
    #[test]
    #[ignore]
    fn record_call_id_cost() {
        let dir = tempfile::tempdir().unwrap();
        let store = Store::open(&dir.path().join("pi-host.db")).unwrap();
        let n = 300u32;
        let began = std::time::Instant::now();
        for i in 0..u64::from(n) {
            assert!(
                store
                    .record_call_id(&format!("{i:032x}"), 1_000 + i, 0)
                    .unwrap()
            );
        }
        println!(
            "record_call_id: {:?} each, {n} in a row",
            began.elapsed() / n
        );
    }
}
