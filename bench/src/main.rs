//! `pi-bench`: pi-host measured side by side with a Socket.IO 4.8 peer, on loopback, in one run
//! bounded in time. `scripts/bench` builds everything and runs `pi-bench run`; docs/benchmarks.md
//! explains each scenario and holds the figures of one run.
//!
//! - `pi-bench run`: every scenario (or `--only` some); raw results to OUT/results.json and the
//!   markdown tables to OUT/results.md and stdout.
//! - `pi-bench report FILE`: the markdown tables of a results file.
//! - `pi-bench worker`: a load-generating client process (started by `run`).

mod bytes;
mod capacity;
mod gateway;
mod hist;
mod host;
mod pool;
mod procstat;
mod racp;
mod report;
mod scenarios;
mod worker;

use anyhow::{Context, Result, bail};
use clap::{Parser, Subcommand};
use pool::System;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

#[derive(Parser)]
#[command(
    name = "pi-bench",
    about = "pi-host against a Socket.IO 4.8 peer on loopback"
)]
struct Cli {
    #[command(subcommand)]
    command: Commands,
}

#[derive(Subcommand)]
enum Commands {
    /// Run the scenarios and write the results.
    Run(Box<RunArgs>),
    /// Print the markdown tables of a results file.
    Report { file: PathBuf },
    /// A load-generating client process (started by `run`).
    #[command(hide = true)]
    Worker(worker::WorkerArgs),
}

#[derive(clap::Args)]
struct RunArgs {
    /// Where results.json, results.md and the server logs go.
    #[arg(long, default_value = "target/bench")]
    out: PathBuf,
    /// Scenarios to run (comma-separated): fanout, resume, memory, durability, bytes, and
    /// gateway (only when named: it needs nats-server and pi-gateway, and takes minutes), and
    /// capacity (only when named: N sessions streaming at model speed on one host).
    #[arg(
        long,
        value_delimiter = ',',
        default_value = "fanout,resume,memory,durability,bytes"
    )]
    only: Vec<String>,
    /// Systems to run: pi-host, socket.io.
    #[arg(long, value_delimiter = ',', default_value = "pi-host,socket.io")]
    systems: Vec<String>,
    /// Subscriber counts for fan-out.
    #[arg(long, value_delimiter = ',', default_value = "1,10,100,1000")]
    subscribers: Vec<usize>,
    /// Fan-out with the agent writing pi's own shape (each update carries the message so far,
    /// messages of 100 deltas) instead of fixed 200-byte lines.
    #[arg(long)]
    pi_shaped: bool,
    /// Seconds each fan-out rate step produces for.
    #[arg(long, default_value_t = 2.0)]
    step_secs: f64,
    /// Load-generating client processes per system (the same for both).
    #[arg(long, default_value_t = 2)]
    processes: usize,
    /// Fan-out at these delivered events/s only (no ramp): for comparing server CPU per
    /// delivery between builds.
    #[arg(long, value_delimiter = ',')]
    fixed_deliveries: Vec<u64>,
    /// Missed events for the resume scenario.
    #[arg(long, value_delimiter = ',', default_value = "10000,100000")]
    resume_gaps: Vec<u64>,
    /// Repetitions of each resume measurement (the median is reported).
    #[arg(long, default_value_t = 3)]
    resume_runs: usize,
    /// Idle connection counts for the memory scenario.
    #[arg(long, value_delimiter = ',', default_value = "1000,10000")]
    memory: Vec<usize>,
    /// Host counts for the gateway scenario (each step adds hosts to the last one's).
    #[arg(long, value_delimiter = ',', default_value = "10,30,100")]
    gateway_hosts: Vec<usize>,
    /// Subscribers per host in the gateway scenario, on each path (gateway and direct).
    #[arg(long, default_value_t = 10)]
    gateway_per_host: usize,
    /// Events per second each host streams in the gateway scenario's measured step.
    #[arg(long, default_value_t = 5)]
    gateway_rate: u64,
    /// Seconds of the gateway scenario's measured step.
    #[arg(long, default_value_t = 10.0)]
    gateway_secs: f64,
    /// Seconds of the gateway scenario's idle window (every subscriber connected, nothing
    /// streamed): long windows show the steady idle cost of many subscriptions.
    #[arg(long, default_value_t = 5.0)]
    gateway_idle_secs: f64,
    /// After the largest host count, ramp the per-host rate through the gateway alone.
    #[arg(long)]
    gateway_ceiling: bool,
    /// Session counts for the capacity scenario (one host each).
    #[arg(long, value_delimiter = ',', default_value = "1,10,25,50,100")]
    capacity_sessions: Vec<usize>,
    /// Subscribers per session in the capacity scenario.
    #[arg(long, default_value_t = 2)]
    capacity_subscribers: usize,
    /// Deltas per second each agent streams in the capacity scenario (model speed).
    #[arg(long, default_value_t = 30)]
    capacity_rate: u64,
    /// Seconds of the capacity scenario's measured stream.
    #[arg(long, default_value_t = 10.0)]
    capacity_secs: f64,
    /// pi-gateway binary [default: next to pi-bench]
    #[arg(long)]
    pi_gateway: Option<PathBuf>,
    /// Stop starting new measurements after this many seconds.
    #[arg(long, default_value_t = 540)]
    budget_secs: u64,
    /// The Socket.IO peer's directory (server.mjs, client.mjs, node_modules).
    #[arg(long, default_value = "bench/node")]
    node_dir: PathBuf,
    /// pi-host binary [default: next to pi-bench]
    #[arg(long)]
    pi_host: Option<PathBuf>,
    /// stand-in agent binary [default: next to pi-bench]
    #[arg(long)]
    agent: Option<PathBuf>,
    /// A directory on tmpfs, for the durability baseline.
    #[arg(long, default_value = "/dev/shm")]
    tmpfs: PathBuf,
}

