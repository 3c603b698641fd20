//! The gateway's side of a desktop connection (racp-server's connection core runs it): the
//! gateway answers the core's and the endpoint's calls of the method table itself (`hello`,
//! `pair`, `host/list`, devices, pairing, subscriptions from the host's stream) and routes the
//! host's calls to the connection's host over NATS.

use crate::devices::{Caller, DeviceRecord};
use crate::feed::{self, Feed};
use crate::follow::{self, Follow, Outgoing};
use crate::hosts;
use crate::revocation;
use crate::state::{Gateway, shutting_down};
use crate::stream::{self, Span};
use racp_proto::events::SubscriptionHead;
use racp_proto::gateway::{events_stream, events_subject, valid_session_id};
use racp_proto::methods::handshake::{HelloResult, HostIdentity, Limits};
use racp_proto::methods::host::{DeviceInfo, DeviceListResult, PairingCreateResult};
use racp_proto::methods::session::{
    SessionRef, SessionState, SessionSubscribeParams, SessionSubscribeResult,
};
use racp_proto::{
    AppError, Call, Capability, Cursor, EndpointCall, Epoch, ErrorCode, Expired, HostCall, Method,
    PROTOCOL_VERSION, SubscriptionCall,
};
use racp_server::connection::{self, Answer, Here, Pushes, Refusal, Service, Settings, revoked};
use racp_server::connections::Slot;
use racp_server::fanout::{Subscriptions, no_such_subscription};
use racp_server::hello::Agreed;
use racp_server::identity::pairing_link;
use racp_server::socket::Socket;
use racp_server::wire::to_raw;
use serde_json::json;
use serde_json::value::RawValue;
use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{Notify, mpsc};

/// How long a subscribe behind the host's head waits for the host's relay to put the session's
/// events in a stream that holds none of them, before it answers CURSOR_EXPIRED.
const RELAY_WAIT: Duration = Duration::from_secs(3);
/// Frames subscription tasks may queue for the socket before they wait (and stop pulling from
/// JetStream): a slow desktop slows only its own consumers.
const OUTGOING_QUEUE: usize = 32;

struct GatewayConnection {
    gateway: Arc<Gateway>,
    caller: Caller,
    /// The host this connection reaches (`/racp/hosts/<id>`); `None` on `/racp`.
    host: Option<String>,
    /// What that host's last record says it has on (empty: not known).
    host_capabilities: Vec<String>,
    /// The address the desktop reached the gateway at (its Host header).
    reached_as: String,
    /// The frame bound and events per push, as agreed at `hello`.
    agreed: Agreed,
    /// Subscriptions catching up on a consumer of their own, until their feed's window holds
    /// what comes next.
    follows: BTreeMap<String, Follow>,
    /// Subscriptions reading from their session's feed, as a host's read its log.
    live: Subscriptions<Feed>,
    /// Where the catch-up tasks queue their frames for the connection.
    out: mpsc::Sender<Outgoing>,
}

/// What wakes a gateway connection: a feed's append, or a catch-up task's frame.
pub struct GatewayPushes {
    wake: Arc<Notify>,
    queue: mpsc::Receiver<Outgoing>,
}

pub enum Signal {
    Wake,
    Out(Outgoing),
}

impl Pushes for GatewayPushes {
    type Signal = Signal;
    async fn next(&mut self) -> Option<Signal> {
        tokio::select! {
            () = self.wake.notified() => Some(Signal::Wake),
            out = self.queue.recv() => out.map(Signal::Out),
        }
    }
}

pub async fn run(
    socket: Socket,
    gateway: Arc<Gateway>,
    caller: Caller,
    host: Option<String>,
    slot: Slot,
    reached_as: String,
) {
    let s = &gateway.settings;
    let settings = Settings {
        server: "gateway",
        max_frame_bytes: s.max_frame_bytes,
        max_events_per_frame: s.max_events_per_frame,
        max_in_flight: s.max_in_flight,
        server_in_flight: None,
        heartbeat: s.heartbeat,
        send_stall: s.send_stall,
        budget: gateway.budget.clone(),
    };
    let device_id = caller.device_id().map(str::to_string);
    let host_capabilities = match &host {
        Some(host_id) => crate::hosts::seen(&gateway.hosts, host_id)
            .await
            .ok()
            .flatten()
            .map(|seen| seen.record.capabilities)
            .unwrap_or_default(),
        None => Vec::new(),
    };
    let (out, queue) = mpsc::channel::<Outgoing>(OUTGOING_QUEUE);
    let live = Subscriptions::new(s.max_lag_events, s.max_events_per_frame);
    let pushes = GatewayPushes {
        wake: live.notify.clone(),
        queue,
    };
    let served = GatewayConnection {
        agreed: Agreed {
            max_frame_bytes: racp_proto::limits::PRE_HELLO_MAX_FRAME_BYTES,
            events_per_push: s.max_events_per_frame,
        },
        gateway: gateway.clone(),
        caller,
        host,
        host_capabilities,
        reached_as,
        follows: BTreeMap::new(),
        live,
        out,
    };
    connection::run(
        socket,
        &gateway.connections,
        slot,
        device_id,
        settings,
        served,
        pushes,
    )
    .await;
}

