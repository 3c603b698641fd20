//! Security properties against a real host: the Host and Origin matrix, guessing tokens, the
//! pairing race, how fast a revoked device loses its sockets, path escapes, secrets kept out
//! of logs, argv and environments, the modes of the files that hold secrets, an observer's
//! reads that start no agent, and a key replaced during a turn kept out of it.
//!
//! Set `RACP_FIGURES_DIR` to also write the measured figures as JSON there.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use serde_json::{Value, json};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};
use tests::{Client, FaultProxy, HostProcess, PATIENCE, Upgrade, record_figures};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn bin() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_pi-host"))
}

fn secret_of(token: &str) -> &str {
    token.split_once('.').map(|(_, secret)| secret).unwrap()
}

/// Sends a hand-written HTTP request; returns the status and the JSON body (if any).
async fn raw_request(host: &HostProcess, request: String) -> (u16, Value) {
    let mut stream = host.stream().await;
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut buffer = Vec::new();
    let read = async {
        let mut chunk = [0u8; 4096];
        loop {
            let n = stream.read(&mut chunk).await.unwrap_or(0);
            if n == 0 {
                break;
            }
            buffer.extend_from_slice(&chunk[..n]);
            let text = String::from_utf8_lossy(&buffer);
            if let Some(end) = text.find("\r\n\r\n") {
                let length = text[..end]
                    .lines()
                    .find_map(|l| {
                        let (name, value) = l.split_once(':')?;
                        name.eq_ignore_ascii_case("content-length")
                            .then(|| value.trim().parse::<usize>().ok())?
                    })
                    .unwrap_or(0);
                if buffer.len() >= end + 4 + length || text.starts_with("HTTP/1.1 101") {
                    break;
                }
            }
        }
    };
    tokio::time::timeout(PATIENCE, read)
        .await
        .expect("an HTTP answer");
    let text = String::from_utf8_lossy(&buffer).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    let body = text
        .split_once("\r\n\r\n")
        .and_then(|(_, b)| serde_json::from_str(b).ok())
        .unwrap_or(Value::Null);
    (status, body)
}

fn upgrade_request(headers: &[(&str, &str)]) -> String {
    let mut request = String::from(
        "GET /racp HTTP/1.1\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\
         Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
         Sec-WebSocket-Protocol: racp.v1\r\n",
    );
    for (name, value) in headers {
        request.push_str(&format!("{name}: {value}\r\n"));
    }
    request.push_str("\r\n");
    request
}

