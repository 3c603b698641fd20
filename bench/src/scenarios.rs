//! The four scenarios of docs/benchmarks.md, each run against pi-host and (where it applies) the Socket.IO
//! peer on the same machine, one after the other, each server fresh.

use crate::hist::Histogram;
use crate::host::{PiHost, SocketIo, Tools, cursor_seq, session_with_agent, start_turn, wait_idle};
use crate::pool::{Pool, Receipts, System, Target};
use crate::procstat::{CpuMeter, rss_kib};
use crate::racp::Control;
use crate::worker::now_us;
use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// The token the Socket.IO peer's auth middleware checks.
const SIO_TOKEN: &str = "pi-bench-socketio-token";
/// Deliveries per second of the first (light) fan-out step.
const FIRST_STEP_DELIVERIES: u64 = 5_000;
/// Highest event rate a fan-out ramp offers.
const MAX_RATE: u64 = 1_000_000;
/// A step passes when every delivery arrived at most this long after the producer's schedule
/// ended: the subscribers kept up with at most this much backlog.
const PASS_SLACK_SECS: f64 = 0.25;
const READY_TIMEOUT: Duration = Duration::from_secs(180);

pub struct Ctx {
    pub tools: Tools,
    /// Data directories on the disk (fsync reaches the device).
    pub disk_dir: PathBuf,
    /// Fan-out with pi-shaped agent lines (`--pi-shaped`).
    pub pi_shaped: bool,
    /// Data directories on tmpfs (fsync returns at once): the durability baseline.
    pub tmpfs_dir: PathBuf,
    pub deadline: Instant,
    pub step_secs: f64,
    pub subscribers: Vec<usize>,
    pub processes: usize,
    pub resume_gaps: Vec<u64>,
    pub resume_runs: usize,
    pub memory_connections: Vec<usize>,
    /// Fan-out at these deliveries per second only, instead of the ramp (for A/B comparisons of
    /// server CPU per delivery).
    pub fixed_deliveries: Vec<u64>,
}

impl Ctx {
    fn time_left(&self) -> Duration {
        self.deadline.saturating_duration_since(Instant::now())
    }

    fn check_time(&self, need: Duration, what: &str) -> Result<()> {
        if self.time_left() < need {
            bail!("skipped {what}: the time budget is spent");
        }
        Ok(())
    }
}

/// Whoever produces a fan-out stream: pi-host's agent (through a turn) or the Socket.IO server.
enum Producer<'a> {
    Pi {
        control: &'a mut Control,
        session: &'a str,
        /// The agent writes pi's own shape (the message so far in every update).
        pi_shaped: bool,
    },
    Sio {
        server: &'a mut SocketIo,
    },
}

impl Producer<'_> {
    async fn start(&mut self, n: u64, rate: u64, tag: u64) -> Result<()> {
        match self {
            Producer::Pi {
                control,
                session,
                pi_shaped,
            } => {
                let shape = if *pi_shaped { ":pi" } else { "" };
                start_turn(control, session, &format!("stream:{n}:{rate}:{tag}{shape}")).await
            }
            Producer::Sio { server } => {
                server
                    .process
                    .send(&json!({"cmd": "stream", "n": n, "rate": rate, "tag": tag}))
                    .await
            }
        }
    }

    async fn finish(&mut self, timeout: Duration) -> Result<()> {
        match self {
            Producer::Pi {
                control, session, ..
            } => {
                wait_idle(control, session, timeout).await?;
            }
            Producer::Sio { server } => {
                let done = server.process.recv(timeout).await?;
                if done.get("streamed").is_none() {
                    bail!("unexpected answer from the Socket.IO server: {done}");
                }
            }
        }
        Ok(())
    }
}

fn latency(hist: &Histogram) -> Value {
    json!({"p50_us": hist.quantile(0.50), "p99_us": hist.quantile(0.99),
        "p999_us": hist.quantile(0.999), "max_us": hist.quantile(1.0)})
}

struct Meters {
    server: CpuMeter,
    agent: Option<CpuMeter>,
    clients: Vec<CpuMeter>,
}

