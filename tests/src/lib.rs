//! Shared harness for end-to-end tests: a real `pi-host` process on a loopback port chosen by the
//! OS, with its own temporary data directory, and a raw WebSocket client that speaks RACP-WS
//! frames. Nothing here is mocked.
//!
//! Hosts serve TLS with their own certificate, as they do by default, and every client here pins
//! it by its SHA-256 (docs/protocol.md §2.4): the harness learns each host's fingerprint from the
//! line it prints at startup and looks it up by port ([`pin_for_url`]), through a [`FaultProxy`]
//! too. A host started with `--plain` has no pin and is reached over `ws://`.

#![allow(clippy::expect_used, clippy::unwrap_used)]

pub mod gateway;
pub mod nats;
pub mod pi;
pub mod raw;
pub mod roles;
pub mod sshd;
use futures_util::{SinkExt, StreamExt};
use racp_proto::fingerprint::CertSha256;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{self, Message};

/// Fingerprints of the hosts this test process started, by port.
static HOST_PINS: Mutex<Option<HashMap<u16, CertSha256>>> = Mutex::new(None);
/// Each fault proxy's current target, by the proxy's port.
static PROXY_TARGETS: Mutex<Option<HashMap<u16, Arc<Mutex<SocketAddr>>>>> = Mutex::new(None);

pub(crate) fn register_host(port: u16, pin: CertSha256) {
    HOST_PINS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .get_or_insert_with(HashMap::new)
        .insert(port, pin);
}

/// The certificate fingerprint of the host at `port` on loopback, or behind the proxy there.
pub fn pin_for_port(port: u16) -> Option<CertSha256> {
    let target = PROXY_TARGETS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|proxies| proxies.get(&port).cloned())
        .map(|target| target.lock().unwrap_or_else(|p| p.into_inner()).port());
    let port = target.unwrap_or(port);
    HOST_PINS
        .lock()
        .unwrap_or_else(|p| p.into_inner())
        .as_ref()
        .and_then(|pins| pins.get(&port).copied())
}

/// The pin for a `ws[s]://127.0.0.1:PORT/...` URL of a host (or proxy) this harness started.
pub fn pin_for_url(url: &str) -> Option<CertSha256> {
    let authority = url.split("://").nth(1)?.split('/').next()?;
    let port = authority.rsplit(':').next()?.parse().ok()?;
    pin_for_port(port)
}

/// Client options for a host this harness started: its certificate pinned, or, for a `--plain`
/// host (`ws://`), the plain-WebSocket opt-in.
pub fn client_options(url: impl Into<String>, token: &str) -> racp_proto::client::ClientOptions {
    let url = url.into();
    let pin = pin_for_url(&url);
    let plain = url.starts_with("ws://");
    let mut options = racp_proto::client::ClientOptions::new(url, token);
    options.pinned_sha256 = pin;
    options.allow_plain_ws = plain;
    // Reconnects soon after a cut; a call waits as long as the tests wait for anything.
    options.min_backoff = Duration::from_millis(20);
    options.max_backoff = Duration::from_millis(250);
    options.call_timeout = PATIENCE;
    // The tests check the host's delivery: a repeated event must reach them, not be hidden.
    options.strict_delivery = true;
    options
}

/// A byte stream to the host: plain TCP or TLS over TCP.
pub trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

/// TCP to the URL's port on loopback, and for `wss://` TLS that accepts only the pinned
/// certificate of the host there.
pub(crate) async fn dial(url: &str) -> std::io::Result<Box<dyn Io>> {
    let authority = url
        .split("://")
        .nth(1)
        .and_then(|rest| rest.split('/').next())
        .unwrap_or_default();
    let tcp = TcpStream::connect(authority).await?;
    let _ = tcp.set_nodelay(true);
    if !url.starts_with("wss://") {
        return Ok(Box::new(tcp));
    }
    let pin = pin_for_url(url).unwrap_or_else(|| panic!("no certificate pin known for {url}"));
    Ok(Box::new(pinned_tls(tcp, pin).await?))
}

/// A TLS client session over `tcp` that accepts exactly the certificate with SHA-256 `pin`.
pub async fn pinned_tls(
    tcp: TcpStream,
    pin: CertSha256,
) -> std::io::Result<tokio_rustls::client::TlsStream<TcpStream>> {
    use tokio_rustls::rustls::{self, ClientConfig, pki_types::ServerName};
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    // The client's own verifier: the harness trusts hosts exactly as devices do.
    let verifier = Arc::new(racp_proto::client::PinnedVerifier::new(pin, &provider));
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("TLS versions")
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_no_client_auth();
    tokio_rustls::TlsConnector::from(Arc::new(config))
        .connect(ServerName::try_from("localhost").expect("name"), tcp)
        .await
}

/// Generous bound for anything a test waits on; a loaded 2-core machine is slow, not stuck.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// Numbers at the edges of what a double or a 64-bit integer holds, as JSON text. The stand-in
/// agent's `numbers` directive writes them exactly so; the host relays agent payloads as text,
/// so every client must receive them exactly so (docs/protocol.md §1, "Numbers").
pub const EDGE_NUMBERS: &[&str] = &[
    // 2^53 + 1, the first integer a double cannot hold.
    "9007199254740993",
    // 2^64, one past u64.
    "18446744073709551616",
    "1e308",
    // The smallest subnormal double.
    "5e-324",
    "1234567890123456789012345678901234567890",
    "-0.0",
    // One below i64.
    "-9223372036854775809",
    // Spellings that encoding a parsed number would change.
    "1E5",
    "0.10",
    // 162 digits: the integer a fuzzer found rounded, and rounded again, in transit.
    "176452877777777777777777777777777777777777777777777777777733333333333333333333333333333333333333333333333333333333333333777777777777777777777777777777777777000041",
];

