//! The method table: every RACP-WS v1 method with its params and result types, the access it
//! needs, whether it changes state, and whether a client may resend it after losing the reply.

pub mod fs;
pub mod handshake;
pub mod host;
pub mod model;
pub mod session;
pub mod turn;
pub mod workspace;

use crate::codec::params::decode_params;
use crate::error::AppError;
use crate::limits::SHELL_DEADLINE_SECONDS;
use crate::role::{Access, Role};
use crate::validate::Validate;
use schemars::JsonSchema;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

use fs::{FsListResult, FsReadParams, FsReadResult, FsStatResult, PathParams};
use handshake::{HelloParams, HelloResult, PairParams, PairResult};
use host::{
    DeviceListResult, DeviceRevokeParams, HostInfoResult, HostListResult, PairingCreateParams,
    PairingCreateResult,
};
use model::{
    CredentialListResult, CredentialSetParams, CredentialSetResult, Deleted, ModelListResult,
    ProviderRef, ProviderSetParams,
};
use session::{
    SessionBashParams, SessionBashResult, SessionClearQueueParams, SessionClearQueueResult,
    SessionCloneParams, SessionCommandsResult, SessionCompactParams, SessionCompactResult,
    SessionConfigureParams, SessionCreateParams, SessionCreateResult, SessionExportParams,
    SessionExportResult, SessionForkParams, SessionForkResult, SessionGetResult,
    SessionHistoryParams, SessionHistoryResult, SessionListResult, SessionRef, SessionRenameParams,
    SessionStatsResult, SessionStreamParams, SessionStreamResult, SessionSubscribeParams,
    SessionSubscribeResult, SessionUnsubscribeParams,
};
use turn::{
    ApprovalRespondParams, ApprovalRespondResult, TurnFollowUpParams, TurnFollowUpResult, TurnRef,
    TurnStartParams, TurnStartResult, TurnSteerParams,
};
use workspace::{WorkspaceDiffParams, WorkspaceDiffResult, WorkspaceStatusResult};

/// No params, or no result fields: `{}`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Empty {}

impl Validate for Empty {}

/// A result with no fields yet: `{}`. Unlike [`Empty`] it tolerates fields a newer host adds.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct Ack {}

/// One row of the method table.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MethodSpec {
    pub method: Method,
    /// The wire name, e.g. `session/subscribe`.
    pub name: &'static str,
    /// Who serves it: the connection core, the connection's subscriptions, the server the
    /// client reached (a host or a gateway), or the host (a gateway routes it there).
    pub place: Place,
    /// Who may call it; anything else gets FORBIDDEN (or UNAUTHORIZED on a pairing connection).
    pub access: Access,
    /// Whether it changes host state.
    pub mutates: bool,
    /// Whether a client may send it again after losing the reply (HOST_DISCONNECTED, TIMEOUT):
    /// true for reads, for mutations that are idempotent by nature, and for `turn/start`, whose
    /// idempotency key makes a resend return the same turn.
    pub safe_to_resend: bool,
    /// How a host runs it: on the connection's loop, on the blocking pool, or on a task.
    pub run: Run,
    /// Whether it draws on the caller's rate bucket: every call but `hello`, which a client
    /// must be able to say whatever its budget.
    pub pays_rate: bool,
    /// Whether it holds a pass from the device's gate while it runs: every call but
    /// `device/revoke`, which waits for the device's passes (a device revoking itself would
    /// wait for its own call).
    pub holds_pass: bool,
    /// How long a host may take to answer it beyond a router's usual call timeout: the
    /// host's own deadline for a call that waits on something the user started (a shell
    /// command); `None` for every other call.
    pub deadline_ms: Option<u64>,
    doc: &'static str,
}

/// How a host runs a call ([`MethodSpec::run`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Run {
    /// On the connection's own loop, before it reads on: it changes the connection's state.
    Loop,
    /// On the blocking pool: a short store or file-system operation.
    Blocking,
    /// On a task of its own: it waits on an agent, another call, or the network.
    Task,
}

impl MethodSpec {
    /// What the method does, in one sentence.
    pub fn summary(&self) -> &'static str {
        self.doc.trim()
    }
}

/// A method's types, for typed calls: `client.call::<calls::SessionGet>(params)`.
pub trait RacpMethod {
    const METHOD: Method;
    type Params: Serialize + DeserializeOwned + JsonSchema + Validate;
    type Result: Serialize + DeserializeOwned + JsonSchema;
}

