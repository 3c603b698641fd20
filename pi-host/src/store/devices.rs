//! Devices and pairing tokens. Only HMAC tags of secrets are stored.

use super::{Store, StoreError};
use racp_proto::Role;
use rusqlite::OptionalExtension;

#[derive(Debug, Clone)]
pub struct DeviceRow {
    pub device_id: String,
    pub name: String,
    pub roles: Vec<Role>,
    pub token_tag: Vec<u8>,
    pub created_at: u64,
    pub last_seen_at: Option<u64>,
    pub revoked: bool,
}

#[derive(Debug, Clone)]
pub struct PairingTokenRow {
    pub token_id: String,
    pub token_tag: Vec<u8>,
    pub roles: Vec<Role>,
    pub expires_at: u64,
    pub consumed: bool,
}

/// What happened when a pairing token was exchanged.
#[derive(Debug)]
pub enum PairingOutcome {
    Paired,
    /// Another connection consumed it first, or it was burned by failed attempts.
    AlreadyUsed,
    Expired,
    Unknown,
}

fn encode_roles(roles: &[Role]) -> String {
    roles
        .iter()
        .map(|r| r.as_str())
        .collect::<Vec<_>>()
        .join(",")
}

fn decode_roles(text: &str) -> Vec<Role> {
    text.split(',').filter_map(Role::from_name).collect()
}

