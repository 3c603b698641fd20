//! What every connection of one gateway replica shares: NATS, the buckets, settings, and the
//! open connections (with the gates that make a revoke final).

use crate::devices::Devices;
use crate::lease::Lease;
use async_nats::jetstream::{self, kv};
use racp_proto::fingerprint::CertSha256;
use racp_proto::{AppError, ErrorCode};
use racp_server::connections::Connections;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

pub struct Settings {
    pub listen: SocketAddr,
    pub heartbeat: Duration,
    pub max_frame_bytes: u32,
    pub max_connections: usize,
    pub max_in_flight: u32,
    pub max_subscriptions: u32,
    pub max_events_per_frame: usize,
    /// A live subscriber this many events behind the head is CLIENT_TOO_SLOW, as on a host.
    pub max_lag_events: u64,
    pub send_stall: Duration,
    pub requests_per_second: u32,
    pub request_burst: u32,
    pub allowed_origins: Vec<String>,
    /// Names the Host header may carry besides loopback ones.
    pub allowed_hosts: Vec<String>,
    /// The served certificate's SHA-256 (None with `--plain`).
    pub cert_sha256: Option<CertSha256>,
    /// How long this replica serves devices after it last confirmed it knows every revoke.
    pub revocation_lease: Duration,
    /// The bound on bytes held for clients (racp-server's budget.rs).
    pub max_held_bytes: usize,
}

pub struct Gateway {
    pub settings: Settings,
    pub client: async_nats::Client,
    /// The gateway's key: every routed call is signed with it (hosts trust its public half).
    pub signer: nkeys::KeyPair,
    pub js: jetstream::Context,
    pub hosts: kv::Store,
    pub devices: Devices,
    pub lease: Lease,
    pub rate: racp_server::ratelimit::RateLimiter,
    /// What every connection's requests and replies are charged to.
    pub budget: racp_server::budget::ByteBudget,
    /// The connection core's counters (racp-server's metrics.rs).
    pub metrics: racp_server::metrics::Metrics,
    /// Open connections and the per-device gates that make a revoke final, as on a host.
    pub connections: Connections,
    /// The sessions this replica follows, each with one JetStream consumer.
    pub feeds: crate::feed::Feeds,
    draining: AtomicBool,
}

impl Gateway {
    pub fn new(
        settings: Settings,
        client: async_nats::Client,
        buckets: crate::nats::Buckets,
        signer: nkeys::KeyPair,
    ) -> Result<Arc<Self>, AppError> {
        let lease = Lease::new(buckets.replicas, settings.revocation_lease)?;
        Ok(Arc::new(Gateway {
            budget: racp_server::budget::ByteBudget::new(settings.max_held_bytes),
            metrics: racp_server::metrics::Metrics::default(),
            rate: racp_server::ratelimit::RateLimiter::new(
                settings.requests_per_second,
                settings.request_burst,
            ),
            settings,
            js: jetstream::new(client.clone()),
            client,
            signer,
            hosts: buckets.hosts,
            devices: Devices::new(buckets.devices, buckets.pairings),
            lease,
            connections: Connections::default(),
            feeds: crate::feed::Feeds::default(),
            draining: AtomicBool::new(false),
        }))
    }

    /// Whether NATS is reachable now (the upgrade refuses with HOST_UNAVAILABLE when not).
    pub fn nats_up(&self) -> bool {
        self.client.connection_state() == async_nats::connection::State::Connected
    }

    /// Ends every connection on this replica (the replica is stopping), and waits up to
    /// `grace` for them to send their connection error and close.
    pub async fn drain(&self, grace: Duration) {
        self.draining.store(true, Ordering::Release);
        self.connections.end_all(&shutting_down(), grace).await;
    }

    pub fn is_draining(&self) -> bool {
        self.draining.load(Ordering::Acquire)
    }
}

pub fn shutting_down() -> AppError {
    AppError::new(
        ErrorCode::HostShuttingDown,
        "this gateway replica is stopping; reconnect (to any replica) and resume",
    )
}
