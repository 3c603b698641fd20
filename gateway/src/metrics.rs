//! The gateway's metrics and health (docs/reliability.md, "Metrics and health"), on the
//! operator's listener `--metrics-listen` (racp-server's `metrics.rs`): the connection core's
//! series, whether NATS is connected and how often it reconnected, and each enrolled host's
//! JetStream bytes against its stream's limit and the events in it this replica's feeds have
//! not been sent yet (read at the scrape, for at most [`MAX_HOSTS_SHOWN`] hosts, within
//! [`READ_DEADLINE`]); `/readyz` checks `nats`.

use crate::state::Gateway;
use futures_util::StreamExt;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use racp_server::metrics::{Check, Observed, Operator};
use std::collections::HashMap;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Most hosts whose streams a scrape reports (the label's set stays bounded).
const MAX_HOSTS_SHOWN: usize = 256;
/// Longest a scrape waits for the streams' info, and again for the consumers' lag.
const READ_DEADLINE: Duration = Duration::from_secs(2);
/// Most feed consumers a scrape asks after, and how many at once.
const MAX_CONSUMERS_READ: usize = 4096;
const CONSUMERS_AT_ONCE: usize = 32;

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
    let observed = GatewayObserved::of(gateway);
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
    stream_bytes: Family<HostLabel, Gauge>,
    stream_max_bytes: Family<HostLabel, Gauge>,
    pending: Family<HostLabel, Gauge>,
}

/// What `/readyz` checks of a gateway (for systemd's readiness too: main.rs).
pub fn observed(gateway: &Arc<Gateway>) -> Arc<dyn Observed> {
    Arc::new(GatewayObserved::of(gateway))
}

impl GatewayObserved {
    fn of(gateway: &Arc<Gateway>) -> GatewayObserved {
        GatewayObserved {
            gateway: Arc::downgrade(gateway),
            stream_bytes: Family::default(),
            stream_max_bytes: Family::default(),
            pending: Family::default(),
        }
    }

    fn register(&self, registry: &mut Registry) {
        crate::nats::LINK.register(registry);
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
        registry.register(
            "host_events_pending",
            "Events in a host's stream not yet delivered to this replica's feeds (summed over \
             the sessions it follows; 0 when it follows none)",
            self.pending.clone(),
        );
    }

    fn nats_up(&self) -> bool {
        self.gateway.upgrade().is_some_and(|g| g.nats_up())
    }

    /// Each host's events stream: its bytes and its limit, and how far this replica's feeds
    /// are behind it, read afresh.
    async fn read_streams(&self, gateway: &Gateway) {
        let Ok(seen) = tokio::time::timeout(READ_DEADLINE, streams(gateway)).await else {
            tracing::debug!("the streams' info took too long for a scrape");
            return;
        };
        let mut lag = pending(gateway).await;
        self.stream_bytes.clear();
        self.stream_max_bytes.clear();
        self.pending.clear();
        for (host, bytes, max) in seen {
            let pending = lag.remove(&host).unwrap_or(0);
            let label = HostLabel { host };
            let bytes = i64::try_from(bytes).unwrap_or(i64::MAX);
            self.stream_bytes.get_or_create(&label).set(bytes);
            self.stream_max_bytes.get_or_create(&label).set(max);
            let pending = i64::try_from(pending).unwrap_or(i64::MAX);
            self.pending.get_or_create(&label).set(pending);
        }
    }
}

/// The hosts' events streams (at most [`MAX_HOSTS_SHOWN`]): host id, bytes, byte limit.
async fn streams(gateway: &Gateway) -> Vec<(String, u64, i64)> {
    let mut streams = gateway.js.streams();
    let mut seen = Vec::new();
    let prefix = racp_proto::gateway::events_stream("");
    while let Some(info) = streams.next().await {
        let info = match info {
            Ok(info) => info,
            Err(error) => {
                tracing::debug!(%error, "cannot list the streams for a scrape");
                break;
            }
        };
        if let Some(host) = info.config.name.strip_prefix(&prefix) {
            seen.push((host.to_string(), info.state.bytes, info.config.max_bytes));
        }
        if seen.len() >= MAX_HOSTS_SHOWN {
            break;
        }
    }
    seen
}

/// Each host's events not yet delivered to this replica: its feeds' consumers' `num_pending`
/// (what the stream holds past what NATS has sent the consumer), summed. Read at the scrape,
/// not on a timer: an idle gateway asks NATS nothing, and the value is as fresh as the scrape.
/// A catch-up's consumer is not counted: it replays what a subscriber asked for, not the lag.
/// A consumer that does not answer within [`READ_DEADLINE`] counts nothing.
async fn pending(gateway: &Gateway) -> HashMap<String, u64> {
    let consumers = gateway.feeds.consumers(MAX_CONSUMERS_READ);
    let asked = futures_util::stream::iter(consumers)
        .map(|(host, stream, name)| async move {
            let info = stream.consumer_info(name).await;
            info.ok().map(|info| (host, info.num_pending))
        })
        .buffer_unordered(CONSUMERS_AT_ONCE)
        .filter_map(std::future::ready);
    let mut lag = HashMap::new();
    let read = tokio::time::timeout(READ_DEADLINE, async {
        let mut asked = std::pin::pin!(asked);
        while let Some((host, pending)) = asked.next().await {
            *lag.entry(host).or_insert(0u64) += pending;
        }
    });
    if read.await.is_err() {
        tracing::debug!("the feeds' consumers took too long for a scrape");
    }
    lag
}

impl Observed for GatewayObserved {
    fn refresh(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            let Some(gateway) = self.gateway.upgrade() else {
                crate::nats::LINK.observe(None);
                return;
            };
            crate::nats::LINK.observe(Some(&gateway.client));
            if self.nats_up() {
                self.read_streams(&gateway).await;
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
