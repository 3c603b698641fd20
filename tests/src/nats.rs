//! A real NATS server (Debian's `nats-server`, JetStream on) for the gateway tests: one node, or
//! a three-node cluster on loopback, each node with its own store, killable and restartable on
//! the same ports. Authorization is a users file the test writes (and may rewrite and reload).

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
}

impl NatsCluster {
    /// Starts `size` nodes (1, or 3 for a cluster) and waits until JetStream answers on each.
    /// `users` is the body of `authorization { users = [ ... ] }`; empty: no authorization.
    pub async fn start(size: usize, users: &[String]) -> NatsCluster {
        let dir = tempfile::tempdir().expect("temp dir");
        let nodes = (0..size)
            .map(|i| Node {
                name: format!("n{i}"),
                port: free_port(),
                cluster_port: free_port(),
                monitor_port: free_port(),
                child: None,
            })
            .collect();
        let mut cluster = NatsCluster { dir, nodes };
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
        let mut config = format!(
            "server_name: {name}\nlisten: 127.0.0.1:{port}\nhttp: 127.0.0.1:{monitor}\n\
             jetstream {{\n  store_dir: \"{store}\"\n  max_memory_store: 64MB\n  max_file_store: 1GB\n}}\n\
             include \"users.conf\"\n",
            name = node.name,
            port = node.port,
            monitor = node.monitor_port,
            store = store.display(),
        );
        if self.nodes.len() > 1 {
            let routes: Vec<String> = self
                .nodes
                .iter()
                .filter(|n| n.name != node.name)
                .map(|n| format!("nats-route://127.0.0.1:{}", n.cluster_port))
                .collect();
            config.push_str(&format!(
                "cluster {{\n  name: racp\n  listen: 127.0.0.1:{}\n  routes: [{}]\n}}\n",
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
        self.nodes
            .iter()
            .map(|n| format!("nats://127.0.0.1:{}", n.port))
            .collect::<Vec<_>>()
            .join(",")
    }

    pub fn url(&self, i: usize) -> String {
        format!("nats://{}", self.addr(i))
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
