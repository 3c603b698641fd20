//! When a session's agent runs (docs/architecture.md, "Agent lifecycle"): started with the
//! session, so the first prompt does not wait for Node and pi to load; stopped after
//! `agent_idle` with no turn, no pending approval and no subscriber, and started again (resuming
//! its own session) by the next turn or subscriber; never more than `max_agents` at once.

use super::DriverHost;
use super::{Driver, Drivers};
use crate::sessions::{HostEvent, Session};
use racp_proto::events::{AgentStopReason, AgentStoppedData};
use racp_proto::methods::host::AgentsInfo;
use racp_proto::{AppError, ErrorCode};
use serde_json::json;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};
use tokio::sync::MutexGuard;

/// How long a warm start waits for the agent's first answer (pi loads in about 2 s).
const WARM_TIMEOUT: Duration = Duration::from_secs(60);
/// When every agent is busy: try again after about one turn.
const RETRY_AFTER_MS: u64 = 5_000;

impl Drivers {
    /// Starts the session's agent in the background when none runs and there is room, so a
    /// prompt that comes later finds it loaded. A turn that starts meanwhile waits on the
    /// driver's lock and then uses this agent. Failures are left to the turn to report.
    pub fn warm(&self, host: &Arc<impl DriverHost>, session: &Arc<Session>) {
        let driver = self.driver(session);
        let host = host.clone();
        tokio::spawn(async move {
            let agent = {
                let mut state = driver.state.lock().await;
                if state.agent.is_some() || driver.session.is_closing() {
                    return;
                }
                let Ok(_slot) = host.drivers().make_room(&host, &driver).await else {
                    return;
                };
                match driver.ensure_agent(&host, &mut state).await {
                    Ok(agent) => agent,
                    Err(err) => {
                        tracing::debug!(error = %err, session_id = %driver.session.id, "warm start failed");
                        return;
                    }
                }
            };
            // pi answers its first command once loaded (with the preload extension, once it has
            // also loaded what the first prompt needs): ask now, not at the first prompt.
            if !matches!(
                tokio::time::timeout(WARM_TIMEOUT, agent.get_state()).await,
                Ok(Ok(_))
            ) {
                return;
            }
            // The models a turn checks its model against, asked now too: one round trip less
            // before the first prompt (docs/benchmarks.md §7). A failure is left to the turn.
            let Ok(available) = agent.available_models().await else {
                return;
            };
            let mut state = driver.state.lock().await;
            let same_agent = state.agent.as_ref().map(|a| a.pid()) == Some(agent.pid());
            if same_agent && state.available.is_none() {
                state.available = Some(Ok(available));
            }
        });
    }

    /// Makes room for one more agent: with `max_agents` running, stops the least recently used
    /// idle one; HOST_OVERLOADED when every running agent is busy. The returned guard keeps the
    /// slot until the caller has spawned.
    pub(super) async fn make_room(
        &self,
        host: &impl DriverHost,
        for_driver: &Arc<Driver>,
    ) -> Result<MutexGuard<'_, ()>, AppError> {
        let slot = self.spawn_gate.lock().await;
        let max = host.config().max_agents;
        // Each pass stops one agent or gives up; a victim that got busy meanwhile is skipped.
        for _ in 0..=max {
            let running: Vec<Arc<Driver>> = self
                .drivers
                .iter()
                .filter(|d| d.agent_pid.load(Ordering::Relaxed) != 0 && !Arc::ptr_eq(d, for_driver))
                .map(|d| d.clone())
                .collect();
            if running.len() < max {
                return Ok(slot);
            }
            let mut idle: Vec<(Option<Instant>, Arc<Driver>)> = running
                .into_iter()
                .filter_map(|d| {
                    let last_used = d.idle_since()?;
                    Some((last_used, d))
                })
                .collect();
            idle.sort_by_key(|(last_used, _)| *last_used);
            let Some((_, victim)) = idle.into_iter().next() else {
                break;
            };
            victim
                .stop_idle(host, AgentStopReason::Capacity, Duration::ZERO)
                .await;
        }
        Err(AppError::new(
            ErrorCode::HostOverloaded,
            "every agent this host may run is busy with a turn; try again when one finishes",
        )
        .with_retry_after_ms(RETRY_AFTER_MS)
        .with_details(json!({"runningAgents": max, "maxAgents": max})))
    }

    /// The agents running now and their memory, for `host/info` and `pi-host status`.
    pub fn agents_info(&self, host: &impl DriverHost) -> AgentsInfo {
        let pids: Vec<u32> = self
            .drivers
            .iter()
            .map(|d| d.agent_pid.load(Ordering::Relaxed))
            .filter(|pid| *pid != 0)
            .collect();
        AgentsInfo {
            running: u32::try_from(pids.len()).unwrap_or(u32::MAX),
            max: u32::try_from(host.config().max_agents).unwrap_or(u32::MAX),
            rss_bytes: pids.iter().map(|pid| rss_bytes(*pid)).sum(),
            idle_stop_ms: u64::try_from(host.config().agent_idle.as_millis()).unwrap_or(u64::MAX),
        }
    }
}

