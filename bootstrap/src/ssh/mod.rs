//! SSH with russh: resolve a destination through the user's config, connect (through ProxyJump
//! hops), check the host key against known_hosts, authenticate with the agent or key files, then
//! run commands, upload files and open direct-tcpip channels.
//!
//! russh leaves host-key checking, keepalive and nodelay to the caller: [`connect`] checks the
//! key ([`host_key`]), and turns keepalive and nodelay on.

pub mod config;
pub mod forward;
pub mod host_key;
pub mod peer_uid;
pub mod prompt;

use crate::ssh::config::Destination;
use crate::ssh::host_key::{HostKeyPolicy, KnownHostsCheck};
use russh::client::{self, Handle};
use russh::keys::agent::AgentIdentity;
use russh::keys::agent::client::AgentClient;
use russh::keys::{Algorithm, HashAlg, PrivateKeyWithHashAlg, PublicKey};
use russh::{ChannelMsg, ChannelOpenFailure, ChannelStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite};
use tokio::sync::watch;

/// Asks for a key file's passphrase; `None` gives up on that key.
pub type PassphrasePrompt = Arc<dyn Fn(&Path) -> Option<String> + Send + Sync>;

/// How a connection behaves; the defaults suit an interactive user.
#[derive(Clone)]
pub struct ConnectOptions {
    pub host_key: HostKeyPolicy,
    pub passphrase: Option<PassphrasePrompt>,
    /// Keepalive probes; three unanswered ones close the connection.
    pub keepalive: Duration,
    /// Whether keys held by the ssh-agent (`SSH_AUTH_SOCK`) are tried first.
    pub use_agent: bool,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            host_key: HostKeyPolicy::Strict,
            passphrase: None,
            keepalive: Duration::from_secs(5),
            use_agent: true,
        }
    }
}

/// Why an SSH step failed.
#[derive(Debug, thiserror::Error)]
pub enum SshError {
    #[error("cannot reach {target}: {reason}")]
    Unreachable { target: String, reason: String },
    /// Boxed: the details would make every `Result<_, SshError>` large.
    #[error("{0}")]
    HostKeyChanged(Box<ChangedHostKey>),
    #[error(
        "the host key of {host} ({fingerprint}) is marked @revoked on line {line} of \
         {known_hosts}: it may have been stolen, and is refused"
    )]
    HostKeyRevoked {
        host: String,
        known_hosts: String,
        line: usize,
        fingerprint: String,
    },
    #[error(
        "{host} is not in {known_hosts} (key {fingerprint}); confirm the fingerprint and run \
         again with --accept-new to trust it"
    )]
    HostKeyUnknown {
        host: String,
        known_hosts: String,
        fingerprint: String,
    },
    #[error("cannot use {known_hosts}: {reason}")]
    KnownHosts { known_hosts: String, reason: String },
    #[error(
        "{user}@{host} refused every key ({tried}); add one of your keys to the remote's authorized_keys or load it into ssh-agent"
    )]
    AuthFailed {
        user: String,
        host: String,
        tried: String,
    },
    #[error("cannot use the key file {path}: {reason}")]
    KeyFile { path: String, reason: String },
    #[error("cannot read {path}: {reason}")]
    LocalFile { path: String, reason: String },
    #[error("cannot open a channel to {target} on the remote: {reason}")]
    ChannelOpen {
        target: String,
        reason: String,
        /// The server forbids it (`AllowTcpForwarding no`, PermitOpen), rather than the target
        /// being closed.
        prohibited: bool,
    },
    #[error("{0} timed out")]
    Timeout(String),
    #[error("SSH: {0}")]
    Protocol(#[from] russh::Error),
}

impl From<russh::keys::Error> for SshError {
    fn from(err: russh::keys::Error) -> Self {
        SshError::Protocol(russh::Error::from(err))
    }
}

