//! `pi-remote`: a command-line RACP-WS client for a pi-host.
//!
//! ```text
//! pi-remote pair 'racps://127.0.0.1:7878/pair?cert=sha256:…#ppt_…'  # store a credential (profile)
//! pi-remote status                                     # the profile's host, device, roles; host version
//! pi-remote sessions                                   # list sessions
//! pi-remote new --workspace /srv/code/app --title fix  # create a session
//! pi-remote prompt SESSION "fix the tests" --wait      # start a turn and follow it
//! pi-remote steer SESSION "use the other test runner"  # guide the running turn
//! pi-remote follow-up SESSION "then update the docs"   # a turn of its own after the running one
//! pi-remote compact SESSION [--instructions TEXT]      # summarise the conversation
//! pi-remote abort SESSION | close SESSION              # end the running turn | close the session
//! pi-remote attach SESSION                             # live view; answer approvals from stdin
//! pi-remote history SESSION [--limit N]                # the conversation, oldest first
//! pi-remote shell SESSION "git status"                 # a shell command; its output joins the conversation
//! pi-remote stats SESSION | commands SESSION           # tokens and cost | slash commands
//! pi-remote export SESSION > session.html              # the session as pi's HTML page
//! pi-remote fork SESSION --from CURSOR [--title T]     # a new session before a message you sent
//! pi-remote clone SESSION [--title T]                  # a new session with the whole conversation
//! pi-remote cat PATH                                   # a file on the host, as it is
//! pi-remote changes SESSION                            # the workspace's branch and changed files
//! pi-remote diff SESSION [--turn TURN | --path FILE]   # its diff against HEAD
//! pi-remote approve APPROVAL [--value V] | deny APPROVAL
//! pi-remote devices | revoke DEVICE                    # owner only
//! pi-remote hosts [--use HOST_ID]                      # a gateway's hosts | choose the default
//! pi-remote --host HOST_ID sessions                    # a command for one host behind a gateway
//! pi-remote use PROFILE                                # the default profile
//! pi-remote remotes                                    # every profile: forward, host, versions, last seen
//! pi-remote connect TARGET --background | disconnect   # a forward held in the background | stop it
//! pi-remote logs [PROFILE] [-f] [--local]              # the remote host's log | the background one
//! pi-remote doctor [PROFILE]                           # the remote checked step by step
//! pi-remote uninstall PROFILE [--yes] [--local-only]   # remove what connect installed, then the profile
//! ```
//!
//! The commands are in [`commands`], one module per group; [`out`] is where their output goes;
//! `src/bin/pi-remote.rs` parses the command line and dispatches.
//!
//! Every command takes `--profile NAME` (else `PI_REMOTE_PROFILE`, else the profile `pi-remote
//! use` chose, stored in `$PI_REMOTE_CONFIG_DIR/default-profile`, else `default`: see
//! [`remotes`]) and `--json` (machine-readable
//! output: one JSON document, or one JSON line per event for `attach` and `prompt --wait`).
//! Notes and errors go to stderr, data to stdout.
//!
//! `pair` connects with the pairing token (the client says `hello` before it reports the link
//! up), calls `pair`, and stores `{url, certSha256, deviceId, deviceToken, roles}`. The link is
//! `racps://HOST:PORT/pair?cert=sha256:HEX#TOKEN`: the client pins that certificate fingerprint
//! for the pairing connection and every later one, so a process squatting the host's port gets
//! neither token (docs/protocol.md §2.4). A plain `racp://` link is accepted only with `--plain`
//! (for a host run with `--plain`). A profile without a fingerprint (an older pi-remote's) is
//! refused before any connection, exit 4: pair again. `pair` into a profile that exists refuses
//! (exit 1, before the pairing token is spent) and names what the profile holds (device, role,
//! host) unless `--force` is given: a credential is never replaced by accident. (A profile
//! without a fingerprint, which cannot be used, is replaced: pairing again is its migration.)
//!
//! Gateways: a profile is a gateway's when its endpoint answers `host/list` (asked by `pair`
//! with the new credential, since a pairing connection may call only `hello` and `pair`; a
//! single pi-host answers METHOD_NOT_FOUND, docs/protocol.md §15), stored as `gateway: true`.
//! `hello` cannot tell them apart at pairing: its capabilities are empty on a pairing
//! connection (a device connection's list `hosts` at a gateway). `hosts` calls `host/list` at
//! the gateway's own endpoint and prints id, host name, version, online/offline and when the
//! gateway last heard from each host; `hosts --use HOST_ID` (a listed one) stores the profile's
//! default host. Every other command but `devices` and `revoke` (the gateway's own) connects to
//! `<url>/hosts/<HOST_ID>`, the host from the global `--host HOST_ID`, else the default; with
//! neither it fails before connecting with exit 64, naming `hosts` and `--host`, and so does
//! `--host` with a profile of a single host. `status` reports on the chosen host, if any. The
//! same certificate pin and device token serve every host of the gateway. For `pair` with a
//! bare token, `--host` is the host's `HOST:PORT` (no environment variable sets `--host`, so
//! it cannot slip into a `pair`).
//!
//! `status` prints the profile (URL, pinned certificate, device id and name, roles, the SSH
//! target of a `connect` profile) and the host's `host/info` (version, id, host name). The
//! profile's part is printed even when the host cannot be reached; the exit code says why.
//!
//! `steer` and `abort` act on the session's running turn (`--turn` names one). `abort` with
//! nothing running succeeds, as `turn/abort` of a finished turn does; `steer` with nothing
//! running is refused locally (exit 1). `steer` is sent once (`turn/steer` is not safe to
//! resend); `abort` and `close` are resent after a dropped link. `follow-up` queues a prompt for
//! after the running turn (or starts a turn when none runs) with a fresh idempotency key,
//! resent as is after a dropped link, as `prompt`'s; `compact` is sent once
//! (docs/protocol.md §7.25, §7.26). `fork` and `clone` are sent once too (a resend would make a
//! second session): `fork --from` takes the cursor of a user message of the session's history
//! (`history --json` prints each entry with its `cursor`) and prints the new session's id, then
//! that message's text; `clone` prints the new session's id (docs/protocol.md §7.31, §7.32).
//!
//! `prompt` starts a turn with a fresh idempotency key (resent as is after a dropped link). With
//! `--wait` it first subscribes from the session's snapshot cursor (`session/get`), so no event
//! of the turn is missed, and prints the turn's events until `turn.finished`. When the turn
//! asks for an approval and stdin is a terminal, the typed line answers it as in `attach`;
//! otherwise stdin is not read and a note on stderr gives the `pi-remote approve`/`deny`
//! command.
//!
//! `history` prints the session's conversation, oldest first: it reads `session/history` pages
//! back from the head (each page's `earlier` is the next one's `upTo`) until a page has no
//! `earlier`, then prints them in order, one message at a time: `you: TEXT`, `assistant: TEXT`,
//! a tool call `→ NAME {ARGS}` (200 characters), its result `← NAME: OUTPUT` (the first 5
//! lines, at most 400 characters, `…` where cut), a compaction `[compacted: SUMMARY'S FIRST
//! LINE]`; a message's further lines are indented. The host keeps the history past its replay
//! window; when its own bound dropped the oldest messages, the first line says so. `--limit N`
//! prints the last N messages. With `--json`, each entry is printed as the event it is (one
//! JSON line each, as `attach` prints events).
//!
//! `attach` first shows the conversation so far: the snapshot's history (its most recent
//! messages, in `history`'s view, naming `pi-remote history SESSION` when there are more).
//! Then it prints the session live from the snapshot's cursor, where that history ends, so no
//! message is shown twice, and survives dropped links (the client resumes by cursor; a note goes
//! to stderr on reconnects and snapshot resyncs; after a resync, the snapshot's history entries
//! past the last event shown are printed: the messages missed meanwhile, naming `history` when
//! more may have been). Pending approvals
//! (from the snapshot or from events) are answered with stdin lines, oldest first: `y`/`n` for
//! confirm, an option or its number for select (options are shown numbered from 1), the text
//! for input and editor ([`commands`]' `approvals` module, shared with `prompt --wait`). Piped
//! input is held until an approval needs it; at a terminal a line typed while nothing waits is
//! dropped. It exits 0 when the session closes, or when stdin has ended, every typed line is
//! used, and no approval it knows is pending (an answered one counts until `approval.settled`).
//! With `--json` it prints a `{"type": "client.attached", "session", "cursor",
//! "pendingApprovals", "history"}` line (`history`: the snapshot's, `{entries, earlier?,
//! truncated?}`), then each event as one JSON line (and `client.resynced` lines, whose
//! `history` holds only the entries missed, with `earlier` when more may have been).
//!
//! Profiles live in `$PI_REMOTE_CONFIG_DIR/profiles/<name>.json`, where the directory defaults to
//! `$XDG_CONFIG_HOME/pi-remote` or `~/.config/pi-remote` (see [`profile`]). A profile holds the
//! device token: the file is created with mode 0600 in a 0700 directory, and the token is never
//! printed. `pair -` reads the pairing URL or token from stdin, to keep it out of argv.
//!
//! Exit codes ([`Exit`]): 0 ok; 1 a local problem (no profile, unreadable file, a profile `pair`
//! would replace, nothing to steer); 2 the host refused the call (its error code is printed); 3
//! the host cannot be reached; 4 the credential was refused, the profile has no certificate
//! fingerprint (stored by an older version), or the endpoint is not the paired host
//! (HOST_IDENTITY_MISMATCH): pair again, in the last case only if you trust the change; 5 a turn
//! that `prompt --wait` followed ended other than `completed`; 6 `connect` failed; 7 `doctor`
//! found a problem or a warning; 64 bad usage
//! (an unknown command or option, a missing or malformed argument, an invalid profile name, a
//! gateway profile's host command without a host, `--host` with a single host's profile,
//! `uninstall` without a terminal and without `--yes`, `logs`/`doctor`/`uninstall` for a
//! profile not made by `connect`): `EX_USAGE`, the same in pi-host and pi-gateway
//! (`racp_proto::EXIT_USAGE`). `use` with a profile that is not stored is 1 (the message names
//! the stored ones); `connect --background` when one already runs for the profile, and
//! `disconnect` when none does, are 0 (each says so); `logs` and `uninstall` exit 3 when SSH
//! cannot reach the remote and 4 when it refuses the keys or the host key (`uninstall` then
//! removes nothing and names `--local-only`, which removes the profile and its files without
//! touching the network and lists what stays on the remote; at a terminal without `--yes` it
//! asks whether to do that instead).
//!
//! Living with a remote (commands/background.rs, lifecycle.rs, remote_admin.rs, doctor.rs):
//! `connect --background` holds the forward in a detached pi-remote of its own (one per
//! profile: `flock` on `run/<profile>.lock`, its output in `run/<profile>.log`, 0600), and
//! returns once that one is ready (the same connected line, or `--json` `ready` event with a
//! `background: {pid, log}` member) or has failed; no secret is in the child's arguments, and it
//! needs the host key known and keys usable without a terminal. A foreground `connect` (not
//! `--once`) takes the same lock, so a profile has one forward either way (a second is refused,
//! exit 1, naming the pid). `disconnect` stops whichever holds it (SIGTERM, then up to 10 s for
//! the lock). `remotes` asks each profile's host for `host/info` within 3 s;
//! `last seen` is when a command last reached the host (`seen/<profile>`). `logs`, `doctor` and
//! `uninstall` go over SSH again with what `connect` was given (stored in the profile's `ssh`).

