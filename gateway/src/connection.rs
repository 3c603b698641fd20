//! One desktop connection to the gateway: the host's protocol (hello first, access by role,
//! rate, params, in-flight bounds, heartbeats, the frame bound), with each call answered by the
//! gateway (`hello`, `pair`, `host/list`, devices, pairing, subscriptions) or routed to the
//! connection's host over NATS.

use crate::devices::Caller;
use crate::follow::{self, Follow, Outgoing, Span};
use crate::hosts;
use crate::revocation::Revocation;
use crate::state::{Gateway, shutting_down};
use axum::extract::ws::{Message, WebSocket};
use racp_proto::codec::{Rejected, decode_request};
use racp_proto::frame::{ErrorReply, RequestId, ResultReply};
use racp_proto::gateway::{events_stream, events_subject, valid_session_id};
use racp_proto::limits::PRE_HELLO_MAX_FRAME_BYTES;
use racp_proto::methods::handshake::{HelloParams, HelloResult, HostIdentity, Limits};
use racp_proto::methods::host::{DeviceInfo, DeviceListResult, PairingCreateResult};
use racp_proto::methods::session::{SessionState, SessionSubscribeParams, SessionSubscribeResult};
use racp_proto::{AppError, Call, Cursor, Epoch, ErrorCode, Expired, Method, PROTOCOL_VERSION};
use racp_server::connections::{CallPass, DeviceGate, Registration, Slot};
use racp_server::elide::fit_reply;
use racp_server::identity::pairing_link;
use racp_server::socket::{FINAL_FRAME_GRACE, close_with, error_reply, send_all};
use racp_server::wire::encode;
use serde_json::value::RawValue;
use serde_json::{Value, json};
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Semaphore, mpsc};

const REPLY_QUEUE: usize = 256;
/// How long a subscribe behind the host's head waits for the host's relay to put the session's
/// events in a stream that holds none of them, before it answers CURSOR_EXPIRED.
const RELAY_WAIT: Duration = Duration::from_secs(3);
/// Frames subscription tasks may queue for the socket before they wait (and stop pulling from
/// JetStream): a slow desktop slows only its own consumers.
const OUTGOING_QUEUE: usize = 32;
const CAPABILITIES: &[&str] = &[
    "pairing",
    "devices",
    "sessions",
    "turns",
    "approvals",
    "fs",
    "models",
    "credentials",
    "hosts",
];

struct Connection {
    gateway: Arc<Gateway>,
    caller: Caller,
    /// The device's gate: every call but a revoke holds a pass from it while it runs.
    gate: Option<Arc<DeviceGate>>,
    /// The host this connection reaches (`/racp/hosts/<id>`); `None` on `/racp`.
    host: Option<String>,
    /// The address the desktop reached the gateway at (its Host header).
    reached_as: String,
    max_frame_bytes: usize,
    /// Most events per push, as agreed at `hello`.
    events_per_push: usize,
    said_hello: bool,
    in_flight: Arc<Semaphore>,
    follows: BTreeMap<String, Follow>,
    next_subscription: u64,
    fatal: Option<AppError>,
}

pub async fn run(
    mut socket: WebSocket,
    gateway: Arc<Gateway>,
    caller: Caller,
    host: Option<String>,
    slot: Slot,
    reached_as: String,
) {
    let device_id = caller.device_id().map(str::to_string);
    let Registration {
        id,
        kill: mut killed,
        gate,
        slot: _slot,
    } = gateway.connections.register(slot, device_id.clone());
    // Checked after registering, never before: a revoke or drain that began in between either
    // saw this connection in the table or is seen here.
    let ending_at_start = if let Some(killed) = killed.borrow_and_update().clone() {
        Some(killed)
    } else if gate.as_deref().is_some_and(DeviceGate::is_closed)
        || device_id.is_some_and(|d| gateway.devices.is_revoked(&d))
    {
        Some(revoked())
    } else {
        gateway.is_draining().then(shutting_down)
    };
    let mut conn = Connection {
        in_flight: Arc::new(Semaphore::new(gateway.settings.max_in_flight as usize)),
        gateway: gateway.clone(),
        caller,
        gate,
        host,
        reached_as,
        max_frame_bytes: PRE_HELLO_MAX_FRAME_BYTES as usize,
        events_per_push: gateway.settings.max_events_per_frame,
        said_hello: false,
        follows: BTreeMap::new(),
        next_subscription: 1,
        fatal: None,
    };
    let ending = match ending_at_start {
        Some(error) => Some(error),
        None => conn.serve(&mut socket, &mut killed).await,
    };
    // Tells a waiting revoke that this connection sends nothing more but its final error.
    drop(killed);
    drop(conn);
    if let Some(error) = ending {
        let _ = tokio::time::timeout(FINAL_FRAME_GRACE, close_with(&mut socket, error)).await;
    }
    gateway.connections.unregister(id);
}

