//! The host's heartbeat record in the gateway's hosts bucket: who it is, its version, its
//! sessions. The gateway calls a host offline when its record is older than
//! `OFFLINE_AFTER_MS` by the NATS server's clock (no clock of the host's is trusted for that).

use super::Retry;
use crate::state::HostState;
use racp_proto::gateway::{HEARTBEAT_MS, HostRecord, heartbeat_subject};
use racp_server::clock::now_ms;
use std::sync::Arc;
use std::time::Duration;

/// Writes the record every `HEARTBEAT_MS`; `first` is told when the first one is stored.
pub async fn run(
    state: Arc<HostState>,
    client: async_nats::Client,
    first: tokio::sync::oneshot::Sender<()>,
) {
    let mut first = Some(first);
    let jetstream = async_nats::jetstream::new(client);
    let subject = heartbeat_subject(&state.host_id);
    let hostname = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|h| h.trim().to_string())
        .unwrap_or_default();
    let mut tick = tokio::time::interval(Duration::from_millis(HEARTBEAT_MS));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut retry = Retry::new();
    let mut warned = false;
    loop {
        tick.tick().await;
        let record = HostRecord {
            host_id: state.host_id.clone(),
            version: env!("CARGO_PKG_VERSION").to_string(),
            hostname: hostname.clone(),
            started_at: state.started_at,
            sessions: u32::try_from(state.sessions.list().len()).unwrap_or(u32::MAX),
            at: now_ms(),
            online: !state.is_draining(),
            capabilities: crate::methods::host::capabilities(&state),
        };
        let body = racp_server::wire::encode(&record);
        let written = match jetstream.publish(subject.clone(), body.into()).await {
            Ok(ack) => ack.await.map(|_| ()).map_err(|e| e.to_string()),
            Err(err) => Err(err.to_string()),
        };
        match written {
            Ok(()) => {
                if let Some(first) = first.take() {
                    let _ = first.send(());
                }
                retry.reset();
                warned = false;
            }
            Err(error) => {
                if !warned {
                    tracing::warn!(%error, "cannot write the gateway heartbeat; retrying");
                    warned = true;
                }
                retry.wait().await;
            }
        }
    }
}