/// A host key that matches none of the keys on record for the host (docs/reliability.md 4.9).
#[derive(Debug, thiserror::Error)]
#[error(
    "REMOTE HOST IDENTIFICATION HAS CHANGED: the host key of {host} is not the one on record. \
     The server offered the {algorithm} key {fingerprint}; line {line} of {known_hosts} records \
     the {recorded_algorithm} key {recorded_fingerprint}, and no key on record for {host} \
     matches. Someone may be intercepting the connection, or the host was reinstalled. Check \
     the new key's fingerprint with the host's administrator, then remove the old keys \
     (ssh-keygen -R '{host}' -f '{known_hosts}')"
)]
pub struct ChangedHostKey {
    /// The name looked up (`host`, `[host]:port` or the HostKeyAlias).
    pub host: String,
    pub known_hosts: String,
    /// The line of the key on record that `ssh` names too (the last one for the host).
    pub line: usize,
    /// The offered key.
    pub fingerprint: String,
    pub algorithm: String,
    /// The key on record at `line`.
    pub recorded_fingerprint: String,
    pub recorded_algorithm: String,
}

/// The russh event handler: checks the host key, reports the end of the connection.
struct Client {
    host: String,
    port: u16,
    host_key_alias: Option<String>,
    known_hosts: PathBuf,
    other_known_hosts: Vec<PathBuf>,
    policy: HostKeyPolicy,
    closed: watch::Sender<bool>,
}

impl client::Handler for Client {
    type Error = SshError;

    async fn check_server_key(
        &mut self,
        key: &russh::keys::PublicKeyOrCertificate,
    ) -> Result<bool, SshError> {
        let russh::keys::PublicKeyOrCertificate::PublicKey { key, .. } = key else {
            return Err(SshError::KnownHosts {
                known_hosts: self.known_hosts.display().to_string(),
                reason: "the server offered a host certificate; only plain host keys are supported"
                    .into(),
            });
        };
        let check = KnownHostsCheck {
            host: &self.host,
            port: self.port,
            host_key_alias: self.host_key_alias.as_deref(),
            known_hosts: &self.known_hosts,
            other_known_hosts: &self.other_known_hosts,
        };
        check.verify(key, &self.policy).await
    }

    async fn disconnected(
        &mut self,
        reason: client::DisconnectReason<SshError>,
    ) -> Result<(), SshError> {
        let _ = self.closed.send(true);
        match reason {
            client::DisconnectReason::ReceivedDisconnect(_) => Ok(()),
            client::DisconnectReason::Error(err) => Err(err),
        }
    }
}

/// A byte stream an SSH connection can run over: a TCP socket or a channel through a jump host.
trait Transport: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Transport for T {}

/// An authenticated SSH connection.
pub struct SshSession {
    handle: Handle<Client>,
    // Jump hosts' connections carry this one; they live as long as it does.
    _jumps: Vec<Handle<Client>>,
    closed: watch::Receiver<bool>,
    destination: Destination,
}

/// Steps of [`connect`], reported as they start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConnectStep {
    /// TCP (and jump hosts).
    Connect,
    /// Key exchange and the known_hosts check.
    HostKey,
    Authenticate,
}

/// Connects, checks the host key and authenticates, hopping through `destination.jumps`.
pub async fn connect(
    destination: &Destination,
    options: &ConnectOptions,
    mut on_step: impl FnMut(ConnectStep),
) -> Result<SshSession, SshError> {
    on_step(ConnectStep::Connect);
    // Owned hops, first jump first: borrowed iterators held across awaits make the future
    // too general for tokio::spawn.
    let hops: Vec<Destination> = destination
        .jumps
        .iter()
        .cloned()
        .chain(std::iter::once(destination.clone()))
        .collect();
    let mut jumps: Vec<Handle<Client>> = Vec::new();
    let mut transport: Box<dyn Transport> = Box::new(tcp_connect(&hops[0]).await?);
    for (index, current) in hops.iter().enumerate() {
        let next = hops.get(index + 1);
        if next.is_none() {
            on_step(ConnectStep::HostKey);
        }
        let (mut handle, closed) = handshake(current, transport, options).await?;
        if next.is_none() {
            on_step(ConnectStep::Authenticate);
        }
        authenticate(&mut handle, current, options).await?;
        let Some(next) = next else {
            return Ok(SshSession {
                handle,
                _jumps: jumps,
                closed,
                destination: destination.clone(),
            });
        };
        let channel = open_direct_tcpip(&handle, &next.host, next.port, next.connect_timeout)
            .await
            .map_err(|err| SshError::Unreachable {
                target: next.display(),
                reason: format!("through the jump host {}: {err}", current.display()),
            })?;
        transport = Box::new(channel.into_stream());
        jumps.push(handle);
    }
    Err(SshError::Unreachable {
        target: destination.display(),
        reason: "no hops to connect through".into(),
    })
}

