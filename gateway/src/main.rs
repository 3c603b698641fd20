//! `pi-gateway`: RACP-WS for many hosts. Hosts dial out to NATS (`pi-host serve --gateway`);
//! desktops pair with the gateway and reach each host at `/racp/hosts/<hostId>`. Replicas share
//! nothing but NATS (docs/architecture.md, "Gateway"; docs/protocol.md §15).
//!
//! Layout: `server.rs` (the endpoints and upgrade) hands each socket to `connection.rs` (the
//! gateway's `Service` for racp-server's core), which answers the endpoint's calls in
//! `endpoint.rs`, routes a host's calls through `hosts.rs`, and follows a session's events by
//! `start.rs` (where a subscription starts), `feed.rs` (one consumer per session, shared) and
//! `follow.rs` (a reader older than the feed's window) over `stream.rs` (JetStream). Devices,
//! pairing and revocation live in NATS buckets (`devices.rs`, `revocation.rs`, `lease.rs`);
//! `nats.rs` is the link, `state.rs` what a replica holds.

mod connection;
mod devices;
mod endpoint;
mod feed;
mod follow;
mod hosts;
mod lease;
mod metrics;
mod nats;
mod revocation;
mod served;
mod server;
mod start;
mod state;
mod stream;

use clap::{Parser, Subcommand};
use racp_proto::Role;
use racp_proto::fingerprint::CertSha256;
use racp_server::usage::LogFormat;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

#[derive(Parser)]
#[command(
    name = "pi-gateway",
    version,
    about = "RACP-WS gateway for many pi-hosts, over NATS JetStream"
)]
struct Cli {
    /// Where the gateway keeps its TLS identity and NATS key [default: $XDG_DATA_HOME/pi-gateway]
    #[arg(long, global = true, env = "PI_GATEWAY_DATA_DIR")]
    data_dir: Option<PathBuf>,
    /// NATS servers (tls://host:port, comma-separated; nats:// only for a cleartext link)
    #[arg(
        long,
        global = true,
        env = "PI_GATEWAY_NATS",
        default_value = "tls://127.0.0.1:4222"
    )]
    nats: String,
    /// The CA (PEM file) that signs the NATS servers' certificates [default: the system's roots]
    #[arg(long, global = true, env = "PI_GATEWAY_NATS_CA")]
    nats_ca: Option<PathBuf>,
    /// Connect to NATS without the gateway's nkey (a server with no authorization)
    #[arg(long, global = true)]
    nats_no_auth: bool,
    /// Copies JetStream keeps of the gateway's buckets and streams (3 on a three-node cluster)
    #[arg(long, global = true, default_value_t = 1)]
    replicas: usize,
    /// The log's format on stderr: text lines, or one JSON object a line (with the call's span
    /// and trace id)
    #[arg(
        long,
        global = true,
        env = "PI_GATEWAY_LOG_FORMAT",
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
    Serve(ServeArgs),
    /// Print the gateway's public nkey (made at first use), for the NATS server's configuration.
    Key,
    /// Enroll a host: record its key, create its events stream (with its limits) and print the
    /// NATS user that confines it to its own subjects (add it to the server's
    /// `authorization.users` and reload the server). A host id enrolled with another key is
    /// refused (exit 64) unless --replace.
    Enroll(EnrollArgs),
    /// Mint a single-use pairing token for a device.
    Pair {
        #[arg(long, value_delimiter = ',', default_value = "owner", value_parser = parse_role)]
        roles: Vec<Role>,
        /// Hosts the device may reach [default: all]
        #[arg(long, value_delimiter = ',')]
        hosts: Vec<String>,
        #[arg(long, default_value_t = 600)]
        ttl: u64,
        /// The address desktops reach the gateway at (host:port), for the pairing link
        /// [default: the one the last `serve` with this data directory serves]
        #[arg(long)]
        address: Option<String>,
        #[arg(long)]
        json: bool,
    },
}

