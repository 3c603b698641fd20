// RACP-WS v1 TypeScript declarations.
// Generated from racp-proto by `cargo run -p racp-proto --bin racp-codegen`. Do not edit: a test fails when this file is stale.

/* eslint-disable */

export const PROTOCOL_VERSION = 1 as const;
export const SUBPROTOCOL = "racp.v1" as const;
export const BEARER_SUBPROTOCOL_PREFIX = "racp.bearer." as const;
export const ENDPOINT_PATH = "/racp" as const;

/**
 * A result with no fields yet: `{}`. Unlike [`Empty`] it tolerates fields a newer host adds.
 */
export type Ack = Record<string, unknown>;

/**
 * One slash command of the session's agent: run it with `turn/start` and the text
 * `/name arguments` (docs/protocol.md §7.29).
 */
export type AgentCommand = {
  description?: string | null;
  /**
   * Where it was loaded from: `user`, `project` or `temporary`; absent when pi does not say.
   */
  location?: string | null;
  /**
   * What follows the `/` (skills are `skill:<name>`).
   */
  name: string;
  /**
   * `extension`, `prompt` (a prompt template) or `skill`.
   */
  source: string;
};

/**
 * The runtime of a Node program.
 */
export type AgentRuntime = {
  /**
   * `node`.
   */
  name: string;
  /**
   * Its absolute path.
   */
  path: string;
  /**
   * What `node --version` printed, without the `v`, e.g. `20.20.2`; absent when it could
   * not be run.
   */
  version?: string | null;
};

export type AgentState = "ready" | "missing" | "incompatible";

/**
 * Whether the host can run its agent (docs/protocol.md §7.1, "The agent").
 */
export type AgentStatus = {
  /**
   * The agent's absolute path, when it was found.
   */
  path?: string | null;
  /**
   * Why the agent is missing or incompatible, and what to do about it; absent when ready.
   */
  problem?: string | null;
  /**
   * The Node.js runtime that runs it, when the agent is a Node program.
   */
  runtime?: AgentRuntime | null;
  state: AgentState;
  /**
   * What the agent's `--version` printed, e.g. `0.73.1`.
   */
  version?: string | null;
};

/**
 * Why an idle agent was stopped.
 */
export type AgentStopReason = "idle" | "capacity" | "sandbox";

/**
 * `session.agent_stopped`: the host stopped the session's idle agent; the next turn (or
 * subscription) starts it again, resuming its own session (docs/protocol.md §8.1).
 */
export type AgentStoppedData = {
  /**
   * How long the agent had been idle (ms).
   */
  idleMs: number;
  reason: AgentStopReason;
};

/**
 * The agent processes a host runs (docs/architecture.md, "Agent lifecycle").
 */
export type AgentsInfo = {
  /**
   * An agent with no turn and no subscriber for this long is stopped (ms).
   */
  idleStopMs: number;
  /**
   * Most agents that run at once.
   */
  max: number;
  /**
   * Their resident memory together, in bytes.
   */
  rssBytes: number;
  /**
   * Agents running now.
   */
  running: number;
};

/**
 * A text answer to a select, input or editor approval.
 */
export type Answer = {
  /**
   * With a permission's `deny`: a note the model receives with the refusal.
   */
  note?: string | null;
  value: string;
};

/**
 * A failure, always carrying a registered error code.
 */
export type AppError = {
  /**
   * A nested or transport-level code this error was mapped from.
   */
  causeCode?: string | null;
  code: ErrorCode;
  /**
   * Machine-readable specifics (e.g. `path` for INVALID_PARAMS, cursors for CURSOR_EXPIRED).
   */
  details?: unknown;
  /**
   * English text for people; clients switch on `code`, never on this.
   */
  message: string;
  /**
   * What the client should do next.
   */
  recovery: Recovery;
  /**
   * Whether this failure is transient. Whether the call may be *sent again* also depends on the
   * method: see `safeToResend` in the method table.
   */
  retriable: boolean;
  /**
   * How long to wait before retrying, when known.
   */
  retryAfterMs?: number | null;
  /**
   * Which component produced it.
   */
  source: ErrorSource;
  /**
   * Correlates the error with the host's log.
   */
  traceId?: string | null;
};

/**
 * A question the agent asked a person.
 */
export type ApprovalInfo = {
  approvalId: string;
  /**
   * Absolute deadline (ms since the Unix epoch); at it the host settles the approval as expired.
   */
  deadline: number;
  kind: ApprovalKind;
  message?: string | null;
  /**
   * The choices of a `select`.
   */
  options?: string[] | null;
  /**
   * What a `permission` approval asks about.
   */
  permission?: PermissionQuestion | null;
  sessionId: string;
  /**
   * The device whose answer settled it.
   */
  settledBy?: string | null;
  /**
   * That device's name, as it was paired (absent in approvals of older hosts).
   */
  settledByName?: string | null;
  state: ApprovalState;
  title: string;
  turnId: string;
  /**
   * The answer of a select, input or editor approval; a permission's choice.
   */
  value?: string | null;
};

/**
 * The kind of question an approval asks (the agent's confirm, select, input or editor request).
 */
export type ApprovalKind = "confirm" | "select" | "input" | "editor" | "permission";

/**
 * `approval.requested`: the agent asked a question; answer with `approval/respond`.
 */
export type ApprovalRequestedData = {
  approvalId: string;
  /**
   * Absolute deadline (ms since the Unix epoch).
   */
  deadline: number;
  kind: ApprovalKind;
  message?: string | null;
  options?: string[] | null;
  /**
   * What a `permission` approval asks about.
   */
  permission?: PermissionQuestion | null;
  title: string;
  turnId: string;
};

/**
 * Answers an approval. The first answer wins across devices.
 */
export type ApprovalRespondParams = {
  approvalId: string;
  decision: Decision;
};

/**
 * `approval/respond`: Answers an approval; the first answer wins, later ones get APPROVAL_STALE.
 */
