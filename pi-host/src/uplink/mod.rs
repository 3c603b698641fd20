//! The host's link to a gateway (docs/architecture.md, "Gateway"): with `--gateway`, the host
//! dials out to NATS with its own nkey and, while the link is up,
//! - writes its heartbeat record to the hosts bucket (`heartbeat.rs`),
//! - answers the RACP calls the gateway routes to it (`calls.rs`), when a trusted gateway
//!   signed them (racp-server's `uplink/signed.rs`),
//! - publishes every committed event to its JetStream stream (`relay.rs`).
//!
//! The host's own log stays the source of truth, and local clients are served whether or not
//! NATS is reachable: the client library reconnects on its own, and each task retries. The link
//! is TLS unless `--gateway` says `nats://` (racp-server's `uplink/link.rs`).
//!
//! The host announces itself before it reports ready: `serve` waits (at most
//! [`ANNOUNCE_PATIENCE`]) until its call subscription is in place on the server and its first
//! heartbeat is stored, so a call routed to it once it printed "listening" reaches it.

mod calls;
mod heartbeat;
mod relay;

use crate::state::HostState;
use racp_proto::gateway::host_inbox_prefix;
use racp_server::uplink::{key, link, signed};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::oneshot;

/// How long `serve` waits for the gateway to know the host before it serves anyway (local
/// clients do not need NATS; the link keeps trying).
pub const ANNOUNCE_PATIENCE: Duration = Duration::from_secs(10);

/// Whether the host got announced to the gateway: resolves once its call subscription is in
/// place and its first heartbeat is stored, or with the reason it cannot be yet.
pub struct Announced(Option<oneshot::Receiver<Result<(), String>>>);

impl Announced {
    /// Waits for the announcement, at most `patience`; `Ok` also when there is no gateway.
    pub async fn wait(self, patience: Duration) -> Result<(), String> {
        let Some(receiver) = self.0 else {
            return Ok(());
        };
        match tokio::time::timeout(patience, receiver).await {
            Ok(Ok(outcome)) => outcome,
            Ok(Err(_)) => Err("the gateway link stopped".into()),
            Err(_) => Err(format!(
                "NATS did not answer within {} s",
                patience.as_secs()
            )),
        }
    }
}

/// Starts the link when the host has a gateway; returns at once (the connection is made, and
/// remade, in the background) with what tells when the gateway knows the host.
pub fn spawn(state: &Arc<HostState>) -> Result<Announced, String> {
    if state.config.gateway.is_empty() {
        return Ok(Announced(None));
    }
    let seed = key::load_or_create(&state.config.data_dir).map_err(|e| e.to_string())?;
    let verifier = Arc::new(signed::Verifier::new(&state.config.gateway_trust)?);
    let servers = link::Servers::parse(&state.config.gateway).map_err(|e| e.to_string())?;
    servers.warn_if_cleartext("gateway");
    let tls = link::Tls {
        ca: state.config.gateway_ca.clone(),
        ca_flag: "--gateway-ca",
    };
    let host_id = state.host_id.clone();
    let nkey = seed.seed;
    let base = move || {
        async_nats::ConnectOptions::with_nkey(nkey.clone())
            // Replies to this host come to its own inbox, so its credential reads no one else's.
            .custom_inbox_prefix(host_inbox_prefix(&host_id))
    };
    let options = tls.apply(base(), &servers).map_err(|e| e.to_string())?;
    let options = redialing(options, &state.host_id, state.metrics.nats_link.clone());
    let state = state.clone();
    let (announced, announcement) = oneshot::channel();
    tokio::spawn(async move {
        let mut announced = Some(announced);
        // A certificate that does not verify is reported as such (the client would retry it
        // in silence); the link keeps retrying, as for a server that is down.
        if let Err(err) = tls.check(&servers, base()).await {
            tracing::error!(error = %err, "cannot link to the gateway");
            if let Some(announced) = announced.take() {
                let _ = announced.send(Err(err.to_string()));
            }
        }
        let client = match options.connect(servers.addrs.clone()).await {
            Ok(client) => client,
            Err(err) => {
                tracing::error!(error = %err, gateway = %servers.shown(), "cannot use the gateway address");
                if let Some(announced) = announced.take() {
                    let _ = announced.send(Err(err.to_string()));
                }
                return;
            }
        };
        let _ = state.metrics.nats.set(client.clone()); // for `/readyz`'s `nats` check
        // Calls are taken before the first heartbeat says the host is online.
        let calls = calls::subscribe(&state, &client).await;
        let (first_beat, beaten) = oneshot::channel();
        tokio::spawn(heartbeat::run(state.clone(), client.clone(), first_beat));
        tokio::spawn(relay::run(state.clone(), client.clone()));
        let serving = tokio::spawn(calls::run(state, client, verifier, calls));
        if beaten.await.is_ok()
            && let Some(announced) = announced.take()
        {
            tracing::info!("announced to the gateway");
            let _ = announced.send(Ok(()));
        }
        let _ = serving.await;
    });
    Ok(Announced(Some(announcement)))
}

/// `options` for a link that is made again whenever it drops, and logs and counts when it does.
fn redialing(
    options: async_nats::ConnectOptions,
    host_id: &str,
    counted: racp_server::metrics::NatsLink,
) -> async_nats::ConnectOptions {
    options
        .name(format!("pi-host {host_id}"))
        .retry_on_initial_connect()
        .max_reconnects(None)
        .connection_timeout(Duration::from_secs(5))
        .request_timeout(Some(Duration::from_secs(10)))
        .reconnect_delay_callback(backoff)
        .event_callback(move |event| {
            counted.event(&event);
            async move { log_link(event) }
        })
}

fn log_link(event: async_nats::Event) {
    match event {
        async_nats::Event::Connected => tracing::info!("gateway link up"),
        async_nats::Event::Disconnected => tracing::warn!("gateway link down; retrying"),
        other => tracing::warn!(event = %other, "gateway link"),
    }
}

/// Reconnect delay: doubling from 100 ms to 5 s, with jitter from the attempt count so many
/// hosts cut at once do not come back in step.
fn backoff(attempt: usize) -> Duration {
    let base = 100u64.saturating_mul(1 << attempt.min(6)).min(5_000);
    let jitter = (attempt as u64).wrapping_mul(7919) % (base / 4 + 1);
    Duration::from_millis(base - jitter)
}

/// Waits with doubling delays (50 ms to 2 s) between tries of an operation that needs NATS.
struct Retry {
    delay: Duration,
}

impl Retry {
    fn new() -> Self {
        Retry {
            delay: Duration::from_millis(50),
        }
    }

    async fn wait(&mut self) {
        tokio::time::sleep(self.delay).await;
        self.delay = (self.delay * 2).min(Duration::from_secs(2));
    }

    fn reset(&mut self) {
        self.delay = Duration::from_millis(50);
    }
}
