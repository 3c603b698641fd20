//! The server side of RACP-WS that a host (`pi-host`) and a gateway (`pi-gateway`) both run
//! (docs/architecture.md, "racp-server"): nothing here knows sessions, agents or a store.
//!
//! Layout, in the order a connection meets it:
//! - [`listener`]: the accept loop and the descriptor budget; [`tls`], [`identity`]: the
//!   host's certificate; [`upgrade`]: Host, Origin and the bearer token's place on an upgrade.
//! - [`socket`]: the WebSocket upgrade and settings; [`reframe`]: the bytes under tungstenite
//!   (large frames in fragments); [`budget`]: the bytes held for all clients.
//! - [`connection`]: the one connection core a server's `Service` plugs into: [`hello`],
//!   [`admission`] (access, [`ratelimit`], drain), in-flight bounds, replies, [`push`]es.
//! - [`fanout`]: subscribers pulling from a shared log; [`connections`]: the registry and the
//!   device gate a revoke closes.
//! - [`metrics`]: the core's counters and the operator's listener (`/metrics`, `/livez`,
//!   `/readyz`); [`notify`]: systemd's readiness, from the same checks.
//! - [`uplink`]: the signed link to NATS a host and a gateway share; [`wire`], [`failure`],
//!   [`trace`] (a call's trace id, its span and its errors), [`log`], [`clock`], [`private_file`], [`token`], [`usage`], [`limits`]: what they are built
//!   from.

pub mod admission;
pub mod budget;
pub mod clock;
pub mod connection;
pub mod connections;
pub mod failure;
pub mod fanout;
pub mod hello;
pub mod identity;
pub mod limits;
pub mod listener;
pub mod log;
pub mod metrics;
pub mod notify;
pub mod private_file;
pub mod push;
pub mod ratelimit;
pub mod reframe;
pub mod socket;
pub mod tls;
pub mod token;
pub mod trace;
pub mod upgrade;
pub mod uplink;
pub mod usage;
pub mod wire;

/// How long a closing client may take to read the close frame that answers its own.
const CLOSE_ANSWER_GRACE: std::time::Duration = std::time::Duration::from_secs(2);

/// Answers a client's close frame, as RFC 6455 §5.5.1 requires: tungstenite queues the answer
/// when it reads the client's close, and it leaves only with a flush. Without it every client
/// that closes with 1000 (a browser's `pair()`) would see 1006.
pub async fn answer_close(socket: &mut socket::Socket) {
    use futures_util::SinkExt;
    let _ = tokio::time::timeout(CLOSE_ANSWER_GRACE, socket.flush()).await;
}
