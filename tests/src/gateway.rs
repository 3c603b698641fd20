//! `pi-gateway` processes for the gateway tests, and a fleet set-up the way an operator does it:
//! NATS with the gateway's user, hosts enrolled (their users added and NATS reloaded), hosts
//! started with `--gateway`, devices paired with the gateway.

use crate::nats::{NatsCluster, NatsOptions};
use crate::{Client, HostProcess, PATIENCE, register_host, workspace_binary};
use racp_proto::fingerprint::CertSha256;
use serde_json::{Value, json};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

pub fn gateway_binary() -> PathBuf {
    workspace_binary("gateway", "pi-gateway", None)
}

/// A running `pi-gateway serve`.
pub struct GatewayProcess {
    child: Child,
    pub addr: SocketAddr,
    pub cert_sha256: CertSha256,
    /// The operator's listener, when started with `--metrics-listen`.
    pub metrics: Option<SocketAddr>,
    pub data_dir: tempfile::TempDir,
    log_dir: tempfile::TempDir,
    nats: String,
    nats_ca: Option<PathBuf>,
    replicas: usize,
}

impl GatewayProcess {
    /// A gateway's data directory with its nkey made; returns it and the public key.
    pub async fn prepare() -> (tempfile::TempDir, String) {
        let data_dir = tempfile::tempdir().expect("temp dir");
        let nkey = Self::public_key(data_dir.path()).await;
        (data_dir, nkey)
    }

    /// The gateway's public key (what hosts trust its calls by).
    pub async fn public_key(data_dir: &Path) -> String {
        let output = Command::new(gateway_binary())
            .arg("key")
            .arg("--data-dir")
            .arg(data_dir)
            .output()
            .await
            .expect("run pi-gateway key");
        assert!(output.status.success(), "pi-gateway key failed");
        String::from_utf8_lossy(&output.stdout).trim().to_string()
    }

    /// Starts one with extra `serve` arguments, reaching NATS at `nats` with the CA `nats_ca`.
    pub async fn start_with(
        data_dir: tempfile::TempDir,
        nats: &str,
        nats_ca: Option<&Path>,
        replicas: usize,
        extra: &[&str],
    ) -> GatewayProcess {
        Self::start_with_env(data_dir, nats, nats_ca, replicas, extra, &[]).await
    }

    /// [`GatewayProcess::start_with`] with extra environment variables.
    pub async fn start_with_env(
        data_dir: tempfile::TempDir,
        nats: &str,
        nats_ca: Option<&Path>,
        replicas: usize,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> GatewayProcess {
        let log_dir = tempfile::tempdir().expect("temp dir");
        let log = std::fs::File::create(log_dir.path().join("gateway.log")).expect("log");
        let mut child = Command::new(gateway_binary())
            .args(["serve", "--listen", "127.0.0.1:0", "--heartbeat-ms", "1000"])
            .arg("--data-dir")
            .arg(data_dir.path())
            .args(["--nats", nats, "--replicas", &replicas.to_string()])
            .args(nats_ca.iter().flat_map(|ca| [Path::new("--nats-ca"), ca]))
            .args(extra)
            .env("PI_GATEWAY_LOG", "debug,async_nats=info,hyper=info")
            .envs(env.iter().copied())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn pi-gateway");
        let stdout = child.stdout.take().expect("stdout");
        let mut lines = BufReader::new(stdout).lines();
        let log_path = log_dir.path().join("gateway.log");
        let (addr, cert_sha256, metrics) = tokio::time::timeout(PATIENCE * 2, async {
            let (mut cert, mut metrics) = (None, None);
            while let Ok(Some(line)) = lines.next_line().await {
                if let Some(addr) = line.strip_prefix("pi-gateway metrics listening on http://") {
                    metrics = Some(addr.trim().parse::<SocketAddr>().expect("metrics address"));
                }
                if let Some(hex) = line.strip_prefix("pi-gateway certificate SHA-256 ") {
                    cert = hex.trim().parse::<CertSha256>().ok();
                }
                if let Some(rest) = line.strip_prefix("pi-gateway listening on wss://") {
                    let addr = rest.trim_end_matches("/racp").parse::<SocketAddr>();
                    return (
                        addr.expect("listen address"),
                        cert.expect("certificate line"),
                        metrics,
                    );
                }
            }
            panic!(
                "pi-gateway exited before listening:\n{}",
                std::fs::read_to_string(&log_path).unwrap_or_default()
            );
        })
        .await
        .expect("pi-gateway did not start in time");
        register_host(addr.port(), cert_sha256);
        tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
        GatewayProcess {
            child,
            addr,
            cert_sha256,
            metrics,
            data_dir,
            log_dir,
            nats: nats.to_string(),
            nats_ca: nats_ca.map(Path::to_path_buf),
            replicas,
        }
    }

    /// The gateway's process id.
    pub fn pid(&self) -> u32 {
        self.child.id().expect("pi-gateway running")
    }

    /// The gateway's own endpoint (pairing, devices, `host/list`).
    pub fn url(&self) -> String {
        format!("wss://{}/racp", self.addr)
    }

    /// One host through the gateway.
    pub fn host_url(&self, host_id: &str) -> String {
        format!("wss://{}/racp/hosts/{host_id}", self.addr)
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_dir.path().join("gateway.log")).unwrap_or_default()
    }

