//! A real OpenSSH server for tests: `/usr/sbin/sshd` on a loopback port the OS chose, with its
//! own host key (ed25519, RSA, ECDSA P-256 or P-384), an authorized client key and its configuration in a temporary directory. Tests
//! drive it with the OpenSSH client ([`SshServer::openssh`]) or with the bootstrapper.
//!
//! [`SshServer::kill_all`] ends the listener *and* every per-connection process below it, as a
//! network cut or a reboot of sshd would: processes that left the tree (a `setsid` daemon whose
//! parent exited) survive it.

use crate::PATIENCE;
use std::collections::{BTreeMap, BTreeSet};
use std::io::{Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};
use tokio::io::AsyncReadExt;

const SSHD: &str = "/usr/sbin/sshd";
const POLL: Duration = Duration::from_millis(20);

/// The type of the server's one host key (sshd offers only that one, so a client that knows
/// another type for the host has no way around the mismatch).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum HostKeyType {
    #[default]
    Ed25519,
    Rsa,
    EcdsaP256,
    EcdsaP384,
}

impl HostKeyType {
    /// `ssh-keygen` arguments (RSA at 2048 bits, which is quick to generate).
    fn keygen_args(self) -> &'static [&'static str] {
        match self {
            HostKeyType::Ed25519 => &["-t", "ed25519"],
            HostKeyType::Rsa => &["-t", "rsa", "-b", "2048"],
            HostKeyType::EcdsaP256 => &["-t", "ecdsa", "-b", "256"],
            HostKeyType::EcdsaP384 => &["-t", "ecdsa", "-b", "384"],
        }
    }

    fn file_name(self) -> &'static str {
        match self {
            HostKeyType::Ed25519 => "host_ed25519",
            HostKeyType::Rsa => "host_rsa",
            HostKeyType::EcdsaP256 => "host_ecdsa_p256",
            HostKeyType::EcdsaP384 => "host_ecdsa_p384",
        }
    }
}

/// Generates an unencrypted key pair of `kind` at `path` (and `path.pub`); returns the public
/// key as `type AAAA...` (no comment).
pub fn generate_key(path: &Path, kind: HostKeyType) -> String {
    keygen_typed(path, kind, None);
    public_key_of(path)
}

fn public_key_of(private_key: &Path) -> String {
    let public = std::fs::read_to_string(private_key.with_extension("pub")).expect("public key");
    public
        .split_whitespace()
        .take(2)
        .collect::<Vec<_>>()
        .join(" ")
}

/// How the server is configured.
#[derive(Clone, Debug)]
pub struct SshdOptions {
    /// The host key's type (ed25519 by default).
    pub host_key: HostKeyType,
    /// `AllowTcpForwarding yes` (the default) or `no`.
    pub allow_tcp_forwarding: bool,
    /// Listen on `[::1]` too, on the same port (see [`ipv6_loopback`]).
    pub listen_ipv6: bool,
    /// Extra `sshd_config` lines, appended after the generated ones (sshd takes the first value
    /// it reads for most keywords, so these add rather than override).
    pub extra_config: Vec<String>,
    /// The login shell and home directory sshd gives the user, instead of the ones in
    /// /etc/passwd (see [`RemoteAccount`]).
    pub account: Option<RemoteAccount>,
    /// Directories put first on the `PATH` of every session (`SetEnv PATH=...`): stand-in
    /// commands the remote then runs instead of the system's.
    pub path_prefix: Vec<PathBuf>,
    /// `/tmp` is `noexec` for sshd and everything it runs: sshd starts in a private mount
    /// namespace where /tmp is bind-mounted onto itself with `noexec` (the rest of the machine
    /// keeps its /tmp). Needs CAP_SYS_ADMIN, which the test user (root) has.
    pub noexec_tmp: bool,
}

