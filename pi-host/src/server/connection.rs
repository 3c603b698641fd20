//! One WebSocket connection: reads requests, answers them, sends heartbeats, and ends with a
//! connection error when the host kills it (revoke, drain).

use super::subscriptions::{Delivery, Subscriptions};
use crate::auth::Credential;
use crate::connections::{CallPass, DeviceGate, Registration, Slot};
use crate::handlers::{self, ConnectionCall, Route};
use crate::state::HostState;
use crate::wire::{encode, to_value};
use axum::extract::ws::{Message, WebSocket};
use racp_proto::codec::{Rejected, decode_request};
use racp_proto::frame::{ErrorReply, RequestId, ResultReply};
use racp_proto::limits::PRE_HELLO_MAX_FRAME_BYTES;
use racp_proto::methods::handshake::{HelloParams, HelloResult};
use racp_proto::{AppError, Call, ErrorCode, Method, PROTOCOL_VERSION};
use racp_server::socket::{FINAL_FRAME_GRACE, close_with, error_reply, send_all};
use serde_json::{Value, json};
use std::sync::Arc;
use tokio::sync::{Semaphore, mpsc, watch};

/// Replies produced by request tasks, waiting for the socket.
const REPLY_QUEUE: usize = 256;

struct Connection {
    state: Arc<HostState>,
    credential: Credential,
    /// The device's gate: every call holds a pass from it while it runs (None when pairing).
    gate: Option<Arc<DeviceGate>>,
    /// Frame bound in bytes: 64 KiB before `hello`, then the negotiated bound.
    max_frame_bytes: usize,
    said_hello: bool,
    in_flight: Arc<Semaphore>,
    subs: Subscriptions,
    /// The rate budget this connection draws on: its device's, or its pairing token's.
    rate_key: String,
    /// Set when a reply must be followed by closing the connection (PROTOCOL_MISMATCH).
    fatal: Option<AppError>,
}

/// Frames a connection sends for its subscriptions before it looks at other work again.
const DELIVERY_BURST: usize = 8;

pub async fn run(mut socket: WebSocket, state: Arc<HostState>, credential: Credential, slot: Slot) {
    let device_id = credential.device_id().map(str::to_string);
    let Registration {
        id: connection_id,
        kill: mut kill_rx,
        gate,
        slot: _slot,
    } = state.connections.register(slot, device_id.clone());
    tracing::debug!(connection_id, device_id = ?device_id, "connection opened");
    let mut ending = ending_at_start(&state, &mut kill_rx, gate.as_deref());
    if let (Some(device_id), None) = (device_id, &ending) {
        touch_device(&state, device_id).await;
    }
    let mut conn = Connection::new(state.clone(), credential, gate);
    if ending.is_none() {
        ending = conn.serve(&mut socket, &mut kill_rx).await;
    }
    // Tells a waiting revoke that this connection sends nothing more but its final error.
    drop(kill_rx);
    if let Some(error) = ending {
        tracing::info!(
            code = %error.code(),
            message = error.message(),
            connection_id,
            "ending a connection"
        );
        // A client that stopped reading takes the final error only once it reads again (the
        // frame waits behind what fills its socket buffers); give it a while, then drop it.
        let _ = tokio::time::timeout(FINAL_FRAME_GRACE, close_with(&mut socket, error)).await;
    }
    drop(conn);
    state.connections.unregister(connection_id);
}

/// Checked after registering, never before: a revoke or drain that began in between either saw
/// this connection in the table or is seen here (racp-server/src/connections.rs).
fn ending_at_start(
    state: &HostState,
    kill_rx: &mut watch::Receiver<Option<AppError>>,
    gate: Option<&DeviceGate>,
) -> Option<AppError> {
    if let Some(killed) = kill_rx.borrow_and_update().clone() {
        return Some(killed);
    }
    if gate.is_some_and(DeviceGate::is_closed) {
        return Some(revoked());
    }
    state.is_draining().then(shutting_down)
}

