//! The error-code registry: the single source of truth for every code RACP-WS can emit.
//!
//! Each row fixes what a code means and how a client should react. Rows are only ever added:
//! `tests/frozen_codes.rs` holds the published list and fails if one disappears or changes its
//! wire name. docs/error-codes.md, the JSON Schema and the TypeScript declarations are generated
//! from this table.

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

/// Whether a failure of this kind is transient. This is not the same as "safe to send the call
/// again": that also depends on the method (see [`crate::MethodSpec::safe_to_resend`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Retriable {
    /// The condition is transient; the same call can succeed later.
    Yes,
    /// The same call fails the same way until something else changes.
    No,
    /// Depends on the occurrence; the error's own `retriable` flag decides.
    Maybe,
}

/// What a client should do next when it meets a code.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "snake_case")]
pub enum Recovery {
    /// Retry with exponential backoff and jitter, if the call is safe to resend.
    Retry,
    /// Wait `retryAfterMs` (or back off when absent), then retry if the call is safe to resend.
    RetryAfter,
    /// Reconnect, say `hello` again and resubscribe every subscription from its last cursor.
    ReconnectAndResume,
    /// The cursor cannot be resumed: call `session/get` and continue from the snapshot's cursor.
    Resnapshot,
    /// The request itself is wrong; the same call fails the same way. Fix it before sending again.
    FixArguments,
    /// The credential was refused or has expired: pair again to get a new device credential.
    Reauthorize,
    /// Read the current state (session, turn, approval) before deciding what to do.
    CheckState,
    /// Client and host speak incompatible versions: upgrade one of them.
    Upgrade,
    /// Nothing the client can do will fix it: stop and show the error to the user.
    StopAndReport,
}

impl Recovery {
    pub const ALL: &'static [Recovery] = &[
        Recovery::Retry,
        Recovery::RetryAfter,
        Recovery::ReconnectAndResume,
        Recovery::Resnapshot,
        Recovery::FixArguments,
        Recovery::Reauthorize,
        Recovery::CheckState,
        Recovery::Upgrade,
        Recovery::StopAndReport,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Recovery::Retry => "retry",
            Recovery::RetryAfter => "retry_after",
            Recovery::ReconnectAndResume => "reconnect_and_resume",
            Recovery::Resnapshot => "resnapshot",
            Recovery::FixArguments => "fix_arguments",
            Recovery::Reauthorize => "reauthorize",
            Recovery::CheckState => "check_state",
            Recovery::Upgrade => "upgrade",
            Recovery::StopAndReport => "stop_and_report",
        }
    }

    /// One sentence for the generated documentation.
    pub fn advice(self) -> &'static str {
        match self {
            Recovery::Retry => {
                "Retry with exponential backoff and jitter, if the call is safe to resend."
            }
            Recovery::RetryAfter => {
                "Wait `retryAfterMs` (back off when absent), then resend if the call is safe to resend."
            }
            Recovery::ReconnectAndResume => {
                "Reconnect, say `hello`, and resubscribe every subscription from its last cursor."
            }
            Recovery::Resnapshot => "Call `session/get` and continue from the snapshot's cursor.",
            Recovery::FixArguments => {
                "Fix the request (see `details`); sending it unchanged fails the same way."
            }
            Recovery::Reauthorize => "Pair again to obtain a valid device credential.",
            Recovery::CheckState => "Read the current state before deciding what to do next.",
            Recovery::Upgrade => "Upgrade the client or the host to a compatible version.",
            Recovery::StopAndReport => "Stop and show the error; retrying cannot help.",
        }
    }
}

/// One row of the registry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CodeSpec {
    pub code: ErrorCode,
    /// The stable wire name, e.g. `CURSOR_EXPIRED`.
    pub name: &'static str,
    pub retriable: Retriable,
    pub recovery: Recovery,
    /// WebSocket close code used when this error ends a connection (private range 4000-4999).
    pub close_code: u16,
    /// HTTP status used when this error refuses a WebSocket upgrade.
    pub http_status: u16,
    /// Documented ahead of emission: registered so clients can prepare for it, but nothing emits
    /// it yet (its meaning says which code is used today).
    pub reserved: bool,
    /// The row's doc comment, as written (see [`CodeSpec::meaning`]).
    doc: &'static str,
}