impl Driver {
    /// When the agent became idle, if it is (running, no turn, no pending approval); `None`
    /// also while the state is locked, which means it is in use.
    fn idle_since(&self) -> Option<Option<Instant>> {
        let state = self.state.try_lock().ok()?;
        let idle = state.agent.is_some()
            && state.active.is_none()
            && !self.shell_running.load(Ordering::Acquire)
            && !self.session.has_pending_approvals();
        idle.then_some(state.last_used)
    }

    /// Stops the agent if it has been idle for at least `min_idle`, and records why. Never waits
    /// for the state's lock: whoever holds it is using the agent.
    async fn stop_idle(&self, host: &impl DriverHost, reason: AgentStopReason, min_idle: Duration) {
        let (agent, idle_for, ran_turn) = {
            let Ok(mut state) = self.state.try_lock() else {
                return;
            };
            let idle_for = state.last_used.map_or(Duration::MAX, |t| t.elapsed());
            if state.active.is_some()
                || self.session.has_pending_approvals()
                || self.shell_running.load(Ordering::Acquire)
                || idle_for < min_idle
            {
                return;
            }
            let Some(agent) = self.take_agent(&mut state, &host.drivers().counts) else {
                return;
            };
            (agent, idle_for, state.ran_turn)
        };
        tracing::info!(session_id = %self.session.id, ?reason, "stopping an idle agent");
        agent.shutdown().await;
        if !ran_turn {
            return;
        }
        let event = HostEvent::of_session(AgentStoppedData {
            reason,
            idle_ms: u64::try_from(idle_for.as_millis()).unwrap_or(u64::MAX),
        });
        if let Err(err) = host.sessions().commit(&self.session, vec![event]).await {
            tracing::warn!(error = %err, "cannot record an agent stop");
        }
    }
}

/// Stops agents idle for `agent_idle`, until the host drains. A session with a subscriber is
/// in use: its idle time starts when the last one leaves.
pub async fn stop_idle_agents(host: Arc<impl DriverHost>) {
    let idle = host.config().agent_idle;
    let mut tick =
        tokio::time::interval((idle / 4).clamp(Duration::from_millis(10), Duration::from_secs(5)));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        if host.is_draining() {
            return;
        }
        let running: Vec<Arc<Driver>> = host
            .drivers()
            .drivers
            .iter()
            .filter(|d| d.agent_pid.load(Ordering::Relaxed) != 0)
            .map(|d| d.clone())
            .collect();
        for driver in running {
            if driver.session.has_watchers() {
                if let Ok(mut state) = driver.state.try_lock() {
                    state.last_used = Some(Instant::now());
                }
                continue;
            }
            driver.stop_idle(&host, AgentStopReason::Idle, idle).await;
        }
    }
}

/// A process's resident memory in bytes (0 when it cannot be read).
fn rss_bytes(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kib| kib * 1024)
}
