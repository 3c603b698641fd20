//! `pi-remote`: pair with a pi-host and drive its sessions from a terminal.
//!
//! See [`bootstrap::remote`] for the commands, profiles and exit codes.

use bootstrap::provision;
use bootstrap::remote::pairing::{self, PairingTarget};
use bootstrap::remote::profile::{self, DEFAULT_PROFILE, Profile};
use bootstrap::remote::view::{self, View};
use bootstrap::remote::{Exit, Failure};
use bootstrap::ssh::config::ResolveOptions;
use bootstrap::ssh::host_key::{HostKeyPolicy, UnknownHost};
use bootstrap::ssh::{ConnectOptions, prompt};
use clap::{Parser, Subcommand};
use racp_proto::client::{ClientOptions, ClientState, RacpClient, SubscriptionItem};
use racp_proto::events::{Event, TurnFinishedData, TurnOutcome};
use racp_proto::methods::handshake::PairParams;
use racp_proto::methods::host::DeviceRevokeParams;
use racp_proto::methods::session::{SessionCreateParams, SessionRef, SessionSubscribeParams};
use racp_proto::methods::turn::{
    Answer, ApprovalKind, ApprovalRespondParams, Decision, TurnStartParams, TurnState, Verdict,
};
use racp_proto::validate::printable;
use racp_proto::{AppError, Empty, ErrorCode, ErrorSource, RacpMethod, calls};
use serde_json::{Value, json};
use std::collections::VecDeque;
use std::io::{IsTerminal, Write};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;

const EXIT_CODES: &str = "\
Exit codes:
  0  ok
  1  usage error or local problem (no profile, unreadable file)
  2  the host refused the call (its error code is printed)
  3  the host cannot be reached
  4  the host refused the credential, the profile has no certificate fingerprint (stored by
     an older version), or the endpoint is not the paired host (HOST_IDENTITY_MISMATCH): pair
     again, in the last case only if you trust the change
  5  prompt --wait: the turn ended aborted or failed
  6  connect: provisioning over SSH failed (HOST_BOOTSTRAP_FAILED, REMOTE_FORWARD_FAILED,
     HOST_VERSION_MISMATCH; details.reason names the stage)";

#[derive(Parser, Debug)]
#[command(
    name = "pi-remote",
    version,
    about = "Pair with a pi-host and drive its agent sessions over RACP-WS",
    after_help = EXIT_CODES
)]
struct Cli {
    /// The stored pairing to use (a file under $PI_REMOTE_CONFIG_DIR/profiles/).
    #[arg(long, global = true, default_value = DEFAULT_PROFILE, env = "PI_REMOTE_PROFILE")]
    profile: String,
    /// Print machine-readable JSON (one JSON line per event for attach and prompt --wait).
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand, Debug)]
enum Command {
    /// Install or upgrade pi-host on a machine over SSH, start it on loopback, forward a local
    /// port to it, pair, and keep the forward up (reconnecting) until Ctrl-C.
    Connect(Box<ConnectCommand>),
    /// Pair this machine with a host and store the device credential in a profile.
    Pair {
        /// racps://HOST:PORT/pair?cert=sha256:HEX#TOKEN (from `pi-host pair`), a bare token
        /// (with --host and --cert-sha256), or `-` to read either from stdin (keeps the token
        /// out of the process list).
        link: String,
        /// The host's HOST:PORT, for a bare token.
        #[arg(long)]
        host: Option<String>,
        /// The host's certificate SHA-256 (64 hex digits, `certSha256` of `pi-host pair`), for a
        /// bare token.
        #[arg(long)]
        cert_sha256: Option<racp_proto::fingerprint::CertSha256>,
        /// Accept a plain racp:// link, for a host run with --plain: the token then goes to
        /// whatever holds the port, with nothing to prove it is the host.
        #[arg(long)]
        plain: bool,
        /// The device name shown in `devices` (default: this machine's host name).
        #[arg(long)]
        name: Option<String>,
    },
    /// List sessions.
    Sessions,
    /// Create a session.
    New {
        /// Absolute path of the workspace on the host (inside its permitted roots).
        #[arg(long)]
        workspace: String,
        #[arg(long)]
        title: Option<String>,
    },
    /// Start a turn with a prompt.
    Prompt {
        session: String,
        text: String,
        /// Follow the turn and print its events until it finishes; exit 5 unless it completed.
        #[arg(long)]
        wait: bool,
    },
    /// Allow a pending approval, or answer it with --value (select, input, editor).
    Approve {
        approval: String,
        #[arg(long)]
        value: Option<String>,
    },
    /// Deny a pending approval.
    Deny { approval: String },
    /// Follow a session live and answer its approvals from stdin (y/n or a value).
    Attach { session: String },
    /// List paired devices (owner only).
    Devices,
    /// Revoke a device (owner only).
    Revoke { device: String },
}