impl Service for GatewayConnection {
    type Pushes = GatewayPushes;

    fn refused_at_start(&self) -> Option<AppError> {
        if let Some(device_id) = self.caller.device_id()
            && self.gateway.devices.is_revoked(device_id)
        {
            return Some(revoked());
        }
        self.gateway.is_draining().then(shutting_down)
    }

    /// The watch on the devices bucket says whether the device was revoked meanwhile, and the
    /// revocation lease whether this replica still knows every revoke; then the admit policy.
    fn admit(&mut self, method: Method, params: Option<&RawValue>) -> Result<Call, Refusal> {
        let mut rate = None;
        if let Caller::Device(device) = &self.caller {
            if self.gateway.devices.is_revoked(&device.device_id) {
                return Err(Refusal::Connection(revoked()));
            }
            if !self.gateway.lease.current() {
                return Err(Refusal::Call(crate::lease::stale()));
            }
            rate = Some((&self.gateway.rate, device.device_id.as_str()));
        }
        let draining = self.gateway.is_draining().then(shutting_down);
        let principal = self.caller.principal();
        Ok(racp_server::admission::admit(
            &principal, method, params, rate, draining,
        )?)
    }

    fn hello(&mut self, agreed: Agreed) -> HelloResult {
        let settings = &self.gateway.settings;
        self.agreed = agreed;
        self.live.set_max_events_per_frame(agreed.events_per_push);
        let (principal, pairing) = match &self.caller {
            Caller::Device(device) => (
                racp_server::hello::device(&device.device_id, &device.roles),
                false,
            ),
            Caller::Pairing { .. } => (racp_server::hello::pairing(), true),
        };
        HelloResult {
            protocol: PROTOCOL_VERSION,
            host: HostIdentity {
                version: env!("CARGO_PKG_VERSION").to_string(),
                id: self.host.clone().unwrap_or_else(|| "gateway".to_string()),
            },
            principal,
            capabilities: if pairing {
                Vec::new()
            } else {
                self.capabilities()
            },
            limits: Limits {
                max_frame_bytes: agreed.max_frame_bytes,
                max_events_per_push: u32::try_from(agreed.events_per_push).unwrap_or(u32::MAX),
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
        }
    }

    fn subscription(&mut self, call: SubscriptionCall) -> Here<'_> {
        Box::pin(async move {
            match call {
                SubscriptionCall::SessionSubscribe(params) => {
                    to_raw(&self.subscribe(params).await?)
                }
                SubscriptionCall::SessionUnsubscribe(params) => {
                    let id = &params.subscription_id;
                    if self.follows.remove(id).is_none() && !self.live.remove(id) {
                        return Err(no_such_subscription(id));
                    }
                    to_raw(&racp_proto::Ack {})
                }
            }
        })
    }

    fn endpoint(&mut self, call: EndpointCall) -> Answer {
        let gateway = self.gateway.clone();
        let device = self.device();
        let caller = self.caller.clone();
        let reached_as = self.reached_as.clone();
        Box::pin(async move {
            let now = racp_server::clock::now_ms();
            match call {
                EndpointCall::Pair(params) => {
                    let Caller::Pairing { token_id } = caller else {
                        return Err(hosts::internal(&"pair without a pairing token"));
                    };
                    to_raw(
                        &gateway
                            .devices
                            .pair(&token_id, params.device_name, now)
                            .await?,
                    )
                }
                EndpointCall::HostList(_) => {
                    to_raw(&hosts::list(&gateway.js, &gateway.hosts, &device?, now).await?)
                }
                EndpointCall::DeviceList(_) => to_raw(&device_list(&gateway, &device?)),
                EndpointCall::DeviceRevoke(params) => {
                    revocation::revoke(&gateway, &params.device_id, &device?).await?;
                    to_raw(&racp_proto::Ack {})
                }
                EndpointCall::PairingCreate(params) => {
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
                    to_raw(&PairingCreateResult {
                        url,
                        token: minted.token,
                        expires_at,
                        roles: params.roles,
                        cert_sha256: settings.cert_sha256.map(|s| s.to_hex()),
                    })
                }
            }
        })
    }