impl Meters {
    fn start(server: u32, agent: Option<u32>, clients: &[u32]) -> Result<Meters> {
        Ok(Meters {
            server: CpuMeter::start(server)?,
            agent: agent.map(CpuMeter::start).transpose()?,
            clients: clients
                .iter()
                .map(|&p| CpuMeter::start(p))
                .collect::<Result<_>>()?,
        })
    }

    fn read(&self) -> Result<(u64, Option<u64>, u64)> {
        let clients = self
            .clients
            .iter()
            .map(|m| m.elapsed_us())
            .sum::<Result<u64>>()?;
        Ok((
            self.server.elapsed_us()?,
            self.agent.as_ref().map(|m| m.elapsed_us()).transpose()?,
            clients,
        ))
    }
}

/// One rate step of a fan-out ramp.
#[allow(clippy::too_many_arguments)]
async fn step(
    ctx: &Ctx,
    producer: &mut Producer<'_>,
    pool: &mut Pool,
    server_pid: u32,
    agent_pid: Option<u32>,
    rate: u64,
    tag: u64,
) -> Result<Value> {
    let events = ((rate as f64 * ctx.step_secs) as u64).clamp(10, 2 * MAX_RATE);
    let produce_secs = events as f64 / rate as f64;
    let subscribers = pool.connections as u64;
    let meters = Meters::start(server_pid, agent_pid, &pool.pids())?;
    let t0 = now_us();
    producer.start(events, rate, tag).await?;
    let timeout = Duration::from_secs_f64(produce_secs + 10.0);
    let r: Receipts = pool.await_tag(tag, events, timeout).await?;
    let (server_cpu, agent_cpu, client_cpu) = meters.read()?;
    producer.finish(Duration::from_secs(60)).await?;
    let expected = events * subscribers;
    let secs = r.last_us.saturating_sub(t0) as f64 / 1e6;
    let complete = r.received == expected;
    let pass = complete && secs <= produce_secs + PASS_SLACK_SECS && r.closed == 0;
    let per = |cpu: u64| {
        if r.received == 0 {
            0.0
        } else {
            cpu as f64 / r.received as f64
        }
    };
    Ok(json!({
        "rate": rate,
        "events": events,
        "expected": expected,
        "received": r.received,
        "complete": complete,
        "closed": r.closed,
        "secs": secs,
        "delivered_per_s": if secs > 0.0 { r.received as f64 / secs } else { 0.0 },
        "server_cpu_us": server_cpu,
        "server_cpu_us_per_delivery": per(server_cpu),
        "agent_cpu_us": agent_cpu,
        "client_cpu_us": client_cpu,
        "client_cpu_us_per_delivery": per(client_cpu),
        "latency": latency(&r.hist),
        "pass": pass,
    }))
}