#[derive(clap::Args)]
struct EnrollArgs {
    /// The host's id and nkey, as `pi-host gateway-key` prints them.
    host_id: String,
    nkey: String,
    /// How long the stream keeps a host's events (seconds)
    #[arg(long, alias = "retention", default_value_t = 7 * 86_400)]
    retention_seconds: u64,
    /// Most bytes the host's stream keeps (the oldest events go first); JetStream reserves
    /// them
    #[arg(long, default_value_t = 256 << 20)]
    max_bytes: i64,
    /// The largest event the host's stream takes (bytes)
    #[arg(long, default_value_t = 1 << 20)]
    max_msg_size: i32,
    /// Give the host id to this key even though another key has it; the printed user entry
    /// replaces the old key's, which must leave the server's configuration
    #[arg(long)]
    replace: bool,
}

#[derive(clap::Args)]
struct ServeArgs {
    #[arg(long, default_value = "127.0.0.1:7879")]
    listen: SocketAddr,
    /// Serve `/metrics` (Prometheus), `/livez` and `/readyz` for the operator on this address,
    /// never the device port (port 0: the OS's pick, printed). Loopback only unless
    /// --metrics-allow-remote
    #[arg(long)]
    metrics_listen: Option<SocketAddr>,
    /// Allow --metrics-listen on a non-loopback address (metrics are served without auth)
    #[arg(long, requires = "metrics_listen")]
    metrics_allow_remote: bool,
    /// Serve plain ws:// (loopback only; devices cannot check the gateway's identity)
    #[arg(long, conflicts_with_all = ["tls_cert", "tls_key"])]
    plain: bool,
    /// The certificate to serve (PEM) instead of the data directory's own: replicas behind one
    /// address serve the same one, so a device's pin holds on each
    #[arg(long, requires = "tls_key")]
    tls_cert: Option<PathBuf>,
    /// The key of --tls-cert (PEM)
    #[arg(long, requires = "tls_cert")]
    tls_key: Option<PathBuf>,
    /// Heartbeat interval in milliseconds
    #[arg(long, default_value_t = 15_000)]
    heartbeat_ms: u64,
    /// Browser Origins to accept (repeatable)
    #[arg(long = "allow-origin")]
    allowed_origins: Vec<String>,
    /// A name devices reach the gateway by, to accept in the Host header besides loopback
    /// names and the --listen address (repeatable; against DNS rebinding)
    #[arg(long = "allow-host")]
    allowed_hosts: Vec<String>,
    /// A live subscriber this many events behind its session's head gets CLIENT_TOO_SLOW, as on
    /// a host; a replica's window of each session it follows holds this many events and a push
    /// [default: 20000]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    max_lag_events: Option<u64>,
    /// Bytes held for clients at once, over all connections (requests being read, replies
    /// waiting for their socket); past it, HOST_OVERLOADED [default: 67108864]
    #[arg(long, value_parser = clap::value_parser!(u64).range(1 << 20..=1 << 40))]
    max_held_bytes: Option<u64>,
    /// How long a replica serves devices after it last confirmed it knows every revoke, and
    /// so the longest a revoke waits for a replica that does not confirm (milliseconds)
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(500..=600_000))]
    revocation_lease_ms: u64,
}

/// jemalloc rather than glibc's malloc: after a burst of large requests glibc kept hundreds of
/// MiB that no connection held any more; jemalloc, tuned in .cargo/config.toml, hands freed
/// pages back within about a second from its background thread (docs/benchmarks.md, "Memory
/// under large requests", where mimalloc was also weighed).
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

/// The log on stderr: text (colour at a terminal) or one JSON object a line.
fn init_log(format: LogFormat) {
    format.install("PI_GATEWAY_LOG", std::io::stderr);
}

fn main() -> ExitCode {
    let cli = match racp_server::usage::parse::<Cli>() {
        Ok(cli) => cli,
        Err(exit) => return exit,
    };
    init_log(cli.log_format);
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(err) => {
            eprintln!("pi-gateway: cannot start the runtime: {err}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(failure) => {
            eprintln!("pi-gateway: {}", failure.message);
            failure.code
        }
    }
}

/// The TLS configuration a listener serves.
type ServedTls = Arc<tokio_rustls::rustls::ServerConfig>;

/// A failed command: what to print and the exit code.
struct Failure {
    message: String,
    code: ExitCode,
}