pub mod commands;
pub mod out;
pub mod pairing;
pub mod profile;
pub mod remotes;
pub mod view;

use racp_proto::{AppError, ErrorCode};
use std::process::ExitCode;

/// `pi-remote`'s exit codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Ok = 0,
    /// A local problem (no profile, unreadable file, a profile `pair` would replace, ...).
    Other = 1,
    /// The host answered the call with an error.
    Refused = 2,
    /// The host cannot be reached (connection refused, dropped, timed out).
    Unreachable = 3,
    /// The host refused the credential: pair again.
    Auth = 4,
    /// `prompt --wait`: the turn ended aborted or failed.
    TurnNotCompleted = 5,
    /// `connect`: provisioning over SSH failed (HOST_BOOTSTRAP_FAILED, REMOTE_FORWARD_FAILED,
    /// HOST_VERSION_MISMATCH).
    Bootstrap = 6,
    /// `doctor`: a check found a problem or a warning (each is printed with what to do).
    Doctor = 7,
    /// Bad usage: an unknown command or option, a missing or malformed argument (`EX_USAGE`,
    /// the same in pi-host and pi-gateway).
    Usage = racp_proto::EXIT_USAGE as isize,
}

impl From<Exit> for ExitCode {
    fn from(exit: Exit) -> ExitCode {
        ExitCode::from(exit as u8)
    }
}