pub fn revoked() -> AppError {
    AppError::new(ErrorCode::RemoteAuthFailed, "this device was revoked")
}

impl Connection {
    async fn serve(
        &mut self,
        socket: &mut WebSocket,
        killed: &mut tokio::sync::watch::Receiver<Option<AppError>>,
    ) -> Option<AppError> {
        let (reply_tx, mut reply_rx) = mpsc::channel::<String>(REPLY_QUEUE);
        let (out_tx, mut out_rx) = mpsc::channel::<Outgoing>(OUTGOING_QUEUE);
        let stall = self.gateway.settings.send_stall;
        let mut heartbeat = tokio::time::interval(self.gateway.settings.heartbeat);
        heartbeat.tick().await;
        loop {
            let outgoing = tokio::select! {
                incoming = socket.recv() => match incoming {
                    Some(Ok(Message::Text(text))) => {
                        let reply = self.handle_text(text.as_str(), &reply_tx, &out_tx).await;
                        reply.map(|r| vec![fit_reply(r, self.max_frame_bytes)]).unwrap_or_default()
                    }
                    Some(Ok(Message::Binary(_))) => vec![encode(&ErrorReply {
                        id: None,
                        error: AppError::new(
                            ErrorCode::InvalidArgument,
                            "binary frames are not accepted; send UTF-8 JSON text frames",
                        )
                        .with_details(json!({"reason": "binary_frame"})),
                    })],
                    Some(Ok(Message::Close(_))) => {
                        racp_server::answer_close(socket).await;
                        return None;
                    }
                    None => return None,
                    // As on a host: a client that broke the rules is told which.
                    Some(Err(err)) => {
                        return racp_server::socket::read_failure(
                            err,
                            self.gateway.settings.max_frame_bytes,
                            self.max_frame_bytes,
                        );
                    }
                    Some(Ok(_)) => Vec::new(),
                },
                Some(reply) = reply_rx.recv() => vec![fit_reply(reply, self.max_frame_bytes)],
                Some(out) = out_rx.recv() => match out {
                    Outgoing::Frame(frame) => vec![frame],
                    Outgoing::Ended(id) => {
                        self.follows.remove(&id);
                        Vec::new()
                    }
                },
                _ = heartbeat.tick(), if self.said_hello => self.heartbeat(),
                changed = killed.changed() => match changed {
                    Ok(()) => return killed.borrow_and_update().clone(),
                    Err(_) => return None,
                },
            };
            if let Some(error) = killed.borrow_and_update().clone() {
                return Some(error);
            }
            if !outgoing.is_empty() {
                match tokio::time::timeout(stall, send_all(socket, outgoing)).await {
                    Ok(Ok(())) => {}
                    Ok(Err(_)) => return None,
                    Err(_) => return Some(self.too_slow()),
                }
            }
            if let Some(fatal) = self.fatal.take() {
                return Some(fatal);
            }
        }
    }

    fn too_slow(&self) -> AppError {
        racp_server::push::too_slow(
            "stopped reading",
            self.follows.iter().map(|(id, f)| (id.clone(), f.cursor())),
        )
    }

    /// The `heartbeat` pushes, within the frame bound as on a host.
    fn heartbeat(&self) -> Vec<String> {
        let heads = self
            .follows
            .iter()
            .map(|(id, f)| racp_proto::events::SubscriptionHead {
                subscription_id: id.clone(),
                session_id: f.session_id.clone(),
                cursor: f.cursor(),
            })
            .collect();
        racp_server::push::heartbeats(racp_server::clock::now_ms(), heads, self.max_frame_bytes)
    }

