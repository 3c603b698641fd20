//! The client's background task: connect, say hello, resubscribe, relay, and reconnect.

use super::{ClientOptions, ClientState, Command, SubscriptionItem, disconnected};
use crate::codec::decode_server_frame;
use crate::events::{PushMethod, SessionEventsParams, SubscriptionEndedParams};
use crate::fingerprint::CertSha256;
use crate::frame::{RequestId, ServerFrame};
use crate::methods::handshake::HelloResult;
use crate::methods::session::{SessionGetResult, SessionSubscribeResult};
use crate::{AppError, Cursor, ErrorCode, ErrorSource, PROTOCOL_VERSION, SUBPROTOCOL};
use futures_util::{SinkExt, StreamExt};
use serde_json::value::RawValue;
use serde_json::{Value, json};
use std::collections::HashMap;
use std::time::Duration;
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use tokio::time::Instant;
use tokio_tungstenite::WebSocketStream;
use tokio_tungstenite::tungstenite::client::IntoClientRequest;
use tokio_tungstenite::tungstenite::http::HeaderValue;
use tokio_tungstenite::tungstenite::{self, Message};

/// A byte stream to the host: plain TCP or TLS over TCP.
trait Io: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send {}
impl<T: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin + Send> Io for T {}

type Socket = WebSocketStream<Box<dyn Io>>;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
/// A link up this long counts as healthy again.
const STABLE_LINK: Duration = Duration::from_secs(2);

/// Refuses a URL over which the token could reach someone other than the host: `ws://` to a
/// non-loopback address always, and `ws://` at all unless the caller opted into plain
/// WebSocket (docs/protocol.md §2.4). Nothing is connected when this fails.
pub(super) fn check_url(options: &ClientOptions) -> Result<(), AppError> {
    let url = options.url.as_str();
    let refuse = |why: &str, reason: &str| {
        AppError::new(
            ErrorCode::RemoteConnectionFailed,
            format!("cannot connect to {url}: {why}"),
        )
        .with_retriable(false)
        .with_details(json!({"reason": reason}))
        .with_source(ErrorSource::Client)
    };
    // Judged on the URL as the socket library parses it, so the host checked is the host
    // dialled: `ws://127.0.0.1:1@evil.example/` names evil.example, not loopback.
    let uri: tungstenite::http::Uri = url.parse().map_err(|_| refuse("not a URL", "bad_url"))?;
    let scheme = uri.scheme_str().unwrap_or("");
    let authority = uri.authority().map(|a| a.as_str()).unwrap_or("");
    if authority.contains('@') {
        return Err(refuse(
            "the URL carries a user name or password before the host; give the host's URL without them",
            "userinfo",
        ));
    }
    let host = uri.host().unwrap_or("");
    let loopback = host.eq_ignore_ascii_case("localhost")
        || host == "[::1]"
        || host
            .parse::<std::net::Ipv4Addr>()
            .is_ok_and(|ip| ip.is_loopback());
    match scheme {
        "ws" if !loopback => Err(refuse(
            "ws:// is only allowed to a loopback address; use wss://",
            "plain_not_loopback",
        )),
        "ws" if options.pinned_sha256.is_some() => Err(refuse(
            "this host's identity is pinned, which needs wss://; a plain ws:// endpoint cannot prove it is the host",
            "plain_refused",
        )),
        "ws" if !options.allow_plain_ws => Err(refuse(
            "refusing to send a token over plain ws://: nothing proves the endpoint is the host (another local process may hold the port); use the host's wss:// URL and its certificate fingerprint, or opt into plain WebSocket for a host run with --plain",
            "plain_refused",
        )),
        "ws" | "wss" => Ok(()),
        _ => Err(refuse("the scheme must be ws:// or wss://", "bad_url")),
    }
}

/// Codes that mean "this credential or client will never work here": stop, do not retry.
fn is_fatal(code: ErrorCode) -> bool {
    matches!(
        code,
        ErrorCode::RemoteAuthFailed
            | ErrorCode::PairingFailed
            | ErrorCode::PairingTokenExpired
            | ErrorCode::ProtocolMismatch
            | ErrorCode::Forbidden
            | ErrorCode::HostIdentityMismatch
    )
}