#[tokio::test]
async fn the_host_and_origin_matrix() {
    let host = HostProcess::start_with(
        bin(),
        &[
            "--allow-host",
            "box.lan",
            "--allow-origin",
            "https://app.example",
        ],
    )
    .await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let url = host.url();
    let attempt = |host_header: Option<&'static str>, origin: Option<&'static str>| {
        let url = url.clone();
        let token = token.clone();
        async move {
            let options = Upgrade {
                bearer: Some(&token),
                host: host_header,
                origin,
                ..Upgrade::default()
            };
            match Client::upgrade(&url, options).await {
                Ok(_) => Ok(()),
                Err(refused) => Err((refused.status, refused.body)),
            }
        }
    };
    let accepted_hosts = [
        "127.0.0.1",
        "127.0.0.1:7878",
        "127.8.9.10:1",
        "127.255.255.254",
        "[::1]",
        "[::1]:7878",
        "localhost",
        "localhost:7878",
        "LOCALHOST:80",
        "LocalHost",
        "box.lan",
        "box.lan:7878",
        "BOX.LAN",
    ];
    let refused_hosts = [
        "localhost6",
        "localhost.localdomain",
        "localhost.",
        "localhost:",
        "localhost:abc",
        "localhost:123456",
        "localhost.evil.example",
        "evil-localhost",
        "127.1",
        "127.0.1",
        "2130706433",
        "0177.0.0.1",
        "0x7f.0.0.1",
        "0x7f000001",
        "127.0.0.01",
        "127.0.0.256",
        "127.0.0.1.",
        "127.0.0.1.nip.io",
        "128.0.0.1",
        "0.0.0.0",
        "::1",
        "[::1",
        "[::2]",
        "[0:0:0:0:0:0:0:1]",
        "[::ffff:127.0.0.1]",
        "[::1]x",
        "example.com",
        "192.168.1.5:7878",
        "box.lan.evil.example",
        "box.lan@evil.example",
        "evil.example#127.0.0.1",
    ];
    let mut figures = serde_json::Map::new();
    for name in accepted_hosts {
        attempt(Some(name), None)
            .await
            .unwrap_or_else(|e| panic!("Host {name} refused: {e:?}"));
    }
    for name in refused_hosts {
        let (status, body) = attempt(Some(name), None)
            .await
            .err()
            .unwrap_or_else(|| panic!("Host {name} accepted"));
        assert_eq!(status, 403, "{name}: {body}");
        assert_eq!(body["error"]["code"], "FORBIDDEN", "{name}");
        assert_eq!(body["error"]["details"]["reason"], "host_not_allowed");
    }
    // Hosts a client library will not send: none, empty, two.
    let bearer = format!("Bearer {token}");
    for (what, headers) in [
        ("no Host", vec![("Authorization", bearer.as_str())]),
        (
            "empty Host",
            vec![("Host", ""), ("Authorization", bearer.as_str())],
        ),
        (
            "two Hosts",
            vec![
                ("Host", "127.0.0.1"),
                ("Host", "evil.example"),
                ("Authorization", bearer.as_str()),
            ],
        ),
        (
            "two Origins, the allowed one first",
            vec![
                ("Host", "127.0.0.1"),
                ("Origin", "https://app.example"),
                ("Origin", "https://evil.example"),
                ("Authorization", bearer.as_str()),
            ],
        ),
        (
            "two Hosts, evil first",
            vec![
                ("Host", "evil.example"),
                ("Host", "127.0.0.1"),
                ("Authorization", bearer.as_str()),
            ],
        ),
    ] {
        let (status, body) = raw_request(&host, upgrade_request(&headers)).await;
        assert!(
            (400..500).contains(&status),
            "{what} was not refused: {status} {body}"
        );
        figures.insert(what.into(), json!(status));
    }

    let accepted_origins = [None, Some("https://app.example")];
    let refused_origins = [
        "https://evil.example",
        "https://app.example.evil.example",
        "https://evil.example/https://app.example",
        "http://app.example",
        "https://app.example:443",
        "https://app.example/",
        "https://APP.example",
        "null",
        "",
        "file://",
        "http://localhost",
        "http://127.0.0.1:7878",
    ];
    for origin in accepted_origins {
        attempt(None, origin)
            .await
            .unwrap_or_else(|e| panic!("Origin {origin:?} refused: {e:?}"));
    }
    for origin in refused_origins {
        let (status, body) = attempt(None, Some(origin))
            .await
            .err()
            .unwrap_or_else(|| panic!("Origin {origin:?} accepted"));
        assert_eq!(status, 403, "{origin}: {body}");
        assert_eq!(body["error"]["details"]["reason"], "origin_not_allowed");
    }
    // A page refused for its Host or Origin learns nothing about tokens: the same refusal with
    // a valid token, a wrong one, or none.
    for bearer in [Some(token.as_str()), Some("pdt_x.y"), None] {
        let options = Upgrade {
            bearer,
            origin: Some("https://evil.example"),
            ..Upgrade::default()
        };
        let refused = Client::upgrade(&url, options).await.err().unwrap();
        assert_eq!(
            refused.body["error"]["details"]["reason"],
            "origin_not_allowed"
        );
    }
    figures.insert("acceptedHosts".into(), json!(accepted_hosts.len()));
    figures.insert("refusedHosts".into(), json!(refused_hosts.len()));
    figures.insert("refusedOrigins".into(), json!(refused_origins.len()));
    record_figures("security_host_origin", &Value::Object(figures));
}