async fn tcp_connect(destination: &Destination) -> Result<tokio::net::TcpStream, SshError> {
    let address = (destination.host.as_str(), destination.port);
    let unreachable = |reason: String| SshError::Unreachable {
        target: destination.display(),
        reason,
    };
    let socket = tokio::time::timeout(
        destination.connect_timeout,
        tokio::net::TcpStream::connect(address),
    )
    .await
    .map_err(|_| {
        unreachable(format!(
            "no answer within {:?}",
            destination.connect_timeout
        ))
    })?
    .map_err(|err| unreachable(err.to_string()))?;
    let _ = socket.set_nodelay(true);
    Ok(socket)
}

/// AES-GCM first: ring runs it on the CPU's AES instructions, faster than russh's portable
/// ChaCha20-Poly1305 (russh's default first choice). docs/benchmarks.md has the forward's
/// throughput with each.
const PREFERRED_CIPHERS: &[russh::cipher::Name] = &[
    russh::cipher::AES_256_GCM,
    russh::cipher::AES_128_GCM,
    russh::cipher::CHACHA20_POLY1305,
    russh::cipher::AES_256_CTR,
    russh::cipher::AES_192_CTR,
    russh::cipher::AES_128_CTR,
];

async fn handshake(
    destination: &Destination,
    transport: Box<dyn Transport>,
    options: &ConnectOptions,
) -> Result<(Handle<Client>, watch::Receiver<bool>), SshError> {
    let config = client::Config {
        keepalive_interval: Some(options.keepalive),
        keepalive_max: 3,
        nodelay: true,
        inactivity_timeout: None,
        preferred: russh::Preferred {
            cipher: std::borrow::Cow::Borrowed(PREFERRED_CIPHERS),
            ..russh::Preferred::default()
        },
        ..client::Config::default()
    };
    let (closed_tx, closed) = watch::channel(false);
    let handler = Client {
        host: destination.host.clone(),
        port: destination.port,
        host_key_alias: destination.host_key_alias.clone(),
        known_hosts: destination.known_hosts.clone(),
        other_known_hosts: destination.other_known_hosts.clone(),
        policy: options.host_key.clone(),
        closed: closed_tx,
    };
    // The server's LoginGraceTime bounds the exchange, but an unknown host may wait for a
    // person to answer; only a silent server is cut short here.
    let handle = client::connect_stream(Arc::new(config), transport, handler).await?;
    Ok((handle, closed))
}

async fn authenticate(
    handle: &mut Handle<Client>,
    destination: &Destination,
    options: &ConnectOptions,
) -> Result<(), SshError> {
    let mut tried: Vec<String> = Vec::new();
    let rsa_hash = handle.best_supported_rsa_hash().await?.flatten();
    let wanted_public: Vec<PublicKey> = destination
        .identity_files
        .iter()
        .filter_map(|path| read_public_key(path))
        .collect();
    if options.use_agent
        && let Some(socket) = agent_socket(destination)
        && let Ok(mut agent) = AgentClient::connect_uds(&socket).await
    {
        let keys = agent_keys(&mut agent, destination, &wanted_public).await;
        let offered = keys.len();
        for key in keys {
            let hash = signature_hash(key.algorithm(), rsa_hash);
            match handle
                .authenticate_publickey_with(&destination.user, key, hash, &mut agent)
                .await
            {
                Ok(result) if result.success() => return Ok(()),
                Ok(_) => {}
                Err(err) => tracing::debug!(%err, "the agent could not sign"),
            }
        }
        if offered > 0 {
            tried.push(format!("{offered} ssh-agent key(s)"));
        }
    }
    if with_key_files(handle, destination, options, rsa_hash, &mut tried).await? {
        return Ok(());
    }
    Err(SshError::AuthFailed {
        user: destination.user.clone(),
        host: destination.host.clone(),
        tried: if tried.is_empty() {
            "no ssh-agent keys and no key files were found".into()
        } else {
            format!("tried {}", tried.join(", "))
        },
    })
}