    /// Runs a `pi-gateway` command with this gateway's data directory and NATS.
    pub async fn cli(&self, args: &[&str]) -> (bool, String, String) {
        cli(
            self.data_dir.path(),
            &self.nats,
            self.nats_ca.as_deref(),
            self.replicas,
            args,
        )
        .await
    }

    /// Runs a `pi-gateway` command with this gateway's data directory and NATS: its exit code.
    pub async fn cli_status(&self, args: &[&str]) -> (Option<i32>, String, String) {
        cli_status(
            self.data_dir.path(),
            &self.nats,
            self.nats_ca.as_deref(),
            self.replicas,
            args,
        )
        .await
    }

    /// Pairs a device with the gateway (`pi-gateway pair`, then `pair` over RACP); returns its
    /// id and token.
    pub async fn pair_device(&self, roles: &str, hosts: &[&str]) -> (String, String) {
        let mut args = vec!["pair", "--json", "--roles", roles];
        let joined = hosts.join(",");
        if !hosts.is_empty() {
            args.extend(["--hosts", &joined]);
        }
        let (ok, out, err) = self.cli(&args).await;
        assert!(ok, "pi-gateway pair failed: {err}");
        let minted: Value = serde_json::from_str(out.trim()).expect("pair --json");
        let token = minted["token"].as_str().expect("token");
        // The link names the address and certificate served, without --address.
        assert_eq!(
            minted["url"],
            format!(
                "racps://{}/pair?cert=sha256:{}#{token}",
                self.addr, self.cert_sha256
            ),
            "{minted}"
        );
        let mut client = Client::connect(&self.url(), token)
            .await
            .unwrap_or_else(|refused| panic!("pairing refused: {refused:?}\n{}", self.log()));
        client.hello().await;
        let paired = client
            .call("pair", json!({"deviceName": "test desktop"}))
            .await;
        let result = &paired["result"];
        (
            result["deviceId"].as_str().expect("deviceId").to_string(),
            result["deviceToken"]
                .as_str()
                .expect("deviceToken")
                .to_string(),
        )
    }

    pub async fn kill(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Stops it with SIGTERM and waits for it to exit.
    pub async fn terminate(&mut self) {
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill").arg(pid.to_string()).status().await;
        }
        let _ = tokio::time::timeout(PATIENCE, self.child.wait()).await;
    }
}

/// The end of the gateway's log when a test fails while it runs.
impl Drop for GatewayProcess {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = self.log();
            let mut start = log.len().saturating_sub(12 << 10);
            while !log.is_char_boundary(start) {
                start += 1;
            }
            eprintln!("--- pi-gateway log (tail) ---\n{}", &log[start..]);
        }
    }
}

/// Runs a `pi-gateway` command: (success, stdout, stderr).
pub async fn cli(
    data_dir: &Path,
    nats: &str,
    nats_ca: Option<&Path>,
    replicas: usize,
    args: &[&str],
) -> (bool, String, String) {
    let (code, out, err) = cli_status(data_dir, nats, nats_ca, replicas, args).await;
    (code == Some(0), out, err)
}

