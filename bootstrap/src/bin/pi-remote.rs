//! `pi-remote`: pair with a pi-host and drive its sessions from a terminal.
//!
//! This file is the command line: arguments, dispatch and exit codes. The commands are in
//! [`bootstrap::remote::commands`]; see [`bootstrap::remote`] for what they do, profiles and
//! exit codes.

use bootstrap::provision::{self, BootstrapOptions};
use bootstrap::remote::commands::connect::{self, ConnectArgs, Display};
use bootstrap::remote::commands::models::{
    parse_model, parse_permission_mode, parse_queue_mode, parse_thinking,
};
use bootstrap::remote::commands::{
    Reach, attach, background, devices, doctor, files, history, hosts, lifecycle, models,
    open_profile, pair, remote_admin, sessions, shell, status, turns,
};
use bootstrap::remote::out::Out;
use bootstrap::remote::pairing::PairingHints;
use bootstrap::remote::profile;
use bootstrap::remote::remotes;
use bootstrap::remote::{Exit, Failure};
use bootstrap::ssh::ConnectOptions;
use bootstrap::ssh::config::ResolveOptions;
use clap::{Parser, Subcommand};
use racp_proto::client::RacpClient;
use racp_proto::methods::model::{ModelRef, QueueMode, ThinkingLevel};
use racp_proto::methods::session::{SessionConfigureParams, SessionCreateParams};
use racp_proto::permission::PermissionMode;
use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

const EXIT_CODES: &str = "\
Exit codes:
  0  ok
  1  local problem (no profile, unreadable file, a profile pair would replace)
  2  the host refused the call (its error code is printed)
  3  the host cannot be reached
  4  the host refused the credential, the profile has no certificate fingerprint (stored by
     an older version), or the endpoint is not the paired host (HOST_IDENTITY_MISMATCH): pair
     again, in the last case only if you trust the change
  5  prompt --wait: the turn ended aborted or failed
  6  connect: provisioning over SSH failed (HOST_BOOTSTRAP_FAILED, REMOTE_FORWARD_FAILED,
     HOST_VERSION_MISMATCH; details.reason names the stage)
  7  doctor: a check found a problem or a warning (each line says what to do)
  connect --background with one already running for the profile, disconnect with none
  running: 0 (each says so); uninstall without a terminal and without --yes: 64
  64 bad usage (unknown command or option, missing or malformed argument; a gateway
     profile's session, turn, approval or model command without a host: see `hosts`;
     --host with a profile of a single host)";

