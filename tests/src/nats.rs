//! A real NATS server (Debian's `nats-server`, JetStream on) for the gateway tests: one node, or
//! a three-node cluster on loopback, each node with its own store, killable and restartable on
//! the same ports. Authorization is a users file the test writes (and may rewrite and reload).
//! Clients connect over TLS (a CA made per cluster, `ca_path`), as by default; the cluster's
//! routes use TLS with the same certificates.

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::process::{Child, Command};

pub const NATS_SERVER: &str = "/usr/sbin/nats-server";

/// Whether `nats-server` is installed (scripts/test installs it).
pub fn available() -> bool {
    Path::new(NATS_SERVER).exists() || which("nats-server").is_some()
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH")?
        .to_str()?
        .split(':')
        .map(|dir| Path::new(dir).join(name))
        .find(|p| p.exists())
}

fn binary() -> PathBuf {
    if Path::new(NATS_SERVER).exists() {
        PathBuf::from(NATS_SERVER)
    } else {
        which("nats-server").expect("nats-server is not installed (apt-get install nats-server)")
    }
}

/// A port the OS picked as free (bound on :0, then released for the server to take).
fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// A certificate authority made for one test, and certificates it issues.
pub struct TestCa {
    dir: tempfile::TempDir,
    issuer: rcgen::Issuer<'static, rcgen::KeyPair>,
    /// The CA's certificate (PEM), what clients trust.
    pub cert: PathBuf,
}

impl TestCa {
    pub fn new() -> TestCa {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut params = rcgen::CertificateParams::new(Vec::<String>::new()).expect("CA params");
        params.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "test NATS CA");
        params.key_usages = vec![
            rcgen::KeyUsagePurpose::KeyCertSign,
            rcgen::KeyUsagePurpose::DigitalSignature,
        ];
        let key = rcgen::KeyPair::generate().expect("CA key");
        let cert = params.self_signed(&key).expect("CA certificate");
        let path = dir.path().join("ca.pem");
        std::fs::write(&path, cert.pem()).expect("write CA");
        TestCa {
            issuer: rcgen::Issuer::new(params, key),
            dir,
            cert: path,
        }
    }

    /// A certificate for loopback (`localhost`, 127.0.0.1) signed by this CA: (cert, key) PEM
    /// files.
    pub fn issue(&self, name: &str) -> (PathBuf, PathBuf) {
        let params =
            rcgen::CertificateParams::new(vec!["localhost".to_string(), "127.0.0.1".to_string()])
                .expect("params");
        let key = rcgen::KeyPair::generate().expect("key");
        let cert = params.signed_by(&key, &self.issuer).expect("sign");
        let (cert_path, key_path) = (
            self.dir.path().join(format!("{name}-cert.pem")),
            self.dir.path().join(format!("{name}-key.pem")),
        );
        std::fs::write(&cert_path, cert.pem()).expect("write cert");
        std::fs::write(&key_path, key.serialize_pem()).expect("write key");
        (cert_path, key_path)
    }
}

impl Default for TestCa {
    fn default() -> Self {
        TestCa::new()
    }
}

/// How the test's NATS serves: TLS (the default) or cleartext, JetStream's file store size (or
/// no JetStream), or from a configuration file as an operator writes it.
#[derive(Clone)]
pub struct NatsOptions {
    pub tls: bool,
    pub max_file_store: String,
    pub jetstream: bool,
    /// A configuration file (deploy/nats-server.conf) to serve from instead (one node): its
    /// listen address, store, certificate and users are this test's, everything else is its own.
    pub config_file: Option<PathBuf>,
}

impl Default for NatsOptions {
    fn default() -> Self {
        NatsOptions {
            tls: true,
            max_file_store: "1GB".into(),
            jetstream: true,
            config_file: None,
        }
    }
}

