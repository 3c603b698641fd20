//! What every connection of one gateway replica shares: NATS, the buckets, settings, and the
//! open connections (kill switches for revoked devices).

use crate::devices::Devices;
use crate::revocation::Revocation;
use async_nats::jetstream::{self, kv};
use dashmap::DashMap;
use racp_proto::fingerprint::CertSha256;
use racp_proto::{AppError, ErrorCode};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;
use tokio::sync::watch;

pub struct Settings {
    pub listen: SocketAddr,
    pub heartbeat: Duration,
    pub max_frame_bytes: u32,
    pub max_in_flight: u32,
    pub max_subscriptions: u32,
    pub max_events_per_frame: usize,
    pub send_stall: Duration,
    pub requests_per_second: u32,
    pub request_burst: u32,
    pub allowed_origins: Vec<String>,
    /// The served certificate's SHA-256 (None with `--plain`).
    pub cert_sha256: Option<CertSha256>,
    /// How long this replica serves devices after it last confirmed it knows every revoke.
    pub revocation_lease: Duration,
}

pub struct Gateway {
    pub settings: Settings,
    pub client: async_nats::Client,
    pub js: jetstream::Context,
    pub hosts: kv::Store,
    pub devices: Devices,
    pub revocation: Revocation,
    pub rate: pi_host::ratelimit::RateLimiter,
    connections: DashMap<u64, (Option<String>, watch::Sender<Option<AppError>>)>,
    next_connection: AtomicU64,
}

impl Gateway {
    pub fn new(
        settings: Settings,
        client: async_nats::Client,
        buckets: crate::nats::Buckets,
    ) -> Result<Arc<Self>, AppError> {
        let revocation = Revocation::new(buckets.replicas, settings.revocation_lease)?;
        Ok(Arc::new(Gateway {
            rate: pi_host::ratelimit::RateLimiter::new(
                settings.requests_per_second,
                settings.request_burst,
            ),
            settings,
            js: jetstream::new(client.clone()),
            client,
            hosts: buckets.hosts,
            devices: Devices::new(buckets.devices, buckets.pairings),
            revocation,
            connections: DashMap::new(),
            next_connection: AtomicU64::new(1),
        }))
    }

    /// Whether NATS is reachable now (the upgrade refuses with HOST_UNAVAILABLE when not).
    pub fn nats_up(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    pub fn register(&self, device_id: Option<String>) -> (u64, watch::Receiver<Option<AppError>>) {
        let id = self.next_connection.fetch_add(1, Ordering::Relaxed);
        let (kill, killed) = watch::channel(None);
        self.connections.insert(id, (device_id, kill));
        (id, killed)
    }

    pub fn unregister(&self, id: u64) {
        self.connections.remove(&id);
    }

    /// Ends every connection on this replica (the replica is stopping), and waits up to
    /// `grace` for them to send their connection error and close.
    pub async fn drain(&self, grace: Duration) {
        let error = AppError::new(
            ErrorCode::HostShuttingDown,
            "this gateway replica is stopping; reconnect (to any replica) and resume",
        );
        for entry in self.connections.iter() {
            let _ = entry.value().1.send(Some(error.clone()));
        }
        let deadline = tokio::time::Instant::now() + grace;
        while !self.connections.is_empty() && tokio::time::Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Ends every connection of a device on this replica.
    pub fn kill_device(&self, device_id: &str, error: &AppError) -> usize {
        self.kill_where(|device| device == Some(device_id), error)
    }

    /// Ends every device's connection on this replica (those still pairing stay).
    pub fn kill_devices(&self, error: &AppError) -> usize {
        self.kill_where(|device| device.is_some(), error)
    }

    fn kill_where(&self, chosen: impl Fn(Option<&str>) -> bool, error: &AppError) -> usize {
        let mut killed = 0;
        for entry in self.connections.iter() {
            if chosen(entry.value().0.as_deref()) {
                let _ = entry.value().1.send(Some(error.clone()));
                killed += 1;
            }
        }
        killed
    }
}