#[derive(Parser, Debug)]
#[command(
    name = "pi-remote",
    version,
    about = "Pair with a pi-host and drive its agent sessions over RACP-WS",
    after_help = EXIT_CODES
)]
struct Cli {
    /// The stored pairing to use (a file under $PI_REMOTE_CONFIG_DIR/profiles/) [default: the
    /// one `pi-remote use` chose, else `default`].
    #[arg(long, global = true, env = "PI_REMOTE_PROFILE", value_parser = parse_profile_name)]
    profile: Option<String>,
    /// For a profile paired with a gateway: the host behind it that session, turn, approval and
    /// model commands go to (its id, from `pi-remote hosts`) [default: the profile's, set with
    /// `hosts --use`]. For `pair` with a bare token: the host's HOST:PORT.
    #[arg(long, global = true)]
    host: Option<String>,
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
    /// Stop the profile's background connect (`connect --background`): its forward closes.
    Disconnect {
        /// The profile [default: --profile's].
        #[arg(value_name = "PROFILE", value_parser = parse_profile_name)]
        name: Option<String>,
    },
    /// Make PROFILE the default: commands without --profile (or PI_REMOTE_PROFILE) use it.
    Use {
        #[arg(value_name = "PROFILE", value_parser = parse_profile_name)]
        name: String,
    },
    /// List the profiles: remote, background forward, whether the host answers, its pi-host,
    /// agent and sandbox, and when it was last reached.
    Remotes,
    /// Print the remote host's log (over SSH; a `connect` profile), or with --local the
    /// profile's background connect's log.
    Logs {
        /// The profile [default: --profile's].
        #[arg(value_name = "PROFILE", value_parser = parse_profile_name)]
        name: Option<String>,
        /// Keep printing what is appended, until Ctrl-C.
        #[arg(long, short = 'f')]
        follow: bool,
        /// The local background log ($PI_REMOTE_CONFIG_DIR/run/PROFILE.log) instead.
        #[arg(long)]
        local: bool,
        /// How many of the last lines to print first.
        #[arg(long, short = 'n', default_value_t = 100)]
        lines: u32,
    },
    /// Stop pi-host on a `connect` profile's remote and remove what connect installed (the
    /// install root's pi-host, data and agent, connect's config lines; your own files stay),
    /// then the profile. Asks first.
    Uninstall {
        #[arg(value_name = "PROFILE", value_parser = parse_profile_name)]
        name: String,
        /// Do not ask (needed without a terminal).
        #[arg(long)]
        yes: bool,
        /// Remove only this desktop's side (the profile with its device token and pin, the
        /// background connect and its files), without contacting the remote: for a remote
        /// that is gone. What stays on the remote is named.
        #[arg(long)]
        local_only: bool,
    },
    /// Check a `connect` profile's remote step by step (SSH, host key, pi-host and its version,
    /// TLS pin, clock, disk, forward, agent), one line each with what to do; exit 7 on any
    /// problem or warning.
    Doctor {
        /// The profile [default: --profile's].
        #[arg(value_name = "PROFILE", value_parser = parse_profile_name)]
        name: Option<String>,
    },
    /// Pair this machine with a host and store the device credential in a profile.
    Pair {
        /// racps://HOST:PORT/pair?cert=sha256:HEX#TOKEN (from `pi-host pair` or `pi-gateway
        /// pair`), a bare token (with --host HOST:PORT and --cert-sha256), or `-` to read
        /// either from stdin (keeps the token out of the process list).
        link: String,
        /// The host's certificate SHA-256 to pin (64 hex digits, `certSha256` of `pi-host
        /// pair`; `sha256:HEX` and openssl's `AB:CD:…` work too): needed with a bare token, and
        /// checked against the racps:// link's `cert=` when both are given.
        #[arg(long, visible_alias = "cert")]
        cert_sha256: Option<racp_proto::fingerprint::CertSha256>,
        /// Accept a plain racp:// link, for a host run with --plain: the token then goes to
        /// whatever holds the port, with nothing to prove it is the host.
        #[arg(long)]
        plain: bool,
        /// The device name shown in `devices` (default: this machine's host name).
        #[arg(long)]
        name: Option<String>,
        /// Replace the profile's credential if it already holds one (without it, pair refuses
        /// and names what the profile holds).
        #[arg(long)]
        force: bool,
    },
    /// Show the profile (host URL, pinned certificate, device, roles) and the host's version.
    Status,
    /// List the hosts behind a gateway this device may reach (profile paired with a gateway).
    Hosts {
        /// Make this host the profile's default: commands without --host go to it.
        #[arg(long = "use", value_name = "HOST_ID")]
        use_host: Option<String>,
    },
    /// List sessions.
    Sessions,
    /// Create a session.
    New {
        /// The workspace on the host (inside its permitted roots): an absolute path, or
        /// '~/...' for the remote user's home (quoted, so this machine's shell leaves `~` alone).
        #[arg(long)]
        workspace: String,
        #[arg(long)]
        title: Option<String>,
        /// The model, as PROVIDER/MODEL (`models` lists them) [default: the agent's own].
        #[arg(long, value_parser = parse_model)]
        model: Option<ModelRef>,
        /// The thinking level: off, minimal, low, medium, high, xhigh.
        #[arg(long, value_parser = parse_thinking)]
        thinking: Option<ThinkingLevel>,
        /// What the agent may do without asking: ask, accept-edits, auto or plan [default: the
        /// host's, ask unless configured].
        #[arg(long, value_parser = parse_permission_mode)]
        mode: Option<PermissionMode>,
    },
    /// Change a session's model, thinking level, auto-compaction or queue modes.
    Configure {
        session: String,
        /// The model, as PROVIDER/MODEL.
        #[arg(long, value_parser = parse_model)]
        model: Option<ModelRef>,
        /// The thinking level: off, minimal, low, medium, high, xhigh.
        #[arg(long, value_parser = parse_thinking)]
        thinking: Option<ThinkingLevel>,
        /// Whether the agent compacts its context when it is nearly full: on or off.
        #[arg(long, value_parser = parse_on_off)]
        auto_compaction: Option<bool>,
        /// How the agent delivers queued steering messages: all, or one-at-a-time.
        #[arg(long, value_parser = parse_queue_mode)]
        steering_mode: Option<QueueMode>,
        /// How the agent delivers queued follow-ups: all, or one-at-a-time.
        #[arg(long, value_parser = parse_queue_mode)]
        follow_up_mode: Option<QueueMode>,
        /// What the agent may do without asking: ask, accept-edits, auto or plan.
        #[arg(long, value_parser = parse_permission_mode)]
        mode: Option<PermissionMode>,
        /// Withdraw every permission grant given with "always" in the session.
        #[arg(long)]
        clear_grants: bool,
    },
    /// Compact a session's conversation: the agent replaces its older messages with a summary.
    Compact {
        session: String,
        /// What the summary should keep or focus on.
        #[arg(long)]
        instructions: Option<String>,
    },
    /// List the models the host's agent can run and whether each provider has a key.
    Models {
        /// Only models whose provider, id or name holds this text (any case).
        filter: Option<String>,
        /// Only this provider's models.
        #[arg(long)]
        provider: Option<String>,
    },
    /// Provider API keys the host hands its agent (owner only).
    #[command(subcommand)]
    Credentials(CredentialsCommand),
    /// Start a turn with a prompt.
    Prompt {
        session: String,
        text: String,
        /// An image to send with the prompt (.png, .jpg, .gif, .webp; repeatable, at most 8).
        #[arg(long = "image")]
        images: Vec<std::path::PathBuf>,
        /// Follow the turn and print its events until it finishes; exit 5 unless it completed.
        /// At a terminal it asks for the answers to the turn's approvals.
        #[arg(long)]
        wait: bool,
    },
    /// Add guidance to the running turn; the agent reads it at its next step.
    Steer {
        session: String,
        text: String,
        /// The turn [default: the session's running turn].
        #[arg(long)]
        turn: Option<String>,
    },
    /// Queue a prompt to run as a turn of its own once the running turn completes (at once when
    /// none runs).
    FollowUp {
        session: String,
        text: String,
        /// An image to send with it (.png, .jpg, .gif, .webp; repeatable, at most 8 queued).
        #[arg(long = "image")]
        images: Vec<std::path::PathBuf>,
    },
    /// Withdraw a session's queued follow-ups before they run, printing their text.
    ClearQueue {
        session: String,
        /// Only this follow-up's turn [default: all of them].
        #[arg(long)]
        turn: Option<String>,
    },
    /// Abort the running turn (nothing running is not an error).
    Abort {
        session: String,
        /// The turn [default: the session's running turn].
        #[arg(long)]
        turn: Option<String>,
    },
    /// Close a session: its agent stops and a running turn ends aborted; its log stays readable.
    Close { session: String },
    /// Give a session another title.
    Rename { session: String, title: String },
    /// Fork a session before one of its messages: a new session with the conversation before
    /// it; prints the new session's id, then the message's text (to edit and send again).
    Fork {
        session: String,
        /// The cursor of a message you sent (`pi-remote history SESSION --json` prints each
        /// message with its cursor).
        #[arg(long, value_name = "CURSOR")]
        from: racp_proto::Cursor,
        #[arg(long)]
        title: Option<String>,
    },
    /// Clone a session: a new session with its whole conversation; prints the new session's id.
    Clone {
        session: String,
        #[arg(long)]
        title: Option<String>,
    },
    /// Allow a pending approval, or answer it with --value (select, input, editor).
    Approve {
        approval: String,
        #[arg(long)]
        value: Option<String>,
    },
    /// Deny a pending approval; a permission's --note is what the model reads of why.
    Deny {
        approval: String,
        #[arg(long)]
        note: Option<String>,
    },
    /// Follow a session live and answer its approvals from stdin (y/n or a value); its most
    /// recent messages are shown first.
    Attach { session: String },
    /// Print a session's conversation, oldest first: every message the host kept, however long
    /// ago (with --json, one event a line).
    History {
        session: String,
        /// Only the last N messages.
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        limit: Option<u32>,
    },
    /// Run a shell command in a session's workspace; its output joins the conversation (the
    /// agent sees it with the next prompt). Waits until it ends (the host aborts it after 10 min).
    Shell { session: String, command: String },
    /// Print what a session cost: messages, tool calls, tokens, cost (and the context in use
    /// while its agent runs).
    Stats { session: String },
    /// List a session's slash commands (prompt templates, skills, extension commands); run one
    /// with `prompt SESSION "/name args"`.
    Commands { session: String },
    /// Write a session's HTML export to stdout (`pi-remote export SESSION > session.html`).
    Export { session: String },
    /// Write a file on the host to stdout as it is, text or binary (`pi-remote cat PATH`): an
    /// absolute path inside the host's permitted roots (operator).
    Cat { path: String },
    /// Show a session workspace's unified diff against HEAD, as the host's git writes it
    /// (operator): all of it, the files one turn changed (`--turn`), or one file (`--path`).
    Diff {
        session: String,
        /// Only the files this turn changed (its id, from `attach` or `history`).
        #[arg(long, conflicts_with = "path")]
        turn: Option<String>,
        /// Only this file (relative to the workspace).
        #[arg(long)]
        path: Option<String>,
    },
    /// Show a session workspace's git state: its branch, how far it is ahead of and behind
    /// its upstream, and each changed file with git's two status letters.
    Changes { session: String },
    /// List paired devices (owner only).
    Devices,
    /// Revoke a device (owner only).
    Revoke { device: String },
    /// Make the agent bundle `connect` uploads to a remote whose npm cannot install pi (or find
    /// it in the cache): prints its path, size and SHA-256.
    Bundle {
        /// The remote's architecture, as `uname -m` prints it (x86_64 or aarch64).
        #[arg(long, default_value = "x86_64")]
        arch: String,
        /// With Node.js, for a remote without a Node pi runs on.
        #[arg(long)]
        node: bool,
    },
}