#[derive(clap::Args, Debug)]
struct ConnectCommand {
    /// `[user@]host[:port]`, or a Host alias from the ssh config.
    target: String,
    /// The release directory made by deploy/release.sh (manifest.json, tarballs, install.sh);
    /// needed to install or upgrade.
    #[arg(long, env = "PI_REMOTE_RELEASE_DIR")]
    release_dir: Option<std::path::PathBuf>,
    /// The install root on the remote.
    #[arg(long, default_value = provision::remote_shell::DEFAULT_REMOTE_DIR)]
    remote_dir: String,
    /// The ssh config file [default: ~/.ssh/config].
    #[arg(long, short = 'F')]
    ssh_config: Option<std::path::PathBuf>,
    /// The known_hosts file to check and to record new hosts in, instead of the config's
    /// UserKnownHostsFile [default: ~/.ssh/known_hosts ~/.ssh/known_hosts2]; the global ones
    /// (GlobalKnownHostsFile, /etc/ssh/ssh_known_hosts) are checked too, as ssh does.
    #[arg(long)]
    known_hosts: Option<std::path::PathBuf>,
    /// A private key to try (before the config's IdentityFile); may be repeated.
    #[arg(long = "identity", short = 'i')]
    identities: Vec<std::path::PathBuf>,
    /// Trust and record a host seen for the first time: one with no key on record. A key that
    /// matches none of the host's keys on record, of any type, is always refused.
    #[arg(long)]
    accept_new: bool,
    /// Do not use keys from ssh-agent.
    #[arg(long)]
    no_agent: bool,
    /// The local port of the forward [default: the port of the last connect, else any free one].
    #[arg(long)]
    local_port: Option<u16>,
    /// Seconds between SSH keepalives; three missed ones mean the link is dead.
    #[arg(long, default_value_t = 5)]
    keepalive: u64,
    /// The device name shown in `devices` (default: this machine's host name).
    #[arg(long)]
    name: Option<String>,
    /// Provision, pair and check the host, then exit instead of keeping the forward up.
    #[arg(long)]
    once: bool,
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() {
                Exit::Other.into()
            } else {
                Exit::Ok.into()
            };
        }
    };
    let json = cli.json;
    // Two workers: the SSH session loop and forwarded copies run beside each other.
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("pi-remote: cannot start the runtime: {e}");
            return Exit::Other.into();
        }
    };
    match runtime.block_on(run(cli)) {
        Ok(()) => Exit::Ok.into(),
        Err(failure) => {
            if json {
                let error = match &failure {
                    Failure::App(error) => serde_json::to_value(error).unwrap_or(Value::Null),
                    Failure::Local(message) | Failure::PairAgain(message) => {
                        json!({"message": message})
                    }
                    Failure::Turn(outcome) => {
                        json!({"message": format!("the turn ended {outcome}")})
                    }
                };
                eprintln!(
                    "{}",
                    json!({"error": error, "exitCode": failure.exit() as u8})
                );
            } else {
                eprintln!("{}", printable(&failure.describe(), true));
            }
            failure.exit().into()
        }
    }
}

