//! The operator's listener (docs/reliability.md, "Metrics and health"): a real host with the
//! stand-in agent and `--metrics-listen 127.0.0.1:0`, its address read from the state file;
//! the counters move with a turn, a CURSOR_EXPIRED, a CLIENT_TOO_SLOW cut and a revoke;
//! `/readyz` fails while the store refuses writes, and systemd is told `READY=1` only once it
//! passes; a real Prometheus scrapes a host and the gateway it is attached to.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::Path;
use std::time::Duration;
use tests::{Client, HostProcess};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

/// A host serving metrics on a port the OS picked, and where it serves them.
struct Observed {
    host: HostProcess,
    metrics: SocketAddr,
    _state_dir: tempfile::TempDir,
}

async fn start_host(extra: &[&str]) -> Observed {
    let state_dir = tempfile::tempdir().unwrap();
    let state_file = state_dir.path().join("state.json");
    let agent = tests::stand_in_agent();
    let mut args = vec![
        "--agent",
        agent.to_str().unwrap(),
        "--metrics-listen",
        "127.0.0.1:0",
        "--state-file",
        state_file.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    let host = HostProcess::start_with(bin(), &args).await;
    let state: Value = serde_json::from_slice(&std::fs::read(&state_file).unwrap()).unwrap();
    let metrics = state["metricsListen"].as_str().unwrap().parse().unwrap();
    Observed {
        host,
        metrics,
        _state_dir: state_dir,
    }
}

use tests::{http_get as get, series_value as value};

/// Scrapes until `series` satisfies `ok`, within the tests' patience.
async fn until_series(addr: SocketAddr, series: &str, ok: impl Fn(f64) -> bool) -> String {
    let deadline = tokio::time::Instant::now() + tests::PATIENCE;
    loop {
        let (status, text) = get(addr, "/metrics").await;
        assert_eq!(status, 200, "{text}");
        if ok(value(&text, series)) {
            return text;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{series} never reached the expected value:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Starts a turn of the stand-in agent's `text`; the host must take it.
async fn start_turn(
    client: &mut Client,
    session_id: &impl serde::Serialize,
    key: &str,
    text: impl Into<Value>,
) {
    let turn = json!({"sessionId": session_id, "idempotencyKey": key, "text": text.into()});
    let started = call(client, "turn/start", turn).await;
    assert!(started.get("result").is_some(), "{started}");
}

async fn call(client: &mut Client, method: &str, params: Value) -> Value {
    client.call(method, params).await
}

const DEVICES: &str = r#"pi_host_connections{kind="device"}"#;

#[tokio::test]
async fn counters_move_with_a_turn_an_expired_cursor_a_slow_cut_and_a_revoke() {
    // Plain, a short stall bound: the slow subscriber below is cut within a second.
    let o = start_host(&["--plain", "--send-stall-ms", "300"]).await;
    let (_, token) = o.host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&o.host.url(), &token).await.unwrap();
    client.hello().await;
    let text = until_series(o.metrics, DEVICES, |v| v == 1.0).await;
    // The pairing connection's hello and pair, then the device's hello.
    let hellos = r#"pi_host_calls_total{method="hello",code="ok"}"#;
    assert_eq!(value(&text, hellos), 2.0, "{text}");
    let pairs = r#"pi_host_calls_total{method="pair",code="ok"}"#;
    assert_eq!(value(&text, pairs), 1.0, "{text}");
    let before = value(&text, "pi_host_events_appended_total");

    // A turn: calls by method, events committed.
    let created = call(
        &mut client,
        "session/create",
        json!({"workspace": o.host.workspace("w")}),
    )
    .await;
    let session = created["result"]["session"].clone();
    let session_id = session["sessionId"].as_str().unwrap().to_string();
    let start = session["cursor"].clone();
    call(
        &mut client,
        "session/subscribe",
        json!({"sessionId": session_id, "cursor": start}),
    )
    .await;
    start_turn(&mut client, &session_id, "k1", "deltas:3").await;
    let events = client
        .events_until(tests::PATIENCE, |e| e["type"] == "turn.finished")
        .await;
    let text = until_series(o.metrics, "pi_host_events_appended_total", |v| {
        v >= before + events.len() as f64
    })
    .await;
    let turns = r#"pi_host_calls_total{method="turn/start",code="ok"}"#;
    assert_eq!(value(&text, turns), 1.0, "{text}");
    // The turn's latency, commits, deliveries, the subscription and the agent it started.
    let took = r#"pi_host_request_seconds_count{method="turn/start"}"#;
    assert_eq!(value(&text, took), 1.0, "{text}");
    assert!(
        value(&text, "pi_host_commit_seconds_count") >= 1.0,
        "{text}"
    );
    let text = until_series(o.metrics, "pi_host_events_delivered_total", |v| {
        v >= events.len() as f64
    })
    .await;
    let owners = r#"pi_host_subscriptions{role="owner"}"#;
    assert_eq!(value(&text, owners), 1.0, "{text}");
    assert_eq!(value(&text, "pi_host_agents_started_total"), 1.0, "{text}");
    assert_eq!(value(&text, "pi_host_agents_running"), 1.0, "{text}");
    assert!(value(&text, "pi_host_agents_rss_bytes") > 0.0, "{text}");
    assert!(value(&text, "pi_host_store_bytes") > 0.0, "{text}");

    // An approval answered: settled, counted by its outcome.
    start_turn(&mut client, &session_id, "k0", "approve:confirm").await;
    let asked = client
        .events_until(tests::PATIENCE, |e| e["type"] == "approval.requested")
        .await;
    let approval_id = asked.last().unwrap()["data"]["approvalId"].clone();
    let allow = json!({"approvalId": approval_id, "decision": "allow"});
    let allowed = call(&mut client, "approval/respond", allow).await;
    assert!(allowed.get("result").is_some(), "{allowed}");
    let events = client
        .events_until(tests::PATIENCE, |e| e["type"] == "turn.finished")
        .await;
    let settled = r#"pi_host_approvals_settled_total{outcome="allowed"}"#;
    until_series(o.metrics, settled, |v| v == 1.0).await;

    // A cursor the host never gave out: CURSOR_EXPIRED, counted by method and code and alone.
    let (epoch, _) = start.as_str().unwrap().rsplit_once('-').unwrap();
    let ahead = json!({"sessionId": session_id, "cursor": format!("{epoch}-1000000")});
    let expired = call(&mut client, "session/subscribe", ahead).await;
    assert_eq!(expired["error"]["code"], "CURSOR_EXPIRED", "{expired}");
    let text = until_series(o.metrics, "pi_host_cursor_expired_total", |v| v == 1.0).await;
    let refused = r#"pi_host_calls_total{method="session/subscribe",code="CURSOR_EXPIRED"}"#;
    assert_eq!(value(&text, refused), 1.0, "{text}");

    // A subscriber that stops reading while big events come: CLIENT_TOO_SLOW.
    let mut slow = Client::connect(&o.host.url(), &token).await.unwrap();
    slow.hello().await;
    let sub = json!({"sessionId": session_id, "cursor": events.last().unwrap()["cursor"]});
    assert!(
        call(&mut slow, "session/subscribe", sub)
            .await
            .get("result")
            .is_some()
    );
    let big = "big:60000 ".repeat(40);
    start_turn(&mut client, &session_id, "k2", big).await;
    // Both subscribers stopped reading (this test reads neither): both are cut.
    until_series(o.metrics, "pi_host_client_too_slow_total", |v| v >= 1.0).await;
    until_series(o.metrics, DEVICES, |v| v == 0.0).await;
    drop(slow);
    let mut client = Client::connect(&o.host.url(), &token).await.unwrap();
    client.hello().await;

    // A revoke: the call counted, the revoked device's connection gone.
    let (second_id, second_token) = o.host.pair_device("phone", &[]).await;
    let mut second = Client::connect(&o.host.url(), &second_token).await.unwrap();
    second.hello().await;
    until_series(o.metrics, DEVICES, |v| v == 2.0).await;
    let revoked = call(&mut client, "device/revoke", json!({"deviceId": second_id})).await;
    assert!(revoked.get("result").is_some(), "{revoked}");
    let text = until_series(o.metrics, DEVICES, |v| v == 1.0).await;
    let revokes = r#"pi_host_calls_total{method="device/revoke",code="ok"}"#;
    assert_eq!(value(&text, revokes), 1.0, "{text}");
    // A session closed: its agent stopped, counted.
    let closed = call(
        &mut client,
        "session/close",
        json!({"sessionId": session_id}),
    )
    .await;
    assert!(closed.get("result").is_some(), "{closed}");
    let text = until_series(o.metrics, "pi_host_agents_stopped_total", |v| v == 1.0).await;
    // Nothing that names a device, a path or a prompt is a label.
    for secret in [second_id.as_str(), session_id.as_str(), "deltas:3", "big:"] {
        assert!(!text.contains(secret), "{secret} in the metrics:\n{text}");
    }
}

/// Makes the store's directory refuse writes, as root too (the immutable attribute), and
/// undoes it.
struct ReadOnly(std::path::PathBuf);

impl ReadOnly {
    fn make(path: &Path) -> ReadOnly {
        let done = if nix_is_root() {
            std::process::Command::new("chattr")
                .arg("+i")
                .arg(path)
                .status()
                .unwrap()
                .success()
        } else {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o500)).is_ok()
        };
        assert!(done, "cannot make {} read-only", path.display());
        ReadOnly(path.to_path_buf())
    }
}

impl Drop for ReadOnly {
    fn drop(&mut self) {
        if nix_is_root() {
            let _ = std::process::Command::new("chattr")
                .arg("-i")
                .arg(&self.0)
                .status();
        } else {
            use std::os::unix::fs::PermissionsExt;
            let _ = std::fs::set_permissions(&self.0, std::fs::Permissions::from_mode(0o700));
        }
    }
}

fn nix_is_root() -> bool {
    std::fs::read_to_string("/proc/self/status")
        .unwrap()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|ids| ids.split_whitespace().nth(1).map(|uid| uid == "0"))
        .unwrap()
}