#[tokio::test]
async fn guessing_tokens_gets_nowhere() {
    let host = HostProcess::start(bin()).await;
    let (device_id, token) = host.pair_device("laptop", &[]).await;

    // Device tokens: 256-bit secrets. A guess for a real device, for an unknown one and a
    // malformed token are refused alike, and the real device is never locked out.
    let guesses = 300;
    let started = Instant::now();
    let mut bodies = std::collections::BTreeSet::new();
    for i in 0..guesses {
        let guess = match i % 3 {
            0 => format!("pdt_{device_id}.{}", "A".repeat(43)),
            1 => format!("pdt_dev_nobody{i}.{}", "B".repeat(43)),
            _ => format!("garbage {i}"),
        };
        let refused = Client::connect(&host.url(), &guess).await.err().unwrap();
        assert_eq!(refused.status, 401);
        bodies.insert(refused.body.to_string());
    }
    let per_second = f64::from(guesses) / started.elapsed().as_secs_f64();
    assert_eq!(bodies.len(), 1, "refusals differ: {bodies:?}");
    let mut device = Client::connect(&host.url(), &token).await.unwrap();
    device.hello().await;

    // Pairing tokens: 128-bit, single use, and burned after 5 wrong secrets.
    let minted = host.pairing_token(&["--roles", "observer"]).await;
    let pairing = minted["token"].as_str().unwrap().to_string();
    let id = pairing.split_once('.').unwrap().0.to_string();
    for i in 0..4 {
        let refused = Client::connect(&host.url(), &format!("{id}.wrong{i}"))
            .await
            .err()
            .unwrap();
        assert_eq!(refused.body["error"]["code"], "REMOTE_AUTH_FAILED");
    }
    let mut survivor = Client::connect(&host.url(), &pairing)
        .await
        .expect("four wrong guesses do not burn the token");
    survivor.hello().await;
    drop(survivor);

    // Forty concurrent wrong guesses burn it however they interleave.
    let minted = host.pairing_token(&["--roles", "observer"]).await;
    let pairing = minted["token"].as_str().unwrap().to_string();
    let id = pairing.split_once('.').unwrap().0.to_string();
    let url = host.url();
    let tasks: Vec<_> = (0..40)
        .map(|i| {
            let (url, guess) = (url.clone(), format!("{id}.concurrent{i}"));
            tokio::spawn(async move { Client::connect(&url, &guess).await.err().unwrap() })
        })
        .collect();
    for task in tasks {
        assert_eq!(task.await.unwrap().status, 401);
    }
    let burned = Client::connect(&host.url(), &pairing).await.err().unwrap();
    assert_eq!(burned.body["error"]["code"], "PAIRING_FAILED");

    record_figures(
        "security_guessing",
        &json!({
            "deviceGuesses": guesses,
            "deviceGuessesPerSecond": per_second,
            // 2^256 secrets at this rate: expected years to find one by chance (log10).
            "log10YearsToGuessADeviceSecret": 256.0 * 2f64.log10() - (per_second * 3.156e7).log10(),
            "pairingAttemptsBeforeBurn": 5,
            "concurrentWrongGuesses": 40,
        }),
    );
}

#[tokio::test]
async fn the_pairing_race_makes_one_device_per_token() {
    let host = HostProcess::start(bin()).await;
    let (_, owner_token) = host.pair_device("owner", &[]).await;
    let mut owner = Client::connect(&host.url(), &owner_token).await.unwrap();
    owner.hello().await;
    let url = host.url();
    let tokens = 8;
    let racers = 16;
    let mut paired_total = 0;
    for round in 0..tokens {
        let minted = owner
            .call("pairing/create", json!({"roles": ["observer"]}))
            .await;
        let token = minted["result"]["token"].as_str().unwrap().to_string();
        // Every racer upgrades, says hello and pairs at once; in odd rounds a few wrong
        // guesses race them too.
        let mut tasks = Vec::new();
        for i in 0..racers {
            let (url, token) = (url.clone(), token.clone());
            tasks.push(tokio::spawn(async move {
                let mut client = match Client::connect(&url, &token).await {
                    Ok(client) => client,
                    Err(refused) => return Err(refused.body["error"]["code"].clone()),
                };
                client.hello().await;
                let reply = client
                    .call("pair", json!({"deviceName": format!("racer-{round}-{i}")}))
                    .await;
                match reply.get("result") {
                    Some(result) => Ok(result["deviceId"].as_str().unwrap().to_string()),
                    None => Err(reply["error"]["code"].clone()),
                }
            }));
        }
        if round % 2 == 1 {
            let id = token.split_once('.').unwrap().0.to_string();
            for i in 0..3 {
                let (url, guess) = (url.clone(), format!("{id}.guess{i}"));
                tasks.push(tokio::spawn(async move {
                    let refused = Client::connect(&url, &guess).await.err().unwrap();
                    Err(refused.body["error"]["code"].clone())
                }));
            }
        }
        let mut winners = 0;
        for task in tasks {
            match task.await.unwrap() {
                Ok(_) => winners += 1,
                Err(code) => assert!(
                    code == "PAIRING_FAILED" || code == "REMOTE_AUTH_FAILED",
                    "{code}"
                ),
            }
        }
        assert_eq!(winners, 1, "round {round}");
        paired_total += winners;
    }
    let devices = owner.call("device/list", json!({})).await;
    let count = devices["result"]["devices"].as_array().unwrap().len();
    assert_eq!(count, 1 + paired_total);
    record_figures(
        "security_pairing_race",
        &json!({"tokens": tokens, "racersPerToken": racers, "devicesCreated": paired_total}),
    );
}