async fn run(cli: Cli) -> Result<(), Failure> {
    profile::check_name(&cli.profile).map_err(Failure::Local)?;
    let out = Out { json: cli.json };
    if let Command::Pair {
        link,
        host,
        name,
        cert_sha256,
        plain,
    } = &cli.command
    {
        let hints = pairing::PairingHints {
            host: host.as_deref(),
            cert_sha256: *cert_sha256,
            plain: *plain,
        };
        return pair(&out, &cli.profile, link, &hints, name.clone()).await;
    }
    if let Command::Connect(command) = cli.command {
        return connect_over_ssh(*command, cli.profile, cli.json).await;
    }
    let dir = profile::config_dir().map_err(Failure::Local)?;
    let stored = profile::load(&dir, &cli.profile).map_err(Failure::Local)?;
    // Before any connection: a token is only sent to an endpoint that can prove it is the host.
    if let Some(message) = profile::unpinned_message(&cli.profile, &stored) {
        return Err(Failure::PairAgain(message));
    }
    let security = Security {
        pin: stored.cert_sha256,
        plain: stored.plain,
    };
    let client = match connect(&stored.url, &stored.device_token, security).await {
        Ok(client) => client,
        // An SSH profile's URL is a local forward that lives only while `connect` runs.
        Err(error)
            if bootstrap::remote::exit_for(error.code()) == Exit::Unreachable
                && let Some(origin) = &stored.ssh =>
        {
            return Err(Failure::App(
                AppError::new(
                    error.code(),
                    format!(
                        "{}; this profile reaches {} through an SSH forward: run `pi-remote --profile {} connect {}` (it keeps the forward up)",
                        error.message(),
                        origin.target,
                        cli.profile,
                        origin.target
                    ),
                )
                .with_source(ErrorSource::Client),
            ));
        }
        // Over SSH the host's identity can be checked again on a channel already trusted.
        Err(error)
            if error.code() == ErrorCode::HostIdentityMismatch
                && let Some(origin) = &stored.ssh =>
        {
            let mut refused = AppError::new(
                error.code(),
                format!(
                    "{}; this profile reaches {} through SSH: `pi-remote --profile {} connect {}` checks the host's certificate over SSH and pairs again if it changed",
                    error.message(),
                    origin.target,
                    cli.profile,
                    origin.target
                ),
            )
            .with_source(ErrorSource::Client);
            if let Some(details) = error.details() {
                refused = refused.with_details(details.clone());
            }
            return Err(Failure::App(refused));
        }
        Err(error) => return Err(error.into()),
    };
    match cli.command {
        Command::Pair { .. } | Command::Connect(_) => Ok(()),
        Command::Sessions => {
            let list = client.call::<calls::SessionList>(Empty {}).await?;
            if out.json {
                out.json_value(&list);
            } else if list.sessions.is_empty() {
                out.line("no sessions");
            } else {
                for s in &list.sessions {
                    let state = enum_name(&s.state);
                    let title = printable(s.title.as_deref().unwrap_or("-"), false);
                    let turn = s
                        .active_turn_id
                        .as_deref()
                        .map(|t| format!(" turn={t}"))
                        .unwrap_or_default();
                    out.line(&format!(
                        "{}\t{state}\t{title}\t{}{turn}",
                        printable(&s.session_id, false),
                        printable(&s.workspace, false)
                    ));
                }
            }
            Ok(())
        }
        Command::New { workspace, title } => {
            let created = client
                .call::<calls::SessionCreate>(SessionCreateParams { workspace, title })
                .await?;
            if out.json {
                out.json_value(&created.session);
            } else {
                out.line(&created.session.session_id);
            }
            Ok(())
        }
        Command::Prompt {
            session,
            text,
            wait,
        } => prompt(&out, &client, session, text, wait).await,
        Command::Approve { approval, value } => {
            let decision = match value {
                Some(value) => Decision::Answer(Answer { value }),
                None => Decision::Verdict(Verdict::Allow),
            };
            respond(&out, &client, approval, decision).await
        }
        Command::Deny { approval } => {
            respond(&out, &client, approval, Decision::Verdict(Verdict::Deny)).await
        }
        Command::Attach { session } => attach(&out, client, session).await,
        Command::Devices => {
            let list = client.call::<calls::DeviceList>(Empty {}).await?;
            if out.json {
                out.json_value(&list);
            } else {
                for d in &list.devices {
                    let roles: Vec<&str> = d.roles.iter().map(|r| r.as_str()).collect();
                    let current = if d.current { "\t(this device)" } else { "" };
                    out.line(&format!(
                        "{}\t{}\t{}{current}",
                        printable(&d.device_id, false),
                        printable(&d.name, false),
                        roles.join(",")
                    ));
                }
            }
            Ok(())
        }
        Command::Revoke { device } => {
            client
                .call::<calls::DeviceRevoke>(DeviceRevokeParams {
                    device_id: device.clone(),
                })
                .await?;
            if out.json {
                out.json_value(&json!({"deviceId": device, "revoked": true}));
            } else {
                out.line(&format!("revoked {device}"));
            }
            Ok(())
        }
    }
}