/// The remote user as sshd sees it: sshd looks the user up with getpwnam(3), and runs under
/// nss_wrapper (Debian's libnss-wrapper, an LD_PRELOAD library made for tests) with a passwd
/// file where the user has this shell and home. The sessions' own environment is built by sshd
/// and does not carry LD_PRELOAD, so the shell and what it runs see the real system.
#[derive(Clone, Debug)]
pub struct RemoteAccount {
    /// The login shell: sshd runs every command as `SHELL -c COMMAND`, with `argv[0]` the
    /// shell's file name (so a symlink named `ash` to busybox runs busybox's ash).
    pub shell: PathBuf,
    /// The home directory (`$HOME`, and the directory sessions start in).
    pub home: PathBuf,
}

/// The nss_wrapper library [`RemoteAccount`] needs (scripts/test installs libnss-wrapper).
pub const NSS_WRAPPER: &str = "libnss_wrapper.so";

/// Whether nss_wrapper is installed.
pub fn nss_wrapper_installed() -> bool {
    [
        "/usr/lib/x86_64-linux-gnu",
        "/usr/lib/aarch64-linux-gnu",
        "/usr/lib",
        "/usr/lib64",
    ]
    .iter()
    .any(|dir| Path::new(dir).join(NSS_WRAPPER).exists())
}

impl Default for SshdOptions {
    fn default() -> Self {
        SshdOptions {
            host_key: HostKeyType::default(),
            allow_tcp_forwarding: true,
            listen_ipv6: false,
            extra_config: Vec::new(),
            account: None,
            path_prefix: Vec::new(),
            noexec_tmp: false,
        }
    }
}

/// A running (or, between [`SshServer::kill_all`] and [`SshServer::restart`], stopped) sshd.
pub struct SshServer {
    listener: Option<Child>,
    port: u16,
    user: String,
    options: SshdOptions,
    client_key: PathBuf,
    /// How many keys [`SshServer::add_client_key`] made, for unique names.
    extra_keys: std::sync::atomic::AtomicUsize,
    // Last, so the directory outlives the processes that use it.
    dir: tempfile::TempDir,
}