fn to_u64(v: i64) -> u64 {
    u64::try_from(v).unwrap_or(0)
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

const DEVICE_COLUMNS: &str =
    "device_id, name, roles, token_tag, created_at, last_seen_at, revoked_at";

fn device_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<DeviceRow> {
    Ok(DeviceRow {
        device_id: r.get(0)?,
        name: r.get(1)?,
        roles: decode_roles(&r.get::<_, String>(2)?),
        token_tag: r.get(3)?,
        created_at: to_u64(r.get(4)?),
        last_seen_at: r.get::<_, Option<i64>>(5)?.map(to_u64),
        revoked: r.get::<_, Option<i64>>(6)?.is_some(),
    })
}

impl Store {
    pub fn device(&self, device_id: &str) -> Result<Option<DeviceRow>, StoreError> {
        let conn = self.conn()?;
        let row = conn
            .query_row(
                &format!("SELECT {DEVICE_COLUMNS} FROM devices WHERE device_id = ?1"),
                [device_id],
                device_row,
            )
            .optional()?;
        Ok(row)
    }

    /// Active (not revoked) devices, oldest first.
    pub fn devices(&self) -> Result<Vec<DeviceRow>, StoreError> {
        let conn = self.conn()?;
        let mut stmt = conn.prepare(&format!(
            "SELECT {DEVICE_COLUMNS} FROM devices WHERE revoked_at IS NULL
             ORDER BY created_at, device_id"
        ))?;
        let rows = stmt
            .query_map([], device_row)?
            .collect::<Result<Vec<_>, _>>()?;
        Ok(rows)
    }

    pub fn active_device_count(&self) -> Result<u64, StoreError> {
        let conn = self.conn()?;
        let n: i64 = conn.query_row(
            "SELECT COUNT(*) FROM devices WHERE revoked_at IS NULL",
            [],
            |r| r.get(0),
        )?;
        Ok(to_u64(n))
    }

    pub fn touch_device(&self, device_id: &str, now: u64) -> Result<(), StoreError> {
        let conn = self.conn()?;
        conn.execute(
            "UPDATE devices SET last_seen_at = ?2 WHERE device_id = ?1",
            (device_id, to_i64(now)),
        )?;
        Ok(())
    }

    /// Revokes a device; false when there was no such active device.
    pub fn revoke_device(&self, device_id: &str, now: u64) -> Result<bool, StoreError> {
        let conn = self.conn()?;
        let n = conn.execute(
            "UPDATE devices SET revoked_at = ?2 WHERE device_id = ?1 AND revoked_at IS NULL",
            (device_id, to_i64(now)),
        )?;
        Ok(n == 1)
    }

    pub fn insert_pairing_token(
        &self,
        token_id: &str,
        tag: &[u8],
        roles: &[Role],
        now: u64,
        expires_at: u64,
    ) -> Result<(), StoreError> {
        let conn = self.conn()?;
        conn.execute(
            "INSERT INTO pairing_tokens (token_id, token_tag, roles, created_at, expires_at)
             VALUES (?1, ?2, ?3, ?4, ?5)",
            (
                token_id,
                tag,
                encode_roles(roles),
                to_i64(now),
                to_i64(expires_at),
            ),
        )?;
        Ok(())
    }

    pub fn pairing_token(&self, token_id: &str) -> Result<Option<PairingTokenRow>, StoreError> {
        let conn = self.conn()?;
        let row = conn
            .query_row(
                "SELECT token_id, token_tag, roles, expires_at, consumed_at
                 FROM pairing_tokens WHERE token_id = ?1",
                [token_id],
                |r| {
                    Ok(PairingTokenRow {
                        token_id: r.get(0)?,
                        token_tag: r.get(1)?,
                        roles: decode_roles(&r.get::<_, String>(2)?),
                        expires_at: to_u64(r.get(3)?),
                        consumed: r.get::<_, Option<i64>>(4)?.is_some(),
                    })
                },
            )
            .optional()?;
        Ok(row)
    }

    /// Counts a wrong secret; at `max` failures the token is burned (consumed).
    pub fn fail_pairing_attempt(
        &self,
        token_id: &str,
        max: u32,
        now: u64,
    ) -> Result<(), StoreError> {
        let conn = self.conn()?;
        conn.execute(
            "UPDATE pairing_tokens SET failed_attempts = failed_attempts + 1,
                 consumed_at = CASE WHEN failed_attempts + 1 >= ?2 THEN COALESCE(consumed_at, ?3) ELSE consumed_at END
             WHERE token_id = ?1",
            (token_id, i64::from(max), to_i64(now)),
        )?;
        Ok(())
    }

    /// Consumes the pairing token and creates the device in one transaction, so that of any
    /// number of concurrent exchanges of one token exactly one succeeds.
    pub fn exchange_pairing_token(
        &self,
        token_id: &str,
        device: &DeviceRow,
        now: u64,
    ) -> Result<PairingOutcome, StoreError> {
        let mut conn = self.conn()?;
        let tx = conn.transaction()?;
        let claimed = tx.execute(
            "UPDATE pairing_tokens SET consumed_at = ?2
             WHERE token_id = ?1 AND consumed_at IS NULL AND expires_at > ?2",
            (token_id, to_i64(now)),
        )?;
        if claimed != 1 {
            let state: Option<(Option<i64>, i64)> = tx
                .query_row(
                    "SELECT consumed_at, expires_at FROM pairing_tokens WHERE token_id = ?1",
                    [token_id],
                    |r| Ok((r.get(0)?, r.get(1)?)),
                )
                .optional()?;
            return Ok(match state {
                None => PairingOutcome::Unknown,
                Some((Some(_), _)) => PairingOutcome::AlreadyUsed,
                Some((None, _)) => PairingOutcome::Expired,
            });
        }
        let name = distinct_name(&tx, &device.name)?;
        tx.execute(
            "INSERT INTO devices (device_id, name, roles, token_tag, created_at, last_seen_at)
             VALUES (?1, ?2, ?3, ?4, ?5, ?5)",
            (
                &device.device_id,
                &name,
                encode_roles(&device.roles),
                &device.token_tag,
                to_i64(now),
            ),
        )?;
        tx.commit()?;
        Ok(PairingOutcome::Paired)
    }
}

/// `wanted`, or `wanted (2)`, `wanted (3)`, ... when a device that is not revoked has the name
/// already: two laptops that both say "laptop" stay apart in `devices` and `device/list`.
fn distinct_name(tx: &rusqlite::Transaction<'_>, wanted: &str) -> Result<String, StoreError> {
    let mut statement = tx.prepare("SELECT name FROM devices WHERE revoked_at IS NULL")?;
    let taken: std::collections::HashSet<String> = statement
        .query_map([], |r| r.get::<_, String>(0))?
        .collect::<Result<_, _>>()?;
    if !taken.contains(wanted) {
        return Ok(wanted.to_string());
    }
    for n in 2u32.. {
        let suffix = format!(" ({n})");
        // Within the name bound, the suffix included.
        let max = usize::try_from(racp_proto::limits::MAX_NAME_CHARS).unwrap_or(usize::MAX);
        let keep = max.saturating_sub(suffix.chars().count());
        let candidate: String = wanted.chars().take(keep).collect::<String>() + &suffix;
        if !taken.contains(&candidate) {
            return Ok(candidate);
        }
    }
    Ok(wanted.to_string())
}
