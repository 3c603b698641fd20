//! Shared harness for end-to-end tests: a real `pi-host` process on a loopback port chosen by the
//! OS, with its own temporary data directory, and a plain WebSocket client that speaks RACP-WS
//! frames. Nothing here is mocked.

#![allow(clippy::expect_used, clippy::unwrap_used)]

use futures_util::{SinkExt, StreamExt};
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::net::TcpStream;
use tokio::process::{Child, Command};
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::protocol::CloseFrame;
use tokio_tungstenite::tungstenite::{self, Message};
use tokio_tungstenite::{MaybeTlsStream, WebSocketStream};

/// Generous bound for anything a test waits on; a loaded 2-core machine is slow, not stuck.
pub const PATIENCE: Duration = Duration::from_secs(30);

/// A running `pi-host serve`.
pub struct HostProcess {
    child: Child,
    pub addr: SocketAddr,
    pub data_dir: tempfile::TempDir,
    bin: PathBuf,
}

impl HostProcess {
    /// Starts `bin serve` on 127.0.0.1 with an OS-chosen port and waits until it listens.
    pub async fn start(bin: &Path) -> HostProcess {
        let data_dir = tempfile::tempdir().expect("temp dir");
        let mut child = Command::new(bin)
            .args(["serve", "--listen", "127.0.0.1:0", "--data-dir"])
            .arg(data_dir.path())
            .env(
                "PI_HOST_LOG",
                std::env::var("PI_HOST_TEST_LOG").unwrap_or_else(|_| "warn".into()),
            )
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true)
            .spawn()
            .expect("spawn pi-host");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let addr = tokio::time::timeout(PATIENCE, async {
            while let Some(line) = lines.next_line().await.expect("read stdout") {
                if let Some(rest) = line.strip_prefix("pi-host listening on ws://") {
                    let addr = rest.trim_end_matches("/racp");
                    return addr.parse::<SocketAddr>().expect("listen address");
                }
            }
            panic!("pi-host exited before listening");
        })
        .await
        .expect("pi-host did not start in time");
        // Keep draining stdout so the host never blocks on a full pipe.
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        HostProcess {
            child,
            addr,
            data_dir,
            bin: bin.to_path_buf(),
        }
    }

    pub fn url(&self) -> String {
        format!("ws://{}/racp", self.addr)
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

    /// Sends SIGKILL (the test-side kill -9).
    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
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

/// A raw RACP-WS client for tests.
pub struct Client {
    ws: WebSocketStream<MaybeTlsStream<TcpStream>>,
    next_id: u64,
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
        match tokio::time::timeout(PATIENCE, tokio_tungstenite::connect_async(request)).await {
            Err(_) => panic!("upgrade timed out"),
            Ok(Ok((ws, response))) => Ok(Client {
                ws,
                next_id: 1,
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

    /// Sends a request and returns its reply frame, skipping pushes.
    pub async fn call(&mut self, method: &str, params: Value) -> Value {
        let id = self.next_id;
        self.next_id += 1;
        self.send_text(json!({"id": id, "method": method, "params": params}).to_string())
            .await;
        let wait = async {
            loop {
                let frame = self
                    .next_frame()
                    .await
                    .expect("connection closed before the reply");
                if frame.get("id") == Some(&json!(id)) {
                    return frame;
                }
            }
        };
        tokio::time::timeout(PATIENCE, wait)
            .await
            .unwrap_or_else(|_| panic!("no reply to {method} in time"))
    }

    pub async fn send_text(&mut self, text: String) {
        self.try_send_text(text).await.expect("send frame");
    }

    /// Sends a frame; an error means the server already closed or reset the connection.
    pub async fn try_send_text(&mut self, text: String) -> Result<(), tungstenite::Error> {
        self.ws.send(Message::Text(text.into())).await
    }

    /// The next JSON frame, or `None` once the connection closed (with its close frame).
    pub async fn next_frame(&mut self) -> Option<Value> {
        loop {
            let message = tokio::time::timeout(PATIENCE, self.ws.next())
                .await
                .expect("no frame in time")?;
            match message {
                Ok(Message::Text(text)) => {
                    return Some(serde_json::from_str(text.as_str()).expect("JSON frame"));
                }
                Ok(Message::Close(_)) | Err(_) => return None,
                Ok(_) => {}
            }
        }
    }

    /// Reads until the server closes; returns the frames before the close and the close frame.
    pub async fn until_close(&mut self) -> (Vec<Value>, Option<CloseFrame>) {
        let mut frames = Vec::new();
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