impl SshServer {
    /// Generates the keys and the configuration and starts sshd; returns once it answers with an
    /// SSH banner.
    pub async fn start(options: SshdOptions) -> SshServer {
        assert!(
            Path::new(SSHD).exists(),
            "{SSHD} is missing: install openssh-server (scripts/test does)"
        );
        // sshd refuses to start as root without its privilege separation directory.
        if !Path::new("/run/sshd").exists() {
            let _ = std::fs::create_dir_all("/run/sshd");
            let _ = set_mode(Path::new("/run/sshd"), 0o755);
        }
        let dir = tempfile::Builder::new()
            .prefix("sshd-")
            .tempdir()
            .expect("temp dir");
        keygen_typed(
            &dir.path().join(options.host_key.file_name()),
            options.host_key,
            None,
        );
        let client_key = dir.path().join("client_ed25519");
        keygen(&client_key, None);
        std::fs::copy(
            client_key.with_extension("pub"),
            dir.path().join("authorized_keys"),
        )
        .expect("write authorized_keys");
        let user = current_user();
        let mut server = SshServer {
            listener: None,
            port: 0,
            user,
            options,
            client_key,
            extra_keys: Default::default(),
            dir,
        };
        // The port is free when we look and taken by someone else when sshd binds: try another.
        for attempt in 1.. {
            server.port = free_port();
            match server.spawn().await {
                Ok(()) => return server,
                Err(why) if attempt < 5 => eprintln!("sshd start (attempt {attempt}): {why}"),
                Err(why) => panic!("sshd did not start: {why}\n{}", server.log()),
            }
        }
        unreachable!()
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The server's temporary directory (keys, config, log; tests may add files).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The user to log in as: the one running the tests (sshd authenticates no one else when it
    /// does not run as root).
    pub fn user(&self) -> String {
        self.user.clone()
    }

    /// An unencrypted private key the server accepts.
    pub fn client_key(&self) -> &Path {
        &self.client_key
    }

    /// A new ed25519 key (encrypted with `passphrase` when given) that the server accepts too.
    pub fn add_client_key(&self, passphrase: Option<&str>) -> PathBuf {
        let n = self
            .extra_keys
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let key = self.dir().join(format!("client_{n}_ed25519"));
        keygen(&key, passphrase);
        let public = std::fs::read_to_string(key.with_extension("pub")).expect("public key");
        let mut authorized = std::fs::OpenOptions::new()
            .append(true)
            .open(self.dir().join("authorized_keys"))
            .expect("open authorized_keys");
        authorized
            .write_all(public.as_bytes())
            .expect("append to authorized_keys");
        key
    }

    /// `ssh-ed25519 AAAA...` (no comment; the type is the one [`SshdOptions::host_key`] chose).
    pub fn host_public_key(&self) -> String {
        public_key_of(&self.host_key_path())
    }

    fn host_key_path(&self) -> PathBuf {
        self.dir().join(self.options.host_key.file_name())
    }

    /// The server's `known_hosts` line: `[127.0.0.1]:PORT ssh-ed25519 AAAA...`.
    pub fn known_hosts_line(&self) -> String {
        format!("[127.0.0.1]:{} {}", self.port, self.host_public_key())
    }

    /// Writes an OpenSSH client configuration for this server under `alias` (strict host key
    /// checking against `known_hosts`, batch mode, only the client key); returns its path.
    pub fn write_ssh_config(&self, alias: &str, known_hosts: &Path) -> PathBuf {
        let path = self.dir().join(format!("ssh_config.{alias}"));
        let config = format!(
            "Host {alias}\n\
             \x20 HostName 127.0.0.1\n\
             \x20 Port {port}\n\
             \x20 User {user}\n\
             \x20 IdentityFile {key}\n\
             \x20 IdentitiesOnly yes\n\
             \x20 IdentityAgent none\n\
             \x20 UserKnownHostsFile {known_hosts}\n\
             \x20 GlobalKnownHostsFile /dev/null\n\
             \x20 StrictHostKeyChecking yes\n\
             \x20 UpdateHostKeys no\n\
             \x20 BatchMode yes\n\
             \x20 ConnectTimeout 30\n\
             \x20 LogLevel ERROR\n",
            port = self.port,
            user = self.user,
            key = self.client_key.display(),
            known_hosts = known_hosts.display(),
        );
        std::fs::write(&path, config).expect("write ssh config");
        path
    }

    /// `ssh -F config alias`: append the remote command (and set stdio) to run it.
    pub fn openssh(&self, config: &Path, alias: &str) -> tokio::process::Command {
        let mut command = tokio::process::Command::new("ssh");
        command.arg("-F").arg(config).arg(alias).kill_on_drop(true);
        command
    }

    /// SIGKILLs the listener and every process below it (the per-connection sshd processes and
    /// what they run); waits until they are gone and the port refuses connections.
    pub async fn kill_all(&mut self) {
        let victims = self.kill_tree();
        let deadline = Instant::now() + PATIENCE;
        while victims.iter().any(|&pid| alive(pid)) {
            assert!(
                Instant::now() < deadline,
                "sshd processes still alive after SIGKILL"
            );
            tokio::time::sleep(POLL).await;
        }
        let addr = self.addr();
        loop {
            match tokio::net::TcpStream::connect(addr).await {
                Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => break,
                _ => {}
            }
            assert!(
                Instant::now() < deadline,
                "port {} still answers after sshd was killed",
                self.port
            );
            tokio::time::sleep(POLL).await;
        }
    }

    /// Starts sshd again on the same port with the same keys (after [`SshServer::kill_all`]; it
    /// calls that itself if the server still runs).
    pub async fn restart(&mut self) {
        if self.listener.is_some() {
            self.kill_all().await;
        }
        // The port may still be held briefly (TIME_WAIT, a closing socket): retry on it.
        let deadline = Instant::now() + PATIENCE;
        loop {
            match self.spawn().await {
                Ok(()) => return,
                Err(why) if Instant::now() < deadline => {
                    eprintln!("sshd restart on port {}: {why}", self.port);
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
                Err(why) => panic!("sshd did not restart: {why}\n{}", self.log()),
            }
        }
    }

    /// Kills the server, replaces its host key and starts it again on the same port: a client
    /// that knows the old key must refuse it.
    pub async fn restart_with_new_host_key(&mut self) {
        self.kill_all().await;
        let key = self.host_key_path();
        let _ = std::fs::remove_file(&key);
        let _ = std::fs::remove_file(key.with_extension("pub"));
        keygen_typed(&key, self.options.host_key, None);
        self.restart().await;
    }

    /// Everything sshd has logged (its stderr, `LogLevel VERBOSE`) across starts.
    pub fn log(&self) -> String {
        std::fs::read_to_string(self.log_path()).unwrap_or_default()
    }

    fn addr(&self) -> SocketAddr {
        SocketAddr::from((Ipv4Addr::LOCALHOST, self.port))
    }

    fn log_path(&self) -> PathBuf {
        self.dir().join("sshd.log")
    }

    fn write_config(&self) -> PathBuf {
        let dir = self.dir();
        let mut lines = vec![
            format!("ListenAddress 127.0.0.1:{}", self.port),
            if self.options.listen_ipv6 {
                format!("ListenAddress [::1]:{}", self.port)
            } else {
                String::new()
            },
            format!("HostKey {}", self.host_key_path().display()),
            format!("PidFile {}", dir.join("sshd.pid").display()),
            format!(
                "AuthorizedKeysFile {}",
                dir.join("authorized_keys").display()
            ),
            "AuthenticationMethods publickey".into(),
            "PubkeyAuthentication yes".into(),
            "PasswordAuthentication no".into(),
            "KbdInteractiveAuthentication no".into(),
            "PermitRootLogin yes".into(),
            format!(
                "AllowTcpForwarding {}",
                if self.options.allow_tcp_forwarding {
                    "yes"
                } else {
                    "no"
                }
            ),
            // scp speaks SFTP since OpenSSH 9.
            "Subsystem sftp internal-sftp".into(),
            "StrictModes no".into(),
            "UsePAM no".into(),
            "PrintMotd no".into(),
            "PrintLastLog no".into(),
            "MaxStartups 100".into(),
            "MaxSessions 100".into(),
            "LogLevel VERBOSE".into(),
            "ClientAliveInterval 0".into(),
        ];
        if !self.options.path_prefix.is_empty() {
            let mut path: Vec<String> = self
                .options
                .path_prefix
                .iter()
                .map(|p| p.display().to_string())
                .collect();
            path.push("/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin".into());
            lines.push(format!("SetEnv PATH={}", path.join(":")));
        }
        lines.extend(self.options.extra_config.iter().cloned());
        let path = dir.join("sshd_config");
        std::fs::write(&path, lines.join("\n") + "\n").expect("write sshd_config");
        path
    }

    /// A copy of /etc/passwd where the user has the account's shell and home (the other users,
    /// sshd's privilege separation user among them, stay as they are).
    fn write_passwd(&self, account: &RemoteAccount) -> PathBuf {
        let passwd = std::fs::read_to_string("/etc/passwd").expect("read /etc/passwd");
        let mut found = false;
        let lines: Vec<String> = passwd
            .lines()
            .map(|line| {
                let mut fields: Vec<String> = line.split(':').map(str::to_string).collect();
                if fields.len() == 7 && fields[0] == self.user {
                    found = true;
                    fields[5] = account.home.display().to_string();
                    fields[6] = account.shell.display().to_string();
                }
                fields.join(":")
            })
            .collect();
        assert!(found, "{} is not in /etc/passwd", self.user);
        let path = self.dir().join("passwd");
        std::fs::write(&path, lines.join("\n") + "\n").expect("write passwd");
        path
    }

    /// Starts sshd on `self.port`; Ok once it logged that it listens and answered a banner.
    async fn spawn(&mut self) -> Result<(), String> {
        let config = self.write_config();
        let log_path = self.log_path();
        let offset = std::fs::metadata(&log_path).map(|m| m.len()).unwrap_or(0);
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("open sshd log");
        let mut command = if self.options.noexec_tmp {
            // unshare and sh exec in place: the listener's pid stays sshd's.
            let mut command = std::process::Command::new("unshare");
            command.args([
                "--mount",
                "--propagation",
                "private",
                "sh",
                "-c",
                "mount --bind /tmp /tmp && mount -o remount,bind,noexec /tmp && exec \"$@\"",
                "sh",
                SSHD,
            ]);
            command
        } else {
            std::process::Command::new(SSHD)
        };
        if let Some(account) = &self.options.account {
            command
                .env("LD_PRELOAD", NSS_WRAPPER)
                .env("NSS_WRAPPER_PASSWD", self.write_passwd(account))
                .env("NSS_WRAPPER_GROUP", "/etc/group");
        }
        let child = command
            .args(["-D", "-e", "-f"])
            .arg(&config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .spawn()
            .map_err(|e| format!("spawn {SSHD}: {e}"))?;
        self.listener = Some(child);
        let mut listening = vec![format!("Server listening on 127.0.0.1 port {}", self.port)];
        if self.options.listen_ipv6 {
            listening.push(format!("Server listening on ::1 port {}", self.port));
        }
        let deadline = Instant::now() + PATIENCE;
        loop {
            let since = read_from(&log_path, offset);
            if listening.iter().all(|line| since.contains(line)) {
                break;
            }
            // sshd carries on with the addresses it could bind; this server wants them all.
            if since.contains("Bind to port") {
                self.kill_tree();
                return Err(format!("sshd could not bind: {}", since.trim()));
            }
            let exited = self
                .listener
                .as_mut()
                .and_then(|c| c.try_wait().ok().flatten());
            if let Some(status) = exited {
                self.listener = None;
                return Err(format!("sshd exited ({status}): {}", since.trim()));
            }
            if Instant::now() > deadline {
                self.kill_tree();
                return Err(format!("sshd did not listen in time: {}", since.trim()));
            }
            tokio::time::sleep(POLL).await;
        }
        // It says it listens; the banner proves it is this sshd that answers.
        let banner = tokio::time::timeout(PATIENCE, async {
            let mut stream = tokio::net::TcpStream::connect(self.addr()).await?;
            let mut buf = Vec::new();
            let mut chunk = [0u8; 256];
            while !buf.windows(7).any(|w| w == b"SSH-2.0") {
                let n = stream.read(&mut chunk).await?;
                if n == 0 {
                    break;
                }
                buf.extend_from_slice(&chunk[..n]);
            }
            Ok::<_, std::io::Error>(String::from_utf8_lossy(&buf).into_owned())
        })
        .await;
        match banner {
            Ok(Ok(text)) if text.contains("SSH-2.0") => Ok(()),
            other => {
                self.kill_tree();
                Err(format!("no SSH banner on port {}: {other:?}", self.port))
            }
        }
    }

    /// SIGKILLs the listener and its descendants; returns the pids that were sent the signal
    /// (other than the listener, which is reaped here).
    fn kill_tree(&mut self) -> Vec<u32> {
        let Some(mut listener) = self.listener.take() else {
            return Vec::new();
        };
        let root = listener.id();
        // Freeze the tree first so nothing forks or exits between the scan and the kill (a
        // process whose parent died would be reparented out of the tree and missed).
        let mut frozen = BTreeSet::from([root]);
        signal("STOP", &frozen);
        loop {
            let found = descendants(root);
            let new: BTreeSet<u32> = found.difference(&frozen).copied().collect();
            if new.is_empty() {
                break;
            }
            signal("STOP", &new);
            frozen.extend(new);
        }
        signal("KILL", &frozen);
        let _ = listener.kill();
        let _ = listener.wait();
        frozen.remove(&root);
        frozen.into_iter().collect()
    }
}

impl Drop for SshServer {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let log = std::fs::read(self.log_path()).unwrap_or_default();
            let tail = String::from_utf8_lossy(&log[log.len().saturating_sub(4 << 10)..]);
            eprintln!("--- sshd log (tail) ---\n{tail}");
        }
        self.kill_tree();
    }
}

/// `ssh-keygen -q -t ed25519 -N PASSPHRASE -f PATH -C test`.
fn keygen(path: &Path, passphrase: Option<&str>) {
    keygen_typed(path, HostKeyType::Ed25519, passphrase);
}

/// `ssh-keygen -q -t TYPE [-b BITS] -N PASSPHRASE -f PATH -C test`.
fn keygen_typed(path: &Path, kind: HostKeyType, passphrase: Option<&str>) {
    let output = std::process::Command::new("ssh-keygen")
        .arg("-q")
        .args(kind.keygen_args())
        .args(["-N", passphrase.unwrap_or(""), "-C", "test", "-f"])
        .arg(path)
        .stdin(Stdio::null())
        .output()
        .expect("run ssh-keygen");
    assert!(
        output.status.success(),
        "ssh-keygen failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

fn current_user() -> String {
    let output = std::process::Command::new("id")
        .arg("-un")
        .output()
        .expect("run id -un");
    assert!(output.status.success(), "id -un failed");
    String::from_utf8_lossy(&output.stdout).trim().to_string()
}

fn set_mode(path: &Path, mode: u32) -> std::io::Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
}

/// Whether this machine has an IPv6 loopback to listen on (containers may not).
pub fn ipv6_loopback() -> bool {
    TcpListener::bind((std::net::Ipv6Addr::LOCALHOST, 0)).is_ok()
}

/// A port that was free a moment ago.
fn free_port() -> u16 {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0)).expect("bind 127.0.0.1:0");
    listener.local_addr().expect("local addr").port()
}