/// The ssh-agent's socket: IdentityAgent's path, none when it says `none`, else
/// `SSH_AUTH_SOCK`.
fn agent_socket(destination: &Destination) -> Option<PathBuf> {
    match destination.identity_agent.as_deref() {
        Some(none) if none.eq_ignore_ascii_case("none") => None,
        Some(path) if path != "SSH_AUTH_SOCK" && path != "$SSH_AUTH_SOCK" => {
            Some(PathBuf::from(path))
        }
        _ => std::env::var_os("SSH_AUTH_SOCK").map(PathBuf::from),
    }
}

/// The agent's keys to offer: all of them, or with IdentitiesOnly those of the identity files
/// (`wanted_public`).
async fn agent_keys(
    agent: &mut AgentClient<tokio::net::UnixStream>,
    destination: &Destination,
    wanted_public: &[PublicKey],
) -> Vec<PublicKey> {
    let identities = agent.request_identities().await.unwrap_or_default();
    identities
        .into_iter()
        .filter_map(|identity| match identity {
            AgentIdentity::PublicKey { key, .. } => Some(key),
            _ => None,
        })
        .filter(|key| {
            !destination.identities_only
                || wanted_public.iter().any(|w| w.key_data() == key.key_data())
        })
        .collect()
}

/// The hash an RSA key signs with (the best the server takes); other keys have their own.
fn signature_hash(algorithm: Algorithm, rsa_hash: Option<HashAlg>) -> Option<HashAlg> {
    if algorithm.is_rsa() { rsa_hash } else { None }
}

/// Tries the identity files that exist, in order; `true` once one is accepted. Each is named
/// in `tried`.
async fn with_key_files(
    handle: &mut Handle<Client>,
    destination: &Destination,
    options: &ConnectOptions,
    rsa_hash: Option<HashAlg>,
    tried: &mut Vec<String>,
) -> Result<bool, SshError> {
    for path in &destination.identity_files {
        if !path.exists() {
            continue;
        }
        let Some(key) = load_key(path, options)? else {
            tried.push(format!("{} (no passphrase given)", path.display()));
            continue;
        };
        let hash = signature_hash(key.algorithm(), rsa_hash);
        tried.push(path.display().to_string());
        let result = handle
            .authenticate_publickey(
                &destination.user,
                PrivateKeyWithHashAlg::new(Arc::new(key), hash),
            )
            .await?;
        if result.success() {
            return Ok(true);
        }
    }
    Ok(false)
}

fn read_public_key(private_key: &Path) -> Option<PublicKey> {
    let mut path = private_key.as_os_str().to_owned();
    path.push(".pub");
    let text = std::fs::read_to_string(PathBuf::from(path)).ok()?;
    PublicKey::from_openssh(text.trim()).ok()
}

/// Loads a key file, asking for its passphrase (three tries) when it is encrypted.
fn load_key(
    path: &Path,
    options: &ConnectOptions,
) -> Result<Option<russh::keys::PrivateKey>, SshError> {
    let unreadable = |err: &dyn std::fmt::Display| SshError::KeyFile {
        path: path.display().to_string(),
        reason: err.to_string(),
    };
    match russh::keys::load_secret_key(path, None) {
        Ok(key) => return Ok(Some(key)),
        Err(russh::keys::Error::KeyIsEncrypted) => {}
        Err(err) => return Err(unreadable(&err)),
    }
    let Some(prompt) = &options.passphrase else {
        return Ok(None);
    };
    for _ in 0..3 {
        let Some(passphrase) = prompt(path) else {
            return Ok(None);
        };
        match russh::keys::load_secret_key(path, Some(&passphrase)) {
            Ok(key) => return Ok(Some(key)),
            Err(err) => tracing::debug!(%err, "wrong passphrase"),
        }
    }
    Err(unreadable(&"wrong passphrase (three tries)"))
}

