//! A reconnecting RACP-WS client (feature `client`).
//!
//! One background task owns the WebSocket. Calls go to it over a channel and wait for their
//! reply with a timeout. When the link drops (read error, close, or silence for two heartbeat
//! intervals) every call in flight fails with HOST_DISCONNECTED, the task reconnects with
//! exponential backoff and jitter, says `hello` again, and resubscribes every subscription from
//! the cursor of the last event it handed out, so a subscriber sees each event exactly once, in
//! order. A cursor the host no longer has (CURSOR_EXPIRED) is recovered through `session/get`:
//! the subscriber receives [`SubscriptionItem::Resynced`] with the snapshot, then the events
//! after it. A refused credential (REMOTE_AUTH_FAILED and the pairing codes) stops the client:
//! retrying cannot help.

mod connection;
mod pin;

pub use connection::Backoff;
pub use pin::{PinnedVerifier, certificate_sha256};

use crate::events::Event;
use crate::fingerprint::CertSha256;
use crate::methods::session::{SessionGetResult, SessionSubscribeParams};
use crate::pi::stream::StreamState;
use crate::{AppError, Cursor, ErrorCode, ErrorSource, Method, RacpMethod};
use serde_json::Value;
use std::time::Duration;
use tokio::sync::{mpsc, oneshot, watch};

/// How to reach a host.
#[derive(Debug, Clone)]
pub struct ClientOptions {
    /// `wss://HOST:PORT/racp`, or `ws://127.0.0.1:PORT/racp` (loopback only, and only with
    /// [`ClientOptions::allow_plain_ws`]).
    pub url: String,
    /// A device token (or a pairing token, for `pair`).
    pub token: String,
    pub client_name: String,
    pub client_version: String,
    /// How long a call waits for its reply before failing with TIMEOUT.
    pub call_timeout: Duration,
    /// First reconnect delay; it doubles up to `max_backoff`, with jitter.
    pub min_backoff: Duration,
    pub max_backoff: Duration,
    /// For `wss://`: trust exactly this certificate (DER), e.g. a host's self-signed one.
    /// Without it the host's certificate must chain to the bundled web PKI roots.
    pub pinned_certificate: Option<Vec<u8>>,
    /// For `wss://`: accept exactly the certificate whose DER has this SHA-256 (pinned at
    /// pairing; no name, chain or expiry check). Any other certificate fails the handshake with
    /// HOST_IDENTITY_MISMATCH before anything is sent (docs/protocol.md §2.4).
    pub pinned_sha256: Option<CertSha256>,
    /// Send the token over unencrypted `ws://` (loopback only), for a host run with `--plain`.
    /// Nothing then proves the endpoint is the host: whoever holds the port gets the token.
    /// Off by default: a `ws://` URL is refused before connecting.
    pub allow_plain_ws: bool,
    /// Hand every event the host pushes to the subscriber as it came, even one at or below the
    /// subscription's cursor, instead of dropping it as a repeat. Off by default (a view never
    /// shows an event twice); a test of the host's delivery turns it on to see a host that
    /// repeats itself.
    pub strict_delivery: bool,
}

impl ClientOptions {
    pub fn new(url: impl Into<String>, token: impl Into<String>) -> Self {
        ClientOptions {
            url: url.into(),
            token: token.into(),
            client_name: "racp-client".into(),
            client_version: env!("CARGO_PKG_VERSION").into(),
            call_timeout: Duration::from_secs(30),
            min_backoff: Duration::from_millis(100),
            max_backoff: Duration::from_secs(10),
            pinned_certificate: None,
            pinned_sha256: None,
            allow_plain_ws: false,
            strict_delivery: false,
        }
    }
}

/// What a subscription yields, in order.
#[derive(Debug, Clone)]
pub enum SubscriptionItem {
    Event(Box<Event>),
    /// The host no longer had the events after the last cursor: here is the session's snapshot;
    /// events continue after its cursor.
    Resynced(Box<SessionGetResult>),
    /// The host ended the subscription (the session was closed).
    Ended,
    /// The subscription cannot continue (the client stopped, e.g. its credential was refused).
    Failed(AppError),
}

