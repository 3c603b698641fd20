//! The operator's listener, `--metrics-listen` (docs/reliability.md, "Metrics and health";
//! racp-server's `metrics.rs` serves it): the host's series (`crate::metrics`), read from the
//! host's state at each scrape, and `/readyz`'s checks: the store (a write answers), the agent
//! (the agent check says ready) and, with `--gateway`, the NATS link.

use crate::metrics::Observation;
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
    let mut registry = state.metrics.registry(&state.drivers.counts);
    if !state.config.gateway.is_empty() {
        state.metrics.nats_link.register(&mut registry);
    }
    let operator = Operator {
        registry,
        observed: observed(state),
    };
    racp_server::metrics::listen(addr, remote, operator).await
}

/// The host's gauges and `/readyz`'s checks, for its listener and for systemd's readiness
/// (racp-server's `notify.rs`).
pub fn observed(state: &Arc<HostState>) -> Arc<dyn Observed> {
    Arc::new(HostObserved(Arc::downgrade(state)))
}

/// The host as its listener sees it; weak, so the listener does not keep a stopped host.
struct HostObserved(Weak<HostState>);

impl Observed for HostObserved {
    fn refresh(&self) -> Pin<Box<dyn Future<Output = ()> + Send + '_>> {
        Box::pin(async move {
            let Some(state) = self.0.upgrade() else {
                return;
            };
            let approvals_pending: usize = state
                .sessions
                .list()
                .iter()
                .map(|s| s.pending_approval_count())
                .sum();
            let agents = state.drivers.agents_info(&*state);
            let dir = state.config.data_dir.clone();
            let sizes = tokio::task::spawn_blocking(move || on_disk(&dir));
            let (store_bytes, history_bytes) =
                bounded_sizes(CHECK_DEADLINE, sizes).await.unwrap_or((0, 0));
            state.metrics.observe(Observation {
                agents_running: agents.running,
                agents_rss_bytes: agents.rss_bytes,
                approvals_pending,
                sandbox_enforced: state.sandbox.enforced(),
                store_bytes,
                history_bytes,
            });
            state.metrics.nats_link.observe(state.metrics.nats.get());
        })
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

/// The sizes on disk, unless reading them takes longer than `deadline` (a hung disk).
async fn bounded_sizes(
    deadline: Duration,
    sizes: tokio::task::JoinHandle<(u64, u64)>,
) -> Option<(u64, u64)> {
    tokio::time::timeout(deadline, sizes).await.ok()?.ok()
}

/// Most files of the agents' session directories a scrape reads the size of.
const MAX_HISTORY_FILES: usize = 100_000;

/// The database with its write-ahead log, and the agents' session files (their directory under
/// the data directory, one level of sessions and the files within them).
fn on_disk(data_dir: &std::path::Path) -> (u64, u64) {
    let size = |path: std::path::PathBuf| std::fs::metadata(path).map_or(0, |m| m.len());
    let store = ["pi-host.db", "pi-host.db-wal", "pi-host.db-shm"]
        .into_iter()
        .map(|name| size(data_dir.join(name)))
        .sum();
    let mut history = 0;
    let sessions = std::fs::read_dir(data_dir.join("agent-sessions"))
        .into_iter()
        .flatten();
    let files = sessions
        .flatten()
        .filter_map(|session| std::fs::read_dir(session.path()).ok())
        .flatten()
        .flatten()
        .take(MAX_HISTORY_FILES);
    for file in files {
        if let Ok(meta) = file.metadata()
            && meta.is_file()
        {
            history += meta.len();
        }
    }
    (store, history)
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
