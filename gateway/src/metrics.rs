//! The gateway's metrics and health (docs/reliability.md, "Metrics and health"), on the
//! operator's listener `--metrics-listen` (racp-server's `metrics.rs`): the connection core's
//! series, whether NATS is connected and how often it reconnected, and each enrolled host's
//! JetStream bytes against its stream's limit (read at the scrape, for at most
//! [`MAX_HOSTS_SHOWN`] hosts, within [`READ_DEADLINE`]); `/readyz` checks `nats`.

use crate::state::Gateway;
use futures_util::StreamExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use racp_server::metrics::{Check, Observed, Operator};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, LazyLock, Weak};
use std::time::Duration;

/// Most hosts whose streams a scrape reports (the label's set stays bounded).
const MAX_HOSTS_SHOWN: usize = 256;
/// Longest a scrape waits for the streams' info.
const READ_DEADLINE: Duration = Duration::from_secs(2);

/// NATS connections made again after the first (nats.rs's event callback counts them).
static RECONNECTS: LazyLock<Counter> = LazyLock::new(Counter::default);
static CONNECTED_ONCE: AtomicBool = AtomicBool::new(false);

/// The NATS client said it is connected: a reconnect unless it is the first time.
pub fn nats_connected() {
    if CONNECTED_ONCE.swap(true, Ordering::Relaxed) {
        RECONNECTS.inc();
    }
}

/// An enrolled host's id: ids are the operator's, checked at enrollment (a NATS token).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct HostLabel {
    host: String,
}

/// Binds the operator's listener and serves it; returns the bound address.
pub async fn start(
    gateway: &Arc<Gateway>,
    addr: SocketAddr,
    remote: bool,
) -> Result<SocketAddr, String> {
    let observed = GatewayObserved {
        gateway: Arc::downgrade(gateway),
        nats_connected: Gauge::default(),
        stream_bytes: Family::default(),
        stream_max_bytes: Family::default(),
    };
    let mut registry = Registry::with_prefix("pi_gateway");
    gateway.metrics.register(&mut registry);
    observed.register(&mut registry);
    let operator = Operator {
        registry,
        observed: Arc::new(observed),
    };
    racp_server::metrics::listen(addr, remote, operator).await
}

struct GatewayObserved {
    gateway: Weak<Gateway>,
    nats_connected: Gauge,
    stream_bytes: Family<HostLabel, Gauge>,
    stream_max_bytes: Family<HostLabel, Gauge>,
}

impl GatewayObserved {
    fn register(&self, registry: &mut Registry) {
        registry.register(
            "nats_connected",
            "1 while the replica's NATS connection is up, 0 when not",
            self.nats_connected.clone(),
        );
        registry.register(
            "nats_reconnects",
            "NATS connections made again after a loss",
            RECONNECTS.clone(),
        );
        registry.register(
            "host_stream_bytes",
            "Bytes a host's events stream holds in JetStream",
            self.stream_bytes.clone(),
        );
        registry.register(
            "host_stream_max_bytes",
            "The byte limit of a host's events stream (-1: none)",
            self.stream_max_bytes.clone(),
        );
    }

    fn nats_up(&self) -> bool {
        self.gateway.upgrade().is_some_and(|g| g.nats_up())
    }

    /// Each host's events stream: its bytes and its limit, read afresh.
    async fn read_streams(&self, gateway: &Gateway) {
        let mut streams = gateway.js.streams();
        let mut seen = Vec::new();
        while let Some(info) = streams.next().await {
            let info = match info {
                Ok(info) => info,
                Err(error) => {
                    tracing::debug!(%error, "cannot list the streams for a scrape");
                    break;
                }
            };
            let prefix = racp_proto::gateway::events_stream("");
            if let Some(host) = info.config.name.strip_prefix(&prefix) {
                seen.push((host.to_string(), info.state.bytes, info.config.max_bytes));
            }
            if seen.len() >= MAX_HOSTS_SHOWN {
                break;
            }
        }
        self.stream_bytes.clear();
        self.stream_max_bytes.clear();
        for (host, bytes, max) in seen {
            let label = HostLabel { host };
            let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
            self.stream_bytes.get_or_create(&label).set(bytes);
            self.stream_max_bytes.get_or_create(&label).set(max);
        }
    }
}

impl Observed for GatewayObserved {
    fn refresh(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            self.nats_connected.set(i64::from(self.nats_up()));
            let Some(gateway) = self.gateway.upgrade() else {
                return;
            };
            if self.nats_up() {
                let read = tokio::time::timeout(READ_DEADLINE, self.read_streams(&gateway)).await;
                if read.is_err() {
                    tracing::debug!("the streams' info took too long for a scrape");
                }
            }
        })
    }

    fn checks(&self) -> Pin<Box<dyn Future<Output = Vec<Check>> + Send + '_>> {
        let nats = if self.nats_up() {
            Ok(())
        } else {
            Err("NATS is not connected".to_string())
        };
        Box::pin(async move { vec![("nats", nats)] })
    }
}