/// A column's value in a row, or its default when the row leaves the column out.
macro_rules! or_default {
    ($value:expr; $default:expr) => {
        $value
    };
    (; $default:expr) => {
        $default
    };
}

macro_rules! method_table {
    ($(
        $(#[doc = $place_doc:literal])*
        $place:ident($placed:ident) {$(
            $(#[doc = $doc:literal])*
            $variant:ident = $name:literal ($params:ty => $result:ty) {
                access: $access:expr, mutates: $mutates:literal, safe_to_resend: $resend:literal,
                run: $run:ident
                $(, pays_rate: $pays_rate:literal)?
                $(, holds_pass: $holds_pass:literal)?
                $(, deadline_ms: $deadline:expr)? $(,)?
            }
        )*}
    )*) => {
        /// A method name the host knows.
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Method {
            $($($(#[doc = $doc])* $variant,)*)*
        }

        impl Method {
            /// Every method, in table order.
            pub const ALL: &'static [Method] = &[$($(Method::$variant,)*)*];

            pub fn spec(self) -> &'static MethodSpec {
                match self {
                    $($(Method::$variant => &MethodSpec {
                        method: Method::$variant,
                        name: $name,
                        place: Place::$place,
                        access: $access,
                        mutates: $mutates,
                        safe_to_resend: $resend,
                        run: Run::$run,
                        pays_rate: or_default!($($pays_rate)?; true),
                        holds_pass: or_default!($($holds_pass)?; true),
                        deadline_ms: or_default!($(Some($deadline))?; None),
                        doc: concat!($($doc),*),
                    },)*)*
                }
            }

            pub fn from_name(name: &str) -> Option<Method> {
                match name {
                    $($($name => Some(Method::$variant),)*)*
                    _ => None,
                }
            }

            pub fn as_str(self) -> &'static str {
                self.spec().name
            }

            /// The JSON Schema of the method's params (a `$ref` into the generator's definitions).
            pub fn params_schema(self, generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
                match self {
                    $($(Method::$variant => generator.subschema_for::<$params>(),)*)*
                }
            }

            /// Reads a result as this method's result type (client side), to check its shape.
            pub fn check_result(self, result: &str) -> Result<(), serde_json::Error> {
                match self {
                    $($(Method::$variant => serde_json::from_str::<$result>(result).map(drop),)*)*
                }
            }

            /// The JSON Schema of the method's result.
            pub fn result_schema(self, generator: &mut schemars::SchemaGenerator) -> schemars::Schema {
                match self {
                    $($(Method::$variant => generator.subschema_for::<$result>(),)*)*
                }
            }
        }

        /// A request's params, read as its method's type.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Call {
            $($($variant($params),)*)*
        }

        /// Who serves a method ([`MethodSpec::place`]).
        #[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
        pub enum Place {
            $($(#[doc = $place_doc])* $place,)*
        }

        /// A call by who serves it ([`Call::place`]): each server matches the places it
        /// serves exhaustively, so a new row that is not placed everywhere does not compile.
        #[derive(Debug, Clone, PartialEq)]
        pub enum Placed {
            $($(#[doc = $place_doc])* $place($placed),)*
        }

        $(
            $(#[doc = $place_doc])*
            #[derive(Debug, Clone, PartialEq)]
            pub enum $placed {
                $($variant($params),)*
            }

            impl $placed {
                pub fn method(&self) -> Method {
                    match self {
                        $($placed::$variant(_) => Method::$variant,)*
                    }
                }
            }
        )*

        impl Call {
            /// Reads `params` as `method`'s params type and validates them.
            pub fn decode(method: Method, params: Option<&RawValue>) -> Result<Call, AppError> {
                match method {
                    $($(Method::$variant => decode_params::<$params>(params).map(Call::$variant),)*)*
                }
            }

            pub fn method(&self) -> Method {
                match self {
                    $($(Call::$variant(_) => Method::$variant,)*)*
                }
            }

            /// The params as JSON, as a client writes them.
            pub fn params_value(&self) -> Result<serde_json::Value, serde_json::Error> {
                match self {
                    $($(Call::$variant(params) => serde_json::to_value(params),)*)*
                }
            }

            /// The call by who serves it.
            pub fn place(self) -> Placed {
                match self {
                    $($(Call::$variant(params) => Placed::$place($placed::$variant(params)),)*)*
                }
            }
        }

        /// One marker type per method, implementing [`RacpMethod`].
        pub mod calls {
            use super::*;
            $($(
                $(#[doc = $doc])*
                #[derive(Debug, Clone, Copy)]
                pub struct $variant;

                impl RacpMethod for $variant {
                    const METHOD: Method = Method::$variant;
                    type Params = $params;
                    type Result = $result;
                }
            )*)*
        }
    };
}

const ANY: Access = Access::Any;
const PAIRING: Access = Access::Pairing;
const OBSERVER: Access = Access::Role(Role::Observer);
const OPERATOR: Access = Access::Role(Role::Operator);
const OWNER: Access = Access::Role(Role::Owner);

method_table! {
    /// Served by the connection core itself.
    Core(CoreCall) {
        /// Negotiates the protocol version and frame bound; must be the first call on a connection.
        Hello = "hello" (HelloParams => HelloResult) { access: ANY, mutates: false, safe_to_resend: true, run: Loop, pays_rate: false }
    }
    /// Served by the connection, with its server's events.
    Subscription(SubscriptionCall) {
        /// Subscribes to a session's events, replaying from a cursor when one is given.
        SessionSubscribe = "session/subscribe" (SessionSubscribeParams => SessionSubscribeResult) { access: OBSERVER, mutates: false, safe_to_resend: true, run: Loop }
        /// Ends a subscription.
        SessionUnsubscribe = "session/unsubscribe" (SessionUnsubscribeParams => Ack) { access: OBSERVER, mutates: false, safe_to_resend: true, run: Loop }
    }
    /// Served by the server the client reached: a host, or the gateway for every host behind it.
    Endpoint(EndpointCall) {
        /// Exchanges the connection's pairing token for a device credential (pairing connections only).
        Pair = "pair" (PairParams => PairResult) { access: PAIRING, mutates: true, safe_to_resend: false, run: Blocking }
        /// Lists hosts behind a gateway; a plain pi-host answers METHOD_NOT_FOUND.
        HostList = "host/list" (Empty => HostListResult) { access: OBSERVER, mutates: false, safe_to_resend: true, run: Blocking }
        /// Lists paired devices.
        DeviceList = "device/list" (Empty => DeviceListResult) { access: OWNER, mutates: false, safe_to_resend: true, run: Blocking }
        /// Revokes a device and closes its open connections at once.
        DeviceRevoke = "device/revoke" (DeviceRevokeParams => Ack) { access: OWNER, mutates: true, safe_to_resend: true, run: Task, holds_pass: false }
        /// Mints a single-use pairing token for another device.
        PairingCreate = "pairing/create" (PairingCreateParams => PairingCreateResult) { access: OWNER, mutates: true, safe_to_resend: false, run: Blocking }
    }
    /// Served by the host: directly, or routed to it by a gateway.
    Host(HostCall) {
        /// Describes the host: version, id, platform, capabilities and limits.
        HostInfo = "host/info" (Empty => HostInfoResult) { access: OBSERVER, mutates: false, safe_to_resend: true, run: Task }
        /// Lists a directory inside the host's permitted roots.
        FsList = "fs/list" (PathParams => FsListResult) { access: OBSERVER, mutates: false, safe_to_resend: true, run: Blocking }
        /// Describes one path inside the host's permitted roots.
        FsStat = "fs/stat" (PathParams => FsStatResult) { access: OBSERVER, mutates: false, safe_to_resend: true, run: Blocking }
        /// Reads a page of a file inside the host's permitted roots: text, or binary flagged (its bytes in base64 when asked), with the file's size, time and SHA-256.
        FsRead = "fs/read" (FsReadParams => FsReadResult) { access: OPERATOR, mutates: false, safe_to_resend: true, run: Blocking }
        /// The git state of a session's workspace: branch, upstream ahead/behind, changed files.
        WorkspaceStatus = "workspace/status" (SessionRef => WorkspaceStatusResult) { access: OBSERVER, mutates: false, safe_to_resend: true, run: Task }
        /// A bounded unified diff of a session's workspace against HEAD: all of it, one path, or the files one turn changed.
        WorkspaceDiff = "workspace/diff" (WorkspaceDiffParams => WorkspaceDiffResult) { access: OPERATOR, mutates: false, safe_to_resend: true, run: Task }
        /// Creates a session in a workspace directory.
        SessionCreate = "session/create" (SessionCreateParams => SessionCreateResult) { access: OPERATOR, mutates: true, safe_to_resend: false, run: Task }
        /// Lists sessions.
        SessionList = "session/list" (Empty => SessionListResult) { access: OBSERVER, mutates: false, safe_to_resend: true, run: Blocking }
        /// Returns a session with a snapshot and the cursor the snapshot was taken at.
        SessionGet = "session/get" (SessionRef => SessionGetResult) { access: OBSERVER, mutates: false, safe_to_resend: true, run: Blocking }
        /// The assistant message and tool outputs streaming as of a cursor, so a client that resumes from its own cursor mid-message can rebuild what is in progress.
        SessionStream = "session/stream" (SessionStreamParams => SessionStreamResult) { access: OBSERVER, mutates: false, safe_to_resend: true, run: Blocking }
        /// A page of a session's conversation (its messages and compaction summaries) up to a cursor, kept past the event log's retention; needs no agent.
        SessionHistory = "session/history" (SessionHistoryParams => SessionHistoryResult) { access: OBSERVER, mutates: false, safe_to_resend: true, run: Blocking }
        /// Gives a session another title (and its agent's session the same name); the same title again changes nothing.
        SessionRename = "session/rename" (SessionRenameParams => SessionCreateResult) { access: OPERATOR, mutates: true, safe_to_resend: true, run: Task }
        /// Closes a session: its agent stops; its log stays readable. Closing a closed session succeeds.
        SessionClose = "session/close" (SessionRef => Ack) { access: OPERATOR, mutates: true, safe_to_resend: true, run: Task }
        /// Starts a turn with a prompt; idempotent by `idempotencyKey`.
        TurnStart = "turn/start" (TurnStartParams => TurnStartResult) { access: OPERATOR, mutates: true, safe_to_resend: true, run: Task }
        /// Adds guidance to the running turn.
        TurnSteer = "turn/steer" (TurnSteerParams => Ack) { access: OPERATOR, mutates: true, safe_to_resend: false, run: Task }
        /// Aborts the running turn. Aborting a finished turn succeeds and changes nothing.
        TurnAbort = "turn/abort" (TurnRef => Ack) { access: OPERATOR, mutates: true, safe_to_resend: true, run: Task }
        /// Answers an approval; the first answer wins, later ones get APPROVAL_STALE.
        ApprovalRespond = "approval/respond" (ApprovalRespondParams => ApprovalRespondResult) { access: OPERATOR, mutates: true, safe_to_resend: true, run: Task }
        /// Lists the providers and models the host's agent can run, each with whether a credential is present; needs no session.
        ModelList = "model/list" (Empty => ModelListResult) { access: OBSERVER, mutates: false, safe_to_resend: true, run: Task }
        /// Queues a prompt to run as a turn of its own once the running turn ends (starts it at once when none runs); idempotent by `idempotencyKey`.
        TurnFollowUp = "turn/follow_up" (TurnFollowUpParams => TurnFollowUpResult) { access: OPERATOR, mutates: true, safe_to_resend: true, run: Task }
        /// Withdraws queued follow-ups before they run (one, or all); a resend withdraws nothing more.
        SessionClearQueue = "session/clear_queue" (SessionClearQueueParams => SessionClearQueueResult) { access: OPERATOR, mutates: true, safe_to_resend: true, run: Task }
        /// Compacts a session's conversation: the agent replaces its older messages with a summary; refused while a turn runs.
        SessionCompact = "session/compact" (SessionCompactParams => SessionCompactResult) { access: OPERATOR, mutates: true, safe_to_resend: false, run: Task }
        /// Changes a session's model, thinking level, auto-compaction or queue modes; setting the same values again changes nothing.
        SessionConfigure = "session/configure" (SessionConfigureParams => SessionCreateResult) { access: OPERATOR, mutates: true, safe_to_resend: true, run: Task }
        /// Makes a new session from a session's conversation before one of its user messages, and answers that message's text; refused while a turn runs.
        SessionFork = "session/fork" (SessionForkParams => SessionForkResult) { access: OPERATOR, mutates: true, safe_to_resend: false, run: Task }
        /// Makes a new session holding a session's whole conversation; refused while a turn runs.
        SessionClone = "session/clone" (SessionCloneParams => SessionCreateResult) { access: OPERATOR, mutates: true, safe_to_resend: false, run: Task }
        /// Sets a provider's API key (write-only: never returned); the next agent started uses it.
        CredentialSet = "credential/set" (CredentialSetParams => CredentialSetResult) { access: OWNER, mutates: true, safe_to_resend: true, run: Blocking }
        /// Deletes a provider's API key set with `credential/set`.
        CredentialDelete = "credential/delete" (ProviderRef => Deleted) { access: OWNER, mutates: true, safe_to_resend: true, run: Blocking }
        /// Lists the providers with a key set from a client: when, and a short fingerprint, never the key.
        CredentialList = "credential/list" (Empty => CredentialListResult) { access: OWNER, mutates: false, safe_to_resend: true, run: Blocking }
        /// Adds or replaces an OpenAI-compatible provider (a model server on the remote's network).
        ProviderSet = "provider/set" (ProviderSetParams => Ack) { access: OWNER, mutates: true, safe_to_resend: true, run: Blocking }
        /// Removes a provider added with `provider/set`.
        ProviderDelete = "provider/delete" (ProviderRef => Deleted) { access: OWNER, mutates: true, safe_to_resend: true, run: Blocking }
        /// Runs a shell command in the session's workspace; its output joins the conversation (the model sees it with the next prompt) and the history.
        SessionBash = "session/bash" (SessionBashParams => SessionBashResult) { access: OPERATOR, mutates: true, safe_to_resend: false, run: Task, deadline_ms: SHELL_DEADLINE_SECONDS * 1000 }
        /// Aborts the session's running shell command; with none running it succeeds and changes nothing.
        SessionBashAbort = "session/bash_abort" (SessionRef => Ack) { access: OPERATOR, mutates: true, safe_to_resend: true, run: Task }
        /// A session's token, cost, message and tool-call totals, counted from its history (no agent needed); the context window in use when its agent runs.
        SessionStats = "session/stats" (SessionRef => SessionStatsResult) { access: OBSERVER, mutates: false, safe_to_resend: true, run: Task }
        /// The slash commands (prompt templates, skills, extension commands) of the session's agent; start one with turn/start and `/name args`.
        SessionCommands = "session/commands" (SessionRef => SessionCommandsResult) { access: OBSERVER, mutates: false, safe_to_resend: true, run: Task }
        /// The session exported by its agent as one self-contained HTML page, bounded by `maxBytes`.
        SessionExport = "session/export" (SessionExportParams => SessionExportResult) { access: OBSERVER, mutates: false, safe_to_resend: true, run: Task }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn names_are_unique_and_round_trip() {
        let mut seen = HashSet::new();
        for method in Method::ALL {
            assert!(seen.insert(method.as_str()));
            assert_eq!(Method::from_name(method.as_str()), Some(*method));
            assert!(!method.spec().summary().is_empty());
        }
    }

    #[test]
    fn only_hello_and_pair_are_open_to_pairing_connections() {
        let principal = crate::role::Principal::Pairing;
        let open: Vec<_> = Method::ALL
            .iter()
            .filter(|m| m.spec().access.check(m.as_str(), &principal).is_ok())
            .map(|m| m.as_str())
            .collect();
        assert_eq!(open, ["hello", "pair"]);
    }

    /// The columns a server acts on, each with the rows that differ from the rest.
    #[test]
    fn the_scheduling_columns_set_apart_exactly_the_methods_that_need_it() {
        let names = |keep: fn(&MethodSpec) -> bool| -> Vec<&str> {
            Method::ALL
                .iter()
                .map(|m| m.spec())
                .filter(|spec| keep(spec))
                .map(|spec| spec.name)
                .collect()
        };
        assert_eq!(names(|s| !s.pays_rate), ["hello"]);
        assert_eq!(names(|s| !s.holds_pass), ["device/revoke"]);
        assert_eq!(names(|s| s.deadline_ms.is_some()), ["session/bash"]);
        assert_eq!(
            Method::SessionBash.spec().deadline_ms,
            Some(crate::limits::SHELL_DEADLINE_SECONDS * 1000)
        );
        // A call on the connection's loop is one the connection serves itself, and only those.
        for method in Method::ALL {
            let spec = method.spec();
            let on_connection = matches!(spec.place, Place::Core | Place::Subscription);
            assert_eq!(spec.run == Run::Loop, on_connection, "{}", spec.name);
        }
    }

    #[test]
    fn reads_are_safe_to_resend() {
        for method in Method::ALL {
            let spec = method.spec();
            if !spec.mutates {
                assert!(
                    spec.safe_to_resend,
                    "{} reads but is not safe to resend",
                    spec.name
                );
            }
        }
    }
}
