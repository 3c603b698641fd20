//! A session's permission grants (docs/protocol.md, "Permissions"): what a person allowed
//! with "always", kept until the session's `session/configure` clears them, across restarts.

use super::{Store, StoreError};
use racp_proto::permission::{GrantScope, PermissionGrant};

fn scope_name(scope: GrantScope) -> &'static str {
    match scope {
        GrantScope::CommandPrefix => "command-prefix",
        GrantScope::Directory => "directory",
        GrantScope::Tool => "tool",
    }
}

fn scope_of(name: &str) -> Result<GrantScope, StoreError> {
    match name {
        "command-prefix" => Ok(GrantScope::CommandPrefix),
        "directory" => Ok(GrantScope::Directory),
        "tool" => Ok(GrantScope::Tool),
        other => Err(StoreError::Corrupt(format!("a grant's scope {other:?}"))),
    }
}

impl Store {
    /// Records a grant (once: the same grant again changes nothing).
    pub fn add_grant(
        &self,
        session_id: &str,
        grant: &PermissionGrant,
        at: u64,
    ) -> Result<(), StoreError> {
        let at = i64::try_from(at).map_err(|_| StoreError::Corrupt("a grant's time".into()))?;
        self.conn()?.execute(
            "INSERT OR IGNORE INTO grants (session_id, tool, scope, value, granted_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            (
                session_id,
                &grant.tool,
                scope_name(grant.scope),
                &grant.value,
                at,
            ),
        )?;
        Ok(())
    }

    /// A session's grants, oldest first.
    pub fn grants(&self, session_id: &str) -> Result<Vec<PermissionGrant>, StoreError> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare(
            "SELECT tool, scope, value FROM grants WHERE session_id = ?1
             ORDER BY granted_at, rowid",
        )?;
        let rows = stmt.query_map([session_id], |r| {
            Ok((
                r.get::<_, String>(0)?,
                r.get::<_, String>(1)?,
                r.get::<_, String>(2)?,
            ))
        })?;
        rows.map(|row| {
            let (tool, scope, value) = row?;
            Ok(PermissionGrant {
                tool,
                scope: scope_of(&scope)?,
                value,
            })
        })
        .collect()
    }

    /// Withdraws every grant of a session.
    pub fn clear_grants(&self, session_id: &str) -> Result<(), StoreError> {
        self.conn()?
            .execute("DELETE FROM grants WHERE session_id = ?1", [session_id])?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn grants_are_kept_once_in_order_and_cleared_per_session() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("host.db");
        let store = Store::open(&path).unwrap();
        let grant = |value: &str| PermissionGrant {
            tool: "bash".into(),
            scope: GrantScope::CommandPrefix,
            value: value.into(),
        };
        store.add_grant("s1", &grant("git status"), 1).unwrap();
        store.add_grant("s1", &grant("npm test"), 2).unwrap();
        store.add_grant("s1", &grant("git status"), 3).unwrap();
        store.add_grant("s2", &grant("ls"), 1).unwrap();
        drop(store);
        let store = Store::open(&path).unwrap();
        assert_eq!(
            store.grants("s1").unwrap(),
            [grant("git status"), grant("npm test")]
        );
        store.clear_grants("s1").unwrap();
        assert!(store.grants("s1").unwrap().is_empty());
        assert_eq!(store.grants("s2").unwrap(), [grant("ls")]);
    }
}