impl From<String> for Failure {
    fn from(message: String) -> Failure {
        Failure {
            message,
            code: ExitCode::FAILURE,
        }
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Failure {
        message.to_string().into()
    }
}

/// The exit code of a command refused as a conflict (BSD's EX_USAGE).
const EXIT_CONFLICT: u8 = 64;

fn parse_role(text: &str) -> Result<Role, String> {
    Role::from_name(text)
        .ok_or_else(|| format!("unknown role {text:?}: use owner, operator or observer"))
}

fn default_data_dir() -> PathBuf {
    if let Some(dir) = std::env::var_os("XDG_DATA_HOME").filter(|d| !d.is_empty()) {
        return PathBuf::from(dir).join("pi-gateway");
    }
    let home = std::env::var_os("HOME")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from("."));
    home.join(".local/share/pi-gateway")
}

async fn run(cli: Cli) -> Result<(), Failure> {
    let data_dir = cli.data_dir.clone().unwrap_or_else(default_data_dir);
    let seed = |dir: &Path| -> Result<Option<String>, String> {
        if cli.nats_no_auth {
            return Ok(None);
        }
        racp_server::uplink::key::load_or_create(dir)
            .map(|key| Some(key.seed))
            .map_err(|e| e.to_string())
    };
    match &cli.command {
        Command::Key => {
            let key =
                racp_server::uplink::key::load_or_create(&data_dir).map_err(|e| e.to_string())?;
            println!("{}", key.public);
            Ok(())
        }
        Command::Enroll(args) => {
            let js = jetstream(&cli, seed(&data_dir)?).await?;
            enroll(&js, cli.replicas, args).await
        }
        Command::Pair {
            roles,
            hosts,
            ttl,
            address,
            json,
        } => {
            let js = jetstream(&cli, seed(&data_dir)?).await?;
            let hosts = (!hosts.is_empty()).then(|| hosts.clone());
            let request = PairRequest {
                roles: roles.clone(),
                hosts,
                ttl: *ttl,
                address: address.as_deref(),
                json: *json,
            };
            Ok(pair(&js, cli.replicas, &data_dir, request).await?)
        }
        Command::Serve(args) => {
            let seed = seed(&data_dir)?;
            Ok(serve(&cli, &data_dir, seed, args).await?)
        }
    }
}

/// `pi-gateway enroll`: the host's key and stream recorded, its NATS user printed.
async fn enroll(
    js: &async_nats::jetstream::Context,
    replicas: usize,
    args: &EnrollArgs,
) -> Result<(), Failure> {
    let EnrollArgs {
        host_id,
        nkey,
        retention_seconds,
        max_bytes,
        max_msg_size,
        replace,
    } = args;
    let enrollment = nats::Enrollment {
        host_id,
        nkey,
        retention: Duration::from_secs(*retention_seconds),
        max_bytes: *max_bytes,
        max_msg_size: *max_msg_size,
        replicas,
        replace: *replace,
    };
    let enrolled = tokio::time::timeout(Duration::from_secs(30), nats::enroll(js, &enrollment))
        .await
        .map_err(|_| "JetStream did not answer within 30 s".to_string())?
        .map_err(|e| match e {
            nats::NatsError::Conflict(message) => Failure {
                message,
                code: ExitCode::from(EXIT_CONFLICT),
            },
            other => other.to_string().into(),
        })?;
    println!("{}", enrolled.user);
    if let Some(old) = enrolled.replaced {
        eprintln!(
            "pi-gateway: {host_id} now belongs to {nkey}. In the NATS server's \
             authorization.users, replace the entry of {old} with the one printed above \
             and reload the server: until then the old key keeps the host's access."
        );
    }
    Ok(())
}

struct PairRequest<'a> {
    roles: Vec<Role>,
    hosts: Option<Vec<String>>,
    ttl: u64,
    address: Option<&'a str>,
    json: bool,
}