    async fn handle_text(
        &mut self,
        text: &str,
        replies: &mpsc::Sender<String>,
        out: &mpsc::Sender<Outgoing>,
    ) -> Option<String> {
        let request = match decode_request(text, self.max_frame_bytes) {
            Ok(request) => request,
            Err(Rejected { id, error }) => return Some(encode(&ErrorReply { id, error })),
        };
        let id = request.id;
        let method = request.method;
        let (call, pass) = match self.admit(method, request.params) {
            Ok(admitted) => admitted,
            Err(error) => return Some(error_reply(id, error)),
        };
        // The pass is held to the end of this function, or moved into the spawned call.
        match call {
            Call::Hello(params) => {
                let said = self.hello(params);
                Some(self.reply(id, said))
            }
            Call::SessionSubscribe(params) => {
                let subscribed = self.subscribe(params, out).await;
                Some(self.reply(id, subscribed))
            }
            Call::SessionUnsubscribe(params) => {
                let removed = self.follows.remove(&params.subscription_id);
                let answer = removed.map(|_| racp_proto::Ack {}).ok_or_else(|| {
                    AppError::new(
                        ErrorCode::NotFound,
                        "no such subscription on this connection",
                    )
                    .with_details(json!({"subscriptionId": params.subscription_id}))
                });
                Some(self.reply(id, answer))
            }
            Call::DeviceList(_) => Some(self.reply(id, self.device_list())),
            // A revoke holds no pass: a device revoking itself would wait for its own call.
            call @ Call::DeviceRevoke(_) => {
                self.spawn(id, method, call, request.params, replies, None)
            }
            call => self.spawn(id, method, call, request.params, replies, pass),
        }
    }

    fn reply<T: serde::Serialize>(&self, id: RequestId, answer: Result<T, AppError>) -> String {
        match answer.and_then(|r| racp_server::wire::to_value(&r)) {
            Ok(result) => encode(&ResultReply::<Value> { id, result }),
            Err(error) => error_reply(id, error),
        }
    }

    /// Every check between a decoded envelope and its handling, as on a host.
    fn admit(
        &mut self,
        method: Method,
        params: Option<&RawValue>,
    ) -> Result<(Call, Option<CallPass>), AppError> {
        if !self.said_hello && method != Method::Hello {
            return Err(AppError::new(
                ErrorCode::HelloRequired,
                "say hello first: it must be the first call on a connection",
            ));
        }
        method
            .spec()
            .access
            .check(method.as_str(), &self.caller.principal())?;
        if let Caller::Device(device) = &self.caller {
            // The watch on the devices bucket says whether it was revoked meanwhile.
            if self.gateway.devices.is_revoked(&device.device_id) {
                self.fatal = Some(revoked());
                return Err(revoked());
            }
            if !self.gateway.revocation.current() {
                return Err(crate::revocation::stale());
            }
            if method != Method::Hello {
                self.gateway.rate.check(&device.device_id)?;
            }
        }
        let call = Call::decode(method, params)?;
        let pass = match &self.gate {
            None => None,
            Some(gate) => Some(gate.enter().ok_or_else(revoked).inspect_err(|error| {
                self.fatal = Some(error.clone());
            })?),
        };
        Ok((call, pass))
    }

