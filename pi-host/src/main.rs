//! `pi-host`: the RACP-WS host and its local admin commands.

use pi_host::*;

use clap::{Parser, Subcommand};
use config::ServeConfig;
use racp_proto::validate::printable;
use racp_proto::{AppError, Role};
use racp_server::uplink::key;
use racp_server::usage::LogFormat;
use racp_server::{clock, identity, listener, tls};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "pi-host",
    version,
    about = "Remote-control host for coding-agent sessions (RACP-WS)"
)]
struct Cli {
    /// Where the host keeps its database, key and admin socket [default: R/data for a binary
    /// installed under R/versions/ (as `pi-remote connect` installs it), else
    /// $XDG_DATA_HOME/pi-host]
    #[arg(long, global = true, env = "PI_HOST_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// The log's format on stderr: text lines, or one JSON object a line (with the call's span
    /// and trace id)
    #[arg(
        long,
        global = true,
        env = "PI_HOST_LOG_FORMAT",
        value_enum,
        default_value_t
    )]
    log_format: LogFormat,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Serve RACP-WS until SIGTERM or SIGINT.
    Serve {
        /// A TOML file with the same settings as these flags (flags win).
        #[arg(long)]
        config: Option<PathBuf>,
        /// Once listening, write `{version, pid, listen, url, dataDir, startedAt, certSha256}` here
        /// (atomically; removed on a clean exit). The SSH bootstrapper reads the port and the
        /// certificate fingerprint from it.
        #[arg(long)]
        state_file: Option<PathBuf>,
        /// Serve `/metrics` (Prometheus), `/livez` and `/readyz` for the operator on this
        /// address, never the device port (port 0: the OS's pick, in the log and the state
        /// file's `metricsListen`). Loopback only unless --metrics-allow-remote.
        #[arg(long)]
        metrics_listen: Option<std::net::SocketAddr>,
        /// Allow --metrics-listen on a non-loopback address (metrics are served without auth).
        #[arg(long, requires = "metrics_listen")]
        metrics_allow_remote: bool,
        #[command(flatten)]
        settings: Box<config::Settings>,
    },
    /// Mint a single-use pairing token on the running host.
    Pair {
        /// Roles for the paired device [default: owner for the first device, operator after]
        #[arg(long, value_delimiter = ',', value_parser = parse_role)]
        roles: Option<Vec<Role>>,
        /// Token lifetime, e.g. 10m, 90s, 1h.
        #[arg(long, default_value = "10m", value_parser = parse_duration)]
        ttl: u64,
        /// Also draw the pairing link as a QR code (for a phone's camera; 24 lines for an
        /// address of up to 24 characters). Needs an address a device reaches: --address, or a host
        /// listening on one.
        #[arg(long)]
        qr: bool,
        /// The address (NAME:PORT) a device reaches this host at, for the link instead of the
        /// listen address (a forwarded port, a VPN name); the host must accept that name
        /// (`--allow-host NAME`).
        #[arg(long)]
        address: Option<String>,
        #[arg(long)]
        json: bool,
    },
    /// List paired devices.
    Devices {
        #[arg(long)]
        json: bool,
    },
    /// Revoke a device; its open connections close at once.
    Revoke {
        device_id: String,
        #[arg(long)]
        json: bool,
    },
    /// Print this host's id and the public nkey it dials a gateway with (made at first use), for
    /// `pi-gateway enroll` on the gateway's side.
    GatewayKey {
        #[arg(long)]
        json: bool,
    },
    /// Show the running host's status.
    Status {
        #[arg(long)]
        json: bool,
    },
    /// Start an agent in its sandbox (the host runs this; docs/reliability.md §4.19).
    #[command(hide = true)]
    SandboxExec(pi_host::agent::sandbox::ExecArgs),
    /// Print the version.
    Version {
        #[arg(long)]
        json: bool,
    },
}

fn parse_role(text: &str) -> Result<Role, String> {
    Role::from_name(text)
        .ok_or_else(|| format!("unknown role {text:?}: use owner, operator or observer"))
}