struct Sub {
    session_id: String,
    /// The cursor after the last event handed out (or where the subscription started).
    last: Option<Cursor>,
    /// The host's id for this subscription on the current connection.
    server_id: Option<String>,
    items: mpsc::UnboundedSender<SubscriptionItem>,
}

/// What a request in flight on this link waits for, by its id: a caller's reply, a
/// subscription's start (the first one answers its caller; a resubscription answers no one), or
/// the snapshot that resumes a subscription whose cursor expired.
enum InFlight {
    Call(oneshot::Sender<Result<Value, AppError>>),
    Subscribe {
        local: u64,
        reply: Option<oneshot::Sender<Result<Cursor, AppError>>>,
    },
    Resnapshot {
        local: u64,
    },
}

enum Ended {
    Reconnect(String),
    Stop(AppError),
    Shutdown,
}

/// Exponential backoff with jitter: each delay is the current step scaled by a factor in
/// [0.5, 1.0), so many clients do not retry in step; the step doubles up to `max`.
pub struct Backoff {
    min: Duration,
    max: Duration,
    step: Duration,
    // A small, dependency-free jitter source; randomness quality does not matter here.
    state: u64,
}

impl Backoff {
    pub fn new(min: Duration, max: Duration) -> Self {
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0x9e37_79b9);
        Backoff {
            min,
            max,
            step: min,
            state: seed | 1,
        }
    }

    /// The next delay to wait.
    pub fn next_delay(&mut self) -> Duration {
        self.state ^= self.state << 13;
        self.state ^= self.state >> 7;
        self.state ^= self.state << 17;
        let factor = 0.5 + (self.state % 1000) as f64 / 2000.0;
        let delay = self.step.mul_f64(factor);
        self.step = (self.step * 2).min(self.max);
        delay
    }

    /// Back to the shortest delay (after a link that stayed up).
    pub fn reset(&mut self) {
        self.step = self.min;
    }
}

pub(super) async fn run(
    options: ClientOptions,
    mut commands: mpsc::UnboundedReceiver<Command>,
    state: watch::Sender<ClientState>,
) {
    let mut subs: HashMap<u64, Sub> = HashMap::new();
    let mut next_local = 1u64;
    let mut backoff = Backoff::new(options.min_backoff, options.max_backoff);
    let mut connected_once = false;
    loop {
        let _ = state.send(ClientState::Connecting);
        let ended = match open(&options).await {
            Ok((socket, hello)) => {
                connected_once = true;
                let started = Instant::now();
                let mut link = Link {
                    socket,
                    next_id: 1,
                    in_flight: HashMap::new(),
                    heartbeat: Duration::from_millis(hello.heartbeat_ms.max(10)),
                    strict_delivery: options.strict_delivery,
                };
                let ended = link
                    .serve(&mut subs, &mut next_local, &mut commands, &state)
                    .await;
                // Only a link that lived a while resets the backoff: one that dies at once
                // (a host that keeps refusing something) must not make the client spin.
                if started.elapsed() >= STABLE_LINK {
                    backoff.reset();
                }
                ended
            }
            // The first attempt decides whether the client starts at all: the caller of
            // `connect` gets the error instead of a client that retries forever.
            Err(error) if is_fatal(error.code()) || !connected_once => Ended::Stop(error),
            Err(error) => Ended::Reconnect(error.message().to_string()),
        };
        match ended {
            Ended::Shutdown => return,
            Ended::Stop(error) => return stop(&error, &subs, &mut commands, &state).await,
            Ended::Reconnect(reason) => {
                tracing::debug!(%reason, "racp link lost; reconnecting");
                let _ = state.send(ClientState::Connecting);
                let deadline = Instant::now() + backoff.next_delay();
                if !refuse_until(deadline, &reason, &mut commands).await {
                    return;
                }
            }
        }
    }
}