/// Doubles the offered rate until a step fails, then narrows the gap twice (geometric means).
async fn ramp(
    ctx: &Ctx,
    producer: &mut Producer<'_>,
    pool: &mut Pool,
    server_pid: u32,
    agent_pid: Option<u32>,
) -> Result<Value> {
    let subscribers = pool.connections as u64;
    // Warm-up: every subscriber sees events flowing before anything is measured.
    let mut tag = 1;
    producer.start(100, 1000, tag).await?;
    let warm = pool.await_tag(tag, 100, Duration::from_secs(30)).await?;
    producer.finish(Duration::from_secs(30)).await?;
    if warm.received != 100 * subscribers {
        bail!(
            "warm-up: {} of {} deliveries arrived",
            warm.received,
            100 * subscribers
        );
    }
    let mut steps: Vec<Value> = Vec::new();
    let mut notes = Vec::new();
    if !ctx.fixed_deliveries.is_empty() {
        for &deliveries in &ctx.fixed_deliveries {
            tag += 1;
            let rate = (deliveries / subscribers).max(1);
            steps.push(step(ctx, producer, pool, server_pid, agent_pid, rate, tag).await?);
        }
        return Ok(json!({"steps": steps, "best": 0, "light": 0, "notes": ["fixed rates"]}));
    }
    let mut rate = (FIRST_STEP_DELIVERIES / subscribers).max(1);
    let step_budget = Duration::from_secs_f64(ctx.step_secs + 12.0);
    let mut pass_rate: Option<u64> = None;
    let mut fail: Option<(u64, bool)> = None;
    loop {
        if ctx.time_left() < step_budget {
            notes.push("stopped early: time budget".to_string());
            break;
        }
        tag += 1;
        let s = step(ctx, producer, pool, server_pid, agent_pid, rate, tag).await?;
        let (pass, drained) = (s["pass"] == true, s["complete"] == true);
        steps.push(s);
        if !pass {
            fail = Some((rate, drained));
            break;
        }
        pass_rate = Some(rate);
        if rate >= MAX_RATE {
            notes.push(format!("reached the highest offered rate, {MAX_RATE}/s"));
            break;
        }
        rate = (rate * 2).min(MAX_RATE);
    }
    // Narrow down between the last pass and the first failure, unless the failure left a
    // backlog that would spoil later steps.
    if let (Some(mut lo), Some((mut hi, true))) = (pass_rate, fail) {
        for _ in 0..2 {
            let mid = ((lo as f64) * (hi as f64)).sqrt() as u64;
            if mid <= lo + lo / 20 || ctx.time_left() < step_budget {
                break;
            }
            tag += 1;
            let s = step(ctx, producer, pool, server_pid, agent_pid, mid, tag).await?;
            let (pass, drained) = (s["pass"] == true, s["complete"] == true);
            steps.push(s);
            if pass {
                lo = mid;
            } else {
                hi = mid;
                if !drained {
                    break;
                }
            }
        }
    }
    // The best step: the highest rate that passed (else the first step, which failed).
    let best = steps
        .iter()
        .enumerate()
        .filter(|(_, s)| s["pass"] == true)
        .max_by_key(|(_, s)| s["rate"].as_u64().unwrap_or(0))
        .map_or(0, |(i, _)| i);
    Ok(json!({"steps": steps, "best": best, "light": 0, "notes": notes}))
}

pub async fn fanout(ctx: &Ctx, system: System, subscribers: usize) -> Result<Value> {
    ctx.check_time(Duration::from_secs(30), "fan-out")?;
    let processes = ctx.processes.min(subscribers);
    let mut result = match system {
        System::PiHost => {
            // Throughput is measured with slow-subscriber protection out of the way: a lagging
            // subscriber is what a failing step shows, not a reason to drop it.
            let host = PiHost::start(
                &ctx.tools,
                &ctx.disk_dir,
                &[
                    "--max-lag-events",
                    "1000000000",
                    "--retain-events",
                    "4000000",
                    "--retain-bytes",
                    "4294967296",
                ],
            )
            .await?;
            let outcome = async {
                let token = host.pair_device().await?;
                let (mut control, session) = session_with_agent(&host, &token).await?;
                let agent = host.agent_pids().first().copied();
                let target = Target {
                    system,
                    url: &host.url,
                    token: &token,
                    session: Some(&session),
                };
                let mut pool = Pool::start(
                    &ctx.tools,
                    &target,
                    "fanout",
                    subscribers,
                    processes,
                    READY_TIMEOUT,
                )
                .await?;
                let mut producer = Producer::Pi {
                    control: &mut control,
                    session: &session,
                    pi_shaped: ctx.pi_shaped,
                };
                let ramped = ramp(ctx, &mut producer, &mut pool, host.pid, agent).await;
                pool.stop().await;
                ramped
            }
            .await;
            host.stop().await;
            outcome?
        }
        System::SocketIo => {
            let mut server = SocketIo::start(&ctx.tools, SIO_TOKEN).await?;
            let pid = server.pid();
            let url = server.url.clone();
            let outcome = async {
                let target = Target {
                    system,
                    url: &url,
                    token: SIO_TOKEN,
                    session: None,
                };
                let mut pool = Pool::start(
                    &ctx.tools,
                    &target,
                    "fanout",
                    subscribers,
                    processes,
                    READY_TIMEOUT,
                )
                .await?;
                let mut producer = Producer::Sio {
                    server: &mut server,
                };
                let ramped = ramp(ctx, &mut producer, &mut pool, pid, None).await;
                pool.stop().await;
                ramped
            }
            .await;
            server.stop().await;
            outcome?
        }
    };
    result["system"] = json!(system.name());
    result["subscribers"] = json!(subscribers);
    result["processes"] = json!(processes);
    Ok(result)
}

