//! The capacity of one host (docs/benchmarks.md, "Capacity"): N sessions on one pi-host, each
//! with its agent streaming pi-shaped `message_update` deltas at model speed to a few
//! subscribers; the host's CPU and RSS and the latency an event takes from the agent's write to
//! a client's read, as N grows.

use crate::hist::Histogram;
use crate::host::{PiHost, Tools, session_with_agent, start_turn, wait_idle};
use crate::pool::Pool;
use crate::procstat::{CpuMeter, rss_kib};
use crate::racp::Control;
use crate::worker::{WorkerTarget, now_us};
use anyhow::{Result, bail};
use futures_util::{StreamExt, TryStreamExt};
use serde_json::{Value, json};
use std::path::Path;
use std::time::{Duration, Instant};

pub struct Options {
    /// Session counts, one host each.
    pub sessions: Vec<usize>,
    /// Subscribers per session.
    pub subscribers: usize,
    /// Deltas per second each agent writes.
    pub rate: u64,
    /// Seconds of the measured stream.
    pub secs: f64,
    pub processes: usize,
}

/// Sessions whose agents start at once while a host is set up.
const STARTING_AT_ONCE: usize = 8;

pub async fn capacity(
    tools: &Tools,
    disk_dir: &Path,
    options: &Options,
    deadline: Instant,
) -> Result<Value> {
    let mut runs = Vec::new();
    for &n in &options.sessions {
        if Instant::now() + Duration::from_secs_f64(options.secs + 60.0) > deadline {
            runs.push(json!({"sessions": n, "error": "skipped: the time budget is spent"}));
            continue;
        }
        eprintln!("pi-bench capacity: {n} sessions");
        let run = one(tools, disk_dir, options, n).await;
        runs.push(run.unwrap_or_else(|e| json!({"sessions": n, "error": format!("{e:#}")})));
    }
    Ok(
        json!({"rate": options.rate, "subscribers_per_session": options.subscribers,
        "secs": options.secs, "runs": runs}),
    )
}

async fn one(tools: &Tools, disk_dir: &Path, options: &Options, n: usize) -> Result<Value> {
    let agents = (n + 8).to_string();
    // PiHost::start lifts the rate limit already.
    let extra = ["--max-agents", &agents];
    let host = PiHost::start(tools, disk_dir, &extra).await?;
    let outcome = measure(tools, &host, options, n).await;
    host.stop().await;
    outcome
}

async fn measure(tools: &Tools, host: &PiHost, options: &Options, n: usize) -> Result<Value> {
    let token = host.pair_device().await?;
    let mut sessions: Vec<(Control, String)> = futures_util::stream::iter(0..n)
        .map(|_| session_with_agent(host, &token))
        .buffer_unordered(STARTING_AT_ONCE)
        .try_collect()
        .await?;
    let targets: Vec<WorkerTarget> = sessions
        .iter()
        .map(|(_, session)| WorkerTarget {
            url: host.url.clone(),
            token: token.clone(),
            session: session.clone(),
            count: options.subscribers,
        })
        .collect();
    let mut pool = Pool::start_targets(
        tools,
        "capacity",
        &targets,
        options.processes,
        Duration::from_secs(180),
    )
    .await?;
    let outcome = async {
        // Warm-up: every subscriber sees deltas before anything is measured.
        stream_all(&mut sessions, 20, options.rate, 1).await?;
        let warm = pool.await_tag(1, 20, Duration::from_secs(60)).await?;
        idle_all(&mut sessions).await?;
        let expected = 20 * (n * options.subscribers) as u64;
        if warm.received != expected {
            bail!("warm-up: {} of {expected} deliveries", warm.received);
        }
        let mut run = stream_measured(host, &mut sessions, &mut pool, options).await?;
        run["sessions"] = json!(n);
        Ok(run)
    }
    .await;
    pool.stop().await;
    outcome
}

/// The measured stream: every agent `options.secs` at `options.rate`, the host's CPU over it.
async fn stream_measured(
    host: &PiHost,
    sessions: &mut [(Control, String)],
    pool: &mut Pool,
    options: &Options,
) -> Result<Value> {
    let n = sessions.len();
    let events = ((options.rate as f64) * options.secs) as u64;
    let cpu = CpuMeter::start(host.pid)?;
    let t0 = now_us();
    stream_all(sessions, events, options.rate, 2).await?;
    let wait = Duration::from_secs_f64(options.secs + 60.0);
    let r = pool.await_tag(2, events, wait).await?;
    let cpu_us = cpu.elapsed_us()?;
    let wall_us = r.last_us.saturating_sub(t0).max(1);
    let rss = rss_kib(host.pid)?;
    let agents_rss: u64 = host
        .agent_pids()
        .iter()
        .filter_map(|p| rss_kib(*p).ok())
        .sum();
    idle_all(sessions).await?;
    let expected = events * (n * options.subscribers) as u64;
    Ok(json!({
        "events_per_s": n as u64 * options.rate,
        "expected": expected,
        "received": r.received,
        "closed": r.closed,
        "host_cpu_pct": cpu_us as f64 * 100.0 / wall_us as f64,
        "host_rss_mib": rss as f64 / 1024.0,
        "agents_rss_mib": agents_rss as f64 / 1024.0,
        "latency": latency(&r.hist),
        "load": crate::procstat::loadavg(),
    }))
}

fn latency(hist: &Histogram) -> Value {
    json!({"p50_us": hist.quantile(0.50), "p99_us": hist.quantile(0.99),
        "max_us": hist.quantile(1.0)})
}

/// Every session's agent streams `events` pi-shaped deltas at `rate` a second, tagged `tag`.
async fn stream_all(
    sessions: &mut [(Control, String)],
    events: u64,
    rate: u64,
    tag: u64,
) -> Result<()> {
    let text = format!("stream:{events}:{rate}:{tag}:pi");
    for (control, session) in sessions.iter_mut() {
        start_turn(control, session, &text).await?;
    }
    Ok(())
}

async fn idle_all(sessions: &mut [(Control, String)]) -> Result<()> {
    for (control, session) in sessions.iter_mut() {
        wait_idle(control, session, Duration::from_secs(60)).await?;
    }
    Ok(())
}