/// The client stops for good with `error`: every subscription fails with it, and so does
/// whatever still arrives until every handle is gone.
async fn stop(
    error: &AppError,
    subs: &HashMap<u64, Sub>,
    commands: &mut mpsc::UnboundedReceiver<Command>,
    state: &watch::Sender<ClientState>,
) {
    let _ = state.send(ClientState::Stopped(error.clone()));
    for sub in subs.values() {
        let _ = sub.items.send(SubscriptionItem::Failed(error.clone()));
    }
    while let Some(command) = commands.recv().await {
        refuse(command, error);
    }
}

/// Refuses every command until `deadline`, the link being down for `reason`: the caller
/// decides whether to resend. False when every handle is gone.
async fn refuse_until(
    deadline: Instant,
    reason: &str,
    commands: &mut mpsc::UnboundedReceiver<Command>,
) -> bool {
    loop {
        tokio::select! {
            _ = tokio::time::sleep_until(deadline) => return true,
            command = commands.recv() => match command {
                Some(command) => refuse(command, &disconnected(reason)),
                None => return false,
            },
        }
    }
}

fn refuse(command: Command, error: &AppError) {
    match command {
        Command::Call { reply, .. } => {
            let _ = reply.send(Err(error.clone()));
        }
        Command::Subscribe { reply, .. } => {
            let _ = reply.send(Err(error.clone()));
        }
    }
}

/// A connection that failed before hello, worth retrying.
fn connect_failed(why: String) -> AppError {
    AppError::new(ErrorCode::RemoteConnectionFailed, why)
        .with_retriable(true)
        .with_source(ErrorSource::Client)
}

/// Connects, upgrades to RACP-WS with the token, and says hello.
async fn open(options: &ClientOptions) -> Result<(Socket, HelloResult), AppError> {
    let failed = connect_failed;
    let request = upgrade_request(options)?;
    let stream = tokio::time::timeout(CONNECT_TIMEOUT, dial(options, request.uri()))
        .await
        .map_err(|_| failed("the host did not answer in time".into()))??;
    let connected = tokio::time::timeout(
        CONNECT_TIMEOUT,
        tokio_tungstenite::client_async_with_config(request, stream, Some(websocket_config())),
    )
    .await
    .map_err(|_| failed("the host did not answer in time".into()))?;
    let (mut socket, _) = match connected {
        Ok(ok) => ok,
        Err(tungstenite::Error::Http(response)) => return Err(upgrade_refused(&response)),
        Err(err) => return Err(failed(format!("cannot connect: {err}"))),
    };
    let hello = hello(&mut socket, options).await?;
    Ok((socket, hello))
}

/// The HTTP upgrade request: the URL, the subprotocol and the token.
fn upgrade_request(
    options: &ClientOptions,
) -> Result<tungstenite::handshake::client::Request, AppError> {
    let failed = connect_failed;
    let mut request = options
        .url
        .as_str()
        .into_client_request()
        .map_err(|e| failed(format!("bad URL: {e}")))?;
    let headers = request.headers_mut();
    headers.insert(
        "Sec-WebSocket-Protocol",
        HeaderValue::from_static(SUBPROTOCOL),
    );
    let bearer = HeaderValue::from_str(&format!("Bearer {}", options.token))
        .map_err(|_| failed("the token has characters a header cannot carry".into()))?;
    headers.insert("Authorization", bearer);
    Ok(request)
}

/// The host's refusal of the upgrade: the RACP error in its body, else the HTTP status.
fn upgrade_refused(response: &tungstenite::http::Response<Option<Vec<u8>>>) -> AppError {
    let body: Value = response
        .body()
        .as_ref()
        .and_then(|b| serde_json::from_slice(b).ok())
        .unwrap_or(Value::Null);
    if body["error"].is_object() {
        crate::codec::error_from_wire(body["error"].clone())
    } else {
        connect_failed(format!(
            "the host refused the upgrade: HTTP {}",
            response.status()
        ))
    }
}

