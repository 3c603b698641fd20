//! The RACP-WS host as a library: `src/main.rs` is its command line. The server side it shares
//! with `pi-gateway` (accept loop, upgrade checks, identity, the connection core and registry,
//! the signed link) is the `racp-server` crate.
//!
//! Layout, from the socket to the disk:
//! - [`server`]: the `/racp` endpoint, the host's upgrade and its `Service` for racp-server's
//!   connection core; [`auth`], [`secrets`]: who is calling; [`admin`]: the owner's socket.
//! - [`methods`]: one file per group of the method table (`handshake`, `host`, `fs`,
//!   `session`, `turn`, `model`), and in `methods/mod.rs` one exhaustive match per place, each
//!   arm naming the file and function that answers it.
//! - [`sessions`]: a session's log, snapshot view, history pages and group commit;
//!   [`store`]: SQLite (devices, sessions, events, history, approvals, call ids).
//! - [`driver`]: the agent driver per session (turns, queue, approvals, lifecycle, shell,
//!   branches); [`agent`]: pi's process, its check, extensions and failures;
//!   [`models`]: keys, providers and the model catalogue; [`redact`]: what never leaves.
//! - [`policy`]: what the agent may do before each tool call (modes, denylist, grants).
//! - [`fence`]: files behind the roots; [`uplink`]: the link to a gateway;
//!   [`config`], [`state`]: what the host runs with and holds.

pub mod admin;
pub mod agent;
pub mod auth;
pub mod config;
pub mod driver;
pub mod fence;
pub mod methods;
pub mod metrics;
pub mod models;
pub mod policy;
pub mod qr;
pub mod redact;
pub mod secrets;
pub mod server;
pub mod sessions;
pub mod state;
pub mod store;
#[cfg(debug_assertions)]
mod test_hooks;
pub mod uplink;
pub mod workspace;

/// The host's INTERNAL: the cause logged under the trace id the reply carries.
pub fn internal(err: impl std::fmt::Display) -> racp_proto::AppError {
    racp_server::failure::internal("host", err)
}