/// A running `pi-host serve`.
pub struct HostProcess {
    // First, so it runs before the log directory is removed.
    _log_tail: LogTail,
    child: Child,
    pub addr: SocketAddr,
    /// The SHA-256 of the certificate the host serves (`None` for a `--plain` host).
    pub cert_sha256: Option<CertSha256>,
    pub data_dir: tempfile::TempDir,
    /// The host's permitted root (`--root`): create workspaces inside it.
    pub root: tempfile::TempDir,
    /// Holds `host.log`, the host's stderr (debug level unless PI_HOST_TEST_LOG says otherwise).
    log_dir: tempfile::TempDir,
    bin: PathBuf,
    /// Extra environment variables for the host process, kept for restarts.
    env: Vec<(String, String)>,
}

impl HostProcess {
    /// Starts `bin serve` on 127.0.0.1 with an OS-chosen port and waits until it listens.
    pub async fn start(bin: &Path) -> HostProcess {
        HostProcess::start_with(bin, &[]).await
    }

    /// Like [`HostProcess::start`], with extra `serve` arguments.
    pub async fn start_with(bin: &Path, extra: &[&str]) -> HostProcess {
        HostProcess::start_with_env(bin, extra, &[]).await
    }

    /// Like [`HostProcess::start_with`], with extra environment variables for the host process
    /// (the host passes its environment on to the agents it runs). [`HostProcess::restart`] keeps
    /// them.
    pub async fn start_with_env(bin: &Path, extra: &[&str], env: &[(&str, &str)]) -> HostProcess {
        let data_dir = tempfile::tempdir().expect("temp dir");
        let root = tempfile::tempdir().expect("temp dir");
        let log_dir = tempfile::tempdir().expect("temp dir");
        let env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        HostProcess::spawn(bin, data_dir, root, log_dir, extra, env).await
    }

    /// Like [`HostProcess::start_with`], on a data directory made beforehand (a host enrolled
    /// with a gateway has its key there already).
    pub async fn start_in(bin: &Path, data_dir: tempfile::TempDir, extra: &[&str]) -> HostProcess {
        HostProcess::start_in_with_env(bin, data_dir, extra, &[]).await
    }

    /// [`HostProcess::start_in`] with extra environment variables (as `start_with_env`).
    pub async fn start_in_with_env(
        bin: &Path,
        data_dir: tempfile::TempDir,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> HostProcess {
        let root = tempfile::tempdir().expect("temp dir");
        let log_dir = tempfile::tempdir().expect("temp dir");
        let env = env
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        HostProcess::spawn(bin, data_dir, root, log_dir, extra, env).await
    }

    /// Starts a host again on the same data directory and root (after a kill).
    pub async fn restart(self, extra: &[&str]) -> HostProcess {
        let HostProcess {
            mut child,
            data_dir,
            root,
            log_dir,
            bin,
            env,
            ..
        } = self;
        let _ = child.kill().await;
        HostProcess::spawn(&bin, data_dir, root, log_dir, extra, env).await
    }

    async fn spawn(
        bin: &Path,
        data_dir: tempfile::TempDir,
        root: tempfile::TempDir,
        log_dir: tempfile::TempDir,
        extra: &[&str],
        env: Vec<(String, String)>,
    ) -> HostProcess {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log_dir.path().join("host.log"))
            .expect("open host log");
        let mut child = Command::new(bin)
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir.path())
            .arg("--root")
            .arg(root.path())
            .args(extra)
            .env(
                "PI_HOST_LOG",
                std::env::var("PI_HOST_TEST_LOG").unwrap_or_else(|_| "debug".into()),
            )
            .env("NO_COLOR", "1")
            .envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())))
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn pi-host");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let (addr, cert_sha256) = tokio::time::timeout(PATIENCE, async {
            let mut cert_sha256 = None;
            while let Some(line) = lines.next_line().await.expect("read stdout") {
                if let Some(hex) = line.strip_prefix("pi-host certificate SHA-256 ") {
                    cert_sha256 = Some(hex.trim().parse::<CertSha256>().expect("fingerprint"));
                }
                let rest = line
                    .strip_prefix("pi-host listening on ws://")
                    .or_else(|| line.strip_prefix("pi-host listening on wss://"));
                if let Some(rest) = rest {
                    let addr = rest.trim_end_matches("/racp");
                    return (
                        addr.parse::<SocketAddr>().expect("listen address"),
                        cert_sha256,
                    );
                }
            }
            panic!("pi-host exited before listening");
        })
        .await
        .expect("pi-host did not start in time");
        if let Some(pin) = cert_sha256 {
            register_host(addr.port(), pin);
        }
        // Keep draining stdout so the host never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        HostProcess {
            _log_tail: LogTail(log_dir.path().join("host.log")),
            child,
            addr,
            cert_sha256,
            data_dir,
            root,
            log_dir,
            bin: bin.to_path_buf(),
            env,
        }
    }

    /// `wss://` with the host's own certificate, or `ws://` for a `--plain` host.
    pub fn url(&self) -> String {
        let scheme = if self.cert_sha256.is_some() {
            "wss"
        } else {
            "ws"
        };
        format!("{scheme}://{}/racp", self.addr)
    }

    /// A byte stream to the host below HTTP, for hand-written requests: TLS with the pinned
    /// certificate, or plain TCP for a `--plain` host.
    pub async fn stream(&self) -> Box<dyn Io> {
        dial(&self.url()).await.expect("connect to the host")
    }

    /// Runs a `pi-host` admin command against this host; returns (success, stdout, stderr).
    pub async fn cli(&self, args: &[&str]) -> (bool, String, String) {
        let output = Command::new(&self.bin)
            .args(args)
            .arg("--data-dir")
            .arg(self.data_dir.path())
            .env("PI_HOST_LOG", "warn")
            .output()
            .await
            .expect("run pi-host");
        (
            output.status.success(),
            String::from_utf8_lossy(&output.stdout).into_owned(),
            String::from_utf8_lossy(&output.stderr).into_owned(),
        )
    }

    /// Mints a pairing token with `pi-host pair --json`.
    pub async fn pairing_token(&self, extra: &[&str]) -> Value {
        let mut args = vec!["pair", "--json"];
        args.extend_from_slice(extra);
        let (ok, stdout, stderr) = self.cli(&args).await;
        assert!(ok, "pi-host pair failed: {stdout} {stderr}");
        serde_json::from_str(stdout.trim()).expect("pair --json prints JSON")
    }

    /// Pairs a new device and returns (deviceId, deviceToken).
    pub async fn pair_device(&self, name: &str, extra: &[&str]) -> (String, String) {
        let token = self.pairing_token(extra).await["token"]
            .as_str()
            .unwrap()
            .to_string();
        let mut client = Client::connect(&self.url(), &token)
            .await
            .expect("pairing upgrade");
        client.hello().await;
        let reply = client.call("pair", json!({"deviceName": name})).await;
        let result = &reply["result"];
        (
            result["deviceId"].as_str().expect("deviceId").to_string(),
            result["deviceToken"]
                .as_str()
                .expect("deviceToken")
                .to_string(),
        )
    }

    /// The host's process id.
    /// The host's child processes (its agents), sorted.
    pub fn agent_pids(&self) -> Vec<u32> {
        let mut pids = Vec::new();
        let tasks = std::fs::read_dir(format!("/proc/{}/task", self.pid())).expect("/proc tasks");
        for task in tasks.flatten() {
            let children =
                std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
            pids.extend(
                children
                    .split_whitespace()
                    .filter_map(|p| p.parse::<u32>().ok()),
            );
        }
        // Not an agent: a child that already exited (no command line), one forked and not yet
        // running its program (the host's own command line, until its exec), or the host's
        // own look at its agent (`--version`, docs/architecture.md "The agent check").
        let host = std::fs::read(format!("/proc/{}/cmdline", self.pid())).unwrap_or_default();
        pids.retain(|pid| {
            let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap_or_default();
            !cmdline.is_empty()
                && cmdline != host
                && !cmdline.split(|b| *b == 0).any(|arg| arg == b"--version")
        });
        pids.sort_unstable();
        pids
    }

    pub fn pid(&self) -> u32 {
        self.child.id().expect("host running")
    }

    /// Sends SIGKILL (the test-side kill -9).
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Sends SIGTERM (the host begins to drain) without waiting for it to exit.
    pub fn sigterm(&self) {
        let sent = std::process::Command::new("kill")
            .args(["-TERM", &self.pid().to_string()])
            .status()
            .expect("run kill");
        assert!(sent.success(), "kill -TERM {}", self.pid());
    }

    /// Waits until the host's log holds `text`, within `patience`; `what` names the wait
    /// in the failure.
    pub async fn until_logged(&self, text: &str, patience: Duration, what: &str) {
        let deadline = std::time::Instant::now() + patience;
        while !self.log().contains(text) {
            assert!(std::time::Instant::now() < deadline, "{what}");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Sends SIGTERM and waits for the process to exit; returns whether it exited cleanly.
    pub async fn terminate(&mut self) -> bool {
        let Some(pid) = self.child.id() else {
            return false;
        };
        let _ = Command::new("kill")
            .args(["-TERM", &pid.to_string()])
            .status()
            .await;
        tokio::time::timeout(PATIENCE, self.child.wait())
            .await
            .expect("host did not exit after SIGTERM")
            .map(|s| s.success())
            .unwrap_or(false)
    }

    /// The host process's resident memory in KiB (from /proc).
    pub fn rss_kib(&self) -> u64 {
        let pid = self.child.id().expect("host running");
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    /// Everything the host has logged so far.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_dir.path().join("host.log")).unwrap_or_default()
    }

    /// A new workspace directory inside the root; returns its path.
    pub fn workspace(&self, name: &str) -> String {
        let path = self.root.path().join(name);
        std::fs::create_dir_all(&path).expect("create workspace");
        path.to_str().expect("utf-8 path").to_string()
    }
}

/// Prints the end of the host's log when a test fails while the host is alive.
struct LogTail(PathBuf);

impl Drop for LogTail {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read(&self.0).unwrap_or_default();
            let tail = String::from_utf8_lossy(&log[log.len().saturating_sub(8 << 10)..]);
            eprintln!("--- pi-host log (tail) ---\n{tail}");
        }
    }
}

