//! `ssh-bench`: the SSH bootstrapper against OpenSSH, measured in one run on this machine
//! (docs/benchmarks.md, section 5). Run it through `scripts/bench-ssh`, which builds the release
//! binaries first.
//!
//! Against a real OpenSSH sshd on loopback (tests/src/sshd.rs):
//! - `ssh host true` (OpenSSH client) next to a warm `pi-remote connect --once` (the host runs:
//!   connect, host key, auth, one probe command, forward check, RACP hello) and a cold one
//!   (upload, verify, install, start, pair);
//! - throughput of a local forward, 1 GiB up and down, through `ssh -N -L` and through the
//!   bootstrapper's forward (`bootstrap::ssh::forward`, the code `pi-remote connect` runs),
//!   to a sink/source server on the remote's loopback.

use bootstrap::ssh::config::{ResolveOptions, resolve};
use bootstrap::ssh::forward::{Target, accept_loop};
use bootstrap::ssh::{ConnectOptions, connect};
use clap::Parser;
use serde_json::{Value, json};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::Arc;
use std::time::{Duration, Instant};
use tests::sshd::{SshServer, SshdOptions};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

#[derive(Parser)]
struct Args {
    /// A release build of pi-remote.
    #[arg(long)]
    pi_remote: PathBuf,
    /// A release build of pi-host (packaged with deploy/release.sh).
    #[arg(long)]
    pi_host: PathBuf,
    /// Runs of each connect measurement.
    #[arg(long, default_value_t = 10)]
    runs: usize,
    /// Runs of the cold install of pi-host alone (the remote's config names an agent of its
    /// own, so connect installs none).
    #[arg(long, default_value_t = 3)]
    cold_runs: usize,
    /// Runs of the cold install with the agent: pi from the remote's npm (no config.toml). The
    /// warm runs then go to the last of these hosts.
    #[arg(long, default_value_t = 1)]
    agent_runs: usize,
    /// Runs of each cold install with an agent bundle, timed to the first model reply: a remote
    /// whose npm reaches no registry (the bundle with pi, run with the remote's Node), and a
    /// bare one with no Node pi runs on (the bundle with Node). The first of each makes the
    /// bundle on this machine; later ones take it from the cache.
    #[arg(long, default_value_t = 2)]
    bundle_runs: usize,
    /// MiB sent through each forward per direction and run.
    #[arg(long, default_value_t = 1024)]
    mib: u64,
    /// Runs of each throughput measurement.
    #[arg(long, default_value_t = 3)]
    throughput_runs: usize,
    /// Where to write the raw results.
    #[arg(long)]
    out: Option<PathBuf>,
}

type Result<T> = std::result::Result<T, String>;

fn main() -> std::process::ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("ssh-bench: {err}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("ssh-bench: {err}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .map(Path::to_path_buf)
        .unwrap_or_default()
}

struct Setup {
    server: SshServer,
    config: PathBuf,
    release: PathBuf,
    scratch: tempfile::TempDir,
}