/// `90`, `90s`, `10m`, `2h` → seconds.
fn parse_duration(text: &str) -> Result<u64, String> {
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let n: u64 = digits
        .parse()
        .map_err(|_| format!("bad duration {text:?}"))?;
    let scale = match unit {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        _ => return Err(format!("bad duration unit in {text:?}: use s, m or h")),
    };
    Ok(n.saturating_mul(scale))
}

/// jemalloc rather than glibc's malloc: after a burst of large requests glibc kept hundreds of
/// MiB that no connection held any more; jemalloc, tuned in .cargo/config.toml, hands freed
/// pages back within about a second from its background thread (docs/benchmarks.md, "Memory
/// under large requests", where mimalloc was also weighed).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The log on stderr, every line through the redactor; colour for a person at a terminal,
/// never in a redirected log (or with NO_COLOR), never in JSON.
fn init_log(format: LogFormat, redactor: &pi_host::redact::Redactor) {
    let writer = pi_host::redact::LogWriter::new(redactor.clone(), std::io::stderr);
    format.install("PI_HOST_LOG", writer);
}

fn main() -> ExitCode {
    let cli = match racp_server::usage::parse::<Cli>() {
        Ok(cli) => cli,
        Err(exit) => return exit,
    };
    // The agent's launcher execs the agent: no log, no runtime.
    let command = match cli.command {
        Command::SandboxExec(args) => return pi_host::agent::sandbox::run(args),
        command => command,
    };
    // The log and the agents' output share one redaction: it learns the provider keys when the
    // host's state opens (pi_host::redact).
    let redactor = pi_host::redact::Redactor::default();
    init_log(cli.log_format, &redactor);
    let data_dir = cli.data_dir.unwrap_or_else(config::default_data_dir);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("pi-host: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    runtime.block_on(run(command, data_dir, redactor))
}

async fn run(command: Command, data_dir: PathBuf, redactor: pi_host::redact::Redactor) -> ExitCode {
    match command {
        Command::Serve {
            config: file,
            state_file,
            metrics_listen,
            metrics_allow_remote,
            settings,
        } => {
            let metrics = metrics_listen.map(|addr| (addr, metrics_allow_remote));
            let served = match config::load(file.as_deref(), *settings, data_dir) {
                Ok(config) => serve(config, state_file, metrics, redactor).await,
                Err(message) => Err(message),
            };
            served.map_or_else(
                |message| {
                    eprintln!("pi-host: {message}");
                    ExitCode::FAILURE
                },
                |()| ExitCode::SUCCESS,
            )
        }
        Command::Pair {
            roles,
            ttl,
            qr,
            address,
            json,
        } => pair(&data_dir, roles, ttl, qr, address, json).await,
        Command::Devices { json } => {
            admin_command(
                &data_dir,
                &admin::AdminRequest::Devices,
                json,
                devices_table,
            )
            .await
        }
        Command::Revoke { device_id, json } => {
            let request = admin::AdminRequest::Revoke {
                device_id: device_id.clone(),
            };
            admin_command(&data_dir, &request, json, |_| {
                format!("revoked {device_id}\n")
            })
            .await
        }
        Command::GatewayKey { json } => gateway_key(&data_dir, json),
        Command::Status { json } => {
            admin_command(&data_dir, &admin::AdminRequest::Status, json, status_text).await
        }
        Command::Version { json } => version(json),
        Command::SandboxExec(args) => pi_host::agent::sandbox::run(args),
    }
}

/// `pi-host status` for a person: the URL, connections, certificate, agent and agents.
fn status_text(v: &serde_json::Value) -> String {
    let cert = match v["certSha256"].as_str() {
        Some(sha256) => format!("certificate SHA-256 {sha256}\n"),
        None => "plain ws:// (--plain): no certificate\n".into(),
    };
    let agents = &v["agents"];
    let agent = agent_line(&v["agent"]);
    let sandbox = sandbox_line(&v["sandbox"]);
    format!(
        "pi-host {} listening on {} ({} connections{})\ndata directory {}\n{cert}{agent}{sandbox}agents: {} running (at most {}), {} MiB resident\n",
        v["host"]["version"].as_str().unwrap_or_default(),
        v["url"].as_str().unwrap_or_default(),
        v["connections"],
        if v["draining"] == true {
            ", draining"
        } else {
            ""
        },
        printable(v["dataDir"].as_str().unwrap_or_default(), false),
        agents["running"],
        agents["max"],
        agents["rssBytes"].as_u64().unwrap_or(0) >> 20,
    )
}

/// `pi-host version`.
fn version(json: bool) -> ExitCode {
    let version = env!("CARGO_PKG_VERSION");
    if json {
        println!(
            "{}",
            serde_json::json!({"version": version, "protocol": racp_proto::PROTOCOL_VERSION})
        );
    } else {
        println!(
            "pi-host {version} (RACP-WS v{})",
            racp_proto::PROTOCOL_VERSION
        );
    }
    ExitCode::SUCCESS
}

/// `status`'s line about the agents' sandbox: `sandbox: landlock (ABI 7), workspace-write`, or
/// `sandbox: none: REASON`.
fn sandbox_line(sandbox: &serde_json::Value) -> String {
    let text = |key: &str| sandbox[key].as_str().unwrap_or_default().to_string();
    match sandbox["abi"].as_u64() {
        Some(abi) => format!("sandbox: {} (ABI {abi}), {}\n", text("kind"), text("mode")),
        None => format!(
            "sandbox: none: {}\n",
            printable(&text("unavailable"), false)
        ),
    }
}

/// `status`'s line about the agent: `agent: ready, 0.73.1 at PATH (node 20.20.2)`, or its state
/// and problem.
fn agent_line(agent: &serde_json::Value) -> String {
    let text = |key: &str| agent[key].as_str().unwrap_or_default().to_string();
    let state = text("state");
    if state == "ready" {
        let runtime = match agent["runtime"]["version"].as_str() {
            Some(version) => format!(" (node {version})"),
            None => String::new(),
        };
        return format!(
            "agent: ready, {} at {}{runtime}\n",
            text("version"),
            printable(&text("path"), false)
        );
    }
    format!("agent: {state}: {}\n", printable(&text("problem"), false))
}

fn gateway_key(data_dir: &std::path::Path, json: bool) -> ExitCode {
    let identity = state::open_identity(data_dir).map_err(|e| e.to_string());
    let key = identity.and_then(|(_, _, host_id)| {
        key::load_or_create(data_dir)
            .map(|key| (host_id, key.public))
            .map_err(|e| e.to_string())
    });
    match key {
        Ok((host_id, nkey)) if json => {
            println!("{}", serde_json::json!({"hostId": host_id, "nkey": nkey}));
            ExitCode::SUCCESS
        }
        Ok((host_id, nkey)) => {
            println!(
                "host id {host_id}\nnkey    {nkey}\nOn the gateway: pi-gateway enroll {host_id} {nkey}"
            );
            ExitCode::SUCCESS
        }
        Err(message) => {
            eprintln!("pi-host: {message}");
            ExitCode::FAILURE
        }
    }
}

/// `pi-host pair`: a QR code only of a link a device can reach (so, without `--address`, none
/// is minted for a host that listens on loopback or on every address); `--address` puts that
/// address in the link.
async fn pair(
    data_dir: &std::path::Path,
    roles: Option<Vec<Role>>,
    ttl_seconds: u64,
    qr: bool,
    address: Option<String>,
    json: bool,
) -> ExitCode {
    if qr && address.is_none() {
        let status = admin::call(data_dir, &admin::AdminRequest::Status).await;
        let listen = status.as_ref().ok().and_then(|s| s["listen"].as_str());
        if let Some(why) = listen.and_then(unreachable_listen) {
            eprintln!("pi-host: {why}");
            return ExitCode::from(64);
        }
    }
    let request = admin::AdminRequest::Pair { roles, ttl_seconds };
    let relinked = |mut v: serde_json::Value| {
        if let Some(address) = &address {
            v["url"] = relink(&v, address).into();
        }
        v
    };
    match admin::call(data_dir, &request).await.map(relinked) {
        Ok(value) if json => {
            println!("{value}");
            ExitCode::SUCCESS
        }
        Ok(value) => {
            print!("{}", pairing_text(&value, qr));
            ExitCode::SUCCESS
        }
        Err(error) => report(&error, json),
    }
}

/// Why a link to `listen` would not reach a device, if it would not (a loopback or unspecified
/// address), and what to do instead.
fn unreachable_listen(listen: &str) -> Option<String> {
    let addr: std::net::SocketAddr = listen.parse().ok()?;
    let port = addr.port();
    if addr.ip().is_loopback() {
        return Some(format!(
            "no QR code: this host listens on {listen}, its own loopback, which a phone or \
             another machine cannot reach. To pair the desktop, run `pi-remote connect` there \
             (it reaches the host over SSH); to pair a phone, serve on an address it reaches \
             (`listen` in the host's config, with --allow-host NAME) and name it: \
             `pi-host pair --qr --address NAME:{port}`"
        ));
    }
    addr.ip().is_unspecified().then(|| {
        format!(
            "no QR code: this host listens on every address ({listen}); name the one a device \
             reaches: `pi-host pair --qr --address NAME:{port}`"
        )
    })
}

/// The pairing link of a minted token at `address` instead of the listen address.
fn relink(minted: &serde_json::Value, address: &str) -> String {
    let cert = minted["certSha256"]
        .as_str()
        .and_then(|hex| hex.parse::<racp_proto::fingerprint::CertSha256>().ok());
    let tls = minted["url"]
        .as_str()
        .is_some_and(|url| url.starts_with("racps://"));
    identity::pairing_link(
        address,
        cert.as_ref(),
        tls,
        minted["token"].as_str().unwrap_or_default(),
    )
}

/// `pi-host pair` for a person: what the token is for, when it expires, and the link; short
/// enough for an 80x24 terminal unless the QR code is asked for.
fn pairing_text(v: &serde_json::Value, qr: bool) -> String {
    let token = v["token"].as_str().unwrap_or_default();
    let url = v["url"].as_str().unwrap_or_default();
    let expires = v["expiresAt"].as_u64().map_or_else(String::new, |at| {
        racp_proto::human::moment(at, clock::now_ms())
    });
    let cert = match v["certSha256"].as_str() {
        Some(sha256) => format!("Host certificate SHA-256 (the device pins it):\n  {sha256}\n"),
        None => {
            "The host serves plain ws:// (--plain): the device cannot check its identity.\n".into()
        }
    };
    let picture = if qr {
        terminal_qr(url)
    } else {
        "(pi-host pair --qr draws the link as a QR code)\n".into()
    };
    format!(
        "Pairing token for one device, roles {}, expires {expires}:\n  {token}\n{cert}Pairing link:\n  {url}\n{picture}",
        racp_proto::human::roles(&v["roles"]),
    )
}

/// `pi-host devices` as a table: id, roles, last seen, paired, name.
fn devices_table(v: &serde_json::Value) -> String {
    let devices: Vec<&serde_json::Value> = v["devices"].as_array().into_iter().flatten().collect();
    if devices.is_empty() {
        return "no paired devices\n".into();
    }
    let now = clock::now_ms();
    let when = |at: &serde_json::Value| {
        at.as_u64()
            .map_or("never".into(), |at| racp_proto::human::moment(at, now))
    };
    let rows: Vec<[String; 5]> = devices
        .iter()
        .map(|d| {
            [
                printable(d["deviceId"].as_str().unwrap_or_default(), false).into_owned(),
                racp_proto::human::roles(&d["roles"]),
                when(&d["lastSeenAt"]),
                when(&d["createdAt"]),
                // Names come from clients: escaped, so one cannot drive the terminal.
                printable(d["name"].as_str().unwrap_or_default(), false).into_owned(),
            ]
        })
        .collect();
    let header = ["DEVICE", "ROLES", "LAST SEEN", "PAIRED", "NAME"].map(String::from);
    let mut widths = [0usize; 5];
    for row in std::iter::once(&header).chain(&rows) {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    let mut out = String::new();
    for row in std::iter::once(&header).chain(&rows) {
        let cells: Vec<String> = row
            .iter()
            .zip(widths)
            .map(|(cell, width)| format!("{cell:width$}"))
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

/// The link as a QR code (pi_host::qr), with a word when it is taller than a terminal.
fn terminal_qr(url: &str) -> String {
    match qr::draw(url) {
        Ok(drawn) if drawn.lines > qr::TERMINAL_LINES => format!(
            "{}(the code is {} lines: a taller terminal shows it whole, or a shorter --address \
             makes it smaller)\n",
            drawn.text, drawn.lines
        ),
        Ok(drawn) => drawn.text,
        Err(err) => format!("(no QR code: {err})\n"),
    }
}

async fn admin_command(
    data_dir: &std::path::Path,
    request: &admin::AdminRequest,
    json: bool,
    human: impl FnOnce(&serde_json::Value) -> String,
) -> ExitCode {
    match admin::call(data_dir, request).await {
        Ok(value) => {
            if json {
                println!("{value}");
            } else {
                print!("{}", human(&value));
            }
            ExitCode::SUCCESS
        }
        Err(error) => report(&error, json),
    }
}

fn report(error: &AppError, json: bool) -> ExitCode {
    if json {
        println!("{}", serde_json::json!({ "error": error }));
    } else {
        eprintln!("pi-host: {}", printable(&error.to_string(), true));
    }
    ExitCode::FAILURE
}

/// `pi-host serve`: RACP-WS until SIGTERM or SIGINT, then a drain.
async fn serve(
    mut config: ServeConfig,
    state_file: Option<PathBuf>,
    metrics: Option<(std::net::SocketAddr, bool)>,
    redactor: pi_host::redact::Redactor,
) -> Result<(), String> {
    config.host_files.extend(state_file.iter().cloned());
    let tls = tls_config(&mut config)?;
    if !config.listen.ip().is_loopback() && tls.is_none() && !config.insecure_bind {
        return Err(format!(
            "refusing to listen on {} without TLS (--plain): drop --plain, or, to send tokens \
             unencrypted over the network, add --insecure-bind",
            config.listen
        ));
    }
    // The port is taken now (a second host fails here, before touching the admin socket) but
    // accepts only once the admin socket is served: whoever sees the port accept can run
    // `pi-host pair` or `status` at once (docs/reliability.md §2.4).
    refuse_second_host(&config.data_dir).await?;
    let socket = take_port(&config).await?;
    let local = socket.local_addr().map_err(|e| e.to_string())?;
    // The real port (when asked for port 0) is what pairing URLs and `status` must show.
    config.listen = local;
    // Before anything else opens descriptors: the limit is raised and split (racp-server/src/listener.rs).
    let budget = listener::plan(&mut config.limits);
    let state = state::HostState::open_with(config, redactor).map_err(|e| e.to_string())?;
    let metrics_local = start_local_services(&state, metrics).await?;
    let announced = uplink::spawn(&state)?;
    // Ready means reachable through the gateway too, unless NATS cannot be had now.
    if let Err(reason) = announced.wait(uplink::ANNOUNCE_PATIENCE).await {
        tracing::warn!(%reason, "not announced to the gateway yet; serving local clients, the link keeps trying");
    }
    let listener = socket
        .listen(1024)
        .map_err(|e| format!("cannot listen on {local}: {e}"))?;
    let scheme = if tls.is_some() { "wss" } else { "ws" };
    tracing::info!(%local, data_dir = %state.config.data_dir.display(), "pi-host listening");
    let shutdown = shutdown_signal()?;
    let url = format!("{scheme}://{local}{}", racp_proto::ENDPOINT_PATH);
    if let Some(path) = &state_file {
        write_state_file(path, local, metrics_local, &url, &state.config)
            .map_err(|e| format!("cannot write the state file {}: {e}", path.display()))?;
    }
    if let Some(sha256) = &state.config.cert_sha256 {
        println!("pi-host certificate SHA-256 {sha256}");
    }
    println!("pi-host listening on {url}");
    // Under systemd (`NOTIFY_SOCKET`, deploy/pi-host.service): `READY=1` once `/readyz` passes.
    let readiness = racp_server::notify::Readiness::start(server::operator::observed(&state));
    let router = server::router(state.clone());
    let drain_state = state.clone();
    let drained = async move {
        shutdown.await;
        tracing::info!("draining");
        if let Some(readiness) = readiness {
            readiness.stopping();
        }
        drain_state.begin_drain().await;
    };
    listener::serve(listener, tls, router, &budget, drained).await;
    stop(&state, state_file.as_deref()).await;
    Ok(())
}

/// After every connection has closed: ends the agents, commits what is queued, and removes the
/// admin socket and the state file.
async fn stop(state: &std::sync::Arc<state::HostState>, state_file: Option<&std::path::Path>) {
    state.drivers.stop_all(state).await;
    state.sessions.flush_and_stop();
    let _ = std::fs::remove_file(admin::socket_path(&state.config.data_dir));
    if let Some(path) = state_file {
        remove_own_state_file(path);
    }
}

/// Binds the listen address (without listening yet); a taken port is explained in words.
async fn take_port(config: &ServeConfig) -> Result<tokio::net::TcpSocket, String> {
    let listen = config.listen;
    let socket = if listen.is_ipv4() {
        tokio::net::TcpSocket::new_v4()
    } else {
        tokio::net::TcpSocket::new_v6()
    }
    .and_then(|socket| {
        socket.set_reuseaddr(true)?;
        socket.bind(listen)?;
        Ok(socket)
    });
    match socket {
        Ok(socket) => Ok(socket),
        Err(err) => Err(listen_error(&config.data_dir, listen, &err).await),
    }
}

/// What serves beside the device port: the agent's first check, the end of turns a previous run
/// left, the workspaces' watchers, the idle stop, the admin socket, and the operator's metrics
/// listener when asked (its bound address).
async fn start_local_services(
    state: &std::sync::Arc<state::HostState>,
    metrics: Option<(std::net::SocketAddr, bool)>,
) -> Result<Option<std::net::SocketAddr>, String> {
    // The agent is checked meanwhile; its first check is what host/info and turns wait for.
    let checking = state.clone();
    tokio::spawn(async move { checking.agent.status().await });
    driver::end_interrupted_turns(state).await;
    workspace::Workspaces::watch_open(state).await;
    tokio::spawn(driver::stop_idle_agents(state.clone()));
    let admin = admin::bind(&state.config.data_dir)
        .map_err(|e| format!("cannot bind the admin socket: {e}"))?;
    tokio::spawn(admin::serve(admin, state.clone()));
    match metrics {
        Some((addr, remote)) => Ok(Some(server::operator::start(state, addr, remote).await?)),
        None => Ok(None),
    }
}

/// The TLS configuration to serve: `--tls-cert`/`--tls-key`, else the host's own identity from
/// the data directory (made at first start), else none with `--plain`. Records the served
/// certificate's fingerprint in `config` for pairing links, `status` and the state file.
fn tls_config(
    config: &mut ServeConfig,
) -> Result<Option<std::sync::Arc<tokio_rustls::rustls::ServerConfig>>, String> {
    if config.plain {
        tracing::warn!(
            "serving plain ws:// (--plain): clients cannot check they reached this host, so a \
             process that takes over the port can collect their tokens (docs/protocol.md §2.4)"
        );
        return Ok(None);
    }
    let (cert, key, sha256, own) = match &config.tls {
        Some((cert, key)) => {
            let sha256 = identity::fingerprint(cert).map_err(|e| e.to_string())?;
            (cert.clone(), key.clone(), sha256, false)
        }
        None => {
            let identity = identity::load_or_create(&config.data_dir)
                .map_err(|e| format!("cannot load the host's TLS identity: {e}"))?;
            (identity.cert, identity.key, identity.sha256, true)
        }
    };
    let served = tls::server_config(&cert, &key).map_err(|e| {
        if own {
            // Never replaced silently: a new identity breaks every device's pin.
            format!(
                "{e} (the host's TLS identity; remove {} and {} only to make a new one, after \
                 which every paired device must pair again)",
                cert.display(),
                key.display()
            )
        } else {
            e
        }
    })?;
    config.tls = Some((cert, key));
    config.cert_sha256 = Some(sha256);
    Ok(Some(served))
}

/// Why the port cannot be taken, in words: a host of this data directory that is running
/// (its admin socket answers) is named with its pid and port; anything else only by the port.
async fn listen_error(
    data_dir: &std::path::Path,
    listen: std::net::SocketAddr,
    err: &std::io::Error,
) -> String {
    if err.kind() != std::io::ErrorKind::AddrInUse {
        return format!("cannot listen on {listen}: {err}");
    }
    match admin::call(data_dir, &admin::AdminRequest::Status).await {
        Ok(status) => already_running(&status),
        Err(_) => format!(
            "port {} is taken by another process: stop it, or choose another port with --listen",
            listen.port()
        ),
    }
}

/// One host per data directory: a second one would take over the admin socket and share the
/// store with the first (a host a supervisor or `pi-remote connect` started is one too).
async fn refuse_second_host(data_dir: &std::path::Path) -> Result<(), String> {
    match admin::call(data_dir, &admin::AdminRequest::Status).await {
        Ok(status) => Err(already_running(&status)),
        Err(_) => Ok(()),
    }
}

fn already_running(status: &serde_json::Value) -> String {
    format!(
        "a host is already running with data directory {} (pid {}, listening on {}): \
         `pi-host status` shows it; stop it first, or start this one with another --data-dir \
         and --listen",
        status["dataDir"].as_str().unwrap_or_default(),
        status["pid"],
        status["listen"].as_str().unwrap_or_default()
    )
}

/// Writes the state file through a temporary name and a rename, so a reader never sees half of
/// it.
fn write_state_file(
    path: &std::path::Path,
    listen: std::net::SocketAddr,
    metrics: Option<std::net::SocketAddr>,
    url: &str,
    config: &ServeConfig,
) -> std::io::Result<()> {
    let mut state = serde_json::json!({
        "version": env!("CARGO_PKG_VERSION"),
        "pid": std::process::id(),
        "listen": listen.to_string(),
        "url": url,
        "dataDir": config.data_dir.display().to_string(),
        "startedAt": clock::now_ms(),
    });
    if let Some(metrics) = metrics {
        state["metricsListen"] = metrics.to_string().into();
    }
    // The bootstrapper pins this (it arrives over SSH, a channel it already trusts).
    if let Some(sha256) = &config.cert_sha256 {
        state["certSha256"] = sha256.to_hex().into();
    }
    // 0600 whatever the umask: it names the certificate the bootstrapper pins.
    racp_server::private_file::replace_private(path, format!("{state}\n").as_bytes())
}

/// Removes the state file only if it is still this process's (a newer host may have replaced it).
fn remove_own_state_file(path: &std::path::Path) {
    let ours = std::fs::read(path)
        .ok()
        .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
        .is_some_and(|state| state["pid"] == std::process::id());
    if ours {
        let _ = std::fs::remove_file(path);
    }
}

/// Resolves on SIGTERM or SIGINT. The handlers are installed when this is called, not when the
/// future is first polled: a signal that arrives right after the "listening" line must drain,
/// not kill.
fn shutdown_signal() -> Result<impl std::future::Future<Output = ()>, String> {
    use tokio::signal::unix::{SignalKind, signal};
    let mut term =
        signal(SignalKind::terminate()).map_err(|e| format!("cannot handle SIGTERM: {e}"))?;
    let mut int =
        signal(SignalKind::interrupt()).map_err(|e| format!("cannot handle SIGINT: {e}"))?;
    Ok(async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    })
}