fn median(values: &mut [f64]) -> f64 {
    values.sort_by(|a, b| a.total_cmp(b));
    values.get(values.len() / 2).copied().unwrap_or(0.0)
}

/// A subscriber misses `gap` events and reconnects with its cursor: time to the last one.
pub async fn resume(ctx: &Ctx, system: System) -> Result<Value> {
    ctx.check_time(Duration::from_secs(20), "resume")?;
    let mut rows = Vec::new();
    match system {
        System::PiHost => {
            // The shipped retention (200k events, 64 MiB) holds a 100k gap.
            let host = PiHost::start(&ctx.tools, &ctx.disk_dir, &[]).await?;
            let outcome: Result<()> = async {
                let token = host.pair_device().await?;
                let (mut control, session) = session_with_agent(&host, &token).await?;
                let target = Target {
                    system,
                    url: &host.url,
                    token: &token,
                    session: Some(&session),
                };
                let mut pool =
                    Pool::start(&ctx.tools, &target, "resume", 1, 1, READY_TIMEOUT).await?;
                let mut tag = 100;
                for &gap in &ctx.resume_gaps {
                    let mut runs = Vec::new();
                    let mut last = Value::Null;
                    for _ in 0..ctx.resume_runs {
                        ctx.check_time(Duration::from_secs(10), "resume")?;
                        tag += 1;
                        let cursor = wait_idle(&mut control, &session, Duration::from_secs(30)).await?;
                        start_turn(&mut control, &session, &format!("stream:{gap}:0:{tag}")).await?;
                        let head = wait_idle(&mut control, &session, Duration::from_secs(120)).await?;
                        let until = cursor_seq(&head)?;
                        let meter = CpuMeter::start(host.pid)?;
                        let mut answer = pool
                            .ask_first(
                                json!({"cmd": "resume", "cursor": cursor, "until_seq": until,
                                    "timeout_ms": 60_000}),
                                Duration::from_secs(70),
                            )
                            .await?;
                        answer["server_cpu_ms"] = json!(meter.elapsed_us()? as f64 / 1000.0);
                        runs.push(answer["ms"].as_f64().context("no ms")?);
                        last = answer;
                    }
                    let all = runs.clone();
                    rows.push(json!({
                        "missed": gap,
                        "runs_ms": all,
                        "median_ms": median(&mut runs),
                        "received": last["received"],
                        "ok": last["in_order"],
                        "last": last,
                        "note": "received counts the whole gap: the stream plus the ~10 turn and message events around it",
                    }));
                }
                pool.stop().await;
                Ok(())
            }
            .await;
            host.stop().await;
            outcome?;
        }
        System::SocketIo => {
            let mut server = SocketIo::start(&ctx.tools, SIO_TOKEN).await?;
            let url = server.url.clone();
            let outcome: Result<()> = async {
                let target = Target {
                    system,
                    url: &url,
                    token: SIO_TOKEN,
                    session: None,
                };
                let mut pool =
                    Pool::start(&ctx.tools, &target, "resume", 1, 1, READY_TIMEOUT).await?;
                // The client needs an offset to recover from: it must have seen a packet.
                server
                    .ask(json!({"cmd": "stream", "n": 10, "rate": 0, "tag": 1}), Duration::from_secs(10))
                    .await?;
                tokio::time::sleep(Duration::from_millis(200)).await;
                let mut tag = 100;
                for &gap in &ctx.resume_gaps {
                    let mut runs = Vec::new();
                    let mut last = Value::Null;
                    for _ in 0..ctx.resume_runs {
                        ctx.check_time(Duration::from_secs(10), "resume")?;
                        tag += 1;
                        pool.ask_first(json!({"cmd": "drop"}), Duration::from_secs(10)).await?;
                        // Broadcast only once the server has seen the disconnect.
                        let deadline = Instant::now() + Duration::from_secs(10);
                        loop {
                            let clients = server
                                .ask(json!({"cmd": "clients"}), Duration::from_secs(10))
                                .await?;
                            if clients["clients"] == 0 {
                                break;
                            }
                            if Instant::now() > deadline {
                                bail!("the Socket.IO server did not see the disconnect");
                            }
                            tokio::time::sleep(Duration::from_millis(5)).await;
                        }
                        server
                            .ask(json!({"cmd": "stream", "n": gap, "rate": 0, "tag": tag}), Duration::from_secs(120))
                            .await?;
                        let answer = pool
                            .ask_first(
                                json!({"cmd": "resume", "tag": tag, "expect": gap, "timeout_ms": 60_000}),
                                Duration::from_secs(70),
                            )
                            .await?;
                        runs.push(answer["ms"].as_f64().context("no ms")?);
                        last = answer;
                    }
                    let all = runs.clone();
                    rows.push(json!({
                        "missed": gap,
                        "runs_ms": all,
                        "median_ms": median(&mut runs),
                        "received": last["received"],
                        "ok": last["recovered"] == true && last["in_order"] == true,
                    }));
                }
                pool.stop().await;
                Ok(())
            }
            .await;
            server.stop().await;
            outcome?;
        }
    }
    Ok(json!({"system": system.name(), "rows": rows}))
}