/// Why a command failed.
#[derive(Debug)]
pub enum Failure {
    /// A local problem, with a message for a person.
    Local(String),
    /// An error from the host or the client library.
    App(AppError),
    /// The followed turn ended with this outcome.
    Turn(String),
    /// The stored profile cannot be used safely (no certificate fingerprint to pin): pair
    /// again. Exits like a refused credential.
    PairAgain(String),
    /// The command line cannot work as given (a gateway call without a host, `--host` for a
    /// profile of a single host): exit 64, with what to give instead.
    Usage(String),
    /// `doctor` found something to mend (the checks are printed): exit 7.
    Checks(String),
}

impl From<AppError> for Failure {
    fn from(error: AppError) -> Failure {
        Failure::App(error)
    }
}

impl Failure {
    pub fn local(message: impl Into<String>) -> Failure {
        Failure::Local(message.into())
    }

    pub fn exit(&self) -> Exit {
        match self {
            Failure::Local(_) => Exit::Other,
            Failure::App(error) => exit_for(error.code()),
            Failure::Turn(_) => Exit::TurnNotCompleted,
            Failure::PairAgain(_) => Exit::Auth,
            Failure::Usage(_) => Exit::Usage,
            Failure::Checks(_) => Exit::Doctor,
        }
    }

    /// The line printed on stderr.
    pub fn describe(&self) -> String {
        match self {
            Failure::Local(message)
            | Failure::PairAgain(message)
            | Failure::Usage(message)
            | Failure::Checks(message) => format!("pi-remote: {message}"),
            Failure::Turn(outcome) => format!("pi-remote: the turn ended {outcome}"),
            Failure::App(error) => {
                let hint = match exit_for(error.code()) {
                    // The message says what happened and when re-pairing is right.
                    _ if error.code() == ErrorCode::HostIdentityMismatch => "",
                    Exit::Auth => {
                        "\npi-remote: the host refused this credential; pair again (pi-remote pair)"
                    }
                    Exit::Unreachable => "\npi-remote: is pi-host running and reachable?",
                    _ if error.code() == ErrorCode::AgentBusy => {
                        "\npi-remote: a turn is running in this session: follow it with `pi-remote attach SESSION`, guide it with `pi-remote steer SESSION TEXT`, or end it with `pi-remote abort SESSION`"
                    }
                    _ => "",
                };
                format!("pi-remote: {}: {}{hint}", error.code(), error.message())
            }
        }
    }
}