#[derive(Subcommand, Debug)]
enum CredentialsCommand {
    /// Set a provider's API key: typed at a prompt without echo, or piped on stdin (never an
    /// argument). The host's next agent uses it.
    Set { provider: String },
    /// List the keys set: provider, fingerprint, when (never the key).
    List,
    /// Delete a provider's key.
    Delete { provider: String },
}

fn parse_profile_name(text: &str) -> Result<String, String> {
    profile::check_name(text).map(|()| text.to_string())
}

fn parse_on_off(text: &str) -> Result<bool, String> {
    match text {
        "on" | "true" | "yes" => Ok(true),
        "off" | "false" | "no" => Ok(false),
        _ => Err(format!("{text:?} is not on or off")),
    }
}

#[derive(clap::Args, Debug)]
struct ConnectCommand {
    /// `[user@]host[:port]`, or a Host alias from the ssh config.
    target: String,
    /// The release directory made by deploy/release.sh (manifest.json, tarballs, install.sh);
    /// needed to install or upgrade [default: the release of this version beside pi-remote,
    /// PREFIX/share/pi-remote/release as deploy/dist.sh lays it out, else
    /// ~/.local/share/pi-remote/release].
    #[arg(long, env = "PI_REMOTE_RELEASE_DIR")]
    release_dir: Option<std::path::PathBuf>,
    /// The install root on the remote: yours, and writable by no one else (else it is refused,
    /// as ssh refuses such a ~/.ssh).
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
    #[arg(long, conflicts_with = "background")]
    once: bool,
    /// Keep the forward up in a background process of its own (one per profile; its log is
    /// $PI_REMOTE_CONFIG_DIR/run/PROFILE.log) and return once it is ready; `disconnect` stops it.
    /// The host key must be known (or --accept-new given) and keys usable without a question
    /// (ssh-agent, SSH_ASKPASS, unencrypted).
    #[arg(long)]
    background: bool,
    /// The pi version installed on the remote as the host's agent.
    #[arg(long, default_value = provision::agent::PI_VERSION, value_parser = pi_version)]
    pi_version: String,
}