/// Says hello on a connection just upgraded and reads the host's answer.
async fn hello(socket: &mut Socket, options: &ClientOptions) -> Result<HelloResult, AppError> {
    let failed = connect_failed;
    let hello = json!({"id": 0, "method": "hello", "params": {
        "protocol": {"min": PROTOCOL_VERSION, "max": PROTOCOL_VERSION},
        "client": {"name": options.client_name, "version": options.client_version},
    }});
    socket
        .send(Message::Text(hello.to_string().into()))
        .await
        .map_err(|e| failed(format!("cannot say hello: {e}")))?;
    let reply = tokio::time::timeout(CONNECT_TIMEOUT, async {
        while let Some(message) = socket.next().await {
            if let Ok(Message::Text(text)) = message
                && let Ok(frame) = decode_server_frame(text.as_str())
            {
                return Some(frame);
            }
        }
        None
    })
    .await
    .map_err(|_| failed("no answer to hello".into()))?;
    match reply {
        Some(ServerFrame::Result { result, .. }) => serde_json::from_str(result.get())
            .map_err(|e| failed(format!("unreadable hello result: {e}"))),
        Some(ServerFrame::Error { error, .. } | ServerFrame::ConnectionError { error }) => {
            Err(error)
        }
        _ => Err(failed("the host closed the connection during hello".into())),
    }
}

/// Frames as large as one agent event can be (the host bounds those at 16 MiB of agent output).
fn websocket_config() -> tokio_tungstenite::tungstenite::protocol::WebSocketConfig {
    tokio_tungstenite::tungstenite::protocol::WebSocketConfig::default()
        .max_message_size(Some(64 << 20))
        .max_frame_size(Some(64 << 20))
}

/// Opens TCP to the URL's host, with TLS for `wss://` (ring provider; a pinned certificate or
/// the web PKI roots).
async fn dial(
    options: &ClientOptions,
    uri: &tokio_tungstenite::tungstenite::http::Uri,
) -> Result<Box<dyn Io>, AppError> {
    use tokio_rustls::rustls::pki_types::ServerName;
    let failed = connect_failed;
    let secure = uri.scheme_str() == Some("wss");
    let host = uri
        .host()
        .ok_or_else(|| failed("the URL has no host".into()))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri.port_u16().unwrap_or(if secure { 443 } else { 80 });
    let tcp = TcpStream::connect((host.as_str(), port))
        .await
        .map_err(|e| failed(format!("cannot connect to {host}:{port}: {e}")))?;
    let _ = tcp.set_nodelay(true);
    if !secure {
        return Ok(Box::new(tcp));
    }
    let (config, mismatch) = tls_config(options)?;
    let name = ServerName::try_from(host.clone())
        .map_err(|_| failed(format!("{host} is not a valid TLS server name")))?;
    let tls = tokio_rustls::TlsConnector::from(std::sync::Arc::new(config))
        .connect(name, tcp)
        .await;
    match tls {
        Ok(tls) => Ok(Box::new(tls)),
        Err(e) => {
            let found = mismatch
                .as_ref()
                .and_then(|slot| slot.lock().ok().and_then(|found| *found));
            match (found, options.pinned_sha256) {
                (Some(found), Some(expected)) => Err(identity_mismatch(
                    &format!("{host}:{port}"),
                    expected,
                    found,
                )),
                _ => Err(failed(format!(
                    "TLS with {host}:{port} failed (certificate not trusted?): {e}"
                ))),
            }
        }
    }
}

/// What a pinned-fingerprint verifier saw when it refused: the certificate it found.
type Mismatch = std::sync::Arc<std::sync::Mutex<Option<CertSha256>>>;

/// The TLS client configuration: the pinned fingerprint when there is one (with where its
/// verifier records a mismatch), else the pinned certificate, else the web PKI roots.
fn tls_config(
    options: &ClientOptions,
) -> Result<(tokio_rustls::rustls::ClientConfig, Option<Mismatch>), AppError> {
    use tokio_rustls::rustls::{self, ClientConfig, RootCertStore};
    let failed = connect_failed;
    let provider = std::sync::Arc::new(rustls::crypto::ring::default_provider());
    let builder = ClientConfig::builder_with_provider(provider.clone())
        .with_safe_default_protocol_versions()
        .map_err(|e| failed(format!("TLS setup failed: {e}")))?;
    match (&options.pinned_sha256, &options.pinned_certificate) {
        (Some(expected), _) => {
            let verifier = super::pin::PinnedVerifier::new(*expected, &provider);
            let mismatch = verifier.mismatch();
            let config = builder
                .dangerous()
                .with_custom_certificate_verifier(std::sync::Arc::new(verifier))
                .with_no_client_auth();
            Ok((config, Some(mismatch)))
        }
        (None, pinned) => {
            let mut roots = RootCertStore::empty();
            match pinned {
                Some(der) => roots
                    .add(der.clone().into())
                    .map_err(|e| failed(format!("the pinned certificate is unusable: {e}")))?,
                None => roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned()),
            }
            Ok((
                builder.with_root_certificates(roots).with_no_client_auth(),
                None,
            ))
        }
    }
}

