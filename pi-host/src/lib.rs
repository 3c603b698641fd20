//! The RACP-WS host as a library: `src/main.rs` is its command line. The server side it shares
//! with `pi-gateway` (accept loop, upgrade checks, identity, frame fitting, the connection
//! registry, the signed link) is the `racp-server` crate.

pub mod admin;
pub mod agent;
pub mod auth;
pub mod browse;
pub mod config;
pub mod fence;
pub mod handlers;
pub mod models;
pub mod redact;
pub mod secrets;
pub mod server;
pub mod sessions;
pub mod state;
pub mod store;
#[cfg(debug_assertions)]
mod test_hooks;
pub mod turns;
pub mod uplink;

/// The host's INTERNAL: the cause logged under the trace id the reply carries.
pub fn internal(err: impl std::fmt::Display) -> racp_proto::AppError {
    racp_server::failure::internal("host", err)
}