fn pi_version(text: &str) -> Result<String, String> {
    if provision::agent::valid_version(text) {
        Ok(text.to_string())
    } else {
        Err(format!(
            "{text:?} is not a version (digits, letters and .-+ only)"
        ))
    }
}

/// `pi-remote bundle`: the bundle of the pinned pi for `arch`.
async fn bundle(out: &Out, arch: &str, with_node: bool) -> Result<(), Failure> {
    let cpu = provision::bundle::npm_cpu(arch).ok_or_else(|| {
        Failure::Usage(format!(
            "Node.js has no official Linux build for {arch:?}: give x86_64 or aarch64"
        ))
    })?;
    let spec = provision::bundle::BundleSpec { cpu, with_node };
    // The bundle stage's progress on stderr; `--json` prints only the result.
    let reporter: Box<dyn provision::stage::Reporter> = if out.json {
        Box::new(provision::stage::Silent)
    } else {
        Box::new(Display::new())
    };
    let made =
        provision::bundle::ensure(provision::agent::PI_VERSION, spec, reporter.as_ref()).await?;
    if out.json {
        out.json_value(&serde_json::json!({
            "path": made.path,
            "bytes": made.len,
            "sha256": made.sha256,
            "pi": provision::agent::PI_VERSION,
            "node": made.node,
            "parts": made.parts,
        }));
    } else {
        out.line(&format!(
            "{} ({} bytes, sha256 {})",
            made.path.display(),
            made.len,
            made.sha256
        ));
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(error) => {
            let _ = error.print();
            return if error.use_stderr() {
                Exit::Usage.into()
            } else {
                Exit::Ok.into()
            };
        }
    };
    let out = Out::new(cli.json);
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
    match runtime.block_on(run(cli, &out)) {
        Ok(()) => Exit::Ok.into(),
        Err(failure) => {
            out.failure(&failure);
            failure.exit().into()
        }
    }
}