async fn run(args: Args) -> Result<()> {
    // Node's CA bundle, when this machine sets one (a TLS-inspecting proxy before the
    // registry), reaches the remote's npm as a real remote has its own.
    let extra_config = std::env::var_os("NODE_EXTRA_CA_CERTS")
        .map(|ca| {
            vec![format!(
                "SetEnv NODE_EXTRA_CA_CERTS={}",
                ca.to_string_lossy()
            )]
        })
        .unwrap_or_default();
    let server = SshServer::start(SshdOptions {
        extra_config,
        ..SshdOptions::default()
    })
    .await;
    let scratch = tempfile::tempdir().map_err(|e| e.to_string())?;
    let known_hosts = scratch.path().join("known_hosts");
    std::fs::write(&known_hosts, format!("{}\n", server.known_hosts_line()))
        .map_err(|e| e.to_string())?;
    let config = server.write_ssh_config("box", &known_hosts);
    let release = scratch.path().join("release");
    let output = std::process::Command::new(repo_root().join("deploy/release.sh"))
        .arg("--binary")
        .arg(&args.pi_host)
        .arg("--out")
        .arg(&release)
        .output()
        .map_err(|e| e.to_string())?;
    if !output.status.success() {
        return Err(format!(
            "release.sh: {}",
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let setup = Setup {
        server,
        config,
        release,
        scratch,
    };
    eprintln!("ssh-bench: `ssh box true` x{}", args.runs);
    let mut ssh_true = Vec::new();
    for _ in 0..args.runs {
        let started = Instant::now();
        let status = setup
            .server
            .openssh(&setup.config, "box")
            .arg("true")
            .stdin(Stdio::null())
            .status()
            .await
            .map_err(|e| e.to_string())?;
        if !status.success() {
            return Err(format!("ssh box true: {status}"));
        }
        ssh_true.push(ms(started));
    }

    eprintln!("ssh-bench: cold connect x{}", args.cold_runs);
    let mut cold = Vec::new();
    let mut cold_stages = Vec::new();
    let mut warm_root = None;
    for _ in 0..args.cold_runs {
        let root = tempfile::tempdir().map_err(|e| e.to_string())?;
        let config_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        // The operator's own agent line: connect leaves the agent alone.
        std::fs::write(
            root.path().join("config.toml"),
            "agent = \"pi --mode rpc\"\n",
        )
        .map_err(|e| e.to_string())?;
        let (elapsed, events) =
            pi_remote_connect(&args, &setup, root.path(), config_dir.path()).await?;
        cold.push(elapsed);
        cold_stages.push(stage_times(&events));
        if let Some((old_root, _)) = warm_root.replace((root, config_dir)) {
            stop_host(old_root.path());
        }
    }
    eprintln!(
        "ssh-bench: cold connect with pi from npm x{}",
        args.agent_runs
    );
    let mut cold_npm = Vec::new();
    let mut cold_npm_stages = Vec::new();
    for _ in 0..args.agent_runs {
        let root = tempfile::tempdir().map_err(|e| e.to_string())?;
        let config_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let (elapsed, events) =
            pi_remote_connect(&args, &setup, root.path(), config_dir.path()).await?;
        if !events
            .iter()
            .any(|e| e["stage"] == "agent" && e["status"] == "done")
        {
            return Err("a cold connect without config installed no agent".into());
        }
        cold_npm.push(elapsed);
        cold_npm_stages.push(stage_times(&events));
        if let Some((old_root, _)) = warm_root.replace((root, config_dir)) {
            stop_host(old_root.path());
        }
    }
    let cold_bundle = first_replies(&args, &setup).await?;
    let (root, config_dir) = warm_root.ok_or("no cold run")?;

    eprintln!("ssh-bench: warm connect x{}", args.runs);
    let mut warm = Vec::new();
    let mut warm_stages = Vec::new();
    for _ in 0..args.runs {
        let (elapsed, events) =
            pi_remote_connect(&args, &setup, root.path(), config_dir.path()).await?;
        if events.iter().any(|e| e["type"] == "progress") {
            return Err("a warm connect transferred".into());
        }
        warm.push(elapsed);
        warm_stages.push(stage_times(&events));
    }
    stop_host(root.path());

    eprintln!(
        "ssh-bench: forward throughput, {} MiB x{} per direction",
        args.mib, args.throughput_runs
    );
    let sink = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let sink_port = sink.local_addr().map_err(|e| e.to_string())?.port();
    tokio::spawn(sink_source(sink));
    let bytes = args.mib << 20;

    let openssh_port = free_port()?;
    let mut openssh = setup
        .server
        .openssh(&setup.config, "box")
        .args(["-N", "-o", "ExitOnForwardFailure=yes", "-L"])
        .arg(format!("127.0.0.1:{openssh_port}:127.0.0.1:{sink_port}"))
        .stdin(Stdio::null())
        .spawn()
        .map_err(|e| e.to_string())?;
    wait_listening(openssh_port).await?;

    let destination = resolve(
        "box",
        &ResolveOptions {
            config_file: Some(setup.config.clone()),
            ..ResolveOptions::default()
        },
    )?;
    let session = connect(&destination, &ConnectOptions::default(), |_| {})
        .await
        .map_err(|e| e.to_string())?;
    let forward = TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|e| e.to_string())?;
    let russh_port = forward.local_addr().map_err(|e| e.to_string())?.port();
    let (_targets_tx, targets) = tokio::sync::watch::channel(Some(Arc::new(Target {
        session: Arc::new(session),
        port: sink_port,
    })));
    tokio::spawn(accept_loop(forward, targets, Duration::from_secs(10), None));

    let mut throughput = json!({});
    for name in ["openssh", "pi_remote"] {
        throughput[name] = json!({"up": [], "down": []});
    }
    for _ in 0..args.throughput_runs {
        // Alternate, so neither side always runs on a warmer machine.
        for (name, port) in [("openssh", openssh_port), ("pi_remote", russh_port)] {
            let up = upload(port, bytes).await?;
            let down = download(port, bytes).await?;
            push(&mut throughput[name]["up"], mb_per_s(bytes, up));
            push(&mut throughput[name]["down"], mb_per_s(bytes, down));
        }
    }
    let _ = openssh.kill().await;

    let results = json!({
        "machine": machine(),
        "sshTrueMs": summary(&ssh_true),
        "warmConnectMs": summary(&warm),
        "warmStagesMs": median_stages(&warm_stages),
        "coldConnectMs": summary(&cold),
        "coldStagesMs": median_stages(&cold_stages),
        "coldAgentNpmMs": summary(&cold_npm),
        "coldAgentNpmStagesMs": median_stages(&cold_npm_stages),
        "coldAgentBundle": cold_bundle,
        "forwardMiB": args.mib,
        "forwardMBps": {
            "openssh": {"up": median_of(&throughput["openssh"]["up"]), "down": median_of(&throughput["openssh"]["down"])},
            "piRemote": {"up": median_of(&throughput["pi_remote"]["up"]), "down": median_of(&throughput["pi_remote"]["down"])},
            "runs": throughput,
        },
    });
    print_table(&results);
    if let Some(out) = &args.out {
        if let Some(parent) = out.parent() {
            let _ = std::fs::create_dir_all(parent);
        }
        std::fs::write(
            out,
            serde_json::to_string_pretty(&results).unwrap_or_default(),
        )
        .map_err(|e| e.to_string())?;
    }
    drop(setup.scratch);
    Ok(())
}

fn ms(started: Instant) -> f64 {
    started.elapsed().as_secs_f64() * 1000.0
}

fn push(list: &mut Value, value: f64) {
    if let Some(list) = list.as_array_mut() {
        list.push(json!(value));
    }
}

fn mb_per_s(bytes: u64, elapsed: Duration) -> f64 {
    bytes as f64 / 1e6 / elapsed.as_secs_f64()
}

fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    match sorted.len() {
        0 => 0.0,
        n if n % 2 == 1 => sorted[n / 2],
        n => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

fn median_of(list: &Value) -> f64 {
    let values: Vec<f64> = list
        .as_array()
        .map(|l| l.iter().filter_map(Value::as_f64).collect())
        .unwrap_or_default();
    median(&values)
}

fn summary(values: &[f64]) -> Value {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    json!({
        "median": median(values),
        "min": sorted.first(),
        "max": sorted.last(),
        "runs": values,
    })
}

/// `{stage: ms}` of one connect's done stages.
fn stage_times(events: &[Value]) -> Value {
    let mut stages = serde_json::Map::new();
    for event in events {
        if event["type"] == "stage"
            && event["status"] == "done"
            && let Some(stage) = event["stage"].as_str()
        {
            stages.insert(stage.into(), event["ms"].clone());
        }
    }
    Value::Object(stages)
}

fn median_stages(runs: &[Value]) -> Value {
    let mut out = serde_json::Map::new();
    if let Some(first) = runs.first().and_then(Value::as_object) {
        for stage in first.keys() {
            let values: Vec<f64> = runs.iter().filter_map(|r| r[stage].as_f64()).collect();
            out.insert(stage.clone(), json!(median(&values)));
        }
    }
    Value::Object(out)
}

async fn pi_remote_connect(
    args: &Args,
    setup: &Setup,
    root: &Path,
    config_dir: &Path,
) -> Result<(f64, Vec<Value>)> {
    connect_with(args, &setup.config, &setup.release, root, config_dir).await
}

/// `pi-remote --json connect box --once` through ssh config `ssh_config`.
async fn connect_with(
    args: &Args,
    ssh_config: &Path,
    release: &Path,
    root: &Path,
    config_dir: &Path,
) -> Result<(f64, Vec<Value>)> {
    let started = Instant::now();
    let output = tokio::process::Command::new(&args.pi_remote)
        .args(["--json", "connect", "box", "--once", "-F"])
        .arg(ssh_config)
        .arg("--release-dir")
        .arg(release)
        .arg("--remote-dir")
        .arg(root)
        .env("PI_REMOTE_CONFIG_DIR", config_dir)
        .env_remove("SSH_AUTH_SOCK")
        .stdin(Stdio::null())
        .output()
        .await
        .map_err(|e| e.to_string())?;
    let elapsed = ms(started);
    if !output.status.success() {
        return Err(format!(
            "pi-remote connect: {}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        ));
    }
    let events = String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    Ok((elapsed, events))
}

/// The bundle runs, timed to the first model reply: for each remote kind, a first connect that
/// makes the bundle on this machine (nothing cached), then ones that take it from the cache;
/// each connect goes on to `new` and `prompt --wait` against a stub model on loopback (the
/// remote's pi is configured for it), so a figure is from nothing to a reply.
async fn first_replies(args: &Args, setup: &Setup) -> Result<Value> {
    let mut results = json!({});
    // Bundles made by this run only, so the first of each kind is made, not found.
    let bundle_cache = setup.scratch.path().join("pi-remote-cache");
    for (kind, session_env) in bundle_remotes(setup.scratch.path())? {
        eprintln!(
            "ssh-bench: to the first reply with a bundle ({kind}) x{}",
            args.bundle_runs
        );
        let home = setup.scratch.path().join(format!("home-{kind}"));
        std::fs::create_dir_all(&home).map_err(|e| e.to_string())?;
        let stub = tests::pi::Stub::default();
        let port = tests::pi::start_stub(stub.clone()).await;
        tests::pi::write_pi_config(&home.join(".pi/agent"), port);
        let server = SshServer::start(SshdOptions {
            extra_config: vec![format!(
                "{session_env} PI_OFFLINE=1 PI_SKIP_VERSION_CHECK=1 PI_TELEMETRY=0"
            )],
            account: Some(tests::sshd::RemoteAccount {
                shell: PathBuf::from("/bin/sh"),
                home: home.clone(),
            }),
            ..SshdOptions::default()
        })
        .await;
        let known_hosts = setup.scratch.path().join(format!("known_hosts.{kind}"));
        std::fs::write(&known_hosts, format!("{}\n", server.known_hosts_line()))
            .map_err(|e| e.to_string())?;
        let remote = Remote {
            ssh_config: server.write_ssh_config("box", &known_hosts),
            home,
            bundle_cache: bundle_cache.clone(),
        };
        let (mut made, mut cached) = (Vec::new(), Vec::new());
        let (mut made_stages, mut cached_stages) = (Vec::new(), Vec::new());
        for run in 0..args.bundle_runs {
            let timed = remote.first_reply(args, &setup.release, run).await?;
            let mut stages = stage_times(&timed.events);
            // From the start: connect's ready line; after it: `new` and the prompt's reply.
            stages["connected"] = json!(timed.ready_ms);
            stages["newAndReply"] = json!(timed.reply_ms - timed.ready_ms);
            if run == 0 {
                made.push(timed.reply_ms);
                made_stages.push(stages);
            } else {
                cached.push(timed.reply_ms);
                cached_stages.push(stages);
            }
        }
        results[kind] = json!({
            "madeMs": summary(&made),
            "cachedMs": summary(&cached),
            "madeStagesMs": median_stages(&made_stages),
            "cachedStagesMs": median_stages(&cached_stages),
        });
    }
    Ok(results)
}

/// A remote of the first-reply runs: its ssh config, its user's home (pi's config in it points
/// at the stub model) and this machine's bundle cache.
struct Remote {
    ssh_config: PathBuf,
    home: PathBuf,
    bundle_cache: PathBuf,
}

/// One run to the first reply: when connect said ready, when the reply came (from the start),
/// and connect's events.
struct FirstReply {
    ready_ms: f64,
    reply_ms: f64,
    events: Vec<Value>,
}

impl Remote {
    /// `pi-remote connect` into a fresh install root, then `new` and `prompt --wait` through
    /// its forward; the host is stopped afterwards.
    async fn first_reply(&self, args: &Args, release: &Path, run: usize) -> Result<FirstReply> {
        use tokio::io::AsyncBufReadExt;
        let root = self.home.join(format!(".pi-host-{run}"));
        let config_dir = tempfile::tempdir().map_err(|e| e.to_string())?;
        let started = Instant::now();
        let mut connect = tokio::process::Command::new(&args.pi_remote)
            .args(["--json", "connect", "box", "-F"])
            .arg(&self.ssh_config)
            .arg("--release-dir")
            .arg(release)
            .arg("--remote-dir")
            .arg(&root)
            .env("PI_REMOTE_CACHE_DIR", &self.bundle_cache)
            .env("PI_REMOTE_CONFIG_DIR", config_dir.path())
            .env_remove("SSH_AUTH_SOCK")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .kill_on_drop(true)
            .spawn()
            .map_err(|e| e.to_string())?;
        let stdout = connect.stdout.take().ok_or("no stdout")?;
        let mut lines = tokio::io::BufReader::new(stdout).lines();
        let mut events = Vec::new();
        while let Ok(Some(line)) = lines.next_line().await {
            let Ok(event) = serde_json::from_str::<Value>(&line) else {
                continue;
            };
            let kind = event["type"].clone();
            events.push(event);
            if kind == "ready" {
                break;
            }
            if kind == "error" {
                return Err(format!("connect failed: {line}"));
            }
        }
        let ready_ms = ms(started);
        if !events.iter().any(|e| e["type"] == "ready") {
            return Err(format!("connect ended before it was ready: {events:?}"));
        }
        let workspace = self.home.join("project");
        std::fs::create_dir_all(&workspace).map_err(|e| e.to_string())?;
        let pi_remote = |words: &[&str]| {
            std::process::Command::new(&args.pi_remote)
                .args(words)
                .env("PI_REMOTE_CONFIG_DIR", config_dir.path())
                .stdin(Stdio::null())
                .output()
        };
        let workspace = workspace.display().to_string();
        let created = pi_remote(&["new", "--workspace", &workspace]).map_err(|e| e.to_string())?;
        let session = String::from_utf8_lossy(&created.stdout).trim().to_string();
        if !created.status.success() || session.is_empty() {
            return Err(format!("new: {}", String::from_utf8_lossy(&created.stderr)));
        }
        // A text reply (the stub's LONG-REPLY), no tool call: the turn ends at the reply.
        let reply = pi_remote(&["prompt", &session, "LONG-REPLY:3", "--wait"])
            .map_err(|e| e.to_string())?;
        let reply_ms = ms(started);
        let _ = connect.kill().await;
        stop_host(&root);
        if !reply.status.success() {
            return Err(format!(
                "prompt: {}",
                String::from_utf8_lossy(&reply.stderr)
            ));
        }
        Ok(FirstReply {
            ready_ms,
            reply_ms,
            events,
        })
    }
}

/// The remotes of the bundle runs, as the `SetEnv` words of their sessions: one whose npm is
/// offline with an empty cache (the first connect tries it, it fails, and connect makes and
/// sends pi alone; later ones send the bundle made then, as to any remote with a Node pi runs
/// on), and one whose `node` is 18 (too old for pi: the bundle carries Node).
fn bundle_remotes(scratch: &Path) -> Result<Vec<(&'static str, String)>> {
    let empty = scratch.join("empty-npm-cache");
    let stand_ins = scratch.join("stand-ins");
    std::fs::create_dir_all(&stand_ins).map_err(|e| e.to_string())?;
    for (name, script) in [("node", "echo v18.19.0"), ("npm", "exit 1")] {
        let path = stand_ins.join(name);
        std::fs::write(&path, format!("#!/bin/sh\n{script}\n")).map_err(|e| e.to_string())?;
        std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755))
            .map_err(|e| e.to_string())?;
    }
    Ok(vec![
        (
            "noRegistry",
            format!(
                "SetEnv npm_config_offline=true npm_config_cache={}",
                empty.display()
            ),
        ),
        (
            "withNode",
            format!(
                "SetEnv PATH={}:/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin",
                stand_ins.display()
            ),
        ),
    ])
}

fn stop_host(root: &Path) {
    let _ = std::process::Command::new("sh")
        .arg(root.join("install.sh"))
        .args(["stop", "--root"])
        .arg(root)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

fn free_port() -> Result<u16> {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
    Ok(listener.local_addr().map_err(|e| e.to_string())?.port())
}

async fn wait_listening(port: u16) -> Result<()> {
    let deadline = Instant::now() + tests::PATIENCE;
    while TcpStream::connect(("127.0.0.1", port)).await.is_err() {
        if Instant::now() > deadline {
            return Err(format!("nothing listens on {port}"));
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    Ok(())
}

/// The remote end: `U` then bytes until EOF (answers the count), or `D` + u64 (sends that many).
async fn sink_source(listener: TcpListener) {
    while let Ok((mut socket, _)) = listener.accept().await {
        tokio::spawn(async move {
            let _ = socket.set_nodelay(true);
            let mut kind = [0u8; 1];
            if socket.read_exact(&mut kind).await.is_err() {
                return;
            }
            let mut buffer = vec![0u8; 256 << 10];
            if kind[0] == b'U' {
                let mut total = 0u64;
                while let Ok(n) = socket.read(&mut buffer).await {
                    if n == 0 {
                        break;
                    }
                    total += n as u64;
                }
                let _ = socket.write_all(&total.to_be_bytes()).await;
            } else {
                let mut length = [0u8; 8];
                if socket.read_exact(&mut length).await.is_err() {
                    return;
                }
                let mut left = u64::from_be_bytes(length);
                while left > 0 {
                    let n = left.min(buffer.len() as u64) as usize;
                    if socket.write_all(&buffer[..n]).await.is_err() {
                        return;
                    }
                    left -= n as u64;
                }
            }
            let _ = socket.shutdown().await;
        });
    }
}

async fn upload(port: u16, bytes: u64) -> Result<Duration> {
    let mut socket = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let _ = socket.set_nodelay(true);
    let buffer = vec![7u8; 256 << 10];
    let started = Instant::now();
    socket.write_all(b"U").await.map_err(|e| e.to_string())?;
    let mut left = bytes;
    while left > 0 {
        let n = left.min(buffer.len() as u64) as usize;
        socket
            .write_all(&buffer[..n])
            .await
            .map_err(|e| e.to_string())?;
        left -= n as u64;
    }
    socket.shutdown().await.map_err(|e| e.to_string())?;
    let mut count = [0u8; 8];
    socket
        .read_exact(&mut count)
        .await
        .map_err(|e| format!("no count from the sink: {e}"))?;
    let elapsed = started.elapsed();
    if u64::from_be_bytes(count) != bytes {
        return Err(format!(
            "the sink got {} of {bytes} bytes",
            u64::from_be_bytes(count)
        ));
    }
    Ok(elapsed)
}

async fn download(port: u16, bytes: u64) -> Result<Duration> {
    let mut socket = TcpStream::connect(("127.0.0.1", port))
        .await
        .map_err(|e| e.to_string())?;
    let _ = socket.set_nodelay(true);
    let started = Instant::now();
    socket.write_all(b"D").await.map_err(|e| e.to_string())?;
    socket
        .write_all(&bytes.to_be_bytes())
        .await
        .map_err(|e| e.to_string())?;
    let mut buffer = vec![0u8; 256 << 10];
    let mut total = 0u64;
    loop {
        let n = socket.read(&mut buffer).await.map_err(|e| e.to_string())?;
        if n == 0 {
            break;
        }
        total += n as u64;
    }
    let elapsed = started.elapsed();
    if total != bytes {
        return Err(format!("got {total} of {bytes} bytes"));
    }
    Ok(elapsed)
}

fn machine() -> Value {
    let read = |path: &str| std::fs::read_to_string(path).unwrap_or_default();
    let model = read("/proc/cpuinfo")
        .lines()
        .find(|l| l.starts_with("model name"))
        .and_then(|l| l.split(':').nth(1))
        .map(|m| m.trim().to_string())
        .unwrap_or_default();
    let ssh = std::process::Command::new("ssh")
        .arg("-V")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_string())
        .unwrap_or_default();
    json!({
        "cpu": model,
        "cores": std::thread::available_parallelism().map(|n| n.get()).unwrap_or(0),
        "openssh": ssh,
        "date": std::process::Command::new("date").arg("-u").arg("+%Y-%m-%d").output()
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string()).unwrap_or_default(),
    })
}

fn print_table(results: &Value) {
    let f = |v: &Value| v.as_f64().unwrap_or(0.0);
    let ssh_true = f(&results["sshTrueMs"]["median"]);
    let warm = f(&results["warmConnectMs"]["median"]);
    let cold = f(&results["coldConnectMs"]["median"]);
    let mbps = &results["forwardMBps"];
    let (o_up, o_down) = (f(&mbps["openssh"]["up"]), f(&mbps["openssh"]["down"]));
    let (p_up, p_down) = (f(&mbps["piRemote"]["up"]), f(&mbps["piRemote"]["down"]));
    println!("| measurement | pi-remote | OpenSSH | ratio |");
    println!("|---|---|---|---|");
    println!(
        "| warm `connect --once` vs `ssh host true` (median ms) | {warm:.0} | {ssh_true:.0} | {:.2}x |",
        warm / ssh_true
    );
    println!("| cold `connect --once` (median ms) | {cold:.0} | — | — |");
    let cold_npm = f(&results["coldAgentNpmMs"]["median"]);
    println!("| cold `connect --once` with pi from npm (median ms) | {cold_npm:.0} | — | — |");
    for (kind, label) in [
        (
            "noRegistry",
            "the remote's Node and a bundle of pi (its npm reaches no registry)",
        ),
        (
            "withNode",
            "a bundle of pi and Node (a bare remote: no Node pi runs on)",
        ),
    ] {
        let runs = &results["coldAgentBundle"][kind];
        println!(
            "| to the first reply with {label}: bundle made / cached (median ms) | {:.0} / {:.0} | — | — |",
            f(&runs["madeMs"]["median"]),
            f(&runs["cachedMs"]["median"])
        );
    }
    println!(
        "| forward up, MB/s (median) | {p_up:.0} | {o_up:.0} | {:.2}x |",
        p_up / o_up
    );
    println!(
        "| forward down, MB/s (median) | {p_down:.0} | {o_down:.0} | {:.2}x |",
        p_down / o_down
    );
    println!("warm stages (median ms): {}", results["warmStagesMs"]);
    println!("cold stages (median ms): {}", results["coldStagesMs"]);
    println!(
        "cold stages with pi from npm (median ms): {}",
        results["coldAgentNpmStagesMs"]
    );
    println!(
        "cold stages with a bundle (median ms): {}",
        results["coldAgentBundle"]
    );
}
