//! The forward: a local 127.0.0.1 listener whose connections ride direct-tcpip channels to the
//! host's loopback port, and the supervisor that reconnects SSH when the link drops.
//!
//! The listener outlives SSH connections: while the link is down, new local connections wait
//! (up to [`LINK_WAIT`]) for the next one, so a RACP client simply reconnects to the same URL
//! and resumes by cursor. Each reconnect runs the bootstrap's stages again; they find the host
//! running and cost one probe.

use super::stage::{Progress, Reporter, Stage};
use super::{BootstrapOptions, Link, establish, ssh_failed};
use crate::provision::remote_shell::Probe;
use crate::ssh::SshSession;
use crate::ssh::forward::{self, ForwardTarget, LINK_WAIT, wait_for_target};
use racp_proto::client::Backoff;
use racp_proto::{AppError, ErrorCode, ErrorSource};
use std::sync::Arc;
use std::time::{Duration, Instant};
use tokio::net::TcpListener;
use tokio::sync::{Notify, watch};
use tokio::task::JoinHandle;

impl ForwardTarget for Link {
    fn session(&self) -> &SshSession {
        &self.session
    }

    fn port(&self) -> u16 {
        self.remote_port
    }
}
const MIN_BACKOFF: Duration = Duration::from_millis(200);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

type Current = watch::Sender<Option<Arc<Link>>>;

/// A running forward; dropping it stops the forward and the reconnects.
pub struct Forward {
    local_port: u16,
    links: Current,
    fatal: watch::Receiver<Option<AppError>>,
    tasks: Vec<JoinHandle<()>>,
}

impl Forward {
    pub(crate) async fn open(
        options: &BootstrapOptions,
        link: Link,
        reporter: Arc<dyn Reporter>,
    ) -> Result<Forward, AppError> {
        // Find out now whether the server forwards at all (AllowTcpForwarding no refuses at
        // once and leaves the session usable), rather than on the first client connection.
        let probe_channel = link
            .session
            .open_tcp("127.0.0.1", link.remote_port, options.channel_timeout)
            .await
            .map_err(|e| ssh_failed(Stage::Forward, e))?;
        drop(probe_channel);

        let preferred = match options.preferred_local_port {
            Some(port) => TcpListener::bind(("127.0.0.1", port)).await.ok(),
            None => None,
        };
        let listener = match preferred {
            Some(listener) => listener,
            None => bind_local(options.local_port).await?,
        };
        let local_port = listener
            .local_addr()
            .map_err(|e| local_failed(format!("cannot read the listener's address: {e}")))?
            .port();
        let (links, _) = watch::channel(Some(Arc::new(link)));
        let (fatal_tx, fatal) = watch::channel(None);
        let host_gone = Arc::new(Notify::new());
        let accept = tokio::spawn(forward::accept_loop(
            listener,
            links.subscribe(),
            options.channel_timeout,
            Some(host_gone.clone()),
        ));
        let supervisor = tokio::spawn(supervise(
            options.clone(),
            links.clone(),
            reporter,
            fatal_tx,
            host_gone,
        ));
        Ok(Forward {
            local_port,
            links,
            fatal,
            tasks: vec![accept, supervisor],
        })
    }

    /// `wss://127.0.0.1:PORT/racp`: TLS end to end with the host, so a client pinning the
    /// host's certificate knows it reached the host and not whatever else listens locally.
    pub fn url(&self) -> String {
        format!(
            "wss://127.0.0.1:{}{}",
            self.local_port,
            racp_proto::ENDPOINT_PATH
        )
    }

    pub fn local_port(&self) -> u16 {
        self.local_port
    }

    /// The host's port on the remote, while a link is up.
    pub fn remote_port(&self) -> Option<u16> {
        self.links.borrow().as_ref().map(|l| l.remote_port)
    }

    pub fn remote_root(&self) -> Option<String> {
        self.links.borrow().as_ref().map(|l| l.probe.root.clone())
    }

    /// How a person on the remote runs its pi-host ([`Probe::host_cli`]).
    pub fn host_cli(&self) -> Option<String> {
        self.links.borrow().as_ref().map(|l| l.probe.host_cli())
    }

    /// Whether an SSH link is up now.
    pub fn is_linked(&self) -> bool {
        self.links.borrow().is_some()
    }

    /// The current SSH session (waiting for a reconnect if the link is down).
    pub(crate) async fn current_link(&self) -> Result<(Arc<SshSession>, Probe), AppError> {
        let link = wait_for_target(self.links.subscribe(), LINK_WAIT)
            .await
            .ok_or_else(|| link_down("the SSH link is down"))?;
        Ok((link.session.clone(), link.probe.clone()))
    }

