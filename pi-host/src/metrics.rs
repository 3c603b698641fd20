//! The host's series (docs/reliability.md, "Metrics and health"): the connection core's, and
//! what only a host knows: events committed, agents running, approvals pending, whether the
//! kernel sandbox is enforced. The operator's listener that serves them, with `/readyz`'s
//! checks, is `server/operator.rs`.

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use racp_server::metrics::Metrics;
use std::sync::OnceLock;

/// The host's series. The counters are counted where things happen; the gauges are read from
/// the host's state at each scrape.
#[derive(Debug, Default)]
pub struct HostMetrics {
    pub core: Metrics,
    /// Events committed to the store (sessions/writer.rs).
    pub events_appended: Counter,
    agents_running: Gauge,
    approvals_pending: Gauge,
    sandbox_enforced: Gauge,
    /// The gateway link once made (uplink/mod.rs), for the `nats` check.
    pub nats: OnceLock<async_nats::Client>,
}

impl HostMetrics {
    /// The gauges, as the host's state reads at a scrape.
    pub fn observe(&self, agents_running: u32, approvals_pending: usize, sandbox_enforced: bool) {
        self.agents_running.set(i64::from(agents_running));
        self.approvals_pending
            .set(i64::try_from(approvals_pending).unwrap_or(i64::MAX));
        self.sandbox_enforced.set(i64::from(sandbox_enforced));
    }

    pub fn registry(&self) -> Registry {
        let mut registry = Registry::with_prefix("pi_host");
        self.core.register(&mut registry);
        registry.register(
            "events_appended",
            "Session events committed to the store",
            self.events_appended.clone(),
        );
        registry.register(
            "agents_running",
            "Agent processes running",
            self.agents_running.clone(),
        );
        registry.register(
            "approvals_pending",
            "Approvals waiting for an answer, over every session",
            self.approvals_pending.clone(),
        );
        registry.register(
            "sandbox_enforced",
            "1 when agents start in the kernel sandbox, 0 when not",
            self.sandbox_enforced.clone(),
        );
        registry
    }
}
