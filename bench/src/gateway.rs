//! The gateway at scale (docs/benchmarks.md §8): real pi-host processes with the stand-in agent,
//! one single-node NATS server with JetStream (R1), one `pi-gateway`, and per host the same
//! number of subscribers through the gateway and connected to the host directly, all in one run
//! on the same events, so the gateway's added latency compares like with like.
//!
//! Hosts are added in steps (10, 30, 100 by default) and stay up between steps; each step gets
//! a fresh gateway (so its memory growth is its own) and fresh subscriber pools.

use crate::hist::Histogram;
use crate::host::{PiHost, Tools, new_data_dir, session_with_agent, start_turn, wait_idle};
use crate::pool::{Pool, Receipts};
use crate::procstat::{CpuMeter, loadavg, rss_kib};
use crate::racp::Control;
use crate::worker::{WorkerTarget, now_us};
use anyhow::{Context, Result, bail};
use futures_util::StreamExt;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tests::nats::NatsCluster;
use tokio::process::{Child, Command};

const START_TIMEOUT: Duration = Duration::from_secs(60);
const READY_TIMEOUT: Duration = Duration::from_secs(180);
/// Warm-up deltas per host before each measurement, so every subscriber sees events flowing.
const WARM_EVENTS: u64 = 20;
/// A ceiling step passes when every delivery arrived at most this long after the producers'
/// schedule ended (as in the fan-out ramp).
const PASS_SLACK_SECS: f64 = 0.25;
/// Enrollments run at once (each is a `pi-gateway enroll` process talking to JetStream).
const ENROLL_WINDOW: usize = 4;

pub struct Options {
    /// Host counts, in increasing order.
    pub hosts: Vec<usize>,
    /// Subscribers per host on each path (through the gateway, and direct).
    pub per_host: usize,
    /// Events per second each host's agent writes in the measured step.
    pub rate: u64,
    /// Seconds the measured step produces for.
    pub secs: f64,
    /// Seconds of the idle window before it.
    pub idle_secs: f64,
    /// After the last step, ramp the per-host rate through the gateway alone.
    pub ceiling: bool,
    pub processes: usize,
}