/// The endpoint presented a certificate other than the pinned one. Nothing has been sent: the
/// handshake stops before the HTTP upgrade that carries the token.
fn identity_mismatch(endpoint: &str, expected: CertSha256, found: CertSha256) -> AppError {
    AppError::new(
        ErrorCode::HostIdentityMismatch,
        format!(
            "the endpoint at {endpoint} is not the host this device paired with: its certificate \
             has SHA-256 {found}, the pinned one is {expected}. Nothing was sent. Another process \
             may hold the port, or the host's identity was reset; re-pair only if you trust the \
             change"
        ),
    )
    .with_details(json!({"expected": expected.to_hex(), "found": found.to_hex()}))
    .with_source(ErrorSource::Client)
}

struct Link {
    socket: Socket,
    next_id: u64,
    in_flight: HashMap<u64, InFlight>,
    heartbeat: Duration,
    /// [`ClientOptions::strict_delivery`].
    strict_delivery: bool,
}

impl Link {
    async fn send(&mut self, method: &str, params: Value, awaits: InFlight) -> Result<(), String> {
        let id = self.next_id;
        self.next_id += 1;
        let frame = json!({"id": id, "method": method, "params": params});
        self.in_flight.insert(id, awaits);
        self.socket
            .send(Message::Text(frame.to_string().into()))
            .await
            .map_err(|e| format!("send failed: {e}"))
    }

    async fn subscribe(
        &mut self,
        local: u64,
        sub: &Sub,
        reply: Option<oneshot::Sender<Result<Cursor, AppError>>>,
    ) -> Result<(), String> {
        let mut params = json!({"sessionId": sub.session_id});
        if let Some(cursor) = sub.last {
            params["cursor"] = json!(cursor);
        }
        self.send(
            "session/subscribe",
            params,
            InFlight::Subscribe { local, reply },
        )
        .await
    }

    async fn serve(
        &mut self,
        subs: &mut HashMap<u64, Sub>,
        next_local: &mut u64,
        commands: &mut mpsc::UnboundedReceiver<Command>,
        state: &watch::Sender<ClientState>,
    ) -> Ended {
        let ended = self.relay(subs, next_local, commands, state).await;
        // Calls in flight cannot be answered any more; resubscriptions are redone next time.
        let reason = match &ended {
            Ended::Reconnect(reason) => reason.clone(),
            Ended::Stop(error) => error.message().to_string(),
            Ended::Shutdown => "the client stopped".into(),
        };
        for (_, request) in self.in_flight.drain() {
            match request {
                InFlight::Call(reply) => {
                    let _ = reply.send(Err(disconnected(&reason)));
                }
                InFlight::Subscribe {
                    local,
                    reply: Some(reply),
                } => {
                    subs.remove(&local);
                    let _ = reply.send(Err(disconnected(&reason)));
                }
                InFlight::Subscribe { reply: None, .. } | InFlight::Resnapshot { .. } => {}
            }
        }
        for sub in subs.values_mut() {
            sub.server_id = None;
        }
        let _ = self.socket.close(None).await;
        ended
    }