/// Why an upgrade failed: the HTTP status and the JSON body.
#[derive(Debug)]
pub struct Refused {
    pub status: u16,
    pub body: Value,
}

/// Options for an upgrade request.
#[derive(Default, Clone)]
pub struct Upgrade<'a> {
    pub bearer: Option<&'a str>,
    pub subprotocols: Option<&'a str>,
    pub host: Option<&'a str>,
    pub origin: Option<&'a str>,
    pub url_suffix: &'a str,
}

/// A process's resident memory (`VmRSS`) and its peak (`VmHWM`) in KiB, from
/// `/proc/PID/status`.
pub fn memory_kib(pid: u32) -> (u64, u64) {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let field = |name: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Waits up to `patience` for `pid`'s RSS to fall to `bound_kib` or below; returns the last
/// RSS read (above the bound when it did not fall in time).
pub async fn rss_falls_to(pid: u32, bound_kib: u64, patience: Duration) -> u64 {
    let deadline = tokio::time::Instant::now() + patience;
    loop {
        let (rss, _) = memory_kib(pid);
        if rss <= bound_kib || tokio::time::Instant::now() >= deadline {
            return rss;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A raw RACP-WS client for tests.
pub struct Client {
    ws: WebSocketStream<Box<dyn Io>>,
    next_id: u64,
    /// Frames read while waiting for a reply, handed out by `next_frame` in order, as the text
    /// received (so `next_text` sees them byte for byte).
    pending: std::collections::VecDeque<String>,
    /// The subprotocol the server selected.
    pub selected_protocol: Option<String>,
}

impl Client {
    pub async fn connect(url: &str, token: &str) -> Result<Client, Refused> {
        Client::upgrade(
            url,
            Upgrade {
                bearer: Some(token),
                ..Upgrade::default()
            },
        )
        .await
    }

    pub async fn upgrade(url: &str, options: Upgrade<'_>) -> Result<Client, Refused> {
        let mut request = format!("{url}{}", options.url_suffix)
            .into_client_request()
            .expect("request");
        let headers = request.headers_mut();
        headers.insert(
            "Sec-WebSocket-Protocol",
            HeaderValue::from_str(options.subprotocols.unwrap_or("racp.v1")).unwrap(),
        );
        if let Some(token) = options.bearer {
            headers.insert(
                "Authorization",
                HeaderValue::from_str(&format!("Bearer {token}")).unwrap(),
            );
        }
        if let Some(host) = options.host {
            headers.insert("Host", HeaderValue::from_str(host).unwrap());
        }
        if let Some(origin) = options.origin {
            headers.insert("Origin", HeaderValue::from_str(origin).unwrap());
        }
        let connect = async {
            let stream = dial(url).await.map_err(tungstenite::Error::Io)?;
            tokio_tungstenite::client_async(request, stream).await
        };
        match tokio::time::timeout(PATIENCE, connect).await {
            Err(_) => panic!("upgrade timed out"),
            Ok(Ok((ws, response))) => Ok(Client {
                ws,
                next_id: 1,
                pending: std::collections::VecDeque::new(),
                selected_protocol: response
                    .headers()
                    .get("Sec-WebSocket-Protocol")
                    .and_then(|v| v.to_str().ok())
                    .map(str::to_string),
            }),
            Ok(Err(tungstenite::Error::Http(response))) => {
                let body = response
                    .body()
                    .as_ref()
                    .map(|b| serde_json::from_slice(b).unwrap_or(Value::Null))
                    .unwrap_or(Value::Null);
                Err(Refused {
                    status: response.status().as_u16(),
                    body,
                })
            }
            Ok(Err(err)) => panic!("upgrade failed: {err}"),
        }
    }

    /// Says hello with the default parameters and returns the result.
    pub async fn hello(&mut self) -> Value {
        let reply = self
            .call(
                "hello",
                json!({"protocol": {"min": 1, "max": 1}, "client": {"name": "tests", "version": "0"}}),
            )
            .await;
        assert!(reply.get("result").is_some(), "hello failed: {reply}");
        reply["result"].clone()
    }

    /// Creates a session in `workspace` and subscribes to it from its start; returns its id.
    pub async fn open_session(&mut self, workspace: &str) -> String {
        let created = self
            .call(
                "session/create",
                serde_json::json!({"workspace": workspace}),
            )
            .await;
        let session = &created["result"]["session"];
        let id = session["sessionId"]
            .as_str()
            .unwrap_or_else(|| panic!("session/create failed: {created}"))
            .to_string();
        let sub = self
            .call(
                "session/subscribe",
                serde_json::json!({"sessionId": id, "cursor": session["cursor"]}),
            )
            .await;
        assert!(sub.get("result").is_some(), "{sub}");
        id
    }

    /// Sends a request and returns its reply frame, skipping pushes.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send_text(json!({"id": id, "method": method, "params": params}).to_string())
            .await;
        let wait = async {
            loop {
                let text = self
                    .read_text()
                    .await
                    .expect("connection closed before the reply");
                let frame: Value = serde_json::from_str(&text).expect("JSON frame");
                if frame.get("id") == Some(&json!(id)) {
                    return frame;
                }
                self.pending.push_back(text);
            }
        };
        tokio::time::timeout(PATIENCE, wait)
            .await
            .unwrap_or_else(|_| panic!("no reply to {method} in time"))
    }

    pub async fn send_text(&mut self, text: String) {
        self.try_send_text(text).await.expect("send frame");
    }

    /// Collects session events until one satisfies `done` (inclusive), within `patience`;
    /// later events of the same frame stay unread for the next call.
    pub async fn events_until(
        &mut self,
        patience: Duration,
        done: impl Fn(&Value) -> bool,
    ) -> Vec<Value> {
        let mut events = Vec::new();
        let collect = async {
            loop {
                let mut frame = self.next_frame().await.expect("connection open");
                if frame["method"] != "session/events" {
                    continue;
                }
                let batch = frame["params"]["events"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default();
                for (i, event) in batch.iter().enumerate() {
                    events.push(event.clone());
                    if done(event) {
                        if i + 1 < batch.len() {
                            frame["params"]["events"] = Value::Array(batch[i + 1..].to_vec());
                            self.unread(frame);
                        }
                        return;
                    }
                }
            }
        };
        if tokio::time::timeout(patience, collect).await.is_err() {
            panic!("the awaited event did not come in time; got {events:#?}");
        }
        events
    }

    /// The subscribed session's events from here up to its head as `session/get` names it now
    /// (none when `last_read`, the cursor of the last event read, is the head already). Every one
    /// is committed, so they come at once: an event a test expects and does not find among them
    /// is missing, not late, and the test says so without waiting out a deadline.
    pub async fn events_to_head(
        &mut self,
        session_id: &str,
        last_read: Option<&Value>,
    ) -> Vec<Value> {
        let got = self
            .call("session/get", serde_json::json!({"sessionId": session_id}))
            .await;
        let head = got["result"]["cursor"].clone();
        assert!(head.is_string(), "session/get failed: {got}");
        if last_read == Some(&head) {
            return Vec::new();
        }
        self.events_until(PATIENCE, |e| e["cursor"] == head).await
    }

    /// Puts a frame back: the next `next_frame` returns it first.
    pub fn unread(&mut self, frame: Value) {
        self.pending.push_front(frame.to_string());
    }

    /// Writes one text frame of `payload` straight to the socket, masked with a zero key so the
    /// payload goes as it is: the same large payload sent on many connections costs the test
    /// no copy per connection (tungstenite's write buffer would keep one each).
    pub async fn send_raw_text(&mut self, payload: &[u8]) {
        use tokio::io::AsyncWriteExt;
        let mut header = vec![0x81, 0x80 | 127];
        header.extend_from_slice(&(payload.len() as u64).to_be_bytes());
        header.extend_from_slice(&[0; 4]);
        let stream = self.ws.get_mut();
        stream.write_all(&header).await.expect("send frame header");
        stream.write_all(payload).await.expect("send frame payload");
        stream.flush().await.expect("flush frame");
    }

    /// Sends a frame; an error means the server already closed or reset the connection.
    pub async fn try_send_text(&mut self, text: String) -> Result<(), tungstenite::Error> {
        self.ws.send(Message::Text(text.into())).await
    }

    /// The next JSON frame (including pushes that arrived while a call waited for its reply),
    /// or `None` once the connection closed.
    pub async fn next_frame(&mut self) -> Option<Value> {
        let text = self.next_text().await?;
        Some(serde_json::from_str(&text).expect("JSON frame"))
    }

    /// The next frame as the text received, byte for byte (a parsed `Value` would not keep
    /// every number as sent).
    pub async fn next_text(&mut self) -> Option<String> {
        if let Some(text) = self.pending.pop_front() {
            return Some(text);
        }
        self.read_text().await
    }

    async fn read_text(&mut self) -> Option<String> {
        loop {
            let message = tokio::time::timeout(PATIENCE, self.ws.next())
                .await
                .expect("no frame in time")?;
            match message {
                Ok(Message::Text(text)) => return Some(text.as_str().to_string()),
                Ok(Message::Close(_)) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// Closes with 1000 as a client that is done would, and returns the server's answering close
    /// frame (`None` when the connection ended without one, which RFC 6455 §5.5.1 forbids).
    pub async fn close_normally(&mut self) -> Option<CloseFrame> {
        use tungstenite::protocol::frame::coding::CloseCode;
        let goodbye = CloseFrame {
            code: CloseCode::Normal,
            reason: "done".into(),
        };
        self.ws.close(Some(goodbye)).await.ok()?;
        loop {
            let message = tokio::time::timeout(PATIENCE, self.ws.next())
                .await
                .expect("no answer to the close in time");
            match message {
                Some(Ok(Message::Close(frame))) => return frame,
                None | Some(Err(_)) => return None,
                Some(Ok(_)) => {}
            }
        }
    }

    /// Reads until the server closes; returns the frames before the close and the close frame.
    pub async fn until_close(&mut self) -> (Vec<Value>, Option<CloseFrame>) {
        let mut frames: Vec<Value> = self
            .pending
            .drain(..)
            .map(|text| serde_json::from_str(&text).expect("JSON frame"))
            .collect();
        loop {
            let message = tokio::time::timeout(PATIENCE, self.ws.next())
                .await
                .expect("server did not close in time");
            match message {
                Some(Ok(Message::Text(text))) => {
                    frames.push(serde_json::from_str(text.as_str()).expect("JSON frame"));
                }
                Some(Ok(Message::Close(frame))) => return (frames, frame),
                None | Some(Err(_)) => return (frames, None),
                Some(Ok(_)) => {}
            }
        }
    }
}

/// Prints a test's measured figures and, when `RACP_FIGURES_DIR` is set, writes them there as
/// `<name>.json` (docs/reliability.md reads them from there). Figures are reported, never asserted.
/// One HTTP/1.1 GET to a server's operator listener (`/metrics`, `/livez`, `/readyz`): the
/// status code and the body.
pub async fn http_get(addr: SocketAddr, path: &str) -> (u16, String) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::net::TcpStream::connect(addr).await.expect("connect");
    let request = format!("GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n");
    stream.write_all(request.as_bytes()).await.expect("send");
    let mut response = String::new();
    tokio::time::timeout(PATIENCE, stream.read_to_string(&mut response))
        .await
        .expect("no answer in time")
        .expect("read");
    let status = response
        .get(9..12)
        .and_then(|s| s.parse().ok())
        .expect("status");
    let body = response
        .split_once("\r\n\r\n")
        .map(|(_, body)| body.to_string())
        .unwrap_or_default();
    (status, body)
}

/// The value of one series in the Prometheus text format (its name and labels as written),
/// 0 when absent.
pub fn series_value(text: &str, series: &str) -> f64 {
    text.lines()
        .find_map(|line| line.strip_prefix(series)?.strip_prefix(' '))
        .map_or(0.0, |v| v.trim().parse().expect("a number"))
}

pub fn record_figures(name: &str, figures: &serde_json::Value) {
    println!("{name}: {figures}");
    if let Ok(dir) = std::env::var("RACP_FIGURES_DIR") {
        std::fs::create_dir_all(&dir).expect("figures directory");
        std::fs::write(
            Path::new(&dir).join(format!("{name}.json")),
            serde_json::to_string_pretty(figures).expect("figures as JSON"),
        )
        .expect("write figures");
    }
}

/// The path of the `stand-in-agent` test fixture (a scripted stand-in for `pi --mode rpc`, see
/// `src/bin/stand-in-agent.rs`), built when missing or older than its source.
pub fn stand_in_agent() -> PathBuf {
    let source = Path::new(env!("CARGO_MANIFEST_DIR")).join("src/bin/stand-in-agent.rs");
    workspace_binary("tests", "stand-in-agent", Some(&source))
}

/// The `pi-host` binary, built when missing or stale (for tests outside the pi-host package).
pub fn pi_host_binary() -> PathBuf {
    workspace_binary("pi-host", "pi-host", None)
}

/// A workspace binary next to the running test executable: the test binary is
/// `target/<profile>/deps/x`, the binary `target/<profile>/<bin>`. Cargo builds another
/// package's binaries only for that package's own tests, so when the binary is missing or older
/// than its package's sources (or `source`), this builds it first, with the same profile and
/// target directory.
pub fn workspace_binary(package: &str, bin: &str, source: Option<&Path>) -> PathBuf {
    static BUILT: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());
    let mut built = BUILT
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    if let Some((_, path)) = built.iter().find(|(name, _)| name == bin) {
        return path.clone();
    }
    let exe = std::env::current_exe().expect("current test executable");
    let deps = exe.parent().expect("test executable's directory");
    let profile_dir = if deps.file_name().is_some_and(|name| name == "deps") {
        deps.parent().expect("profile directory")
    } else {
        deps
    };
    let path = profile_dir.join(format!("{bin}{}", std::env::consts::EXE_SUFFIX));
    let modified = |p: &Path| std::fs::metadata(p).and_then(|m| m.modified()).ok();
    // Older than any source it is built from: a binary left by an earlier build would test old
    // code (a plain `cargo nextest run -p tests` builds no other package's binaries).
    let newest = source
        .and_then(modified)
        .into_iter()
        .chain(newest_source(package))
        .max();
    let stale = match (modified(&path), newest) {
        (None, _) => true,
        (Some(binary), Some(source)) => binary < source,
        (Some(_), None) => false,
    };
    if stale {
        let cargo = option_env!("CARGO").unwrap_or("cargo");
        let mut command = std::process::Command::new(cargo);
        command.args(["build", "-p", package, "--bin", bin]);
        // The directory named after the profile: `debug` is the `dev` profile.
        match profile_dir.file_name().and_then(|name| name.to_str()) {
            Some("debug") | None => {}
            Some("release") => {
                command.arg("--release");
            }
            Some(profile) => {
                command.args(["--profile", profile]);
            }
        }
        if let Some(target_dir) = profile_dir.parent() {
            command.arg("--target-dir").arg(target_dir);
        }
        let status = command
            .current_dir(env!("CARGO_MANIFEST_DIR"))
            .stdin(Stdio::null())
            .status()
            .unwrap_or_else(|e| panic!("run cargo to build {bin}: {e}"));
        assert!(status.success(), "building {bin} failed: {status}");
        assert!(path.exists(), "{bin} is not at {}", path.display());
    }
    built.push((bin.to_string(), path.clone()));
    path
}

/// The newest modification time of the sources a workspace package's binaries are built from:
/// its own `src/` and `Cargo.toml`, and those of every workspace package it depends on, read
/// from the manifests (so a new dependency, racp-server for pi-host say, cannot be missed).
fn newest_source(package: &str) -> Option<std::time::SystemTime> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent()?;
    let crates = workspace_dependencies(root, package);
    let mut newest = None;
    let mut stack: Vec<PathBuf> = crates.iter().map(|c| root.join(c).join("src")).collect();
    let manifests = crates.iter().map(|c| root.join(c).join("Cargo.toml"));
    let mut consider = |path: &Path| {
        if let Ok(time) = std::fs::metadata(path).and_then(|m| m.modified()) {
            newest = newest.max(Some(time));
        }
    };
    manifests.for_each(|m| consider(&m));
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else {
            continue;
        };
        for entry in entries.flatten() {
            let path = entry.path();
            if path.is_dir() {
                stack.push(path);
            } else {
                consider(&path);
            }
        }
    }
    newest
}

/// `package` and the workspace packages its `[dependencies]` name, directly or through one
/// another (not its dev-dependencies: they do not go into its binaries). A workspace package
/// lives in the directory of its name.
fn workspace_dependencies(root: &Path, package: &str) -> Vec<String> {
    let mut found = vec![package.to_string()];
    let mut next = 0;
    while let Some(name) = found.get(next).cloned() {
        next += 1;
        let manifest = std::fs::read_to_string(root.join(&name).join("Cargo.toml"));
        for dependency in dependency_names(&manifest.unwrap_or_default()) {
            let is_member = root.join(&dependency).join("Cargo.toml").is_file();
            if is_member && !found.contains(&dependency) {
                found.push(dependency);
            }
        }
    }
    found
}

/// The names a manifest's `[dependencies]` table lists (`name = ...`, `name.workspace = true`).
fn dependency_names(manifest: &str) -> Vec<String> {
    let mut names = Vec::new();
    let mut in_dependencies = false;
    for line in manifest.lines().map(str::trim) {
        if line.starts_with('[') {
            in_dependencies = line == "[dependencies]";
            continue;
        }
        if !in_dependencies || line.starts_with('#') {
            continue;
        }
        if let Some(name) = line.split(['=', '.']).next().map(str::trim)
            && !name.is_empty()
        {
            names.push(name.to_string());
        }
    }
    names
}

/// A self-signed certificate for `localhost`, written as PEM files for `--tls-cert`/`--tls-key`.
pub struct TestCertificate {
    _dir: tempfile::TempDir,
    pub cert: PathBuf,
    pub key: PathBuf,
    /// The certificate in DER, for a client to pin.
    pub der: Vec<u8>,
}

impl TestCertificate {
    pub fn localhost() -> TestCertificate {
        let certified = rcgen::generate_simple_self_signed(vec!["localhost".to_string()])
            .expect("generate a certificate");
        let dir = tempfile::tempdir().expect("temp dir");
        let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
        std::fs::write(&cert, certified.cert.pem()).expect("write cert");
        std::fs::write(&key, certified.signing_key.serialize_pem()).expect("write key");
        TestCertificate {
            _dir: dir,
            cert,
            key,
            der: certified.cert.der().to_vec(),
        }
    }

    /// The `serve` arguments that turn TLS on with this certificate.
    pub fn serve_args(&self) -> [&str; 4] {
        [
            "--tls-cert",
            self.cert.to_str().expect("utf-8 path"),
            "--tls-key",
            self.key.to_str().expect("utf-8 path"),
        ]
    }
}

/// A TCP proxy on loopback between a client and a host that can cut every connection or stall
/// (black-hole) traffic, for testing reconnects and liveness. Its target can change, so a
/// restarted host (on a new port) stays reachable at the same address.
pub struct FaultProxy {
    pub addr: SocketAddr,
    target: std::sync::Arc<std::sync::Mutex<SocketAddr>>,
    cut: tokio::sync::broadcast::Sender<()>,
    stalled: tokio::sync::watch::Sender<bool>,
    /// Latency added to every chunk forwarded, in milliseconds.
    delay_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
    /// How long what arrives is held to go out in one write (0: not batched).
    batch_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
}

impl FaultProxy {
    pub async fn start(target: SocketAddr) -> FaultProxy {
        FaultProxy::start_inner(target, false).await
    }

    /// Like [`FaultProxy::start`], with a small receive buffer on the side facing the target,
    /// so a stalled or delayed link pushes back on the host after a few KiB instead of after
    /// the megabytes loopback buffers grow to.
    pub async fn start_with_small_buffers(target: SocketAddr) -> FaultProxy {
        FaultProxy::start_inner(target, true).await
    }

    async fn start_inner(target: SocketAddr, small_buffers: bool) -> FaultProxy {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
            .await
            .expect("bind proxy");
        let addr = listener.local_addr().expect("proxy address");
        let target = std::sync::Arc::new(std::sync::Mutex::new(target));
        PROXY_TARGETS
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get_or_insert_with(HashMap::new)
            .insert(addr.port(), target.clone());
        let (cut, _) = tokio::sync::broadcast::channel(16);
        let (stalled, _) = tokio::sync::watch::channel(false);
        let delay_ms = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let batch_ms = std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0));
        let accept_batch = batch_ms.clone();
        let (accept_target, accept_cut, accept_stalled, accept_delay) = (
            target.clone(),
            cut.clone(),
            stalled.clone(),
            delay_ms.clone(),
        );
        tokio::spawn(async move {
            while let Ok((inbound, _)) = listener.accept().await {
                let to = *accept_target.lock().expect("target lock");
                let mut cut_rx = accept_cut.subscribe();
                let stalled_rx = accept_stalled.subscribe();
                let delay = accept_delay.clone();
                let batch = accept_batch.clone();
                tokio::spawn(async move {
                    let outbound = if small_buffers {
                        let socket = match to {
                            SocketAddr::V4(_) => tokio::net::TcpSocket::new_v4(),
                            SocketAddr::V6(_) => tokio::net::TcpSocket::new_v6(),
                        };
                        let Ok(socket) = socket else { return };
                        let _ = socket.set_recv_buffer_size(4096);
                        socket.connect(to).await
                    } else {
                        TcpStream::connect(to).await
                    };
                    let Ok(outbound) = outbound else {
                        return;
                    };
                    let (in_read, in_write) = inbound.into_split();
                    let (out_read, out_write) = outbound.into_split();
                    let up = tokio::spawn(Self::pump(
                        in_read,
                        out_write,
                        stalled_rx.clone(),
                        delay.clone(),
                        batch.clone(),
                    ));
                    let down =
                        tokio::spawn(Self::pump(out_read, in_write, stalled_rx, delay, batch));
                    let _ = cut_rx.recv().await;
                    up.abort();
                    down.abort();
                });
            }
        });
        FaultProxy {
            addr,
            target,
            cut,
            stalled,
            delay_ms,
            batch_ms,
        }
    }

    async fn pump(
        mut from: tokio::net::tcp::OwnedReadHalf,
        mut to: tokio::net::tcp::OwnedWriteHalf,
        mut stalled: tokio::sync::watch::Receiver<bool>,
        delay_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
        batch_ms: std::sync::Arc<std::sync::atomic::AtomicU64>,
    ) {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut buf = vec![0u8; 16 << 10];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => n,
            };
            let batch = batch_ms.load(std::sync::atomic::Ordering::Relaxed);
            if batch > 0 {
                // As a TLS-terminating balancer does: what arrives within the window leaves in
                // one write, so the peer reads several frames (a reply and a push) at once.
                let mut held = buf[..n].to_vec();
                let until = tokio::time::Instant::now() + Duration::from_millis(batch);
                let mut ended = false;
                while let Ok(read) = tokio::time::timeout_at(until, from.read(&mut buf)).await {
                    match read {
                        Ok(0) | Err(_) => {
                            ended = true;
                            break;
                        }
                        Ok(m) => held.extend_from_slice(&buf[..m]),
                    }
                }
                if to.write_all(&held).await.is_err() || ended {
                    return;
                }
                continue;
            }
            while *stalled.borrow_and_update() {
                if stalled.changed().await.is_err() {
                    return;
                }
            }
            let delay = delay_ms.load(std::sync::atomic::Ordering::Relaxed);
            if delay > 0 {
                // Latency injection is the point here, not synchronisation.
                tokio::time::sleep(Duration::from_millis(delay)).await;
            }
            if to.write_all(&buf[..n]).await.is_err() {
                return;
            }
        }
    }

    /// `wss://` when the host behind it serves TLS (clients pin that host's certificate).
    pub fn url(&self) -> String {
        let scheme = if pin_for_port(self.addr.port()).is_some() {
            "wss"
        } else {
            "ws"
        };
        format!("{scheme}://{}/racp", self.addr)
    }

    /// Drops every connection that goes through the proxy now.
    pub fn cut(&self) {
        let _ = self.cut.send(());
    }

    /// Holds (or releases) all traffic without closing anything, and that of connections made
    /// later.
    pub fn stall(&self, on: bool) {
        // `send` keeps the old value when no connection holds a receiver (between a client's
        // attempts): a release then would not reach the next connection.
        self.stalled.send_replace(on);
    }

    /// Adds `ms` of latency to every chunk forwarded in either direction (0 removes it).
    pub fn delay(&self, ms: u64) {
        self.delay_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// Holds what arrives for `ms` and forwards it in one write, in both directions (0: off).
    pub fn batch(&self, ms: u64) {
        self.batch_ms
            .store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// Sends new connections to another host address.
    pub fn retarget(&self, target: SocketAddr) {
        *self.target.lock().expect("target lock") = target;
    }
}

/// A process that took over a port a client expects its host on (docs/reliability.md §4.11):
/// it accepts connections, answers nothing useful, and records every byte it is sent. The TLS
/// flavour presents a certificate of its own and also records what it could decrypt.
pub struct Squatter {
    pub addr: SocketAddr,
    /// Raw bytes received, over all connections.
    received: Arc<Mutex<Vec<u8>>>,
    /// Bytes decrypted after a completed TLS handshake (TLS flavour only).
    plaintext: Arc<Mutex<Vec<u8>>>,
    connections: Arc<std::sync::atomic::AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
    /// The squatter's own certificate (TLS flavour).
    pub certificate: Option<TestCertificate>,
}

impl Squatter {
    /// A plain TCP listener on `addr` (e.g. a stopped host's port) that answers an HTTP upgrade
    /// as a host would, so a client that sends a credential would send it in full.
    pub async fn plain(addr: SocketAddr) -> Squatter {
        Squatter::start(addr, None).await
    }

    /// A TLS listener on `addr` with its own self-signed certificate.
    pub async fn tls(addr: SocketAddr) -> Squatter {
        Squatter::start(addr, Some(TestCertificate::localhost())).await
    }

    async fn start(addr: SocketAddr, certificate: Option<TestCertificate>) -> Squatter {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .expect("bind the squatter");
        let addr = listener.local_addr().expect("squatter address");
        let received = Arc::new(Mutex::new(Vec::new()));
        let plaintext = Arc::new(Mutex::new(Vec::new()));
        let connections = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let acceptor = certificate.as_ref().map(|certificate| {
            use tokio_rustls::rustls::pki_types::pem::PemObject;
            use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer};
            let certs = vec![CertificateDer::from_pem_file(&certificate.cert).expect("cert")];
            let key = PrivateKeyDer::from_pem_file(&certificate.key).expect("key");
            let provider = Arc::new(tokio_rustls::rustls::crypto::ring::default_provider());
            let config = tokio_rustls::rustls::ServerConfig::builder_with_provider(provider)
                .with_safe_default_protocol_versions()
                .expect("TLS versions")
                .with_no_client_auth()
                .with_single_cert(certs, key)
                .expect("squatter TLS config");
            tokio_rustls::TlsAcceptor::from(Arc::new(config))
        });
        let (task_received, task_plaintext, task_connections) =
            (received.clone(), plaintext.clone(), connections.clone());
        let task = tokio::spawn(async move {
            while let Ok((stream, _)) = listener.accept().await {
                task_connections.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let received = task_received.clone();
                let plaintext = task_plaintext.clone();
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    let recorder = Recorder {
                        inner: stream,
                        log: received,
                    };
                    let answer = b"HTTP/1.1 101 Switching Protocols\r\nUpgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Protocol: racp.v1\r\n\r\n";
                    match acceptor {
                        None => {
                            let mut recorder = recorder;
                            let mut buf = [0u8; 4096];
                            let mut answered = false;
                            while let Ok(n) = recorder.read(&mut buf).await {
                                if n == 0 {
                                    break;
                                }
                                if !answered {
                                    answered = true;
                                    let _ = recorder.write_all(answer).await;
                                }
                            }
                        }
                        Some(acceptor) => {
                            let Ok(mut tls) = acceptor.accept(recorder).await else {
                                return;
                            };
                            let mut buf = [0u8; 4096];
                            while let Ok(n) = tls.read(&mut buf).await {
                                if n == 0 {
                                    break;
                                }
                                plaintext
                                    .lock()
                                    .unwrap_or_else(|p| p.into_inner())
                                    .extend_from_slice(&buf[..n]);
                                let _ = tls.write_all(answer).await;
                            }
                        }
                    }
                });
            }
        });
        Squatter {
            addr,
            received,
            plaintext,
            connections,
            task,
            certificate,
        }
    }

    /// Every raw byte received so far.
    pub fn received(&self) -> Vec<u8> {
        self.received
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// What the TLS flavour could decrypt (empty unless a client finished the handshake).
    pub fn plaintext(&self) -> Vec<u8> {
        self.plaintext
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    pub fn connections(&self) -> usize {
        self.connections.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Asserts that nothing the squatter read carries a credential: no token, no
    /// `Authorization` header, no `racp.bearer.` subprotocol, no HTTP request at all.
    pub fn assert_got_no_credential(&self, tokens: &[&str]) {
        for (what, bytes) in [("raw", self.received()), ("decrypted", self.plaintext())] {
            let text = String::from_utf8_lossy(&bytes).to_ascii_lowercase();
            for needle in ["authorization", "racp.bearer.", "get /racp", "pdt_", "ppt_"] {
                assert!(
                    !text.contains(needle),
                    "the squatter read {needle:?} ({what}): {text:?}"
                );
            }
            for token in tokens {
                let (_, secret) = token.split_once('.').unwrap_or(("", token));
                assert!(
                    !text.contains(&secret.to_ascii_lowercase()),
                    "the squatter read a token ({what})"
                );
            }
        }
    }
}

impl Drop for Squatter {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A stream that appends everything read through it to a log.
struct Recorder {
    inner: TcpStream,
    log: Arc<Mutex<Vec<u8>>>,
}

impl tokio::io::AsyncRead for Recorder {
    fn poll_read(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = std::pin::Pin::new(&mut self.inner).poll_read(cx, buf);
        if let std::task::Poll::Ready(Ok(())) = &polled {
            let fresh = buf.filled()[before..].to_vec();
            self.log
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .extend_from_slice(&fresh);
        }
        polled
    }
}

impl tokio::io::AsyncWrite for Recorder {
    fn poll_write(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
        buf: &[u8],
    ) -> std::task::Poll<std::io::Result<usize>> {
        std::pin::Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_flush(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<std::io::Result<()>> {
        std::pin::Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A binary is rebuilt when any workspace package it links changed: pi-host's and the
    /// gateway's include racp-server, whose connection core both run.
    #[test]
    fn a_binary_is_built_from_every_workspace_package_it_depends_on() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).parent().unwrap();
        let sorted = |package: &str| {
            let mut crates = workspace_dependencies(root, package);
            crates.sort();
            crates
        };
        assert_eq!(sorted("pi-host"), ["pi-host", "racp-proto", "racp-server"]);
        assert_eq!(sorted("gateway"), ["gateway", "racp-proto", "racp-server"]);
        assert_eq!(sorted("tests"), ["bootstrap", "racp-proto", "tests"]);
        assert_eq!(
            dependency_names(
                "[package]\nname = \"x\"\n[dependencies]\n# a note\na.workspace = true\nb = { path = \"../b\" }\n[dev-dependencies]\nc = \"1\"\n"
            ),
            ["a", "b"]
        );
    }
}