/// What a remote command printed and how it ended.
#[derive(Debug, Default)]
pub struct ExecOutput {
    /// `None` when the command was killed by a signal or the channel closed without a status.
    pub status: Option<u32>,
    pub stdout: Vec<u8>,
    /// The last [`STDERR_TAIL_BYTES`] of stderr.
    pub stderr: Vec<u8>,
}

impl ExecOutput {
    pub fn success(&self) -> bool {
        self.status == Some(0)
    }

    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// The last lines of stderr, for error reports.
    pub fn stderr_tail(&self) -> String {
        let text = String::from_utf8_lossy(&self.stderr);
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(20)..].join("\n")
    }
}

/// A command running on the remote ([`SshSession::start`]).
pub struct RemoteCommand {
    channel: russh::Channel<client::Msg>,
    output: ExecOutput,
    /// How much of `output.stdout` [`RemoteCommand::next_line`] has handed out.
    read: usize,
    /// The channel closed.
    ended: bool,
    eof_sent: bool,
}

impl RemoteCommand {
    /// Takes one message from the channel; false once it has closed.
    async fn receive(&mut self) -> bool {
        if self.ended {
            return false;
        }
        match self.channel.wait().await {
            Some(ChannelMsg::Data { data }) => {
                let room = STDOUT_MAX_BYTES.saturating_sub(self.output.stdout.len());
                self.output
                    .stdout
                    .extend_from_slice(&data[..data.len().min(room)]);
            }
            Some(ChannelMsg::ExtendedData { data, .. }) => {
                self.output.stderr.extend_from_slice(&data);
                if self.output.stderr.len() > STDERR_TAIL_BYTES {
                    let cut = self.output.stderr.len() - STDERR_TAIL_BYTES;
                    self.output.stderr.drain(..cut);
                }
            }
            Some(ChannelMsg::ExitStatus { exit_status }) => self.output.status = Some(exit_status),
            Some(ChannelMsg::Close) | None => self.ended = true,
            Some(_) => {}
        }
        !self.ended
    }

    /// The next line the command prints on stdout (without its newline), as it comes; `None`
    /// once it has closed its output and ended (a last line without a newline comes first).
    pub async fn next_line(&mut self) -> Option<String> {
        loop {
            let pending = &self.output.stdout[self.read..];
            if let Some(end) = pending.iter().position(|&b| b == b'\n') {
                let line = String::from_utf8_lossy(&pending[..end]).into_owned();
                self.read += end + 1;
                return Some(line);
            }
            if !self.receive().await {
                let rest = &self.output.stdout[self.read..];
                if rest.is_empty() {
                    return None;
                }
                let line = String::from_utf8_lossy(rest).into_owned();
                self.read = self.output.stdout.len();
                return Some(line);
            }
        }
    }

    /// Sends bytes to the command's stdin.
    pub async fn send(&mut self, bytes: &[u8]) -> Result<(), SshError> {
        self.channel.data_bytes(bytes.to_vec()).await?;
        Ok(())
    }

    /// Streams a local file to the command's stdin, reporting the bytes sent so far.
    pub async fn send_file(
        &mut self,
        path: &Path,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<(), SshError> {
        let unreadable = |err: std::io::Error| SshError::LocalFile {
            path: path.display().to_string(),
            reason: err.to_string(),
        };
        let mut file = tokio::fs::File::open(path).await.map_err(unreadable)?;
        let mut buffer = vec![0u8; 256 << 10];
        let mut sent = 0u64;
        loop {
            let n = file.read(&mut buffer).await.map_err(unreadable)?;
            if n == 0 {
                return Ok(());
            }
            // Owned bytes go out in packets of the peer's maximum size; `data` would copy them
            // through an AsyncWrite in 8 KiB packets, each a trip through the session loop.
            self.channel.data_bytes(buffer[..n].to_vec()).await?;
            sent += n as u64;
            progress(sent);
        }
    }

    /// Closes the command's stdin.
    pub async fn eof(&mut self) -> Result<(), SshError> {
        if !self.eof_sent {
            self.eof_sent = true;
            self.channel.eof().await?;
        }
        Ok(())
    }

    /// Drops the stdout [`RemoteCommand::next_line`] has handed out, so a command that prints
    /// without end (`tail -F`) is not cut at the output bound.
    pub fn forget_read(&mut self) {
        self.output.stdout.drain(..self.read);
        self.read = 0;
    }

    /// Closes stdin (if still open) and waits for the command to end: everything it printed and
    /// its exit status.
    pub async fn finish(mut self) -> Result<ExecOutput, SshError> {
        // The remote command may read until EOF; one that has ended already cannot take it.
        let _ = self.eof().await;
        while self.receive().await {}
        Ok(self.output)
    }
}

/// Remote output is kept up to these sizes, so a chatty command cannot exhaust memory.
const STDOUT_MAX_BYTES: usize = 4 << 20;
const STDERR_TAIL_BYTES: usize = 16 << 10;

impl SshSession {
    pub fn destination(&self) -> &Destination {
        &self.destination
    }