    async fn relay(
        &mut self,
        subs: &mut HashMap<u64, Sub>,
        next_local: &mut u64,
        commands: &mut mpsc::UnboundedReceiver<Command>,
        state: &watch::Sender<ClientState>,
    ) -> Ended {
        let locals: Vec<u64> = subs.keys().copied().collect();
        for local in locals {
            let Some(sub) = subs.get(&local) else {
                continue;
            };
            if let Err(reason) = self.subscribe(local, sub, None).await {
                return Ended::Reconnect(reason);
            }
        }
        let _ = state.send(ClientState::Connected);
        let mut last_heard = Instant::now();
        loop {
            let silence_deadline = last_heard + self.heartbeat * 2;
            tokio::select! {
                message = self.socket.next() => {
                    let text = match message {
                        Some(Ok(Message::Text(text))) => text,
                        Some(Ok(Message::Close(_))) | None => return Ended::Reconnect("the host closed the connection".into()),
                        Some(Err(err)) => return Ended::Reconnect(format!("read failed: {err}")),
                        Some(Ok(_)) => { last_heard = Instant::now(); continue; }
                    };
                    last_heard = Instant::now();
                    let Ok(frame) = decode_server_frame(text.as_str()) else { continue };
                    if let Some(ended) = self.on_frame(frame, subs).await {
                        return ended;
                    }
                }
                command = commands.recv() => {
                    let Some(command) = command else { return Ended::Shutdown };
                    let sent = match command {
                        Command::Call { method, params, reply } => self.send(method, params, InFlight::Call(reply)).await,
                        Command::Subscribe { session_id, cursor, items, reply } => {
                            let local = *next_local;
                            *next_local += 1;
                            let sub = Sub { session_id, last: cursor, server_id: None, items };
                            let sent = self.subscribe(local, &sub, Some(reply)).await;
                            subs.insert(local, sub);
                            sent
                        }
                    };
                    if let Err(reason) = sent {
                        return Ended::Reconnect(reason);
                    }
                }
                _ = tokio::time::sleep_until(silence_deadline) => {
                    return Ended::Reconnect("no frame for two heartbeat intervals".into());
                }
            }
        }
    }

    async fn on_frame(
        &mut self,
        frame: ServerFrame,
        subs: &mut HashMap<u64, Sub>,
    ) -> Option<Ended> {
        match frame {
            ServerFrame::Result { id, result } => {
                let request = self.take(&id)?;
                self.on_result(request, &result, subs).await
            }
            ServerFrame::Error { id, error } => {
                let request = self.take(&id?)?;
                self.on_error(request, error, subs).await
            }
            ServerFrame::Push { method, params } => {
                on_push(&method, &params, subs, self.strict_delivery);
                None
            }
            ServerFrame::ConnectionError { error } => Some(if is_fatal(error.code()) {
                Ended::Stop(error)
            } else {
                Ended::Reconnect(format!("{}: {}", error.code(), error.message()))
            }),
        }
    }

    /// A request succeeded: answer its caller, start its subscription, or resume one from the
    /// snapshot it fetched.
    async fn on_result(
        &mut self,
        request: InFlight,
        result: &RawValue,
        subs: &mut HashMap<u64, Sub>,
    ) -> Option<Ended> {
        match request {
            InFlight::Call(reply) => {
                let value = serde_json::from_str(result.get()).unwrap_or(Value::Null);
                let _ = reply.send(Ok(value));
            }
            InFlight::Subscribe { local, reply } => {
                let parsed: Option<SessionSubscribeResult> =
                    serde_json::from_str(result.get()).ok();
                if let (Some(sub), Some(parsed)) = (subs.get_mut(&local), parsed) {
                    sub.server_id = Some(parsed.subscription_id);
                    sub.last = Some(sub.last.unwrap_or(parsed.cursor));
                    if let Some(reply) = reply {
                        let _ = reply.send(Ok(parsed.cursor));
                    }
                }
            }
            InFlight::Resnapshot { local } => {
                let snapshot: Option<SessionGetResult> = serde_json::from_str(result.get()).ok();
                let sub = subs.get_mut(&local)?;
                let snapshot = snapshot?;
                sub.last = Some(snapshot.cursor);
                let _ = sub
                    .items
                    .send(SubscriptionItem::Resynced(Box::new(snapshot)));
                let sub = subs.get(&local)?;
                if let Err(reason) = self.subscribe(local, sub, None).await {
                    return Some(Ended::Reconnect(reason));
                }
            }
        }
        None
    }