async fn run(mut cli: Cli, out: &Out) -> Result<(), Failure> {
    let profile = remotes::resolve_profile(cli.profile.take());
    let command = match lifecycle_command(cli.command, out, &profile).await? {
        Some(command) => command,
        None => return Ok(()),
    };
    let cli = Parsed {
        profile,
        host: cli.host,
        json: cli.json,
    };
    let command = match command {
        Command::Connect(_) if cli.host.is_some() => {
            return Err(Failure::Usage(
                "--host chooses a host behind a gateway; connect takes its SSH target instead"
                    .into(),
            ));
        }
        Command::Connect(command) => return connect(*command, cli.profile, cli.json).await,
        Command::Pair {
            link,
            cert_sha256,
            plain,
            name,
            force,
        } => {
            let hints = PairingHints {
                host: cli.host.as_deref(),
                cert_sha256,
                plain,
            };
            return pair::pair(out, &cli.profile, &link, &hints, name, force).await;
        }
        Command::Status => return status::status(out, &cli.profile, cli.host.as_deref()).await,
        Command::Bundle { arch, node } => return bundle(out, &arch, node).await,
        Command::Hosts { use_host } => {
            if cli.host.is_some() {
                return Err(Failure::Usage(
                    "hosts lists every host; choose one with `hosts --use HOST_ID`, not --host"
                        .into(),
                ));
            }
            return hosts::hosts(out, &cli.profile, use_host).await;
        }
        command => command,
    };
    // Devices are the gateway's own; everything else is a host's.
    let reach = match command {
        Command::Devices | Command::Revoke { .. } => Reach::Gateway,
        _ => Reach::Host,
    };
    let client = open_profile(&cli.profile, cli.host.as_deref(), reach).await?;
    on_client(out, client, command).await
}