/// Records the device's last-seen time: a synchronous SQLite write with fsync, on the blocking
/// pool, not on a runtime thread that serves other connections meanwhile.
async fn touch_device(state: &Arc<HostState>, device_id: String) {
    let store_state = state.clone();
    let touched = tokio::task::spawn_blocking(move || {
        store_state
            .store
            .touch_device(&device_id, crate::clock::now_ms())
    })
    .await;
    if let Ok(Err(err)) = touched {
        tracing::warn!(error = %err, "cannot record last-seen time");
    }
}

fn revoked() -> AppError {
    AppError::new(ErrorCode::RemoteAuthFailed, "this device was revoked")
}

fn shutting_down() -> AppError {
    AppError::new(
        ErrorCode::HostShuttingDown,
        "the host is shutting down; reconnect when it is back",
    )
}

impl Connection {
    fn new(state: Arc<HostState>, credential: Credential, gate: Option<Arc<DeviceGate>>) -> Self {
        let limits = &state.config.limits;
        Connection {
            in_flight: Arc::new(Semaphore::new(limits.max_in_flight as usize)),
            subs: Subscriptions::new(limits.max_lag_events, limits.max_events_per_frame),
            rate_key: match &credential {
                Credential::Device { device_id, .. } => device_id.clone(),
                Credential::Pairing { token_id, .. } => format!("pairing:{token_id}"),
            },
            state,
            credential,
            gate,
            max_frame_bytes: PRE_HELLO_MAX_FRAME_BYTES as usize,
            said_hello: false,
            fatal: None,
        }
    }

    /// The connection's loop: requests, replies, deliveries and heartbeats, until the client
    /// leaves (`None`) or the connection must end with an error.
    async fn serve(
        &mut self,
        socket: &mut WebSocket,
        kill_rx: &mut watch::Receiver<Option<AppError>>,
    ) -> Option<AppError> {
        let (reply_tx, mut reply_rx) = mpsc::channel::<String>(REPLY_QUEUE);
        let stall = self.state.config.limits.send_stall;
        let wake = self.subs.notify.clone();
        let mut heartbeat = tokio::time::interval(self.state.config.heartbeat);
        heartbeat.tick().await;
        loop {
            let (outgoing, ending) = tokio::select! {
                incoming = socket.recv() => match incoming {
                    // The client said goodbye or vanished: no connection error.
                    Some(Ok(Message::Close(_))) => {
                        super::answer_close(socket).await;
                        return None;
                    }
                    None => return None,
                    Some(Ok(message)) => self.on_message(message, &reply_tx),
                    Some(Err(err)) => {
                        tracing::debug!(error = %err, "connection read failed");
                        return self.read_failure(err);
                    }
                },
                Some(reply) = reply_rx.recv() => {
                    (vec![super::elide::fit_reply(reply, self.max_frame_bytes)], None)
                }
                _ = wake.notified() => self.deliveries(&wake),
                _ = heartbeat.tick(), if self.said_hello => {
                    (self.subs.heartbeat(crate::clock::now_ms(), self.max_frame_bytes), None)
                }
                changed = kill_rx.changed() => match changed {
                    Ok(()) => return kill_rx.borrow_and_update().clone(),
                    Err(_) => return None,
                },
            };
            // Once killed, nothing more leaves: a revoke may already have answered (it waits
            // for this loop to stop, and a write in progress is part of that wait).
            if let Some(killed) = kill_rx.borrow_and_update().clone() {
                return Some(killed);
            }
            if !outgoing.is_empty() {
                match tokio::time::timeout(stall, send_all(socket, outgoing)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return ending,
                    // The client stopped reading: the socket has not taken the frames in time.
                    Err(_) => return Some(self.subs.too_slow("stopped reading")),
                }
            }
            if ending.is_some() {
                return ending;
            }
        }
    }