/// Where the client is.
#[derive(Debug, Clone, PartialEq)]
pub enum ClientState {
    Connecting,
    Connected,
    /// Stopped for good, with the reason (e.g. REMOTE_AUTH_FAILED).
    Stopped(AppError),
}

pub(crate) enum Command {
    Call {
        method: &'static str,
        params: Value,
        reply: oneshot::Sender<Result<Value, AppError>>,
    },
    Subscribe {
        session_id: String,
        cursor: Option<Cursor>,
        items: mpsc::UnboundedSender<SubscriptionItem>,
        reply: oneshot::Sender<Result<Cursor, AppError>>,
    },
}

/// A handle on the client; dropping every handle stops its task.
#[derive(Clone)]
pub struct RacpClient {
    commands: mpsc::UnboundedSender<Command>,
    state: watch::Receiver<ClientState>,
    call_timeout: Duration,
}

/// A subscription's items.
pub struct Subscription {
    pub items: mpsc::UnboundedReceiver<SubscriptionItem>,
    /// Where delivery started.
    pub cursor: Cursor,
    stream: StreamState,
}

impl Subscription {
    /// The next item, after applying it to [`Subscription::stream`]. Reading `items` directly
    /// skips that.
    pub async fn next(&mut self) -> Option<SubscriptionItem> {
        let item = self.items.recv().await?;
        match &item {
            SubscriptionItem::Event(event) => self.stream.apply_event(event),
            SubscriptionItem::Resynced(got) => {
                self.stream = StreamState::from_snapshot(&got.snapshot);
            }
            SubscriptionItem::Ended | SubscriptionItem::Failed(_) => {}
        }
        Some(item)
    }

    /// The assistant message and tool outputs streaming as of the last item [`next`] gave,
    /// rebuilt from the compact events (docs/protocol.md §8.1).
    ///
    /// [`next`]: Subscription::next
    pub fn stream(&self) -> &StreamState {
        &self.stream
    }

    /// Starts [`Subscription::stream`] from a snapshot, for a subscription that continues from
    /// a `session/get` cursor.
    pub fn resume_stream(&mut self, snapshot: &crate::methods::session::Snapshot) {
        self.stream = StreamState::from_snapshot(snapshot);
    }
}

pub(crate) fn disconnected(reason: &str) -> AppError {
    AppError::new(
        ErrorCode::HostDisconnected,
        format!("the connection to the host dropped ({reason}); the client is reconnecting"),
    )
    .with_source(ErrorSource::Client)
}

impl RacpClient {
    /// Starts the client and waits for its first connection; an error then is returned as is
    /// (the client retries only after it has been connected once).
    pub async fn connect(options: ClientOptions) -> Result<RacpClient, AppError> {
        connection::check_url(&options)?;
        let (commands, rx) = mpsc::unbounded_channel();
        let (state_tx, mut state) = watch::channel(ClientState::Connecting);
        let call_timeout = options.call_timeout;
        tokio::spawn(connection::run(options, rx, state_tx));
        loop {
            match &*state.borrow_and_update() {
                ClientState::Connected => break,
                ClientState::Stopped(error) => return Err(error.clone()),
                ClientState::Connecting => {}
            }
            if state.changed().await.is_err() {
                return Err(disconnected("the client task ended"));
            }
        }
        Ok(RacpClient {
            commands,
            state,
            call_timeout,
        })
    }

    pub fn state(&self) -> ClientState {
        self.state.borrow().clone()
    }

    /// Waits until the client is connected again (after a reconnect) or stopped.
    pub async fn wait_connected(&mut self) -> Result<(), AppError> {
        loop {
            match &*self.state.borrow_and_update() {
                ClientState::Connected => return Ok(()),
                ClientState::Stopped(error) => return Err(error.clone()),
                ClientState::Connecting => {}
            }
            if self.state.changed().await.is_err() {
                return Err(disconnected("the client task ended"));
            }
        }
    }

    /// Calls a method with typed params and result, waiting the client's call timeout plus
    /// the method's own deadline from the method table (`session/bash` is answered when its
    /// command ends).
    pub async fn call<M: RacpMethod>(&self, params: M::Params) -> Result<M::Result, AppError> {
        self.call_within::<M>(params, self.timeout_of(M::METHOD))
            .await
    }