/// Where output goes: data on stdout, notes on stderr. What a person reads passes through
/// `printable`: names, paths and agent text come from elsewhere and must not drive the terminal
/// (JSON output is escaped by the encoder).
struct Out {
    json: bool,
}

impl Out {
    fn text(&self, text: &str) {
        if text.is_empty() {
            return;
        }
        let text = printable(text, true);
        let mut stdout = std::io::stdout().lock();
        let _ = stdout.write_all(text.as_bytes());
        let _ = stdout.flush();
    }

    fn line(&self, text: &str) {
        self.text(&format!("{text}\n"));
    }

    fn json_value<T: serde::Serialize>(&self, value: &T) {
        match serde_json::to_string(value) {
            Ok(text) => self.line(&text),
            Err(e) => eprintln!("pi-remote: cannot encode output: {e}"),
        }
    }

    /// A note for a person, on stderr (also in JSON mode, where stdout carries only data).
    fn note(&self, text: &str) {
        eprintln!("{}", printable(text, true));
    }
}

fn enum_name<T: serde::Serialize>(value: &T) -> String {
    serde_json::to_value(value)
        .ok()
        .and_then(|v| v.as_str().map(str::to_string))
        .unwrap_or_default()
}

/// How the endpoint proves it is the host: the pinned certificate, or nothing (`--plain`).
#[derive(Clone, Copy)]
struct Security {
    pin: Option<racp_proto::fingerprint::CertSha256>,
    plain: bool,
}

async fn connect(url: &str, token: &str, security: Security) -> Result<RacpClient, AppError> {
    let mut options = ClientOptions::new(url, token);
    options.pinned_sha256 = security.pin;
    options.allow_plain_ws = security.plain;
    options.client_name = "pi-remote".into();
    options.client_version = env!("CARGO_PKG_VERSION").into();
    RacpClient::connect(options).await
}

/// Calls a method that is safe to resend, resending it after a dropped link.
async fn call_resending<M: RacpMethod>(
    client: &RacpClient,
    params: M::Params,
) -> Result<M::Result, AppError>
where
    M::Params: Clone,
{
    let mut client = client.clone();
    let mut attempts = 0;
    loop {
        match client.call::<M>(params.clone()).await {
            Err(e) if e.code() == ErrorCode::HostDisconnected && attempts < 5 => {
                attempts += 1;
                client.wait_connected().await?;
            }
            other => return other,
        }
    }
}