/// Runs a `pi-gateway` command: (exit code, stdout, stderr).
pub async fn cli_status(
    data_dir: &Path,
    nats: &str,
    nats_ca: Option<&Path>,
    replicas: usize,
    args: &[&str],
) -> (Option<i32>, String, String) {
    let output = Command::new(gateway_binary())
        .args(args)
        .arg("--data-dir")
        .arg(data_dir)
        .args(["--nats", nats, "--replicas", &replicas.to_string()])
        .args(nats_ca.iter().flat_map(|ca| [Path::new("--nats-ca"), ca]))
        .env("PI_GATEWAY_LOG", "warn")
        .output()
        .await
        .expect("run pi-gateway");
    (
        output.status.code(),
        String::from_utf8_lossy(&output.stdout).into_owned(),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A host's data directory with its gateway key made: (dir, host id, nkey).
pub async fn prepare_host(pi_host: &Path) -> (tempfile::TempDir, String, String) {
    let data_dir = tempfile::tempdir().expect("temp dir");
    let output = Command::new(pi_host)
        .args(["gateway-key", "--json", "--data-dir"])
        .arg(data_dir.path())
        .output()
        .await
        .expect("run pi-host gateway-key");
    assert!(output.status.success(), "pi-host gateway-key failed");
    let key: Value = serde_json::from_slice(&output.stdout).expect("gateway-key --json");
    (
        data_dir,
        key["hostId"].as_str().expect("hostId").to_string(),
        key["nkey"].as_str().expect("nkey").to_string(),
    )
}

/// NATS, a gateway's data directory, and enrolled hosts: what the tests build on.
pub struct Fleet {
    pub nats: NatsCluster,
    pub replicas: usize,
    /// The gateway's NATS user (unrestricted) and each enrolled host's.
    pub users: Vec<String>,
    pub gateway_dirs: Vec<tempfile::TempDir>,
    /// The gateways' public keys, which hosts trust calls from.
    pub gateway_keys: Vec<String>,
    /// Enrolled hosts not started yet: (data dir, host id).
    pub hosts: Vec<(tempfile::TempDir, String)>,
    /// The certificate every replica serves (`--tls-cert`), so a device's pin holds on each.
    pub certificate: crate::TestCertificate,
}

impl Fleet {
    /// `nodes` NATS nodes (1 or 3), `gateways` gateway data directories sharing one TLS
    /// identity (replicas behind one name), and `hosts` enrolled hosts.
    pub async fn new(nodes: usize, gateways: usize, hosts: usize, retention_seconds: u64) -> Fleet {
        Self::new_with(
            nodes,
            gateways,
            hosts,
            retention_seconds,
            NatsOptions::default(),
            &[],
        )
        .await
    }

    /// As `new`, with NATS served as `options` says and `enroll_args` added to each enroll.
    pub async fn new_with(
        nodes: usize,
        gateways: usize,
        hosts: usize,
        retention_seconds: u64,
        options: NatsOptions,
        enroll_args: &[&str],
    ) -> Fleet {
        let pi_host = crate::pi_host_binary();
        let mut gateway_dirs = Vec::new();
        let mut gateway_keys = Vec::new();
        let mut users = Vec::new();
        for _ in 0..gateways {
            let (dir, nkey) = GatewayProcess::prepare().await;
            users.push(format!("{{ nkey: \"{nkey}\" }}"));
            gateway_keys.push(nkey);
            gateway_dirs.push(dir);
        }
        let first = gateway_dirs[0].path().to_path_buf();
        let replicas = if nodes >= 3 { 3 } else { 1 };
        let mut nats = NatsCluster::start_with(nodes, &users, options).await;
        let mut enrolled = Vec::new();
        for _ in 0..hosts {
            let (dir, host_id, nkey) = prepare_host(&pi_host).await;
            let retention = retention_seconds.to_string();
            let mut args = vec!["enroll", &host_id, &nkey, "--retention-seconds", &retention];
            args.extend(enroll_args);
            let (ok, out, err) =
                cli(&first, &nats.urls(), Some(nats.ca_path()), replicas, &args).await;
            assert!(ok, "pi-gateway enroll failed: {err}");
            users.push(out.trim().to_string());
            enrolled.push((dir, host_id));
        }
        nats.set_users(&users).await;
        Fleet {
            nats,
            replicas,
            users,
            gateway_dirs,
            gateway_keys,
            hosts: enrolled,
            certificate: crate::TestCertificate::localhost(),
        }
    }

    /// Starts the next gateway replica.
    pub async fn gateway(&mut self) -> GatewayProcess {
        self.gateway_with(&[]).await
    }

    /// Starts the next gateway replica with extra `serve` arguments.
    pub async fn gateway_with(&mut self, extra: &[&str]) -> GatewayProcess {
        let urls = self.nats.urls();
        self.gateway_at(&urls, extra).await
    }

    /// Starts the next gateway replica reaching NATS at `nats` (a proxy, say).
    pub async fn gateway_at(&mut self, nats: &str, extra: &[&str]) -> GatewayProcess {
        self.gateway_at_with_env(nats, extra, &[]).await
    }

    /// Starts the next gateway replica with extra `serve` arguments and environment variables.
    pub async fn gateway_with_env(
        &mut self,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> GatewayProcess {
        let urls = self.nats.urls();
        self.gateway_at_with_env(&urls, extra, env).await
    }

    async fn gateway_at_with_env(
        &mut self,
        nats: &str,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> GatewayProcess {
        let dir = self.gateway_dirs.remove(0);
        let ca = self.nats.ca_path().to_path_buf();
        let mut args: Vec<&str> = self.certificate.serve_args().to_vec();
        args.extend(extra);
        GatewayProcess::start_with_env(dir, nats, Some(&ca), self.replicas, &args, env).await
    }

    /// The `serve` arguments of a host of this fleet: the stand-in agent, NATS to dial (with
    /// its CA), and the gateways it trusts.
    pub fn host_args(&self) -> Vec<String> {
        let agent = crate::stand_in_agent();
        self.host_args_for(agent.to_str().expect("utf-8 path"))
    }

    /// [`Fleet::host_args`] with `agent` as the agent's command.
    pub fn host_args_for(&self, agent: &str) -> Vec<String> {
        vec![
            "--agent".into(),
            agent.into(),
            "--gateway".into(),
            self.nats.urls(),
            "--gateway-ca".into(),
            self.nats.ca_path().to_str().expect("utf-8 path").into(),
            "--gateway-trust".into(),
            self.gateway_keys.join(","),
        ]
    }

    /// Starts the next enrolled host with the stand-in agent, dialing out to NATS.
    pub async fn host(&mut self, extra: &[&str]) -> (HostProcess, String) {
        let (dir, host_id) = self.hosts.remove(0);
        let mut args = self.host_args();
        args.extend(extra.iter().map(|a| a.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let host = HostProcess::start_in(&crate::pi_host_binary(), dir, &args).await;
        (host, host_id)
    }

    /// Starts the next enrolled host with the real pi talking to `stub` (`tests::pi`),
    /// dialing out to NATS, with `extra` serve arguments; also returns pi's config directory,
    /// to keep until the host stops.
    pub async fn pi_host(
        &mut self,
        stub: &crate::pi::Stub,
        extra: &[&str],
    ) -> (HostProcess, String, tempfile::TempDir) {
        let (dir, host_id) = self.hosts.remove(0);
        let port = crate::pi::start_stub(stub.clone()).await;
        let pi_dir = crate::pi::pi_config(port);
        let agent = shell_words::join(crate::pi::pi_words(&crate::pi::pi_cli(), None));
        let mut args = self.host_args_for(&agent);
        args.extend(extra.iter().map(|a| a.to_string()));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let env = crate::pi::pi_env(pi_dir.path());
        let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let host = HostProcess::start_in_with_env(&crate::pi_host_binary(), dir, &args, &env).await;
        (host, host_id, pi_dir)
    }
}

/// Waits until `host/list` shows `host_id` online, so no call after it meets HOST_DISCONNECTED.
pub async fn until_online(client: &mut Client, host_id: &str) {
    let deadline = tokio::time::Instant::now() + PATIENCE * 2;
    loop {
        let listed = client.call("host/list", json!({})).await;
        let online = listed["result"]["hosts"].as_array().is_some_and(|hosts| {
            hosts
                .iter()
                .any(|h| h["host"]["id"] == host_id && h["status"] == "online")
        });
        if online {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "{host_id} never came online: {listed}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}