    /// Routed to the connection's host, which a device granted some hosts reaches only if it
    /// is one of them.
    fn host(&mut self, call: HostCall, params: Option<&RawValue>) -> Answer {
        let gateway = self.gateway.clone();
        let target = self.host_for(call.method()).and_then(|host| {
            let device = self.device()?;
            if !device.may_reach(&host) {
                return Err(forbidden_host(&host));
            }
            Ok((host, device))
        });
        let params = params.map(ToOwned::to_owned);
        Box::pin(async move {
            let (host, device) = target?;
            let routed = hosts::Routed::new(&call, params.as_deref());
            hosts::route(&gateway.client, &gateway.signer, &host, &device, routed).await
        })
    }

    fn heads(&self) -> Vec<SubscriptionHead> {
        let mut heads = self.live.heads();
        heads.extend(self.follows.iter().map(|(id, f)| SubscriptionHead {
            subscription_id: id.clone(),
            session_id: f.session_id.clone(),
            cursor: f.cursor(),
        }));
        heads
    }

    fn pushes(
        &mut self,
        signal: Signal,
        max_frame_bytes: usize,
    ) -> (Vec<String>, Option<AppError>) {
        match signal {
            Signal::Wake => self.live.burst(max_frame_bytes),
            Signal::Out(Outgoing::Frame(frame)) => (vec![frame], None),
            Signal::Out(Outgoing::Ended(id)) => {
                self.follows.remove(&id);
                (Vec::new(), None)
            }
            Signal::Out(Outgoing::Live {
                subscription_id,
                last,
            }) => {
                if let Some(caught_up) = self.follows.remove(&subscription_id) {
                    self.live
                        .insert(subscription_id, caught_up.feed.clone(), last);
                }
                (Vec::new(), None)
            }
        }
    }
}

impl GatewayConnection {
    /// What `hello` names: on a host's endpoint the host's own (from its last record, so a host
    /// with `fs` off is not said to have it), else every capability a host can have; and `hosts`.
    fn capabilities(&self) -> Vec<String> {
        let hosts = Capability::Hosts.to_string();
        if !self.host_capabilities.is_empty() {
            return self
                .host_capabilities
                .iter()
                .cloned()
                .chain(std::iter::once(hosts))
                .collect();
        }
        Capability::HOST
            .iter()
            .map(|c| c.to_string())
            .chain(std::iter::once(hosts))
            .collect()
    }