    /// Resolves when the forward has given up for good (e.g. the host key changed while
    /// reconnecting), with the reason.
    pub async fn failed(&mut self) -> AppError {
        loop {
            if let Some(error) = self.fatal.borrow_and_update().clone() {
                return error;
            }
            if self.fatal.changed().await.is_err() {
                return link_down("the forward stopped");
            }
        }
    }

    /// Stops accepting, ends the SSH session.
    pub async fn stop(mut self) {
        for task in self.tasks.drain(..) {
            task.abort();
        }
        let link = self.links.send_replace(None);
        if let Some(link) = link {
            link.session.disconnect().await;
        }
    }
}

impl Drop for Forward {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
    }
}

fn local_failed(message: String) -> AppError {
    AppError::new(ErrorCode::RemoteForwardFailed, message)
        .with_details(serde_json::json!({"reason": "local_listener"}))
        .with_source(ErrorSource::Bootstrap)
}

fn link_down(message: &str) -> AppError {
    AppError::new(ErrorCode::HostDisconnected, message).with_source(ErrorSource::Bootstrap)
}

async fn bind_local(port: u16) -> Result<TcpListener, AppError> {
    TcpListener::bind(("127.0.0.1", port)).await.map_err(|e| {
        local_failed(format!(
            "cannot listen on 127.0.0.1:{port}: {e}{}",
            if port != 0 {
                " (choose another --local-port, or 0 for any)"
            } else {
                ""
            }
        ))
    })
}

/// Failures that another attempt cannot fix: a changed or unknown host key, refused keys, a
/// version that cannot be had.
fn is_permanent(error: &AppError) -> bool {
    match error.code() {
        ErrorCode::HostVersionMismatch => true,
        ErrorCode::HostBootstrapFailed => {
            let reason = error.details().and_then(|d| d["reason"].as_str());
            matches!(reason, Some("host_key" | "authenticate" | "resolve"))
        }
        _ => false,
    }
}

async fn supervise(
    options: BootstrapOptions,
    links: Current,
    reporter: Arc<dyn Reporter>,
    fatal: watch::Sender<Option<AppError>>,
    host_gone: Arc<Notify>,
) {
    loop {
        let Some(link) = links.borrow().clone() else {
            return;
        };
        let error = link_lost(&link, &host_gone).await;
        links.send_replace(None);
        link.session.disconnect().await;
        drop(link);
        let lost = Instant::now();
        match reconnect(&options, reporter.as_ref(), error).await {
            Ok(link) => {
                let remote_port = link.remote_port;
                links.send_replace(Some(Arc::new(link)));
                reporter.report(Progress::Reconnected {
                    remote_port,
                    ms: lost.elapsed().as_millis() as u64,
                });
            }
            Err(err) => {
                reporter.report(Progress::Failed(err.clone()));
                let _ = fatal.send(Some(err));
                return;
            }
        }
    }
}

/// Waits until `link` is lost: its SSH session closed, or the host behind the forward gone
/// (crashed, killed, the remote rebooted its services). Both are mended by running the stages
/// again, which start the host when it is not running.
async fn link_lost(link: &Link, host_gone: &Notify) -> AppError {
    let mut closed = link.session.closed();
    let session_closed = async {
        while !*closed.borrow_and_update() {
            if closed.changed().await.is_err() {
                break;
            }
        }
    };
    tokio::select! {
        _ = session_closed => link_down("the SSH link dropped"),
        _ = host_gone.notified() => link_down("pi-host no longer listens on the remote"),
    }
}

/// Runs the stages again, with backoff, until they give a link or fail in a way another
/// attempt cannot fix. `error`: why the last link was lost.
async fn reconnect(
    options: &BootstrapOptions,
    reporter: &dyn Reporter,
    mut error: AppError,
) -> Result<Link, AppError> {
    let mut backoff = Backoff::new(MIN_BACKOFF, MAX_BACKOFF);
    let mut attempt = 1;
    loop {
        let delay = backoff.next_delay();
        reporter.report(Progress::Reconnecting {
            attempt,
            delay_ms: delay.as_millis() as u64,
            error: error.clone(),
        });
        tokio::time::sleep(delay).await;
        // The credential is the one connect stored: no token to mint.
        match establish(options, reporter, false).await {
            Ok((link, _, _)) => return Ok(link),
            Err(err) if is_permanent(&err) => return Err(err),
            Err(err) => error = err,
        }
        attempt += 1;
    }
}