    /// Resolves when the connection has ended (the server went away, keepalive gave up).
    pub fn closed(&self) -> watch::Receiver<bool> {
        self.closed.clone()
    }

    pub fn is_closed(&self) -> bool {
        self.handle.is_closed() || *self.closed.borrow()
    }

    /// Runs `command` through the remote user's shell and collects its output.
    pub async fn exec(&self, command: &str) -> Result<ExecOutput, SshError> {
        self.exec_with_input(command, None, &mut |_| {}).await
    }

    /// Runs `command` with `input` streamed to its stdin (then EOF), reporting bytes sent.
    pub async fn exec_with_input(
        &self,
        command: &str,
        input: Option<&Path>,
        progress: &mut (dyn FnMut(u64) + Send),
    ) -> Result<ExecOutput, SshError> {
        let mut remote = self.start(command).await?;
        if let Some(path) = input {
            remote.send_file(path, progress).await?;
        }
        remote.finish().await
    }

    /// Starts `command` through the remote user's shell; the caller talks with it: reads its
    /// stdout line by line while it runs, decides, then sends it input (a conversation in one
    /// command saves the per-command cost of the login shell, docs/architecture.md, "One
    /// `pi-remote connect`").
    pub async fn start(&self, command: &str) -> Result<RemoteCommand, SshError> {
        let channel = self.handle.channel_open_session().await?;
        channel.exec(true, command).await?;
        Ok(RemoteCommand {
            channel,
            output: ExecOutput::default(),
            read: 0,
            ended: false,
            eof_sent: false,
        })
    }
    /// Opens a direct-tcpip channel to `host:port` as seen from the remote.
    pub async fn open_tcp(
        &self,
        host: &str,
        port: u16,
        timeout: Duration,
    ) -> Result<ChannelStream<client::Msg>, SshError> {
        Ok(open_direct_tcpip(&self.handle, host, port, timeout)
            .await?
            .into_stream())
    }

    pub async fn disconnect(&self) {
        let _ = self
            .handle
            .disconnect(russh::Disconnect::ByApplication, "", "en")
            .await;
    }
}

async fn open_direct_tcpip(
    handle: &Handle<Client>,
    host: &str,
    port: u16,
    timeout: Duration,
) -> Result<russh::Channel<client::Msg>, SshError> {
    let target = format!("{host}:{port}");
    // A server can leave a channel open request unanswered; never wait for it forever.
    let opened = tokio::time::timeout(
        timeout,
        handle.channel_open_direct_tcpip(host, u32::from(port), "127.0.0.1", 0),
    )
    .await
    .map_err(|_| SshError::Timeout(format!("opening a channel to {target}")))?;
    match opened {
        Ok(channel) => Ok(channel),
        Err(russh::Error::ChannelOpenFailure(failure)) => Err(SshError::ChannelOpen {
            target,
            prohibited: matches!(failure, ChannelOpenFailure::AdministrativelyProhibited),
            reason: match failure {
                ChannelOpenFailure::AdministrativelyProhibited => "administratively prohibited: the server's sshd_config forbids TCP forwarding (AllowTcpForwarding no, or a PermitOpen that excludes it)".into(),
                ChannelOpenFailure::ConnectFailed => "connection refused on the remote (nothing listens there)".into(),
                other => format!("{other:?}"),
            },
        }),
        Err(err) => Err(err.into()),
    }
}