/// A command that goes through the profile's client, to the host or to the gateway. Longer than
/// 60 lines by design: one short arm per command, each handing its arguments to its module.
async fn on_client(out: &Out, client: RacpClient, command: Command) -> Result<(), Failure> {
    match command {
        // Returned above: they need no stored profile, or report on it without a client.
        Command::Connect(_)
        | Command::Pair { .. }
        | Command::Status
        | Command::Hosts { .. }
        | Command::Bundle { .. }
        | Command::Disconnect { .. }
        | Command::Use { .. }
        | Command::Remotes
        | Command::Logs { .. }
        | Command::Uninstall { .. }
        | Command::Doctor { .. } => Ok(()),
        Command::Sessions => sessions::list(out, &client).await,
        Command::New {
            workspace,
            title,
            model,
            thinking,
            mode,
        } => {
            let params = SessionCreateParams {
                workspace,
                title,
                model,
                thinking_level: thinking,
                permission_mode: mode,
            };
            sessions::create(out, &client, params).await
        }
        Command::Configure {
            session,
            model,
            thinking,
            auto_compaction,
            steering_mode,
            follow_up_mode,
            mode,
            clear_grants,
        } => {
            let params = SessionConfigureParams {
                session_id: session,
                model,
                thinking_level: thinking,
                auto_compaction,
                steering_mode,
                follow_up_mode,
                permission_mode: mode,
                clear_grants,
            };
            models::configure(out, &client, params).await
        }
        Command::Models { filter, provider } => {
            let filter = models::ModelFilter {
                text: filter,
                provider,
            };
            models::list(out, &client, &filter).await
        }
        Command::Credentials(command) => credentials(out, &client, command).await,
        Command::Prompt {
            session,
            text,
            images,
            wait,
        } => turns::prompt(out, &client, session, text, &images, wait).await,
        Command::Steer {
            session,
            text,
            turn,
        } => turns::steer(out, &client, session, text, turn).await,
        Command::FollowUp {
            session,
            text,
            images,
        } => turns::follow_up(out, &client, session, text, &images).await,
        Command::ClearQueue { session, turn } => {
            turns::clear_queue(out, &client, session, turn).await
        }
        Command::Compact {
            session,
            instructions,
        } => turns::compact(out, &client, session, instructions).await,
        Command::Abort { session, turn } => turns::abort(out, &client, session, turn).await,
        Command::Close { session } => sessions::close(out, &client, session).await,
        Command::Rename { session, title } => sessions::rename(out, &client, session, title).await,
        Command::Fork {
            session,
            from,
            title,
        } => sessions::fork(out, &client, session, from, title).await,
        Command::Clone { session, title } => sessions::clone(out, &client, session, title).await,
        Command::Approve { approval, value } => turns::approve(out, &client, approval, value).await,
        Command::Deny { approval, note } => turns::deny(out, &client, approval, note).await,
        Command::Attach { session } => attach::attach(out, client, session).await,
        Command::History { session, limit } => history::history(out, &client, session, limit).await,
        Command::Shell { session, command } => shell::shell(out, &client, session, command).await,
        Command::Stats { session } => shell::stats(out, &client, session).await,
        Command::Commands { session } => shell::commands(out, &client, session).await,
        Command::Export { session } => shell::export(out, &client, session).await,
        Command::Cat { path } => files::cat(out, &client, path).await,
        Command::Diff {
            session,
            turn,
            path,
        } => files::diff(out, &client, session, turn, path).await,
        Command::Changes { session } => files::changes(out, &client, session).await,
        Command::Devices => devices::list(out, &client).await,
        Command::Revoke { device } => devices::revoke(out, &client, device).await,
    }
}