/// RSS per idle authenticated connection: (RSS with N connections − RSS before) / N.
pub async fn memory(ctx: &Ctx, system: System, connections: usize) -> Result<Value> {
    ctx.check_time(Duration::from_secs(30), "memory")?;
    let settle = Duration::from_secs(2);
    let (rss0, rss, connected, pid) = match system {
        System::PiHost => {
            let host = PiHost::start(&ctx.tools, &ctx.disk_dir, &[]).await?;
            let outcome = async {
                let token = host.pair_device().await?;
                tokio::time::sleep(Duration::from_millis(500)).await;
                let rss0 = rss_kib(host.pid)?;
                let target = Target {
                    system,
                    url: &host.url,
                    token: &token,
                    session: None,
                };
                let pool = Pool::start(
                    &ctx.tools,
                    &target,
                    "idle",
                    connections,
                    ctx.processes,
                    READY_TIMEOUT,
                )
                .await?;
                tokio::time::sleep(settle).await;
                let rss = rss_kib(host.pid)?;
                let connected = pool.connections;
                pool.stop().await;
                Ok::<_, anyhow::Error>((rss0, rss, connected, host.pid))
            }
            .await;
            host.stop().await;
            outcome?
        }
        System::SocketIo => {
            let mut server = SocketIo::start(&ctx.tools, SIO_TOKEN).await?;
            let url = server.url.clone();
            let pid = server.pid();
            let outcome = async {
                server
                    .ask(json!({"cmd": "gc"}), Duration::from_secs(10))
                    .await?;
                tokio::time::sleep(Duration::from_millis(500)).await;
                let rss0 = rss_kib(pid)?;
                let target = Target {
                    system,
                    url: &url,
                    token: SIO_TOKEN,
                    session: None,
                };
                let pool = Pool::start(
                    &ctx.tools,
                    &target,
                    "idle",
                    connections,
                    ctx.processes,
                    READY_TIMEOUT,
                )
                .await?;
                let clients = server
                    .ask(json!({"cmd": "clients"}), Duration::from_secs(10))
                    .await?;
                let connected = clients["clients"].as_u64().unwrap_or(0) as usize;
                tokio::time::sleep(settle).await;
                server
                    .ask(json!({"cmd": "gc"}), Duration::from_secs(30))
                    .await?;
                tokio::time::sleep(Duration::from_millis(500)).await;
                let rss = rss_kib(pid)?;
                pool.stop().await;
                Ok::<_, anyhow::Error>((rss0, rss, connected, pid))
            }
            .await;
            server.stop().await;
            outcome?
        }
    };
    let _ = pid;
    let per = (rss.saturating_sub(rss0) * 1024) as f64 / connections.max(1) as f64;
    Ok(json!({
        "system": system.name(),
        "connections": connections,
        "connected": connected,
        "processes": ctx.processes,
        "rss0_kib": rss0,
        "rss_kib": rss,
        "bytes_per_connection": per,
    }))
}