async fn ready(addr: SocketAddr) -> (u16, Value) {
    let (status, body) = get(addr, "/readyz").await;
    (status, serde_json::from_str(&body).unwrap())
}

fn check<'a>(body: &'a Value, name: &str) -> &'a Value {
    body["checks"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["name"] == name)
        .unwrap_or_else(|| panic!("no {name} check in {body}"))
}

#[tokio::test]
async fn readyz_fails_while_the_store_refuses_writes_and_recovers() {
    let o = start_host(&[]).await;
    assert_eq!(get(o.metrics, "/livez").await.0, 200);
    // The first agent check runs in the background: ready once it is done.
    let deadline = tokio::time::Instant::now() + tests::PATIENCE;
    let body = loop {
        let (status, body) = ready(o.metrics).await;
        if status == 200 {
            break body;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "never ready: {body}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    assert_eq!(check(&body, "store")["ok"], true, "{body}");
    assert_eq!(check(&body, "agent")["ok"], true, "{body}");
    assert!(
        body["checks"].as_array().unwrap().len() == 2,
        "no nats without a gateway: {body}"
    );

    let read_only = ReadOnly::make(o.host.data_dir.path());
    let (status, body) = ready(o.metrics).await;
    assert_eq!(status, 503, "{body}");
    assert_eq!(check(&body, "store")["ok"], false, "{body}");
    assert_eq!(check(&body, "agent")["ok"], true, "{body}");
    // The host still serves: livez says the process answers.
    assert_eq!(get(o.metrics, "/livez").await.0, 200);
    drop(read_only);
    let (status, body) = ready(o.metrics).await;
    assert_eq!(status, 200, "{body}");
}

/// The next state the host sends systemd's socket, within the tests' patience.
async fn next_state(socket: &tokio::net::UnixDatagram) -> String {
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(tests::PATIENCE, socket.recv(&mut buf))
        .await
        .expect("no state sent to the notify socket in time")
        .unwrap();
    String::from_utf8(buf[..n].to_vec()).unwrap()
}

/// States sent until one `wanted` takes; none before it may hold `refused`.
async fn until_state(
    socket: &tokio::net::UnixDatagram,
    wanted: impl Fn(&str) -> bool,
    refused: &str,
) -> String {
    loop {
        let state = next_state(socket).await;
        if wanted(&state) {
            return state;
        }
        assert!(!state.contains(refused), "{refused} too early: {state}");
    }
}

/// systemd's readiness (deploy/pi-host.service is `Type=notify`): the host started by it sends
/// `READY=1` only once `/readyz`'s checks pass, naming the failing checks in `STATUS=` until
/// then; its agents do not see the socket; SIGTERM sends `STOPPING=1`.
#[tokio::test]
async fn systemd_is_told_ready_only_once_readyz_passes_and_stopping_at_the_drain() {
    let dir = tempfile::tempdir().unwrap();
    let notify = dir.path().join("notify");
    let socket = tokio::net::UnixDatagram::bind(&notify).unwrap();
    // The agent is not installed yet: the `agent` check fails.
    let agent = dir.path().join("agent");
    let state_file = dir.path().join("state.json");
    let args = [
        "--agent",
        agent.to_str().unwrap(),
        "--metrics-listen",
        "127.0.0.1:0",
        "--state-file",
        state_file.to_str().unwrap(),
    ];
    let env = [("NOTIFY_SOCKET", notify.to_str().unwrap())];
    let host = HostProcess::start_with_env(bin(), &args, &env).await;
    let state: Value = serde_json::from_slice(&std::fs::read(&state_file).unwrap()).unwrap();
    let metrics: SocketAddr = state["metricsListen"].as_str().unwrap().parse().unwrap();
    let first = next_state(&socket).await;
    assert!(first.starts_with("STATUS=not ready: agent: "), "{first}");
    assert_eq!(ready(metrics).await.0, 503);

    // The agent installed while the store refuses writes: the status names the store alone.
    let read_only = ReadOnly::make(host.data_dir.path());
    let copy = dir.path().join("agent.new");
    std::fs::copy(tests::stand_in_agent(), &copy).unwrap();
    std::fs::rename(&copy, &agent).unwrap();
    let store = until_state(&socket, |s| !s.contains("agent: "), "READY=1").await;
    assert!(store.starts_with("STATUS=not ready: store: "), "{store}");
    assert_eq!(ready(metrics).await.0, 503);

    // The store writable again: READY=1, when `/readyz` answers 200.
    drop(read_only);
    let told = until_state(&socket, |s| s.contains("READY=1"), "STOPPING=1").await;
    assert_eq!(told, "READY=1\nSTATUS=ready");
    let (status, body) = ready(metrics).await;
    assert_eq!(status, 200, "{body}");

    // An agent the host runs does not see the socket.
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let workspace = json!({"workspace": host.workspace("w")});
    let created = call(&mut client, "session/create", workspace).await;
    let session_id = created["result"]["session"]["sessionId"].clone();
    let subscribed = json!({"sessionId": session_id});
    call(&mut client, "session/subscribe", subscribed).await;
    start_turn(&mut client, &session_id, "k", "whoami").await;
    let events = client
        .events_until(tests::PATIENCE, |e| e["type"] == "turn.finished")
        .await;
    let whoami = events
        .iter()
        .find(|e| e["type"] == "agent.stand_in_whoami")
        .expect("the agent said who it is");
    assert!(whoami["data"]["cwd"].is_string(), "{whoami}");
    assert_eq!(whoami["data"]["notifySocket"], Value::Null, "{whoami}");

    // SIGTERM: the drain begins with STOPPING=1.
    host.sigterm();
    let stopping = until_state(&socket, |s| s.contains("STOPPING=1"), "READY=1").await;
    assert!(stopping.starts_with("STOPPING=1"), "{stopping}");
}

#[tokio::test]
async fn a_metrics_address_off_loopback_needs_the_flag() {
    let data = tempfile::tempdir().unwrap();
    let out = tokio::process::Command::new(bin())
        .args(["serve", "--plain", "--listen", "127.0.0.1:0"])
        .args(["--metrics-listen", "0.0.0.0:0", "--data-dir"])
        .arg(data.path())
        .output();
    let out = tokio::time::timeout(tests::PATIENCE, out)
        .await
        .unwrap()
        .unwrap();
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("--metrics-allow-remote"), "{stderr}");
}

/// A Prometheus server (Debian's) scraping `target` every second, on a port of its own.
struct Prometheus {
    _child: tokio::process::Child,
    api: SocketAddr,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scrapes each `(job, target)`.
    async fn start(targets: &[(&str, SocketAddr)]) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let config = dir.path().join("prometheus.yml");
        let mut scrape =
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n".to_string();
        for (job, target) in targets {
            scrape.push_str(&format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n"
            ));
        }
        std::fs::write(&config, scrape).unwrap();
        // Prometheus takes an address, not a socket: a port the OS had free a moment ago.
        let api = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap();
        let child = tokio::process::Command::new("/usr/bin/prometheus")
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={api}"))
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .expect("Debian's prometheus at /usr/bin/prometheus (scripts/test installs it)");
        Prometheus {
            _child: child,
            api,
            _dir: dir,
        }
    }

    /// The instant query's result vector once it holds a series `ok` accepts.
    async fn until(&self, query: &str, ok: impl Fn(&Value) -> bool) -> Value {
        let deadline = tokio::time::Instant::now() + tests::PATIENCE;
        loop {
            let answer = match tokio::net::TcpStream::connect(self.api).await {
                Ok(_) => {
                    let (status, body) =
                        get(self.api, &format!("/api/v1/query?query={query}")).await;
                    (status == 200).then(|| serde_json::from_str::<Value>(&body).unwrap())
                }
                Err(_) => None,
            };
            let result = answer.map(|a| a["data"]["result"].clone());
            if let Some(result) = result.filter(|r| r.as_array().is_some_and(|r| r.iter().any(&ok)))
            {
                return result;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "Prometheus never had {query}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// A host and a gateway it is attached to, both serving metrics, and a session streamed
/// through the gateway (so the gateway's series hold a host's stream).
struct Attached {
    _fleet: tests::gateway::Fleet,
    gateway: tests::gateway::GatewayProcess,
    host: HostProcess,
    host_metrics: SocketAddr,
    _state_dir: tempfile::TempDir,
}

async fn attached() -> Attached {
    assert!(
        tests::nats::available(),
        "nats-server is not installed: scripts/test installs it"
    );
    let mut fleet = tests::gateway::Fleet::new(1, 1, 1, 3600).await;
    let gateway = fleet
        .gateway_with(&["--metrics-listen", "127.0.0.1:0"])
        .await;
    let state_dir = tempfile::tempdir().unwrap();
    let state_file = state_dir.path().join("state.json");
    let state_arg = state_file.to_str().unwrap();
    let args = ["--metrics-listen", "127.0.0.1:0", "--state-file", state_arg];
    let (host, host_id) = fleet.host(&args).await;
    let state: Value = serde_json::from_slice(&std::fs::read(&state_file).unwrap()).unwrap();
    let host_metrics = state["metricsListen"].as_str().unwrap().parse().unwrap();
    let (_, token) = gateway.pair_device("owner", &[]).await;
    let mut root = Client::connect(&gateway.url(), &token).await.unwrap();
    root.hello().await;
    tests::gateway::until_online(&mut root, &host_id).await;
    let mut desk = Client::connect(&gateway.host_url(&host_id), &token)
        .await
        .unwrap();
    desk.hello().await;
    let workspace = json!({"workspace": host.workspace("w")});
    let created = call(&mut desk, "session/create", workspace).await;
    assert!(created.get("result").is_some(), "{created}");
    Attached {
        _fleet: fleet,
        gateway,
        host,
        host_metrics,
        _state_dir: state_dir,
    }
}

#[tokio::test]
async fn a_prometheus_server_scrapes_a_host_and_a_gateway_and_answers_their_series() {
    let a = attached().await;
    let gateway_metrics = a.gateway.metrics.expect("the gateway's metrics address");
    let (_, token) = a.host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&a.host.url(), &token).await.unwrap();
    client.hello().await;
    let prometheus =
        Prometheus::start(&[("pi-host", a.host_metrics), ("pi-gateway", gateway_metrics)]).await;
    let devices = prometheus
        .until("pi_host_connections", |s| {
            s["metric"]["kind"] == "device" && s["value"][1] == "1"
        })
        .await;
    assert_eq!(devices[0]["metric"]["job"], "pi-host", "{devices}");
    let calls = prometheus
        .until("pi_host_calls_total", |s| {
            s["metric"]["method"] == "pair" && s["metric"]["code"] == "ok"
        })
        .await;
    assert!(!calls.as_array().unwrap().is_empty());
    prometheus
        .until("pi_host_sandbox_enforced", |s| s["value"][1].is_string())
        .await;
    // The gateway's: its NATS link, and the host's stream against its limit.
    let nats = prometheus
        .until("pi_gateway_nats_connected", |s| s["value"][1] == "1")
        .await;
    assert_eq!(nats[0]["metric"]["job"], "pi-gateway", "{nats}");
    let limit = prometheus
        .until("pi_gateway_host_stream_max_bytes", |s| {
            s["value"][1].as_str().is_some_and(|v| v != "0")
        })
        .await;
    let host = &limit[0]["metric"]["host"];
    prometheus
        .until("pi_gateway_host_stream_bytes", |s| {
            s["metric"]["host"] == *host
        })
        .await;
    prometheus
        .until(r#"pi_gateway_calls_total{method="session/create"}"#, |s| {
            s["value"][1] == "1"
        })
        .await;
}

/// Every series name deploy/grafana-dashboard.json queries (`pi_host_…`, `pi_gateway_…`).
fn dashboard_series() -> Vec<String> {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/grafana-dashboard.json");
    let dashboard: Value = serde_json::from_slice(&std::fs::read(path).unwrap()).unwrap();
    let mut names = Vec::new();
    for panel in dashboard["panels"].as_array().unwrap() {
        for target in panel["targets"].as_array().into_iter().flatten() {
            let expr = target["expr"].as_str().unwrap();
            for (at, _) in expr.match_indices("pi_") {
                let name: String = expr[at..]
                    .chars()
                    .take_while(|c| c.is_ascii_lowercase() || *c == '_')
                    .collect();
                if name.starts_with("pi_host_") || name.starts_with("pi_gateway_") {
                    names.push(name);
                }
            }
        }
    }
    assert!(!names.is_empty(), "the dashboard queries no series");
    names
}

/// Whether a scrape exports `name`: its family's TYPE line, under the name a sample has less
/// its suffix (`_total`, `_bucket`, `_sum`, `_count`).
fn exported(text: &str, name: &str) -> bool {
    let family = ["_total", "_bucket", "_sum", "_count"]
        .iter()
        .find_map(|suffix| name.strip_suffix(suffix))
        .unwrap_or(name);
    text.lines()
        .any(|line| line.starts_with(&format!("# TYPE {family} ")))
}

/// deploy/: the dashboard asks only for series a real host and gateway export, and
/// prometheus.yml is a valid configuration (promtool, where Debian's prometheus installed it).
#[tokio::test]
async fn the_dashboard_queries_series_a_host_and_a_gateway_export() {
    let a = attached().await;
    let gateway_metrics = a.gateway.metrics.expect("the gateway's metrics address");
    // The series read at a scrape are there from the start; the per-call ones after a call.
    let (_, token) = a.host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&a.host.url(), &token).await.unwrap();
    client.hello().await;
    let listed = call(&mut client, "session/list", json!({})).await;
    assert!(listed.get("result").is_some(), "{listed}");
    // The gateway reads its streams' sizes and its feeds' lag from NATS at the scrape, within a
    // bound (2 s): on a loaded machine one scrape may go without them, the next has them.
    let deadline = std::time::Instant::now() + tests::PATIENCE;
    loop {
        let (_, host_text) = get(a.host_metrics, "/metrics").await;
        let (_, gateway_text) = get(gateway_metrics, "/metrics").await;
        let missing: Vec<String> = dashboard_series()
            .into_iter()
            .filter(|name| {
                let text = if name.starts_with("pi_host_") {
                    &host_text
                } else {
                    &gateway_text
                };
                !exported(text, name)
            })
            .collect();
        if missing.is_empty() {
            break;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "not exported: {missing:?}\nhost:\n{host_text}\ngateway:\n{gateway_text}"
        );
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let promtool = Path::new("/usr/bin/promtool");
    if promtool.exists() {
        let config = Path::new(env!("CARGO_MANIFEST_DIR")).join("../deploy/prometheus.yml");
        let checked = std::process::Command::new(promtool)
            .args(["check", "config"])
            .arg(&config)
            .output()
            .unwrap();
        assert!(
            checked.status.success(),
            "{}",
            String::from_utf8_lossy(&checked.stderr)
        );
    }
}
