//! Approvals, kept so that an answer to one from before a restart is told what became of it.

use super::{Store, StoreError};
use racp_proto::methods::turn::{ApprovalInfo, ApprovalState};
use rusqlite::OptionalExtension;

fn encode(info: &ApprovalInfo) -> Result<String, StoreError> {
    serde_json::to_string(info)
        .map_err(|e| StoreError::Corrupt(format!("approval {}: {e}", info.approval_id)))
}

fn decode(json: &str) -> Result<ApprovalInfo, StoreError> {
    serde_json::from_str(json).map_err(|e| StoreError::Corrupt(format!("an approval: {e}")))
}

impl Store {
    /// Inserts or updates an approval.
    pub fn save_approval(&self, info: &ApprovalInfo) -> Result<(), StoreError> {
        let json = encode(info)?;
        let conn = self.conn()?;
        conn.execute(
            "INSERT INTO approvals (approval_id, session_id, pending, json) VALUES (?1, ?2, ?3, ?4)
             ON CONFLICT (approval_id) DO UPDATE SET pending = excluded.pending, json = excluded.json",
            (
                &info.approval_id,
                &info.session_id,
                info.state == ApprovalState::Pending,
                json,
            ),
        )?;
        Ok(())
    }

    pub fn approval(&self, approval_id: &str) -> Result<Option<ApprovalInfo>, StoreError> {
        let conn = self.conn()?;
        let json: Option<String> = conn
            .query_row(
                "SELECT json FROM approvals WHERE approval_id = ?1",
                [approval_id],
                |r| r.get(0),
            )
            .optional()?;
        json.as_deref().map(decode).transpose()
    }

    /// Approvals of a session still pending (after a restart: their agent is gone).
    pub fn pending_approvals(&self, session_id: &str) -> Result<Vec<ApprovalInfo>, StoreError> {
        let conn = self.conn()?;
        let mut stmt =
            conn.prepare("SELECT json FROM approvals WHERE session_id = ?1 AND pending = 1")?;
        let rows = stmt.query_map([session_id], |r| r.get::<_, String>(0))?;
        rows.map(|json| decode(&json?)).collect()
    }
}