async fn connect_over_ssh(
    command: ConnectCommand,
    profile: String,
    json: bool,
) -> Result<(), Failure> {
    let mut options = provision::BootstrapOptions::new(command.target);
    options.resolve = ResolveOptions {
        config_file: command.ssh_config,
        known_hosts: command.known_hosts,
        identity_files: command.identities,
    };
    let interactive = !json && std::io::stdin().is_terminal();
    options.ssh = ConnectOptions {
        host_key: if command.accept_new {
            HostKeyPolicy::AcceptNew
        } else if interactive || std::env::var_os("SSH_ASKPASS").is_some() {
            HostKeyPolicy::Ask(Arc::new(|unknown: &UnknownHost| {
                prompt::ask_yes_no(&format!(
                    "The authenticity of host '{}' can't be established.\n{} key fingerprint is {}.\nTrust it and record it in {}? (yes/no) ",
                    unknown.host,
                    unknown.algorithm,
                    unknown.fingerprint,
                    unknown.known_hosts.display()
                ))
            }))
        } else {
            HostKeyPolicy::Strict
        },
        passphrase: Some(Arc::new(|path: &std::path::Path| {
            prompt::ask_secret(&format!("Enter passphrase for key '{}': ", path.display()))
        })),
        keepalive: Duration::from_secs(command.keepalive.max(1)),
        use_agent: !command.no_agent,
    };
    options.release_dir = command.release_dir;
    options.remote_dir = command.remote_dir;
    options.device_name = device_name(command.name);
    if let Some(port) = command.local_port {
        options.local_port = port;
    }
    bootstrap::remote::connect::run(bootstrap::remote::connect::ConnectArgs {
        options,
        profile,
        once: command.once,
        json,
    })
    .await
}

fn device_name(name: Option<String>) -> String {
    name.or_else(|| {
        std::fs::read_to_string("/proc/sys/kernel/hostname")
            .ok()
            .map(|h| h.trim().to_string())
            .filter(|h| !h.is_empty())
            .map(|h| format!("pi-remote@{h}"))
    })
    .unwrap_or_else(|| "pi-remote".into())
}

async fn pair(
    out: &Out,
    profile_name: &str,
    link: &str,
    hints: &pairing::PairingHints<'_>,
    name: Option<String>,
) -> Result<(), Failure> {
    let dir = profile::config_dir().map_err(Failure::Local)?;
    let link = if link == "-" {
        let mut line = String::new();
        std::io::stdin()
            .read_line(&mut line)
            .map_err(|e| Failure::local(format!("cannot read the pairing link from stdin: {e}")))?;
        line
    } else {
        link.to_string()
    };
    let PairingTarget {
        url,
        token,
        cert_sha256,
    } = pairing::parse(&link, hints).map_err(Failure::Local)?;
    let plain = cert_sha256.is_none();
    // The pairing token is as replayable as a device token: it too goes only to the pinned
    // host. The client says `hello` itself before it reports the connection as up.
    let security = Security {
        pin: cert_sha256,
        plain,
    };
    let client = connect(&url, &token, security).await?;
    let paired = client
        .call::<calls::Pair>(PairParams {
            device_name: device_name(name),
        })
        .await?;
    let stored = Profile {
        url,
        cert_sha256,
        plain,
        device_id: paired.device_id,
        device_token: paired.device_token,
        roles: paired.roles,
        ssh: None,
    };
    let file = profile::save(&dir, profile_name, &stored).map_err(Failure::Local)?;
    if out.json {
        out.json_value(&json!({
            "deviceId": stored.device_id,
            "roles": stored.roles,
            "profile": profile_name,
            "url": stored.url,
            "certSha256": stored.cert_sha256,
        }));
    } else {
        let roles: Vec<&str> = stored.roles.iter().map(|r| r.as_str()).collect();
        out.line(&format!(
            "paired as {} (roles: {}); profile {profile_name:?} saved to {}",
            stored.device_id,
            roles.join(","),
            file.display()
        ));
    }
    Ok(())
}

async fn respond(
    out: &Out,
    client: &RacpClient,
    approval_id: String,
    decision: Decision,
) -> Result<(), Failure> {
    let result = call_resending::<calls::ApprovalRespond>(
        client,
        ApprovalRespondParams {
            approval_id,
            decision,
        },
    )
    .await?;
    if out.json {
        out.json_value(&result.approval);
    } else {
        out.line(&format!(
            "approval {} {}",
            result.approval.approval_id,
            enum_name(&result.approval.state)
        ));
    }
    Ok(())
}

