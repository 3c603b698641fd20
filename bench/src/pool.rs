//! Load-generating client processes: `pi-bench worker` for pi-host, `node client.mjs` for
//! Socket.IO. Both speak the same JSON-lines protocol, so a scenario drives either the same way.

use crate::hist::Histogram;
use crate::host::{JsonProcess, Tools};
use crate::worker::WorkerTarget;
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::time::Duration;
use tokio::process::Command;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum System {
    PiHost,
    SocketIo,
}

impl System {
    pub fn name(self) -> &'static str {
        match self {
            System::PiHost => "pi-host",
            System::SocketIo => "socket.io",
        }
    }
}

/// Where a pool's clients connect.
pub struct Target<'a> {
    pub system: System,
    pub url: &'a str,
    pub token: &'a str,
    /// The session to subscribe to (pi-host).
    pub session: Option<&'a str>,
}

/// What the workers of a pool received of one tag, merged.
#[derive(Debug, Default)]
pub struct Receipts {
    pub received: u64,
    pub first_us: u64,
    pub last_us: u64,
    pub hist: Histogram,
    /// Subscriber connections that closed (pi-host workers only).
    pub closed: u64,
}

pub struct Pool {
    workers: Vec<JsonProcess>,
    pub connections: usize,
}

impl Pool {
    /// Starts `processes` workers sharing `total` connections in `mode` and waits until every
    /// connection is up.
    pub async fn start(
        tools: &Tools,
        target: &Target<'_>,
        mode: &str,
        total: usize,
        processes: usize,
        ready_timeout: Duration,
    ) -> Result<Pool> {
        let processes = processes.clamp(1, total.max(1));
        let mut workers = Vec::with_capacity(processes);
        for i in 0..processes {
            // Spread the remainder so the counts add up to `total`.
            let count = total / processes + usize::from(i < total % processes);
            let command = match target.system {
                System::PiHost => {
                    let mut c = Command::new(std::env::current_exe()?);
                    c.args(["worker", "--url", target.url, "--token", target.token])
                        .args(["--count", &count.to_string(), "--mode", mode]);
                    if let Some(session) = target.session {
                        c.args(["--session", session]);
                    }
                    c
                }
                System::SocketIo => {
                    let mut c = Command::new("node");
                    c.arg(tools.node_dir.join("client.mjs"))
                        .args(["--url", target.url, "--token", target.token])
                        .args(["--count", &count.to_string(), "--mode", mode]);
                    c
                }
            };
            let name = format!("{} worker {i}", target.system.name());
            workers.push(JsonProcess::spawn(
                command,
                &name,
                &tools.log_dir.join("workers.log"),
            )?);
        }
        Pool::ready(workers, ready_timeout).await
    }

    /// Starts `processes` pi-bench workers subscribing to several servers and sessions: whole
    /// targets are dealt to the workers in turn, so each server's subscribers are spread.
    pub async fn start_targets(
        tools: &Tools,
        name: &str,
        targets: &[WorkerTarget],
        processes: usize,
        ready_timeout: Duration,
    ) -> Result<Pool> {
        let processes = processes.clamp(1, targets.len().max(1));
        let mut workers = Vec::with_capacity(processes);
        for i in 0..processes {
            let mine: Vec<&WorkerTarget> = targets.iter().skip(i).step_by(processes).collect();
            let mut c = Command::new(std::env::current_exe()?);
            c.args(["worker", "--mode", "fanout", "--targets"])
                .arg(serde_json::to_string(&mine)?);
            workers.push(JsonProcess::spawn(
                c,
                &format!("{name} worker {i}"),
                &tools.log_dir.join("workers.log"),
            )?);
        }
        Pool::ready(workers, ready_timeout).await
    }

    async fn ready(mut workers: Vec<JsonProcess>, ready_timeout: Duration) -> Result<Pool> {
        let mut connections = 0;
        for worker in &mut workers {
            let ready = worker.recv(ready_timeout).await?;
            if ready["ready"] != json!(true) {
                bail!("worker did not get ready: {ready}");
            }
            connections += ready["connected"].as_u64().unwrap_or(0) as usize;
        }
        Ok(Pool {
            workers,
            connections,
        })
    }

    pub fn pids(&self) -> Vec<u32> {
        self.workers.iter().map(|w| w.pid).collect()
    }

    /// Waits until every subscriber got `expect` deltas of `tag` (or `timeout`), then merges
    /// what the workers saw.
    pub async fn await_tag(
        &mut self,
        tag: u64,
        expect: u64,
        timeout: Duration,
    ) -> Result<Receipts> {
        let command = json!({"cmd": "await", "tag": tag, "expect": expect,
            "timeout_ms": timeout.as_millis() as u64});
        for worker in &mut self.workers {
            worker.send(&command).await?;
        }
        let mut merged = Receipts::default();
        for worker in &mut self.workers {
            let report = worker.recv(timeout + Duration::from_secs(10)).await?;
            let received = report["received"].as_u64().context("no received")?;
            merged.received += received;
            merged.closed += report["closed"].as_u64().unwrap_or(0);
            if received > 0 {
                let first = report["first_us"].as_u64().unwrap_or(0);
                let last = report["last_us"].as_u64().unwrap_or(0);
                merged.first_us = if merged.first_us == 0 {
                    first
                } else {
                    merged.first_us.min(first)
                };
                merged.last_us = merged.last_us.max(last);
            }
            let pairs: Vec<(u32, u64)> =
                serde_json::from_value(report["hist"].clone()).context("bad histogram")?;
            merged.hist.merge_pairs(&pairs);
        }
        Ok(merged)
    }

    /// Sends one command to the first worker and returns its answer (resume mode).
    pub async fn ask_first(&mut self, command: Value, timeout: Duration) -> Result<Value> {
        let worker = self.workers.first_mut().context("empty pool")?;
        worker.send(&command).await?;
        worker.recv(timeout).await
    }

    pub async fn stop(self) {
        for mut worker in self.workers {
            let _ = worker.send(&json!({"cmd": "quit"})).await;
            worker.stop().await;
        }
    }
}