    /// One message from the client: the frames to send back, and the error to end with after
    /// them, if any.
    fn on_message(
        &mut self,
        message: Message,
        replies: &mpsc::Sender<String>,
    ) -> (Vec<String>, Option<AppError>) {
        match message {
            Message::Text(text) => {
                let reply = self.handle_text(text.as_str(), replies);
                let frames = reply
                    .into_iter()
                    .map(|reply| super::elide::fit_reply(reply, self.max_frame_bytes))
                    .collect();
                (frames, self.fatal.take())
            }
            Message::Binary(_) => {
                let error = AppError::new(
                    ErrorCode::InvalidArgument,
                    "binary frames are not accepted; send UTF-8 JSON text frames",
                )
                .with_details(json!({"reason": "binary_frame"}));
                (vec![encode(&ErrorReply { id: None, error })], None)
            }
            // Close is handled by the loop.
            Message::Ping(_) | Message::Pong(_) | Message::Close(_) => (Vec::new(), None),
        }
    }

    /// Up to a burst of subscription frames; the rest waits for the next wake-up, so requests
    /// get a turn.
    fn deliveries(&mut self, wake: &tokio::sync::Notify) -> (Vec<String>, Option<AppError>) {
        let mut frames = Vec::new();
        while frames.len() < DELIVERY_BURST {
            match self.subs.next_delivery(self.max_frame_bytes) {
                Some(Delivery::Frame(frame)) => frames.push(frame),
                Some(Delivery::TooSlow(error)) => return (frames, Some(error)),
                None => break,
            }
        }
        if frames.len() == DELIVERY_BURST {
            wake.notify_one();
        }
        (frames, None)
    }

    /// Handles one text frame; returns a reply to send now, if any. Calls the connection does
    /// not answer itself run on their own task and reply through `replies`.
    fn handle_text(&mut self, text: &str, replies: &mpsc::Sender<String>) -> Option<String> {
        let request = match decode_request(text, self.max_frame_bytes) {
            Ok(request) => request,
            Err(Rejected { id, error }) => return Some(encode(&ErrorReply { id, error })),
        };
        let id = request.id;
        let (call, pass) = match self.admit(request.method, request.params) {
            Ok(admitted) => admitted,
            Err(error) => return Some(error_reply(id, error)),
        };
        match handlers::route(self.state.clone(), self.credential.clone(), call) {
            Route::Connection(call) => Some(self.answer_here(id, call)),
            Route::Task(answer) => self.spawn_answer(id, answer, pass, replies),
        }
    }

    /// Every check between a decoded envelope and a handler: hello first, access, rate, drain,
    /// params, and the device's gate (racp-server/src/connections.rs).
    fn admit(
        &mut self,
        method: Method,
        params: Option<&serde_json::value::RawValue>,
    ) -> Result<(Call, Option<CallPass>), AppError> {
        if !self.said_hello && method != Method::Hello {
            return Err(AppError::new(
                ErrorCode::HelloRequired,
                "say hello first: it must be the first call on a connection",
            ));
        }
        let rate_key = (method != Method::Hello).then_some(self.rate_key.as_str());
        let call = handlers::admit(&self.state, &self.credential, method, params, rate_key)?;
        let pass = self.enter().inspect_err(|error| {
            self.fatal = Some(error.clone());
        })?;
        Ok((call, pass))
    }

    /// Answers the calls that change this connection's own state.
    fn answer_here(&mut self, id: RequestId, call: ConnectionCall) -> String {
        let answer = match call {
            ConnectionCall::Hello(params) => self.hello(params).map(|r| to_value(&r)).inspect_err(
                // No common version: nothing more can be said on this connection.
                |error| self.fatal = Some(error.clone()),
            ),
            ConnectionCall::Subscribe(params) => self.subscribe(params).map(|r| to_value(&r)),
            ConnectionCall::Unsubscribe(params) => self
                .subs
                .unsubscribe(&params.subscription_id)
                .map(|()| to_value(&racp_proto::Ack {})),
        };
        match answer {
            Ok(Ok(result)) => encode(&ResultReply::<Value> { id, result }),
            Ok(Err(error)) | Err(error) => error_reply(id, error),
        }
    }