export type ApprovalRespondRequest = {
  id: RequestId;
  method: "approval/respond";
  params: ApprovalRespondParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

export type ApprovalRespondResult = {
  approval: ApprovalInfo;
};

/**
 * `approval.settled`: an approval got its answer, expired, or was cancelled.
 */
export type ApprovalSettledData = {
  approvalId: string;
  /**
   * The device whose answer settled it; absent when it expired or was cancelled.
   */
  deviceId?: string | null;
  /**
   * Its name, as it was paired, when the event was recorded (at most 200 characters);
   * absent when `deviceId` is, and in events recorded by hosts older than the field.
   */
  deviceName?: string | null;
  /**
   * `allowed`, `denied`, `answered`, `expired` or `cancelled`.
   */
  outcome: ApprovalState;
  value?: string | null;
};

/**
 * Where an approval is in its life.
 */
export type ApprovalState = "pending" | "allowed" | "denied" | "answered" | "expired" | "cancelled";

/**
 * The role of a shell command's message, as pi names it.
 */
export type BashRole = "bashExecution";

/**
 * What happened to a path.
 */
export type ChangeKind = "created" | "modified" | "removed" | "renamed";

/**
 * Any frame a client sends: a request.
 */
export type ClientFrame = HelloRequest | SessionSubscribeRequest | SessionUnsubscribeRequest | PairRequest | HostListRequest | DeviceListRequest | DeviceRevokeRequest | PairingCreateRequest | HostInfoRequest | FsListRequest | FsStatRequest | FsReadRequest | WorkspaceStatusRequest | WorkspaceDiffRequest | SessionCreateRequest | SessionListRequest | SessionGetRequest | SessionStreamRequest | SessionHistoryRequest | SessionRenameRequest | SessionCloseRequest | TurnStartRequest | TurnSteerRequest | TurnAbortRequest | ApprovalRespondRequest | ModelListRequest | TurnFollowUpRequest | SessionClearQueueRequest | SessionCompactRequest | SessionConfigureRequest | SessionForkRequest | SessionCloneRequest | CredentialSetRequest | CredentialDeleteRequest | CredentialListRequest | ProviderSetRequest | ProviderDeleteRequest | SessionBashRequest | SessionBashAbortRequest | SessionStatsRequest | SessionCommandsRequest | SessionExportRequest;

/**
 * Who is calling.
 */
export type ClientInfo = {
  name: string;
  version: string;
};

/**
 * A failure of the whole connection; a WebSocket close follows.
 */
export type ConnectionError = {
  error: AppError;
};

/**
 * The messages in the model's context now and their usage, as pi's `get_session_stats`
 * counts them: after a compaction, its summary and the messages it kept, not the ones it
 * summarised (those stay in the session's totals).
 */
export type ContextStats = {
  assistantMessages: number;
  /**
   * The cost pi computed for the assistant messages in the context, in US dollars.
   */
  cost: number;
  tokens: TokenTotals;
  toolCalls: number;
  toolResults: number;
  /**
   * Every message in the context: the above, a compaction's summary, shell commands
   * (`bashExecution`), extensions' messages.
   */
  totalMessages: number;
  userMessages: number;
};

/**
 * pi's estimate of the context window in use.
 */
export type ContextUsage = {
  contextWindow: number;
  /**
   * `tokens` as a percentage of `contextWindow`.
   */
  percent?: number | null;
  /**
   * Tokens in the context; absent right after a compaction, until the next reply.
   */
  tokens?: number | null;
};

/**
 * `credential/delete`: Deletes a provider's API key set with `credential/set`.
 */
export type CredentialDeleteRequest = {
  id: RequestId;
  method: "credential/delete";
  params: ProviderRef;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * A stored credential, without its value.
 */
export type CredentialInfo = {
  /**
   * `sha256:` and the first 8 hex digits of the key's SHA-256: enough to tell two keys
   * apart, nothing to recover one from.
   */
  fingerprint: string;
  provider: string;
  /**
   * When it was set (ms since the Unix epoch).
   */
  setAt: number;
};

/**
 * `credential/list`: Lists the providers with a key set from a client: when, and a short fingerprint, never the key.
 */
export type CredentialListRequest = {
  id: RequestId;
  method: "credential/list";
  params?: Empty | null;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

export type CredentialListResult = {
  credentials: CredentialInfo[];
};

/**
 * Sets (or replaces) the API key of a provider. The key is write-only: no reply, event or log
 * ever carries it.
 */
export type CredentialSetParams = {
  /**
   * The provider's API key, as the provider issued it.
   */
  apiKey: string;
  provider: string;
};

/**
 * `credential/set`: Sets a provider's API key (write-only: never returned); the next agent started uses it.
 */
export type CredentialSetRequest = {
  id: RequestId;
  method: "credential/set";
  params: CredentialSetParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

export type CredentialSetResult = {
  credential: CredentialInfo;
};

/**
 * Where a provider's credential comes from.
 */
export type CredentialSource = "host" | "agent";

/**
 * An opaque position in a session's event log. Send back only cursors the host gave you.
 */
export type Cursor = string;

/**
 * A model of a custom provider. Unset numbers take pi's defaults (128 000 tokens of context,
 * 16 384 out).
 */
export type CustomModel = {
  contextWindow?: number | null;
  /**
   * The id the server knows it by (sent as the request's `model`).
   */
  id: string;
  /**
   * It takes images.
   */
  images?: boolean;
  maxTokens?: number | null;
  name?: string | null;
  /**
   * It reasons (`thinkingLevel` is sent as the request's `reasoning_effort`).
   */
  reasoning?: boolean;
};

/**
 * Who or what decided a tool call.
 */
export type DecidedBy = "mode" | "grant" | "person" | "deadline" | "denylist" | "cancelled";

/**
 * `"allow"`, `"deny"`, or `{"value": "..."}`.
 */
export type Decision = Verdict | Answer;

/**
 * Whether a delete found something to delete (deleting again is not an error).
 */
export type Deleted = {
  deleted: boolean;
};

/**
 * A paired device.
 */
export type DeviceInfo = {
  /**
   * When it was paired (ms since the Unix epoch).
   */
  createdAt: number;
  /**
   * True for the device making this call.
   */
  current: boolean;
  deviceId: string;
  /**
   * When it last opened a connection (ms since the Unix epoch).
   */
  lastSeenAt?: number | null;
  name: string;
  roles: Role[];
};

/**
 * `device/list`: Lists paired devices.
 */
export type DeviceListRequest = {
  id: RequestId;
  method: "device/list";
  params?: Empty | null;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

export type DeviceListResult = {
  devices: DeviceInfo[];
};

/**
 * Revokes a device: its credential stops working and its open connections close at once.
 */
export type DeviceRevokeParams = {
  deviceId: string;
};

/**
 * `device/revoke`: Revokes a device and closes its open connections at once.
 */
export type DeviceRevokeRequest = {
  id: RequestId;
  method: "device/revoke";
  params: DeviceRevokeParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * What the host cut from an event that did not fit the connection's frame bound. The event
 * keeps its `seq`, `cursor`, `type`, `at` and `turnId`; the largest strings of `data` are cut
 * to a prefix (or `data` becomes `null` when that is not enough).
 */
export type Elided = {
  /**
   * Size in bytes of the whole event as the host stores it.
   */
  bytes: number;
  /**
   * The values that were cut, at most 64.
   */
  cut: ElidedValue[];
  /**
   * Subscribing from this cursor on a connection whose frame bound holds `bytes` (plus
   * about 1 KiB for the push around it) delivers the event whole, while the host retains it.
   */
  from: Cursor;
  /**
   * The frame bound the event had to fit (the connection's `limits.maxFrameBytes`).
   */
  limit: number;
};

/**
 * One value the host cut from an event.
 */
export type ElidedValue = {
  /**
   * Size in bytes of the value as JSON before it was cut.
   */
  bytes: number;
  /**
   * For a string: how many of its characters were kept (a prefix). Absent when the value
   * was replaced by `null`.
   */
  kept?: number | null;
  /**
   * Where the value is in the event, e.g. `data.assistantMessageEvent.delta` (array items
   * by index: `data.message.content.0.text`).
   */
  path: string;
};

/**
 * No params, or no result fields: `{}`.
 */
export type Empty = Record<string, never>;

/**
 * What a directory entry is. Symlinks are reported as what they point to when the target is
 * inside the permitted roots, and as `symlink` otherwise.
 */
export type EntryKind = "file" | "dir" | "symlink" | "other";

/**
 * A registered error code. Only these can appear on the wire.
 */
export type ErrorCode = "PROTOCOL_MISMATCH" | "HOST_UNAVAILABLE" | "HOST_OVERLOADED" | "INTERNAL" | "INVALID_ARGUMENT" | "INVALID_PARAMS" | "UNAUTHORIZED" | "NOT_FOUND" | "SESSION_NOT_FOUND" | "CONFLICT" | "UNSUPPORTED" | "FORBIDDEN" | "METHOD_NOT_FOUND" | "IDEMPOTENCY_CONFLICT" | "CURSOR_EXPIRED" | "CLIENT_TOO_SLOW" | "APPROVAL_EXPIRED" | "APPROVAL_STALE" | "PAYLOAD_TOO_LARGE" | "TIMEOUT" | "HOST_SHUTTING_DOWN" | "RATE_LIMITED" | "LIMIT_EXCEEDED" | "AGENT_UNAVAILABLE" | "AGENT_BUSY" | "AGENT_SIDECAR_CRASHED" | "TURN_NOT_FOUND" | "TURN_ABORTED" | "HOST_DISCONNECTED" | "HOST_BOOTSTRAP_FAILED" | "HOST_VERSION_MISMATCH" | "REMOTE_AUTH_FAILED" | "REMOTE_CONNECTION_FAILED" | "REMOTE_FORWARD_FAILED" | "REMOTE_PATH_NOT_FOUND" | "REMOTE_PATH_FORBIDDEN" | "PAIRING_FAILED" | "PAIRING_TOKEN_EXPIRED" | "CAPABILITY_UNAVAILABLE" | "HOST_IDENTITY_MISMATCH" | "MODEL_NOT_CONFIGURED" | "PROVIDER_ERROR" | "PROVIDER_UNAUTHORIZED" | "PROVIDER_RATE_LIMITED" | "CONTEXT_TOO_LARGE" | "STREAM_FAILED" | "NETWORK_ERROR" | "EMPTY_MODEL_RESPONSE" | "AGENT_SIDECAR_OOM" | "PROVIDER_TIMEOUT" | "PROVIDER_MODEL_NOT_FOUND" | "PROVIDER_SECRET_MISSING" | "HELLO_REQUIRED" | "TOOL_DENIED" | "WORKSPACE_PATH_DENIED" | "PATH_OUTSIDE_WORKSPACE" | "WRITE_DISABLED_IN_PLAN" | "EDIT_DISABLED_IN_PLAN" | "TOOL_DISABLED_IN_PLAN" | "READ_PATH_IS_DIRECTORY" | "WORKSPACE_NOT_A_REPOSITORY" | "GIT_UNAVAILABLE";

/**
 * A failed reply. `id` is `null` when the request could not be read far enough to find it.
 */
export type ErrorReply = {
  error: AppError;
  id: RequestId | null;
};

/**
 * Which component produced an error.
 */
export type ErrorSource = "host" | "agent" | "client" | "bootstrap";

/**
 * One entry of a session's event log.
 */
export type Event = {
  /**
   * When the host recorded it (ms since the Unix epoch).
   */
  at: number;
  /**
   * The position just after this event: resuming from it delivers the next event.
   */
  cursor: Cursor;
  /**
   * Type-specific payload; for `agent.*` events, the agent's own payload. Kept as the JSON
   * text the host sent, so its numbers arrive exactly as written (docs/protocol.md §1).
   */
  data: unknown;
  /**
   * Present only when the event as stored does not fit the connection's frame bound: the
   * host cut large values out of it (see [`Elided`]). Absent on every event that is whole.
   */
  elided?: Elided | null;
  /**
   * Strictly increasing within a session's epoch, starting at 1, with no gaps.
   */
  seq: number;
  /**
   * The turn it belongs to, if any.
   */
  turnId?: string | null;
  /**
   * A type of the host event table (`turn.started`, `approval.requested`, ...; each
   * type's `data` is in `x-racp-events` and `RacpEventData`), or `agent.<pi event type>`
   * (see [`EventType`]).
   */
  type: string;
};

/**
 * A file a turn's tools wrote, edited or deleted (in `turn.finished`'s `files`).
 */
export type FileChange = {
  /**
   * Lines added, when known: exact from the agent's edit tool's diff and for a file a
   * write created; for a write over an existing file the lines it wrote.
   */
  added?: number | null;
  /**
   * Which tools changed it: `write`, `edit`, or `disk` when only the workspace's watcher
   * saw it (a shell command, a tool the host does not read).
   */
  by: string[];
  kind: ChangeKind;
  /**
   * Relative to the workspace (`/`-separated); absolute when outside it.
   */
  path: string;
  /**
   * Lines removed, when known (exact from the edit tool's diff; 0 for a created file).
   */
  removed?: number | null;
};

/**
 * One directory entry.
 */
export type FsEntry = {
  kind: EntryKind;
  /**
   * Last modification (ms since the Unix epoch).
   */
  modifiedAt?: number | null;
  name: string;
  /**
   * Size in bytes, for files.
   */
  size?: number | null;
};

/**
 * `fs/list`: Lists a directory inside the host's permitted roots.
 */
export type FsListRequest = {
  id: RequestId;
  method: "fs/list";
  params: PathParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * A directory's entries, sorted by name.
 */
export type FsListResult = {
  entries: FsEntry[];
  /**
   * The canonical path that was listed.
   */
  path: string;
  /**
   * True when the listing was cut at the host's entry bound.
   */
  truncated?: boolean;
};

/**
 * `fs/read`'s params: a page of a file from `offset`, at most `length` bytes.
 */
export type FsReadParams = {
  /**
   * `base64` to have a binary page's bytes too (a text page is UTF-8 unless this asks
   * otherwise); absent: text as UTF-8, a binary page flagged without its bytes.
   */
  encoding?: ReadEncoding | null;
  /**
   * Most bytes to read: 1 to 524 288 (262 144 when absent).
   */
  length?: number | null;
  /**
   * The first byte to read (0 when absent).
   */
  offset?: number | null;
  path: string;
};

/**
 * `fs/read`: Reads a page of a file inside the host's permitted roots: text, or binary flagged (its bytes in base64 when asked), with the file's size, time and SHA-256.
 */
export type FsReadRequest = {
  id: RequestId;
  method: "fs/read";
  params: FsReadParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * A page of a file, and what a client needs to cache it.
 */
export type FsReadResult = {
  /**
   * True when the page is not UTF-8 text (it holds a NUL byte or invalid UTF-8).
   */
  binary: boolean;
  data?: string | null;
  /**
   * How `data` is written; absent with `data` for a binary page not asked as `base64`.
   */
  encoding?: ReadEncoding | null;
  /**
   * True when the page reaches the end of the file; else read on from `offset + length`.
   */
  eof: boolean;
  /**
   * The page's length in bytes (a text page ends on a whole character, so it may be a few
   * bytes shorter than asked).
   */
  length: number;
  /**
   * Last modification (ms since the Unix epoch).
   */
  modifiedAt?: number | null;
  /**
   * Where the page starts.
   */
  offset: number;
  /**
   * The canonical path that was read.
   */
  path: string;
  /**
   * SHA-256 of the whole file, as 64 lowercase hex digits: unchanged means unchanged.
   */
  sha256: string;
  /**
   * The whole file's size in bytes.
   */
  size: number;
};

/**
 * `fs/stat`: Describes one path inside the host's permitted roots.
 */
export type FsStatRequest = {
  id: RequestId;
  method: "fs/stat";
  params: PathParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * One path's metadata.
 */
export type FsStatResult = {
  kind: EntryKind;
  modifiedAt?: number | null;
  /**
   * The canonical path.
   */
  path: string;
  size?: number | null;
};

/**
 * What a session grant allows.
 */
export type GrantScope = "command-prefix" | "directory" | "tool";

/**
 * `heartbeat`: liveness, with each subscription's cursor.
 */
export type HeartbeatParams = {
  /**
   * Host time (ms since the Unix epoch).
   */
  at: number;
  subscriptions: SubscriptionHead[];
};

/**
 * `heartbeat`: Sent every `heartbeatMs`: liveness, and the head cursor of every subscription.
 */
export type HeartbeatPush = {
  method: "heartbeat";
  params: HeartbeatParams;
};

/**
 * First call on every connection.
 */
export type HelloParams = {
  client: ClientInfo;
  /**
   * Most events the client wants in one `session/events` push (a client that buffers N
   * events asks for N/2 or fewer, so one push never fills its buffer); the host answers with
   * `min(this, its own bound)` in `limits.maxEventsPerPush`.
   */
  maxEventsPerPush?: number | null;
  /**
   * Largest frame the client wants to send or receive; the host answers with
   * `min(this, its own bound)`.
   */
  maxFrameBytes?: number | null;
  /**
   * Protocol versions the client speaks.
   */
  protocol: ProtocolRange;
};

/**
 * `hello`: Negotiates the protocol version and frame bound; must be the first call on a connection.
 */
export type HelloRequest = {
  id: RequestId;
  method: "hello";
  params: HelloParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * The host's answer to `hello`.
 */
export type HelloResult = {
  /**
   * Optional features this host has on, e.g. `sessions`, `approvals`, `fs`. A call that needs
   * one that is absent gets CAPABILITY_UNAVAILABLE.
   */
  capabilities: string[];
  /**
   * The host sends a `heartbeat` push at this interval; a client that hears nothing for two
   * intervals should treat the link as dead.
   */
  heartbeatMs: number;
  host: HostIdentity;
  limits: Limits;
  principal: PrincipalInfo;
  /**
   * The protocol version chosen for this connection.
   */
  protocol: number;
};

/**
 * Entries of a session's history, oldest first: each is the event that carried a message
 * whole or a compaction's summary (`agent.message_end`, `agent.compaction_end`), exactly as
 * it was delivered live, with its seq and cursor.
 */
export type HistoryPage = {
  /**
   * Present when older entries exist: pass it as `upTo` to `session/history` for the page
   * before this one. Absent: the page reaches the start of the conversation.
   */
  earlier?: Cursor | null;
  entries: Event[];
  /**
   * True when the host's history policy dropped entries older than any it still holds
   * (docs/protocol.md §7.24, "Bounds").
   */
  truncated?: boolean;
};

/**
 * One host behind a gateway (docs/protocol.md §15).
 */
export type HostEntry = {
  host: HostIdentity;
  hostname: string;
  /**
   * When the gateway last heard from the host (ms since the Unix epoch, by the NATS
   * server's clock); absent for a host enrolled but never seen.
   */
  lastSeenAt?: number | null;
  /**
   * Where a device connects to reach this host through the gateway, e.g. `/racp/hosts/host_…`.
   */
  path: string;
  /**
   * Sessions the host had at its last heartbeat.
   */
  sessions: number;
  status: HostStatus;
};

/**
 * Any frame a host sends.
 */
export type HostFrame = ResultReply | ErrorReply | HostPush | ConnectionError;

/**
 * The host's identity.
 */
export type HostIdentity = {
  /**
   * Stable id of this host's data directory.
   */
  id: string;
  /**
   * pi-host's version, e.g. `0.1.0`.
   */
  version: string;
};

/**
 * `host/info`: Describes the host: version, id, platform, capabilities and limits.
 */
export type HostInfoRequest = {
  id: RequestId;
  method: "host/info";
  params?: Empty | null;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * Facts about the host.
 */
export type HostInfoResult = {
  /**
   * The agent program the host runs for its sessions, as last checked.
   */
  agent: AgentStatus;
  /**
   * The sessions' agent processes.
   */
  agents: AgentsInfo;
  /**
   * CPU architecture, e.g. `x86_64`.
   */
  arch: string;
  capabilities: string[];
  host: HostIdentity;
  /**
   * The machine's host name.
   */
  hostname: string;
  limits: Limits;
  /**
   * Operating system, e.g. `linux`.
   */
  os: string;
  /**
   * The kernel sandbox the agents run in, or why they run without one (docs/reliability.md
   * §4.19). Absent from a host older than the sandbox.
   */
  sandbox?: SandboxInfo | null;
  /**
   * When this host process started (ms since the Unix epoch).
   */
  startedAt: number;
};

/**
 * `host/list`: Lists hosts behind a gateway; a plain pi-host answers METHOD_NOT_FOUND.
 */
export type HostListRequest = {
  id: RequestId;
  method: "host/list";
  params?: Empty | null;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * Hosts reachable through a gateway, those the calling device may reach. A plain pi-host has
 * no gateway and answers METHOD_NOT_FOUND.
 */
export type HostListResult = {
  hosts: HostEntry[];
};

/**
 * Any push a host sends.
 */
export type HostPush = SessionEventsPush | HeartbeatPush | SubscriptionEndedPush;

export type HostStatus = "online" | "offline";

/**
 * An image sent with a prompt, as pi takes it (`ImageContent`).
 */
export type ImageAttachment = {
  /**
   * The image's bytes in base64 (standard alphabet, padded).
   */
  data: string;
  /**
   * `image/png`, `image/jpeg`, `image/gif` or `image/webp`.
   */
  mimeType: string;
};

/**
 * An image a prompt carried, as the log and the snapshot name it.
 */
export type ImageInfo = {
  /**
   * Its size, decoded.
   */
  bytes: number;
  mimeType: string;
};

/**
 * Bounds the host enforces on this connection.
 */
export type Limits = {
  /**
   * Most events in one `session/events` push on this connection.
   */
  maxEventsPerPush: number;
  /**
   * Largest frame either side may send, in bytes (PAYLOAD_TOO_LARGE beyond it).
   */
  maxFrameBytes: number;
  /**
   * Calls this connection may have in flight at once (HOST_OVERLOADED beyond it).
   */
  maxInFlight: number;
  /**
   * Subscriptions this connection may hold (LIMIT_EXCEEDED beyond it).
   */
  maxSubscriptions: number;
  /**
   * Calls a device may make in a burst above the sustained rate.
   */
  requestBurst: number;
  /**
   * Sustained calls per second per device (RATE_LIMITED beyond it).
   */
  requestsPerSecond: number;
};

/**
 * One model the host's agent knows.
 */
export type ModelInfo = {
  /**
   * Tokens of context the model takes.
   */
  contextWindow: number;
  /**
   * A credential for its provider is present (set from a desktop, or in the remote user's
   * own pi configuration or environment): a turn on it can reach the provider.
   */
  credential: boolean;
  id: string;
  /**
   * It takes images with a prompt.
   */
  images: boolean;
  /**
   * Most tokens it writes in one reply.
   */
  maxTokens: number;
  /**
   * A name for people.
   */
  name: string;
  provider: string;
  /**
   * It can think before answering (`thinkingLevel` applies).
   */
  reasoning: boolean;
};

/**
 * `model/list`: Lists the providers and models the host's agent can run, each with whether a credential is present; needs no session.
 */
export type ModelListRequest = {
  id: RequestId;
  method: "model/list";
  params?: Empty | null;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

export type ModelListResult = {
  /**
   * The model a session without a `model` of its own runs on (pi's default), when there is
   * one.
   */
  defaultModel?: ModelRef | null;
  /**
   * Every model the agent knows, by provider then id.
   */
  models: ModelInfo[];
  providers: ProviderInfo[];
};

/**
 * A model by its provider and the provider's own model id, as pi names it
 * (`provider/id` on pi's command line).
 */
export type ModelRef = {
  /**
   * The provider's model id, e.g. `claude-sonnet-4-5`.
   */
  id: string;
  /**
   * The provider, e.g. `anthropic`, `openai`, or one added with `provider/set`.
   */
  provider: string;
};

/**
 * Exchanges the connection's pairing token for a device credential.
 */
export type PairParams = {
  /**
   * A name for the device, shown in `device/list`; no control characters.
   */
  deviceName: string;
};

/**
 * `pair`: Exchanges the connection's pairing token for a device credential (pairing connections only).
 */
export type PairRequest = {
  id: RequestId;
  method: "pair";
  params: PairParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * The new device credential. `deviceToken` is shown once; the host keeps only its digest.
 */
export type PairResult = {
  deviceId: string;
  /**
   * Secret bearer token for `Authorization: Bearer` on later upgrades.
   */
  deviceToken: string;
  roles: Role[];
};

/**
 * Mints a single-use pairing token.
 */
export type PairingCreateParams = {
  /**
   * Through a gateway: the hosts the paired device may reach, each one the caller reaches
   * itself (when absent: the caller's own reach). A plain pi-host is one host and refuses
   * the field.
   */
  hosts?: string[] | null;
  /**
   * Roles the paired device will hold.
   */
  roles: Role[];
  /**
   * Lifetime of the token; 600 when absent.
   */
  ttlSeconds?: number | null;
};

/**
 * `pairing/create`: Mints a single-use pairing token for another device.
 */
export type PairingCreateRequest = {
  id: RequestId;
  method: "pairing/create";
  params: PairingCreateParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * A pairing token. It is secret: show it to the person pairing, never log it.
 */
export type PairingCreateResult = {
  /**
   * The SHA-256 of the host's TLS certificate (64 lowercase hex digits), which the new
   * device pins; absent when the host serves plain WebSocket (`--plain`).
   */
  certSha256?: string | null;
  /**
   * When the token stops working (ms since the Unix epoch).
   */
  expiresAt: number;
  roles: Role[];
  token: string;
  /**
   * A pairing link carrying the host address and the token (in the fragment, which is
   * never sent to a server): `racps://HOST:PORT/pair?cert=sha256:<hex>#<token>`, or
   * `racp://HOST:PORT/pair#<token>` for a host serving plain WebSocket.
   */
  url: string;
};

/**
 * One path that changed, relative to the workspace (`/`-separated).
 */
export type PathChange = {
  /**
   * True for a directory.
   */
  dir?: boolean;
  /**
   * For `renamed`: where it was, when that was inside the watched tree.
   */
  from?: string | null;
  kind: ChangeKind;
  path: string;
};

/**
 * A path on the host. Relative paths are refused; `~` is not expanded.
 */
export type PathParams = {
  path: string;
};

/**
 * An answer a `permission` approval takes.
 */
export type PermissionChoice = "allow" | "always" | "deny";

/**
 * `permission.decided`: the policy's decision on one tool call, before it runs.
 */
export type PermissionDecidedData = {
  allowed: boolean;
  /**
   * The approval a person answered, when one asked.
   */
  approvalId?: string | null;
  by: DecidedBy;
  /**
   * The refusal's code (absent when allowed), as the model receives it in the tool result.
   */
  code?: ErrorCode | null;
  /**
   * The device whose answer decided it.
   */
  deviceId?: string | null;
  /**
   * Its name, as it was paired, when the event was recorded (at most 200 characters);
   * absent when `deviceId` is, and in events recorded by hosts older than the field.
   */
  deviceName?: string | null;
  /**
   * The grant the answer "always" gave.
   */
  grant?: PermissionGrant | null;
  /**
   * The session's mode when it was decided.
   */
  mode: PermissionMode;
  /**
   * Why, in words (the model receives it with the code).
   */
  reason: string;
  summary: ToolSummary;
  tool: string;
  toolCallId: string;
};

/**
 * A grant given with "always" (allow for this session): it lasts until the session ends or
 * `session/configure` clears it, across host restarts. It never lifts the denylist.
 */
export type PermissionGrant = {
  scope: GrantScope;
  /**
   * The tool it allows.
   */
  tool: string;
  /**
   * The command's leading words, the directory, or the tool's name.
   */
  value: string;
};

/**
 * What a session's agent may do without asking.
 */
export type PermissionMode = "ask" | "accept-edits" | "auto" | "plan";

/**
 * The question of a `permission` approval, typed so that a client renders it without parsing
 * text.
 */
export type PermissionQuestion = {
  /**
   * The answers it takes.
   */
  choices: PermissionChoice[];
  /**
   * The code the model receives when the answer is no (or none comes before the deadline).
   */
  code: ErrorCode;
  /**
   * What "always" would grant for the rest of the session; absent when it cannot be offered.
   */
  grant?: PermissionGrant | null;
  /**
   * The rule that asked.
   */
  rule: PermissionRule;
  summary: ToolSummary;
  /**
   * The tool the agent wants to run (`bash`, `write`, `edit`, `read`, or an extension's).
   */
  tool: string;
  /**
   * pi's id of the tool call.
   */
  toolCallId: string;
};

/**
 * Why the policy asked rather than decided.
 */
export type PermissionRule = "mode" | "outside-workspace" | "unknown-tool";

/**
 * Who the host thinks is calling.
 */
export type PrincipalInfo = {
  /**
   * The device's id; `null` on a pairing connection.
   */
  deviceId?: string | null;
  kind: PrincipalKind;
  /**
   * The device's roles; empty on a pairing connection.
   */
  roles: Role[];
};

/**
 * What kind of credential opened the connection.
 */
export type PrincipalKind = "device" | "pairing";

/**
 * An inclusive range of protocol versions.
 */
export type ProtocolRange = {
  max: number;
  min: number;
};

/**
 * The wire API a custom provider speaks.
 */
export type ProviderApi = "openai-completions" | "openai-responses";

/**
 * `provider/delete`: Removes a provider added with `provider/set`.
 */
export type ProviderDeleteRequest = {
  id: RequestId;
  method: "provider/delete";
  params: ProviderRef;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * A provider the host's agent knows.
 */
export type ProviderInfo = {
  /**
   * A credential is present (see [`ModelInfo::credential`]).
   */
  credential: boolean;
  /**
   * Where it comes from: `host` (set with `credential/set`, which wins) or `agent` (the
   * remote user's own pi configuration or environment). Absent when there is none.
   */
  credentialSource?: CredentialSource | null;
  /**
   * Added by an owner with `provider/set`.
   */
  custom: boolean;
  provider: string;
};

/**
 * Names one provider.
 */
export type ProviderRef = {
  provider: string;
};

/**
 * Adds (or replaces) an OpenAI-compatible provider: a model server on the remote's network.
 * It is registered in the agent's model registry at the next agent start, before the remote
 * user's own configuration of a provider with the same name.
 */
export type ProviderSetParams = {
  api: ProviderApi;
  /**
   * The API's base URL as the agent reaches it, e.g. `http://127.0.0.1:8080/v1`
   * (`http` or `https`; no credentials in it: set a key with `credential/set`).
   */
  baseUrl: string;
  /**
   * The models it serves, at least one.
   */
  models: CustomModel[];
  provider: string;
  /**
   * Whether its server wants an API key (`credential/set`). Without one the agent sends a
   * placeholder, which servers run without keys ignore. Default false.
   */
  requiresKey?: boolean;
};

/**
 * `provider/set`: Adds or replaces an OpenAI-compatible provider (a model server on the remote's network).
 */
export type ProviderSetRequest = {
  id: RequestId;
  method: "provider/set";
  params: ProviderSetParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * What waits to run while a turn works: the steering messages the agent holds (pi's
 * `queue_update`) and the follow-ups the host holds (docs/protocol.md §7.25), each in the
 * order it will be delivered.
 */
export type Queue = {
  /**
   * Follow-ups (`turn/follow_up`): each runs as a turn of its own when the turn before it
   * completes; `session/clear_queue` withdraws them.
   */
  followUps?: QueuedFollowUp[];
  /**
   * Steering messages (`turn/steer`): delivered before the agent's next model request.
   */
  steering?: string[];
};

/**
 * How pi delivers the messages queued while it works (`set_steering_mode`,
 * `set_follow_up_mode`): every queued message at once, or one per step (pi's default).
 */
export type QueueMode = "all" | "one-at-a-time";

/**
 * A follow-up waiting for its turn: its `turnId` has no `turn.started` yet.
 */
export type QueuedFollowUp = {
  /**
   * The device that queued it.
   */
  deviceId?: string | null;
  /**
   * Its name, as it was paired.
   */
  deviceName?: string | null;
  /**
   * The images sent with it, named only.
   */
  images?: ImageInfo[];
  text: string;
  turnId: string;
};

/**
 * How a page of a file is written in `fs/read`'s `data`.
 */
export type ReadEncoding = "utf8" | "base64";

/**
 * What a client should do next when it meets a code.
 */
export type Recovery = "retry" | "retry_after" | "reconnect_and_resume" | "resnapshot" | "fix_arguments" | "reauthorize" | "check_state" | "upgrade" | "stop_and_report";

/**
 * Chosen by the client, echoed in the reply.
 */
export type RequestId = number | string;

/**
 * A successful reply; `result` has the type of the request's method (see x-racp-methods). Clients ignore result fields they do not know.
 */
export type ResultReply = {
  id: RequestId;
  result: Record<string, unknown>;
};

/**
 * A device's role. Ordered: `owner` can do everything `operator` can, which can do everything
 * `observer` can.
 */
export type Role = "observer" | "operator" | "owner";

/**
 * The agents' sandbox as the host applies it.
 */
export type SandboxInfo = {
  /**
   * The kernel's Landlock ABI version, with `kind: landlock`.
   */
  abi?: number | null;
  /**
   * `landlock` while the agents run in one; `none` otherwise.
   */
  kind: string;
  /**
   * The owner's mode: `workspace-write`, `read-only` or `off`.
   */
  mode: string;
  /**
   * Why there is none although the mode asks for one (an old kernel, Landlock not
   * enabled), or that the owner switched it off.
   */
  unavailable?: string | null;
};

/**
 * `session/bash_abort`: Aborts the session's running shell command; with none running it succeeds and changes nothing.
 */
export type SessionBashAbortRequest = {
  id: RequestId;
  method: "session/bash_abort";
  params: SessionRef;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * `session.bash`: a shell command ran in the session (`session/bash`). `data` is pi's
 * `bashExecution` message, the shape pi keeps it in its session and shows it in the
 * conversation, with the device that ran it.
 */
export type SessionBashData = {
  cancelled: boolean;
  command: string;
  /**
   * The device that ran it.
   */
  deviceId?: string | null;
  /**
   * Its name, as it was paired, when the event was recorded (at most 200 characters);
   * absent when `deviceId` is, and in events recorded by hosts older than the field.
   */
  deviceName?: string | null;
  /**
   * Absent when it did not exit by itself (cancelled, killed by a signal).
   */
  exitCode?: number | null;
  /**
   * Stdout and stderr together; only the end when `truncated` (at most 64 KiB).
   */
  output: string;
  /**
   * Always `bashExecution`.
   */
  role: BashRole;
  /**
   * When it ended (ms since the Unix epoch).
   */
  timestamp: number;
  truncated: boolean;
};

/**
 * Runs a shell command in a session's workspace, as pi's `!command` does locally: its output
 * joins the conversation (the model sees it with the next prompt) and the session's history
 * (`session.bash`, docs/protocol.md §7.27).
 */
export type SessionBashParams = {
  /**
   * The command line, run by the host user's shell in the workspace.
   */
  command: string;
  sessionId: string;
};

/**
 * `session/bash`: Runs a shell command in the session's workspace; its output joins the conversation (the model sees it with the next prompt) and the history.
 */
export type SessionBashRequest = {
  id: RequestId;
  method: "session/bash";
  params: SessionBashParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * How a shell command ended (pi's `BashResult`, without the path of its full output).
 */
export type SessionBashResult = {
  /**
   * Aborted (`session/bash_abort`, or the host's deadline).
   */
  cancelled: boolean;
  /**
   * Absent when it did not exit by itself (cancelled, killed by a signal).
   */
  exitCode?: number | null;
  /**
   * Its output (stdout and stderr together), the end of it when `truncated`.
   */
  output: string;
  /**
   * `output` is only the end of what the command wrote.
   */
  truncated: boolean;
};

/**
 * Withdraws queued follow-ups before they run: the one named, or all of them.
 */
export type SessionClearQueueParams = {
  sessionId: string;
  /**
   * The follow-up's turn to withdraw; absent, every queued follow-up.
   */
  turnId?: string | null;
};

/**
 * `session/clear_queue`: Withdraws queued follow-ups before they run (one, or all); a resend withdraws nothing more.
 */
export type SessionClearQueueRequest = {
  id: RequestId;
  method: "session/clear_queue";
  params: SessionClearQueueParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * The follow-ups withdrawn now, in queue order (their text, to put back where it was typed);
 * empty when none waited (a resend).
 */
export type SessionClearQueueResult = {
  withdrawn: QueuedFollowUp[];
};

/**
 * Makes a new session holding a session's whole conversation (docs/protocol.md §7.32).
 */
export type SessionCloneParams = {
  sessionId: string;
  /**
   * The new session's title; no control characters.
   */
  title?: string | null;
};

/**
 * `session/clone`: Makes a new session holding a session's whole conversation; refused while a turn runs.
 */
export type SessionCloneRequest = {
  id: RequestId;
  method: "session/clone";
  params: SessionCloneParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * `session/close`: Closes a session: its agent stops; its log stays readable. Closing a closed session succeeds.
 */
export type SessionCloseRequest = {
  id: RequestId;
  method: "session/close";
  params: SessionRef;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * `session.closed`: the session was closed; no more events follow.
 */
export type SessionClosedData = {
  /**
   * The device that closed it; absent when the host did.
   */
  deviceId?: string | null;
  /**
   * Its name, as it was paired, when the event was recorded (at most 200 characters);
   * absent when `deviceId` is, and in events recorded by hosts older than the field.
   */
  deviceName?: string | null;
};

/**
 * `session/commands`: The slash commands (prompt templates, skills, extension commands) of the session's agent; start one with turn/start and `/name args`.
 */
export type SessionCommandsRequest = {
  id: RequestId;
  method: "session/commands";
  params: SessionRef;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * The commands a prompt may start with `/name` in a session's workspace.
 */
export type SessionCommandsResult = {
  commands: AgentCommand[];
};

/**
 * Compacts a session's conversation: the agent summarises it and keeps only the summary and
 * its most recent messages.
 */
export type SessionCompactParams = {
  /**
   * What the summary should focus on (pi's `customInstructions`).
   */
  instructions?: string | null;
  sessionId: string;
};

/**
 * `session/compact`: Compacts a session's conversation: the agent replaces its older messages with a summary; refused while a turn runs.
 */
export type SessionCompactRequest = {
  id: RequestId;
  method: "session/compact";
  params: SessionCompactParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * pi's compaction result.
 */
export type SessionCompactResult = {
  /**
   * pi's details (the files read and modified), as pi gives them.
   */
  details?: unknown;
  /**
   * pi's id of the oldest message kept after the summary.
   */
  firstKeptEntryId: string;
  /**
   * The summary that replaces the older messages.
   */
  summary: string;
  /**
   * The context's size before, in tokens (pi's estimate).
   */
  tokensBefore: number;
};

/**
 * Changes what a session runs with. Each field given replaces the session's (none given
 * changes nothing and returns the session); the running
 * agent takes it at once (a running turn from its next model request), and every later
 * agent of the session starts with it.
 */
export type SessionConfigureParams = {
  autoCompaction?: boolean | null;
  /**
   * Withdraws every grant given with "always" in this session.
   */
  clearGrants?: boolean;
  /**
   * pi's `set_follow_up_mode`.
   */
  followUpMode?: QueueMode | null;
  model?: ModelRef | null;
  /**
   * The permission mode (docs/protocol.md, "Permissions"), from the agent's next tool call.
   */
  permissionMode?: PermissionMode | null;
  sessionId: string;
  /**
   * pi's `set_steering_mode`.
   */
  steeringMode?: QueueMode | null;
  thinkingLevel?: ThinkingLevel | null;
};

/**
 * `session/configure`: Changes a session's model, thinking level, auto-compaction or queue modes; setting the same values again changes nothing.
 */
export type SessionConfigureRequest = {
  id: RequestId;
  method: "session/configure";
  params: SessionConfigureParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * `session.configured`: the session's model, thinking level or auto-compaction changed
 * (`session/configure`); `settings` is what it runs with from now on.
 */
export type SessionConfiguredData = {
  /**
   * The device that changed them.
   */
  deviceId?: string | null;
  /**
   * Its name, as it was paired, when the event was recorded (at most 200 characters);
   * absent when `deviceId` is, and in events recorded by hosts older than the field.
   */
  deviceName?: string | null;
  /**
   * The session's permission grants were withdrawn (`clearGrants`).
   */
  grantsCleared?: boolean;
  settings: SessionSettings;
};

export type SessionCreateParams = {
  /**
   * The model to run on; absent: the agent's default. One the agent does not know is
   * MODEL_NOT_CONFIGURED, one whose provider has no credential PROVIDER_SECRET_MISSING.
   */
  model?: ModelRef | null;
  /**
   * What the agent may do without asking (docs/protocol.md, "Permissions"); absent: the
   * host's default.
   */
  permissionMode?: PermissionMode | null;
  thinkingLevel?: ThinkingLevel | null;
  /**
   * A title shown in session lists; no control characters.
   */
  title?: string | null;
  /**
   * Absolute path of the workspace directory, or `~` / `~/...` for the host user's home
   * (resolved on the host); it must lie inside the host's permitted roots.
   */
  workspace: string;
};

/**
 * `session/create`: Creates a session in a workspace directory.
 */
export type SessionCreateRequest = {
  id: RequestId;
  method: "session/create";
  params: SessionCreateParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

export type SessionCreateResult = {
  session: SessionInfo;
};

/**
 * `session/events`: one or more events for one subscription.
 */
export type SessionEventsParams = {
  /**
   * In `seq` order, continuing exactly after the previous push of this subscription.
   */
  events: Event[];
  sessionId: string;
  subscriptionId: string;
};

/**
 * `session/events`: Events of one subscription, in order; several when the subscriber is behind.
 */
export type SessionEventsPush = {
  method: "session/events";
  params: SessionEventsParams;
};

/**
 * Asks for a session exported as one HTML page.
 */
export type SessionExportParams = {
  /**
   * Most bytes of HTML to return (768 KiB when absent); a larger export is
   * PAYLOAD_TOO_LARGE. Ask for more only on a connection whose frame bound holds it.
   */
  maxBytes?: number | null;
  sessionId: string;
};

/**
 * `session/export`: The session exported by its agent as one self-contained HTML page, bounded by `maxBytes`.
 */
export type SessionExportRequest = {
  id: RequestId;
  method: "session/export";
  params: SessionExportParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * The session as pi's HTML export: one self-contained page.
 */
export type SessionExportResult = {
  /**
   * The page's size in bytes (UTF-8).
   */
  bytes: number;
  html: string;
};

/**
 * Makes a new session from an earlier point of a session's conversation: everything before one
 * of its user messages (docs/protocol.md §7.31).
 */
export type SessionForkParams = {
  /**
   * The cursor of one of its history entries that is a user message (`agent.message_end`
   * with `data.message.role` `user`): the new session holds what came before it.
   */
  from: Cursor;
  /**
   * The session to fork.
   */
  sessionId: string;
  /**
   * The new session's title; no control characters.
   */
  title?: string | null;
};

/**
 * `session/fork`: Makes a new session from a session's conversation before one of its user messages, and answers that message's text; refused while a turn runs.
 */
export type SessionForkRequest = {
  id: RequestId;
  method: "session/fork";
  params: SessionForkParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * The forked session, and the text of the message it was forked at (to edit and send again).
 */
export type SessionForkResult = {
  session: SessionInfo;
  /**
   * The user message's text (pi's `fork` answer; images left out).
   */
  text: string;
};

/**
 * `session.forked`: the first event of a session made by `session/fork` or `session/clone`;
 * the conversation it starts with follows, as this session's own history entries
 * (docs/protocol.md §7.31, §7.32).
 */
export type SessionForkedData = {
  /**
   * The device that made it.
   */
  deviceId?: string | null;
  /**
   * Its name, as it was paired, when the event was recorded (at most 200 characters);
   * absent when `deviceId` is, and in events recorded by hosts older than the field.
   */
  deviceName?: string | null;
  /**
   * The history entry of that session it was forked at (a user message, which it does not
   * hold); absent for a clone, which holds the whole conversation.
   */
  from?: Cursor | null;
  /**
   * The session it was made from.
   */
  fromSessionId: string;
};

/**
 * `session/get`: Returns a session with a snapshot and the cursor the snapshot was taken at.
 */
export type SessionGetRequest = {
  id: RequestId;
  method: "session/get";
  params: SessionRef;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * A session, its snapshot, and the cursor the snapshot was taken at: subscribing from that
 * cursor continues exactly where the snapshot ends.
 */
export type SessionGetResult = {
  cursor: Cursor;
  session: SessionInfo;
  snapshot: Snapshot;
};

/**
 * Asks for a page of a session's history.
 */
export type SessionHistoryParams = {
  /**
   * Most entries in the page; 100 when absent.
   */
  limit?: number | null;
  /**
   * Most bytes of entries in the page (256 KiB when absent); one entry larger than this
   * comes alone, cut to fit (docs/protocol.md §8.6).
   */
  maxBytes?: number | null;
  sessionId: string;
  /**
   * The page ends with the last entry at or before this cursor (a snapshot's `cursor`, a
   * page's `earlier`, any event's cursor). Absent: the log's head.
   */
  upTo?: Cursor | null;
};

/**
 * `session/history`: A page of a session's conversation (its messages and compaction summaries) up to a cursor, kept past the event log's retention; needs no agent.
 */
export type SessionHistoryRequest = {
  id: RequestId;
  method: "session/history";
  params: SessionHistoryParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * A page of history and the position it was read up to: subscribing from `cursor` delivers
 * every later entry as a live event, none of them twice.
 */
export type SessionHistoryResult = {
  cursor: Cursor;
  earlier?: Cursor | null;
  /**
   * The page's fields, as in [`HistoryPage`] (written out: serde cannot flatten the raw
   * `data` of an event).
   */
  entries: Event[];
  truncated?: boolean;
};

/**
 * A session as listed.
 */
export type SessionInfo = {
  /**
   * The running turn, if any.
   */
  activeTurnId?: string | null;
  /**
   * Whether the agent compacts its context by itself when it is nearly full.
   */
  autoCompaction?: boolean | null;
  /**
   * When it was created (ms since the Unix epoch).
   */
  createdAt: number;
  /**
   * The head of its event log: subscribing from here receives only new events.
   */
  cursor: Cursor;
  /**
   * How the agent delivers follow-ups queued while it works.
   */
  followUpMode?: QueueMode | null;
  model?: ModelRef | null;
  /**
   * What the agent may do without asking (docs/protocol.md, "Permissions"); absent: the
   * host's default (`--permission-mode`, `ask` unless configured).
   */
  permissionMode?: PermissionMode | null;
  sessionId: string;
  state: SessionState;
  /**
   * How the agent delivers steering messages queued while it works.
   */
  steeringMode?: QueueMode | null;
  thinkingLevel?: ThinkingLevel | null;
  title?: string | null;
  /**
   * Canonical workspace directory the agent runs in.
   */
  workspace: string;
};

/**
 * `session/list`: Lists sessions.
 */
export type SessionListRequest = {
  id: RequestId;
  method: "session/list";
  params?: Empty | null;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

export type SessionListResult = {
  sessions: SessionInfo[];
};

/**
 * Names one session.
 */
export type SessionRef = {
  sessionId: string;
};

/**
 * Gives a session another title (pi's session name too).
 */
export type SessionRenameParams = {
  sessionId: string;
  /**
   * No control characters.
   */
  title: string;
};

/**
 * `session/rename`: Gives a session another title (and its agent's session the same name); the same title again changes nothing.
 */
export type SessionRenameRequest = {
  id: RequestId;
  method: "session/rename";
  params: SessionRenameParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * `session.renamed`: the session's title changed (`session/rename`).
 */
export type SessionRenamedData = {
  /**
   * The device that renamed it.
   */
  deviceId?: string | null;
  /**
   * Its name, as it was paired, when the event was recorded (at most 200 characters);
   * absent when `deviceId` is, and in events recorded by hosts older than the field.
   */
  deviceName?: string | null;
  title: string;
};

/**
 * What a session runs with, where a client chose it; each absent field is the agent's own
 * default (the remote user's pi settings).
 */
export type SessionSettings = {
  /**
   * Whether the agent compacts its context by itself when it is nearly full.
   */
  autoCompaction?: boolean | null;
  /**
   * How the agent delivers follow-ups queued while it works.
   */
  followUpMode?: QueueMode | null;
  model?: ModelRef | null;
  /**
   * What the agent may do without asking (docs/protocol.md, "Permissions"); absent: the
   * host's default (`--permission-mode`, `ask` unless configured).
   */
  permissionMode?: PermissionMode | null;
  /**
   * How the agent delivers steering messages queued while it works.
   */
  steeringMode?: QueueMode | null;
  thinkingLevel?: ThinkingLevel | null;
};

/**
 * Where a session is in its life.
 */
export type SessionState = "idle" | "running" | "closed";

/**
 * `session/stats`: A session's token, cost, message and tool-call totals, counted from its history (no agent needed); the context window in use when its agent runs.
 */
export type SessionStatsRequest = {
  id: RequestId;
  method: "session/stats";
  params: SessionRef;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * A session's totals (docs/protocol.md §7.28): the whole session's, counted from its history,
 * so they need no agent (a compaction takes messages out of the model's context, not out of
 * these); `context` and `contextUsage` only when the session's agent runs.
 */
export type SessionStatsResult = {
  assistantMessages: number;
  /**
   * What the model's context holds now, as the running agent counts it (pi's
   * `get_session_stats`); absent when none runs.
   */
  context?: ContextStats | null;
  /**
   * How full the model's context is, from the running agent; absent when none runs.
   */
  contextUsage?: ContextUsage | null;
  /**
   * The cost pi computed for the assistant messages, in US dollars.
   */
  cost: number;
  /**
   * Shell commands run with `session/bash`.
   */
  shellCommands: number;
  tokens: TokenTotals;
  /**
   * Tool calls the assistant messages made.
   */
  toolCalls: number;
  toolResults: number;
  /**
   * Every message of the history (user, assistant, tool result, shell command, custom).
   */
  totalMessages: number;
  /**
   * True when the host's history bounds dropped older entries: the totals are of what is kept.
   */
  truncated?: boolean;
  userMessages: number;
};

/**
 * Asks for the streams in progress at a cursor of a session.
 */
export type SessionStreamParams = {
  /**
   * A cursor of this session inside its retained window (CURSOR_EXPIRED otherwise).
   */
  cursor: Cursor;
  sessionId: string;
};

/**
 * `session/stream`: The assistant message and tool outputs streaming as of a cursor, so a client that resumes from its own cursor mid-message can rebuild what is in progress.
 */
export type SessionStreamRequest = {
  id: RequestId;
  method: "session/stream";
  params: SessionStreamParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * What was streaming as of `cursor`: the same fields as a snapshot's, so a client seeds its
 * stream state with them and applies the events after `cursor` (docs/protocol.md §8.1).
 */
export type SessionStreamResult = {
  cursor: Cursor;
  /**
   * The assistant message being streamed at `cursor` (pi's message shape). Absent: none was.
   */
  streamingMessage?: unknown;
  /**
   * The output so far of each tool running at `cursor`, by tool call id.
   */
  toolOutputs?: Record<string, unknown>;
};

/**
 * Starts a subscription to a session's events.
 */
export type SessionSubscribeParams = {
  /**
   * Replay every event after this cursor, then go live. Absent: only events from now on.
   */
  cursor?: Cursor | null;
  sessionId: string;
};

/**
 * `session/subscribe`: Subscribes to a session's events, replaying from a cursor when one is given.
 */
export type SessionSubscribeRequest = {
  id: RequestId;
  method: "session/subscribe";
  params: SessionSubscribeParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

export type SessionSubscribeResult = {
  /**
   * Where the subscription starts: events after this cursor will arrive.
   */
  cursor: Cursor;
  subscriptionId: string;
};

export type SessionUnsubscribeParams = {
  subscriptionId: string;
};

/**
 * `session/unsubscribe`: Ends a subscription.
 */
export type SessionUnsubscribeRequest = {
  id: RequestId;
  method: "session/unsubscribe";
  params: SessionUnsubscribeParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * Everything a client needs to draw a session without replaying its log.
 */
export type Snapshot = {
  /**
   * The grants given with "always" in this session (docs/protocol.md, "Permissions"), oldest
   * first. Absent when none.
   */
  grants?: PermissionGrant[];
  /**
   * The conversation's most recent entries up to the snapshot's cursor (bounded in bytes;
   * an entry over 16 KiB cut as in docs/protocol.md §8.6), and where to page back from with
   * `session/history` (docs/protocol.md §7.24, §8.4).
   */
  history?: HistoryPage;
  /**
   * Approvals waiting for an answer.
   */
  pendingApprovals: ApprovalInfo[];
  /**
   * What waits while a turn works: the agent's steering messages and the host's follow-ups
   * (docs/protocol.md §7.25). Absent when both are empty.
   */
  queue?: Queue;
  state: SessionState;
  /**
   * The assistant message being streamed, as far as the snapshot's cursor (pi's message
   * shape; docs/protocol.md §8.1, "Compact streams"). Absent when none is.
   */
  streamingMessage?: unknown;
  /**
   * The output so far of each running tool, by tool call id (pi's `partialResult` shape).
   */
  toolOutputs?: Record<string, unknown>;
  /**
   * Recent turns, oldest first (the running one last).
   */
  turns: TurnInfo[];
};

/**
 * One file of `workspace/status`.
 */
export type StatusFile = {
  /**
   * For a rename or copy: where it came from.
   */
  from?: string | null;
  /**
   * Relative to the repository's top directory.
   */
  path: string;
  /**
   * git's two-letter status (`porcelain=v2`): the index, then the working tree; `.` for
   * unchanged, `M`, `A`, `D`, `R`, `C`, `U`; `??` untracked.
   */
  status: string;
};

/**
 * `subscription/ended`: the host ended a subscription.
 */
export type SubscriptionEndedParams = {
  /**
   * The last cursor delivered on it.
   */
  cursor: Cursor;
  /**
   * Why, when it was not a normal end (session closed).
   */
  error?: AppError | null;
  sessionId: string;
  subscriptionId: string;
};

/**
 * `subscription/ended`: A subscription ended by the host (session closed, or an error such as CURSOR_EXPIRED).
 */
export type SubscriptionEndedPush = {
  method: "subscription/ended";
  params: SubscriptionEndedParams;
};

/**
 * A subscription's head position.
 */
export type SubscriptionHead = {
  /**
   * The cursor of the last event delivered on this subscription (or where it started). An
   * idle client stores it so its cursor never goes stale.
   */
  cursor: Cursor;
  sessionId: string;
  subscriptionId: string;
};

/**
 * How much the model reasons before it answers (pi's thinking levels). A model without
 * reasoning ignores it; `xhigh` only some models support (pi uses the highest they have).
 */
export type ThinkingLevel = "off" | "minimal" | "low" | "medium" | "high" | "xhigh";

/**
 * Tokens over a session's assistant messages, as the providers reported them.
 */
export type TokenTotals = {
  cacheRead: number;
  cacheWrite: number;
  input: number;
  output: number;
  /**
   * The four added up.
   */
  total: number;
};

/**
 * What a tool call would do, as a person reads it: the command, the path, the size of the
 * change. Each field is absent when the tool has none.
 */
export type ToolSummary = {
  /**
   * The bytes a write would write.
   */
  bytes?: number | null;
  /**
   * A shell command, as the model wrote it.
   */
  command?: string | null;
  /**
   * The replacements an edit would make.
   */
  edits?: number | null;
  /**
   * The path the call names, resolved (`~`, `..`, symlinks, the tool's working directory).
   */
  path?: string | null;
};

/**
 * `turn/abort`: Aborts the running turn. Aborting a finished turn succeeds and changes nothing.
 */
export type TurnAbortRequest = {
  id: RequestId;
  method: "turn/abort";
  params: TurnRef;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * `turn.finished`: a turn ended.
 */
export type TurnFinishedData = {
  /**
   * Why it failed or was aborted (e.g. AGENT_SIDECAR_CRASHED, TURN_ABORTED).
   */
  error?: AppError | null;
  /**
   * The files the turn's tools wrote, edited or deleted, with line counts where known
   * (docs/protocol.md §8.9), at most 256; absent when it changed none.
   */
  files?: FileChange[];
  outcome: TurnOutcome;
};

/**
 * `turn/follow_up`: Queues a prompt to run as a turn of its own once the running turn ends (starts it at once when none runs); idempotent by `idempotencyKey`.
 */
export type TurnFollowUpRequest = {
  id: RequestId;
  method: "turn/follow_up";
  params: TurnStartParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * The follow-up's turn: started now (`queued: false`), or waiting in the host's queue, its
 * `turn.started` to come when the turn before it completes (`queued: true`).
 */
export type TurnFollowUpResult = {
  queued: boolean;
  turnId: string;
};

/**
 * A turn as shown in a snapshot.
 */
export type TurnInfo = {
  /**
   * Why it failed or was aborted.
   */
  error?: AppError | null;
  /**
   * The files it changed, as its `turn.finished` names them.
   */
  files?: FileChange[];
  finishedAt?: number | null;
  startedAt: number;
  state: TurnState;
  /**
   * The prompt that started it.
   */
  text: string;
  turnId: string;
};

/**
 * How a turn ended.
 */
export type TurnOutcome = "completed" | "aborted" | "failed";

/**
 * `turn.queued`: a follow-up waits for the running turn to complete (docs/protocol.md
 * §7.25); its `turn.started` or `turn.withdrawn` comes later.
 */
export type TurnQueuedData = {
  /**
   * The device that queued it.
   */
  deviceId?: string | null;
  /**
   * Its name, as it was paired, when the event was recorded (at most 200 characters);
   * absent when `deviceId` is, and in events recorded by hosts older than the field.
   */
  deviceName?: string | null;
  /**
   * The images sent with it, named only: their bytes reach the log with the prompt's own
   * message once its turn runs.
   */
  images?: ImageInfo[];
  /**
   * The prompt.
   */
  text: string;
};

/**
 * Names one turn of one session.
 */
export type TurnRef = {
  sessionId: string;
  turnId: string;
};

/**
 * Starts a turn. Keys are scoped to the session: in one session the same `idempotencyKey` with
 * the same `text` returns the same turn, so a client may resend it after HOST_DISCONNECTED;
 * other `text` gives IDEMPOTENCY_CONFLICT (docs/protocol.md §6.3).
 */
export type TurnStartParams = {
  idempotencyKey: string;
  /**
   * Images sent with the prompt (the `attachments` capability): at most 8, each at most
   * 5 MiB decoded (docs/protocol.md §7.15).
   */
  images?: ImageAttachment[];
  sessionId: string;
  /**
   * The prompt.
   */
  text: string;
};

/**
 * `turn/start`: Starts a turn with a prompt; idempotent by `idempotencyKey`.
 */
export type TurnStartRequest = {
  id: RequestId;
  method: "turn/start";
  params: TurnStartParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

export type TurnStartResult = {
  turnId: string;
};

/**
 * `turn.started`: a turn began.
 */
export type TurnStartedData = {
  /**
   * The device that started it.
   */
  deviceId?: string | null;
  /**
   * Its name, as it was paired, when the event was recorded (at most 200 characters);
   * absent when `deviceId` is, and in events recorded by hosts older than the field.
   */
  deviceName?: string | null;
  /**
   * The images sent with it, named only: their bytes are in the prompt's own message
   * (`agent.message_end`, role `user`), so the log holds them once.
   */
  images?: ImageInfo[];
  /**
   * The prompt.
   */
  text: string;
};

/**
 * Where a turn is in its life.
 */
export type TurnState = "running" | "completed" | "aborted" | "failed";

/**
 * Adds guidance to the running turn.
 */
export type TurnSteerParams = {
  sessionId: string;
  text: string;
  turnId: string;
};

/**
 * `turn/steer`: Adds guidance to the running turn.
 */
export type TurnSteerRequest = {
  id: RequestId;
  method: "turn/steer";
  params: TurnSteerParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * `turn.withdrawn`: a queued follow-up will not run as a turn of its own.
 */
export type TurnWithdrawnData = {
  /**
   * The device that withdrew it (`reason: "cleared"`).
   */
  deviceId?: string | null;
  /**
   * Its name, as it was paired, when the event was recorded (at most 200 characters);
   * absent when `deviceId` is, and in events recorded by hosts older than the field.
   */
  deviceName?: string | null;
  /**
   * The turn it was delivered with (`reason: "joined"`).
   */
  joinedTurnId?: string | null;
  reason: WithdrawReason;
  /**
   * Its prompt, to put back where it was typed.
   */
  text: string;
};

/**
 * A yes-or-no answer.
 */
export type Verdict = "allow" | "deny";

/**
 * Why a queued follow-up left the queue without a turn of its own.
 */
export type WithdrawReason = "cleared" | "turn_ended" | "agent_stopped" | "host_restarted" | "joined";

/**
 * `workspace.changed`: paths of the session's workspace changed on disk (by the agent, a
 * shell, an editor: whoever wrote), gathered over a short window. `rescan: true` says the
 * list is not the whole story (the kernel's queue overflowed, or a bound was reached): read
 * the tree again (`fs/list`, `workspace/status`) rather than trust what you hold.
 */
export type WorkspaceChangedData = {
  /**
   * In the order first seen; at most 256, each path once (its last kind).
   */
  changes: PathChange[];
  /**
   * Why `rescan`: `overflow` (the kernel dropped events), `too_many_changes` (more paths
   * in the window than one event names), `too_many_directories` (the tree has more
   * directories than the host watches: changes in the rest are not seen), `watch_failed`,
   * `host_restarted` (the host started again: what changed while none watched is unknown).
   */
  reason?: string | null;
  /**
   * Something changed that `changes` does not name.
   */
  rescan?: boolean;
  /**
   * Under `rescan`: the directory to read again (`""`: the whole workspace).
   */
  rescanPath?: string | null;
};

/**
 * `workspace/diff`'s params: the working tree against HEAD, or one path of it, or the files
 * one turn changed.
 */
export type WorkspaceDiffParams = {
  /**
   * Most bytes of diff to return: 1 to 524 288 (262 144 when absent).
   */
  maxBytes?: number | null;
  /**
   * Only this path (relative to the workspace, or absolute inside it).
   */
  path?: string | null;
  sessionId: string;
  /**
   * Only the files this turn changed (its `turn.finished` `files`).
   */
  turnId?: string | null;
};

/**
 * `workspace/diff`: A bounded unified diff of a session's workspace against HEAD: all of it, one path, or the files one turn changed.
 */
export type WorkspaceDiffRequest = {
  id: RequestId;
  method: "workspace/diff";
  params: WorkspaceDiffParams;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * `workspace/diff`'s result: a unified diff (`git diff HEAD`), cut at `maxBytes`.
 */
export type WorkspaceDiffResult = {
  /**
   * The diff text (UTF-8; a binary file as git's `Binary files ... differ`).
   */
  diff: string;
  /**
   * The paths the diff covers when it was asked for a turn (empty otherwise).
   */
  paths?: string[];
  /**
   * True when the diff was cut at `maxBytes` (on a line end).
   */
  truncated?: boolean;
};

/**
 * `workspace/status`: The git state of a session's workspace: branch, upstream ahead/behind, changed files.
 */
export type WorkspaceStatusRequest = {
  id: RequestId;
  method: "workspace/status";
  params: SessionRef;
  /**
   * The call's trace id, for logs (protocol.md §3.3); made by the server when absent.
   */
  traceId?: string;
};

/**
 * `workspace/status`'s result: the workspace's git state.
 */
export type WorkspaceStatusResult = {
  ahead?: number | null;
  behind?: number | null;
  /**
   * The branch checked out; absent when HEAD is detached.
   */
  branch?: string | null;
  /**
   * Changed, untracked and conflicted files (ignored ones left out), at most 2 000 (`MAX_STATUS_FILES`).
   */
  files: StatusFile[];
  /**
   * The commit checked out; absent before the first commit.
   */
  head?: string | null;
  /**
   * True when `files` was cut at its bound.
   */
  truncated?: boolean;
  /**
   * The branch's upstream, with how far the branch is ahead of and behind it.
   */
  upstream?: string | null;
};

/** Params and result type of every method. */
export interface RacpMethods {
  "hello": { params: HelloParams; result: HelloResult };
  "session/subscribe": { params: SessionSubscribeParams; result: SessionSubscribeResult };
  "session/unsubscribe": { params: SessionUnsubscribeParams; result: Ack };
  "pair": { params: PairParams; result: PairResult };
  "host/list": { params: Empty; result: HostListResult };
  "device/list": { params: Empty; result: DeviceListResult };
  "device/revoke": { params: DeviceRevokeParams; result: Ack };
  "pairing/create": { params: PairingCreateParams; result: PairingCreateResult };
  "host/info": { params: Empty; result: HostInfoResult };
  "fs/list": { params: PathParams; result: FsListResult };
  "fs/stat": { params: PathParams; result: FsStatResult };
  "fs/read": { params: FsReadParams; result: FsReadResult };
  "workspace/status": { params: SessionRef; result: WorkspaceStatusResult };
  "workspace/diff": { params: WorkspaceDiffParams; result: WorkspaceDiffResult };
  "session/create": { params: SessionCreateParams; result: SessionCreateResult };
  "session/list": { params: Empty; result: SessionListResult };
  "session/get": { params: SessionRef; result: SessionGetResult };
  "session/stream": { params: SessionStreamParams; result: SessionStreamResult };
  "session/history": { params: SessionHistoryParams; result: SessionHistoryResult };
  "session/rename": { params: SessionRenameParams; result: SessionCreateResult };
  "session/close": { params: SessionRef; result: Ack };
  "turn/start": { params: TurnStartParams; result: TurnStartResult };
  "turn/steer": { params: TurnSteerParams; result: Ack };
  "turn/abort": { params: TurnRef; result: Ack };
  "approval/respond": { params: ApprovalRespondParams; result: ApprovalRespondResult };
  "model/list": { params: Empty; result: ModelListResult };
  "turn/follow_up": { params: TurnStartParams; result: TurnFollowUpResult };
  "session/clear_queue": { params: SessionClearQueueParams; result: SessionClearQueueResult };
  "session/compact": { params: SessionCompactParams; result: SessionCompactResult };
  "session/configure": { params: SessionConfigureParams; result: SessionCreateResult };
  "session/fork": { params: SessionForkParams; result: SessionForkResult };
  "session/clone": { params: SessionCloneParams; result: SessionCreateResult };
  "credential/set": { params: CredentialSetParams; result: CredentialSetResult };
  "credential/delete": { params: ProviderRef; result: Deleted };
  "credential/list": { params: Empty; result: CredentialListResult };
  "provider/set": { params: ProviderSetParams; result: Ack };
  "provider/delete": { params: ProviderRef; result: Deleted };
  "session/bash": { params: SessionBashParams; result: SessionBashResult };
  "session/bash_abort": { params: SessionRef; result: Ack };
  "session/stats": { params: SessionRef; result: SessionStatsResult };
  "session/commands": { params: SessionRef; result: SessionCommandsResult };
  "session/export": { params: SessionExportParams; result: SessionExportResult };
}

export type RacpMethodName = keyof RacpMethods;

/** Params type of every push. */
export interface RacpPushes {
  "session/events": SessionEventsParams;
  "heartbeat": HeartbeatParams;
  "subscription/ended": SubscriptionEndedParams;
}

/** `data` type of every event type the host emits; `agent.*` events carry the agent's payload. */
export interface RacpEventData {
  "turn.started": TurnStartedData;
  "turn.finished": TurnFinishedData;
  "turn.queued": TurnQueuedData;
  "turn.withdrawn": TurnWithdrawnData;
  "approval.requested": ApprovalRequestedData;
  "approval.settled": ApprovalSettledData;
  "session.closed": SessionClosedData;
  "session.agent_stopped": AgentStoppedData;
  "session.configured": SessionConfiguredData;
  "session.renamed": SessionRenamedData;
  "session.bash": SessionBashData;
  "session.forked": SessionForkedData;
  "permission.decided": PermissionDecidedData;
  "workspace.changed": WorkspaceChangedData;
}

/** Who may call each method, whether it changes state, and whether it may be resent after a lost reply, and how long the host may take beyond a usual call (its own deadline, or null). */
export const METHODS = {
  "hello": { access: "any", mutates: false, safeToResend: true, deadlineMs: null },
  "session/subscribe": { access: "observer", mutates: false, safeToResend: true, deadlineMs: null },
  "session/unsubscribe": { access: "observer", mutates: false, safeToResend: true, deadlineMs: null },
  "pair": { access: "pairing", mutates: true, safeToResend: false, deadlineMs: null },
  "host/list": { access: "observer", mutates: false, safeToResend: true, deadlineMs: null },
  "device/list": { access: "owner", mutates: false, safeToResend: true, deadlineMs: null },
  "device/revoke": { access: "owner", mutates: true, safeToResend: true, deadlineMs: null },
  "pairing/create": { access: "owner", mutates: true, safeToResend: false, deadlineMs: null },
  "host/info": { access: "observer", mutates: false, safeToResend: true, deadlineMs: null },
  "fs/list": { access: "observer", mutates: false, safeToResend: true, deadlineMs: null },
  "fs/stat": { access: "observer", mutates: false, safeToResend: true, deadlineMs: null },
  "fs/read": { access: "operator", mutates: false, safeToResend: true, deadlineMs: null },
  "workspace/status": { access: "observer", mutates: false, safeToResend: true, deadlineMs: null },
  "workspace/diff": { access: "operator", mutates: false, safeToResend: true, deadlineMs: null },
  "session/create": { access: "operator", mutates: true, safeToResend: false, deadlineMs: null },
  "session/list": { access: "observer", mutates: false, safeToResend: true, deadlineMs: null },
  "session/get": { access: "observer", mutates: false, safeToResend: true, deadlineMs: null },
  "session/stream": { access: "observer", mutates: false, safeToResend: true, deadlineMs: null },
  "session/history": { access: "observer", mutates: false, safeToResend: true, deadlineMs: null },
  "session/rename": { access: "operator", mutates: true, safeToResend: true, deadlineMs: null },
  "session/close": { access: "operator", mutates: true, safeToResend: true, deadlineMs: null },
  "turn/start": { access: "operator", mutates: true, safeToResend: true, deadlineMs: null },
  "turn/steer": { access: "operator", mutates: true, safeToResend: false, deadlineMs: null },
  "turn/abort": { access: "operator", mutates: true, safeToResend: true, deadlineMs: null },
  "approval/respond": { access: "operator", mutates: true, safeToResend: true, deadlineMs: null },
  "model/list": { access: "observer", mutates: false, safeToResend: true, deadlineMs: null },
  "turn/follow_up": { access: "operator", mutates: true, safeToResend: true, deadlineMs: null },
  "session/clear_queue": { access: "operator", mutates: true, safeToResend: true, deadlineMs: null },
  "session/compact": { access: "operator", mutates: true, safeToResend: false, deadlineMs: null },
  "session/configure": { access: "operator", mutates: true, safeToResend: true, deadlineMs: null },
  "session/fork": { access: "operator", mutates: true, safeToResend: false, deadlineMs: null },
  "session/clone": { access: "operator", mutates: true, safeToResend: false, deadlineMs: null },
  "credential/set": { access: "owner", mutates: true, safeToResend: true, deadlineMs: null },
  "credential/delete": { access: "owner", mutates: true, safeToResend: true, deadlineMs: null },
  "credential/list": { access: "owner", mutates: false, safeToResend: true, deadlineMs: null },
  "provider/set": { access: "owner", mutates: true, safeToResend: true, deadlineMs: null },
  "provider/delete": { access: "owner", mutates: true, safeToResend: true, deadlineMs: null },
  "session/bash": { access: "operator", mutates: true, safeToResend: false, deadlineMs: 600000 },
  "session/bash_abort": { access: "operator", mutates: true, safeToResend: true, deadlineMs: null },
  "session/stats": { access: "observer", mutates: false, safeToResend: true, deadlineMs: null },
  "session/commands": { access: "observer", mutates: false, safeToResend: true, deadlineMs: null },
  "session/export": { access: "observer", mutates: false, safeToResend: true, deadlineMs: null },
} as const;

/** The error-code registry. */
export const ERROR_CODES = {
  PROTOCOL_MISMATCH: { retriable: "no", recovery: "upgrade", closeCode: 4000, httpStatus: 400 },
  HOST_UNAVAILABLE: { retriable: "yes", recovery: "reconnect_and_resume", closeCode: 4001, httpStatus: 503 },
  HOST_OVERLOADED: { retriable: "yes", recovery: "retry_after", closeCode: 4002, httpStatus: 503 },
  INTERNAL: { retriable: "maybe", recovery: "stop_and_report", closeCode: 4003, httpStatus: 500 },
  INVALID_ARGUMENT: { retriable: "no", recovery: "fix_arguments", closeCode: 4004, httpStatus: 400 },
  INVALID_PARAMS: { retriable: "no", recovery: "fix_arguments", closeCode: 4005, httpStatus: 400 },
  UNAUTHORIZED: { retriable: "no", recovery: "reauthorize", closeCode: 4006, httpStatus: 401 },
  NOT_FOUND: { retriable: "no", recovery: "check_state", closeCode: 4007, httpStatus: 404 },
  SESSION_NOT_FOUND: { retriable: "no", recovery: "check_state", closeCode: 4008, httpStatus: 404 },
  CONFLICT: { retriable: "maybe", recovery: "check_state", closeCode: 4009, httpStatus: 409 },
  UNSUPPORTED: { retriable: "no", recovery: "stop_and_report", closeCode: 4010, httpStatus: 501, reserved: true },
  FORBIDDEN: { retriable: "no", recovery: "stop_and_report", closeCode: 4011, httpStatus: 403 },
  METHOD_NOT_FOUND: { retriable: "no", recovery: "stop_and_report", closeCode: 4012, httpStatus: 404 },
  IDEMPOTENCY_CONFLICT: { retriable: "no", recovery: "check_state", closeCode: 4013, httpStatus: 409 },
  CURSOR_EXPIRED: { retriable: "no", recovery: "resnapshot", closeCode: 4014, httpStatus: 410 },
  CLIENT_TOO_SLOW: { retriable: "yes", recovery: "reconnect_and_resume", closeCode: 4015, httpStatus: 429 },
  APPROVAL_EXPIRED: { retriable: "no", recovery: "check_state", closeCode: 4016, httpStatus: 410 },
  APPROVAL_STALE: { retriable: "no", recovery: "check_state", closeCode: 4017, httpStatus: 409 },
  PAYLOAD_TOO_LARGE: { retriable: "no", recovery: "fix_arguments", closeCode: 4018, httpStatus: 413 },
  TIMEOUT: { retriable: "yes", recovery: "retry", closeCode: 4019, httpStatus: 504 },
  HOST_SHUTTING_DOWN: { retriable: "yes", recovery: "reconnect_and_resume", closeCode: 4020, httpStatus: 503 },
  RATE_LIMITED: { retriable: "yes", recovery: "retry_after", closeCode: 4021, httpStatus: 429 },
  LIMIT_EXCEEDED: { retriable: "no", recovery: "fix_arguments", closeCode: 4022, httpStatus: 422 },
  AGENT_UNAVAILABLE: { retriable: "no", recovery: "stop_and_report", closeCode: 4023, httpStatus: 503 },
  AGENT_BUSY: { retriable: "no", recovery: "check_state", closeCode: 4024, httpStatus: 409 },
  AGENT_SIDECAR_CRASHED: { retriable: "no", recovery: "check_state", closeCode: 4025, httpStatus: 502 },
  TURN_NOT_FOUND: { retriable: "no", recovery: "check_state", closeCode: 4026, httpStatus: 404 },
  TURN_ABORTED: { retriable: "no", recovery: "check_state", closeCode: 4027, httpStatus: 409 },
  HOST_DISCONNECTED: { retriable: "yes", recovery: "reconnect_and_resume", closeCode: 4028, httpStatus: 503 },
  HOST_BOOTSTRAP_FAILED: { retriable: "no", recovery: "stop_and_report", closeCode: 4029, httpStatus: 500 },
  HOST_VERSION_MISMATCH: { retriable: "no", recovery: "upgrade", closeCode: 4030, httpStatus: 400 },
  REMOTE_AUTH_FAILED: { retriable: "no", recovery: "reauthorize", closeCode: 4031, httpStatus: 401 },
  REMOTE_CONNECTION_FAILED: { retriable: "maybe", recovery: "retry", closeCode: 4032, httpStatus: 502 },
  REMOTE_FORWARD_FAILED: { retriable: "yes", recovery: "retry", closeCode: 4033, httpStatus: 502 },
  REMOTE_PATH_NOT_FOUND: { retriable: "no", recovery: "fix_arguments", closeCode: 4034, httpStatus: 404 },
  REMOTE_PATH_FORBIDDEN: { retriable: "no", recovery: "fix_arguments", closeCode: 4035, httpStatus: 403 },
  PAIRING_FAILED: { retriable: "no", recovery: "reauthorize", closeCode: 4036, httpStatus: 401 },
  PAIRING_TOKEN_EXPIRED: { retriable: "no", recovery: "reauthorize", closeCode: 4037, httpStatus: 401 },
  CAPABILITY_UNAVAILABLE: { retriable: "no", recovery: "stop_and_report", closeCode: 4038, httpStatus: 501 },
  HOST_IDENTITY_MISMATCH: { retriable: "no", recovery: "stop_and_report", closeCode: 4039, httpStatus: 502 },
  MODEL_NOT_CONFIGURED: { retriable: "no", recovery: "stop_and_report", closeCode: 4040, httpStatus: 424 },
  PROVIDER_ERROR: { retriable: "maybe", recovery: "retry", closeCode: 4041, httpStatus: 502 },
  PROVIDER_UNAUTHORIZED: { retriable: "no", recovery: "stop_and_report", closeCode: 4042, httpStatus: 502 },
  PROVIDER_RATE_LIMITED: { retriable: "yes", recovery: "retry_after", closeCode: 4043, httpStatus: 429 },
  CONTEXT_TOO_LARGE: { retriable: "no", recovery: "fix_arguments", closeCode: 4044, httpStatus: 413 },
  STREAM_FAILED: { retriable: "yes", recovery: "retry", closeCode: 4045, httpStatus: 502 },
  NETWORK_ERROR: { retriable: "maybe", recovery: "retry", closeCode: 4046, httpStatus: 502 },
  EMPTY_MODEL_RESPONSE: { retriable: "yes", recovery: "retry", closeCode: 4047, httpStatus: 502 },
  AGENT_SIDECAR_OOM: { retriable: "no", recovery: "check_state", closeCode: 4048, httpStatus: 502 },
  PROVIDER_TIMEOUT: { retriable: "yes", recovery: "retry", closeCode: 4049, httpStatus: 504, reserved: true },
  PROVIDER_MODEL_NOT_FOUND: { retriable: "no", recovery: "stop_and_report", closeCode: 4050, httpStatus: 404, reserved: true },
  PROVIDER_SECRET_MISSING: { retriable: "no", recovery: "stop_and_report", closeCode: 4051, httpStatus: 424 },
  HELLO_REQUIRED: { retriable: "no", recovery: "fix_arguments", closeCode: 4052, httpStatus: 400 },
  TOOL_DENIED: { retriable: "no", recovery: "check_state", closeCode: 4053, httpStatus: 403 },
  WORKSPACE_PATH_DENIED: { retriable: "no", recovery: "stop_and_report", closeCode: 4054, httpStatus: 403 },
  PATH_OUTSIDE_WORKSPACE: { retriable: "no", recovery: "check_state", closeCode: 4055, httpStatus: 403 },
  WRITE_DISABLED_IN_PLAN: { retriable: "no", recovery: "check_state", closeCode: 4056, httpStatus: 403 },
  EDIT_DISABLED_IN_PLAN: { retriable: "no", recovery: "check_state", closeCode: 4057, httpStatus: 403 },
  TOOL_DISABLED_IN_PLAN: { retriable: "no", recovery: "check_state", closeCode: 4058, httpStatus: 403 },
  READ_PATH_IS_DIRECTORY: { retriable: "no", recovery: "fix_arguments", closeCode: 4059, httpStatus: 400 },
  WORKSPACE_NOT_A_REPOSITORY: { retriable: "no", recovery: "stop_and_report", closeCode: 4060, httpStatus: 409 },
  GIT_UNAVAILABLE: { retriable: "no", recovery: "stop_and_report", closeCode: 4061, httpStatus: 503 },
} as const satisfies Record<ErrorCode, unknown>;