    fn device(&self) -> Result<DeviceRecord, AppError> {
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

    async fn subscribe(
        &mut self,
        params: SessionSubscribeParams,
    ) -> Result<SessionSubscribeResult, AppError> {
        let host = self.host_for(Method::SessionSubscribe)?;
        self.room_for_subscription()?;
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
        let subscription_id = self.live.new_id();
        let feed = self.gateway.feeds.join(feed::Start {
            stream: &stream,
            subject: &subject,
            session_id: &params.session_id,
            epoch,
            after: point.head,
            from: point.after_head,
            closed: point.closed,
            window_events: window_events(&self.gateway.settings),
        });
        if feed.takes_over_at(after) {
            self.live.insert(subscription_id.clone(), feed, after);
            return Ok(SessionSubscribeResult {
                subscription_id,
                cursor: Cursor::new(epoch, after),
            });
        }
        let start = follow::Start {
            subscription_id: subscription_id.clone(),
            session_id: params.session_id,
            subject,
            epoch,
            after,
            stream_sequence: point.stream_sequence,
            max_frame_bytes: self.agreed.max_frame_bytes as usize,
            max_events_per_frame: self.agreed.events_per_push,
            feed,
        };
        let followed = follow::follow(&stream, start, self.out.clone()).await?;
        self.follows.insert(subscription_id.clone(), followed);
        Ok(SessionSubscribeResult {
            subscription_id,
            cursor: Cursor::new(epoch, after),
        })
    }

    /// LIMIT_EXCEEDED when the connection holds as many subscriptions as it may.
    fn room_for_subscription(&self) -> Result<(), AppError> {
        let max = self.gateway.settings.max_subscriptions;
        if self.follows.len() + self.live.len() >= max as usize {
            return Err(AppError::new(
                ErrorCode::LimitExceeded,
                format!("a connection may hold at most {max} subscriptions"),
            )
            .with_details(json!({"maxSubscriptions": max})));
        }
        Ok(())
    }

    /// Where a subscription starts.
    async fn start_point(
        &self,
        stream: &stream::Stream,
        subject: &str,
        host: &str,
        session_id: &str,
        cursor: Option<Cursor>,
    ) -> Result<StartPoint, AppError> {
        let waiting_since = tokio::time::Instant::now();
        let mut pause = Duration::from_millis(25);
        loop {
            let span = stream::span(stream, subject).await?;
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
            let window = Window {
                epoch,
                oldest,
                head,
            };
            let after = self.start_after(cursor, window, host, session_id).await?;
            let stream_sequence = stream::stream_start(stream, subject, after, first, last).await?;
            return Ok(StartPoint {
                epoch,
                after,
                stream_sequence,
                head,
                after_head: last.1 + 1,
                closed,
            });
        }
    }

    /// The seq a subscription from `cursor` starts after, in a stream that holds `window`.
    async fn start_after(
        &self,
        cursor: Option<Cursor>,
        window: Window,
        host: &str,
        session_id: &str,
    ) -> Result<u64, AppError> {
        let Window {
            epoch,
            oldest,
            head,
        } = window;
        match cursor {
            None => Ok(head),
            Some(cursor) if cursor.epoch != epoch => {
                Err(Expired::OtherEpoch.error(epoch, oldest, head))
            }
            Some(cursor) if cursor.seq < oldest => {
                Err(Expired::OlderThanWindow.error(epoch, oldest, head))
            }
            Some(cursor) if cursor.seq > head => {
                // Ahead of the stream: valid only if the host has it (not yet relayed).
                let at_host = self.host_head(host, session_id).await?;
                if at_host.epoch != epoch || cursor.seq > at_host.seq {
                    return Err(Expired::AheadOfHead.error(epoch, oldest, head));
                }
                Ok(cursor.seq)
            }
            Some(cursor) => Ok(cursor.seq),
        }
    }

    /// The session's head cursor as its host has it (`session/get` routed to the host).
    async fn host_head(&self, host: &str, session_id: &str) -> Result<HostHead, AppError> {
        let device = self.device()?;
        let session = SessionRef {
            session_id: session_id.to_string(),
        };
        let params = to_raw(&session)?;
        let call = HostCall::SessionGet(session);
        let routed = hosts::Routed::new(&call, Some(&params));
        let gateway = &self.gateway;
        let got = hosts::route(&gateway.client, &gateway.signer, host, &device, routed).await?;
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
}

/// The devices `viewer` may see, as this replica's watch of the devices bucket has them.
fn device_list(gateway: &Gateway, viewer: &DeviceRecord) -> DeviceListResult {
    DeviceListResult {
        devices: gateway
            .devices
            .list(viewer)
            .into_iter()
            .map(|d| DeviceInfo {
                current: d.device_id == viewer.device_id,
                device_id: d.device_id,
                name: d.name,
                roles: d.roles,
                created_at: d.created_at,
                last_seen_at: None,
            })
            .collect(),
    }
}

/// Events a feed's window holds: a subscriber within the lag bound stays in it, as on a host.
fn window_events(settings: &crate::state::Settings) -> usize {
    let lag = usize::try_from(settings.max_lag_events).unwrap_or(usize::MAX);
    lag.saturating_add(settings.max_events_per_frame)
}

pub fn forbidden_host(host: &str) -> AppError {
    AppError::new(
        ErrorCode::Forbidden,
        "this device may not reach that host; an owner can pair it with access to it",
    )
    .with_details(json!({"hostId": host, "reason": "host_not_granted"}))
}

/// Where a subscription starts: the session's epoch, the RACP seq after which it delivers and
/// the stream sequence it reads from; and where the session's feed would start: the head's
/// RACP seq, the stream sequence after it, and whether the session is closed there.
struct StartPoint {
    epoch: Epoch,
    after: u64,
    stream_sequence: u64,
    head: u64,
    after_head: u64,
    closed: bool,
}

/// The events of one epoch a session's stream holds: the seqs after `oldest` up to `head`.
#[derive(Clone, Copy)]
struct Window {
    epoch: Epoch,
    oldest: u64,
    head: u64,
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
        head: head.seq,
        after_head: 1,
        closed: head.closed,
    }))
}
