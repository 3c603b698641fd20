//! The desktop side of pi-host: the SSH bootstrapper and `pi-remote`, the command-line client
//! that pairs with a host and drives its sessions over RACP-WS.
//!
//! - [`ssh`]: SSH with russh: the user's config, known_hosts, agent and key files; commands,
//!   uploads and direct-tcpip channels.
//! - [`provision`]: the bootstrap's stages (probe, transfer, verify, install, start, forward,
//!   pair, handshake) and the forward that reconnects.
//! - [`remote`]: `pi-remote`: its commands ([`remote::commands`]), exit codes, profiles, pairing
//!   links, output and the event view; `src/bin/pi-remote.rs` parses the command line and
//!   dispatches.

pub mod dirs;
pub mod provision;
pub mod remote;
pub mod ssh;
