//! Fixed protocol bounds. The schema, the validators and the docs all read these constants.

/// Frame size the host allows when the client does not ask for less (1 MiB).
pub const DEFAULT_MAX_FRAME_BYTES: u32 = 1 << 20;
/// Smallest frame bound a client may ask for in `hello` (4 KiB).
pub const MIN_MAX_FRAME_BYTES: u32 = 4 << 10;
/// Frame bound before `hello` has negotiated one (64 KiB): enough for any `hello` or `pair`.
pub const PRE_HELLO_MAX_FRAME_BYTES: u32 = 64 << 10;

/// Longest request id, idempotency key, session/turn/approval/device/subscription id (chars).
pub const MAX_ID_CHARS: u64 = 128;
/// Longest device name, client name or version, session title (chars).
pub const MAX_NAME_CHARS: u64 = 200;
/// Longest path in `fs/*` and `session/create` (chars).
pub const MAX_PATH_CHARS: u64 = 4096;
/// Bytes of a file one `fs/read` returns when it names no `length`.
pub const DEFAULT_READ_BYTES: u64 = 256 << 10;
/// Most bytes of a file one `fs/read` returns: a page, base64-encoded, still fits the default
/// 1 MiB frame; a longer file is read in pages (`offset`).
pub const MAX_READ_BYTES: u64 = 512 << 10;
/// Bytes of diff one `workspace/diff` returns when it names no `maxBytes`, and its most: a
/// diff, escaped as JSON, still fits the default 1 MiB frame.
pub const DEFAULT_DIFF_BYTES: u64 = 256 << 10;
pub const MAX_DIFF_BYTES: u64 = 512 << 10;
/// Most paths one `workspace.changed` event names; past it in one window the event says
/// `rescan` (docs/protocol.md §8.9).
pub const MAX_CHANGES_PER_EVENT: usize = 256;
/// Most files a turn's `turn.finished` names in `files`.
pub const MAX_TURN_FILES: usize = 256;
/// Most files `workspace/status` lists.
pub const MAX_STATUS_FILES: usize = 2000;
/// Longest prompt or steer text (chars); the frame bound usually bites first.
pub const MAX_TEXT_CHARS: u64 = 1 << 20;
/// Longest approval answer `value` (chars).
pub const MAX_ANSWER_CHARS: u64 = 64 << 10;
/// Longest provider API key (chars): real keys are under 300; a JWT-style token a few KiB.
pub const MAX_API_KEY_CHARS: u64 = 8 << 10;
/// Most models one custom provider lists (`provider/set`).
pub const MAX_CUSTOM_MODELS: u64 = 256;
/// Most providers an owner adds with `provider/set`, and most credentials a host stores.
pub const MAX_PROVIDERS: usize = 64;

/// Most images one prompt carries, and the largest one (bytes, decoded): providers take
/// about 5 MB an image. A turn/start must still fit the connection's frame bound (§5.2).
pub const MAX_IMAGES: usize = 8;
pub const MAX_IMAGE_BYTES: u64 = 5 << 20;
/// The image types a prompt takes (pi's and the providers').
pub const IMAGE_MIME_TYPES: [&str; 4] = ["image/png", "image/jpeg", "image/gif", "image/webp"];

/// Most follow-ups a session holds queued (`turn/follow_up`): past it, LIMIT_EXCEEDED.
pub const MAX_QUEUED_FOLLOW_UPS: usize = 32;

/// Most history entries one `session/history` page holds, and how many when `limit` is absent.
pub const MAX_HISTORY_LIMIT: u32 = 1000;
pub const DEFAULT_HISTORY_LIMIT: u32 = 100;
/// The bytes one `session/history` page holds when `maxBytes` is absent (256 KiB), and the
/// least a client may ask for (an entry larger than a page is cut to it, docs/protocol.md §8.6).
pub const DEFAULT_HISTORY_PAGE_BYTES: u32 = 256 << 10;
pub const MIN_HISTORY_PAGE_BYTES: u32 = 4 << 10;
pub const MAX_HISTORY_PAGE_BYTES: u32 = 16 << 20;

/// Pairing token lifetime bounds, in seconds.
pub const MIN_PAIRING_TTL_SECONDS: u64 = 10;
pub const MAX_PAIRING_TTL_SECONDS: u64 = 24 * 60 * 60;
/// Pairing token lifetime when `ttlSeconds` is absent.
pub const DEFAULT_PAIRING_TTL_SECONDS: u64 = 10 * 60;

/// Longest shell command `session/bash` takes (chars).
pub const MAX_SHELL_COMMAND_CHARS: u64 = 64 << 10;
/// How long a shell command (`session/bash`) may run before the host aborts it.
pub const SHELL_DEADLINE_SECONDS: u64 = 600;
/// Most bytes of a shell command's output the host relays and keeps: its end, like pi's own
/// bound on what it keeps for the model (50 KB); a longer output says `truncated`.
pub const MAX_SHELL_OUTPUT_BYTES: usize = 64 << 10;
/// The HTML `session/export` returns at most when `maxBytes` is absent (768 KiB: with JSON's
/// escaping it fits the default 1 MiB frame bound), and the bounds a client may ask for.
pub const DEFAULT_EXPORT_BYTES: u32 = 768 << 10;
pub const MIN_EXPORT_BYTES: u32 = 4 << 10;
pub const MAX_EXPORT_BYTES: u32 = 16 << 20;
