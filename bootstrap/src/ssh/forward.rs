//! A local port forward: connections accepted on a local listener ride direct-tcpip channels to
//! a port on the remote's loopback.
//!
//! Only connections from this process's own user are relayed (Linux; see [`super::peer_uid`]).
//!
//! The target sits behind a watch channel so the listener can outlive an SSH connection: while
//! it is `None` (the link is down), new local connections wait up to [`LINK_WAIT`] for the next
//! one instead of failing.

use crate::ssh::{SshError, SshSession};
use std::sync::Arc;
use std::time::Duration;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, watch};

/// How long a local connection waits for the SSH link to come back.
pub const LINK_WAIT: Duration = Duration::from_secs(30);

/// Where forwarded connections go.
pub trait ForwardTarget: Send + Sync + 'static {
    fn session(&self) -> &SshSession;
    /// The port on the remote's 127.0.0.1.
    fn port(&self) -> u16;
}

/// A fixed session and port.
pub struct Target {
    pub session: Arc<SshSession>,
    pub port: u16,
}

impl ForwardTarget for Target {
    fn session(&self) -> &SshSession {
        &self.session
    }

    fn port(&self) -> u16 {
        self.port
    }
}

/// The current target, waiting up to `patience` while there is none.
pub async fn wait_for_target<T: ForwardTarget>(
    mut targets: watch::Receiver<Option<Arc<T>>>,
    patience: Duration,
) -> Option<Arc<T>> {
    tokio::time::timeout(patience, async {
        loop {
            if let Some(target) = targets.borrow_and_update().clone() {
                return Some(target);
            }
            if targets.changed().await.is_err() {
                return None;
            }
        }
    })
    .await
    .ok()
    .flatten()
}

/// Accepts local connections forever, relaying each through its own channel. When nothing
/// listens at the target port on the remote (the server answers "connect failed"),
/// `target_gone` is notified: the owner may restart what should be listening there.
pub async fn accept_loop<T: ForwardTarget>(
    listener: TcpListener,
    targets: watch::Receiver<Option<Arc<T>>>,
    channel_timeout: Duration,
    target_gone: Option<Arc<Notify>>,
) {
    // Where peers connect to, for telling their sockets apart from ours in /proc/net/tcp.
    let local = listener.local_addr().ok();
    loop {
        let socket = match listener.accept().await {
            Ok((socket, peer)) => {
                // Another local user could otherwise reach the host through this forward
                // (docs/reliability.md §4.11); close such a connection before relaying a byte.
                if let Some(local) = local
                    && let Err(why) = super::peer_uid::same_user(peer, local)
                {
                    tracing::warn!(%peer, %why, "refused a forward connection from another user");
                    drop(socket);
                    continue;
                }
                socket
            }
            Err(err) => {
                // Out of file descriptors and the like: wait a little rather than spin.
                tracing::warn!(%err, "accept failed");
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let targets = targets.clone();
        let target_gone = target_gone.clone();
        tokio::spawn(async move {
            match relay(socket, targets, channel_timeout).await {
                Ok(()) => {}
                Err(RelayFailure::TargetGone(err)) => {
                    tracing::debug!(%err, "nothing listens at the forward's target");
                    if let Some(gone) = target_gone {
                        gone.notify_waiters();
                    }
                }
                Err(RelayFailure::Other(err)) => {
                    tracing::debug!(%err, "forwarded connection ended")
                }
            }
        });
    }
}

/// Why one relayed connection ended.
enum RelayFailure {
    TargetGone(String),
    Other(String),
}

async fn relay<T: ForwardTarget>(
    mut socket: TcpStream,
    targets: watch::Receiver<Option<Arc<T>>>,
    channel_timeout: Duration,
) -> Result<(), RelayFailure> {
    let _ = socket.set_nodelay(true);
    let target = wait_for_target(targets, LINK_WAIT)
        .await
        .ok_or_else(|| RelayFailure::Other("the SSH link did not come back".into()))?;
    let mut channel = target
        .session()
        .open_tcp("127.0.0.1", target.port(), channel_timeout)
        .await
        .map_err(|e| match e {
            SshError::ChannelOpen {
                prohibited: false, ..
            } => RelayFailure::TargetGone(e.to_string()),
            other => RelayFailure::Other(other.to_string()),
        })?;
    // Drained promptly in both directions: a channel whose queue fills up stalls russh's
    // session loop, and with it every other channel of the connection.
    tokio::io::copy_bidirectional_with_sizes(&mut socket, &mut channel, 64 << 10, 64 << 10)
        .await
        .map(|_| ())
        .map_err(|e| RelayFailure::Other(e.to_string()))
}