fn main() -> std::process::ExitCode {
    match run_cli() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("pi-bench: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn run_cli() -> Result<()> {
    let cli = Cli::parse();
    match cli.command {
        Commands::Worker(args) => worker::run(args),
        Commands::Report { file } => {
            let text = std::fs::read_to_string(&file)
                .with_context(|| format!("read {}", file.display()))?;
            let results: Value = serde_json::from_str(&text)?;
            print!("{}", report::markdown(&results));
            Ok(())
        }
        Commands::Run(args) => tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()?
            .block_on(run_until_signal(*args)),
    }
}

/// Runs the scenarios; on SIGTERM (scripts/bench's time bound) or SIGINT the run is dropped,
/// which kills every server and worker it started (they are spawned with kill_on_drop).
async fn run_until_signal(args: RunArgs) -> Result<()> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term = signal(SignalKind::terminate())?;
    let mut int = signal(SignalKind::interrupt())?;
    tokio::select! {
        outcome = run(args) => outcome,
        _ = term.recv() => bail!("stopped by SIGTERM"),
        _ = int.recv() => bail!("stopped by SIGINT"),
    }
}

fn sibling(name: &str) -> Result<PathBuf> {
    let exe = std::env::current_exe()?;
    let path = exe.with_file_name(name);
    if !path.exists() {
        bail!(
            "{} not found next to pi-bench: build it (cargo build --release -p pi-host -p gateway -p tests -p bench --bins)",
            path.display()
        );
    }
    Ok(path)
}