/// Runs `program` and returns its stdout, failing with its stderr.
async fn run_tool(program: &Path, args: &[&str], env: &[(&str, &str)]) -> Result<String> {
    let mut command = Command::new(program);
    command.args(args);
    for (k, v) in env {
        command.env(k, v);
    }
    let output = command
        .output()
        .await
        .with_context(|| format!("run {}", program.display()))?;
    if !output.status.success() {
        bail!(
            "{} {} failed: {}",
            program.display(),
            args.first().unwrap_or(&""),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_string())
}

/// The gateway's data directory, NATS address and binary: what its CLI commands need.
struct GatewayCli {
    bin: PathBuf,
    data_dir: PathBuf,
    nats: String,
}

impl GatewayCli {
    async fn run(&self, args: &[&str]) -> Result<String> {
        let data_dir = self.data_dir.display().to_string();
        let mut all = args.to_vec();
        all.extend(["--data-dir", &data_dir, "--nats", &self.nats]);
        run_tool(&self.bin, &all, &[("PI_GATEWAY_LOG", "warn")]).await
    }
}

/// A running `pi-gateway serve --plain`.
struct GatewayProcess {
    child: Child,
    pid: u32,
    /// `ws://127.0.0.1:PORT/racp`
    url: String,
}

impl GatewayProcess {
    async fn start(cli: &GatewayCli, log: &Path) -> Result<GatewayProcess> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)?;
        // Plain ws:// on loopback, as pi-bench serves pi-host: the comparison with the direct
        // path is of the route, not of TLS. The default heartbeat (15 s).
        let mut command = Command::new(&cli.bin);
        command
            .args(["serve", "--plain", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(&cli.data_dir)
            .args(["--nats", &cli.nats])
            .env("PI_GATEWAY_LOG", "warn")
            .stderr(Stdio::from(log));
        let (child, pid, url) =
            crate::host::spawn_listening(&mut command, "pi-gateway", "gateway.log", START_TIMEOUT)
                .await?;
        Ok(GatewayProcess { child, pid, url })
    }

    fn host_url(&self, host_id: &str) -> String {
        format!("{}/hosts/{host_id}", self.url)
    }

    async fn stop(mut self) {
        let _ = self.child.kill().await;
        let _ = self.child.wait().await;
    }
}

/// An enrolled host, its data directory made and not started yet.
struct Enrolled {
    data_dir: tempfile::TempDir,
    host_id: String,
}

/// A running host of the fleet with its session (agent warm) and its devices' tokens.
struct Member {
    host: PiHost,
    host_id: String,
    control: Control,
    session: String,
    direct_token: String,
    gateway_token: Option<String>,
}

/// Makes `count` host data directories with their gateway keys, and enrolls them.
async fn enroll_hosts(
    tools: &Tools,
    cli: &GatewayCli,
    data_parent: &Path,
    count: usize,
) -> Result<(Vec<Enrolled>, Vec<String>)> {
    let mut prepared = Vec::with_capacity(count);
    for _ in 0..count {
        let data_dir = new_data_dir(data_parent)?;
        let dir = data_dir.path().display().to_string();
        let key: Value = serde_json::from_str(
            &run_tool(
                &tools.pi_host,
                &["gateway-key", "--json", "--data-dir", &dir],
                &[("PI_HOST_LOG", "warn")],
            )
            .await?,
        )
        .context("pi-host gateway-key --json")?;
        let host_id = key["hostId"].as_str().context("no hostId")?.to_string();
        let nkey = key["nkey"].as_str().context("no nkey")?.to_string();
        prepared.push((data_dir, host_id, nkey));
    }
    let users: Vec<Result<String>> =
        futures_util::stream::iter(prepared.iter().map(|(_, host_id, nkey)| async move {
            // 8 MiB a host (JetStream reserves each stream's max_bytes): a run's events are
            // well under it, and a hundred hosts fit the store below.
            cli.run(&[
                "enroll",
                host_id,
                nkey,
                "--retention-seconds",
                "3600",
                "--max-bytes",
                "8388608",
            ])
            .await
        }))
        .buffered(ENROLL_WINDOW)
        .collect()
        .await;
    let users = users.into_iter().collect::<Result<Vec<_>>>()?;
    let enrolled = prepared
        .into_iter()
        .map(|(data_dir, host_id, _)| Enrolled { data_dir, host_id })
        .collect();
    Ok((enrolled, users))
}

/// Pairs a device with the gateway for one host (`pi-gateway pair`, then `pair` over RACP-WS).
async fn pair_with_gateway(
    cli: &GatewayCli,
    gateway: &GatewayProcess,
    host_id: &str,
) -> Result<String> {
    let minted: Value = serde_json::from_str(
        &cli.run(&["pair", "--json", "--roles", "owner", "--hosts", host_id])
            .await?,
    )
    .context("pi-gateway pair --json")?;
    let token = minted["token"].as_str().context("no token")?;
    let mut control = Control::connect(&gateway.url, token).await?;
    let paired = control
        .call("pair", json!({"deviceName": "pi-bench"}))
        .await?;
    paired["deviceToken"]
        .as_str()
        .map(str::to_string)
        .context("no deviceToken in the pair result")
}

fn latency(hist: &Histogram) -> Value {
    json!({"p50_us": hist.quantile(0.50), "p99_us": hist.quantile(0.99),
        "p999_us": hist.quantile(0.999), "max_us": hist.quantile(1.0)})
}

/// CPU of several processes together over an interval.
struct GroupMeter(Vec<CpuMeter>);

impl GroupMeter {
    fn start(pids: &[u32]) -> Result<GroupMeter> {
        Ok(GroupMeter(
            pids.iter()
                .map(|&p| CpuMeter::start(p))
                .collect::<Result<_>>()?,
        ))
    }

    fn elapsed_us(&self) -> Result<u64> {
        self.0.iter().map(|m| m.elapsed_us()).sum()
    }
}

/// Starts a `stream:N:RATE:TAG` turn on every host.
async fn produce(members: &mut [Member], events: u64, rate: u64, tag: u64) -> Result<()> {
    for m in members.iter_mut() {
        start_turn(
            &mut m.control,
            &m.session,
            &format!("stream:{events}:{rate}:{tag}"),
        )
        .await
        .with_context(|| format!("start a turn on host {}", m.host_id))?;
    }
    Ok(())
}

async fn wait_all_idle(members: &mut [Member]) -> Result<()> {
    for m in members.iter_mut() {
        wait_idle(&mut m.control, &m.session, Duration::from_secs(120)).await?;
    }
    Ok(())
}

fn per(cpu: u64, deliveries: u64) -> f64 {
    if deliveries == 0 {
        0.0
    } else {
        cpu as f64 / deliveries as f64
    }
}

fn rate_of(r: &Receipts, t0: u64) -> (f64, f64) {
    let secs = r.last_us.saturating_sub(t0) as f64 / 1e6;
    let per_s = if secs > 0.0 {
        r.received as f64 / secs
    } else {
        0.0
    };
    (secs, per_s)
}

pub async fn gateway(
    tools: &Tools,
    data_parent: &Path,
    gateway_bin: &Path,
    options: &Options,
    deadline: Instant,
) -> Result<Value> {
    let max_hosts = options.hosts.iter().copied().max().unwrap_or(0);
    if max_hosts == 0 {
        bail!("no host counts");
    }
    std::fs::create_dir_all(&tools.log_dir)?;
    std::fs::create_dir_all(data_parent)?;
    let gateway_dir = tempfile::Builder::new()
        .prefix("pi-gateway-data-")
        .tempdir_in(data_parent)?;
    let gateway_key = run_tool(
        gateway_bin,
        &[
            "key",
            "--data-dir",
            &gateway_dir.path().display().to_string(),
        ],
        &[("PI_GATEWAY_LOG", "warn")],
    )
    .await?;
    let mut users = vec![format!("{{ nkey: \"{gateway_key}\" }}")];
    // Cleartext NATS (named nats://), as the WebSockets are plain: the comparison is of the
    // route, not of TLS.
    let cleartext = tests::nats::NatsOptions {
        tls: false,
        max_file_store: "2GB".into(),
        ..Default::default()
    };
    let mut nats = NatsCluster::start_with(1, &users, cleartext).await;
    let nats_pid = nats.pid(0).context("nats-server is not running")?;
    let cli = GatewayCli {
        bin: gateway_bin.to_path_buf(),
        data_dir: gateway_dir.path().to_path_buf(),
        nats: nats.url(0),
    };
    let enroll_started = Instant::now();
    let (mut enrolled, host_users) = enroll_hosts(tools, &cli, data_parent, max_hosts).await?;
    users.extend(host_users);
    nats.set_users(&users).await;
    let enroll_secs = enroll_started.elapsed().as_secs_f64();

    let mut members: Vec<Member> = Vec::new();
    let mut steps = Vec::new();
    let mut ceiling = Value::Null;
    let mut tag = 1000;
    for (index, &hosts) in options.hosts.iter().enumerate() {
        if Instant::now() >= deadline {
            steps.push(json!({"hosts": hosts, "error": "skipped: the time budget is spent"}));
            continue;
        }
        let last = index + 1 == options.hosts.len();
        let started = Instant::now();
        while members.len() < hosts {
            let next = enrolled.remove(0);
            let nats_url = nats.url(0);
            let host = PiHost::start_in(
                tools,
                next.data_dir,
                data_parent,
                &["--gateway", &nats_url, "--gateway-trust", &gateway_key],
            )
            .await?;
            let direct_token = host.pair_device().await?;
            let (control, session) = session_with_agent(&host, &direct_token).await?;
            members.push(Member {
                host,
                host_id: next.host_id,
                control,
                session,
                direct_token,
                gateway_token: None,
            });
        }
        let hosts_secs = started.elapsed().as_secs_f64();
        let gateway = GatewayProcess::start(&cli, &tools.log_dir.join("gateway.log")).await?;
        let outcome = measure(
            tools,
            &cli,
            &gateway,
            nats_pid,
            &mut members,
            options,
            last && options.ceiling,
            &mut tag,
        )
        .await;
        gateway.stop().await;
        match outcome {
            Ok((mut step, found)) => {
                step["hosts_start_secs"] = json!(hosts_secs);
                steps.push(step);
                if !found.is_null() {
                    ceiling = found;
                }
            }
            Err(err) => {
                eprintln!("pi-bench: gateway × {hosts} hosts: {err:#}");
                steps.push(json!({"hosts": hosts, "error": format!("{err:#}")}));
                break;
            }
        }
    }
    for m in members {
        m.host.stop().await;
    }
    Ok(json!({
        "per_host": options.per_host,
        "rate_per_host": options.rate,
        "secs": options.secs,
        "idle_secs": options.idle_secs,
        "nats": "nats-server (single node, JetStream, R1 streams)",
        "enroll_secs": enroll_secs,
        "steps": steps,
        "ceiling": ceiling,
    }))
}

/// One step: pools on both paths, a warm-up, the measured stream, and optionally the ceiling.
#[allow(clippy::too_many_arguments)]
async fn measure(
    tools: &Tools,
    cli: &GatewayCli,
    gateway: &GatewayProcess,
    nats_pid: u32,
    members: &mut [Member],
    options: &Options,
    find_ceiling: bool,
    tag: &mut u64,
) -> Result<(Value, Value)> {
    let hosts = members.len();
    for m in members.iter_mut() {
        if m.gateway_token.is_none() {
            m.gateway_token = Some(pair_with_gateway(cli, gateway, &m.host_id).await?);
        }
    }
    // Let the gateway settle after pairing before its baseline is read.
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_idle = rss_kib(gateway.pid)?;
    let nats_rss_idle = rss_kib(nats_pid)?;
    let mut via_gateway = Vec::new();
    let mut direct = Vec::new();
    for m in members.iter() {
        via_gateway.push(WorkerTarget {
            url: gateway.host_url(&m.host_id),
            token: m.gateway_token.clone().context("no gateway token")?,
            session: m.session.clone(),
            count: options.per_host,
        });
        direct.push(WorkerTarget {
            url: m.host.url.clone(),
            token: m.direct_token.clone(),
            session: m.session.clone(),
            count: options.per_host,
        });
    }
    let connect_started = Instant::now();
    let mut gw_pool = Pool::start_targets(
        tools,
        "gateway",
        &via_gateway,
        options.processes,
        READY_TIMEOUT,
    )
    .await?;
    let gw_connect_secs = connect_started.elapsed().as_secs_f64();
    let mut direct_pool =
        Pool::start_targets(tools, "direct", &direct, options.processes, READY_TIMEOUT).await?;
    let connections = gw_pool.connections;
    let rss_connected = rss_kib(gateway.pid)?;

    // Warm-up on both paths.
    *tag += 1;
    produce(members, WARM_EVENTS, 100, *tag).await?;
    for (name, pool) in [("gateway", &mut gw_pool), ("direct", &mut direct_pool)] {
        let warm = pool
            .await_tag(*tag, WARM_EVENTS, Duration::from_secs(60))
            .await?;
        let want = WARM_EVENTS * pool.connections as u64;
        if warm.received != want {
            bail!(
                "warm-up ({name}): {} of {want} deliveries arrived",
                warm.received
            );
        }
    }
    wait_all_idle(members).await?;

    // CPU with every subscriber connected and no events (pull requests, heartbeats), so the
    // per-delivery figures can be read net of it at low rates.
    let idle_secs = options.idle_secs;
    let gw_idle = CpuMeter::start(gateway.pid)?;
    let nats_idle = CpuMeter::start(nats_pid)?;
    tokio::time::sleep(Duration::from_secs_f64(idle_secs)).await;
    let gw_idle_per_s = gw_idle.elapsed_us()? as f64 / idle_secs;
    let nats_idle_per_s = nats_idle.elapsed_us()? as f64 / idle_secs;

    // The measured stream: the same events reach both pools.
    *tag += 1;
    let events = ((options.rate as f64 * options.secs) as u64).max(1);
    let host_pids: Vec<u32> = members.iter().map(|m| m.host.pid).collect();
    let agent_pids: Vec<u32> = members.iter().flat_map(|m| m.host.agent_pids()).collect();
    let load_before = loadavg();
    let gw_cpu = CpuMeter::start(gateway.pid)?;
    let nats_cpu = CpuMeter::start(nats_pid)?;
    let hosts_cpu = GroupMeter::start(&host_pids)?;
    // Agents stop when idle long enough: measure the ones running now.
    let agents_cpu = GroupMeter(
        agent_pids
            .iter()
            .filter_map(|&p| CpuMeter::start(p).ok())
            .collect(),
    );
    let gw_workers_cpu = GroupMeter::start(&gw_pool.pids())?;
    let direct_workers_cpu = GroupMeter::start(&direct_pool.pids())?;
    let t0 = now_us();
    let measured = Instant::now();
    produce(members, events, options.rate, *tag).await?;
    let timeout = Duration::from_secs_f64(options.secs + 30.0);
    let via = gw_pool.await_tag(*tag, events, timeout).await?;
    let gw_cpu_us = gw_cpu.elapsed_us()?;
    let nats_cpu_us = nats_cpu.elapsed_us()?;
    let measured_secs = measured.elapsed().as_secs_f64();
    let net = |cpu: u64, idle_per_s: f64| {
        per(
            (cpu as f64 - idle_per_s * measured_secs).max(0.0) as u64,
            via.received,
        )
    };
    let direct_r = direct_pool.await_tag(*tag, events, timeout).await?;
    let hosts_cpu_us = hosts_cpu.elapsed_us()?;
    let agents_cpu_us = agents_cpu.elapsed_us().unwrap_or(0);
    let gw_workers_us = gw_workers_cpu.elapsed_us()?;
    let direct_workers_us = direct_workers_cpu.elapsed_us()?;
    let load_after = loadavg();
    wait_all_idle(members).await?;
    let rss_after = rss_kib(gateway.pid)?;
    let nats_rss_after = rss_kib(nats_pid)?;
    let expected = events * connections as u64;
    let (gw_secs, gw_per_s) = rate_of(&via, t0);
    let (direct_secs, direct_per_s) = rate_of(&direct_r, t0);
    let grown = |rss: u64| (rss.saturating_sub(rss_idle)) as f64 / connections.max(1) as f64;
    let step = json!({
        "hosts": hosts,
        "connections": connections,
        "events_per_host": events,
        "offered_events_per_s": options.rate * hosts as u64,
        "load_before": load_before,
        "load_after": load_after,
        "gateway": {
            "expected": expected,
            "received": via.received,
            "closed": via.closed,
            "secs": gw_secs,
            "delivered_per_s": gw_per_s,
            "latency": latency(&via.hist),
            "cpu_us": gw_cpu_us,
            "cpu_us_per_delivery": per(gw_cpu_us, via.received),
            "nats_cpu_us": nats_cpu_us,
            "nats_cpu_us_per_delivery": per(nats_cpu_us, via.received),
            "idle_cpu_us_per_s": gw_idle_per_s,
            "nats_idle_cpu_us_per_s": nats_idle_per_s,
            "net_cpu_us_per_delivery": net(gw_cpu_us, gw_idle_per_s),
            "nats_net_cpu_us_per_delivery": net(nats_cpu_us, nats_idle_per_s),
            "workers_cpu_us_per_delivery": per(gw_workers_us, via.received),
            "connect_secs": gw_connect_secs,
        },
        "direct": {
            "expected": expected,
            "received": direct_r.received,
            "closed": direct_r.closed,
            "secs": direct_secs,
            "delivered_per_s": direct_per_s,
            "latency": latency(&direct_r.hist),
            "workers_cpu_us_per_delivery": per(direct_workers_us, direct_r.received),
            // Everything the hosts did (the agent's pipe, the commit, the relay to NATS, the
            // deliveries) per delivery to their direct subscribers.
            "hosts_cpu_us_per_delivery": per(hosts_cpu_us, direct_r.received),
        },
        "added_p50_us": via.hist.quantile(0.5) as i64 - direct_r.hist.quantile(0.5) as i64,
        "added_p99_us": via.hist.quantile(0.99) as i64 - direct_r.hist.quantile(0.99) as i64,
        "hosts_cpu_us": hosts_cpu_us,
        "agents_cpu_us": agents_cpu_us,
        "memory": {
            "gateway_rss_idle_kib": rss_idle,
            "gateway_rss_connected_kib": rss_connected,
            "gateway_rss_after_kib": rss_after,
            "kib_per_connection_connected": grown(rss_connected),
            "kib_per_connection_after": grown(rss_after),
            "nats_rss_idle_kib": nats_rss_idle,
            "nats_rss_after_kib": nats_rss_after,
            "hosts_rss_kib": members.iter().map(|m| rss_kib(m.host.pid).unwrap_or(0)).sum::<u64>(),
        },
    });
    direct_pool.stop().await;
    let found = if find_ceiling {
        ramp(members, &mut gw_pool, gateway.pid, nats_pid, options, tag).await?
    } else {
        Value::Null
    };
    gw_pool.stop().await;
    Ok((step, found))
}

/// The gateway's delivered ceiling with every host streaming: the per-host rate doubles from
/// the measured step's until a step misses its schedule, through the gateway alone.
async fn ramp(
    members: &mut [Member],
    pool: &mut Pool,
    gateway_pid: u32,
    nats_pid: u32,
    options: &Options,
    tag: &mut u64,
) -> Result<Value> {
    let mut steps = Vec::new();
    let mut rate = options.rate * 2;
    // Shorter steps than the measured one: the ceiling needs a rate, not a distribution.
    let secs = (options.secs / 2.0).max(3.0);
    for _ in 0..6 {
        *tag += 1;
        let events = (rate as f64 * secs) as u64;
        let load_before = loadavg();
        let gw_cpu = CpuMeter::start(gateway_pid)?;
        let nats_cpu = CpuMeter::start(nats_pid)?;
        let t0 = now_us();
        produce(members, events, rate, *tag).await?;
        let r = pool
            .await_tag(*tag, events, Duration::from_secs_f64(secs + 20.0))
            .await?;
        let (gw_cpu_us, nats_cpu_us) = (gw_cpu.elapsed_us()?, nats_cpu.elapsed_us()?);
        let (took, per_s) = rate_of(&r, t0);
        let complete = r.received == events * pool.connections as u64;
        let pass = complete && took <= secs + PASS_SLACK_SECS && r.closed == 0;
        steps.push(json!({
            "rate_per_host": rate,
            "offered_events_per_s": rate * members.len() as u64,
            "expected": events * pool.connections as u64,
            "received": r.received,
            "closed": r.closed,
            "secs": took,
            "delivered_per_s": per_s,
            "latency": latency(&r.hist),
            "cpu_us_per_delivery": per(gw_cpu_us, r.received),
            "nats_cpu_us_per_delivery": per(nats_cpu_us, r.received),
            "load_before": load_before,
            "load_after": loadavg(),
            "pass": pass,
        }));
        // A failed step may leave a backlog; the turns must end before anything else runs.
        wait_all_idle(members).await?;
        if !pass {
            break;
        }
        rate *= 2;
    }
    Ok(json!({"hosts": members.len(), "secs": secs, "steps": steps}))
}