/// The exit code for an error code.
pub fn exit_for(code: ErrorCode) -> Exit {
    match code {
        ErrorCode::RemoteAuthFailed
        | ErrorCode::PairingFailed
        | ErrorCode::PairingTokenExpired
        | ErrorCode::Unauthorized
        | ErrorCode::HostIdentityMismatch => Exit::Auth,
        ErrorCode::RemoteConnectionFailed
        | ErrorCode::HostUnavailable
        | ErrorCode::HostDisconnected
        | ErrorCode::HostShuttingDown
        | ErrorCode::Timeout => Exit::Unreachable,
        ErrorCode::HostBootstrapFailed
        | ErrorCode::RemoteForwardFailed
        | ErrorCode::HostVersionMismatch => Exit::Bootstrap,
        _ => Exit::Refused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_map_to_exit_codes() {
        assert_eq!(exit_for(ErrorCode::PairingFailed), Exit::Auth);
        assert_eq!(exit_for(ErrorCode::RemoteAuthFailed), Exit::Auth);
        assert_eq!(
            exit_for(ErrorCode::RemoteConnectionFailed),
            Exit::Unreachable
        );
        assert_eq!(exit_for(ErrorCode::SessionNotFound), Exit::Refused);
        assert_eq!(exit_for(ErrorCode::Forbidden), Exit::Refused);
    }

    #[test]
    fn a_failure_report_carries_the_host_s_fix() {
        // The host puts what to do in the message: the report shows it, not only `--json`.
        let error = AppError::new(
            ErrorCode::AgentUnavailable,
            "pi-host could not find the agent `pi` (looked in /usr/bin): install or upgrade pi \
             on this host with `npm install -g @mariozechner/pi-coding-agent`",
        )
        .with_details(serde_json::json!({"suggestion": "install pi"}));
        let report = Failure::App(error).describe();
        assert_eq!(
            report,
            "pi-remote: AGENT_UNAVAILABLE: pi-host could not find the agent `pi` (looked in \
             /usr/bin): install or upgrade pi on this host with `npm install -g \
             @mariozechner/pi-coding-agent`"
        );
    }
}