fn command_output(program: &str, args: &[&str]) -> String {
    std::process::Command::new(program)
        .args(args)
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

fn package_version(node_dir: &Path, package: &str) -> String {
    std::fs::read_to_string(
        node_dir
            .join("node_modules")
            .join(package)
            .join("package.json"),
    )
    .ok()
    .and_then(|t| serde_json::from_str::<Value>(&t).ok())
    .and_then(|v| v["version"].as_str().map(str::to_string))
    .unwrap_or_else(|| "?".into())
}

fn meta(args: &RunArgs, pi_host: &Path) -> Value {
    let cpuinfo = std::fs::read_to_string("/proc/cpuinfo").unwrap_or_default();
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_string())
        .unwrap_or_default();
    let cores = cpuinfo
        .lines()
        .filter(|l| l.starts_with("processor"))
        .count();
    let mem_kib: u64 = std::fs::read_to_string("/proc/meminfo")
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0);
    json!({
        "date": command_output("date", &["-u", "+%Y-%m-%d %H:%M UTC"]),
        "cpu": cpu,
        "cores": cores,
        "memory_gib": (mem_kib as f64 / 1048576.0).round(),
        "kernel": format!("Linux {}", std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default().trim()),
        "load_at_start": procstat::loadavg(),
        "nofile_limit": command_output("sh", &["-c", "ulimit -n"]),
        "pi_host": command_output(&pi_host.display().to_string(), &["version"]),
        "pi_host_binary": pi_host.display().to_string(),
        "git": command_output("git", &["rev-parse", "--short", "HEAD"]),
        "rustc": command_output("rustc", &["--version"]),
        "node": command_output("node", &["--version"]),
        "socket_io": package_version(&args.node_dir, "socket.io"),
        "socket_io_client": package_version(&args.node_dir, "socket.io-client"),
        "ws": package_version(&args.node_dir, "ws"),
        "step_secs": args.step_secs,
        "processes": args.processes,
    })
}

fn save(out: &Path, results: &Value) -> Result<()> {
    std::fs::write(
        out.join("results.json"),
        serde_json::to_string_pretty(results)?,
    )?;
    std::fs::write(out.join("results.md"), report::markdown(results))?;
    Ok(())
}

fn systems(args: &RunArgs) -> Result<Vec<System>> {
    args.systems
        .iter()
        .map(|s| match s.as_str() {
            "pi-host" => Ok(System::PiHost),
            "socket.io" => Ok(System::SocketIo),
            other => bail!("unknown system {other}"),
        })
        .collect()
}

/// A scenario's value, or `{"error": ...}` so one failure does not lose the rest of the run.
fn or_error(outcome: Result<Value>, what: &str) -> Value {
    outcome.unwrap_or_else(|err| {
        eprintln!("pi-bench: {what}: {err:#}");
        json!({"error": format!("{err:#}")})
    })
}