/// Reads until the host closes; returns (close code, last connection error code, when).
async fn close_of(mut client: Client) -> (Option<u16>, Value, Instant) {
    let (frames, close) = client.until_close().await;
    let at = Instant::now();
    let error = frames
        .iter()
        .rev()
        .find(|f| f.get("error").is_some() && f.get("id").is_none())
        .map(|f| f["error"]["code"].clone())
        .unwrap_or(Value::Null);
    (close.map(|c| u16::from(c.code)), error, at)
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

#[tokio::test]
async fn revoking_a_device_closes_all_its_sockets_promptly() {
    let agent = tests::stand_in_agent();
    let host = HostProcess::start_with(bin(), &["--agent", agent.to_str().unwrap()]).await;
    let (_, owner_token) = host.pair_device("owner", &[]).await;
    let (device_id, token) = host.pair_device("phone", &["--roles", "operator"]).await;
    let mut owner = Client::connect(&host.url(), &owner_token).await.unwrap();
    owner.hello().await;
    let created = owner
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let session_id = created["result"]["session"]["sessionId"].clone();
    let started = owner
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "k", "text": "stream:200000:2000"}),
        )
        .await;
    assert!(started.get("result").is_some(), "{started}");

    // The device's sockets: idle ones, streaming subscribers, one that never said hello, and
    // one behind a stalled link.
    let mut sockets = Vec::new();
    for i in 0..6 {
        let mut client = Client::connect(&host.url(), &token).await.unwrap();
        client.hello().await;
        if i >= 3 {
            let sub = client
                .call("session/subscribe", json!({"sessionId": session_id}))
                .await;
            assert!(sub.get("result").is_some(), "{sub}");
            client.events_until(PATIENCE, |_| true).await;
        }
        sockets.push(client);
    }
    sockets.push(Client::connect(&host.url(), &token).await.unwrap());
    let proxy = FaultProxy::start(host.addr).await;
    let mut stalled = Client::connect(&proxy.url(), &token).await.unwrap();
    stalled.hello().await;
    proxy.stall(true);

    let waiting: Vec<_> = sockets
        .into_iter()
        .map(|c| tokio::spawn(close_of(c)))
        .collect();
    let sent = Instant::now();
    let revoked = owner
        .call("device/revoke", json!({"deviceId": device_id}))
        .await;
    let replied = sent.elapsed();
    assert!(revoked.get("result").is_some(), "{revoked}");
    let mut latencies = Vec::new();
    for task in waiting {
        let (close, error, at) = task.await.unwrap();
        assert_eq!(close, Some(4031));
        assert_eq!(error, "REMOTE_AUTH_FAILED");
        latencies.push(millis(at.duration_since(sent)));
    }
    // The host lets go of the stalled socket too (only the owner's stays).
    let deadline = Instant::now() + PATIENCE;
    let released = loop {
        let (ok, stdout, _) = host.cli(&["status", "--json"]).await;
        assert!(ok);
        let status: Value = serde_json::from_str(stdout.trim()).unwrap();
        if status["connections"] == 1 {
            break sent.elapsed();
        }
        assert!(Instant::now() < deadline, "sockets linger: {status}");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    proxy.stall(false);
    let (close, error, _) = close_of(stalled).await;
    assert_eq!((close, error), (Some(4031), json!("REMOTE_AUTH_FAILED")));
    let refused = Client::connect(&host.url(), &token).await.err().unwrap();
    assert_eq!(refused.body["error"]["code"], "REMOTE_AUTH_FAILED");

    // The same through the admin socket (`pi-host revoke`).
    let (cli_id, cli_token) = host.pair_device("tablet", &["--roles", "observer"]).await;
    let mut cli_sockets = Vec::new();
    for _ in 0..3 {
        let mut client = Client::connect(&host.url(), &cli_token).await.unwrap();
        client.hello().await;
        cli_sockets.push(tokio::spawn(close_of(client)));
    }
    let sent_cli = Instant::now();
    let (ok, _, stderr) = host.cli(&["revoke", &cli_id]).await;
    assert!(ok, "{stderr}");
    let mut cli_latencies = Vec::new();
    for task in cli_sockets {
        let (close, _, at) = task.await.unwrap();
        assert_eq!(close, Some(4031));
        cli_latencies.push(millis(at.duration_since(sent_cli)));
    }
    latencies.sort_by(f64::total_cmp);
    cli_latencies.sort_by(f64::total_cmp);
    record_figures(
        "security_revoke",
        &json!({
            "sockets": latencies.len() + 1,
            "revokeReplyMs": millis(replied),
            "revokeToCloseMs": {"min": latencies[0], "median": latencies[latencies.len() / 2], "max": latencies[latencies.len() - 1]},
            "stalledSocketReleasedMs": millis(released),
            "cliRevokeToCloseMs": {"max": cli_latencies[cli_latencies.len() - 1]},
        }),
    );
}