    fn timeout_of(&self, method: Method) -> Duration {
        call_timeout_for(method, self.call_timeout)
    }

    /// [`RacpClient::call`] waiting `timeout` for the reply instead.
    pub async fn call_within<M: RacpMethod>(
        &self,
        params: M::Params,
        timeout: Duration,
    ) -> Result<M::Result, AppError> {
        let params = serde_json::to_value(params)
            .map_err(|e| AppError::new(ErrorCode::InvalidParams, e.to_string()))?;
        let value = self
            .call_raw_within(M::METHOD.as_str(), params, timeout)
            .await?;
        serde_json::from_value(value).map_err(|e| {
            AppError::new(
                ErrorCode::Internal,
                format!(
                    "the host's reply to {} has an unexpected shape: {e}",
                    M::METHOD.as_str()
                ),
            )
            .with_source(ErrorSource::Client)
        })
    }

    /// Calls a method with JSON params and returns the JSON result.
    pub async fn call_raw(&self, method: &'static str, params: Value) -> Result<Value, AppError> {
        self.call_raw_within(method, params, self.call_timeout)
            .await
    }

    async fn call_raw_within(
        &self,
        method: &'static str,
        params: Value,
        call_timeout: Duration,
    ) -> Result<Value, AppError> {
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Call {
                method,
                params,
                reply,
            })
            .map_err(|_| disconnected("the client stopped"))?;
        match tokio::time::timeout(call_timeout, answer).await {
            Ok(Ok(result)) => result,
            Ok(Err(_)) => Err(disconnected("the client stopped")),
            Err(_) => Err(AppError::new(
                ErrorCode::Timeout,
                format!(
                    "no reply to {method} within {} ms",
                    call_timeout.as_millis()
                ),
            )
            .with_source(ErrorSource::Client)),
        }
    }

    /// Subscribes to a session's events, from `cursor` (or from now). The subscription survives
    /// reconnects. From a cursor, [`Subscription::stream`] starts with what was streaming there
    /// (`session/stream`).
    pub async fn subscribe(
        &self,
        params: SessionSubscribeParams,
    ) -> Result<Subscription, AppError> {
        // From a cursor: what was streaming there, so a reply in progress rebuilds whole. An
        // error is not the subscription's (an expired cursor is met again, and resynced, below).
        let mut stream = StreamState::default();
        if let Some(cursor) = params.cursor {
            let at = self
                .call::<crate::calls::SessionStream>(crate::methods::session::SessionStreamParams {
                    session_id: params.session_id.clone(),
                    cursor,
                })
                .await;
            if let Ok(at) = at {
                stream = StreamState::resumed(at.streaming_message, at.tool_outputs);
            }
        }
        let (items_tx, items) = mpsc::unbounded_channel();
        let (reply, answer) = oneshot::channel();
        self.commands
            .send(Command::Subscribe {
                session_id: params.session_id,
                cursor: params.cursor,
                items: items_tx,
                reply,
            })
            .map_err(|_| disconnected("the client stopped"))?;
        let cursor = tokio::time::timeout(self.call_timeout, answer)
            .await
            .map_err(|_| {
                AppError::new(ErrorCode::Timeout, "no reply to session/subscribe")
                    .with_source(ErrorSource::Client)
            })?
            .map_err(|_| disconnected("the client stopped"))??;
        Ok(Subscription {
            items,
            cursor,
            stream,
        })
    }
}
/// How long a call waits for its reply: the client's call timeout, plus the method's own
/// deadline from the method table (`session/bash` is answered when its command ends).
pub fn call_timeout_for(method: Method, call_timeout: Duration) -> Duration {
    call_timeout + Duration::from_millis(method.spec().deadline_ms.unwrap_or(0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_call_waits_the_client_timeout_plus_its_methods_own_deadline_and_only_that() {
        let base = Duration::from_secs(30);
        assert_eq!(call_timeout_for(Method::SessionList, base), base);
        assert_eq!(
            call_timeout_for(Method::SessionBash, base),
            base + Duration::from_secs(crate::limits::SHELL_DEADLINE_SECONDS)
        );
    }
}