    /// A request failed: tell its caller or its subscriber. A resubscription whose cursor
    /// expired recovers through a snapshot instead.
    async fn on_error(
        &mut self,
        request: InFlight,
        error: AppError,
        subs: &mut HashMap<u64, Sub>,
    ) -> Option<Ended> {
        match request {
            InFlight::Call(reply) => {
                let _ = reply.send(Err(error));
            }
            InFlight::Subscribe { local, reply } if error.code() == ErrorCode::CursorExpired => {
                // Recover through a snapshot; the first subscribe answers when it lands.
                if let Some(reply) = reply {
                    subs.remove(&local);
                    let _ = reply.send(Err(error));
                    return None;
                }
                let session_id = subs.get(&local)?.session_id.clone();
                if let Err(reason) = self
                    .send(
                        "session/get",
                        json!({"sessionId": session_id}),
                        InFlight::Resnapshot { local },
                    )
                    .await
                {
                    return Some(Ended::Reconnect(reason));
                }
            }
            InFlight::Subscribe { local, reply } => {
                let sub = subs.remove(&local)?;
                match reply {
                    Some(reply) => {
                        let _ = reply.send(Err(error));
                    }
                    None => {
                        let _ = sub.items.send(SubscriptionItem::Failed(error));
                    }
                }
            }
            InFlight::Resnapshot { local } => {
                let sub = subs.remove(&local)?;
                let _ = sub.items.send(SubscriptionItem::Failed(error));
            }
        }
        None
    }

    fn take(&mut self, id: &RequestId) -> Option<InFlight> {
        match id {
            RequestId::Number(n) => self.in_flight.remove(n),
            RequestId::Text(_) => None,
        }
    }
}