/// `pi-gateway pair`: a pairing token minted into the shared bucket, printed once.
async fn pair(
    js: &async_nats::jetstream::Context,
    replicas: usize,
    data_dir: &Path,
    request: PairRequest<'_>,
) -> Result<(), String> {
    let buckets = tokio::time::timeout(Duration::from_secs(30), nats::buckets(js, replicas))
        .await
        .map_err(|_| "JetStream did not answer within 30 s".to_string())?;
    let registry = devices::Devices::new(buckets.devices, buckets.pairings);
    let expires_at = racp_server::clock::now_ms() + request.ttl * 1000;
    let minted = registry
        .mint_pairing(request.roles, request.hosts, expires_at)
        .await
        .map_err(|e| e.to_string())?;
    // The address and certificate the last `serve` of this data directory serves; without
    // one, the data directory's own certificate (what a serve without --tls-cert will serve).
    let (served_address, cert_sha256) = match served::read(data_dir) {
        Some(served) => (Some(served.address), served.cert_sha256),
        None => {
            let identity =
                racp_server::identity::load_or_create(data_dir).map_err(|e| e.to_string())?;
            (None, Some(identity.sha256))
        }
    };
    let address = request.address.map(str::to_string).or(served_address);
    // The link a host's pairing gives, with the gateway's address and certificate.
    let url = address.as_deref().map(|address| {
        racp_server::identity::pairing_link(
            address,
            cert_sha256.as_ref(),
            cert_sha256.is_some(),
            &minted.token,
        )
    });
    if request.json {
        let printed = serde_json::json!({
            "token": minted.token,
            "expiresAt": expires_at,
            "certSha256": cert_sha256.map(|sha256| sha256.to_hex()),
            "url": url,
        });
        println!("{printed}");
    } else {
        println!("Pairing token (single use):\n  {}", minted.token);
        if let Some(sha256) = cert_sha256 {
            println!("Gateway certificate SHA-256:\n  {sha256}");
        }
        match url {
            Some(url) => println!("Pairing URL:\n  {url}"),
            None => eprintln!(
                "pi-gateway: no pairing URL: no `pi-gateway serve` has run with this data \
                 directory; give the address desktops reach the gateway at with --address HOST:PORT"
            ),
        }
    }
    Ok(())
}

/// A JetStream context on a fresh connection, for the one-shot commands.
async fn jetstream(
    cli: &Cli,
    seed: Option<String>,
) -> Result<async_nats::jetstream::Context, String> {
    let client = nats::connect(&cli.nats, seed, cli.nats_ca.as_deref())
        .await
        .map_err(|e| e.to_string())?;
    let shown = racp_server::uplink::link::Servers::parse(&[&cli.nats])
        .map(|servers| servers.shown().to_string())
        .unwrap_or_default();
    nats::require_jetstream(&client, &shown)
        .await
        .map_err(|e| e.to_string())?;
    Ok(async_nats::jetstream::new(client))
}

/// The names accepted in the Host header: `--allow-host`, and the listen address when it
/// names one interface (a wildcard address names none).
fn allowed_hosts(args: &ServeArgs) -> Vec<String> {
    let mut names = args.allowed_hosts.clone();
    let ip = args.listen.ip();
    if !ip.is_unspecified() {
        names.push(match ip {
            std::net::IpAddr::V4(v4) => v4.to_string(),
            std::net::IpAddr::V6(v6) => format!("[{v6}]"),
        });
    }
    names
}

/// `pi-gateway serve`: RACP-WS until SIGTERM or SIGINT, then a drain.
async fn serve(
    cli: &Cli,
    data_dir: &Path,
    seed: Option<String>,
    args: &ServeArgs,
) -> Result<(), String> {
    let (listen, plain) = (args.listen, args.plain);
    if plain && !listen.ip().is_loopback() {
        return Err("--plain serves ws:// on loopback only".into());
    }
    let (tls, cert_sha256) = served_tls(args, data_dir)?;
    // Routed calls are signed with the gateway's key whether or not NATS knows it by it.
    let signer = racp_server::uplink::key::load_or_create(data_dir)
        .and_then(|key| key.pair())
        .map_err(|e| e.to_string())?;
    let client = nats::connect(&cli.nats, seed, cli.nats_ca.as_deref())
        .await
        .map_err(|e| e.to_string())?;
    let js = async_nats::jetstream::new(client.clone());
    let buckets = nats::buckets(&js, cli.replicas).await;
    let mut limits = racp_server::limits::HostLimits::default();
    let budget = racp_server::listener::plan(&mut limits);
    let socket = bind(listen)?;
    let local = socket.local_addr().map_err(|e| e.to_string())?;
    let settings = settings(args, local, &limits, cert_sha256);
    let gateway = state::Gateway::new(settings, client, buckets, signer)
        .map_err(|e| e.message().to_string())?;
    revocation::start(gateway.clone()).await;
    if let Some(addr) = args.metrics_listen {
        let local = metrics::start(&gateway, addr, args.metrics_allow_remote).await?;
        println!("pi-gateway metrics listening on http://{local}");
    }
    let listener = socket.listen(1024).map_err(|e| e.to_string())?;
    let record = served::Served {
        address: served::address(local, &args.allowed_hosts),
        cert_sha256,
    };
    served::record(data_dir, &record).map_err(|e| {
        format!(
            "cannot record the served address in {}: {e}",
            data_dir.display()
        )
    })?;
    let scheme = if tls.is_some() { "wss" } else { "ws" };
    if let Some(sha256) = &cert_sha256 {
        println!("pi-gateway certificate SHA-256 {sha256}");
    }
    println!(
        "pi-gateway listening on {scheme}://{local}{}",
        racp_proto::ENDPOINT_PATH
    );
    // Under systemd (`NOTIFY_SOCKET`, deploy/pi-gateway.service): `READY=1` once NATS is up.
    let readiness = racp_server::notify::Readiness::start(metrics::observed(&gateway));
    let drained = async move {
        shutdown_signal().await;
        if let Some(readiness) = readiness {
            readiness.stopping();
        }
    };
    let router = server::router(gateway.clone());
    racp_server::listener::serve(listener, tls, router, &budget, drained).await;
    gateway.drain(Duration::from_secs(5)).await;
    Ok(())
}

