//! A replica's lease on the devices list (docs/architecture.md, "Gateway", "Revoking a
//! device"): it serves a device's calls only while its last check that it applied every change
//! of the devices bucket is younger than the lease; the list of live replicas a revoke waits
//! for; and how long a replica that has not confirmed a revoke may still serve, read from its
//! last announcement.

use async_nats::jetstream::{self, kv, stream::LastRawMessageErrorKind};
use futures_util::StreamExt;
use racp_proto::{AppError, ErrorCode};
use serde_json::json;
use std::collections::HashSet;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::time::Instant;

/// Live replicas: a key per replica, refreshed at every successful check.
pub const REPLICAS_BUCKET: &str = "racp_gw_replicas";
/// How long a replica that stopped announcing stays listed (a revoke waits at most a lease
/// for a listed replica, so a stale entry only slows a revoke down).
pub const REPLICA_RECORD_AGE: Duration = Duration::from_secs(60);
pub struct Lease {
    pub replica_id: String,
    pub lease: Duration,
    pub replicas: kv::Store,
    /// When the replica started: `verified_at` counts from it.
    born: Instant,
    /// When the last check that found every earlier change applied began, in ns after `born`
    /// (0: never). An atomic, as every device call reads it.
    verified_at: AtomicU64,
}

impl Lease {
    pub fn new(replicas: kv::Store, lease: Duration) -> Result<Self, AppError> {
        use ring::rand::SecureRandom;
        let mut id = [0u8; 8];
        ring::rand::SystemRandom::new()
            .fill(&mut id)
            .map_err(|_| AppError::new(ErrorCode::Internal, "the system random source failed"))?;
        let hex: String = id.iter().map(|b| format!("{b:02x}")).collect();
        Ok(Lease {
            replica_id: format!("gw_{hex}"),
            lease,
            replicas,
            born: Instant::now(),
            verified_at: AtomicU64::new(0),
        })
    }

    /// How often the replica checks it is current: a fifth of the lease. A check counts only
    /// when it and the replica's announcement are both done within this, which is what lets a
    /// revoke read a replica's lease from its last announcement ([`Lease::lapsed_by`]).
    pub fn every(&self) -> Duration {
        (self.lease / 5).max(Duration::from_millis(50))
    }

    /// Whether this replica may serve a device's call: it knows every revoke older than its lease.
    pub fn current(&self) -> bool {
        let at = self.verified_at.load(Ordering::Acquire);
        at != 0 && self.born.elapsed().as_nanos() < u128::from(at) + self.lease.as_nanos()
    }

    pub fn verified(&self, at: Instant) {
        let since = at.duration_since(self.born).as_nanos().max(1);
        // Never back: a slow check that began earlier must not shorten a later one's lease.
        self.verified_at
            .fetch_max(u64::try_from(since).unwrap_or(u64::MAX), Ordering::AcqRel);
    }

    /// The replicas announced in the last minute, or `None` when the list cannot be read.
    pub async fn listed(&self) -> Option<HashSet<String>> {
        let listing = async {
            let mut keys = self.replicas.keys().await.ok()?;
            let mut listed = HashSet::new();
            while let Some(key) = keys.next().await {
                listed.insert(key.ok()?);
            }
            Some(listed)
        };
        tokio::time::timeout(self.lease, listing)
            .await
            .ok()
            .flatten()
    }
}

impl Lease {
    /// Announces this replica in the replicas bucket (stored by the stream's leader, stamped
    /// with its time); returns the record's stream sequence.
    pub async fn announce(&self) -> Result<u64, kv::PutError> {
        self.replicas
            .put(&self.replica_id, bytes::Bytes::new())
            .await
    }