/// `text` (an operator's configuration) with the lines that name places on a real server
/// pointed at a test's own: `listen`, `store_dir`, `cert_file`, `key_file`, and the
/// `authorization` block replaced by the users file (next to the configuration). Panics when one is missing, so a file that
/// no longer has them fails its test.
fn adapt_config(text: &str, places: &[(&str, String)], users: &str) -> String {
    let mut out = String::new();
    let mut found: Vec<&str> = Vec::new();
    let mut in_authorization = false;
    for line in text.lines() {
        let trimmed = line.trim_start();
        if in_authorization {
            in_authorization = line != "}";
            continue;
        }
        if line.starts_with("authorization {") {
            in_authorization = true;
            found.push("authorization");
            out.push_str(&format!("include \"{users}\"\n"));
            continue;
        }
        match places
            .iter()
            .find(|(key, _)| trimmed.starts_with(&format!("{key}:")))
        {
            Some((key, value)) => {
                found.push(key);
                out.push_str(&format!("{key}: {value}\n"));
            }
            None => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    for key in places.iter().map(|(key, _)| *key).chain(["authorization"]) {
        assert!(
            found.contains(&key),
            "the NATS configuration has no `{key}` to point at the test's own"
        );
    }
    out
}

struct Node {
    name: String,
    port: u16,
    cluster_port: u16,
    monitor_port: u16,
    child: Option<Child>,
}

pub struct NatsCluster {
    dir: tempfile::TempDir,
    nodes: Vec<Node>,
    ca: TestCa,
    server_cert: (PathBuf, PathBuf),
    options: NatsOptions,
}

impl NatsCluster {
    /// Starts `size` nodes (1, or 3 for a cluster) serving TLS and waits until JetStream
    /// answers on each. `users` is the body of `authorization { users = [ ... ] }`; empty: no
    /// authorization.
    pub async fn start(size: usize, users: &[String]) -> NatsCluster {
        Self::start_with(size, users, NatsOptions::default()).await
    }

    pub async fn start_with(size: usize, users: &[String], options: NatsOptions) -> NatsCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let ca = TestCa::new();
        let server_cert = ca.issue("server");
        let nodes = (0..size)
            .map(|i| Node {
                name: format!("n{i}"),
                port: free_port(),
                cluster_port: free_port(),
                monitor_port: free_port(),
                child: None,
            })
            .collect();
        let mut cluster = NatsCluster {
            dir,
            nodes,
            ca,
            server_cert,
            options,
        };
        cluster.write_users(users);
        for i in 0..size {
            cluster.write_config(i);
        }
        for i in 0..size {
            cluster.spawn(i);
        }
        for i in 0..size {
            cluster.wait_ready(i).await;
        }
        cluster
    }

    fn users_path(&self) -> PathBuf {
        self.dir.path().join("users.conf")
    }

    fn write_users(&self, users: &[String]) {
        let body = if users.is_empty() {
            String::new()
        } else {
            format!(
                "authorization {{\n  users = [\n    {}\n  ]\n}}\n",
                users.join("\n    ")
            )
        };
        std::fs::write(self.users_path(), body).expect("write users.conf");
    }

    fn write_config(&self, i: usize) {
        let node = &self.nodes[i];
        let store = self.dir.path().join(&node.name);
        if let Some(file) = &self.options.config_file {
            let text = std::fs::read_to_string(file).expect("read the NATS configuration");
            let (cert, key) = &self.server_cert;
            let places = [
                ("listen", format!("127.0.0.1:{}", node.port)),
                ("store_dir", format!("\"{}\"", store.display())),
                ("cert_file", format!("\"{}\"", cert.display())),
                ("key_file", format!("\"{}\"", key.display())),
            ];
            let mut config = adapt_config(&text, &places, "users.conf");
            config.push_str(&format!(
                "server_name: {}\nhttp: 127.0.0.1:{}\n",
                node.name, node.monitor_port
            ));
            std::fs::write(self.dir.path().join(format!("{}.conf", node.name)), config)
                .expect("write node config");
            return;
        }
        let jetstream = if self.options.jetstream {
            format!(
                "jetstream {{\n  store_dir: \"{store}\"\n  max_memory_store: 64MB\n  max_file_store: {file_store}\n}}\n",
                store = store.display(),
                file_store = self.options.max_file_store,
            )
        } else {
            String::new()
        };
        let mut config = format!(
            "server_name: {name}\nlisten: 127.0.0.1:{port}\nhttp: 127.0.0.1:{monitor}\n\
             {jetstream}include \"users.conf\"\n",
            name = node.name,
            port = node.port,
            monitor = node.monitor_port,
        );
        let (cert, key) = &self.server_cert;
        let tls = format!(
            "tls {{\n  cert_file: \"{}\"\n  key_file: \"{}\"\n  ca_file: \"{}\"\n  timeout: 5\n}}\n",
            cert.display(),
            key.display(),
            self.ca.cert.display()
        );
        if self.options.tls {
            config.push_str(&tls);
        }
        if self.nodes.len() > 1 {
            let routes: Vec<String> = self
                .nodes
                .iter()
                .filter(|n| n.name != node.name)
                .map(|n| format!("nats-route://127.0.0.1:{}", n.cluster_port))
                .collect();
            let route_tls = if self.options.tls { tls.as_str() } else { "" };
            config.push_str(&format!(
                "cluster {{\n  name: racp\n  listen: 127.0.0.1:{}\n  routes: [{}]\n{route_tls}}}\n",
                node.cluster_port,
                routes.join(", ")
            ));
        }
        std::fs::write(self.dir.path().join(format!("{}.conf", node.name)), config)
            .expect("write node config");
    }

    fn spawn(&mut self, i: usize) {
        let name = self.nodes[i].name.clone();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.path().join(format!("{name}.log")))
            .expect("open nats log");
        let child = Command::new(binary())
            .arg("-c")
            .arg(self.dir.path().join(format!("{name}.conf")))
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .expect("spawn nats-server");
        self.nodes[i].child = Some(child);
    }

    /// Waits until the node says JetStream is healthy (`/healthz?js-enabled-only=true`, then the
    /// full `/healthz` once a cluster has a meta leader).
    async fn wait_ready(&self, i: usize) {
        let port = self.nodes[i].monitor_port;
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if healthz(port).await {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "nats-server {} did not become ready; log:\n{}",
                self.nodes[i].name,
                self.log(i)
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// A running node's process id (for measuring its CPU and memory).
    pub fn pid(&self, i: usize) -> Option<u32> {
        self.nodes.get(i)?.child.as_ref()?.id()
    }

    pub fn log(&self, i: usize) -> String {
        std::fs::read_to_string(self.dir.path().join(format!("{}.log", self.nodes[i].name)))
            .unwrap_or_default()
    }

    /// Every node's client URL, comma-separated.
    pub fn urls(&self) -> String {
        (0..self.nodes.len())
            .map(|i| self.url(i))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn url(&self, i: usize) -> String {
        format!("{}://{}", self.scheme(), self.addr(i))
    }

    /// `tls` or, for a cleartext server, `nats`.
    pub fn scheme(&self) -> &'static str {
        if self.options.tls { "tls" } else { "nats" }
    }

    /// The CA that signed the servers' certificates (PEM).
    pub fn ca_path(&self) -> &Path {
        &self.ca.cert
    }

    /// Options for a test's own NATS client: TLS with this cluster's CA.
    pub fn client_options(
        &self,
        options: async_nats::ConnectOptions,
    ) -> async_nats::ConnectOptions {
        if self.options.tls {
            options
                .require_tls(true)
                .add_root_certificates(self.ca.cert.clone())
        } else {
            options
        }
    }

    /// Node `i`'s client address.
    pub fn addr(&self, i: usize) -> std::net::SocketAddr {
        std::net::SocketAddr::from(([127, 0, 0, 1], self.nodes[i].port))
    }

    /// Kills a node (SIGKILL).
    pub async fn kill(&mut self, i: usize) {
        if let Some(mut child) = self.nodes[i].child.take() {
            let _ = child.kill().await;
        }
    }

    /// Starts a killed node again on its ports and store, and waits until it is ready.
    pub async fn restart(&mut self, i: usize) {
        self.kill(i).await;
        self.spawn(i);
        self.wait_ready(i).await;
    }

    /// Rewrites the users and has every running node reload its configuration.
    pub async fn set_users(&mut self, users: &[String]) {
        let reloads = |log: String| log.matches("Reloaded server configuration").count();
        let before: Vec<usize> = (0..self.nodes.len())
            .map(|i| reloads(self.log(i)))
            .collect();
        self.write_users(users);
        for node in &self.nodes {
            if let Some(pid) = node.child.as_ref().and_then(Child::id) {
                let _ = nix_hup(pid);
            }
        }
        // A reload is applied asynchronously; the log says when.
        let deadline = Instant::now() + Duration::from_secs(30);
        for (i, before) in before.into_iter().enumerate() {
            if self.nodes[i].child.is_none() {
                continue;
            }
            while reloads(self.log(i)) <= before {
                assert!(Instant::now() < deadline, "nats-server did not reload");
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    }
}

fn nix_hup(pid: u32) -> std::io::Result<()> {
    let status = std::process::Command::new("kill")
        .args(["-HUP", &pid.to_string()])
        .status()?;
    if status.success() {
        Ok(())
    } else {
        Err(std::io::Error::other("kill -HUP failed"))
    }
}

async fn healthz(port: u16) -> bool {
    let Ok(mut stream) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else {
        return false;
    };
    let request = "GET /healthz HTTP/1.0\r\nHost: localhost\r\n\r\n";
    if stream.write_all(request.as_bytes()).await.is_err() {
        return false;
    }
    let mut response = String::new();
    let _ =
        tokio::time::timeout(Duration::from_secs(5), stream.read_to_string(&mut response)).await;
    response.starts_with("HTTP/1.0 200") || response.starts_with("HTTP/1.1 200")
}