/// fdatasync latency of the file system under `dir`: 4 KiB appended and synced, 200 times.
fn fsync_probe(dir: &std::path::Path) -> Result<Value> {
    use std::io::Write;
    let file = tempfile::NamedTempFile::new_in(dir)?;
    let mut f = file.as_file();
    let block = vec![b'x'; 4096];
    let mut hist = Histogram::default();
    for _ in 0..200 {
        let start = Instant::now();
        f.write_all(&block)?;
        f.sync_data()?;
        hist.record(start.elapsed().as_micros() as u64);
    }
    Ok(latency(&hist))
}

/// One stream through a host with a single subscriber.
async fn durable_run(
    pool: &mut Pool,
    control: &mut Control,
    session: &str,
    host_pid: u32,
    events: u64,
    rate: u64,
    tag: u64,
) -> Result<Value> {
    let meter = CpuMeter::start(host_pid)?;
    let t0 = now_us();
    start_turn(control, session, &format!("stream:{events}:{rate}:{tag}")).await?;
    let r = pool
        .await_tag(tag, events, Duration::from_secs(120))
        .await?;
    let cpu = meter.elapsed_us()?;
    wait_idle(control, session, Duration::from_secs(60)).await?;
    if r.received != events {
        bail!("{} of {events} events arrived", r.received);
    }
    let secs = r.last_us.saturating_sub(t0) as f64 / 1e6;
    Ok(json!({
        "rate": rate,
        "events": events,
        "secs": secs,
        "events_per_s": events as f64 / secs,
        "server_cpu_us_per_event": cpu as f64 / events as f64,
        "latency": latency(&r.hist),
    }))
}

/// Events/s and latency with durable-before-visible, on the disk and on tmpfs (where fsync
/// costs nothing): the difference is what durability adds.
pub async fn durability(ctx: &Ctx) -> Result<Value> {
    ctx.check_time(Duration::from_secs(40), "durability")?;
    let mut out = json!({});
    for (label, dir) in [("disk", &ctx.disk_dir), ("tmpfs", &ctx.tmpfs_dir)] {
        std::fs::create_dir_all(dir)?;
        let host = PiHost::start(
            &ctx.tools,
            dir,
            &[
                "--max-lag-events",
                "1000000000",
                "--retain-events",
                "1000000",
                "--retain-bytes",
                "1073741824",
            ],
        )
        .await?;
        let outcome = async {
            let token = host.pair_device().await?;
            let (mut control, session) = session_with_agent(&host, &token).await?;
            let target = Target {
                system: System::PiHost,
                url: &host.url,
                token: &token,
                session: Some(&session),
            };
            let mut pool = Pool::start(&ctx.tools, &target, "fanout", 1, 1, READY_TIMEOUT).await?;
            let full =
                durable_run(&mut pool, &mut control, &session, host.pid, 200_000, 0, 1).await?;
            let mut paced = Vec::new();
            for (i, rate) in [100u64, 1_000, 10_000].into_iter().enumerate() {
                let events = (rate * 3).max(300);
                paced.push(
                    durable_run(
                        &mut pool,
                        &mut control,
                        &session,
                        host.pid,
                        events,
                        rate,
                        2 + i as u64,
                    )
                    .await?,
                );
            }
            pool.stop().await;
            Ok::<_, anyhow::Error>(json!({"full_speed": full, "paced": paced,
                "fsync": fsync_probe(dir)?, "dir": dir.display().to_string()}))
        }
        .await;
        host.stop().await;
        out[label] = outcome?;
    }
    Ok(out)
}