    /// When every replica in `waiting` has at the latest stopped serving on a check that began
    /// before now, read from its last announcement; `None` when that cannot be read (the
    /// caller then waits a whole lease).
    ///
    /// A check renews a replica's lease only when its announcement is stored within
    /// [`Lease::every`] of the check's start, so once that long has passed since a revoke was
    /// written, every check that began before the write (the only ones that may not know of
    /// it) has its announcement stored, after the check began: such a replica serves no
    /// device past its last announcement plus one lease. The announcement's age is read on
    /// one clock, the bucket's: this replica announces itself and compares the two records'
    /// times as the stream's leader stamped them (docs/architecture.md, "Gateway").
    pub async fn lapsed_by(
        &self,
        js: &jetstream::Context,
        waiting: &HashSet<String>,
    ) -> Option<Instant> {
        let read = async {
            let stream = js
                .get_stream_no_info(format!("KV_{REPLICAS_BUCKET}"))
                .await
                .ok()?;
            let stamped = |id: &str| {
                let subject = format!("$KV.{REPLICAS_BUCKET}.{id}");
                let stream = &stream;
                async move {
                    match stream.get_last_raw_message_by_subject(&subject).await {
                        Ok(record) => Some(Some(record.time.unix_timestamp_nanos())),
                        // Gone: not announced for longer than the bucket keeps a record.
                        Err(err) if err.kind() == LastRawMessageErrorKind::NoMessageFound => {
                            Some(None)
                        }
                        Err(_) => None,
                    }
                }
            };
            let announced = self.announce().await.ok()?;
            // Locally no earlier than the leader stamped the record just announced.
            let stored_by = Instant::now();
            let now = stream.get_raw_message(announced).await.ok()?;
            let now = now.time.unix_timestamp_nanos();
            let mut longest = Duration::ZERO;
            for id in waiting {
                longest = longest.max(left(self.lease, stamped(id).await?, now)?);
            }
            Some(stored_by + longest)
        };
        tokio::time::timeout(self.every(), read)
            .await
            .ok()
            .flatten()
    }
}

/// How much of a `lease` a replica that last announced itself at `announced` (ns on the bucket's
/// clock; `None`: no record) may have left at `now`; `None` when that is not known.
fn left(lease: Duration, announced: Option<i128>, now: i128) -> Option<Duration> {
    let Some(announced) = announced else {
        // The bucket dropped the record: its last announcement is older than the bucket keeps.
        return (lease <= REPLICA_RECORD_AGE).then_some(Duration::ZERO);
    };
    let ends = announced.saturating_add(i128::try_from(lease.as_nanos()).ok()?);
    let left = ends.saturating_sub(now).max(0);
    Some(Duration::from_nanos(
        u64::try_from(left).unwrap_or(u64::MAX),
    ))
}

/// The refusal of a device's call on a replica that cannot confirm it knows every revoke.
pub fn stale() -> AppError {
    AppError::new(
        ErrorCode::HostUnavailable,
        "this gateway replica cannot confirm its list of devices is current; retry, or reconnect to another replica",
    )
    .with_details(json!({"reason": "device_registry_stale"}))
    .with_retry_after_ms(1_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LEASE: Duration = Duration::from_secs(10);
    const NS: i128 = 1_000_000_000;

    #[test]
    fn a_replica_has_lease_left_until_one_lease_after_its_announcement() {
        let now = 100 * NS;
        assert_eq!(left(LEASE, Some(now - 10 * NS), now), Some(Duration::ZERO));
        assert_eq!(
            left(LEASE, Some(now - 10 * NS + 1), now),
            Some(Duration::from_nanos(1))
        );
        assert_eq!(left(LEASE, Some(now - 60 * NS), now), Some(Duration::ZERO));
        assert_eq!(left(LEASE, Some(now), now), Some(LEASE));
    }

    #[test]
    fn a_dropped_record_ends_only_a_lease_no_longer_than_the_bucket_keeps_records() {
        assert_eq!(left(REPLICA_RECORD_AGE, None, 0), Some(Duration::ZERO));
        let longer = REPLICA_RECORD_AGE + Duration::from_nanos(1);
        assert_eq!(left(longer, None, 0), None);
    }
}
