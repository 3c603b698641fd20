//! The gateway's metrics and health (docs/reliability.md, "Metrics and health"), on the
//! operator's listener `--metrics-listen` (racp-server's `metrics.rs`): the connection core's
//! series and whether NATS is connected; `/readyz` checks `nats`.

use crate::state::Gateway;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use racp_server::metrics::{Check, Observed, Operator};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Weak};

/// Binds the operator's listener and serves it; returns the bound address.
pub async fn start(
    gateway: &Arc<Gateway>,
    addr: SocketAddr,
    remote: bool,
) -> Result<SocketAddr, String> {
    let nats_connected = Gauge::default();
    let mut registry = Registry::with_prefix("pi_gateway");
    gateway.metrics.register(&mut registry);
    registry.register(
        "nats_connected",
        "1 while the replica's NATS connection is up, 0 when not",
        nats_connected.clone(),
    );
    let observed = GatewayObserved {
        gateway: Arc::downgrade(gateway),
        nats_connected,
    };
    let operator = Operator {
        registry,
        observed: Arc::new(observed),
    };
    racp_server::metrics::listen(addr, remote, operator).await
}

struct GatewayObserved {
    gateway: Weak<Gateway>,
    nats_connected: Gauge,
}

impl GatewayObserved {
    fn nats_up(&self) -> bool {
        self.gateway.upgrade().is_some_and(|g| g.nats_up())
    }
}

impl Observed for GatewayObserved {
    fn refresh(&self) {
        self.nats_connected.set(i64::from(self.nats_up()));
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