#[tokio::test]
async fn paths_cannot_escape_the_roots() {
    let host = HostProcess::start(bin()).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let root = std::fs::canonicalize(host.root.path()).unwrap();
    let r = root.display().to_string();
    let outside = tempfile::tempdir().unwrap();
    let o = outside.path().display().to_string();
    std::fs::write(outside.path().join("secret.txt"), "x").unwrap();
    // A sibling whose name extends the root's: a string prefix, not a path prefix.
    let sibling = PathBuf::from(format!("{r}-sibling"));
    std::fs::create_dir_all(&sibling).unwrap();
    let _cleanup = Sibling(sibling.clone());
    std::fs::create_dir(root.join("project")).unwrap();
    std::fs::write(root.join("project/file.txt"), "y").unwrap();
    let link =
        |target: &str, name: &str| std::os::unix::fs::symlink(target, root.join(name)).unwrap();
    link(&o, "escape");
    link(&format!("{o}/secret.txt"), "file_escape");
    link("..", "up");
    link("/", "slash");
    link(&format!("{r}-sibling"), "to_sibling");
    link("loop_b", "loop_a");
    link("loop_a", "loop_b");
    link("project", "inside");
    link("/proc/self/root", "proc_root");

    let escapes = [
        format!("{r}/escape"),
        format!("{r}/escape/"),
        format!("{r}/escape/secret.txt"),
        format!("{r}/escape/."),
        format!("{r}/file_escape"),
        format!("{r}/up"),
        format!(
            "{r}/up/{}",
            outside.path().file_name().unwrap().to_str().unwrap()
        ),
        format!("{r}/slash"),
        format!("{r}/slash/etc"),
        format!("{r}/to_sibling"),
        format!("{r}/proc_root"),
        format!("{r}/proc_root/etc"),
        format!("{r}/project/../.."),
        format!("{r}/./project/../../"),
        format!(
            "{r}/../{}-sibling",
            root.file_name().unwrap().to_str().unwrap()
        ),
        format!("{r}-sibling"),
        format!("{r}/inside/../../.."),
        format!("{r}//..//..//etc"),
        "/".to_string(),
        "/etc".to_string(),
        "/etc/passwd".to_string(),
        "/proc/self/root".to_string(),
        "/proc/self/cwd".to_string(),
        "//etc".to_string(),
        o.clone(),
        format!("{o}/secret.txt"),
    ];
    let mut refused = 0;
    for path in &escapes {
        for method in ["fs/list", "fs/stat"] {
            let reply = client.call(method, json!({"path": path})).await;
            let code = reply["error"]["code"].as_str().unwrap_or("");
            assert_eq!(code, "REMOTE_PATH_FORBIDDEN", "{method} {path}: {reply}");
            refused += 1;
        }
        let reply = client
            .call("session/create", json!({"workspace": path}))
            .await;
        let code = reply["error"]["code"].as_str().unwrap_or("");
        assert!(
            code == "REMOTE_PATH_FORBIDDEN" || code == "INVALID_PARAMS",
            "session/create {path}: {reply}"
        );
        refused += 1;
    }
    // Odd paths: refused or not found, never an answer from outside.
    let odd = [
        (format!("{r}/loop_a"), "REMOTE_PATH_FORBIDDEN"),
        (format!("{r}/project/\u{0}"), "REMOTE_PATH_FORBIDDEN"),
        (format!("{r}/missing/../../etc"), "REMOTE_PATH_FORBIDDEN"),
        (format!("{r}/missing"), "REMOTE_PATH_NOT_FOUND"),
        ("relative/path".to_string(), "INVALID_PARAMS"),
        // `~` is the host user's home (protocol.md §7.8), outside this host's roots.
        ("~".to_string(), "REMOTE_PATH_FORBIDDEN"),
        ("~/x".to_string(), "REMOTE_PATH_FORBIDDEN"),
        ("~root/x".to_string(), "INVALID_PARAMS"),
        (".".to_string(), "INVALID_PARAMS"),
        ("..".to_string(), "INVALID_PARAMS"),
        (String::new(), "INVALID_PARAMS"),
        (format!("{r}/{}", "a/".repeat(2100)), "INVALID_PARAMS"),
    ];
    for (path, expected) in &odd {
        let reply = client.call("fs/stat", json!({"path": path})).await;
        assert_eq!(reply["error"]["code"], *expected, "{path:.80}: {reply}");
        refused += 1;
    }
    // What is inside stays reachable, through links that stay inside too.
    for path in [
        format!("{r}/inside"),
        format!("{r}/project/.."),
        format!("{r}/escape/.."),
        r.clone(),
    ] {
        let reply = client.call("fs/list", json!({"path": path})).await;
        let listed = reply["result"]["path"]
            .as_str()
            .unwrap_or_else(|| panic!("{path}: {reply}"));
        assert!(Path::new(listed).starts_with(&root), "{listed}");
    }
    let listing = client.call("fs/list", json!({"path": r})).await;
    let entries = listing["result"]["entries"].as_array().unwrap();
    for entry in entries {
        assert!(
            entry.get("size").is_none() || entry["kind"] == "file",
            "{entry}"
        );
        if [
            "escape",
            "file_escape",
            "up",
            "slash",
            "to_sibling",
            "proc_root",
        ]
        .contains(&entry["name"].as_str().unwrap())
        {
            assert_eq!(entry["kind"], "symlink", "{entry}");
        }
    }
    record_figures("security_paths", &json!({"refusedRequests": refused}));
}

