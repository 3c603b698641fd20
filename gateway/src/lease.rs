//! A replica's lease on the devices list (docs/architecture.md, "Gateway", "Revoking a
//! device"): it serves a device's calls only while its last check that it applied every change
//! of the devices bucket is younger than the lease; and the list of live replicas a revoke waits
//! for.

use async_nats::jetstream::kv;
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

    /// Whether this replica may serve a device's call: it knows every revoke older than its lease.
    pub fn current(&self) -> bool {
        let at = self.verified_at.load(Ordering::Acquire);
        at != 0 && self.born.elapsed().as_nanos() < u128::from(at) + self.lease.as_nanos()
    }

    pub fn verified(&self, at: Instant) {
        let since = at.duration_since(self.born).as_nanos().max(1);
        self.verified_at
            .store(u64::try_from(since).unwrap_or(u64::MAX), Ordering::Release);
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

/// The refusal of a device's call on a replica that cannot confirm it knows every revoke.
pub fn stale() -> AppError {
    AppError::new(
        ErrorCode::HostUnavailable,
        "this gateway replica cannot confirm its list of devices is current; retry, or reconnect to another replica",
    )
    .with_details(json!({"reason": "device_registry_stale"}))
    .with_retry_after_ms(1_000)
}
