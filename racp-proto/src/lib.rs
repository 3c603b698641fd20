//! RACP-WS v1 as data: frames, methods, events, cursors, the error-code registry and the codec.
//!
//! No server logic lives here. The host (`pi-host`) and clients share these types, and
//! `docs/schema/`, `clients/ts/` and `docs/error-codes.md` are generated from them
//! (`cargo run -p racp-proto --bin racp-codegen`).
//!
//! Map of the crate:
//! - [`error`]: the registry of codes and the `AppError` object.
//! - [`frame`] and [`codec`]: frame shapes, size-checked decoding, params with JSON paths.
//! - [`methods`]: the method table (params, results, access, resend safety).
//! - [`permission`]: the permission policy as clients read it (modes, questions, grants).
//! - [`events`]: session events and pushes; [`elide`]: an event or reply cut to a frame bound.
//! - [`pi`]: pi's RPC mode as data, the one reader of pi's format: its event types, a line read
//!   in one pass, commands and replies, compaction of its stream updates and the rebuild of
//!   what they stream.
//! - [`trace`]: a call's trace id, presented or made.
//! - [`cursor`], [`role`], [`capability`], [`limits`], [`validate`]: the pieces they are built
//!   from.
//! - [`codegen`]: renders the generated documents.

pub mod capability;
#[cfg(feature = "client")]
pub mod client;
pub mod codec;
pub mod codegen;
pub mod cursor;
pub mod elide;
pub mod error;
pub mod events;
pub mod fingerprint;
pub mod frame;
pub mod gateway;
pub mod human;
pub mod limits;
pub mod methods;
pub mod permission;
pub mod pi;
pub mod role;
pub mod trace;
pub mod validate;

pub use capability::Capability;
pub use cursor::{Cursor, Epoch, Expired};
pub use error::{AppError, ErrorCode, ErrorSource, Recovery, Retriable};
pub use methods::{
    Ack, Call, CoreCall, Empty, EndpointCall, HostCall, Method, MethodSpec, Place, Placed,
    RacpMethod, Run, SubscriptionCall, calls,
};
pub use role::{Access, Principal, Role};

/// The only protocol version this crate speaks.
pub const PROTOCOL_VERSION: u32 = 1;
/// The WebSocket subprotocol a client must offer.
pub const SUBPROTOCOL: &str = "racp.v1";
/// Prefix of the second subprotocol a browser offers to carry its bearer token.
pub const BEARER_SUBPROTOCOL_PREFIX: &str = "racp.bearer.";
/// The endpoint path.
pub const ENDPOINT_PATH: &str = "/racp";
/// The exit status of every binary (pi-host, pi-gateway, pi-remote) for bad usage: unknown
/// commands or options, missing or malformed arguments (`EX_USAGE` of sysexits.h).
pub const EXIT_USAGE: u8 = 64;