/// `pi-remote credentials`: the provider API keys the host hands its agent.
async fn credentials(
    out: &Out,
    client: &RacpClient,
    command: CredentialsCommand,
) -> Result<(), Failure> {
    match command {
        CredentialsCommand::Set { provider } => models::set(out, client, provider).await,
        CredentialsCommand::List => models::credentials(out, client).await,
        CredentialsCommand::Delete { provider } => models::delete(out, client, provider).await,
    }
}

/// `connect`'s arguments as bootstrap options.
fn connect_args(command: ConnectCommand, profile: String, json: bool) -> ConnectArgs {
    let display = Arc::new(Display::new());
    let mut options = BootstrapOptions::new(command.target);
    options.resolve = ResolveOptions {
        config_file: command.ssh_config,
        known_hosts: command.known_hosts,
        identity_files: command.identities,
    };
    options.ssh = ConnectOptions {
        host_key: connect::host_key_policy(command.accept_new, json, display.clone()),
        passphrase: Some(connect::passphrase_prompt(display.clone())),
        keepalive: Duration::from_secs(command.keepalive.max(1)),
        use_agent: !command.no_agent,
    };
    options.release_dir = command.release_dir;
    options.remote_dir = command.remote_dir;
    options.device_name = pair::device_name(command.name);
    options.agent_version = command.pi_version;
    if let Some(port) = command.local_port {
        options.local_port = port;
    }
    ConnectArgs {
        options,
        profile,
        once: command.once,
        json,
        display,
        reporter: None,
    }
}

/// The global options, with the profile resolved.
struct Parsed {
    profile: String,
    host: Option<String>,
    json: bool,
}

/// The commands about profiles and their forwards rather than a host's API; `Some` hands any
/// other command back.
async fn lifecycle_command(
    command: Command,
    out: &Out,
    profile: &str,
) -> Result<Option<Command>, Failure> {
    match command {
        Command::Use { name } => lifecycle::use_profile(out, &name)?,
        Command::Remotes => lifecycle::remotes(out, profile).await?,
        Command::Disconnect { name } => {
            background::disconnect(out, name.as_deref().unwrap_or(profile)).await?;
        }
        Command::Logs {
            name,
            follow,
            local,
            lines,
        } => {
            let name = name.as_deref().unwrap_or(profile);
            remote_admin::logs(out, name, follow, local, lines).await?;
        }
        Command::Uninstall {
            name,
            yes,
            local_only,
        } => remote_admin::uninstall(out, &name, yes, local_only).await?,
        Command::Doctor { name } => {
            if !doctor::doctor(out, name.as_deref().unwrap_or(profile)).await? {
                return Err(Failure::Checks("some checks need attention (above)".into()));
            }
        }
        command => return Ok(Some(command)),
    }
    Ok(None)
}

/// `connect`: in the foreground, or `--background` (the foreground part, or the child).
async fn connect(command: ConnectCommand, profile: String, json: bool) -> Result<(), Failure> {
    if command.background && !background::is_child() {
        return background::launch(&Out::new(json), &profile).await;
    }
    let background = command.background || background::is_child();
    let once = command.once;
    let mut args = connect_args(command, profile.clone(), json);
    let dir = profile::config_dir().map_err(Failure::Local)?;
    if once {
        return connect::run(args).await;
    }
    if !background {
        // One forward per profile, in the foreground or the background.
        let _held = background::take_lock(&dir, &profile)
            .map_err(Failure::Local)?
            .map_err(|pid| {
                Failure::local(format!(
                    "a connect of {profile:?} already runs (pid {pid}) and keeps its forward up: use the profile as it is, or `pi-remote disconnect {profile}` first"
                ))
            })?;
        return connect::run(args).await;
    }
    let Some(_held) = background::child_start(&dir, &profile)? else {
        return Ok(());
    };
    let log = remotes::log_file(&dir, &profile);
    args.reporter = Some(Arc::new(background::ChildReporter::new(log, &profile)));
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .map_err(|e| Failure::local(format!("cannot handle SIGTERM: {e}")))?;
    tokio::select! {
        outcome = connect::run(args) => outcome,
        _ = terminate.recv() => {
            eprintln!("--- {} stopped (SIGTERM)", remotes::now_secs());
            Ok(())
        }
    }
}