impl CodeSpec {
    /// What the code means, in one or two sentences.
    pub fn meaning(&self) -> &'static str {
        self.doc.trim()
    }
}

macro_rules! error_registry {
    (@reserved) => { false };
    (@reserved $reserved:literal) => { $reserved };
    ($(
        $(#[doc = $doc:literal])*
        $variant:ident = $name:literal {
            retriable: $retriable:ident,
            recovery: $recovery:ident,
            close: $close:literal,
            http: $http:literal,
            $(reserved: $reserved:literal,)?
        }
    )*) => {
        /// A registered error code. Only these can appear on the wire.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema)]
        pub enum ErrorCode {
            $(
                $(#[doc = $doc])*
                #[serde(rename = $name)]
                $variant,
            )*
        }

        impl ErrorCode {
            /// Every registered code, in registry order.
            pub const ALL: &'static [ErrorCode] = &[$(ErrorCode::$variant),*];

            /// The registry row for this code.
            pub fn spec(self) -> &'static CodeSpec {
                match self {
                    $(ErrorCode::$variant => &CodeSpec {
                        code: ErrorCode::$variant,
                        name: $name,
                        retriable: Retriable::$retriable,
                        recovery: Recovery::$recovery,
                        close_code: $close,
                        http_status: $http,
                        reserved: error_registry!(@reserved $($reserved)?),
                        doc: concat!($($doc),*),
                    },)*
                }
            }

            /// Looks a code up by its wire name.
            pub fn from_name(name: &str) -> Option<ErrorCode> {
                match name {
                    $($name => Some(ErrorCode::$variant),)*
                    _ => None,
                }
            }
        }
    };
}

error_registry! {
    /// The client and host share no protocol version (`hello`), or the upgrade did not offer the `racp.v1` subprotocol.
    ProtocolMismatch = "PROTOCOL_MISMATCH" { retriable: No, recovery: Upgrade, close: 4000, http: 400, }
    /// The host is not running or cannot be reached.
    HostUnavailable = "HOST_UNAVAILABLE" { retriable: Yes, recovery: ReconnectAndResume, close: 4001, http: 503, }
    /// The host's bounded capacity (calls in flight, connections) is full; retry after backpressure.
    HostOverloaded = "HOST_OVERLOADED" { retriable: Yes, recovery: RetryAfter, close: 4002, http: 503, }
    /// An unexpected internal failure; `traceId` identifies it in the host's log.
    Internal = "INTERNAL" { retriable: Maybe, recovery: StopAndReport, close: 4003, http: 500, }
    /// The frame is not a valid request: not JSON, not an object, a missing or malformed `id` or `method`, or JSON nested too deeply.
    InvalidArgument = "INVALID_ARGUMENT" { retriable: No, recovery: FixArguments, close: 4004, http: 400, }
    /// The method's params failed validation; `details.path` is the JSON path of the bad field.
    InvalidParams = "INVALID_PARAMS" { retriable: No, recovery: FixArguments, close: 4005, http: 400, }
    /// The connection's credential does not admit this call: a pairing connection may only call `hello` and `pair` (a call before `hello` is HELLO_REQUIRED).
    Unauthorized = "UNAUTHORIZED" { retriable: No, recovery: Reauthorize, close: 4006, http: 401, }
    /// The named entity (device, subscription, ...) does not exist.
    NotFound = "NOT_FOUND" { retriable: No, recovery: CheckState, close: 4007, http: 404, }
    /// A session-scoped call named a session the host does not have.
    SessionNotFound = "SESSION_NOT_FOUND" { retriable: No, recovery: CheckState, close: 4008, http: 404, }
    /// The call conflicts with the current state of the entity (for example a closed session).
    Conflict = "CONFLICT" { retriable: Maybe, recovery: CheckState, close: 4009, http: 409, }
    /// The operation has no implementation on this host. Reserved: nothing raises it today (a method this host lacks is METHOD_NOT_FOUND, a capability it has off CAPABILITY_UNAVAILABLE).
    Unsupported = "UNSUPPORTED" { retriable: No, recovery: StopAndReport, close: 4010, http: 501, reserved: true, }
    /// The principal's roles do not admit the method, or the upgrade came from a Host or Origin the host does not allow.
    Forbidden = "FORBIDDEN" { retriable: No, recovery: StopAndReport, close: 4011, http: 403, }
    /// The method is unknown on this host, e.g. `host/list` without a gateway.
    MethodNotFound = "METHOD_NOT_FOUND" { retriable: No, recovery: StopAndReport, close: 4012, http: 404, }
    /// An idempotency key was reused in the same session with different input (keys are scoped to their session).
    IdempotencyConflict = "IDEMPOTENCY_CONFLICT" { retriable: No, recovery: CheckState, close: 4013, http: 409, }
    /// The replay cursor is older than the retained window or from another epoch; `details` carries the oldest and head cursors. Resubscribe from a snapshot.
    CursorExpired = "CURSOR_EXPIRED" { retriable: No, recovery: Resnapshot, close: 4014, http: 410, }
    /// The client fell behind the event stream and was disconnected; `details.lastCursor` is the last cursor delivered on each subscription.
    ClientTooSlow = "CLIENT_TOO_SLOW" { retriable: Yes, recovery: ReconnectAndResume, close: 4015, http: 429, }
    /// The approval's deadline passed before an answer arrived.
    ApprovalExpired = "APPROVAL_EXPIRED" { retriable: No, recovery: CheckState, close: 4016, http: 410, }
    /// The approval was already settled or belongs to an older turn.
    ApprovalStale = "APPROVAL_STALE" { retriable: No, recovery: CheckState, close: 4017, http: 409, }
    /// A frame exceeded the negotiated size bound; `details.limit` is the bound in bytes.
    PayloadTooLarge = "PAYLOAD_TOO_LARGE" { retriable: No, recovery: FixArguments, close: 4018, http: 413, }
    /// An operation did not finish within its time bound.
    Timeout = "TIMEOUT" { retriable: Yes, recovery: Retry, close: 4019, http: 504, }
    /// The host is draining for shutdown; the call was refused rather than started.
    HostShuttingDown = "HOST_SHUTTING_DOWN" { retriable: Yes, recovery: ReconnectAndResume, close: 4020, http: 503, }
    /// A per-device budget was exceeded inside its window; `retryAfterMs` says when it refills.
    RateLimited = "RATE_LIMITED" { retriable: Yes, recovery: RetryAfter, close: 4021, http: 429, }
    /// A request exceeded a count the host bounds: a connection's subscriptions (`details.maxSubscriptions`), a prompt's images, the follow-ups (and their images) a session holds queued, the providers an owner adds (`details.limit`); the message says what to do instead. A field past its own bound (a string's length, a number's range) is INVALID_PARAMS instead.
    LimitExceeded = "LIMIT_EXCEEDED" { retriable: No, recovery: FixArguments, close: 4022, http: 422, }
    /// The host has no usable agent (not found, its version or runtime unusable) or could not start or reach it. The message says what to fix on the host (also `details.suggestion`); the same call fails the same way until then.
    AgentUnavailable = "AGENT_UNAVAILABLE" { retriable: No, recovery: StopAndReport, close: 4023, http: 503, }
    /// The session already has an active turn; steer it, abort it, or wait for it to finish.
    AgentBusy = "AGENT_BUSY" { retriable: No, recovery: CheckState, close: 4024, http: 409, }
    /// The agent process died mid-turn; the turn settles as aborted, and the next turn restarts the agent.
    AgentSidecarCrashed = "AGENT_SIDECAR_CRASHED" { retriable: No, recovery: CheckState, close: 4025, http: 502, }
    /// The turn id is unknown in this session.
    TurnNotFound = "TURN_NOT_FOUND" { retriable: No, recovery: CheckState, close: 4026, http: 404, }
    /// The turn was aborted by a user or by the system.
    TurnAborted = "TURN_ABORTED" { retriable: No, recovery: CheckState, close: 4027, http: 409, }
    /// The connection to the host dropped; calls in flight are rejected, and the client reconnects and resubscribes by cursor.
    HostDisconnected = "HOST_DISCONNECTED" { retriable: Yes, recovery: ReconnectAndResume, close: 4028, http: 503, }
    /// Provisioning pi-host over SSH failed; `details.reason` names the stage, or is `unsupported_platform` when the release has no build the remote can run (`details.found`: its `os`, `arch`, `libc`, `libcVersion`; `details.needed`: `platforms`, and `libc`, `glibcMin` for a glibc build), found before anything is uploaded; `no_node_build` or `glibc_too_old` when the remote has no Node pi runs on and Node's official builds cannot run there (no build for its architecture, musl, or glibc below 2.28; `details.found` as above, `details.node`), also before anything is uploaded; `unsafe_remote_dir` when the install root, or what its `current` link leads to, is not the connecting user's or is writable by its group or others (`details.path`, `details.problem`: `not_owned` or `writable_by_others`), found before anything there is run.
    HostBootstrapFailed = "HOST_BOOTSTRAP_FAILED" { retriable: No, recovery: StopAndReport, close: 4029, http: 500, }
    /// The remote pi-host version does not match the one the client needs.
    HostVersionMismatch = "HOST_VERSION_MISMATCH" { retriable: No, recovery: Upgrade, close: 4030, http: 400, }
    /// The device or pairing token was rejected on the upgrade, or the device was revoked.
    RemoteAuthFailed = "REMOTE_AUTH_FAILED" { retriable: No, recovery: Reauthorize, close: 4031, http: 401, }
    /// The RACP-WS transport could not connect (refused socket, failed TLS handshake: `retriable: true`), or the client refused the URL before connecting (`retriable: false`; `details.reason`: `bad_url`, `userinfo` (a user name or password before the host), `plain_not_loopback`, or `plain_refused` without the plain-WebSocket opt-in).
    RemoteConnectionFailed = "REMOTE_CONNECTION_FAILED" { retriable: Maybe, recovery: Retry, close: 4032, http: 502, }
    /// The SSH loopback port forward could not be established.
    RemoteForwardFailed = "REMOTE_FORWARD_FAILED" { retriable: Yes, recovery: Retry, close: 4033, http: 502, }
    /// A remote workspace or file path does not exist on the host.
    RemotePathNotFound = "REMOTE_PATH_NOT_FOUND" { retriable: No, recovery: FixArguments, close: 4034, http: 404, }
    /// A remote path is outside the host's permitted roots (after resolving symlinks and `..`).
    RemotePathForbidden = "REMOTE_PATH_FORBIDDEN" { retriable: No, recovery: FixArguments, close: 4035, http: 403, }
    /// Pairing could not mint a device credential (token already used, or too many failed attempts).
    PairingFailed = "PAIRING_FAILED" { retriable: No, recovery: Reauthorize, close: 4036, http: 401, }
    /// The single-use pairing token expired before pairing completed.
    PairingTokenExpired = "PAIRING_TOKEN_EXPIRED" { retriable: No, recovery: Reauthorize, close: 4037, http: 401, }
    /// The call needs a capability the host advertised as unavailable in `hello`.
    CapabilityUnavailable = "CAPABILITY_UNAVAILABLE" { retriable: No, recovery: StopAndReport, close: 4038, http: 501, }
    /// The endpoint's TLS certificate is not the one pinned at pairing (`details.expected`, `details.found`: SHA-256 fingerprints); nothing was sent. Another process may hold the port, or the host's identity was reset: re-pair only if you trust the change.
    HostIdentityMismatch = "HOST_IDENTITY_MISMATCH" { retriable: No, recovery: StopAndReport, close: 4039, http: 502, }
    /// No usable model is selected, the agent does not know the model asked for (`session/create`, `session/configure`), or the provider rejects the selected model as unknown (HTTP 404). Pick one `model/list` shows (`session/configure`), or fix the agent's settings on the host.
    ModelNotConfigured = "MODEL_NOT_CONFIGURED" { retriable: No, recovery: StopAndReport, close: 4040, http: 424, }
    /// The model provider failed. Transient for gateway and server errors (5xx, overloaded); terminal (`retriable: false`) for malformed 400/422 requests and for billing, credit, spend or quota exhaustion, even when returned with HTTP 429. `details.providerStatus`, `details.providerCode`, `details.providerMessage` (redacted, at most 600 characters).
    ProviderError = "PROVIDER_ERROR" { retriable: Maybe, recovery: Retry, close: 4041, http: 502, }
    /// The provider refused the credentials configured on the host (HTTP 401/403, a missing or invalid API key).
    ProviderUnauthorized = "PROVIDER_UNAUTHORIZED" { retriable: No, recovery: StopAndReport, close: 4042, http: 502, }
    /// The provider's throughput limit (HTTP 429, rate-limit wording); `retryAfterMs` when the provider said how long to wait. Billing exhaustion is PROVIDER_ERROR instead.
    ProviderRateLimited = "PROVIDER_RATE_LIMITED" { retriable: Yes, recovery: RetryAfter, close: 4043, http: 429, }
    /// The conversation does not fit the model's context window (HTTP 413 or the provider's overflow wording), and the agent's own recovery (compaction) did not bring it back. The same input fails the same way.
    ContextTooLarge = "CONTEXT_TOO_LARGE" { retriable: No, recovery: FixArguments, close: 4044, http: 413, }
    /// The provider's response stream was terminated or closed before the response was complete.
    StreamFailed = "STREAM_FAILED" { retriable: Yes, recovery: Retry, close: 4045, http: 502, }
    /// The provider could not be reached (DNS, refused or reset connection, TLS); `details.networkCode` is the errno when known (`ENOTFOUND`, `ECONNRESET`, ...). Not retriable for a certificate verification failure.
    NetworkError = "NETWORK_ERROR" { retriable: Maybe, recovery: Retry, close: 4046, http: 502, }
    /// The model ended its turn with no visible text and no tool call.
    EmptyModelResponse = "EMPTY_MODEL_RESPONSE" { retriable: Yes, recovery: Retry, close: 4047, http: 502, }
    /// The agent process died after its JavaScript heap hit its limit (V8's fatal-error banner in its stderr); the same turn fails the same way until the input shrinks.
    AgentSidecarOom = "AGENT_SIDECAR_OOM" { retriable: No, recovery: CheckState, close: 4048, http: 502, }
    /// Reserved: the provider did not answer in time. Emitted today as TIMEOUT.
    ProviderTimeout = "PROVIDER_TIMEOUT" { retriable: Yes, recovery: Retry, close: 4049, http: 504, reserved: true, }
    /// Reserved: the provider does not know the model id (HTTP 404). Emitted today as MODEL_NOT_CONFIGURED.
    ProviderModelNotFound = "PROVIDER_MODEL_NOT_FOUND" { retriable: No, recovery: StopAndReport, close: 4050, http: 404, reserved: true, }
    /// The model's provider needs an API key and the host's agent has none: set it with `credential/set` (owner), or pick another model. Found before a turn is spent.
    ProviderSecretMissing = "PROVIDER_SECRET_MISSING" { retriable: No, recovery: StopAndReport, close: 4051, http: 424, }
    /// A call came before `hello` on its connection: send `hello` first (the credential is fine; pairing again would not help).
    HelloRequired = "HELLO_REQUIRED" { retriable: No, recovery: FixArguments, close: 4052, http: 400, }
    /// A tool call was refused: a person denied it (or its approval's deadline passed), or the session's permission mode forbids it (docs/protocol.md, "Permissions"). The model receives the code in the tool's result; `session/configure` changes the mode.
    ToolDenied = "TOOL_DENIED" { retriable: No, recovery: CheckState, close: 4053, http: 403, }
    /// A tool call named a path on the always-on denylist (private keys, `.env` files, credential bundles, `.git/objects` and `.git/hooks` for writes, the host's own data and config): refused in every mode, whatever was granted (docs/protocol.md, "Permissions").
    WorkspacePathDenied = "WORKSPACE_PATH_DENIED" { retriable: No, recovery: StopAndReport, close: 4054, http: 403, }
    /// A tool call named a path outside the session's workspace and no person allowed it (docs/protocol.md, "Permissions"): such a call asks in every mode; allow it once or for the session.
    PathOutsideWorkspace = "PATH_OUTSIDE_WORKSPACE" { retriable: No, recovery: CheckState, close: 4055, http: 403, }
    /// The session is in plan mode, where the write tool is hard-denied: change the mode with `session/configure` to let it write.
    WriteDisabledInPlan = "WRITE_DISABLED_IN_PLAN" { retriable: No, recovery: CheckState, close: 4056, http: 403, }
    /// The session is in plan mode, where the edit tool is hard-denied: change the mode with `session/configure` to let it edit.
    EditDisabledInPlan = "EDIT_DISABLED_IN_PLAN" { retriable: No, recovery: CheckState, close: 4057, http: 403, }
    /// The session is in plan mode, where a tool the policy does not know (an extension's) is hard-denied.
    ToolDisabledInPlan = "TOOL_DISABLED_IN_PLAN" { retriable: No, recovery: CheckState, close: 4058, http: 403, }
    /// `fs/read` was given a directory: list it with `fs/list` instead.
    ReadPathIsDirectory = "READ_PATH_IS_DIRECTORY" { retriable: No, recovery: FixArguments, close: 4059, http: 400, }
    /// `workspace/status` or `workspace/diff` on a session whose workspace is not inside a git repository: there is nothing to compare with (`git init` it, or read files with `fs/read`).
    WorkspaceNotARepository = "WORKSPACE_NOT_A_REPOSITORY" { retriable: No, recovery: StopAndReport, close: 4060, http: 409, }
    /// The host cannot run `git` (not installed, not on the host's PATH, or it failed to start): install git on the remote for `workspace/status` and `workspace/diff`.
    GitUnavailable = "GIT_UNAVAILABLE" { retriable: No, recovery: StopAndReport, close: 4061, http: 503, }
}

impl ErrorCode {
    pub fn as_str(self) -> &'static str {
        self.spec().name
    }

    /// Looks a code up by the WebSocket close code it uses.
    pub fn from_close_code(close_code: u16) -> Option<ErrorCode> {
        ErrorCode::ALL
            .iter()
            .copied()
            .find(|code| code.spec().close_code == close_code)
    }
}

