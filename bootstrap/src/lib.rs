//! The desktop side of pi-host: the SSH bootstrapper (issue 6) and `pi-remote`, the command-line
//! client that pairs with a host and drives its sessions over RACP-WS.
//!
//! - [`remote`]: the pieces of `pi-remote` (exit codes, profiles, pairing URLs, the event view);
//!   the command line itself is `src/bin/pi-remote.rs`.

pub mod remote;
