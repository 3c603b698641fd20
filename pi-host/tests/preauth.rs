//! Unauthenticated exhaustion (docs/reliability.md 4.10): peers that connect and never finish
//! their request (stalled, trickling, oversized headers, unfinished TLS handshakes) against a
//! host whose descriptor limit is low (soft and hard, so its own raise cannot escape it). A
//! device must still connect, the owner must still reach the admin socket, the stalled sockets
//! must be closed by the host, oversized headers get 431, and memory stays bounded.
//!
//! Set `RACP_FIGURES_DIR` to also write the measured figures as JSON there.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};
use tests::{Client, HostProcess, PATIENCE, record_figures};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::task::JoinSet;

/// RLIMIT_NOFILE (soft and hard) of the hosts under attack.
const FD_LIMIT: u32 = 256;
/// Stalled sockets per attack: several times what the host could hold before the fix.
const STALLED: usize = 1000;

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

/// A host started through `sh -c 'ulimit -n 256; exec pi-host "$@"'`: `ulimit -n` sets the soft
/// and the hard limit, so the host's raise to the hard limit stays at 256. Admin commands
/// (`host.cli`) run through the same wrapper.
async fn limited_host(extra: &[&str]) -> (HostProcess, tempfile::TempDir) {
    let wrapper_dir = tempfile::tempdir().unwrap();
    let wrapper = wrapper_dir.path().join("pi-host-limited");
    std::fs::write(
        &wrapper,
        format!(
            "#!/bin/sh\nulimit -n {FD_LIMIT} || exit 1\nexec '{}' \"$@\"\n",
            bin().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    // Info level: a debug log line per dropped connection would be most of the work.
    let host = HostProcess::start_with_env(&wrapper, extra, &[("PI_HOST_LOG", "info")]).await;
    let limits = std::fs::read_to_string(format!("/proc/{}/limits", host.pid())).unwrap();
    let files = limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .unwrap();
    let numbers: Vec<&str> = files.split_whitespace().skip(3).take(2).collect();
    assert_eq!(
        numbers,
        [FD_LIMIT.to_string(), FD_LIMIT.to_string()],
        "{files}"
    );
    (host, wrapper_dir)
}

/// How many attacking sockets this test process can hold beside its own needs.
fn own_fd_room() -> usize {
    let limits = std::fs::read_to_string("/proc/self/limits").unwrap_or_default();
    limits
        .lines()
        .find(|l| l.starts_with("Max open files"))
        .and_then(|l| l.split_whitespace().nth(3))
        .and_then(|soft| soft.parse::<usize>().ok())
        .unwrap_or(1024)
        .saturating_sub(256)
}

/// The host's resident memory (KiB) and open descriptors, sampled until `stop` is set.
struct Sampler {
    pid: u32,
    max_rss_kib: Arc<AtomicUsize>,
    max_fds: Arc<AtomicUsize>,
    stop: Arc<std::sync::atomic::AtomicBool>,
    task: tokio::task::JoinHandle<()>,
}

fn rss_kib(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn fd_count(pid: u32) -> usize {
    std::fs::read_dir(format!("/proc/{pid}/fd"))
        .map(|dir| dir.count())
        .unwrap_or(0)
}

impl Sampler {
    fn start(pid: u32) -> Sampler {
        let max_rss_kib = Arc::new(AtomicUsize::new(rss_kib(pid)));
        let max_fds = Arc::new(AtomicUsize::new(fd_count(pid)));
        let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let (rss, fds, done) = (max_rss_kib.clone(), max_fds.clone(), stop.clone());
        let task = tokio::spawn(async move {
            while !done.load(Ordering::Relaxed) {
                rss.fetch_max(rss_kib(pid), Ordering::Relaxed);
                fds.fetch_max(fd_count(pid), Ordering::Relaxed);
                // A sampling period, not a synchronisation.
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        });
        Sampler {
            pid,
            max_rss_kib,
            max_fds,
            stop,
            task,
        }
    }

    /// (peak RSS in KiB, peak descriptors).
    async fn finish(self) -> (usize, usize) {
        self.stop.store(true, Ordering::Relaxed);
        let _ = self.task.await;
        self.max_rss_kib
            .fetch_max(rss_kib(self.pid), Ordering::Relaxed);
        (
            self.max_rss_kib.load(Ordering::Relaxed),
            self.max_fds.load(Ordering::Relaxed),
        )
    }
}

/// What an attacking socket saw: connected or not, and after how long (from its connect) the
/// host closed it.
#[derive(Debug, Clone, Copy)]
struct Fate {
    connected: bool,
    closed_after: Option<Duration>,
}

/// Reads until the host closes (EOF or reset), at most `patience`.
async fn until_closed(stream: &mut TcpStream, patience: Duration) -> bool {
    let mut buf = [0u8; 1024];
    tokio::time::timeout(patience, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await
    .is_ok()
}

/// Connects `count` sockets that never send a byte (`hello` = None) or send `hello` and then
/// nothing; each task then waits for the host to close it. `settled` counts the connects that
/// are over (done or failed).
fn stall(
    attack: &mut JoinSet<Fate>,
    addr: std::net::SocketAddr,
    count: usize,
    hello: Option<&'static [u8]>,
    settled: &Arc<AtomicUsize>,
) {
    // Connects in flight at once: a burst, without exhausting the test's own ports or fds.
    let gate = Arc::new(tokio::sync::Semaphore::new(64));
    for _ in 0..count {
        let (gate, settled) = (gate.clone(), settled.clone());
        attack.spawn(async move {
            let permit = gate.acquire_owned().await.unwrap();
            let stream = tokio::time::timeout(PATIENCE, TcpStream::connect(addr)).await;
            drop(permit);
            settled.fetch_add(1, Ordering::Relaxed);
            let Ok(Ok(mut stream)) = stream else {
                return Fate {
                    connected: false,
                    closed_after: None,
                };
            };
            let start = Instant::now();
            if let Some(bytes) = hello {
                let _ = stream.write_all(bytes).await;
            }
            let closed = until_closed(&mut stream, PATIENCE).await;
            Fate {
                connected: true,
                closed_after: closed.then(|| start.elapsed()),
            }
        });
    }
}

/// Sends a request line and then one short header line every `every`, never finishing.
fn trickle(attack: &mut JoinSet<Fate>, addr: std::net::SocketAddr, count: usize, every: Duration) {
    for _ in 0..count {
        attack.spawn(async move {
            let Ok(mut stream) = TcpStream::connect(addr).await else {
                return Fate {
                    connected: false,
                    closed_after: None,
                };
            };
            let start = Instant::now();
            let _ = stream
                .write_all(b"GET /racp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
                .await;
            let mut buf = [0u8; 256];
            let closed = tokio::time::timeout(PATIENCE, async {
                let mut n = 0u64;
                loop {
                    // The trickle's pace is the attack itself, not a synchronisation.
                    tokio::select! {
                        read = stream.read(&mut buf) => match read {
                            Ok(0) | Err(_) => return,
                            Ok(_) => {}
                        },
                        _ = tokio::time::sleep(every) => {
                            n += 1;
                            if stream.write_all(format!("X-Slow-{n}: a\r\n").as_bytes()).await.is_err() {
                                return;
                            }
                        }
                    }
                }
            })
            .await
            .is_ok();
            Fate {
                connected: true,
                closed_after: closed.then(|| start.elapsed()),
            }
        });
    }
}

/// Waits (polling) until `n` attacking connects are over, or `PATIENCE / 2` has passed: a host
/// that stopped accepting leaves the rest in the kernel's queue, and the test goes on to show
/// what that does to a device. The device comes while the stalled sockets are held, not in the
/// middle of the burst of connects (docs/reliability.md 4.10 says why).
async fn wait_settled(settled: &AtomicUsize, n: usize) {
    let deadline = Instant::now() + PATIENCE / 2;
    while settled.load(Ordering::Relaxed) < n && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// The host kept descriptors in reserve throughout and never failed an accept for want of one.
fn kept_headroom(host: &HostProcess, peak_fds: usize) {
    let headroom = FD_LIMIT as usize - peak_fds;
    assert!(
        headroom >= 32,
        "the host used {peak_fds} of its {FD_LIMIT} descriptors"
    );
    let log = host.log();
    assert!(
        !log.contains("Too many open files"),
        "the host ran out of descriptors"
    );
}

/// Every attacking socket's fate, once all have been closed or given up on.
async fn fates(mut attack: JoinSet<Fate>) -> Vec<Fate> {
    let mut all = Vec::new();
    while let Some(fate) = attack.join_next().await {
        all.push(fate.unwrap());
    }
    all
}

/// Asserts every connected socket was closed by the host; returns figures about when.
fn all_closed(what: &str, fates: &[Fate]) -> Value {
    let connected: Vec<&Fate> = fates.iter().filter(|f| f.connected).collect();
    assert!(
        connected.len() * 10 >= fates.len() * 9,
        "{what}: only {} of {} connected",
        connected.len(),
        fates.len()
    );
    let open = connected
        .iter()
        .filter(|f| f.closed_after.is_none())
        .count();
    assert_eq!(
        open,
        0,
        "{what}: {open} of {} sockets still open after {PATIENCE:?}",
        connected.len()
    );
    let mut times: Vec<f64> = connected
        .iter()
        .filter_map(|f| f.closed_after)
        .map(|d| d.as_secs_f64())
        .collect();
    times.sort_by(f64::total_cmp);
    json!({
        "sockets": fates.len(),
        "connected": connected.len(),
        "closedWithin1s": times.iter().filter(|t| **t < 1.0).count(),
        "closedAfterSeconds": {
            "median": round(times[times.len() / 2]),
            "max": round(times[times.len() - 1]),
        },
    })
}

fn round(seconds: f64) -> f64 {
    (seconds * 100.0).round() / 100.0
}

/// A device connects, says hello and calls host/info, all within `PATIENCE`.
async fn device_gets_in(url: &str, token: &str) -> Duration {
    let start = Instant::now();
    let mut client = Client::connect(url, token)
        .await
        .unwrap_or_else(|refused| panic!("the device was refused: {refused:?}"));
    client.hello().await;
    let info = client.call("host/info", json!({})).await;
    assert!(info.get("result").is_some(), "{info}");
    start.elapsed()
}

/// `pi-host <args>` through the admin socket answers, within `PATIENCE`.
async fn admin_answers(host: &HostProcess, args: &[&str]) -> Duration {
    let start = Instant::now();
    let (ok, stdout, stderr) = tokio::time::timeout(PATIENCE, host.cli(args))
        .await
        .unwrap_or_else(|_| panic!("pi-host {args:?} hung"));
    assert!(ok, "pi-host {args:?} failed: {stdout} {stderr}");
    start.elapsed()
}

fn ms(d: Duration) -> u128 {
    d.as_millis()
}

#[tokio::test]
async fn stalled_and_trickling_sockets_neither_lock_out_a_device_nor_the_owner() {
    let (host, _wrapper) = limited_host(&[]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let (tablet, _) = host.pair_device("tablet", &[]).await;
    let stalled = STALLED.min(own_fd_room());
    let sampler = Sampler::start(host.pid());
    let rss_before = rss_kib(host.pid());

    let settled = Arc::new(AtomicUsize::new(0));
    let mut attack = JoinSet::new();
    stall(&mut attack, host.addr, stalled, None, &settled);
    let mut slow = JoinSet::new();
    trickle(&mut slow, host.addr, 50, Duration::from_millis(300));
    // Mid-attack: the stalled sockets (several times the host's descriptor limit) are held.
    wait_settled(&settled, stalled).await;

    let device = device_gets_in(&host.url(), &token).await;
    let revoke = admin_answers(&host, &["revoke", &tablet]).await;
    let status = admin_answers(&host, &["status", "--json"]).await;

    let stalled_fates = fates(attack).await;
    let slow_fates = fates(slow).await;
    let (peak_rss, peak_fds) = sampler.finish().await;
    kept_headroom(&host, peak_fds);
    let stalled_figures = all_closed("stalled", &stalled_fates);
    let slow_figures = all_closed("trickling", &slow_fates);
    // The host is still fine afterwards.
    device_gets_in(&host.url(), &token).await;
    assert!(host.log().contains("dropping the oldest"));
    record_figures(
        "preauth_stalled",
        &json!({
            "fdLimit": FD_LIMIT,
            "stalled": stalled_figures,
            "trickling": slow_figures,
            "deviceConnectHelloInfoMs": ms(device),
            "adminRevokeMs": ms(revoke),
            "adminStatusMs": ms(status),
            "hostPeakFds": peak_fds,
            "hostRssKiB": {"before": rss_before, "peak": peak_rss},
        }),
    );
}

/// Sends raw bytes, returns the host's answer: its head and `Content-Length` bytes of body, or
/// what came before the host closed (a reset included).
async fn answer_to(addr: std::net::SocketAddr, request: &[u8]) -> String {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    // The host may stop reading (and reset) once it has answered; the answer is what counts.
    let _ = stream.write_all(request).await;
    let mut answer = Vec::new();
    let complete = |answer: &[u8]| {
        let text = String::from_utf8_lossy(answer);
        let Some(end) = text.find("\r\n\r\n") else {
            return false;
        };
        let length = text[..end]
            .lines()
            .find_map(|l| {
                let (name, value) = l.split_once(':')?;
                name.eq_ignore_ascii_case("content-length")
                    .then(|| value.trim().parse::<usize>().ok())?
            })
            .unwrap_or(0);
        answer.len() >= end + 4 + length
    };
    let _ = tokio::time::timeout(PATIENCE, async {
        let mut buf = [0u8; 4096];
        while !complete(&answer) {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => answer.extend_from_slice(&buf[..n]),
            }
        }
    })
    .await;
    String::from_utf8_lossy(&answer).into_owned()
}

fn request_with_header(bytes: usize, finished: bool) -> Vec<u8> {
    let mut request = b"GET /racp HTTP/1.1\r\nHost: 127.0.0.1\r\nUpgrade: websocket\r\n\
        Connection: Upgrade\r\nSec-WebSocket-Version: 13\r\n\
        Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Protocol: racp.v1\r\n\
        X-Filler: "
        .to_vec();
    request.resize(request.len() + bytes, b'a');
    request.extend_from_slice(b"\r\n");
    if finished {
        request.extend_from_slice(b"\r\n");
    }
    request
}

#[tokio::test]
async fn slow_or_endless_requests_are_cut_off_and_oversized_headers_get_431_in_bounded_memory() {
    // Plain, so the hand-written requests reach the HTTP layer (the TLS path ahead of it is
    // bounded the same way: unfinished_tls_handshakes_are_bounded_and_cut_off).
    let (host, _wrapper) = limited_host(&["--plain"]).await;
    // Under the cap: an ordinary refusal (no token) — the cap leaves room for real requests.
    let small = answer_to(host.addr, &request_with_header(8 << 10, true)).await;
    assert!(small.starts_with("HTTP/1.1 401"), "{small:.200}");
    let large = answer_to(host.addr, &request_with_header(20 << 10, true)).await;
    assert!(large.starts_with("HTTP/1.1 431"), "{large:.200}");

    // 300 peers each send 300 KB of a header that never ends, all at once.
    let rss_before = rss_kib(host.pid());
    let sampler = Sampler::start(host.pid());
    let huge: &'static [u8] = Box::leak(request_with_header(300_000, false).into_boxed_slice());
    let mut attack = JoinSet::new();
    for _ in 0..300 {
        let addr = host.addr;
        attack.spawn(async move {
            let Ok(Ok(mut stream)) = tokio::time::timeout(PATIENCE, TcpStream::connect(addr)).await
            else {
                return (false, false);
            };
            let sent = tokio::time::timeout(PATIENCE, stream.write_all(huge)).await;
            let closed = until_closed(&mut stream, PATIENCE).await;
            (true, closed || matches!(sent, Ok(Err(_))))
        });
    }
    let mut results = Vec::new();
    while let Some(result) = attack.join_next().await {
        results.push(result.unwrap());
    }
    let (peak_rss, peak_fds) = sampler.finish().await;
    let connected = results.iter().filter(|(c, _)| *c).count();
    let closed = results.iter().filter(|(c, closed)| *c && *closed).count();
    assert_eq!(closed, connected, "every oversized request ends");
    let growth_kib = peak_rss.saturating_sub(rss_before);
    record_figures(
        "preauth_headers",
        &json!({
            "header8KiB": small.lines().next(),
            "header20KiB": large.lines().next(),
            "oversizedAttempts": results.len(),
            "connected": connected,
            "hostRssKiB": {"before": rss_before, "peak": peak_rss, "growth": growth_kib},
            "hostPeakFds": peak_fds,
        }),
    );
    assert!(
        growth_kib < 32 << 10,
        "RSS grew by {growth_kib} KiB ({rss_before} → {peak_rss})"
    );
    // Headers trickled a line at a time, and a kept-alive connection sending one complete
    // (refused) request every 2 s: fewer peers than the pre-upgrade bound, so none is dropped
    // to make room; the deadlines have to close them.
    let mut slow = JoinSet::new();
    trickle(&mut slow, host.addr, 20, Duration::from_millis(200));
    let endless = tokio::spawn(endless_requests(host.addr));
    let slow_figures = all_closed("trickling", &fates(slow).await);
    let (requests, closed_after) = endless.await.unwrap();
    let closed_after = closed_after.expect("the kept-alive connection is still open");
    // Past the header deadline: it took the deadline on the whole HTTP phase.
    assert!(requests > 2, "closed after {requests} requests");
    record_figures(
        "preauth_slow",
        &json!({
            "trickling": slow_figures,
            "keptAlive": {"requests": requests, "closedAfterSeconds": round(closed_after.as_secs_f64())},
        }),
    );

    // And the host still answers.
    let after = answer_to(host.addr, &request_with_header(100, true)).await;
    assert!(after.starts_with("HTTP/1.1 401"), "{after:.200}");
}

/// Over TLS with the test certificate: upgrades with `token`, makes `calls` in order and
/// returns their results, all within `PATIENCE`.
async fn tls_session(
    addr: std::net::SocketAddr,
    certificate: &tests::TestCertificate,
    token: &str,
    calls: &[(&str, Value)],
) -> Vec<Value> {
    use futures_util::{SinkExt, StreamExt};
    use tokio_rustls::rustls::{self, ClientConfig, RootCertStore, pki_types::ServerName};
    use tokio_tungstenite::tungstenite::{Message, client::IntoClientRequest, http::HeaderValue};
    let mut roots = RootCertStore::empty();
    roots.add(certificate.der.clone().into()).unwrap();
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(roots)
        .with_no_client_auth();
    let session = async {
        let tcp = TcpStream::connect(addr).await.unwrap();
        let tls = tokio_rustls::TlsConnector::from(Arc::new(config))
            .connect(ServerName::try_from("localhost").unwrap(), tcp)
            .await
            .expect("TLS handshake");
        let mut request = format!("wss://localhost:{}/racp", addr.port())
            .into_client_request()
            .unwrap();
        let headers = request.headers_mut();
        headers.insert(
            "Sec-WebSocket-Protocol",
            HeaderValue::from_static("racp.v1"),
        );
        let bearer = format!("Bearer {token}");
        headers.insert("Authorization", HeaderValue::from_str(&bearer).unwrap());
        let (mut ws, _) = tokio_tungstenite::client_async(request, tls)
            .await
            .expect("upgrade over TLS");
        let mut results = Vec::new();
        for (id, (method, params)) in calls.iter().enumerate() {
            let frame = json!({"id": id, "method": method, "params": params});
            ws.send(Message::Text(frame.to_string().into()))
                .await
                .unwrap();
            let reply = loop {
                match ws.next().await {
                    Some(Ok(Message::Text(text))) => {
                        let frame: Value = serde_json::from_str(text.as_str()).unwrap();
                        if frame["id"] == id {
                            break frame;
                        }
                    }
                    Some(Ok(_)) => {}
                    other => panic!("connection ended: {other:?}"),
                }
            };
            assert!(reply.get("result").is_some(), "{method}: {reply}");
            results.push(reply["result"].clone());
        }
        results
    };
    tokio::time::timeout(PATIENCE, session)
        .await
        .expect("the TLS session ended in time")
}

fn hello() -> (&'static str, Value) {
    (
        "hello",
        json!({"protocol": {"min": 1, "max": 1}, "client": {"name": "t", "version": "1"}}),
    )
}

/// A device connects over TLS, says hello and calls host/info.
async fn tls_device_gets_in(
    addr: std::net::SocketAddr,
    certificate: &tests::TestCertificate,
    token: &str,
) -> Duration {
    let start = Instant::now();
    tls_session(
        addr,
        certificate,
        token,
        &[hello(), ("host/info", json!({}))],
    )
    .await;
    start.elapsed()
}

#[tokio::test]
async fn unfinished_tls_handshakes_are_bounded_and_cut_off() {
    let certificate = tests::TestCertificate::localhost();
    let (host, _wrapper) = limited_host(&certificate.serve_args()).await;
    let pairing = host.pairing_token(&[]).await["token"]
        .as_str()
        .unwrap()
        .to_string();
    let stalled = (STALLED * 2 / 3).min(own_fd_room());
    let sampler = Sampler::start(host.pid());

    let settled = Arc::new(AtomicUsize::new(0));
    let mut attack = JoinSet::new();
    stall(&mut attack, host.addr, stalled, None, &settled);
    // The first bytes of a ClientHello (record header, handshake type, part of the length),
    // then nothing.
    stall(
        &mut attack,
        host.addr,
        50,
        Some(&[0x16, 0x03, 0x01, 0x02, 0x00, 0x01]),
        &settled,
    );
    wait_settled(&settled, stalled + 50).await;

    // While the stalled sockets are held: a device pairs over TLS (the harness pairs over
    // ws://), then connects with its new token.
    let paired = tls_session(
        host.addr,
        &certificate,
        &pairing,
        &[hello(), ("pair", json!({"deviceName": "laptop"}))],
    )
    .await;
    let token = paired[1]["deviceToken"].as_str().unwrap().to_string();
    let device = tls_device_gets_in(host.addr, &certificate, &token).await;
    let status = admin_answers(&host, &["status", "--json"]).await;

    let stalled_fates = fates(attack).await;
    let (peak_rss, peak_fds) = sampler.finish().await;
    kept_headroom(&host, peak_fds);
    let figures = all_closed("TLS stalled", &stalled_fates);
    tls_device_gets_in(host.addr, &certificate, &token).await;
    record_figures(
        "preauth_tls",
        &json!({
            "fdLimit": FD_LIMIT,
            "stalled": figures,
            "deviceTlsConnectHelloInfoMs": ms(device),
            "adminStatusMs": ms(status),
            "hostPeakFds": peak_fds,
            "hostPeakRssKiB": peak_rss,
        }),
    );
}

#[tokio::test]
async fn stalled_admin_clients_neither_block_the_owner_nor_stay_open() {
    let host = HostProcess::start(bin()).await;
    let socket = host.data_dir.path().join("admin.sock");
    // More than the admin socket serves at once, each connected and silent.
    let mut stalled = JoinSet::new();
    for _ in 0..20 {
        let mut stream = tokio::net::UnixStream::connect(&socket).await.unwrap();
        stalled.spawn(async move {
            let start = Instant::now();
            let mut buf = [0u8; 64];
            let closed = tokio::time::timeout(PATIENCE, async {
                while let Ok(n) = stream.read(&mut buf).await {
                    if n == 0 {
                        return;
                    }
                }
            })
            .await
            .is_ok();
            closed.then(|| start.elapsed())
        });
    }
    let status = admin_answers(&host, &["status", "--json"]).await;
    let mut closed_after = Vec::new();
    while let Some(closed) = stalled.join_next().await {
        closed_after.push(closed.unwrap().expect("a stalled admin client stayed open"));
    }
    closed_after.sort();
    record_figures(
        "preauth_admin",
        &json!({
            "stalledAdminClients": closed_after.len(),
            "statusMs": ms(status),
            "closedAfterSeconds": {
                "min": round(closed_after[0].as_secs_f64()),
                "max": round(closed_after[closed_after.len() - 1].as_secs_f64()),
            },
        }),
    );
}

/// One kept-alive connection sending a complete request every 2 s until the host closes it;
/// returns how many it sent and when (from its connect) it was closed.
async fn endless_requests(addr: std::net::SocketAddr) -> (usize, Option<Duration>) {
    let mut stream = TcpStream::connect(addr).await.unwrap();
    let start = Instant::now();
    // Each request is complete (and refused), so hyper's header timer restarts with each one;
    // only the deadline on the whole phase before the upgrade ends this.
    let request = request_with_header(16, true);
    let mut requests = 0;
    let closed = tokio::time::timeout(PATIENCE, async {
        let mut buf = [0u8; 4096];
        loop {
            if stream.write_all(&request).await.is_err() {
                return;
            }
            requests += 1;
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
            // The next request 2 s later (well inside the header deadline), unless the host
            // closes first: the pace of this client, not a synchronisation.
            if let Ok(Ok(0) | Err(_)) =
                tokio::time::timeout(Duration::from_secs(2), stream.read(&mut buf)).await
            {
                return;
            }
        }
    })
    .await;
    (requests, closed.is_ok().then(|| start.elapsed()))
}
