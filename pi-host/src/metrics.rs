//! The host's series (docs/reliability.md, "Metrics and health"): the connection core's, and
//! what only a host knows: events committed and the commit's time, approvals settled by
//! outcome, agents running, starting, started and stopped and their memory, approvals pending,
//! the store's size on disk and the agents' session files, whether the kernel sandbox is
//! enforced, and with `--gateway` whether its NATS link is up and how often it was made again.
//! The operator's listener that serves them, with `/readyz`'s checks, is
//! `server/operator.rs`.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use racp_proto::methods::turn::ApprovalState;
use racp_server::metrics::{Metrics, NatsLink};
use std::sync::OnceLock;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// What the store's writer counts as it commits (sessions/writer.rs).
#[derive(Clone, Debug)]
pub struct Commits {
    /// Events committed to the store.
    pub appended: Counter,
    /// One group commit's time (the transaction and its fsync), in seconds.
    pub seconds: Histogram,
    settled: Family<OutcomeLabel, Counter>,
}

impl Default for Commits {
    fn default() -> Self {
        Commits {
            appended: Counter::default(),
            // 0.1 ms to 6.5 s, each four times the one before.
            seconds: Histogram::new(exponential_buckets(0.0001, 4.0, 9)),
            settled: Family::default(),
        }
    }
}

impl Commits {
    /// An `approval.settled` was committed with `outcome`.
    pub fn settled(&self, outcome: ApprovalState) {
        self.settled
            .get_or_create(&OutcomeLabel {
                outcome: outcome_label(outcome),
            })
            .inc();
    }
}

/// Every outcome's series starts at 0 (what a dashboard finds before the first settles).
fn outcomes_at_zero(settled: &Family<OutcomeLabel, Counter>) {
    use ApprovalState::{Allowed, Answered, Cancelled, Denied, Expired};
    for outcome in [Allowed, Denied, Answered, Expired, Cancelled] {
        let _ = settled.get_or_create(&OutcomeLabel {
            outcome: outcome_label(outcome),
        });
    }
}

fn outcome_label(outcome: ApprovalState) -> &'static str {
    match outcome {
        ApprovalState::Pending => "pending",
        ApprovalState::Allowed => "allowed",
        ApprovalState::Denied => "denied",
        ApprovalState::Answered => "answered",
        ApprovalState::Expired => "expired",
        ApprovalState::Cancelled => "cancelled",
    }
}

/// Agents' starts and stops, counted by the drivers (driver/mod.rs).
#[derive(Clone, Debug, Default)]
pub struct AgentCounts {
    /// Agents being started (spawned, not yet answering).
    pub starting: Gauge,
    pub started: Counter,
    pub stopped: Counter,
}

/// The host's series. The counters are counted where things happen; the gauges are read from
/// the host's state at each scrape.
#[derive(Debug, Default)]
pub struct HostMetrics {
    pub core: Metrics,
    pub commits: Commits,
    agents_running: Gauge,
    agents_rss_bytes: Gauge,
    approvals_pending: Gauge,
    sandbox_enforced: Gauge,
    store_bytes: Gauge,
    history_bytes: Gauge,
    /// The gateway link once made (uplink/mod.rs), for the `nats` check.
    pub nats: OnceLock<async_nats::Client>,
    /// The gateway link's series, registered with `--gateway` (server/operator.rs).
    pub nats_link: NatsLink,
}

/// What a scrape reads of the host's state.
pub struct Observation {
    pub agents_running: u32,
    pub agents_rss_bytes: u64,
    pub approvals_pending: usize,
    pub sandbox_enforced: bool,
    pub store_bytes: u64,
    pub history_bytes: u64,
}

fn set(gauge: &Gauge, value: impl TryInto<i64>) {
    gauge.set(value.try_into().unwrap_or(i64::MAX));
}

impl HostMetrics {
    /// The gauges, as the host's state reads at a scrape.
    pub fn observe(&self, seen: Observation) {
        set(&self.agents_running, seen.agents_running);
        set(&self.agents_rss_bytes, seen.agents_rss_bytes);
        set(&self.approvals_pending, seen.approvals_pending);
        set(&self.sandbox_enforced, i64::from(seen.sandbox_enforced));
        set(&self.store_bytes, seen.store_bytes);
        set(&self.history_bytes, seen.history_bytes);
    }

    pub fn registry(&self, agents: &AgentCounts) -> Registry {
        let mut registry = Registry::with_prefix("pi_host");
        self.core.register(&mut registry);
        let c = &self.commits;
        registry.register(
            "events_appended",
            "Session events committed to the store",
            c.appended.clone(),
        );
        registry.register(
            "commit_seconds",
            "Time of one group commit of events to the store (transaction and fsync)",
            c.seconds.clone(),
        );
        outcomes_at_zero(&c.settled);
        registry.register(
            "approvals_settled",
            "Approvals settled, by outcome",
            c.settled.clone(),
        );
        self.register_agents(&mut registry, agents);
        self.register_gauges(&mut registry);
        registry
    }

    fn register_agents(&self, registry: &mut Registry, agents: &AgentCounts) {
        registry.register(
            "agents_running",
            "Agent processes running",
            self.agents_running.clone(),
        );
        registry.register(
            "agents_starting",
            "Agent processes being started",
            agents.starting.clone(),
        );
        registry.register(
            "agents_started",
            "Agent processes started",
            agents.started.clone(),
        );
        registry.register(
            "agents_stopped",
            "Agent processes stopped or exited",
            agents.stopped.clone(),
        );
        registry.register(
            "agents_rss_bytes",
            "Resident memory of the running agent processes, summed",
            self.agents_rss_bytes.clone(),
        );
    }

    fn register_gauges(&self, registry: &mut Registry) {
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
        registry.register(
            "store_bytes",
            "Size on disk of the host's database (with its write-ahead log)",
            self.store_bytes.clone(),
        );
        registry.register(
            "history_bytes",
            "Size on disk of the agents' session files (the conversations they resume)",
            self.history_bytes.clone(),
        );
    }
}