/// A fresh idempotency key for `turn/start`.
fn idempotency_key() -> Result<String, Failure> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|e| Failure::local(format!("cannot draw a random key: {e}")))?;
    Ok(format!(
        "pi-remote-{}",
        bytes.iter().map(|b| format!("{b:02x}")).collect::<String>()
    ))
}

async fn prompt(
    out: &Out,
    client: &RacpClient,
    session_id: String,
    text: String,
    wait: bool,
) -> Result<(), Failure> {
    let params = TurnStartParams {
        session_id: session_id.clone(),
        idempotency_key: idempotency_key()?,
        text,
    };
    if !wait {
        let started = call_resending::<calls::TurnStart>(client, params).await?;
        if out.json {
            out.json_value(&json!({"sessionId": session_id, "turnId": started.turn_id}));
        } else {
            out.line(&started.turn_id);
        }
        return Ok(());
    }
    // Subscribe first, from the snapshot's cursor, so no event of the turn is missed.
    let got = client
        .call::<calls::SessionGet>(SessionRef {
            session_id: session_id.clone(),
        })
        .await?;
    let mut sub = client
        .subscribe(SessionSubscribeParams {
            session_id,
            cursor: Some(got.cursor),
        })
        .await?;
    let turn_id = call_resending::<calls::TurnStart>(client, params)
        .await?
        .turn_id;
    let mut view = View::default();
    let finish = |view: &mut View, outcome: &str| {
        out.text(&view.break_line());
        if outcome == "completed" {
            Ok(())
        } else {
            Err(Failure::Turn(outcome.to_string()))
        }
    };
    loop {
        let Some(item) = sub.items.recv().await else {
            return Err(client_stopped().into());
        };
        match item {
            SubscriptionItem::Event(event) => {
                if event.turn_id.as_deref() != Some(turn_id.as_str()) {
                    continue;
                }
                show(out, &mut view, &event);
                if event.kind == "approval.requested"
                    && !out.json
                    && let Some(id) = event.data["approvalId"].as_str()
                {
                    out.note(&format!(
                        "answer with: pi-remote approve {id}   or   pi-remote deny {id}"
                    ));
                }
                if event.kind == "turn.finished" {
                    let outcome = serde_json::from_value::<TurnFinishedData>(event.data.clone())
                        .map(|d| outcome_name(d.outcome))
                        .unwrap_or("failed");
                    return finish(&mut view, outcome);
                }
            }
            SubscriptionItem::Resynced(snapshot) => {
                out.note("pi-remote: reconnecting… (resumed from a snapshot; some output may be missing)");
                let ended = snapshot
                    .snapshot
                    .turns
                    .iter()
                    .find(|t| t.turn_id == turn_id && t.state != TurnState::Running);
                if let Some(turn) = ended {
                    let outcome = match turn.state {
                        TurnState::Completed => "completed",
                        TurnState::Aborted => "aborted",
                        TurnState::Failed | TurnState::Running => "failed",
                    };
                    return finish(&mut view, outcome);
                }
            }
            SubscriptionItem::Ended => {
                return finish(&mut view, "aborted (the session was closed)");
            }
            SubscriptionItem::Failed(error) => return Err(error.into()),
        }
    }
}

fn outcome_name(outcome: TurnOutcome) -> &'static str {
    match outcome {
        TurnOutcome::Completed => "completed",
        TurnOutcome::Aborted => "aborted",
        TurnOutcome::Failed => "failed",
    }
}

fn client_stopped() -> AppError {
    AppError::new(ErrorCode::HostDisconnected, "the client stopped")
        .with_source(ErrorSource::Client)
}

/// Prints one event: a JSON line, or the human view.
fn show(out: &Out, view: &mut View, event: &Event) {
    if out.json {
        out.json_value(event);
    } else {
        out.text(&view.render(event));
    }
}

/// An approval `attach` knows to be pending.
struct Pending {
    id: String,
    kind: ApprovalKind,
    options: Vec<String>,
    /// We sent an answer and wait for `approval.settled`.
    answered: bool,
}