struct Sibling(PathBuf);

impl Drop for Sibling {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Children of a process (from /proc), recursively.
fn descendants(pid: u32) -> Vec<u32> {
    let mut out = Vec::new();
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return out;
    };
    for task in tasks.flatten() {
        let children = std::fs::read_to_string(task.path().join("children")).unwrap_or_default();
        for child in children.split_whitespace().filter_map(|c| c.parse().ok()) {
            out.push(child);
            out.extend(descendants(child));
        }
    }
    out
}

#[tokio::test]
async fn secrets_stay_out_of_logs_argv_and_environments_and_their_files_are_private() {
    // The host runs under umask 000: it must make its private files private itself.
    let wrapper_dir = tempfile::tempdir().unwrap();
    let wrapper = wrapper_dir.path().join("pi-host-umask0");
    std::fs::write(
        &wrapper,
        format!("#!/bin/sh\numask 000\nexec '{}' \"$@\"\n", bin().display()),
    )
    .unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let agent = tests::stand_in_agent();
    let state_dir = tempfile::tempdir().unwrap();
    let state_file = state_dir.path().join("state.json");
    let host = HostProcess::start_with_env(
        &wrapper,
        &[
            "--agent",
            agent.to_str().unwrap(),
            "--state-file",
            state_file.to_str().unwrap(),
        ],
        &[("PI_HOST_LOG", "trace")],
    )
    .await;

    // Every way a secret passes through the host.
    let pairing = host.pairing_token(&[]).await["token"]
        .as_str()
        .unwrap()
        .to_string();
    let mut client = Client::connect(&host.url(), &pairing).await.unwrap();
    client.hello().await;
    let paired = client.call("pair", json!({"deviceName": "laptop"})).await;
    let device_token = paired["result"]["deviceToken"]
        .as_str()
        .unwrap()
        .to_string();
    let offered = format!("racp.v1, racp.bearer.{device_token}");
    let mut device = Client::upgrade(
        &host.url(),
        Upgrade {
            subprotocols: Some(&offered),
            ..Upgrade::default()
        },
    )
    .await
    .unwrap();
    device.hello().await;
    let minted = device
        .call("pairing/create", json!({"roles": ["observer"]}))
        .await;
    let second = minted["result"]["token"].as_str().unwrap().to_string();
    let guess = format!("{}.notthesecret", pairing.split_once('.').unwrap().0);
    let _ = Client::connect(&host.url(), &guess).await;
    let in_query = format!("?token={device_token}");
    let _ = Client::upgrade(
        &host.url(),
        Upgrade {
            url_suffix: &in_query,
            ..Upgrade::default()
        },
    )
    .await;
    let created = device
        .call("session/create", json!({"workspace": host.workspace("w")}))
        .await;
    let session_id = created["result"]["sessionId"].clone();
    let session_id = if session_id.is_null() {
        created["result"]["session"]["sessionId"].clone()
    } else {
        session_id
    };
    device
        .call("session/subscribe", json!({"sessionId": session_id}))
        .await;
    let started = device
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "k", "text": "sleep:5000"}),
        )
        .await;
    assert!(started.get("result").is_some(), "{started}");

    // The agent is running now: look at every process of the host.
    let pid = host.pid();
    let deadline = Instant::now() + PATIENCE;
    let processes = loop {
        let children = descendants(pid);
        if !children.is_empty() {
            break children;
        }
        assert!(Instant::now() < deadline, "the agent did not start");
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let secrets = [
        secret_of(&pairing).to_string(),
        secret_of(&device_token).to_string(),
        secret_of(&second).to_string(),
        "notthesecret".to_string(),
    ];
    let key = std::fs::read(host.data_dir.path().join("host.key")).unwrap();
    let key_hex: String = key.iter().map(|b| format!("{b:02x}")).collect();
    let mut looked_at = 0;
    for process in std::iter::once(pid).chain(processes.iter().copied()) {
        for what in ["cmdline", "environ"] {
            let Ok(bytes) = std::fs::read(format!("/proc/{process}/{what}")) else {
                continue;
            };
            let text = String::from_utf8_lossy(&bytes);
            for secret in &secrets {
                assert!(
                    !text.contains(secret.as_str()),
                    "a secret in {what} of {process}"
                );
            }
            looked_at += 1;
        }
    }
    // The host and at least its agent, each with both files: a check that read nothing would
    // pass whatever the processes held (docs/reliability.md §2.4).
    assert!(
        looked_at >= 4,
        "only {looked_at} /proc files of {} processes were read",
        1 + processes.len()
    );
    device
        .call(
            "turn/abort",
            json!({"sessionId": session_id, "turnId": started["result"]["turnId"]}),
        )
        .await;
    let (ok, _, stderr) = host.cli(&["devices", "--json"]).await;
    assert!(ok, "{stderr}");

    let log = host.log();
    assert!(log.contains("TRACE"), "the log is at trace level");
    assert!(log.contains("device paired"));
    for secret in &secrets {
        assert!(!log.contains(secret.as_str()), "a secret reached the log");
    }
    assert!(!log.contains(&key_hex));
    let state = std::fs::read_to_string(&state_file).unwrap();
    for secret in &secrets {
        assert!(!state.contains(secret.as_str()));
    }

    // The files that hold secrets (or digests of them) are the user's alone, umask or not.
    let mode = |path: &Path| std::fs::metadata(path).unwrap().permissions().mode() & 0o777;
    let data = host.data_dir.path();
    assert_eq!(mode(data), 0o700);
    let mut modes = serde_json::Map::new();
    for name in [
        "host.key",
        "pi-host.db",
        "pi-host.db-wal",
        "pi-host.db-shm",
        "admin.sock",
    ] {
        let path = data.join(name);
        if !path.exists() {
            continue;
        }
        assert_eq!(mode(&path), 0o600, "{name}");
        modes.insert(name.into(), json!(format!("{:o}", mode(&path))));
    }
    assert!(modes.contains_key("pi-host.db-wal"), "WAL mode is on");
    for entry in std::fs::read_dir(data).unwrap().flatten() {
        let m = mode(&entry.path());
        assert_eq!(m & 0o077, 0, "{} is {m:o}", entry.path().display());
    }
    record_figures(
        "security_secrets",
        &json!({"processFilesChecked": looked_at, "logBytes": log.len(), "modes": modes}),
    );
}