    /// Runs a call on its own task within the in-flight bounds (HOST_OVERLOADED beyond them);
    /// its reply goes through `replies`.
    fn spawn_answer(
        &self,
        id: RequestId,
        answer: handlers::Answer,
        pass: Option<CallPass>,
        replies: &mpsc::Sender<String>,
    ) -> Option<String> {
        let (Ok(permit), Ok(host_permit)) = (
            self.in_flight.clone().try_acquire_owned(),
            self.state.in_flight.clone().try_acquire_owned(),
        ) else {
            return Some(error_reply(
                id,
                AppError::new(ErrorCode::HostOverloaded, "too many calls in flight")
                    .with_details(json!({
                        "maxInFlight": self.state.config.limits.max_in_flight,
                        "maxInFlightHost": self.state.config.limits.max_in_flight_host,
                    }))
                    .with_retry_after_ms(50),
            ));
        };
        let replies = replies.clone();
        tokio::spawn(async move {
            let reply = match answer.await {
                Ok(result) => encode(&ResultReply::<Value> { id, result }),
                Err(error) => error_reply(id, error),
            };
            drop((permit, host_permit));
            let _ = replies.send(reply).await;
            // Held until the reply is queued: a revoke waits for it (racp-server/src/connections.rs).
            drop(pass);
        });
        None
    }

    /// A pass for one call, or the revocation that ends this connection.
    fn enter(&self) -> Result<Option<CallPass>, AppError> {
        match &self.gate {
            None => Ok(None),
            Some(gate) => gate.enter().map(Some).ok_or_else(revoked),
        }
    }

    fn subscribe(
        &mut self,
        params: racp_proto::methods::session::SessionSubscribeParams,
    ) -> Result<racp_proto::methods::session::SessionSubscribeResult, AppError> {
        let max = self.state.config.limits.max_subscriptions;
        if self.subs.len() >= max as usize {
            return Err(AppError::new(
                ErrorCode::LimitExceeded,
                format!("a connection may hold at most {max} subscriptions"),
            )
            .with_details(json!({"maxSubscriptions": max})));
        }
        let session = self.state.sessions.find(&params.session_id)?;
        let subscribed = self.subs.subscribe(session.clone(), params.cursor)?;
        // Someone who may prompt is watching: have the agent ready for their prompt. An
        // observer only reads the log and the snapshot, so it never starts one.
        let may_prompt = Method::TurnStart
            .spec()
            .access
            .check(Method::TurnStart.as_str(), &self.credential.principal())
            .is_ok();
        if may_prompt && !session.is_closing() {
            self.state.turns.warm(&self.state, &session);
        }
        Ok(subscribed)
    }

    fn hello(&mut self, params: HelloParams) -> Result<HelloResult, AppError> {
        let limits = &self.state.config.limits;
        let agreed = racp_server::hello::agree(
            &params,
            "host",
            limits.max_frame_bytes,
            limits.max_events_per_frame,
        )?;
        let (bound, per_push) = (agreed.max_frame_bytes, agreed.events_per_push);
        self.max_frame_bytes = bound as usize;
        self.subs.set_max_events_per_frame(per_push);
        self.said_hello = true;
        let principal = match &self.credential {
            Credential::Device { device_id, roles } => racp_server::hello::device(device_id, roles),
            Credential::Pairing { .. } => racp_server::hello::pairing(),
        };
        // A pairing connection can only pair: it is offered no features and no subscriptions.
        let pairing = matches!(self.credential, Credential::Pairing { .. });
        let capabilities = if pairing {
            Vec::new()
        } else {
            handlers::capabilities(&self.state)
        };
        let mut limits = handlers::limits(&self.state, bound, per_push);
        if pairing {
            limits.max_subscriptions = 0;
        }
        Ok(HelloResult {
            protocol: PROTOCOL_VERSION,
            host: handlers::host_identity(&self.state),
            principal,
            capabilities,
            limits,
            heartbeat_ms: u64::try_from(self.state.config.heartbeat.as_millis())
                .unwrap_or(u64::MAX),
        })
    }
}

impl Connection {
    /// The connection error to end with after a failed read when the client broke the rules:
    /// a message over the hard size cap, invalid UTF-8 in a text frame, or a WebSocket
    /// protocol violation. `None` when the link simply went away.
    fn read_failure(&self, err: axum::Error) -> Option<AppError> {
        racp_server::socket::read_failure(
            err,
            self.state.config.limits.max_frame_bytes,
            self.max_frame_bytes,
        )
    }
}