async fn run(args: RunArgs) -> Result<()> {
    let started = Instant::now();
    std::fs::create_dir_all(&args.out)?;
    let out = args.out.canonicalize()?;
    let node_dir = args.node_dir.canonicalize().with_context(|| {
        format!(
            "{} not found (run from the repository root)",
            args.node_dir.display()
        )
    })?;
    let pi_host = match &args.pi_host {
        Some(p) => p.clone(),
        None => sibling("pi-host")?,
    };
    let agent = match &args.agent {
        Some(p) => p.clone(),
        None => sibling("stand-in-agent")?,
    };
    let tmpfs = args.tmpfs.join(format!("pi-bench-{}", std::process::id()));
    let ctx = scenarios::Ctx {
        tools: host::Tools {
            pi_host: pi_host.clone(),
            agent,
            node_dir,
            log_dir: out.join("logs"),
        },
        disk_dir: out.join("tmp"),
        pi_shaped: args.pi_shaped,
        tmpfs_dir: tmpfs.clone(),
        deadline: started + Duration::from_secs(args.budget_secs),
        step_secs: args.step_secs,
        subscribers: args.subscribers.clone(),
        processes: args.processes,
        resume_gaps: args.resume_gaps.clone(),
        resume_runs: args.resume_runs,
        memory_connections: args.memory.clone(),
        fixed_deliveries: args.fixed_deliveries.clone(),
    };
    let _ = std::fs::remove_dir_all(&ctx.tools.log_dir);
    let systems = systems(&args)?;
    let mut results = json!({
        "meta": meta(&args, &pi_host),
        "fanout": [], "resume": [], "memory": [], "durability": null, "bytes": null,
        "gateway": null, "capacity": null,
    });
    let wants = |s: &str| args.only.iter().any(|o| o == s);
    let log = |what: String| {
        eprintln!(
            "pi-bench [{:>5.1}s, load {:.2}] {what}",
            started.elapsed().as_secs_f64(),
            procstat::loadavg()
        )
    };

    if wants("fanout") {
        for &n in &ctx.subscribers {
            for &system in &systems {
                log(format!("fan-out: {} × {n}", system.name()));
                let mut r = or_error(
                    scenarios::fanout(&ctx, system, n).await,
                    &format!("fan-out {} × {n}", system.name()),
                );
                r["system"] = json!(system.name());
                r["subscribers"] = json!(n);
                push(&mut results["fanout"], r);
                save(&out, &results)?;
            }
        }
    }
    if wants("resume") {
        for &system in &systems {
            log(format!("resume: {}", system.name()));
            let mut r = or_error(
                scenarios::resume(&ctx, system).await,
                &format!("resume {}", system.name()),
            );
            r["system"] = json!(system.name());
            push(&mut results["resume"], r);
            save(&out, &results)?;
        }
    }
    if wants("memory") {
        for &n in &ctx.memory_connections {
            for &system in &systems {
                log(format!("memory: {} × {n}", system.name()));
                let mut r = or_error(
                    scenarios::memory(&ctx, system, n).await,
                    &format!("memory {} × {n}", system.name()),
                );
                r["system"] = json!(system.name());
                r["connections"] = json!(n);
                push(&mut results["memory"], r);
                save(&out, &results)?;
            }
        }
    }
    if wants("durability") && systems.contains(&System::PiHost) {
        log("durability".into());
        results["durability"] = or_error(scenarios::durability(&ctx).await, "durability");
        save(&out, &results)?;
    }
    if wants("bytes") && systems.contains(&System::PiHost) {
        log("bytes per reply".into());
        results["bytes"] = or_error(
            bytes::bytes_per_reply(&ctx.tools, &ctx.disk_dir).await,
            "bytes per reply",
        );
        save(&out, &results)?;
    }
    if wants("gateway") {
        log("gateway".into());
        let outcome = async {
            let bin = match &args.pi_gateway {
                Some(p) => p.clone(),
                None => sibling("pi-gateway")?,
            };
            let options = gateway::Options {
                hosts: args.gateway_hosts.clone(),
                per_host: args.gateway_per_host,
                rate: args.gateway_rate,
                secs: args.gateway_secs,
                idle_secs: args.gateway_idle_secs,
                ceiling: args.gateway_ceiling,
                processes: args.processes,
            };
            gateway::gateway(&ctx.tools, &ctx.disk_dir, &bin, &options, ctx.deadline).await
        }
        .await;
        results["gateway"] = or_error(outcome, "gateway");
        save(&out, &results)?;
    }
    if wants("capacity") {
        log("capacity".into());
        let options = capacity::Options {
            sessions: args.capacity_sessions.clone(),
            subscribers: args.capacity_subscribers,
            rate: args.capacity_rate,
            secs: args.capacity_secs,
            processes: args.processes,
        };
        let outcome = capacity::capacity(&ctx.tools, &ctx.disk_dir, &options, ctx.deadline).await;
        results["capacity"] = or_error(outcome, "capacity");
        save(&out, &results)?;
    }
    let _ = std::fs::remove_dir_all(&tmpfs);
    let _ = std::fs::remove_dir_all(&ctx.disk_dir);
    results["meta"]["elapsed_secs"] = json!(started.elapsed().as_secs_f64());
    save(&out, &results)?;
    log(format!(
        "done; results in {}",
        out.join("results.json").display()
    ));
    print!("{}", report::markdown(&results));
    Ok(())
}

fn push(list: &mut Value, item: Value) {
    if let Some(list) = list.as_array_mut() {
        list.push(item);
    }
}