/// An agent command that logs each start of the stand-in agent (not its `--version` checks) to
/// `log`, so a test counts the agent processes the host started.
fn counting_agent(dir: &Path) -> (PathBuf, PathBuf) {
    let log = dir.join("starts.log");
    let script = dir.join("agent.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\ncase \"$1\" in --version) ;; *) echo started >>'{}' ;; esac\nexec '{}' \"$@\"\n",
            log.display(),
            tests::stand_in_agent().display()
        ),
    )
    .unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    (script, log)
}

fn starts(log: &Path) -> usize {
    std::fs::read_to_string(log).map_or(0, |text| text.lines().count())
}

/// Waits until `log` has counted `n` agent starts and the host reports `running` agents.
async fn until_agents(client: &mut Client, log: &Path, n: usize, running: u64) {
    let began = Instant::now();
    loop {
        let info = client.call("host/info", json!({})).await;
        let now = info["result"]["agents"]["running"].as_u64();
        if starts(log) == n && now == Some(running) {
            return;
        }
        assert!(
            began.elapsed() < PATIENCE,
            "{} starts, {now:?} running; wanted {n} and {running}",
            starts(log)
        );
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
}

/// docs/reliability.md §4.17: an observer's reads never start an agent, so they never stop an
/// operator's warm agent to make room; they use one that runs.
#[tokio::test]
async fn an_observers_reads_start_no_agent_and_stop_none() {
    let scratch = tempfile::tempdir().unwrap();
    let (agent, log) = counting_agent(scratch.path());
    let host = HostProcess::start_with(
        bin(),
        &["--agent", agent.to_str().unwrap(), "--max-agents", "1"],
    )
    .await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let (_, observer_token) = host.pair_device("phone", &["--roles", "observer"]).await;
    let mut operator = Client::connect(&host.url(), &token).await.unwrap();
    operator.hello().await;
    // Session a's warm agent is stopped for session b's: b's agent is the one running.
    let a = operator.open_session(&host.workspace("a")).await;
    until_agents(&mut operator, &log, 1, 1).await;
    // Answered once the warm start let go of a's agent, which is then idle and can be stopped.
    let commands = operator
        .call("session/commands", json!({"sessionId": a}))
        .await;
    assert!(commands["result"]["commands"].is_array(), "{commands}");
    let b = operator.open_session(&host.workspace("b")).await;
    until_agents(&mut operator, &log, 2, 1).await;

    let mut observer = Client::connect(&host.url(), &observer_token).await.unwrap();
    observer.hello().await;
    for _ in 0..3 {
        for method in ["session/commands", "session/export"] {
            let reply = observer.call(method, json!({"sessionId": a})).await;
            assert_eq!(reply["error"]["code"], "CONFLICT", "{method}: {reply}");
            assert_eq!(reply["error"]["details"]["reason"], "agent_not_running");
            assert_eq!(reply["error"]["retriable"], false);
        }
        let stats = observer
            .call("session/stats", json!({"sessionId": a}))
            .await;
        assert!(stats["result"]["tokens"].is_object(), "{stats}");
    }
    let models = observer.call("model/list", json!({})).await;
    assert_eq!(models["error"]["code"], "CONFLICT", "{models}");
    assert_eq!(models["error"]["details"]["reason"], "agent_not_running");
    assert_eq!(starts(&log), 2, "an observer's call started an agent");
    // b's agent still runs, and answers the observer.
    let commands = observer
        .call("session/commands", json!({"sessionId": b}))
        .await;
    assert_eq!(
        commands["result"]["commands"][0]["name"], "stand-in-template",
        "{commands}"
    );
    let export = observer
        .call("session/export", json!({"sessionId": b}))
        .await;
    assert!(
        export["result"]["html"]
            .as_str()
            .is_some_and(|h| h.contains("stand-in export")),
        "{export}"
    );
    until_agents(&mut operator, &log, 2, 1).await;

    // An operator's read starts the agent, as a turn would.
    let commands = operator
        .call("session/commands", json!({"sessionId": a}))
        .await;
    assert!(commands["result"]["commands"].is_array(), "{commands}");
    until_agents(&mut operator, &log, 3, 1).await;
}

/// docs/reliability.md §4.17: a key replaced while a turn runs is still scrubbed from that
/// turn, whose agent started with it.
#[tokio::test]
async fn a_key_replaced_during_a_turn_is_still_scrubbed_from_it() {
    let agent = tests::stand_in_agent();
    let host = HostProcess::start_with(bin(), &["--agent", agent.to_str().unwrap()]).await;
    let (_, token) = host.pair_device("laptop", &[]).await;
    let mut client = Client::connect(&host.url(), &token).await.unwrap();
    client.hello().await;
    let old_key = "zq9-Old.Provider_Key_41c7";
    let new_key = "zq9-New.Provider_Key_93d2";
    for key in [old_key] {
        let set = client
            .call("credential/set", json!({"provider": "desk", "apiKey": key}))
            .await;
        assert!(set["result"]["credential"].is_object(), "{set}");
    }
    let session_id = client.open_session(&host.workspace("w")).await;
    let hex: String = old_key.bytes().map(|b| format!("{b:02x}")).collect();
    let text = format!("approve:confirm sayhex:{hex}");
    let started = client
        .call(
            "turn/start",
            json!({"sessionId": session_id, "idempotencyKey": "k", "text": text}),
        )
        .await;
    assert!(started["result"]["turnId"].is_string(), "{started}");
    let events = client
        .events_until(PATIENCE, |e| e["type"] == "approval.requested")
        .await;
    let approval_id = events.last().unwrap()["data"]["approvalId"].clone();
    // Replaced while the turn (and its agent, which holds the old key) runs.
    let set = client
        .call(
            "credential/set",
            json!({"provider": "desk", "apiKey": new_key}),
        )
        .await;
    assert!(set["result"]["credential"].is_object(), "{set}");
    let answered = client
        .call(
            "approval/respond",
            json!({"approvalId": approval_id, "decision": "allow"}),
        )
        .await;
    assert!(answered.get("result").is_some(), "{answered}");
    let events = client
        .events_until(PATIENCE, |e| e["type"] == "turn.finished")
        .await;
    let all = json!(events).to_string();
    assert!(!all.contains(old_key), "the old key got out: {all}");
    assert!(all.contains("[redacted]"), "{all}");
    let history = client
        .call("session/history", json!({"sessionId": session_id}))
        .await
        .to_string();
    assert!(!history.contains(old_key), "{history}");
    assert!(!host.log().contains(old_key));
}