fn read_from(path: &Path, offset: u64) -> String {
    use std::io::Seek;
    let mut text = String::new();
    if let Ok(mut file) = std::fs::File::open(path) {
        let _ = file.seek(std::io::SeekFrom::Start(offset));
        let mut bytes = Vec::new();
        let _ = file.read_to_end(&mut bytes);
        text = String::from_utf8_lossy(&bytes).into_owned();
    }
    text
}

/// Sends `kill -SIG` to each pid (errors ignored: a process may be gone already).
fn signal(name: &str, pids: &BTreeSet<u32>) {
    if pids.is_empty() {
        return;
    }
    let _ = std::process::Command::new("kill")
        .arg(format!("-{name}"))
        .args(pids.iter().map(u32::to_string))
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status();
}

/// Every live process whose chain of parents reaches `root` (from /proc).
fn descendants(root: u32) -> BTreeSet<u32> {
    let mut children: BTreeMap<u32, Vec<u32>> = BTreeMap::new();
    for entry in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|s| s.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some((ppid, _)) = stat(pid) {
            children.entry(ppid).or_default().push(pid);
        }
    }
    let mut found = BTreeSet::new();
    let mut queue = vec![root];
    while let Some(pid) = queue.pop() {
        for &child in children.get(&pid).into_iter().flatten() {
            if found.insert(child) {
                queue.push(child);
            }
        }
    }
    found
}

/// (parent pid, state letter) from /proc/PID/stat.
fn stat(pid: u32) -> Option<(u32, char)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name is in parentheses and may itself hold spaces or parentheses.
    let rest = &text[text.rfind(')')? + 2..];
    let mut fields = rest.split_whitespace();
    let state = fields.next()?.chars().next()?;
    let ppid = fields.next()?.parse().ok()?;
    Some((ppid, state))
}

/// Whether a process exists and is not a zombie (a zombie whose parent never reaps it would
/// otherwise look alive forever).
pub fn alive(pid: u32) -> bool {
    matches!(stat(pid), Some((_, state)) if state != 'Z' && state != 'X')
}