    fn hello(&mut self, params: HelloParams) -> Result<HelloResult, AppError> {
        let settings = &self.gateway.settings;
        let agreed = racp_server::hello::agree(
            &params,
            "gateway",
            settings.max_frame_bytes,
            settings.max_events_per_frame,
        )
        .inspect_err(|error| self.fatal = Some(error.clone()))?;
        let bound = agreed.max_frame_bytes;
        self.max_frame_bytes = bound as usize;
        self.events_per_push = agreed.events_per_push;
        self.said_hello = true;
        let (principal, pairing) = match &self.caller {
            Caller::Device(device) => (
                racp_server::hello::device(&device.device_id, &device.roles),
                false,
            ),
            Caller::Pairing { .. } => (racp_server::hello::pairing(), true),
        };
        Ok(HelloResult {
            protocol: PROTOCOL_VERSION,
            host: HostIdentity {
                version: env!("CARGO_PKG_VERSION").to_string(),
                id: self.host.clone().unwrap_or_else(|| "gateway".to_string()),
            },
            principal,
            capabilities: if pairing {
                Vec::new()
            } else {
                CAPABILITIES.iter().map(|c| c.to_string()).collect()
            },
            limits: Limits {
                max_frame_bytes: bound,
                max_events_per_push: u32::try_from(self.events_per_push).unwrap_or(u32::MAX),
                max_in_flight: settings.max_in_flight,
                max_subscriptions: if pairing {
                    0
                } else {
                    settings.max_subscriptions
                },
                requests_per_second: settings.requests_per_second,
                request_burst: settings.request_burst,
            },
            heartbeat_ms: u64::try_from(settings.heartbeat.as_millis()).unwrap_or(u64::MAX),
        })
    }

    fn device(&self) -> Result<crate::devices::DeviceRecord, AppError> {
        match &self.caller {
            Caller::Device(device) => Ok(device.clone()),
            Caller::Pairing { .. } => Err(AppError::new(
                ErrorCode::Unauthorized,
                "a pairing connection may only call hello and pair",
            )),
        }
    }

    /// The connection's host, for a call that needs one.
    fn host_for(&self, method: Method) -> Result<String, AppError> {
        self.host.clone().ok_or_else(|| {
            AppError::new(
                ErrorCode::InvalidArgument,
                format!(
                    "{} needs a host: connect to {}/hosts/<hostId> (host/list names them)",
                    method.as_str(),
                    racp_proto::ENDPOINT_PATH
                ),
            )
            .with_details(json!({"reason": "no_host_selected", "method": method.as_str()}))
        })
    }

    fn device_list(&self) -> Result<DeviceListResult, AppError> {
        let viewer = self.device()?;
        let current = self.caller.device_id();
        Ok(DeviceListResult {
            devices: self
                .gateway
                .devices
                .list(&viewer)
                .into_iter()
                .map(|d| DeviceInfo {
                    current: current == Some(d.device_id.as_str()),
                    device_id: d.device_id,
                    name: d.name,
                    roles: d.roles,
                    created_at: d.created_at,
                    last_seen_at: None,
                })
                .collect(),
        })
    }

    async fn subscribe(
        &mut self,
        params: SessionSubscribeParams,
        out: &mpsc::Sender<Outgoing>,
    ) -> Result<SessionSubscribeResult, AppError> {
        let host = self.host_for(Method::SessionSubscribe)?;
        let max = self.gateway.settings.max_subscriptions;
        if self.follows.len() >= max as usize {
            return Err(AppError::new(
                ErrorCode::LimitExceeded,
                format!("a connection may hold at most {max} subscriptions"),
            )
            .with_details(json!({"maxSubscriptions": max})));
        }
        let stream = self
            .gateway
            .js
            .get_stream_no_info(events_stream(&host))
            .await
            .map_err(|e| hosts::nats_down(&e))?;
        if !valid_session_id(&params.session_id) {
            return Err(AppError::new(ErrorCode::SessionNotFound, "no such session")
                .with_details(json!({"sessionId": params.session_id})));
        }
        let subject = events_subject(&host, &params.session_id);
        let point = self
            .start_point(&stream, &subject, &host, &params.session_id, params.cursor)
            .await?;
        let (epoch, after) = (point.epoch, point.after);
        let subscription_id = format!("sub_{}", self.next_subscription);
        self.next_subscription += 1;
        let start = follow::Start {
            subscription_id: subscription_id.clone(),
            session_id: params.session_id,
            subject,
            epoch,
            after,
            stream_sequence: point.stream_sequence,
            max_frame_bytes: self.max_frame_bytes,
            max_events_per_frame: self.events_per_push,
            ended: point.ended,
        };
        let followed = follow::follow(&stream, start, out.clone()).await?;
        self.follows.insert(subscription_id.clone(), followed);
        Ok(SessionSubscribeResult {
            subscription_id,
            cursor: Cursor::new(epoch, after),
        })
    }

