//! The operator's listener, `--metrics-listen` (docs/reliability.md, "Metrics and health";
//! racp-server's `metrics.rs` serves it): the host's series (`crate::metrics`), read from the
//! host's state at each scrape, and `/readyz`'s checks: the store (a write answers), the agent
//! (the agent check says ready) and, with `--gateway`, the NATS link.

use crate::state::HostState;
use racp_proto::methods::host::AgentState;
use racp_server::metrics::{Check, Observed, Operator};
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::time::Duration;

/// Longest one readiness check may take before it counts as failed.
const CHECK_DEADLINE: Duration = Duration::from_secs(2);

/// Binds the operator's listener and serves it; returns the bound address (port 0 is the
/// OS's choice).
pub async fn start(
    state: &Arc<HostState>,
    addr: SocketAddr,
    remote: bool,
) -> Result<SocketAddr, String> {
    let operator = Operator {
        registry: state.metrics.registry(),
        observed: Arc::new(HostObserved(Arc::downgrade(state))),
    };
    racp_server::metrics::listen(addr, remote, operator).await
}

/// The host as its listener sees it; weak, so the listener does not keep a stopped host.
struct HostObserved(Weak<HostState>);

impl Observed for HostObserved {
    fn refresh(&self) {
        let Some(state) = self.0.upgrade() else {
            return;
        };
        let pending: usize = state
            .sessions
            .list()
            .iter()
            .map(|s| s.pending_approval_count())
            .sum();
        let running = state.drivers.agents_info(&*state).running;
        state
            .metrics
            .observe(running, pending, state.sandbox.enforced());
    }

    fn checks(&self) -> Pin<Box<dyn Future<Output = Vec<Check>> + Send + '_>> {
        Box::pin(async move {
            let Some(state) = self.0.upgrade() else {
                return vec![("host", Err("stopping".to_string()))];
            };
            let mut checks = vec![
                (
                    "store",
                    bounded(CHECK_DEADLINE, store_writes(state.clone())).await,
                ),
                (
                    "agent",
                    bounded(CHECK_DEADLINE, agent_ready(state.clone())).await,
                ),
            ];
            if !state.config.gateway.is_empty() {
                checks.push(("nats", nats_connected(&state)));
            }
            checks
        })
    }
}

/// A check that does not answer within `deadline` (a store locked, a disk hung) fails:
/// `/readyz` answers in bounded time whatever holds the host up.
async fn bounded(
    deadline: Duration,
    check: impl Future<Output = Result<(), String>>,
) -> Result<(), String> {
    tokio::time::timeout(deadline, check)
        .await
        .unwrap_or_else(|_| Err(format!("no answer within {deadline:?}")))
}

/// The store answers a write, and its directory takes a new file written to disk. A write
/// into SQLite's open log can succeed in the page cache on a file system that no longer takes
/// writes (a read-only remount, a full disk, its permissions taken away): the file finds that.
async fn store_writes(state: Arc<HostState>) -> Result<(), String> {
    let wrote = tokio::task::spawn_blocking(move || {
        state
            .store
            .probe_write()
            .map_err(|e| format!("the store refuses a write: {e}"))?;
        probe_file(&state.config.data_dir.join(".ready-probe"))
            .map_err(|e| format!("the data directory refuses a write: {e}"))
    })
    .await;
    wrote.unwrap_or_else(|e| Err(format!("the store check did not finish: {e}")))
}

fn probe_file(path: &std::path::Path) -> std::io::Result<()> {
    use std::io::Write;
    let mut file = std::fs::File::create(path)?;
    file.write_all(b"ready\n")?;
    file.sync_all()?;
    std::fs::remove_file(path)
}

async fn agent_ready(state: Arc<HostState>) -> Result<(), String> {
    let status = state.agent.status().await;
    match status.state {
        AgentState::Ready => Ok(()),
        other => Err(format!("the agent is {other:?}").to_lowercase()),
    }
}

fn nats_connected(state: &HostState) -> Result<(), String> {
    match state
        .metrics
        .nats
        .get()
        .map(async_nats::Client::connection_state)
    {
        Some(async_nats::connection::State::Connected) => Ok(()),
        Some(other) => Err(format!("the gateway link is {other}")),
        None => Err("the gateway link was never made".to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_check_answers_within_its_deadline_or_fails() {
        let deadline = Duration::from_millis(200);
        let answered = bounded(deadline, async { Ok(()) }).await;
        assert_eq!(answered, Ok(()));
        let failed = bounded(deadline, async { Err("refused".to_string()) }).await;
        assert_eq!(failed, Err("refused".to_string()));
        let hung = bounded(deadline, std::future::pending()).await;
        assert!(hung.is_err_and(|why| why.contains("no answer")));
    }
}