/// The device port, bound (and reusable at once after a restart) but not listening yet.
fn bind(listen: std::net::SocketAddr) -> Result<tokio::net::TcpSocket, String> {
    tokio::net::TcpSocket::new_v4()
        .and_then(|s| {
            s.set_reuseaddr(true)?;
            s.bind(listen)?;
            Ok(s)
        })
        .map_err(|e| format!("cannot bind {listen}: {e}"))
}

/// The TLS configuration served and its certificate's fingerprint: none with --plain, else
/// --tls-cert's, else the data directory's own identity.
fn served_tls(
    args: &ServeArgs,
    data_dir: &Path,
) -> Result<(Option<ServedTls>, Option<CertSha256>), String> {
    match (args.plain, &args.tls_cert, &args.tls_key) {
        (true, _, _) => Ok((None, None)),
        (false, Some(cert), Some(key)) => {
            let sha256 = racp_server::identity::fingerprint(cert)
                .map_err(|e| format!("cannot read --tls-cert {}: {e}", cert.display()))?;
            let served = racp_server::tls::server_config(cert, key)?;
            Ok((Some(served), Some(sha256)))
        }
        _ => {
            let identity = racp_server::identity::load_or_create(data_dir)
                .map_err(|e| format!("cannot load the gateway's TLS identity: {e}"))?;
            let served = racp_server::tls::server_config(&identity.cert, &identity.key)?;
            Ok((Some(served), Some(identity.sha256)))
        }
    }
}

/// The gateway's settings: the host's limits, with what `serve`'s flags change.
fn settings(
    args: &ServeArgs,
    listen: SocketAddr,
    limits: &racp_server::limits::HostLimits,
    cert_sha256: Option<CertSha256>,
) -> state::Settings {
    state::Settings {
        listen,
        heartbeat: Duration::from_millis(args.heartbeat_ms.max(100)),
        max_frame_bytes: limits.max_frame_bytes,
        max_connections: limits.max_connections,
        max_in_flight: limits.max_in_flight,
        max_subscriptions: limits.max_subscriptions,
        max_events_per_frame: limits.max_events_per_frame,
        max_lag_events: args.max_lag_events.unwrap_or(limits.max_lag_events),
        send_stall: limits.send_stall,
        requests_per_second: limits.requests_per_second,
        request_burst: limits.request_burst,
        allowed_origins: args.allowed_origins.clone(),
        allowed_hosts: allowed_hosts(args),
        cert_sha256,
        revocation_lease: Duration::from_millis(args.revocation_lease_ms),
        max_held_bytes: args
            .max_held_bytes
            .map_or(limits.max_held_bytes, |bytes| bytes as usize),
    }
}

/// Resolves on SIGTERM or SIGINT; never when the handlers cannot be installed.
async fn shutdown_signal() {
    use tokio::signal::unix::{SignalKind, signal};
    if let (Ok(mut term), Ok(mut int)) = (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    } else {
        std::future::pending::<()>().await;
    }
}
