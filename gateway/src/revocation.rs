//! Revoking a device on every replica (docs/architecture.md, "Gateway", "Revoking a device").
//!
//! Each replica follows the devices bucket and, every fifth of its lease, checks that it has
//! applied every change the bucket held when the check began; it serves a device's calls only
//! while the last such check is younger than the lease, and drops its devices' connections
//! when it is not. A revoke therefore holds everywhere once every live replica has confirmed
//! it, or at the latest one lease after it was written: a replica that did not see it by then
//! (stopped, cut from NATS, its watch lost) no longer serves any device. A check counts only
//! once the replica's announcement of it is stored, so a replica that has not confirmed is
//! waited for only until one lease after its last announcement: one killed a lease ago costs
//! a revoke one check period, not a lease.

use crate::lease;
use crate::state::Gateway;
use futures_util::StreamExt;
use racp_proto::AppError;
use racp_server::connection::revoked;
use std::collections::HashSet;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;

/// Where a replica says it has applied a device's revoke ("<replica> <device> <revision>"): no
/// call of the device runs there any more and its connections there have stopped.
const APPLIED_SUBJECT: &str = "racp.gw.devices.applied";

/// Follows the devices bucket and keeps the lease for the life of the process; returns once
/// the replica is current for the first time, so it never serves before it knows.
pub async fn start(gateway: Arc<Gateway>) {
    tokio::spawn(follow_devices(gateway.clone()));
    let every = gateway.lease.every();
    let (told, first) = tokio::sync::oneshot::channel();
    tokio::spawn(keep_lease(gateway, every, Some(told)));
    let _ = first.await;
}

/// Revokes a device and returns once no replica serves it: every listed replica confirmed,
/// or the lease of each that did not has run out (docs/protocol.md §15, `device/revoke`).
pub async fn revoke(
    gateway: &Gateway,
    device_id: &str,
    by: &crate::devices::DeviceRecord,
) -> Result<(), AppError> {
    let this = &gateway.lease;
    // Listening before the write, so no confirmation can pass unseen.
    let confirmations = gateway
        .client
        .subscribe(APPLIED_SUBJECT)
        .await
        .map_err(crate::devices::unavailable)?;
    let revision = gateway.devices.revoke(device_id, by).await?;
    let written = Instant::now();
    let deadline = written + this.lease;
    // Who to wait for; when the list cannot be read, everyone is waited out (one lease).
    let listed = this.listed().await;
    let unlisted = listed.is_none();
    let mut waiting = listed.unwrap_or_default();
    waiting.insert(this.replica_id.clone());
    tracing::debug!(device_id, revision, replicas = ?waiting, "revoke written; waiting for the replicas");
    let mut heard = Confirmations {
        messages: confirmations,
        device_id,
        revision,
    };
    // A live replica confirms within milliseconds; by the end of one check period every check
    // that began before the write has its announcement stored (lease.rs, `lapsed_by`).
    heard
        .until(&mut waiting, deadline.min(written + this.every()))
        .await;
    if waiting.is_empty() && !unlisted {
        return Ok(());
    }
    // The rest are waited for until their last announcement's lease has run out (a replica
    // killed a lease ago costs nothing more), at most one lease since the write.
    let lapsed = if unlisted {
        None
    } else {
        this.lapsed_by(&gateway.js, &waiting).await
    };
    let until = lapsed.map_or(deadline, |lapsed| lapsed.min(deadline));
    heard.until(&mut waiting, until).await;
    if !waiting.is_empty() || unlisted {
        // Past their lease now: they refuse the device until they catch up.
        tokio::time::sleep_until(until).await;
        tracing::warn!(device_id, unconfirmed = ?waiting, "revoke not confirmed by every replica; their lease has passed");
    }
    Ok(())
}

/// The replicas' word that they applied a revoke (`APPLIED_SUBJECT`).
struct Confirmations<'a> {
    messages: async_nats::Subscriber,
    device_id: &'a str,
    revision: u64,
}

impl Confirmations<'_> {
    /// Takes confirmations of the revoke off `waiting` until it is empty or `until`.
    async fn until(&mut self, waiting: &mut HashSet<String>, until: Instant) {
        while !waiting.is_empty() {
            let Ok(Some(message)) = tokio::time::timeout_at(until, self.messages.next()).await
            else {
                return;
            };
            let text = String::from_utf8_lossy(&message.payload);
            let mut said = text.split(' ');
            if let (Some(replica), Some(device), Some(applied)) =
                (said.next(), said.next(), said.next())
                && device == self.device_id
                && applied
                    .parse::<u64>()
                    .is_ok_and(|applied| applied >= self.revision)
            {
                waiting.remove(replica);
            }
        }
    }
}

/// Applies the devices bucket's changes as they come, from the start after any loss of the watch.
async fn follow_devices(gateway: Arc<Gateway>) {
    loop {
        match gateway.devices.watch().await {
            Ok(mut watch) => {
                while let Some(entry) = watch.next().await {
                    match entry {
                        Ok(entry) => {
                            if let Some(device_id) = gateway.devices.apply(&entry) {
                                tokio::spawn(apply_revoke(
                                    gateway.clone(),
                                    device_id,
                                    entry.revision,
                                ));
                            }
                        }
                        Err(err) => tracing::warn!(error = %err, "the devices watch"),
                    }
                }
                tracing::warn!("the devices watch ended; following it again");
            }
            Err(err) => tracing::warn!(error = %err.message(), "cannot follow the devices bucket"),
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Closes the device's gate, waits for its running calls, ends its connections and waits until
/// they have stopped (as a host does), then says so to the replica that revoked it.
async fn apply_revoke(gateway: Arc<Gateway>, device_id: String, revision: u64) {
    let ended = gateway.connections.revoke(&device_id, &revoked()).await;
    tracing::info!(
        device_id,
        connections = ended,
        "device revoked on this replica"
    );
    let said = format!("{} {device_id} {revision}", gateway.lease.replica_id);
    if let Err(err) = gateway.client.publish(APPLIED_SUBJECT, said.into()).await {
        tracing::warn!(error = %err, "cannot confirm a revoke");
    }
}

/// Checks every `every` that all changes made before the check are applied and announces the
/// replica (the lease counts from the check's start once both are done), and drops its
/// devices' connections when the lease runs out.
async fn keep_lease(
    gateway: Arc<Gateway>,
    every: Duration,
    mut first: Option<tokio::sync::oneshot::Sender<()>>,
) {
    let this = &gateway.lease;
    let mut dropped = false;
    loop {
        let began = Instant::now();
        // The check and the announcement within one period, or the check does not count
        // (a revoke reads a replica's lease from its announcement: lease.rs, `lapsed_by`).
        let check = async {
            let last = gateway.devices.last_revision(&gateway.js).await.ok()?;
            if gateway.devices.applied() < last {
                return None;
            }
            this.announce()
                .await
                .map_err(|err| tracing::warn!(error = %err, "cannot announce this replica"))
                .ok()
        };
        if let Ok(Some(_)) = tokio::time::timeout(every, check).await {
            this.verified(began);
            dropped = false;
            if let Some(first) = first.take() {
                let _ = first.send(());
            }
        }
        if !this.current() && !dropped && first.is_none() {
            let n = gateway.connections.kill_devices(&lease::stale());
            tracing::warn!(
                connections = n,
                "cannot confirm the device list is current; devices' connections dropped"
            );
            dropped = true;
        }
        tokio::time::sleep_until(began + every).await;
    }
}