/// Reads a typed answer for an approval.
fn decision_for(pending: &Pending, line: &str) -> Result<Decision, String> {
    match pending.kind {
        ApprovalKind::Confirm => match line.to_ascii_lowercase().as_str() {
            "y" | "yes" | "allow" => Ok(Decision::Verdict(Verdict::Allow)),
            "n" | "no" | "deny" => Ok(Decision::Verdict(Verdict::Deny)),
            _ => Err(format!("approval {}: answer y or n", pending.id)),
        },
        ApprovalKind::Select => {
            if pending.options.iter().any(|o| o == line) {
                return Ok(Decision::Answer(Answer { value: line.into() }));
            }
            match line.parse::<usize>() {
                Ok(n) if n >= 1 && n <= pending.options.len() => Ok(Decision::Answer(Answer {
                    value: pending.options[n - 1].clone(),
                })),
                _ => Err(format!(
                    "approval {}: answer with one of: {} (or its number)",
                    pending.id,
                    pending.options.join(", ")
                )),
            }
        }
        ApprovalKind::Input | ApprovalKind::Editor => {
            Ok(Decision::Answer(Answer { value: line.into() }))
        }
    }
}

/// Reads stdin lines on a thread; `None` marks end of input.
fn stdin_lines() -> mpsc::UnboundedReceiver<Option<String>> {
    let (tx, rx) = mpsc::unbounded_channel();
    std::thread::spawn(move || {
        let stdin = std::io::stdin();
        let mut line = String::new();
        loop {
            line.clear();
            match stdin.read_line(&mut line) {
                Ok(0) | Err(_) => {
                    let _ = tx.send(None);
                    return;
                }
                Ok(_) => {
                    let text = line.trim_end_matches(['\n', '\r']).to_string();
                    if tx.send(Some(text)).is_err() {
                        return;
                    }
                }
            }
        }
    });
    rx
}