/// A push: events go to their subscription (none at or below its cursor is repeated),
/// `subscription/ended` ends one. `None`: a push this client cannot read or place, dropped.
fn on_push(
    method: &str,
    params: &RawValue,
    subs: &mut HashMap<u64, Sub>,
    strict_delivery: bool,
) -> Option<()> {
    match PushMethod::from_name(method)? {
        PushMethod::SessionEvents => {
            let push: SessionEventsParams = serde_json::from_str(params.get()).ok()?;
            let sub = subs
                .values_mut()
                .find(|s| s.server_id.as_deref() == Some(push.subscription_id.as_str()))?;
            for event in push.events {
                // After a reconnect the host replays from our cursor; never repeat (unless asked
                // to hand over whatever the host sends).
                if !strict_delivery
                    && sub
                        .last
                        .is_some_and(|c| c.epoch == event.cursor.epoch && event.seq <= c.seq)
                {
                    continue;
                }
                sub.last = Some(event.cursor);
                let _ = sub.items.send(SubscriptionItem::Event(Box::new(event)));
            }
        }
        PushMethod::SubscriptionEnded => {
            let push: SubscriptionEndedParams = serde_json::from_str(params.get()).ok()?;
            let local = subs
                .iter()
                .find(|(_, s)| s.server_id.as_deref() == Some(push.subscription_id.as_str()))
                .map(|(local, _)| *local)?;
            if let Some(sub) = subs.remove(&local) {
                let _ = sub.items.send(SubscriptionItem::Ended);
            }
        }
        PushMethod::Heartbeat => {}
    }
    Some(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A `session/events` push of one event with `seq` for subscription `sub_1`.
    fn events_push(seq: u64) -> Box<RawValue> {
        let event = json!({
            "seq": seq, "cursor": format!("{:016x}-{seq}", 7), "type": "turn.started",
            "at": 1, "data": {},
        });
        let params = json!({"subscriptionId": "sub_1", "sessionId": "s", "events": [event]});
        RawValue::from_string(params.to_string()).unwrap()
    }

    /// The seqs a subscriber is handed for pushes of `seqs`, strict or not.
    fn handed_out(seqs: &[u64], strict: bool) -> Vec<u64> {
        let (items, mut received) = mpsc::unbounded_channel();
        let mut subs = HashMap::from([(
            1,
            Sub {
                session_id: "s".into(),
                last: None,
                server_id: Some("sub_1".into()),
                items,
            },
        )]);
        for &seq in seqs {
            on_push("session/events", &events_push(seq), &mut subs, strict);
        }
        let mut out = Vec::new();
        while let Ok(item) = received.try_recv() {
            if let SubscriptionItem::Event(event) = item {
                out.push(event.seq);
            }
        }
        out
    }

    #[test]
    fn a_repeated_event_is_dropped_unless_delivery_is_strict() {
        assert_eq!(handed_out(&[1, 2, 2, 1, 3], false), [1, 2, 3]);
        assert_eq!(handed_out(&[1, 2, 2, 1, 3], true), [1, 2, 2, 1, 3]);
        // A gap is never hidden.
        assert_eq!(handed_out(&[1, 3], false), [1, 3]);
    }

    #[test]
    fn plain_ws_only_to_loopback_and_only_when_asked_for() {
        let check = |url: &str, allow_plain_ws: bool, pinned: bool| {
            let mut options = ClientOptions::new(url, "t");
            options.allow_plain_ws = allow_plain_ws;
            options.pinned_sha256 = pinned.then_some(CertSha256([7; 32]));
            check_url(&options)
        };
        for url in [
            "ws://127.0.0.1:7878/racp",
            "ws://localhost:1/racp",
            "ws://[::1]:1/racp",
        ] {
            assert!(check(url, true, false).is_ok(), "{url}");
            let refused = check(url, false, false).unwrap_err();
            assert_eq!(refused.code(), ErrorCode::RemoteConnectionFailed);
            assert_eq!(refused.details().unwrap()["reason"], "plain_refused");
            // A pin cannot be checked without TLS, whatever the opt-in says.
            assert!(check(url, true, true).is_err(), "{url}");
        }
        assert!(check("wss://example.com:7878/racp", false, false).is_ok());
        assert!(check("wss://127.0.0.1:7878/racp", false, true).is_ok());
        for bad in [
            "ws://192.168.1.5:7878/racp",
            "ws://example.com/racp",
            "http://127.0.0.1/racp",
            "nonsense",
        ] {
            let err = check(bad, true, false).unwrap_err();
            assert_eq!(err.code(), ErrorCode::RemoteConnectionFailed, "{bad}");
        }
    }

    #[test]
    fn loopback_is_judged_on_the_host_dialled_and_userinfo_is_refused() {
        let check = |url: &str| {
            let mut options = ClientOptions::new(url, "t");
            options.allow_plain_ws = true;
            check_url(&options).map_err(|e| e.details().map(|d| d["reason"].clone()))
        };
        for url in [
            "ws://127.0.0.1:1@evil.example/racp",
            "ws://localhost:80@evil.example/racp",
            "ws://[::1]@evil.example/racp",
            "ws://user:pass@127.0.0.1:7878/racp",
            "wss://user@example.com/racp",
        ] {
            assert_eq!(check(url), Err(Some(json!("userinfo"))), "{url}");
        }
        assert_eq!(
            check("ws://127.0.0.1.evil.example/racp"),
            Err(Some(json!("plain_not_loopback")))
        );
        assert_eq!(
            check("ws://localhost.evil.example:80/racp"),
            Err(Some(json!("plain_not_loopback")))
        );
        assert!(check("ws://127.0.0.2:7878/racp").is_ok());
        assert!(check("ws://LOCALHOST:7878/racp").is_ok());
    }

    #[test]
    fn jitter_stays_within_half_to_full() {
        let second = Duration::from_millis(1000);
        let mut backoff = Backoff::new(second, second);
        for _ in 0..1000 {
            let d = backoff.next_delay();
            assert!(d >= Duration::from_millis(500) && d < second);
        }
    }

    #[test]
    fn backoff_doubles_up_to_its_maximum_and_resets() {
        let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_millis(400));
        let steps: Vec<Duration> = (0..4).map(|_| backoff.next_delay()).collect();
        let within = |d: Duration, step: u64| {
            d >= Duration::from_millis(step / 2) && d < Duration::from_millis(step)
        };
        assert!(within(steps[0], 100) && within(steps[1], 200));
        assert!(within(steps[2], 400) && within(steps[3], 400));
        backoff.reset();
        assert!(within(backoff.next_delay(), 100));
    }
}