    /// Where a subscription starts.
    async fn start_point(
        &self,
        stream: &follow::Stream,
        subject: &str,
        host: &str,
        session_id: &str,
        cursor: Option<Cursor>,
    ) -> Result<StartPoint, AppError> {
        let waiting_since = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(25);
        loop {
            let span = follow::span(stream, subject).await?;
            let Span::Events {
                epoch,
                first,
                last,
                closed,
            } = span
            else {
                let head = self.host_head(host, session_id).await?;
                if let Some(point) = start_before_relay(&head, cursor)? {
                    return Ok(point);
                }
                // Behind the host's head: the events after the cursor are on their way from
                // the host, or retention removed them all. Only the first is worth waiting for.
                if waiting_since.elapsed() < RELAY_WAIT {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(400));
                    continue;
                }
                let (epoch, head) = (head.epoch, head.seq);
                return Err(Expired::OlderThanWindow.error(epoch, head, head));
            };
            let (oldest, head) = (first.0.saturating_sub(1), last.0);
            let after = match cursor {
                None => head,
                Some(cursor) if cursor.epoch != epoch => {
                    return Err(Expired::OtherEpoch.error(epoch, oldest, head));
                }
                Some(cursor) if cursor.seq < oldest => {
                    return Err(Expired::OlderThanWindow.error(epoch, oldest, head));
                }
                Some(cursor) if cursor.seq > head => {
                    // Ahead of the stream: valid only if the host has it (not yet relayed).
                    let at_host = self.host_head(host, session_id).await?;
                    if at_host.epoch != epoch || cursor.seq > at_host.seq {
                        return Err(Expired::AheadOfHead.error(epoch, oldest, head));
                    }
                    cursor.seq
                }
                Some(cursor) => cursor.seq,
            };
            let stream_sequence = follow::stream_start(stream, subject, after, first, last).await?;
            return Ok(StartPoint {
                epoch,
                after,
                stream_sequence,
                ended: closed && after >= head,
            });
        }
    }

    /// The session's head cursor as its host has it (`session/get` routed to the host).
    async fn host_head(&self, host: &str, session_id: &str) -> Result<HostHead, AppError> {
        let device = self.device()?;
        let params = RawValue::from_string(json!({ "sessionId": session_id }).to_string())
            .map_err(|e| hosts::internal(&e))?;
        let got = hosts::route(
            &self.gateway.client,
            &self.gateway.signer,
            host,
            &device,
            Method::SessionGet,
            Some(&params),
        )
        .await?;
        #[derive(serde::Deserialize)]
        struct Got {
            session: Session,
            cursor: Cursor,
        }
        #[derive(serde::Deserialize)]
        struct Session {
            state: SessionState,
        }
        serde_json::from_str::<Got>(got.get())
            .map(|got| HostHead {
                epoch: got.cursor.epoch,
                seq: got.cursor.seq,
                closed: got.session.state == SessionState::Closed,
            })
            .map_err(|e| hosts::internal(&e))
    }

    /// Runs a call on its own task within the in-flight bound; its reply goes to `replies`.
    fn spawn(
        &self,
        id: RequestId,
        method: Method,
        call: Call,
        params: Option<&RawValue>,
        replies: &mpsc::Sender<String>,
        pass: Option<CallPass>,
    ) -> Option<String> {
        let Ok(permit) = self.in_flight.clone().try_acquire_owned() else {
            return Some(error_reply(
                id,
                AppError::new(ErrorCode::HostOverloaded, "too many calls in flight")
                    .with_details(json!({"maxInFlight": self.gateway.settings.max_in_flight}))
                    .with_retry_after_ms(50),
            ));
        };
        let answer = self.answer(method, call, params.map(ToOwned::to_owned));
        let replies = replies.clone();
        tokio::spawn(async move {
            let reply = match answer.await {
                Ok(result) => format!(r#"{{"id":{},"result":{}}}"#, encode(&id), result.get()),
                Err(error) => error_reply(id, error),
            };
            drop(permit);
            let _ = replies.send(reply).await;
            // The call is over once its reply is queued: a revoke waiting on it may go on.
            drop(pass);
        });
        None
    }

    /// A call answered off the connection's loop: by the gateway (pairing, devices, hosts) or
    /// by the connection's host.
    fn answer(
        &self,
        method: Method,
        call: Call,
        params: Option<Box<RawValue>>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Box<RawValue>, AppError>> + Send>>
    {
        let gateway = self.gateway.clone();
        let device = self.device();
        let caller = self.caller.clone();
        let reached_as = self.reached_as.clone();
        let host = self.host_for(method);
        Box::pin(async move {
            let now = racp_server::clock::now_ms();
            match call {
                Call::Pair(params) => {
                    let Caller::Pairing { token_id } = caller else {
                        return Err(hosts::internal(&"pair without a pairing token"));
                    };
                    raw(&gateway
                        .devices
                        .pair(&token_id, params.device_name, now)
                        .await?)
                }
                Call::HostList(_) => {
                    raw(&hosts::list(&gateway.js, &gateway.hosts, &device?, now).await?)
                }
                Call::DeviceRevoke(params) => {
                    Revocation::revoke(&gateway, &params.device_id, &device?).await?;
                    raw(&racp_proto::Ack {})
                }
                Call::PairingCreate(params) => {
                    let ttl = params
                        .ttl_seconds
                        .unwrap_or(racp_proto::limits::DEFAULT_PAIRING_TTL_SECONDS);
                    let expires_at = now + ttl * 1000;
                    let hosts = device?.grant(params.hosts)?;
                    let minted = gateway
                        .devices
                        .mint_pairing(params.roles.clone(), hosts, expires_at)
                        .await?;
                    let settings = &gateway.settings;
                    let cert = settings.cert_sha256.as_ref();
                    let url = pairing_link(&reached_as, cert, cert.is_some(), &minted.token);
                    raw(&PairingCreateResult {
                        url,
                        token: minted.token,
                        expires_at,
                        roles: params.roles,
                        cert_sha256: settings.cert_sha256.map(|s| s.to_hex()),
                    })
                }
                _ => {
                    let host = host?;
                    let device = device?;
                    // Checked here too: a device granted some hosts reaches only those.
                    if !device.may_reach(&host) {
                        return Err(forbidden_host(&host));
                    }
                    hosts::route(
                        &gateway.client,
                        &gateway.signer,
                        &host,
                        &device,
                        method,
                        params.as_deref(),
                    )
                    .await
                }
            }
        })
    }
}

pub fn forbidden_host(host: &str) -> AppError {
    AppError::new(
        ErrorCode::Forbidden,
        "this device may not reach that host; an owner can pair it with access to it",
    )
    .with_details(json!({"hostId": host, "reason": "host_not_granted"}))
}

fn raw<T: serde::Serialize>(value: &T) -> Result<Box<RawValue>, AppError> {
    serde_json::value::to_raw_value(value).map_err(|e| hosts::internal(&e))
}

/// Where a subscription starts: the session's epoch, the RACP seq after which it delivers, the
/// stream sequence it reads from, and whether it ends at once (a closed session, read to its end).
struct StartPoint {
    epoch: Epoch,
    after: u64,
    stream_sequence: u64,
    ended: bool,
}

/// A session's head as its host has it.
struct HostHead {
    epoch: Epoch,
    seq: u64,
    closed: bool,
}

/// Where a subscription starts when the stream holds none of the session's events: from the
/// host's head, or from a cursor at it; `None` for a cursor behind it.
fn start_before_relay(
    head: &HostHead,
    cursor: Option<Cursor>,
) -> Result<Option<StartPoint>, AppError> {
    let after = match cursor {
        None => head.seq,
        Some(cursor) if cursor.epoch != head.epoch => {
            return Err(Expired::OtherEpoch.error(head.epoch, 0, head.seq));
        }
        Some(cursor) if cursor.seq > head.seq => {
            return Err(Expired::AheadOfHead.error(head.epoch, 0, head.seq));
        }
        Some(cursor) if cursor.seq < head.seq => return Ok(None),
        Some(cursor) => cursor.seq,
    };
    Ok(Some(StartPoint {
        epoch: head.epoch,
        after,
        stream_sequence: 1,
        ended: head.closed && after >= head.seq,
    }))
}