async fn attach(out: &Out, client: RacpClient, session_id: String) -> Result<(), Failure> {
    let got = call_resending::<calls::SessionGet>(
        &client,
        SessionRef {
            session_id: session_id.clone(),
        },
    )
    .await?;
    let mut pending: Vec<Pending> = got
        .snapshot
        .pending_approvals
        .iter()
        .map(|a| Pending {
            id: a.approval_id.clone(),
            kind: a.kind,
            options: a.options.clone().unwrap_or_default(),
            answered: false,
        })
        .collect();
    let mut sub = client
        .subscribe(SessionSubscribeParams {
            session_id: session_id.clone(),
            cursor: Some(got.cursor),
        })
        .await?;
    let mut view = View::default();
    if out.json {
        out.json_value(&json!({
            "type": "client.attached",
            "session": got.session,
            "cursor": got.cursor,
            "pendingApprovals": got.snapshot.pending_approvals,
        }));
    } else {
        out.line(&format!(
            "attached to {} ({}, {}){}",
            got.session.session_id,
            got.session.workspace,
            enum_name(&got.session.state),
            got.session
                .title
                .as_deref()
                .map(|t| format!(": {t}"))
                .unwrap_or_default()
        ));
        for approval in &got.snapshot.pending_approvals {
            out.text(&view.note(&view::describe_pending(approval)));
        }
    }
    let interactive = std::io::stdin().is_terminal();
    let mut lines = stdin_lines();
    let mut stdin_open = true;
    let mut typed: VecDeque<String> = VecDeque::new();
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    let mut was_connected = true;
    loop {
        // Answer waiting approvals, oldest first, with what was typed.
        while let Some(index) = pending.iter().position(|p| !p.answered) {
            let Some(line) = typed.pop_front() else { break };
            let decision = match decision_for(&pending[index], &line) {
                Ok(decision) => decision,
                Err(message) => {
                    out.note(&message);
                    continue;
                }
            };
            let id = pending[index].id.clone();
            let answer = call_resending::<calls::ApprovalRespond>(
                &client,
                ApprovalRespondParams {
                    approval_id: id.clone(),
                    decision,
                },
            )
            .await;
            match answer {
                Ok(_) => pending[index].answered = true,
                Err(error) => {
                    out.note(&format!(
                        "pi-remote: approval {id}: {}: {}",
                        error.code(),
                        error.message()
                    ));
                    match error.code() {
                        ErrorCode::RemoteAuthFailed => return Err(error.into()),
                        // Settled elsewhere, expired, or not ours to answer: stop waiting on it.
                        _ => {
                            pending.retain(|p| p.id != id);
                        }
                    }
                }
            }
        }
        if !stdin_open && typed.is_empty() && pending.is_empty() {
            out.text(&view.break_line());
            return Ok(());
        }
        tokio::select! {
            item = sub.items.recv() => {
                let Some(item) = item else { return Err(client_stopped().into()) };
                match item {
                    SubscriptionItem::Event(event) => {
                        show(out, &mut view, &event);
                        match event.kind.as_str() {
                            "approval.requested" => {
                                let data = &event.data;
                                if let (Some(id), Ok(kind)) = (
                                    data["approvalId"].as_str(),
                                    serde_json::from_value::<ApprovalKind>(data["kind"].clone()),
                                ) {
                                    let options = data["options"]
                                        .as_array()
                                        .map(|o| o.iter().filter_map(|v| v.as_str().map(str::to_string)).collect())
                                        .unwrap_or_default();
                                    pending.push(Pending { id: id.into(), kind, options, answered: false });
                                }
                            }
                            "approval.settled" => {
                                if let Some(id) = event.data["approvalId"].as_str() {
                                    pending.retain(|p| p.id != id);
                                }
                            }
                            "session.closed" => {
                                out.text(&view.break_line());
                                return Ok(());
                            }
                            _ => {}
                        }
                    }
                    SubscriptionItem::Resynced(snapshot) => {
                        out.note("pi-remote: reconnecting… (resumed from a snapshot; some output may be missing)");
                        if out.json {
                            out.json_value(&json!({
                                "type": "client.resynced",
                                "cursor": snapshot.cursor,
                                "pendingApprovals": snapshot.snapshot.pending_approvals,
                            }));
                        }
                        let answered: Vec<String> = pending.iter().filter(|p| p.answered).map(|p| p.id.clone()).collect();
                        pending = snapshot.snapshot.pending_approvals.iter().map(|a| Pending {
                            id: a.approval_id.clone(),
                            kind: a.kind,
                            options: a.options.clone().unwrap_or_default(),
                            answered: answered.contains(&a.approval_id),
                        }).collect();
                        if !out.json {
                            for approval in &snapshot.snapshot.pending_approvals {
                                out.text(&view.note(&view::describe_pending(approval)));
                            }
                        }
                    }
                    SubscriptionItem::Ended => {
                        out.text(&view.break_line());
                        return Ok(());
                    }
                    SubscriptionItem::Failed(error) => return Err(error.into()),
                }
            }
            line = lines.recv(), if stdin_open => match line {
                Some(Some(line)) => {
                    let line = line.trim().to_string();
                    // Piped input is kept until an approval needs it; at a terminal, a line
                    // typed while nothing waits is dropped with a note.
                    let waiting = pending.iter().any(|p| !p.answered);
                    if interactive && !line.is_empty() && !waiting {
                        out.note("pi-remote: no approval is waiting for an answer");
                    } else if !line.is_empty() {
                        typed.push_back(line);
                    }
                }
                Some(None) | None => stdin_open = false,
            },
            _ = tick.tick() => match client.state() {
                ClientState::Connected => {
                    if !was_connected {
                        out.note("pi-remote: reconnected");
                        was_connected = true;
                    }
                }
                ClientState::Connecting => {
                    if was_connected {
                        out.text(&view.break_line());
                        out.note("pi-remote: reconnecting…");
                        was_connected = false;
                    }
                }
                ClientState::Stopped(error) => return Err(error.into()),
            },
        }
    }
}
