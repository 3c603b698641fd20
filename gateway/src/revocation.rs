//! Revoking a device on every replica (docs/architecture.md, "Gateway", "Revoking a device").
//!
//! Each replica follows the devices bucket and, every fifth of its lease, checks that it has
//! applied every change the bucket held when the check began; it serves a device's calls only
//! while the last such check is younger than the lease, and drops its devices' connections
//! when it is not. A revoke therefore holds everywhere once every live replica has confirmed
//! it, or at the latest one lease after it was written: a replica that did not see it by then
//! (stopped, cut from NATS, its watch lost) no longer serves any device.

use crate::lease;
use crate::state::Gateway;
use futures_util::StreamExt;
use racp_proto::AppError;
use racp_server::connection::revoked;
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
    let every = (gateway.lease.lease / 5).max(Duration::from_millis(50));
    let (told, first) = tokio::sync::oneshot::channel();
    tokio::spawn(keep_lease(gateway, every, Some(told)));
    let _ = first.await;
}

/// Revokes a device and returns once no replica serves it: every listed replica confirmed,
/// or a lease passed since the write (docs/protocol.md §15, `device/revoke`).
pub async fn revoke(
    gateway: &Gateway,
    device_id: &str,
    by: &crate::devices::DeviceRecord,
) -> Result<(), AppError> {
    let this = &gateway.lease;
    // Listening before the write, so no confirmation can pass unseen.
    let mut confirmations = gateway
        .client
        .subscribe(APPLIED_SUBJECT)
        .await
        .map_err(crate::devices::unavailable)?;
    let revision = gateway.devices.revoke(device_id, by).await?;
    let deadline = Instant::now() + this.lease;
    // Who to wait for; when the list cannot be read, everyone is waited out (one lease).
    let listed = this.listed().await;
    let unlisted = listed.is_none();
    let mut waiting = listed.unwrap_or_default();
    waiting.insert(this.replica_id.clone());
    tracing::debug!(device_id, revision, replicas = ?waiting, "revoke written; waiting for the replicas");
    while !waiting.is_empty() {
        let Ok(Some(message)) = tokio::time::timeout_at(deadline, confirmations.next()).await
        else {
            break;
        };
        let text = String::from_utf8_lossy(&message.payload);
        let mut said = text.split(' ');
        if let (Some(replica), Some(device), Some(applied)) =
            (said.next(), said.next(), said.next())
            && device == device_id
            && applied
                .parse::<u64>()
                .is_ok_and(|applied| applied >= revision)
        {
            waiting.remove(replica);
        }
    }
    tracing::debug!(device_id, unconfirmed = ?waiting, "revoke confirmations in");
    if !waiting.is_empty() || unlisted {
        // Past their lease now: they refuse the device until they catch up.
        tokio::time::sleep_until(deadline).await;
        tracing::warn!(device_id, unconfirmed = ?waiting, "revoke not confirmed by every replica; their lease has passed");
    }
    Ok(())
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

/// Checks every `every` that all changes made before the check are applied, announces the
/// replica, and drops its devices' connections when the lease runs out.
async fn keep_lease(
    gateway: Arc<Gateway>,
    every: Duration,
    mut first: Option<tokio::sync::oneshot::Sender<()>>,
) {
    let this = &gateway.lease;
    let mut dropped = false;
    loop {
        let began = Instant::now();
        let check = tokio::time::timeout(every, gateway.devices.last_revision(&gateway.js)).await;
        if let Ok(Ok(last)) = check
            && gateway.devices.applied() >= last
        {
            this.verified(began);
            dropped = false;
            if let Some(first) = first.take() {
                let _ = first.send(());
            }
            // Announced aside, so a slow acknowledgement never delays the next check.
            let (replicas, id) = (this.replicas.clone(), this.replica_id.clone());
            tokio::spawn(async move {
                if let Err(err) = replicas.put(&id, bytes::Bytes::new()).await {
                    tracing::warn!(error = %err, "cannot announce this replica");
                }
            });
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
