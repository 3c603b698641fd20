//! The RACP-WS host as a library: `src/main.rs` is its command line, and `pi-gateway`
//! (gateway/) serves the same protocol with the server layer (`server::listener`, `identity`,
//! `tls`, `elide`) and the wire helpers from here.

pub mod admin;
pub mod agent;
pub mod auth;
pub mod clock;
pub mod config;
pub mod connections;
pub mod fs;
pub mod fsutil;
pub mod handlers;
pub mod models;
pub mod paths;
pub mod ratelimit;
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
pub mod usage;
pub mod wire;