impl std::fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn close_codes_are_unique_and_private() {
        let mut seen = HashSet::new();
        for code in ErrorCode::ALL {
            let spec = code.spec();
            assert!(
                (4000..5000).contains(&spec.close_code),
                "{} uses close code {} outside 4000-4999",
                spec.name,
                spec.close_code
            );
            assert!(
                seen.insert(spec.close_code),
                "{} reuses a close code",
                spec.name
            );
            assert_eq!(ErrorCode::from_close_code(spec.close_code), Some(*code));
        }
    }

    #[test]
    fn wire_names_round_trip() {
        for code in ErrorCode::ALL {
            let json = serde_json::to_string(code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            let back: ErrorCode = serde_json::from_str(&json).unwrap();
            assert_eq!(back, *code);
            assert_eq!(ErrorCode::from_name(code.as_str()), Some(*code));
        }
        assert!(serde_json::from_str::<ErrorCode>("\"NOT_A_CODE\"").is_err());
    }

    #[test]
    fn every_code_has_meaning_and_http_status() {
        for code in ErrorCode::ALL {
            let spec = code.spec();
            assert!(!spec.meaning().is_empty(), "{} has no meaning", spec.name);
            assert!((400..600).contains(&spec.http_status), "{}", spec.name);
            assert_eq!(spec.code, *code);
        }
    }

    #[test]
    fn recovery_names_match_serde() {
        for recovery in Recovery::ALL {
            let json = serde_json::to_value(recovery).unwrap();
            assert_eq!(json, serde_json::Value::String(recovery.as_str().into()));
        }
    }
}
